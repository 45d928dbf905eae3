"""`hippo-gpu serve --ray ADDRESS --replicas 2`: the plain server's HTTP checks against Ray Serve.

One local Ray instance (2 CPUs) for the module. The real CLI runs in a subprocess joined to it and
deploys two replicas of the bundled sample index (each loads the index once and serves
hippo_gpu.serve.server's app with its micro-batcher), with a bearer token and small request
limits; every test talks to Ray Serve's HTTP proxy. Served rankings are compared with offline
`Searcher.retrieve` on the same index (as tests/serve/test_server.py does for the plain server). The
last test stops the CLI with SIGINT and checks that the deployment is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from hippo_gpu.config import MODES  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.retrieval.ircot_thoughts import QUESTIONS, SCRIPT  # noqa: E402
from tests.scripted_llm import fast_backend, scripted_llm  # noqa: E402
from tests.serve.helpers import (  # noqa: E402
    assert_no_leak,
    assert_same_ranking,
    entity_variants,
    offline_hits,
)

pytestmark = pytest.mark.slow  # a Ray Serve deployment of two replicas: ~1.5 min on 2 cores

TOKEN = "ray-serve-token-5d2e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMITS = {"max_queries_per_request": 4, "max_query_chars": 100, "max_top_k": 50,
          "max_entities_per_query": 8, "max_entity_chars": 60}


@pytest.fixture(scope="module")
def llm() -> Iterator[str]:
    """The spec string of a scripted OpenAI-compatible thought source on loopback."""
    with scripted_llm(SCRIPT) as (_, spec):
        yield spec


@pytest.fixture(scope="module")
def served(sample_index_dir: Path, llm: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """(base URL, CLI process) of `hippo-gpu serve --ray <this Ray> --replicas 2 --llm ...`."""
    from ray import serve

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HIPPO_TEST_TOKEN": TOKEN,
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "hippo_gpu.cli", "serve", "--index", str(sample_index_dir),
           "--ray", ray.get_runtime_context().gcs_address, "--replicas", "2",
           "--cpus-per-replica", "0.5", "--threads", "1", "--port", str(port), "--device", "cpu",
           "--token-env", "HIPPO_TEST_TOKEN", "--max-batch", "16", "--max-wait-ms", "50",
           "--llm", llm, "--max-ircot-steps", "4",
           *[a for k, v in LIMITS.items() for a in (f"--{k.replace('_', '-')}", str(v))]]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:] if proc.stdout else ""
            assert time.monotonic() < deadline, "Ray Serve deployment not ready in 300 s"
            app = serve.status().applications.get("hippo-gpu")
            if app is not None and app.status == "RUNNING":  # every replica started
                break
            time.sleep(0.5)
        assert httpx.get(url + "/readyz", timeout=10).json() == {"status": "ready"}
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        ray.shutdown()


def _queries(searcher: Any) -> list[str]:
    titles = sorted({h.title for hits in searcher.retrieve(["science"], top_k=50, mode="dense")
                     for h in hits})
    return ["Which Stanford University professor works on Alzheimer's?"] + [
        f"What is known about {t}?" for t in titles]


def test_two_replicas_run_and_answer_like_the_offline_searcher(served, sample_searcher):
    """Concurrent requests in every mode (two top_k, every way of giving entities) get exactly
    their offline ranking; both replicas run; the replica asked for stats merged requests."""
    from ray import serve

    url, _ = served
    app = serve.status().applications["hippo-gpu"]
    assert app.deployments["HippoReplica"].replica_states == {"RUNNING": 2}
    queries = _queries(sample_searcher)
    requests = []
    for mode in MODES:
        for i in range(12):
            qs = [queries[(i + j) % len(queries)] for j in range(1 + i % 3)]
            variants = entity_variants(qs)[1 if mode == "hipporag1" else 0:]
            req: dict[str, Any] = {"queries": qs, "top_k": 3 if i % 4 == 0 else 5, "mode": mode}
            ents = variants[(i // 3) % len(variants)]
            if ents is not None:
                req["entities"] = ents
            requests.append(req)

    async def send_all() -> list[Any]:
        async with httpx.AsyncClient(base_url=url, timeout=120, headers=AUTH) as client:
            return await asyncio.gather(*(client.post("/v1/retrieve", json=r) for r in requests))

    responses = asyncio.run(send_all())
    for req, resp in zip(requests, responses, strict=True):
        assert resp.status_code == 200, resp.text
        assert resp.json()["seeds"] is None
        offline = offline_hits(sample_searcher, req["queries"], req["top_k"], req["mode"],
                           req.get("entities"))
        for got, want in zip(resp.json()["results"], offline, strict=True):
            assert_same_ranking(got, want)
    stats = httpx.get(url + "/v1/stats", headers=AUTH).json()["batcher"]  # one replica's
    assert 0 < stats["requests_served"] < len(requests)  # the other replica served the rest
    assert stats["batches_served"] < stats["requests_served"]  # its batcher merged requests
    assert stats["max_batch_size_seen"] <= 16


def test_replicas_answer_ircot_as_the_offline_loop(served, sample_searcher, llm):
    """Each replica opens its own thought source from the CLI's --llm: a request's merged
    ranking and thoughts equal the offline batched loop's with the same scripted thoughts."""
    from hippo_gpu.llm.ircot import IRCoTReasoner
    from hippo_gpu.retrieval.ircot import ircot_retrieve

    url, _ = served
    offline = ircot_retrieve(sample_searcher, QUESTIONS[:4], IRCoTReasoner(fast_backend(llm)),
                             max_steps=3, top_k=3).results
    r = httpx.post(url + "/v1/retrieve", headers=AUTH, timeout=60,
                   json={"queries": QUESTIONS[:4], "top_k": 3, "ircot": {"max_steps": 3}})
    assert r.status_code == 200, r.text
    got = r.json()
    for hits, trace, res in zip(got["results"], got["ircot"], offline, strict=True):
        assert [h["key"] for h in hits] == [h.key for h in res.hits]
        assert [h["score"] for h in hits] == pytest.approx([h.score for h in res.hits],
                                                           rel=1e-5, abs=1e-7)
        assert trace["thoughts"] == res.thoughts and trace["stop"] == res.stop
    over = httpx.post(url + "/v1/retrieve", headers=AUTH, timeout=30,
                      json={"queries": QUESTIONS[:1], "top_k": 3, "ircot": {"max_steps": 5}})
    assert over.status_code == 422  # --max-ircot-steps 4 holds on every replica


