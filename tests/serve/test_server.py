"""The query server, end to end: a real uvicorn on 127.0.0.1 over the real sample index.

Every test starts uvicorn on a free loopback port (in a thread, or the CLI in a subprocess) and
talks to it over HTTP. Served rankings are compared with offline `Searcher.retrieve` on the same
index, with the same entities, in every mode (tests/serve/test_openapi.py checks the schema itself).
Where a test needs a request to stay in flight (queue overflow, shutdown), the index is wrapped
in a gate that holds `retrieve` until the test opens it; the ranking still comes from the real
index.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
import uvicorn  # noqa: E402

from hippo_gpu.config import MODES  # noqa: E402
from hippo_gpu.retrieval.entities import heuristic_entities  # noqa: E402
from hippo_gpu.serve.batcher import BatcherConfig  # noqa: E402
from hippo_gpu.serve.config import QueryLimits  # noqa: E402
from hippo_gpu.serve.server import ServerConfig  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.serve.helpers import (  # noqa: E402
    Gate,
    assert_no_leak,
    assert_same_ranking,
    entity_variants,
    offline_hits,
    serving,
    subset_index,
    tensor_bytes_reference,
)

TOKEN = "test-token-8c1f"


# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def index_dir(sample_index_dir: Path) -> Path:
    """The bundled sample, indexed once per session (tests/conftest.py); a build error fails."""
    return sample_index_dir


@pytest.fixture(scope="module")
def searcher(index_dir: Path) -> Any:
    from hippo_gpu import Searcher, load_index

    return Searcher(load_index(index_dir, device="cpu"))


@pytest.fixture(scope="module")
def queries(searcher: Any) -> list[str]:
    """The sample question plus one question per passage title (titles are in the searcher)."""
    titles = sorted({h.title for hits in searcher.retrieve(["science"], top_k=50, mode="dense")
                     for h in hits})  # fmt: skip
    return ["Which Stanford University professor works on Alzheimer's?"] + [
        f"What is known about {t}?" for t in titles
    ]


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_results_equal_offline(searcher: Any, queries: list[str], mode: str) -> None:
    """Merged into batches, every request gets exactly its own offline ranking, in every mode.

    Requests of 1-3 queries with two top_k and every way of giving entities are sent at once;
    a 50 ms wait lets them meet. hipporag1 and hybrid mix requests with and without them
    (without: the question's capitalised spans), dense and hipporag2 get entities too (they
    ignore them).
    """
    requests = []
    for i in range(24):
        n = 1 + i % 3
        qs = [queries[(i + j) % len(queries)] for j in range(n)]
        variants = entity_variants(qs)
        req: dict[str, Any] = {"queries": qs, "top_k": 3 if i % 4 == 0 else 5, "mode": mode}
        ents = variants[(i // 3) % len(variants)]
        if ents is not None:
            req["entities"] = ents
        requests.append(req)
    config = ServerConfig(BatcherConfig(max_batch=16, max_wait_ms=50, max_queue=256))

    async def send_all(url: str) -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*(client.post("/v1/retrieve", json=r) for r in requests))

    with serving(searcher, config) as (url, _):
        responses = asyncio.run(send_all(url))
        stats = httpx.get(url + "/v1/stats").json()["batcher"]

    differs_from_heuristic = False
    for req, resp in zip(requests, responses, strict=True):
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["seeds"] is None
        ents = req.get("entities")
        offline = offline_hits(searcher, req["queries"], req["top_k"], mode, ents)
        assert len(body["results"]) == len(req["queries"])
        for served, expected in zip(body["results"], offline, strict=True):
            assert len(served) == min(req["top_k"], len(searcher.index.passage_keys))
            assert_same_ranking(served, expected)
        if mode in ("hipporag1", "hybrid") and ents is not None:
            heuristic = offline_hits(searcher, req["queries"], req["top_k"], mode, None)
            differs_from_heuristic |= [[h["key"] for h in r] for r in heuristic] != [
                [h["key"] for h in r] for r in offline
            ]
    if mode in ("hipporag1", "hybrid"):
        # Otherwise serving a with-entities query in a batch without them would go unnoticed.
        assert differs_from_heuristic, f"no request's entities changed its {mode} ranking"
    n_queries = sum(len(r["queries"]) for r in requests)
    assert stats["queries_served"] == n_queries
    assert stats["max_batch_size_seen"] <= 16
    assert stats["batches_served"] < len(requests)  # requests really were merged


def test_hybrid_batch_mixing_entities_and_heuristic(searcher: Any, queries: list[str]) -> None:
    """One query, sent at once with and without entities, gets both offline answers."""
    q = queries[0]
    given = [["alzheimer"]]  # not the heuristic's "Stanford University"
    assert heuristic_entities([q]) != given
    config = ServerConfig(BatcherConfig(max_batch=16, max_wait_ms=300, max_queue=64))
    bodies = [{"queries": [q], "top_k": 10, "mode": "hybrid", **({"entities": given} if i % 2
              else {})} for i in range(6)]  # fmt: skip

    async def send_all(url: str) -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            return await asyncio.gather(*(client.post("/v1/retrieve", json=b) for b in bodies))

    with serving(searcher, config) as (url, _):
        responses = asyncio.run(send_all(url))
        stats = httpx.get(url + "/v1/stats").json()["batcher"]
    alone = {None: offline_hits(searcher, [q], 10, "hybrid")[0],
             "given": offline_hits(searcher, [q], 10, "hybrid", given)[0]}  # fmt: skip
    assert [h["key"] for h in alone[None]] != [h["key"] for h in alone["given"]]
    for body, resp in zip(bodies, responses, strict=True):
        assert resp.status_code == 200, resp.text
        assert_same_ranking(resp.json()["results"][0], alone["given" if "entities" in body
                                                              else None])  # fmt: skip
    assert stats["batches_served"] < len(bodies)  # requests really were merged


def test_overflow_gets_429_and_queued_requests_still_complete(
    searcher: Any, queries: list[str]
) -> None:
    gate = Gate(searcher)
    config = ServerConfig(
        BatcherConfig(max_batch=2, max_wait_ms=0, max_queue=3), max_queries_per_request=2
    )

    async def scenario(url: str) -> tuple[list[Any], Any, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:

            def post(q: str) -> Any:
                return asyncio.create_task(
                    client.post("/v1/retrieve", json={"queries": [q], "top_k": 4, "mode": "dense"})
                )

            running = post(queries[0])
            while not gate.entered.is_set():  # the worker holds the first request
                await asyncio.sleep(0.005)
            waiting = [post(q) for q in queries[1:4]]
            for _ in range(2000):
                if (await client.get("/v1/stats")).json()["batcher"]["queue_depth"] == 3:
                    break
                await asyncio.sleep(0.005)
            overflow = await client.post(
                "/v1/retrieve", json={"queries": [queries[4 % len(queries)]], "top_k": 4}
            )
            stats = (await client.get("/v1/stats")).json()["batcher"]
            gate.opened.set()
            return [await t for t in [running, *waiting]], overflow, stats

    with serving(gate, config) as (url, _):
        done, overflow, stats = asyncio.run(scenario(url))
    assert overflow.status_code == 429
    assert overflow.headers.get("retry-after") == "1"
    assert "queue full" in overflow.json()["detail"]
    assert stats["requests_rejected"] == 1
    for q, resp in zip(queries[:4], done, strict=True):
        assert resp.status_code == 200, resp.text
        assert_same_ranking(resp.json()["results"][0], offline_hits(searcher, [q], 4, "dense")[0])


def test_oversized_and_invalid_input(searcher: Any, index_dir: Path) -> None:
    """Anything outside the schema is 422; only a body over the byte limit is 413."""
    config = ServerConfig(max_queries_per_request=4, limits=QueryLimits(
        max_query_chars=100, max_top_k=50, max_entities_per_query=2, max_entity_chars=20))
    cases_422 = [
        {"queries": ["q"] * 5},  # more than max_queries_per_request
        {"queries": ["x" * 101]},  # longer than max_query_chars
        {"queries": []},
        {"queries": [""]},
        {"queries": ["   "]},
        {"queries": ["\u3000\t\x1c"]},  # whitespace beyond ASCII is whitespace too
        {"queries": "not a list"},
        {"queries": [1, 2]},
        {"queries": ["q"], "mode": "bm25"},
        {"queries": ["q"], "top_k": 0},
        {"queries": ["q"], "top_k": 51},
        {"queries": ["q"], "top_k": "5"},  # strict types: no coercion the schema does not allow
        {"queries": ["q"], "top_k": 5.5},
        {"queries": ["q"], "return_seeds": "yes"},
        {"queries": ["q"], "unexpected": True},
        {"queries": ["q", "r"], "entities": [["a"]], "mode": "hybrid"},  # not one list per query
        {"queries": ["q"], "entities": [["a", "b", "c"]]},  # more than max_entities_per_query
        {"queries": ["q"], "entities": [["e" * 21]]},  # longer than max_entity_chars
        {"queries": ["q"], "entities": [[" "]]},
        {"queries": ["q"], "entities": ["a"]},
        {},
    ]
    accepted = [
        {"queries": ["q"], "top_k": 5.0, "mode": "dense"},  # JSON Schema: 5.0 is an integer
        {"queries": [" q "], "entities": None, "mode": "hybrid"},
        {"queries": ["q"], "entities": [[]], "mode": "hipporag1"},
        {"queries": ["q"], "mode": "hipporag1"},  # entities: the capitalised spans (none here)
        {"queries": ["q"], "mode": "hipporag1", "entities": None},
        {"queries": ["q", "r"], "entities": [["a"], []], "mode": "dense"},  # ignored by dense
    ]
    with serving(searcher, config) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        for body in cases_422:
            r = client.post("/v1/retrieve", json=body)
            assert r.status_code == 422, (body, r.text)
            assert isinstance(r.json()["detail"], list)
            assert_no_leak(r.text, index_dir)
        for body in accepted:
            r = client.post("/v1/retrieve", json=body)
            assert r.status_code == 200, (body, r.text)
            assert len(r.json()["results"]) == len(body["queries"])
        r = client.post("/v1/retrieve", json={"queries": ["q"], "mode": "hipporag1"})
        assert r.json()["entities"] == [[]]  # none found, and the answer says so
        for body, loc in (({"queries": ["q", " \u3000"]}, ["body", "queries", 1]),
                          ({"queries": [""]}, ["body", "queries", 0]),
                          ({"queries": ["q"], "entities": [["\t"]], "mode": "hybrid"},
                           ["body", "entities", 0, 0])):
            r = client.post("/v1/retrieve", json=body)
            assert r.json()["detail"] == [{"loc": loc, "msg": "is blank", "type": "blank"}], r.text
        r = client.post("/v1/retrieve", json={"queries": ["q", "r"], "entities": [["a"]]})
        assert "entities has 1 lists for 2 queries" in r.json()["detail"][0]["msg"]
        # Validation errors do not echo the input back.
        r = client.post("/v1/retrieve", json={"queries": ["q"], "mode": "secret-input-xyz"})
        assert r.status_code == 422 and "secret-input-xyz" not in r.text
        # The largest schema-valid request, every character escaped as a surrogate pair (12
        # bytes), still fits under the body limit and is answered.
        widest = {
            "queries": ["\U0001d11e" * 100] * 4,
            "entities": [["\U0001d11e" * 20] * 2] * 4,
            "top_k": 50,
            "mode": "hybrid",
            "return_seeds": True,
        }
        raw = json.dumps(widest, ensure_ascii=True)
        assert config.max_body_bytes / 2 < len(raw) <= config.max_body_bytes
        r = client.post("/v1/retrieve", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        # A body over the limit is refused whether its length is declared or streamed.
        big = json.dumps({"queries": ["y" * 90] * 4, "pad": "z" * config.max_body_bytes})
        r = client.post("/v1/retrieve", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert "limit" in r.json()["detail"]

        def chunks() -> Iterator[bytes]:
            yield big.encode()[:1000]
            yield big.encode()[1000:]

        r = client.post(
            "/v1/retrieve", content=chunks(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 413
        r = client.post(
            "/v1/retrieve", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 422
        # The server still answers normal requests.
        assert (
            client.post("/v1/retrieve", json={"queries": ["q"], "mode": "dense"}).status_code == 200
        )


def test_internal_errors_do_not_leak(searcher: Any, index_dir: Path) -> None:
    gate = Gate(searcher, raise_error=RuntimeError(f"failed reading {index_dir}/graph.safetensors"))
    gate.opened.set()
    with serving(gate, ServerConfig()) as (url, _):
        r = httpx.post(url + "/v1/retrieve", json={"queries": ["q"], "mode": "dense"})
        assert r.status_code == 500
        assert r.json() == {"detail": "internal server error"}
        assert_no_leak(r.text, index_dir)
        stats = httpx.get(url + "/v1/stats")
        assert stats.status_code == 200
        assert_no_leak(stats.text, index_dir)
        assert stats.json()["batcher"]["requests_failed"] == 1


def test_bearer_token(searcher: Any) -> None:
    body = {"queries": ["Stanford"], "top_k": 2, "mode": "dense"}
    with serving(searcher, ServerConfig(token=TOKEN)) as (url, _), httpx.Client(base_url=url) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = c.post("/v1/retrieve", json=body, headers=headers)
            assert r.status_code == 401, headers
            assert r.headers.get("www-authenticate") == "Bearer"
            assert TOKEN not in r.text
            assert c.get("/v1/stats", headers=headers).status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert c.post("/v1/retrieve", json=body, headers=auth).status_code == 200
        assert c.get("/v1/stats", headers=auth).status_code == 200
        # Probes and docs stay open.
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200


def test_health_ready_stats_docs(searcher: Any, index_dir: Path) -> None:
    with serving(searcher, ServerConfig()) as (url, _), httpx.Client(base_url=url) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json() == {"status": "ready"}
        for _ in range(3):
            c.post("/v1/retrieve", json={"queries": ["Stanford", "Alzheimer"], "mode": "dense"})
        r = c.get("/v1/stats")
        assert r.status_code == 200
        assert_no_leak(r.text, index_dir)
        s = r.json()
        for k, v in searcher.index.stats().items():
            if isinstance(v, (bool, int, float)):
                assert s["index"][k] == v
        b = s["batcher"]
        assert b["requests_served"] == 3 and b["queries_served"] == 6
        assert b["queue_depth"] == 0 and b["running"] is True
        assert b["mean_batch_size"] == 2.0
        assert 0 < b["latency_ms"]["p50"] <= b["latency_ms"]["p95"] <= b["latency_ms"]["p99"]
        docs = c.get("/docs")
        assert docs.status_code == 200 and "swagger" in docs.text.lower()
        # offline: every script, style sheet and icon of /docs and /redoc comes from here
        for page in ("/docs", "/redoc"):
            html = c.get(page).text
            urls = re.findall(r'(?:src|href)=["\']([^"\']+)', html)
            assert urls and all(u.startswith("/") for u in urls), (page, urls)
            assert "cdn." not in html and "fonts.googleapis" not in html, page
            for u in urls:
                asset = c.get(u)
                assert asset.status_code == 200 and len(asset.content) > 1000, u
        assert c.get("/docs/assets/other.js").status_code == 404
        home = c.get("/", follow_redirects=False)
        from hippo_gpu.serve import doc_pages

        def missing(name: str) -> bytes:  # a lean install without fastapi-offline
            raise ModuleNotFoundError("fastapi_offline")

        real = doc_pages._asset
        doc_pages._asset = missing  # type: ignore[assignment]
        try:
            lean = c.get("/docs/assets/swagger-ui.css")
        finally:
            doc_pages._asset = real
        assert lean.status_code == 503 and "pip install 'hippo-gpu[serve]'" in lean.text
        assert home.status_code == 307 and home.headers["location"] == "/ui/"
        spec = c.get("/openapi.json").json()
        assert {"/v1/retrieve", "/v1/stats", "/healthz", "/readyz"} <= set(spec["paths"])


def test_seed_facts_are_served(searcher: Any) -> None:
    body = {"queries": ["Stanford", "Alzheimer"], "top_k": 3, "mode": "hipporag2",
            "return_seeds": True}  # fmt: skip
    with serving(searcher, ServerConfig()) as (url, _):
        r = httpx.post(url + "/v1/retrieve", json=body, timeout=60)
    assert r.status_code == 200, r.text
    want = searcher.rank(body["queries"], top_k=3).seeds
    assert r.json()["seeds"] == [[list(f) for f in per_query] for per_query in want]


def test_shutdown_finishes_in_flight_batches(searcher: Any, queries: list[str]) -> None:
    gate = Gate(searcher)
    config = ServerConfig(BatcherConfig(max_batch=2, max_wait_ms=0, max_queue=64))
    sent = queries[:6]

    async def scenario(url: str, server: uvicorn.Server) -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            tasks = [
                asyncio.create_task(
                    client.post("/v1/retrieve", json={"queries": [q], "top_k": 3, "mode": "dense"})
                )
                for q in sent
            ]
            while True:  # one batch on the worker, the rest queued
                b = (await client.get("/v1/stats")).json()["batcher"]
                if b["in_flight"] + b["queue_depth"] == len(sent):
                    break
                await asyncio.sleep(0.005)
            server.should_exit = True  # as on SIGTERM: stop accepting, finish what is open
            await asyncio.sleep(0.2)
            gate.opened.set()
            return await asyncio.gather(*tasks)

    with serving(gate, config) as (url, server):
        responses = asyncio.run(scenario(url, server))
        refused = False
        for _ in range(300):  # the listening socket closes once should_exit is seen
            try:
                httpx.get(url + "/healthz", timeout=2)
            except httpx.TransportError:
                refused = True
                break
            time.sleep(0.05)
        assert refused, "server still accepting after shutdown"
    for q, r in zip(sent, responses, strict=True):
        assert r.status_code == 200, r.text
        assert_same_ranking(r.json()["results"][0], offline_hits(searcher, [q], 3, "dense")[0])


def test_cli_serves_with_token_from_env_and_exits_cleanly_on_sigint(
        sample_hash_index_dir: Path) -> None:
    # the hash:64 index: the server process starts without importing sentence-transformers
    index_dir = sample_hash_index_dir
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HIPPO_TEST_TOKEN": TOKEN}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    cmd = [sys.executable, "-m", "hippo_gpu.cli", "serve", "--index", str(index_dir),
           "--port", str(port), "--device", "cpu", "--token-env", "HIPPO_TEST_TOKEN",
           "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "CLI server not ready in 120 s"
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {"queries": ["Stanford"], "top_k": 2, "mode": "dense"}
        assert httpx.post(url + "/v1/retrieve", json=body, timeout=60).status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        r = httpx.post(url + "/v1/retrieve", json=body, headers=auth, timeout=60)
        assert r.status_code == 200 and len(r.json()["results"][0]) == 2
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert rc == 0, out
    assert TOKEN not in out


# ---------------------------------------------------------------------------------------------
# several indexes


@pytest.fixture(scope="module")
def part_searcher(tmp_path_factory: pytest.TempPathFactory, searcher: Any) -> Any:
    return subset_index(tmp_path_factory.mktemp("part"), searcher, 20)


def test_two_indexes_answer_independently(searcher: Any, part_searcher: Any,
                                          queries: list[str]) -> None:
    """One process serves the sample ("full") and its first 20 passages ("part"): requests sent
    at once to both get each index's own offline ranking; no index named means the first."""
    served = {"full": searcher, "part": part_searcher}
    config = ServerConfig(BatcherConfig(max_batch=16, max_wait_ms=50, max_queue=256))
    sent = queries[:8]
    requests = [(name, {"queries": [q], "top_k": 25, "mode": mode,
                        **({} if name is None else {"index": name})})
                for q in sent for name in ("full", "part", None)
                for mode in ("hipporag2", "dense")]  # fmt: skip

    async def send_all(url: str) -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            return await asyncio.gather(*(client.post("/v1/retrieve", json=body)
                                          for _, body in requests))

    with serving(served, config) as (url, _), httpx.Client(base_url=url, timeout=60) as c:
        responses = asyncio.run(send_all(url))
        listed = c.get("/v1/indexes").json()
        part_stats = c.get("/v1/stats", params={"index": "part"}).json()
        full_stats = c.get("/v1/stats").json()
        unknown = c.post("/v1/retrieve", json={"queries": ["q"], "index": "nope"})
        bad_stats = c.get("/v1/stats", params={"index": "nope"})

    differs = False
    for (name, body), resp in zip(requests, responses, strict=True):
        assert resp.status_code == 200, resp.text
        index_searcher = served[name or "full"]
        got = resp.json()["results"][0]
        assert_same_ranking(got, offline_hits(index_searcher, body["queries"], 25, body["mode"])[0])
        if name == "part":
            assert len(got) == 20 and {h["key"] for h in got} <= set(
                part_searcher.index.passage_keys)
            other = offline_hits(searcher, body["queries"], 25, body["mode"])[0]
            differs |= [h["key"] for h in got] != [h["key"] for h in other][:20]
    assert differs, "the two indexes gave the same rankings: the test would not see a mix-up"

    assert listed == {"indexes": [
        {"name": n, "version": s.index.version, "passages": len(s.index.passage_keys),
         "memory_bytes": tensor_bytes_reference(s.index), "device": "cpu",
         "precision": "float32"}
        for n, s in served.items()]}  # fmt: skip
    assert listed["indexes"][1]["memory_bytes"] < listed["indexes"][0]["memory_bytes"]
    # per-index batchers: each counted only its own queries
    assert part_stats["batcher"]["queries_served"] == len(sent) * 2
    assert full_stats["batcher"]["queries_served"] == len(sent) * 4
    assert part_stats["index"]["passage_nodes"] == 20
    assert unknown.status_code == 422
    assert "unknown index 'nope': this server serves 'full', 'part'" in unknown.text
    assert bad_stats.status_code == 422


