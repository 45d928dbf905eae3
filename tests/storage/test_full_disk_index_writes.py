"""A full disk at every write of an index: a commit, a compaction, a first save (and a save over
an index), each failed at its k-th write operation for every k a dry run counts
(tests/storage/diskfull.py: open, write, fsync, mkdir, rename with ENOSPC); then a real
size-limited tmpfs, filled until commits fail.

For each k: DiskFullError names the file and says the index keeps its version (the CLI: exit 2,
one line, no traceback); the directory is unchanged byte for byte (nothing partial or left over)
and loads verified as the previous version; once the disk has space the same writer's retry
succeeds and equals a fresh build. A failure after the commit point (the folder's fsync after the
manifest's rename) is no error: the commit is made. References are fresh builds (hash:64 vectors,
deterministic), never the code under test.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hippo_gpu import load_index
from hippo_gpu.cli import app
from hippo_gpu.data import Passage
from hippo_gpu.errors import DiskFullError
from hippo_gpu.sample import paths
from hippo_gpu.storage.directory import MANIFEST, IndexFormatError, is_index_dir, read_manifest
from hippo_gpu.versions.writer import IndexWriter
from tests.storage.diskfull import FullDisk, count_writes, generic
from tests.storage.full_disk_checks import (
    ENCODER,
    REMOVED,
    SWEEPS,
    build,
    check_error,
    check_like,
    check_unchanged,
    commit_point,
    copy,
    faults,
    fill,
    small_tmpfs,
    stage,
)
from tests.versions.index_checks import assert_same_index, leftovers, snapshot

pytestmark = pytest.mark.usefixtures("one_thread")

runner = CliRunner()


@pytest.mark.parametrize("every", SWEEPS)
def test_commit_fails_cleanly_at_every_write(base, sample, reference, tmp_path, caplog, every):
    """Each write of a commit (segment files, their fsyncs, the rename, the manifest) fails in
    turn, with the disk full from that write on; the retry after space returns commits."""
    dry = copy(base, tmp_path / "dry")
    with IndexWriter(dry, device="cpu", compact_after=None) as w:
        stage(w, sample)
        ops = count_writes(dry, w.commit)
        version = w.index.version
    assert_same_index(load_index(dry, device="cpu"), reference)
    point = commit_point(ops)
    for k in faults(ops, every):
        d = copy(base, tmp_path / f"k{k}")
        before = snapshot(d)
        w = IndexWriter(d, device="cpu", compact_after=None).open()
        prev = w.index
        stage(w, sample)
        with FullDisk(d, fail_at=k) as disk:
            if k <= point:
                with pytest.raises(DiskFullError) as e:
                    w.commit()
                check_error(e.value, d, prev.version, "commit")
                check_unchanged(d, before, prev)
                disk.free()
                new = w.commit()  # the same writer, its staged change kept
            else:
                with caplog.at_level(logging.WARNING, logger="hippo_gpu.storage.durable"):
                    new = w.commit()  # the rename was the commit: made, with a warning
                assert f"{d / MANIFEST}: written, but syncing its folder failed" in caplog.text
        assert disk.failed and generic(disk.failed[0]) == generic(ops[k - 1])
        w.close()
        assert new.version == version  # the failed attempt left no number taken
        assert new.passage_keys == reference.passage_keys
        check_like(d, dry, version)


def test_cli_insert_on_a_full_disk_exits_2_with_one_line(base, sample, tmp_path, monkeypatch):
    """`hippo-gpu insert` failing at a segment file, at the segment's rename and at the
    manifest: exit status 2, the message on one line, no traceback; the index is unchanged."""
    monkeypatch.setenv("HIPPO_GPU_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "new.json"
    corpus.write_text(json.dumps([p.__dict__ for p in sample["corpus"][20:]]))
    dry = copy(base, tmp_path / "dry")
    args = ["insert", "--corpus", str(corpus), "--openie", str(sample["openie_path"]),
            "--device", "cpu"]
    ops = count_writes(dry, lambda: runner.invoke(app, [*args[:1], str(dry), *args[1:]],
                                                  catch_exceptions=False))
    picks = [next(i for i, op in enumerate(ops, 1) if ".safetensors" in op),
             next(i for i, op in enumerate(ops, 1) if op.startswith("rename")),
             commit_point(ops)]
    for k in picks:
        d = copy(base, tmp_path / f"k{k}")
        before = snapshot(d)
        with FullDisk(d, fail_at=k):
            result = runner.invoke(app, [*args[:1], str(d), *args[1:]])
        out = result.output
        assert result.exit_code == 2, out
        assert "Traceback" not in out and out.count("\n") == 1, out
        assert out.startswith(f"error: {d}: no space left on device for the commit"), out
        assert snapshot(d) == before


@pytest.mark.parametrize("every", SWEEPS)
def test_compaction_fails_cleanly_at_every_write(committed, reference, tmp_path, every):
    """Each write of a compaction (the new base's files, the rename, the manifest) fails in
    turn; the chain stays as it was, and the retry compacts to a fresh build's equal."""
    dry = copy(committed, tmp_path / "dry")
    with IndexWriter(dry, device="cpu", compact_after=None) as w:
        ops = count_writes(dry, w.compact)
        version = w.index.version
    compacted = load_index(dry, device="cpu")
    assert compacted.basis is not None and not read_manifest(dry)["segments"]
    assert_same_index(compacted, reference)  # with the basis, within its certified bounds
    point = commit_point(ops)
    for k in faults(ops, every):
        d = copy(committed, tmp_path / f"k{k}")
        before = snapshot(d)
        w = IndexWriter(d, device="cpu", compact_after=None).open()
        prev = w.index
        with FullDisk(d, fail_at=k) as disk:
            if k <= point:
                with pytest.raises(DiskFullError) as e:
                    w.compact()
                check_error(e.value, d, prev.version, "compaction")
                check_unchanged(d, before, prev)
                disk.free()
            new = w.compact()
        assert disk.failed
        w.close()
        assert new.version == version and new.basis is not None
        check_like(d, dry, version)


@pytest.mark.parametrize("where", ["first", "basis", "manifest"])
def test_a_commit_whose_compaction_fails_is_still_made(base, sample, reference, tmp_path,
                                                       where, caplog):
    """commit() raising means "not committed": a full disk in the compaction after a commit
    (compact_after=1) is logged, the commit stands, and the chain waits for the next one."""
    dry = copy(base, tmp_path / "dry")
    with IndexWriter(dry, device="cpu", compact_after=1) as w:
        stage(w, sample)
        ops = count_writes(dry, w.commit)
    start = commit_point(ops) + 2  # after the commit's manifest rename and folder fsync
    k = {"first": start,
         "basis": next(i for i, op in enumerate(ops, 1) if "basis.safetensors" in op),
         "manifest": len(ops) - 1}[where]
    assert k >= start
    d = copy(base, tmp_path / "index")
    with IndexWriter(d, device="cpu", compact_after=1) as w:
        stage(w, sample)
        with FullDisk(d, fail_at=k), caplog.at_level(logging.WARNING):
            new = w.commit()
        assert not w.last_change.compacted
    assert "the compaction after it failed" in caplog.text
    manifest = read_manifest(d)
    assert manifest["version"] == new.version and len(manifest["segments"]) == 1
    assert leftovers(d) == []
    assert_same_index(load_index(d, device="cpu"), reference)


@pytest.mark.parametrize("every", SWEEPS)
@pytest.mark.parametrize("over", [False, True], ids=["new", "over_an_index"])
def test_save_fails_cleanly_at_every_write(base, reference, tmp_path, over, every):
    """Index.save (what build_index(out_dir=...) runs) failing at each write: a new directory
    is no index (load_index refuses it; only the lock file may be left), an existing one keeps
    its version byte for byte; the retry writes the index, equal to what was saved."""
    def target(name: str) -> Path:
        return copy(base, tmp_path / name / "index") if over else tmp_path / name / "index"

    dry = target("dry")
    ops = count_writes(dry.parent, lambda: reference.save(dry))
    saved = load_index(dry, device="cpu")
    assert saved.basis is not None
    assert_same_index(saved, reference)
    point = commit_point(ops)
    prev = load_index(base, device="cpu") if over else None
    for k in faults(ops, every):
        d = target(f"k{k}")
        before = snapshot(d) if over else None
        with FullDisk(d.parent, fail_at=k) as disk:
            if k <= point:
                with pytest.raises(DiskFullError) as e:
                    reference.save(d)
                msg = str(e.value)
                assert "\n" not in msg and msg.startswith(f"{d}") and \
                    "no space left on device" in msg, msg
                if over:
                    assert prev is not None and before is not None
                    check_unchanged(d, before, prev)
                else:
                    assert not is_index_dir(d)
                    assert not d.exists() or \
                        [p.name for p in d.iterdir()] in ([], [".writer.lock"])
                    with pytest.raises(IndexFormatError, match="not a hippo-gpu index"):
                        load_index(d, device="cpu")
                disk.free()
            reference.save(d)
        assert disk.failed
        check_like(d, dry, saved.version)


def test_cli_index_on_a_full_disk_exits_2_and_a_rerun_builds(sample, tmp_path, monkeypatch):
    monkeypatch.setenv("HIPPO_GPU_CACHE", str(tmp_path / "cache"))
    files = paths()
    out = tmp_path / "disk" / "index"
    args = ["index", "--corpus", str(files["corpus"]), "--openie", str(files["openie"]),
            "--out", str(out), "--encoder", ENCODER, "--device", "cpu"]
    with FullDisk(out.parent, fail_at=10):  # a write of the base's graph file
        result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1
    assert f"{out}/.tmp-v000001-" in result.output and "no space left on device" in \
        result.output
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert_same_index(load_index(out, device="cpu"), build(sample, sample["corpus"]))


def test_a_real_full_tmpfs_fails_commits_cleanly(base, sample, tmp_path):
    """On a 512 KiB tmpfs: the index, then a filler leaving `slack` bytes, for slack from 0
    up in 4 KiB pages until a commit fits; each commit either fails cleanly (DiskFullError,
    the directory unchanged, the old version loads) or succeeds; after the filler goes, the
    failed commits succeed and equal a fresh build. Then one passage per commit until the
    disk is full."""
    gc.freeze()  # what exists now is no garbage: collections below scan only the new objects
    try:
        with small_tmpfs(tmp_path / "mnt", 512) as mnt:
            commit_on_a_full_filesystem(mnt, base, sample)
    finally:
        gc.unfreeze()


def commit_on_a_full_filesystem(mnt: Path, base: Path, sample: dict) -> None:
    d = mnt / "index"
    failed_at: set[str] = set()
    outcomes = []
    ref = build(sample, [p for i, p in enumerate(sample["corpus"][:20])
                         if i not in REMOVED] + sample["corpus"][20:])
    w = prev = None
    # slack grows until a commit fits: how many pages that takes depends on how the kernel
    # charges tmpfs pages to files (large folios included)
    for pages in range(0, 64):
        w = prev = None
        gc.collect()  # a removed file's space returns once no memory map holds it
        shutil.rmtree(d, ignore_errors=True)
        copy(base, d)
        filler = fill(mnt, leave=pages * 4096)
        before = snapshot(d)
        w = IndexWriter(d, device="cpu", compact_after=None).open()
        prev = w.index
        stage(w, sample)
        try:
            w.commit()
            outcomes.append("ok")
        except DiskFullError as e:
            outcomes.append("full")
            check_error(e, d, prev.version, "commit")
            failed_at.add(Path(e.path).name)
            check_unchanged(d, before, prev)
            filler.unlink()
            w.commit()
        w.close()
        filler.unlink(missing_ok=True)
        assert leftovers(d) == []
        assert_same_index(load_index(d, device="cpu"), ref)
        if outcomes[-1] == "ok":
            break
    print("slack pages -> outcome:", outcomes, "files the disk ran out at:", sorted(failed_at))
    assert outcomes[0] == "full" and outcomes[-1] == "ok", outcomes
    assert len(failed_at) >= 2, failed_at  # the disk ran out at different files
    # commits of one passage each until one fails
    w = prev = None
    gc.collect()
    shutil.rmtree(d)
    copy(base, d)
    filler = fill(mnt, leave=8 * 4096)
    added: list[Passage] = []
    with IndexWriter(d, device="cpu", compact_after=None) as w:
        for p in sample["corpus"][20:]:
            before, prev = snapshot(d), w.index
            w.insert([p], sample["openie"])
            try:
                w.commit()
            except DiskFullError as e:
                check_error(e, d, prev.version, "commit")
                check_unchanged(d, before, prev)
                break
            added.append(p)
        else:
            pytest.fail("the disk never filled")
        filler.unlink()
        w.commit()
        added.append(p)
    assert_same_index(load_index(d, device="cpu"),
                      build(sample, sample["corpus"][:20] + added))
    assert leftovers(d) == []
