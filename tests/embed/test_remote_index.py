"""Indexes built through a server encoder ("openai:" models) on the bundled sample.

A loopback FastAPI server serving the bundled MiniLM's vectors (computed by hippo_gpu's local
Encoder in the server) gives, through `hippo-gpu index --encoder openai:...`, the index of the
default encoder: the same counts, synonym edges, embeddings (to float32 round-off), rankings and
recall. A server killed mid-build (a subprocess that SIGKILLs itself) leaves an error naming the
endpoint and the progress, and the re-run sends exactly the texts it never answered. A served
index with a server encoder sends one embeddings request per micro-batch, counted in /metrics.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
import httpx  # noqa: E402

from hippo_gpu import Searcher, build_index, load_index  # noqa: E402
from hippo_gpu.config import EncoderConfig, RemoteEncoderConfig  # noqa: E402
from hippo_gpu.data import read_questions  # noqa: E402
from hippo_gpu.embed import EmbeddingServerError  # noqa: E402
from hippo_gpu.evaluate import recall_at_k  # noqa: E402
from hippo_gpu.retrieval.entities import heuristic_entities  # noqa: E402
from hippo_gpu.sample import paths  # noqa: E402
from tests.embed.embedding_server import EmbeddingState, embedder, serving  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MODES = ("dense", "hipporag2", "hybrid", "hipporag1")
TIMING = ("basis_seconds",)  # stats fields that are measurements, not counts


@pytest.fixture(scope="module")
def minilm_server() -> Iterator[tuple[EmbeddingState, str]]:
    state = EmbeddingState(embedder("minilm"))
    with serving(state) as url:
        yield state, url


def comparable(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stats.items() if k not in TIMING + ("encoder",)}


def test_cli_index_through_the_server_equals_the_default_encoder(
        minilm_server, sample_index_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    state, url = minilm_server
    files = paths()
    out = tmp_path / "remote"
    run = CliRunner().invoke(app, [
        "index", "--corpus", str(files["corpus"]), "--openie", str(files["openie"]),
        "--out", str(out), "--device", "cpu", "--cache-dir", str(tmp_path / "cache"),
        "--encoder", f"openai:all-MiniLM-L6-v2@{url}"])
    assert run.exit_code == 0, run.output
    stats = [json.loads(CliRunner().invoke(app, ["stats", str(d), "--json"]).output)
             for d in (out, sample_index_dir)]
    assert comparable(stats[0]) == comparable(stats[1])
    assert stats[0]["encoder"] == "openai:all-MiniLM-L6-v2"

    remote, local = load_index(out, device="cpu"), load_index(sample_index_dir, device="cpu")
    assert remote.config.encoder.base_url == url
    for name in ("passage_emb", "phrase_emb", "fact_emb"):
        torch.testing.assert_close(getattr(remote, name), getattr(local, name),
                                   rtol=0, atol=1e-6)
    assert torch.equal(remote.synonym_src, local.synonym_src)
    assert torch.equal(remote.synonym_dst, local.synonym_dst)
    torch.testing.assert_close(remote.synonym_score, local.synonym_score, rtol=0, atol=1e-6)
    # every distinct text went to the server once, in requests within the default limits
    texts = state.texts_answered()
    assert len(texts) == len(set(texts)) == len(set(remote.passage_texts)) + \
        len(remote.phrases) + len(remote.facts)

    # queries go through the server too: rankings and recall equal the local encoder's
    questions = read_questions(files["questions"])
    queries = [q.question for q in questions]
    gold = [{p.key for p in q.gold} for q in questions]
    before = len(state.requests)
    via_server, via_local = Searcher(remote), Searcher(local)
    entities = heuristic_entities(queries)  # hipporag1 links them by cosine
    for mode in MODES:
        kw = {"query_entities": entities} if mode == "hipporag1" else {}
        got = via_server.retrieve(queries, top_k=10, mode=mode, **kw)
        want = via_local.retrieve(queries, top_k=10, mode=mode, **kw)
        assert [[h.key for h in r] for r in got] == [[h.key for h in r] for r in want], mode
        np.testing.assert_allclose([[h.score for h in r] for r in got],
                                   [[h.score for h in r] for r in want], rtol=1e-4, atol=1e-6)
        assert recall_at_k([[h.key for h in r] for r in got], gold) == \
            recall_at_k([[h.key for h in r] for r in want], gold)
    query_requests = [r for r in state.requests[before:] if r["inputs"] == queries]
    assert query_requests, "the queries were not embedded by the server in one request"


def _start_server(log: Path, die_after: int | None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.embed.embedding_server", "--vectors", "hash:64",
         "--log", str(log)] + (["--die-after", str(die_after)] if die_after else []),
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("PORT "), f"server did not start: {line!r}"
    url = f"http://127.0.0.1:{int(line.split()[1])}/v1"
    for _ in range(200):  # bound before listen: wait until it answers
        try:
            httpx.get(url.removesuffix("/v1") + "/docs", timeout=1)
            break
        except httpx.TransportError:
            import time

            time.sleep(0.05)
    return proc, url


def _answered(log: Path) -> list[str]:
    if not log.exists():
        return []
    return [t for line in log.read_text().splitlines() for t in json.loads(line)["inputs"]]


def test_server_killed_mid_build_then_rerun_sends_only_what_never_came(
        tmp_path: Path) -> None:
    files = paths()
    remote = RemoteEncoderConfig(max_batch_texts=8, concurrency=1, backoff=0.01, max_retries=2,
                                 timeout=10)
    cache = tmp_path / "cache"
    proc, url = _start_server(tmp_path / "first.jsonl", die_after=2)
    try:
        with pytest.raises(EmbeddingServerError) as e:
            build_index(files["corpus"], files["openie"], tmp_path / "a", device="cpu",
                        encoder=EncoderConfig(model=f"openai:hash-64@{url}", remote=remote),
                        cache_dir=cache)
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == -9  # it really died by SIGKILL, mid-build
    first = _answered(tmp_path / "first.jsonl")
    assert len(first) == 16  # two requests of 8 passages answered before the third killed it
    assert f"{url}/embeddings" in str(e.value)
    assert "16 of the 30 texts to send were received and cached" in str(e.value)
    assert not (tmp_path / "a").exists()  # no index from a failed build

    proc, url2 = _start_server(tmp_path / "second.jsonl", die_after=None)
    try:
        index = build_index(files["corpus"], files["openie"], tmp_path / "a", device="cpu",
                            encoder=EncoderConfig(model=f"openai:hash-64@{url2}", remote=remote),
                            cache_dir=cache)
    finally:
        proc.kill()
        proc.wait(10)
    second = _answered(tmp_path / "second.jsonl")
    assert not set(first) & set(second)  # nothing received before was sent again
    assert len(second) == len(set(second))
    reference = build_index(files["corpus"], files["openie"], None, device="cpu",
                            encoder="hash:64")
    # the distinct texts of the build (passages, phrases, facts), each sent once in all
    assert len(first) + len(second) == len(set(reference.passage_texts)) + \
        len(reference.phrases) + len(reference.facts)
    assert comparable(index.stats()) == comparable(reference.stats())
    assert torch.equal(index.synonym_src, reference.synonym_src)
    torch.testing.assert_close(index.passage_emb, reference.passage_emb, rtol=0, atol=1e-6)
    torch.testing.assert_close(index.fact_emb, reference.fact_emb, rtol=0, atol=1e-6)


def test_served_index_sends_one_embeddings_request_per_micro_batch(
        minilm_server, sample_index_dir: Path, tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from hippo_gpu.serve.batcher import BatcherConfig
    from hippo_gpu.serve.server import ServerConfig
    from tests.serve.helpers import serving as serving_app

    state, url = minilm_server
    files = paths()
    build_index(files["corpus"], files["openie"], tmp_path / "remote", device="cpu",
                encoder=f"openai:all-MiniLM-L6-v2@{url}", cache_dir=tmp_path / "cache")
    searcher = Searcher(load_index(tmp_path / "remote", device="cpu"))
    config = ServerConfig(BatcherConfig(max_batch=16, max_wait_ms=300, max_queue=64))
    queries = [f"who built the tidal clock {i}?" for i in range(6)]

    def counters(text: str) -> dict[str, float]:
        return {s.name: s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name.startswith(("hippo_remote_encode",
                                                         "hippo_batch_size_count"))}

    with serving_app(searcher, config) as (app_url, _):
        async def concurrent() -> list[Any]:
            async with httpx.AsyncClient(base_url=app_url, timeout=60) as ac:
                return await asyncio.gather(*(
                    ac.post("/v1/retrieve", json={"queries": [q], "mode": "dense"})
                    for q in queries))

        before_requests = len(state.requests)
        assert all(r.status_code == 200 for r in asyncio.run(concurrent()))
        metrics = counters(httpx.get(app_url + "/metrics").text)
    sent = state.requests[before_requests:]
    batches = metrics["hippo_batch_size_count"]
    assert 1 <= batches < len(queries)  # the queries were merged
    assert len(sent) == batches  # one embeddings request per micro-batch, not per query
    assert sorted(t for r in sent for t in r["inputs"]) == sorted(queries)
    assert metrics['hippo_remote_encode_calls_total'] == batches
    assert metrics['hippo_remote_encode_requests_total'] == batches
    assert metrics['hippo_remote_encode_texts_total'] == len(queries)
    assert metrics['hippo_remote_encode_retries_total'] == 0
    assert metrics['hippo_remote_encode_failures_total'] == 0
    assert metrics['hippo_remote_encode_seconds_total'] > 0


def test_insert_and_instructed_queries_through_the_server(
        minilm_server, sample_index_dir: Path, tmp_path: Path) -> None:
    """`hippo-gpu insert` on an index built through the server reaches the URL the index
    recorded (and sends only the new texts); a query instruction is put in front of the query
    the server embeds, exactly as for a local model."""
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    state, url = minilm_server
    files = paths()
    corpus = json.loads(Path(files["corpus"]).read_text())
    (tmp_path / "rest.json").write_text(json.dumps(corpus[20:]))
    cache = tmp_path / "cache"
    build_index(corpus[:20], files["openie"], tmp_path / "idx", device="cpu",
                encoder=f"openai:all-MiniLM-L6-v2@{url}", cache_dir=cache)
    before = len(state.requests)
    run = CliRunner().invoke(app, ["insert", str(tmp_path / "idx"), "--corpus",
                                   str(tmp_path / "rest.json"), "--openie", str(files["openie"]),
                                   "--device", "cpu", "--cache-dir", str(cache)])
    assert run.exit_code == 0, run.output
    grown, full = load_index(tmp_path / "idx", device="cpu"), load_index(sample_index_dir)
    assert comparable(grown.stats()) == comparable(full.stats())
    sent = set(t for r in state.requests[before:] for t in r["inputs"])
    contents = [f"{c['title']}\n{c['text']}" for c in corpus]
    assert set(contents[20:]) <= sent  # the new passages went to the recorded URL
    assert not set(contents[:20]) & sent  # the old ones were not sent again

    instructed = EncoderConfig(model=f"openai:all-MiniLM-L6-v2@{url}",
                               query_instructions={"query_to_passage": "find the passage",
                                                   "query_to_fact": ""})
    from hippo_gpu.embed import Encoder

    got = Encoder(instructed, torch.device("cpu")).encode_queries(["tidal clock"],
                                                                  "query_to_passage")
    assert state.requests[-1]["inputs"] == ["Instruct: find the passage\nQuery: tidal clock"]
    local = Encoder(EncoderConfig(query_instructions=instructed.query_instructions),
                    torch.device("cpu")).encode_queries(["tidal clock"], "query_to_passage")
    torch.testing.assert_close(got, local, rtol=0, atol=1e-6)

    # a spec (serve, retrieve, eval) names the model and may move the URL; another model fails
    from hippo_gpu.retrieval.spec import SearcherSpec
    from hippo_gpu.storage.directory import IndexFormatError

    dead = "http://127.0.0.1:9/v1"  # the discard port: nothing answers there
    moved = SearcherSpec(tmp_path / "idx", device="cpu",
                         encoder_model=f"openai:all-MiniLM-L6-v2@{dead}").open()
    assert moved.encoder_config.base_url == dead
    assert SearcherSpec(tmp_path / "idx", device="cpu").open().encoder_config.base_url == url
    with pytest.raises(IndexFormatError, match="built with encoder 'openai:all-MiniLM-L6-v2'"):
        SearcherSpec(tmp_path / "idx", device="cpu", encoder_model="openai:other@" + url).open()
