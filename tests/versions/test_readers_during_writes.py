"""Readers during writes: readers querying while commits land always see one consistent
version; a reader racing a garbage collection reads again; a Searcher refreshes by replaying only
the new segments.
"""

from __future__ import annotations

import threading
import time

import pytest

from hippo_gpu import load_index
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.versions.writer import IndexWriter
from tests.versions.index_checks import (
    MODES,
    assert_same_index,
    copy_index,
    docs_for,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_readers_during_commits_see_one_consistent_version(enc, sample, base_dir, tmp_path):
    index_dir = copy_index(base_dir, tmp_path / "index")
    corpus = sample["corpus"]
    versions: dict[int, list[str]] = {1: load_index(index_dir, device="cpu").passage_keys}
    seen: list[tuple[int | None, list[str], set[str]]] = []
    errors: list[str] = []
    started = [threading.Event() for _ in range(2)]
    done = threading.Event()

    def reader(n: int) -> None:
        i = 0
        while True:
            last = done.is_set()
            try:
                idx = load_index(index_dir, device="cpu")
                hits = Searcher(idx, encoder=enc).retrieve(
                    sample["questions"], top_k=5, mode=MODES[(i + n) % len(MODES)])
                assert idx.num_nodes == len(idx.phrases) + len(idx.passage_keys)
                seen.append((idx.version, list(idx.passage_keys),
                             {h.key for hs in hits for h in hs}))
            except Exception as e:  # noqa: BLE001 - collected and asserted empty below
                errors.append(repr(e))
            started[n].set()
            i += 1
            if last:
                return

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(120)
    changes = [("insert", corpus[20:22]), ("delete", corpus[0:2]), ("insert", corpus[22:25]),
               ("delete", corpus[20:21]), ("insert", corpus[25:30]), ("delete", corpus[5:8])]
    try:
        with IndexWriter(index_dir, device="cpu", encoder=enc) as w:
            for kind, passages in changes:
                if kind == "insert":
                    w.insert(passages, docs_for(sample, passages))
                else:
                    w.delete([p.key for p in passages])
                w.commit()
                report = w.last_change
                versions[report.version] = list(w.index.passage_keys)
                if report.compacted:  # the segment version readers may have seen first
                    versions[report.version - 1] = versions[report.version]
                time.sleep(0.1)
    finally:
        done.set()
        for t in threads:
            t.join(120)
    assert errors == []
    assert len({tuple(k) for k in versions.values()}) == len(changes) + 1
    counts = {len(k) for k in versions.values()}
    for version, keys, returned in seen:
        assert version in versions and keys == versions[version]
        assert len(keys) in counts
        assert returned <= set(keys), "a hit from another version"
    assert {v for v, _, _ in seen} >= {1, max(versions)}  # before the first and after the last


def test_reader_racing_garbage_collection_reads_again(enc, sample, base_dir, tmp_path,
                                                      monkeypatch):
    """The one interleaving the lock protocol must survive: a reader has read the manifest and
    opened the base's `.readers` file, then a commit, a compaction and its garbage collection
    remove that base before the reader's flock. The reader must read the new version, not
    fail on missing files."""
    import fcntl

    import hippo_gpu.storage.directory as store

    index_dir = copy_index(base_dir, tmp_path / "index")
    real_flock = fcntl.flock
    raced = []

    class RacingFcntl:
        def __getattr__(self, name):
            return getattr(fcntl, name)

        @staticmethod
        def flock(fd, op):
            if op == fcntl.LOCK_SH and not raced:
                raced.append(True)
                with IndexWriter(index_dir, device="cpu", encoder=enc, compact_after=None) as w:
                    w.insert(sample["corpus"][20:21], sample["openie_path"])
                    w.commit()
                    w.compact()
                assert not (index_dir / "v000001").exists()  # collected under the reader
            return real_flock(fd, op)

    monkeypatch.setattr(store, "fcntl", RacingFcntl())
    got = load_index(index_dir, device="cpu")
    assert raced and got.version == 3
    assert got.passage_keys == [p.key for p in sample["corpus"][:21]]


def test_a_searcher_refreshes_by_replaying_new_segments(enc, sample, base_dir, tmp_path,
                                                        monkeypatch):
    """Searcher.refresh after another writer's commits: the base is not read again (only the
    new segments), the refreshed version equals a load of the directory, with the same
    settings and encoder; with nothing new it returns the searcher itself."""
    import hippo_gpu.versions.load as versions_module
    from hippo_gpu import Searcher

    index_dir = copy_index(base_dir, tmp_path / "index")
    searcher = Searcher(load_index(index_dir, device="cpu"), encoder=enc)
    assert searcher.refresh() is searcher
    with IndexWriter(index_dir, device="cpu", encoder=enc, compact_after=None) as w:
        w.insert(sample["corpus"][20:24], sample["openie_path"])
        w.commit()
        w.delete([sample["corpus"][2].key])
    reads = []
    real = versions_module.read_index_dir
    monkeypatch.setattr(versions_module, "read_index_dir",
                        lambda path, **kw: reads.append(kw.get("after")) or real(path, **kw))
    fresh = searcher.refresh()
    assert reads == [1]  # only what came after version 1: the two segments
    assert fresh is not searcher and fresh.encoder is enc and fresh.config == searcher.config
    assert_same_index(fresh.index, load_index(index_dir, device="cpu"))
    assert fresh.index.version == 3 and fresh.refresh() is fresh