def test_index_specs(tmp_path: Path) -> None:
    from hippo_gpu.serve.service import parse_index_spec, parse_index_specs

    a, b = tmp_path / "a", tmp_path / "x=y"
    a.mkdir()
    b.mkdir()
    assert parse_index_spec(str(a)) == ("default", a)
    assert parse_index_spec(f"main={a}") == ("main", a)
    assert parse_index_spec(str(b)) == ("default", b)  # "/" before "=": a path
    assert parse_index_specs([f"one={a}", f"two={b}"]) == {"one": a, "two": b}
    with pytest.raises(ValueError, match="is not a directory"):
        parse_index_specs([f"one={tmp_path / 'missing'}"])
    with pytest.raises(ValueError, match="the name 'default' is given twice"):
        parse_index_specs([str(a), str(b)])
    with pytest.raises(ValueError, match="no directory after"):
        parse_index_spec("one=")


def test_cli_rejects_bad_index_specs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    (tmp_path / "a").mkdir()
    runner = CliRunner()
    for args, needle in (
        (["--index", f"a={tmp_path / 'missing'}"], "is not a directory"),
        (["--index", str(tmp_path / "a"), "--index", str(tmp_path / "a")], "given twice"),
    ):
        result = runner.invoke(app, ["serve", *args, "--no-warmup"])
        assert result.exit_code == 2, result.output
        # typer draws the error in a box and wraps it: compare the words only
        assert needle in " ".join(result.output.replace("│", " ").split()), result.output


