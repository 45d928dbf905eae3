"""GET /metrics on a live server: the Prometheus text parses, and between two scrapes every
hippo_ counter moves by exactly the traffic the test sent (counted by the test itself)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from hippo_gpu.serve.batcher import BatcherConfig  # noqa: E402
from hippo_gpu.serve.server import ServerConfig, create_app  # noqa: E402
from tests.serve.helpers import Gate, serving, tensor_bytes_reference  # noqa: E402
from tests.serve.prometheus_samples import AUTH, TOKEN, Samples, delta, scrape, value  # noqa: E402


def test_counts_move_by_exactly_the_traffic_sent(sample_searcher: Any) -> None:
    config = ServerConfig(BatcherConfig(max_batch=8, max_wait_ms=200, max_queue=64), token=TOKEN,
                          max_queries_per_request=8)  # fmt: skip
    dense = [{"queries": ["tidal clock", "Harrowgate"], "top_k": 3, "mode": "dense"}] * 3
    graph = [{"queries": ["Who designed the lighthouse?"], "top_k": 5, "mode": "hipporag2"}] * 2
    with serving(sample_searcher, config) as (url, _), httpx.Client(base_url=url,
                                                                    timeout=60) as c:
        before = scrape(c)
        for body in dense + graph:
            assert c.post("/v1/retrieve", json=body, headers=AUTH).status_code == 200

        async def concurrent() -> list[Any]:  # merged into batches of more than one request
            async with httpx.AsyncClient(base_url=url, timeout=60, headers=AUTH) as ac:
                return await asyncio.gather(*(ac.post("/v1/retrieve", json=b) for b in dense))

        assert all(r.status_code == 200 for r in asyncio.run(concurrent()))
        assert c.post("/v1/retrieve", json={"queries": [""]}, headers=AUTH).status_code == 422
        assert c.post("/v1/retrieve", json=dense[0]).status_code == 401
        assert c.get("/v1/indexes", headers={"Authorization": "Bearer no"}).status_code == 401
        big = json.dumps({"queries": ["x"], "pad": "y" * config.max_body_bytes})
        assert c.post("/v1/retrieve", content=big, headers={
            **AUTH, "content-type": "application/json"}).status_code == 413
        assert c.get("/metrics").status_code == 401  # metrics are behind the token too
        stats = c.get("/v1/stats", headers=AUTH).json()["batcher"]
        after = scrape(c)

    n_dense, n_graph = 2 * len(dense) * 2, len(graph)  # dense requests: sequential + concurrent
    ok = {"index": "default", "transport": "http", "status": "ok"}
    assert delta(before, after, "hippo_retrieve_requests_total", mode="dense", **ok) == 6
    assert delta(before, after, "hippo_retrieve_requests_total", mode="hipporag2", **ok) == 2
    assert delta(before, after, "hippo_queries_total", mode="dense", **ok) == n_dense
    assert delta(before, after, "hippo_queries_total", mode="hipporag2", **ok) == n_graph
    lat = {"index": "default", "transport": "http"}
    assert delta(before, after, "hippo_retrieve_latency_seconds_count", mode="dense", **lat) == 6
    assert delta(before, after, "hippo_retrieve_latency_seconds_sum", mode="dense", **lat) > 0

    http = "hippo_http_requests_total"
    assert delta(before, after, http, route="/v1/retrieve", method="POST", status="200") == 8
    assert delta(before, after, http, route="/v1/retrieve", method="POST", status="422") == 1
    assert delta(before, after, http, route="/v1/retrieve", method="POST", status="401") == 1
    assert delta(before, after, http, route="/v1/retrieve", method="POST", status="413") == 1
    assert delta(before, after, http, route="/v1/indexes", method="GET", status="401") == 1
    assert delta(before, after, http, route="/v1/stats", method="GET", status="200") == 1
    # the first scrape is counted once it has answered; the second not yet
    assert delta(before, after, http, route="/metrics", method="GET", status="200") == 1
    assert delta(before, after, http, route="/metrics", method="GET", status="401") == 1
    assert delta(before, after, "hippo_http_request_duration_seconds_count",
                 route="/v1/retrieve", method="POST") == 11
    for reason, n in (("auth", 3), ("invalid", 1), ("body_too_large", 1), ("queue_full", 0),
                      ("shutting_down", 0)):  # fmt: skip
        assert delta(before, after, "hippo_rejected_requests_total", reason=reason) == n, reason

    # The batch histogram agrees with the batcher's own counters (all traffic came after start).
    assert value(after, "hippo_batch_size_count", index="default") == stats["batches_served"]
    assert value(after, "hippo_batch_size_sum", index="default") == n_dense + n_graph
    assert stats["batches_served"] < 8  # the concurrent requests really were merged
    assert value(after, "hippo_batch_size_bucket", index="default", le="1.0") < stats[
        "batches_served"]
    assert value(after, "hippo_batch_duration_seconds_count", index="default") == stats[
        "batches_served"]
    index = sample_searcher.index
    assert value(after, "hippo_queue_depth", index="default") == 0
    assert value(after, "hippo_in_flight_queries", index="default") == 0
    assert value(after, "hippo_index_version", index="default") == index.version
    assert value(after, "hippo_index_passages", index="default") == len(index.passage_keys)
    assert value(after, "hippo_index_memory_bytes", index="default") == tensor_bytes_reference(
        index)
    names = {name for name, _ in after}
    assert names and all(n.startswith("hippo_") for n in names), sorted(names)


def test_queue_depth_and_overload(sample_searcher: Any) -> None:
    """A held worker: the gauge shows the waiting queries, and the refused one is counted."""
    gate = Gate(sample_searcher)
    config = ServerConfig(BatcherConfig(max_batch=2, max_wait_ms=0, max_queue=2),
                          max_queries_per_request=2)  # fmt: skip
    body = {"queries": ["tidal clock"], "top_k": 2, "mode": "dense"}

    async def scenario(url: str) -> tuple[Samples, Samples, list[Any], Any]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as ac:
            first = asyncio.create_task(ac.post("/v1/retrieve", json=body))
            while not gate.entered.is_set():
                await asyncio.sleep(0.005)
            waiting = [asyncio.create_task(ac.post("/v1/retrieve", json=body)) for _ in range(2)]
            for _ in range(4000):
                if (await ac.get("/v1/stats")).json()["batcher"]["queue_depth"] == 2:
                    break
                await asyncio.sleep(0.005)
            held = _parse((await ac.get("/metrics")).text)
            refused = await ac.post("/v1/retrieve", json=body)
            gate.opened.set()
            done = [await t for t in [first, *waiting]]
            return held, _parse((await ac.get("/metrics")).text), done, refused

    with serving(gate, config) as (url, _):
        held, after, done, refused = asyncio.run(scenario(url))
    assert refused.status_code == 429
    assert all(r.status_code == 200 for r in done)
    assert value(held, "hippo_queue_depth", index="default") == 2
    assert value(held, "hippo_in_flight_queries", index="default") == 1
    assert value(after, "hippo_queue_depth", index="default") == 0
    assert value(after, "hippo_rejected_requests_total", reason="queue_full") == 1
    assert value(after, "hippo_retrieve_requests_total", index="default", mode="dense",
                 transport="http", status="queue_full") == 1  # fmt: skip
    assert value(after, "hippo_http_requests_total", route="/v1/retrieve", method="POST",
                 status="429") == 1  # fmt: skip
    assert value(after, "hippo_retrieve_requests_total", index="default", mode="dense",
                 transport="http", status="ok") == 3  # fmt: skip


def _parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip


def test_each_app_has_its_own_registry(sample_searcher: Any) -> None:
    """Two apps in one process: traffic to one never shows in the other's metrics."""
    body = {"queries": ["tidal clock"], "top_k": 2, "mode": "dense"}
    a, b = create_app(sample_searcher), create_app(sample_searcher)
    assert a.state.metrics.registry is not b.state.metrics.registry
    with serving(sample_searcher, ServerConfig()) as (url_a, _), serving(
            sample_searcher, ServerConfig()) as (url_b, _):  # fmt: skip
        for _ in range(3):
            assert httpx.post(url_a + "/v1/retrieve", json=body, timeout=60).status_code == 200
        sa = _parse(httpx.get(url_a + "/metrics").text)
        sb = _parse(httpx.get(url_b + "/metrics").text)
    key = {"index": "default", "mode": "dense", "transport": "http", "status": "ok"}
    assert value(sa, "hippo_retrieve_requests_total", **key) == 3
    assert value(sb, "hippo_retrieve_requests_total", **key) == 0
