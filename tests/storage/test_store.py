"""Index save -> load round trip, corruption and compatibility errors."""

import json
import os
import shutil
from dataclasses import replace

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
