"""A full disk at every write: a commit, a compaction, a first save (and a save over an index),
the embedding cache and the batch job's parts, each failed at its k-th write operation for
every k a dry run counts (tests/storage/diskfull.py: open, write, fsync, mkdir, rename with ENOSPC);
then a real size-limited tmpfs, filled until commits fail.

For each k of an index write: DiskFullError names the file and says the index keeps its
version (the CLI: exit 2, one line, no traceback); the directory is unchanged byte for byte
(nothing partial or left over) and loads verified as the previous version; once the disk has
space the same writer's retry succeeds and equals a fresh build. A failure after the commit
point (the folder's fsync after the manifest's rename) is no error: the commit is made.
References are fresh builds (hash:64 vectors, deterministic), never the code under test.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import logging
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hippo_gpu import Searcher, build_index, load_index
from hippo_gpu.cli import app
from hippo_gpu.data import Passage
from hippo_gpu.errors import DiskFullError
from hippo_gpu.indexing.index import Index
from hippo_gpu.retrieval.batch import retrieve_file
from hippo_gpu.sample import paths
from hippo_gpu.storage.directory import MANIFEST, IndexFormatError, is_index_dir, read_manifest
from hippo_gpu.storage.safetensors_io import load_safetensors_mmap
from hippo_gpu.versions.writer import IndexWriter
from tests.storage.diskfull import FullDisk, count_writes, distinct_steps, generic
from tests.versions.test_writer import assert_same_index, leftovers, snapshot

ENCODER = "hash:64"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def sample() -> dict:
    files = paths()
    corpus = [Passage(p["title"], p["text"])
              for p in json.loads(files["corpus"].read_text(encoding="utf-8"))]
    return {"corpus": corpus, "openie": json.loads(files["openie"].read_text(encoding="utf-8")),
            "openie_path": files["openie"]}


def build(sample: dict, passages: list[Passage], out: Path | None = None) -> Index:
    return build_index(passages, sample["openie"], out, encoder=ENCODER, device="cpu")


# the change every commit here makes: two of the first 20 passages out, the other 10 in
REMOVED = (0, 5)


def stage(w: IndexWriter, sample: dict) -> None:
    w.delete([sample["corpus"][i].key for i in REMOVED])
    w.insert(sample["corpus"][20:], sample["openie"])


@pytest.fixture(scope="module")
def base(sample: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 20 sample passages, saved with their basis (tests work on copies)."""
    out = tmp_path_factory.mktemp("full_disk_base") / "index"
    build(sample, sample["corpus"][:20], out)
    return out


