"""A full disk under the caches and the OpenIE file: the embedding cache failed at its k-th
write for every k (tests/storage/diskfull.py) keeps whole shards only and the next run sends
only what no shard holds; the LLM cache (SQLite, its own I/O) on a real small tmpfs keeps every
stored result; extraction stops naming the cache and a rerun resumes; extract_openie's JSON
failed at each write leaves no partial file and a rerun writes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from hippo_gpu.errors import DiskFullError
from tests.llm.recorded_llm import CORPUS, RecordedBackend, passage_of, recorded
from tests.storage.diskfull import FullDisk, count_writes, distinct_steps, generic
from tests.storage.full_disk_checks import (
    fill,
    small_tmpfs,
)

pytestmark = pytest.mark.usefixtures("one_thread")

runner = CliRunner()

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


def test_extract_output_fails_cleanly_at_every_write_and_a_rerun_writes_it(tmp_path):
    """extract_openie's JSON (written through write_atomic) failing at each write: DiskFullError
    naming the file, no temporary file left, no partial file at OUT; the rerun with space
    writes the same file as an undisturbed run, from the cache (only the passage that failed,
    which every run retries, is asked of the LLM again)."""
    from hippo_gpu.llm.extract import extract_openie

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
        assert {passage_of(r).split("\n", 1)[0] for r in backend.requests} == {"Epsilon"}