def test_seed_facts_are_served(served, sample_searcher):
    url, _ = served
    body = {"queries": ["Stanford", "Alzheimer"], "top_k": 3, "mode": "hipporag2",
            "return_seeds": True}
    r = httpx.post(url + "/v1/retrieve", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    want = sample_searcher.rank(body["queries"], top_k=3).seeds
    assert r.json()["seeds"] == [[list(f) for f in per_query] for per_query in want]


def test_bearer_token_required_probes_open(served):
    url, _ = served
    body = {"queries": ["Stanford"], "top_k": 2, "mode": "dense"}
    with httpx.Client(base_url=url, timeout=60) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = c.post("/v1/retrieve", json=body, headers=headers)
            assert r.status_code == 401, headers
            assert r.headers.get("www-authenticate") == "Bearer"
            assert TOKEN not in r.text
            assert c.get("/v1/stats", headers=headers).status_code == 401
        assert c.post("/v1/retrieve", json=body, headers=AUTH).status_code == 200
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json() == {"status": "ready"}
        assert "/v1/retrieve" in c.get("/openapi.json").json()["paths"]


def test_limits_and_malformed_requests(served, sample_index_dir):
    """422 naming the field for anything outside the schema (the limits are the CLI's), 413 for
    a body over the byte limit, declared or streamed; the input is not echoed back."""
    url, _ = served
    cases = [
        ({"queries": ["q"] * 5}, "queries"),  # more than --max-queries-per-request 4
        ({"queries": ["x" * 101]}, "queries"),  # longer than --max-query-chars 100
        ({"queries": ["   "]}, "queries"),
        ({"queries": ["q"], "top_k": 0}, "top_k"),
        ({"queries": ["q"], "top_k": 51}, "top_k"),  # over --max-top-k 50
        ({"queries": ["q"], "top_k": "5"}, "top_k"),
        ({"queries": ["q"], "mode": "secret-input-xyz"}, "mode"),
        ({"queries": ["q"], "entities": [["a"] * 9]}, "entities"),  # over 8 per query
        ({"queries": ["q"], "entities": [["e" * 61]]}, "entities"),  # over 60 characters
        ({"queries": ["q"], "unexpected": True}, "unexpected"),
    ]
    with httpx.Client(base_url=url, timeout=60, headers=AUTH) as c:
        for body, field in cases:
            r = c.post("/v1/retrieve", json=body)
            assert r.status_code == 422, (body, r.text)
            assert any(field in map(str, d["loc"]) for d in r.json()["detail"]), (field, r.text)
            assert_no_leak(r.text, sample_index_dir)
            assert "secret-input-xyz" not in r.text
        r = c.post("/v1/retrieve", json={"queries": ["q"], "mode": "hipporag1"})
        assert r.status_code == 200 and r.json()["entities"] == [[]]  # no capitalised span
        r = c.post("/v1/retrieve", content=b"{not json",
                   headers={"content-type": "application/json"})
        assert r.status_code == 422
        limit = c.get("/v1/stats").json()["limits"]["max_body_bytes"]
        big = json.dumps({"queries": ["y"], "pad": "z" * limit}).encode()
        r = c.post("/v1/retrieve", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "limit" in r.json()["detail"]
        r = c.post("/v1/retrieve", content=iter([big[:1000], big[1000:]]),
                   headers={"content-type": "application/json"})  # chunked: no length declared
        assert r.status_code == 413
        assert c.post("/v1/retrieve", json={"queries": ["q"], "mode": "dense"}).status_code == 200


def test_stats_report_the_index_and_the_cli_limits(served, sample_searcher, sample_index_dir):
    url, _ = served
    r = httpx.get(url + "/v1/stats", headers=AUTH, timeout=60)
    assert r.status_code == 200
    assert_no_leak(r.text, sample_index_dir)
    s = r.json()
    for k, v in sample_searcher.index.stats().items():
        if isinstance(v, (bool, int, float)):
            assert s["index"][k] == v
    assert {k: s["limits"][k] for k in LIMITS} == LIMITS
    assert s["limits"]["max_batch"] == 16 and s["batcher"]["running"] is True


def test_sigint_stops_the_cli_and_removes_the_deployment(served):
    url, proc = served
    serve_actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                    if a["namespace"] == "serve"]
    assert sum("HippoReplica" in name for name in serve_actors) == 2, serve_actors
    proc.send_signal(signal.SIGINT)
    try:
        rc = proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert rc == 0, out[-3000:]
    assert f"on {url} with 2 Ray Serve replicas" in " ".join(out.split())
    assert TOKEN not in out
    # The CLI started Serve on this cluster, so it removed the replicas and stopped Serve.
    deadline = time.monotonic() + 60
    while any(a["namespace"] == "serve"
              for a in ray.util.list_named_actors(all_namespaces=True)):
        assert time.monotonic() < deadline, ray.util.list_named_actors(all_namespaces=True)
        time.sleep(0.5)
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/healthz", timeout=5)


def test_ray_refuses_several_indexes_writable_and_a_non_index(sample_index_dir, tmp_path):
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["serve", "--index", f"a={sample_index_dir}", "--index",
                              f"b={sample_index_dir}", "--ray", "local"])
    assert res.exit_code == 2 and "--ray serves one index" in " ".join(res.output.split())
    res = runner.invoke(app, ["serve", "--index", str(sample_index_dir), "--ray", "local",
                              "--writable"], env={"HIPPO_GPU_TOKEN": TOKEN})
    assert res.exit_code == 2 and "--writable is not available with --ray" in \
        " ".join(res.output.split())
    res = runner.invoke(app, ["serve", "--index", str(tmp_path), "--ray", "local"])
    # rich boxes the message and wraps it at the terminal width: drop the frame before matching
    assert res.exit_code == 2 and "not a hippo-gpu index" in \
        " ".join(res.output.replace("│", " ").split())