@pytest.fixture(scope="module")
def committed(base: Path, sample: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`base` with the change committed as a segment (what a compaction folds)."""
    out = tmp_path_factory.mktemp("full_disk_committed") / "index"
    shutil.copytree(base, out)
    with IndexWriter(out, device="cpu", compact_after=None) as w:
        stage(w, sample)
    return out


@pytest.fixture(scope="module")
def reference(sample: dict) -> Index:
    """A fresh build of the corpus after the change, in the writer's order."""
    kept = [p for i, p in enumerate(sample["corpus"][:20]) if i not in REMOVED]
    return build(sample, kept + sample["corpus"][20:])


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def commit_point(ops: list[str]) -> int:
    """The 1-based number of the first rename of the manifest among `ops` (a commit's, when a
    compaction follows): every failure up to it raises, none after it (the folder's fsync).
    A manifest written in place (no rename: not atomic) commits at its last write."""
    manifest = rf"(.*/)?{re.escape(MANIFEST)}"
    renames = [i for i, op in enumerate(ops, 1)
               if op.startswith("replace ") and re.search(rf"-> {manifest}$", op)]
    writes = [i for i, op in enumerate(ops, 1) if re.fullmatch(rf"write {manifest}", op)]
    assert renames or writes, f"the manifest is never written: {ops}"
    return renames[0] if renames else writes[-1]


def check_error(err: BaseException, index_dir: Path, version: int | None, what: str) -> None:
    """One line, naming the index, the file (inside it) and the version kept."""
    msg = str(err)
    assert isinstance(err, DiskFullError) and err.errno == errno.ENOSPC, repr(err)
    assert "\n" not in msg and msg.startswith(f"{index_dir}: no space left on device for the "
                                              f"{what}"), msg
    assert f"(writing {index_dir}" in msg, msg
    assert f"the index keeps version {version}" in msg, msg


def check_unchanged(index_dir: Path, before: dict[str, str], prev: Index) -> None:
    """Byte for byte what it was (no new file, none changed), and it loads, verified, as the
    version it held."""
    assert snapshot(index_dir) == before
    loaded = load_index(index_dir, device="cpu", verify=True)
    assert loaded.version == prev.version and loaded.passage_keys == prev.passage_keys


def named_files(index_dir: Path) -> dict[str, str]:
    """sha256 of every file the manifest names (its base's and its segments'), by name."""
    m = read_manifest(index_dir)
    files = {**m["files"], **{k: v for s in m.get("segments", []) for k, v in s["files"].items()}}
    return {k: v["sha256"] for k, v in files.items()}


def check_like(index_dir: Path, undisturbed: Path, version: int | None) -> None:
    """The retry wrote what an undisturbed run wrote (which equals a fresh build: each test
    checks that once), loads verified at `version`, and left nothing else. Files are equal
    byte for byte, but for the basis's solve time (its last scalar)."""
    got, want = named_files(index_dir), named_files(undisturbed)
    assert got.keys() == want.keys()
    for name in [k for k in got if got[k] != want[k]]:
        assert name.endswith("/basis.safetensors"), name
        a, b = (load_safetensors_mmap(root / name) for root in (index_dir, undisturbed))
        a["scalars"], b["scalars"] = a["scalars"][:-1], b["scalars"][:-1]
        assert a.keys() == b.keys() and all(torch.equal(a[t], b[t]) for t in a), name
    assert load_index(index_dir, device="cpu", verify=True).version == version
    assert leftovers(index_dir) == []


# every step by default (inner write() calls of one file leave the same state as its last);
# every write call behind the slow marker
SWEEPS = [pytest.param(False, id="each_step"),
          pytest.param(True, id="every_write", marks=pytest.mark.slow)]


def faults(ops: list[str], every: bool) -> list[int]:
    return list(range(1, len(ops) + 1)) if every else distinct_steps(ops)


# -- commit ------------------------------------------------------------------------------------


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


# -- compaction --------------------------------------------------------------------------------


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


# -- first save, and a save over an index ------------------------------------------------------


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


# -- the embedding cache -----------------------------------------------------------------------


TEXTS = [f"text {i}: the kafo river runs north " * (i % 3 + 1) for i in range(24)]
SHARD = 8  # texts per cache shard: 3 shards


@pytest.fixture(scope="module")
def embedding_server() -> Iterator[tuple[object, str]]:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from hippo_gpu.embed import HashEncoder
    from tests.embed.embedding_server import EmbeddingState, serving

    state = EmbeddingState(HashEncoder(64))
    with serving(state) as url:
        yield state, url


def server_encoder(url: str, cache: Path):
    from hippo_gpu.config import EncoderConfig, RemoteEncoderConfig
    from hippo_gpu.embed import Encoder

    remote = RemoteEncoderConfig(backoff=0.01, timeout=5.0, max_batch_texts=SHARD,
                                 concurrency=1)
    return Encoder(EncoderConfig(model=f"openai:hash-64@{url}", remote=remote),
                   torch.device("cpu"), cache_dir=cache)


def sent(state) -> list[str]:
    with state.lock:
        texts = [t for r in state.requests for t in r["inputs"]]
        state.requests.clear()
        state.answered.clear()
    return texts


@pytest.mark.parametrize("sticky", [True, False], ids=["full_from_k_on", "only_write_k"])
def test_embedding_cache_survives_a_full_disk_at_every_write(embedding_server, tmp_path,
                                                             sticky):
    """An encoding whose cache writes fail (every write from the k-th on, or the k-th alone)
    still returns every vector; the cache keeps whole shards only (no temporary file, every
    cached row right), and the next run sends exactly the texts no shard holds."""
    from hippo_gpu.embed import HashEncoder
    from hippo_gpu.embed.encoder import text_digest

    state, url = embedding_server
    want = torch.from_numpy(HashEncoder(64)(TEXTS))
    dry = tmp_path / "dry"
    ops = count_writes(dry, lambda: server_encoder(url, dry).encode(TEXTS, shard_size=SHARD))
    sent(state)
    # shard j's writes: from its temporary file's open to its rename (the commit of the shard)
    shards = [(i, i + 3) for i, op in enumerate(ops, 1)
              if op.startswith("open ") and "/.shard-" in op]
    assert len(shards) == len(TEXTS) // SHARD and \
        all(ops[r - 1].startswith("replace ") for _, r in shards), ops
    for k in range(1, len(ops) + 1):
        cache = tmp_path / f"k{k}"
        with FullDisk(cache, fail_at=k, sticky=sticky) as disk:
            got = server_encoder(url, cache).encode(TEXTS, shard_size=SHARD)
        assert disk.failed
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        assert sorted(sent(state)) == sorted(TEXTS)
        assert not [p for p in cache.rglob("*") if ".tmp-" in p.name]
        # what survived: whole shards, the ones whose writes all came before the disk filled
        # (sticky) or that the one failed write did not belong to
        kept = sum(r < k for _, r in shards) if sticky else \
            len(shards) - sum(a <= k <= r for a, r in shards)
        again = server_encoder(url, cache)
        cached = {t for t in TEXTS if again.cache is not None
                  and again.cache.get(text_digest(t)) is not None}
        assert len(cached) == SHARD * kept, (k, ops[k - 1], disk.failed)
        for t in cached:  # every cached row is the right vector
            row = torch.from_numpy(again.cache.get(text_digest(t)))
            torch.testing.assert_close(row, want[TEXTS.index(t)], rtol=0, atol=1e-6)
        torch.testing.assert_close(again.encode(TEXTS, shard_size=SHARD), want, rtol=0,
                                   atol=1e-6)
        resent = sent(state)
        assert sorted(resent) == sorted(set(TEXTS) - cached)  # only what is missing, once
        server_encoder(url, cache).encode(TEXTS, shard_size=SHARD)
        assert sent(state) == []  # now every text is cached


# -- the batch job's parts ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def searcher(sample: dict) -> Searcher:
    return Searcher(build(sample, sample["corpus"]))


QUESTIONS = ["Who designed the lighthouse on Skerrow?", "Which river flows north?",
             "Who founded the college?", "Where was the tidal clock invented?"]


def query_file(tmp_path: Path, repeat: int) -> tuple[list[dict], Path]:
    """QUESTIONS `repeat` times as a JSONL query file with ids: (rows, path)."""
    rows = [{"id": i, "query": q} for i, q in enumerate(QUESTIONS * repeat)]
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows, queries


def test_retrieve_parts_resume_after_a_full_disk_at_every_write(searcher, tmp_path):
    """retrieve_file failing at each write (run file, parts, the join): the rerun with space
    answers only the rows no committed part holds, and OUT has every id exactly once, in
    order, with the keys of an undisturbed run."""
    rows, queries = query_file(tmp_path, 3)
    kw = {"mode": "hipporag2", "top_k": 3, "batch_size": 3, "part_size": 3,
          "show_progress": False}
    clean = tmp_path / "clean" / "out.jsonl"
    ops = count_writes(clean.parent, lambda: retrieve_file(searcher, queries, clean, **kw))
    want = clean.read_text().splitlines()
    assert [json.loads(x)["id"] for x in want] == [r["id"] for r in rows]
    for k in range(1, len(ops) + 1):
        out = tmp_path / f"k{k}" / "out.jsonl"
        with FullDisk(out.parent, fail_at=k) as disk:
            try:
                retrieve_file(searcher, queries, out, **kw)
                raised = False
            except DiskFullError as e:
                raised = True
                assert str(e).startswith(f"{out}") and "no space left on device" in str(e)
        # only a failed fsync of a folder after the very last rename goes unreported
        assert raised == (k < len(ops)), (k, ops[k - 1], disk.failed)
        parts = out.with_name(out.name + ".parts")
        done = sorted(p.name for p in parts.glob("part-*.jsonl")) if parts.exists() else []
        assert not list(out.parent.rglob(".*.tmp-*"))
        if raised:
            report = retrieve_file(searcher, queries, out, **kw)
            assert report.resumed == 3 * len(done)
            assert report.answered == len(rows) - 3 * len(done)
        assert out.read_text().splitlines() == want
        assert not parts.exists()
    # the command: exit 2 with one line when the second part finds the disk full; the same
    # command again finishes the file
    index_dir = searcher.index.save(tmp_path / "index")
    out = tmp_path / "cli" / "out.jsonl"
    args = ["retrieve", "--index", str(index_dir), "--queries", str(queries), "--out", str(out),
            "--top-k", "3", "--batch-size", "3", "--part-size", "3", "--device", "cpu"]
    k = next(i for i, op in enumerate(ops, 1) if "part-000001" in op)
    with FullDisk(out.parent, fail_at=k):
        result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: {out}.parts/part-000001.jsonl: no space left on "
                                    "device"), result.output
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert out.read_text().splitlines() == want


