"""Index save -> load round trip, corruption and compatibility errors."""

import errno
import hashlib
import json
import logging
import os
import random
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hippo_gpu import load_index
from hippo_gpu.storage.directory import IndexFormatError


def _tensors(idx):
    return {
        "crow": idx.adjacency.crow_indices(), "col": idx.adjacency.col_indices(),
        "val": idx.adjacency.values(), "passage_nodes": idx.passage_nodes,
        "fact_phrases": idx.fact_phrases, "counts": idx.phrase_passage_counts,
        "passage_emb": idx.passage_emb, "phrase_emb": idx.phrase_emb, "fact_emb": idx.fact_emb,
        **{f"basis.{k}": v for k, v in idx.basis.tensors().items()},
    }


def test_round_trip_is_bit_identical(sample_index, tmp_path):
    again = load_index(sample_index.save(tmp_path / "copy"), device="cpu")
    for name, t in _tensors(sample_index).items():
        u = _tensors(again)[name]
        assert t.dtype == u.dtype and torch.equal(t, u), name
    assert again.passage_keys == sample_index.passage_keys
    assert again.facts == sample_index.facts and again.phrases == sample_index.phrases
    assert again.stats() == sample_index.stats()
    b, c = sample_index.basis, again.basis
    assert (b.z1_bound, b.damping, b.tol, b.steps, b.seconds) == \
        (c.z1_bound, c.damping, c.tol, c.steps, c.seconds)


@pytest.mark.parametrize("name", ["graph.safetensors", "embeddings.safetensors",
                                  "basis.safetensors", "tables.json"])
def test_flipped_byte_names_the_file(sample_index_dir, tmp_path, name):
    bad = tmp_path / "bad"
    shutil.copytree(sample_index_dir, bad)
    version = json.loads((bad / "manifest.json").read_text())["version"]
    path = bad / f"v{version:06d}" / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=name.replace(".", r"\.")):
        load_index(bad, device="cpu")