def test_a_query_whose_ppr_cannot_converge_fails_alone_with_its_reason(index_dir: Path) -> None:
    """PPR capped at 2 steps (a real non-convergence, not round-off): a single-query request
    gets a 500 naming the cause, a batch gets an error entry per failed query, dense answers."""
    from hippo_gpu import Searcher, load_index
    from hippo_gpu.config import RetrievalConfig

    capped = Searcher(load_index(index_dir, device="cpu"), RetrievalConfig(ppr_max_iter=2))
    with serving(capped, ServerConfig()) as (url, _):
        one = httpx.post(f"{url}/v1/retrieve", timeout=60,
                         json={"queries": ["Who kept the lighthouse?"], "mode": "hipporag2"})
        assert one.status_code == 500
        assert one.json()["detail"].startswith("retrieval failed: PPR did not converge")
        many = httpx.post(f"{url}/v1/retrieve", timeout=60, json={
            "queries": ["Who kept the lighthouse?", "What is a tidal clock?"], "mode": "hybrid"})
        assert many.status_code == 200
        body = many.json()
        assert body["results"] == [[], []]
        assert len(body["errors"]) == 2 and all("did not converge" in e for e in body["errors"])
        dense = httpx.post(f"{url}/v1/retrieve", timeout=60, json={
            "queries": ["Who kept the lighthouse?", "What is a tidal clock?"], "mode": "dense"})
        assert dense.status_code == 200 and dense.json().get("errors") is None
        assert all(len(r) > 0 for r in dense.json()["results"])