# -- a real small filesystem ---------------------------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(where: Path, size_kib: int) -> Iterator[Path]:
    """A tmpfs of `size_kib` KiB mounted at `where` (skips where mounting is not permitted:
    it needs root, CAP_SYS_ADMIN); unmounted on the way out."""
    where.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs",
                           str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        gc.collect()  # memory maps of indexes read from it keep it busy
        if subprocess.run(["umount", str(where)]).returncode != 0:
            subprocess.run(["umount", "--lazy", str(where)], check=True)


def fill(folder: Path, leave: int = 0) -> Path:
    """Fill the filesystem of `folder` with one file, then free `leave` bytes of it."""
    filler = folder / f"filler-{uuid.uuid4().hex}"
    with filler.open("wb", buffering=0) as f:
        block = b"\0" * 4096
        with contextlib.suppress(OSError):
            while f.write(block):
                pass
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


def test_a_real_full_tmpfs_fails_commits_cleanly(base, sample, tmp_path):
    """On a 512 KiB tmpfs: the index, then a filler leaving `slack` bytes, for slack from 0
    to the size of a commit in 4 KiB pages; each commit either fails cleanly (DiskFullError,
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
    for pages in range(0, 12):
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



def test_llm_cache_on_a_real_full_tmpfs_keeps_every_stored_result(tmp_path):
    """SQLite writes through its own I/O (FullDisk cannot see it), so on a real 256 KiB tmpfs:
    results stored until the disk is full; the one that did not fit raises DiskFullError naming
    the cache file and is absent; every earlier one is there for a new reader; once space is
    freed the same store succeeds. A cache created on a full disk raises DiskFullError too."""
    from hippo_gpu.llm.cache import LLMCache

    with small_tmpfs(tmp_path / "mnt", 256) as mnt:
        path = mnt / "llm.sqlite"
        cache = LLMCache(path)
        filler = fill(mnt, leave=16 * 4096)
        stored: list[str] = []
        with pytest.raises(DiskFullError) as info:
            for i in range(1000):
                cache.put_ok(f"k{i}", "openie", {"triples": f"{i} " + "x" * 2000})
                stored.append(f"k{i}")
        assert info.value.path == str(path) and str(path) in str(info.value)
        assert "no space left" in str(info.value) and "{" not in str(info.value)
        failed = f"k{len(stored)}"
        assert 0 < len(stored) < 1000 and cache.get(failed) is None
        with LLMCache(path) as reader:
            got = reader.get_many(stored)
        assert sorted(got) == sorted(stored)
        assert all(got[k].value["triples"].startswith(k[1:] + " ") for k in stored)
        filler.unlink()
        cache.put_ok(failed, "openie", {"triples": "late"})
        assert cache.get_ok(failed) == {"triples": "late"}
        assert cache.counts("openie") == {"ok": len(stored) + 1}
        cache.close()
        filler = fill(mnt)
        with pytest.raises(DiskFullError) as info:
            LLMCache(mnt / "new.sqlite")
        assert info.value.path == str(mnt / "new.sqlite")
        filler.unlink()


def test_extraction_on_a_full_tmpfs_stops_with_the_cache_named_and_a_rerun_resumes(tmp_path):
    """extract_openie on a full disk: DiskFullError naming the cache (not a passage failure);
    once space is freed the rerun finishes from the results cached before the disk ran out."""
    from hippo_gpu.llm.extract import extract_openie
    from tests.llm.test_extract import CORPUS, RecordedBackend, recorded

    with small_tmpfs(tmp_path / "mnt", 256) as mnt:
        cache = mnt / "openie.cache.sqlite"
        first = RecordedBackend(recorded)
        extract_openie(CORPUS[:1], first, None, cache_path=cache, show_progress=False)
        filler = fill(mnt)
        with pytest.raises(DiskFullError) as info:
            extract_openie(CORPUS, RecordedBackend(recorded), None, cache_path=cache,
                           show_progress=False)
        assert info.value.path == str(cache)
        filler.unlink()
        again = RecordedBackend(recorded)
        report = extract_openie(CORPUS, again, tmp_path / "openie.json", cache_path=cache,
                                show_progress=False)
        assert report.cached == 1 and (report.done, report.failed) == (1, 1)
        assert not any("Alpha" in r.messages[-1]["content"] for r in again.requests)


def test_parquet_answers_on_a_real_full_tmpfs_fail_cleanly_and_resume(searcher, tmp_path):
    """pyarrow writes Parquet through its own I/O (FullDisk cannot see it), so on a real
    256 KiB tmpfs with a filler leaving 0, 1, 2 ... pages: each run of retrieve_file to a
    .parquet OUT either finishes or raises DiskFullError naming a file under OUT's folder;
    with the space back the rerun finishes, and OUT holds every row once, as a clean run's.
    The sweep runs until a run finishes, and must have met the full disk both at a part and
    at the Parquet join."""
    pq = pytest.importorskip("pyarrow.parquet")
    rows, queries = query_file(tmp_path, 6)
    kw = {"mode": "hipporag2", "top_k": 5, "batch_size": 4, "part_size": 4,
          "show_progress": False}
    clean = tmp_path / "clean.parquet"
    retrieve_file(searcher, queries, clean, **kw)
    want = pq.read_table(clean).to_pylist()
    failed_at: list[str] = []
    with small_tmpfs(tmp_path / "mnt", 256) as mnt:
        out = mnt / "out" / "answers.parquet"
        for pages in range(64):
            shutil.rmtree(out.parent, ignore_errors=True)
            out.parent.mkdir()
            filler = fill(mnt, leave=pages * 4096)
            try:
                retrieve_file(searcher, queries, out, **kw)
                finished = True
            except DiskFullError as e:
                finished = False
                assert Path(e.path).is_relative_to(out.parent), e.path
                assert str(e).startswith(e.path) and "no space left" in str(e)
                failed_at.append(Path(e.path).name)
            filler.unlink()
            if not finished:
                retrieve_file(searcher, queries, out, **kw)
            assert pq.read_table(out).to_pylist() == want
            assert not list(out.parent.glob(".*.tmp-*"))
            if finished:
                break
    assert finished, failed_at
    assert out.name in failed_at and any(n.startswith("part-") for n in failed_at), failed_at


def test_extract_output_fails_cleanly_at_every_write_and_a_rerun_writes_it(tmp_path):
    """extract_openie's JSON (written through write_atomic) failing at each write: DiskFullError
    naming the file, no temporary file left, no partial file at OUT; the rerun with space
    writes the same file as an undisturbed run, from the cache (only the passage that failed,
    which every run retries, is asked of the LLM again)."""
    from hippo_gpu.llm.extract import extract_openie
    from tests.llm.test_extract import CORPUS, RecordedBackend, _passage_of, recorded

    cache = tmp_path / "cache.sqlite"  # outside the failing folders: only the JSON fails
    clean = tmp_path / "clean" / "openie.json"
    clean.parent.mkdir()
    ops = count_writes(clean.parent, lambda: extract_openie(
        CORPUS, RecordedBackend(recorded), clean, cache_path=cache, show_progress=False))
    want = clean.read_bytes()
    assert {generic(op) for op in ops} == {  # the temporary file, its rename, the folder
        "open .openie.json.tmp-*", "write .openie.json.tmp-*", "fsync .openie.json.tmp-*",
        "replace .openie.json.tmp-* -> openie.json", "fsync ."}, ops
    for k in distinct_steps(ops):
        out = tmp_path / f"k{k}" / "openie.json"
        out.parent.mkdir()
        backend = RecordedBackend(recorded)
        with FullDisk(out.parent, fail_at=k):
            try:
                extract_openie(CORPUS, backend, out, cache_path=cache, show_progress=False)
                raised = False
            except DiskFullError as e:
                raised = True
                assert str(e).startswith(f"{out}: no space left on device"), str(e)
        # only a failed fsync of the folder after the rename goes unreported (it is logged)
        assert raised == (k < len(ops)), (k, ops[k - 1])
        assert not list(out.parent.glob(".*.tmp-*"))
        assert not out.exists() or out.read_bytes() == want
        extract_openie(CORPUS, backend, out, cache_path=cache, show_progress=False)
        assert out.read_bytes() == want  # only the passage whose NER fails is asked again
        assert {_passage_of(r).split("\n", 1)[0] for r in backend.requests} == {"Epsilon"}