def test_a_version_without_basis_loads_with_none(sample_index_dir, sample_index, tmp_path):
    """What an index written before the basis existed looks like: no basis.safetensors in its
    version and no ppr_basis in its config. It loads (basis None, ppr_basis False) and is saved
    again without one."""
    old = tmp_path / "old"
    shutil.copytree(sample_index_dir, old)
    manifest = json.loads((old / "manifest.json").read_text())
    name = f"v{manifest['version']:06d}/basis.safetensors"
    assert name in manifest["files"] and manifest["config"]["ppr_basis"] is True
    (old / name).unlink()
    del manifest["files"][name], manifest["config"]["ppr_basis"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    idx = load_index(old, device="cpu")
    assert idx.basis is None and idx.config.ppr_basis is False
    stats = idx.stats()
    assert (stats["basis_bytes"], stats["basis_steps"], stats["basis_damping"]) == (0, 0, None)
    assert {k: v for k, v in stats.items() if not k.startswith("basis_")} == \
        {k: v for k, v in sample_index.stats().items() if not k.startswith("basis_")}
    again = load_index(idx.save(tmp_path / "again"), device="cpu")
    assert again.basis is None
    assert not list((tmp_path / "again").glob("v*/basis.safetensors"))


def test_a_basis_of_another_shape_is_refused(sample_index, tmp_path):
    b = sample_index.basis
    bad = replace(sample_index, basis=replace(b, z=b.z[:-1].clone()))
    with pytest.raises(IndexFormatError, match="basis tensor z"):
        load_index(bad.save(tmp_path / "bad"), device="cpu")


def test_to_moves_the_basis_and_keeps_it_float64(sample_index):
    half = sample_index.to("cpu", "bfloat16")
    assert half.basis is not None and half.basis.z.dtype == torch.float64
    assert torch.equal(half.basis.z, sample_index.basis.z)
    if torch.cuda.is_available():
        moved = sample_index.to("cuda")
        assert moved.basis.z.is_cuda and moved.basis.z1.is_cuda
        assert torch.equal(moved.basis.z.cpu(), sample_index.basis.z)


def test_encoder_mismatch_and_version_are_errors(sample_index_dir, tmp_path):
    with pytest.raises(IndexFormatError, match="encoder"):
        load_index(sample_index_dir, device="cpu", encoder="some/other-model")
    old = tmp_path / "old"
    shutil.copytree(sample_index_dir, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["format_version"] = 999
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="format version 999"):
        load_index(old, device="cpu")
    with pytest.raises(IndexFormatError, match="not a hippo-gpu index"):
        load_index(tmp_path, device="cpu")


def test_save_replaces_an_index_atomically_but_never_a_foreign_dir(sample_index, tmp_path):
    target = tmp_path / "idx"
    sample_index.save(target)
    sample_index.save(target)  # replacing an existing index is fine: a new version
    assert json.loads((target / "manifest.json").read_text())["version"] == 2
    # the old version is collected, no temp files are left, files follow the umask
    assert sorted(p.name for p in target.iterdir()) == [".writer.lock", "manifest.json",
                                                         "v000002"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    umask = os.umask(0)
    os.umask(umask)
    for p in [target, *target.rglob("*")]:
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        assert p.stat().st_mode & 0o777 == want, p
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep me")
    with pytest.raises(IndexFormatError, match="refusing"):
        sample_index.save(foreign)
    assert (foreign / "mine.txt").read_text() == "keep me"


def test_streamed_safetensors_read_by_safetensors_and_by_the_memory_map(tmp_path):
    from safetensors.torch import load_file

    from hippo_gpu.storage.safetensors_io import load_safetensors_mmap, save_safetensors_stream

    g = torch.Generator().manual_seed(0)
    tensors = {"emb": torch.randn(7, 5, generator=g), "rows": torch.arange(11),
               "empty": torch.zeros(0, 3), "flags": torch.tensor([1, 0, 1], dtype=torch.uint8),
               "half": torch.randn(4, generator=g).half(), "scalar": torch.tensor(2.5)}
    path = tmp_path / "x.safetensors"
    save_safetensors_stream(tensors, path)
    for loaded in (load_file(str(path)), load_safetensors_mmap(path)):
        assert sorted(loaded) == sorted(tensors)
        for name, t in tensors.items():
            assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t), name
    mapped = load_safetensors_mmap(path)["emb"]
    mapped[0, 0] = 99.0  # copy-on-write: the file is unchanged
    assert torch.equal(load_file(str(path))["emb"], tensors["emb"])


def test_write_atomic_leaves_nothing_on_error(tmp_path):
    from hippo_gpu.storage.durable import write_atomic

    path = write_atomic(tmp_path / "f.txt", "old")

    def broken(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, broken)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


# -- storage/durable.py: the one atomic write, its fsyncs, and the full disk's error ----------


def _fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self/fd (Linux)")
@pytest.mark.parametrize("kind", ["str", "bytes", "callable"])
def test_write_atomic_syncs_the_file_renames_it_then_syncs_the_folder(tmp_path, monkeypatch,
                                                                      kind):
    """The order write_atomic's docstring promises: the data in a `.NAME.tmp-UNIQUE` file beside
    the target, that file fsynced, before_replace, the rename over the target, the folder
    fsynced; the new file has the content and the umask's permissions (a callable that writes
    0600, as safetensors does, included)."""
    from hippo_gpu.storage import durable

    events: list[tuple[str, ...]] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", _fd_path(fd)))
                        or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(a), str(b)))
                        or real_replace(a, b))
    path = tmp_path / "f.txt"
    path.write_text("old")
    text = "née ü"

    def writer(tmp: Path) -> None:
        tmp.write_bytes(text.encode("utf-8"))
        os.chmod(tmp, 0o600)

    data = {"str": text, "bytes": text.encode("utf-8"), "callable": writer}[kind]
    got = durable.write_atomic(str(path), data,
                               before_replace=lambda: events.append(("before_replace",)))
    assert got == path and path.read_text(encoding="utf-8") == text
    tmp = events[0][1]
    assert re.fullmatch(re.escape(str(tmp_path)) + r"/\.f\.txt\.tmp-[0-9a-f]{32}", tmp), tmp
    assert events == [("fsync", tmp), ("before_replace",), ("replace", tmp, str(path)),
                      ("fsync", str(tmp_path))]
    assert path.stat().st_mode & 0o777 == 0o666 & ~durable.umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_write_atomic_logs_a_failed_folder_sync_and_returns(tmp_path, monkeypatch, caplog):
    """Once the rename is done nothing raises: a failed fsync of the folder is logged (naming
    the file and the error) and the new file stands."""
    from hippo_gpu.storage import durable

    real = durable.fsync_path

    def fsync_path(p: Path) -> None:
        if p == tmp_path:
            raise OSError(errno.EIO, "sync failed")
        real(p)

    monkeypatch.setattr(durable, "fsync_path", fsync_path)
    path = tmp_path / "f.txt"
    with caplog.at_level(logging.WARNING, logger=durable.__name__):
        assert durable.write_atomic(path, b"new") == path
    assert path.read_bytes() == b"new"
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: written, but syncing its folder failed ({OSError(errno.EIO, 'sync failed')}); "
        "it may not survive a power loss"]


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_raises_disk_full_error_naming_the_file(tmp_path, code):
    """ENOSPC / EDQUOT inside write_atomic (a write() that names no file) becomes DiskFullError
    naming the target, not the temporary file; the old file stays, nothing else is left."""
    from hippo_gpu.errors import DiskFullError
    from hippo_gpu.storage.durable import write_atomic

    path = write_atomic(tmp_path / "f.txt", "old")

    def full(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(code, os.strerror(code))

    with pytest.raises(DiskFullError) as info:
        write_atomic(path, full)
    quota = " (the disk quota is exceeded)" if code == errno.EDQUOT else ""
    assert str(info.value) == (
        f"{path}: no space left on device{quota}; it was not written and what was there "
        "before is unchanged: free some space and run again")
    assert (info.value.errno, info.value.path) == (code, str(path))
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == code
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_naming_full_disk_passes_other_errors_through(tmp_path):
    from hippo_gpu.errors import DiskFullError
    from hippo_gpu.storage.durable import disk_full, naming_full_disk

    other = OSError(errno.EACCES, "denied")
    with pytest.raises(OSError) as info, naming_full_disk(tmp_path / "a"):
        raise other
    assert info.value is other
    named = disk_full(tmp_path / "b", OSError(errno.ENOSPC, "full"))
    with pytest.raises(DiskFullError) as info, naming_full_disk(tmp_path / "a"):
        raise named  # already named: kept as it is
    assert info.value is named and named.path == str(tmp_path / "b")


def test_sha256_of_files_larger_than_a_read_block(tmp_path):
    from hippo_gpu.storage.durable import sha256_file, sha256_files

    rnd = random.Random(0)
    sizes = [0, 1, (1 << 20) - 1, (1 << 20) + 3, 3 << 20]
    paths = []
    for i, n in enumerate(sizes):
        paths.append(tmp_path / f"f{i}")
        paths[-1].write_bytes(rnd.randbytes(n))
    want = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert [sha256_file(p) for p in paths] == want
    assert sha256_files(paths) == want  # in the given order
    assert sha256_files(paths[::-1]) == want[::-1] and sha256_files([]) == []


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002, 0o077])
def test_umask_is_read_without_changing_it(monkeypatch, mask):
    """From /proc/self/status where there is one (os.umask, which sets it, is not called: a
    set-and-restore races other threads creating files); else by the set-and-restore."""
    from hippo_gpu.storage import durable

    old = os.umask(mask)
    try:
        calls: list[int] = []
        real = os.umask
        with monkeypatch.context() as m:
            m.setattr(os, "umask", lambda v: calls.append(v) or real(v))
            if os.path.exists("/proc/self/status"):
                assert durable.umask() == mask and calls == []

            def no_proc(self: Path, *args: object, **kw: object) -> str:
                raise OSError(errno.ENOENT, "no /proc")

            m.setattr(Path, "read_text", no_proc)
            assert durable.umask() == mask and len(calls) == 2
        assert os.umask(mask) == mask  # restored
    finally:
        os.umask(old)
