"""The MCP tools, driven by the official SDK's own client: over stdio (the `hippo-gpu mcp` command
in a subprocess) and over streamable HTTP (/mcp on a live uvicorn, behind the bearer token).

Rankings are compared with offline `Searcher.retrieve` on the same index; a passage read through
the resource is compared with the index's own tables.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

mcp = pytest.importorskip("mcp")
httpx2 = pytest.importorskip("httpx2")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from hippo_gpu.serve.batcher import BatcherConfig  # noqa: E402
from hippo_gpu.serve.server import ServerConfig  # noqa: E402
from hippo_gpu.storage.directory import read_manifest  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.serve.helpers import Gate, serving  # noqa: E402

TOKEN = "mcp-test-token-41"
QUESTIONS = ["Who invented the tidal clock?", "Which college did the lighthouse designer attend?"]


def offline_hits(searcher: Any, query: str, top_k: int, mode: str,
             entities: list[str] | None = None) -> list[dict[str, Any]]:
    hits = searcher.retrieve([query], top_k=top_k, mode=mode,
                             query_entities=None if entities is None else [entities])[0]
    texts = searcher.index.passage_texts
    return [{"key": h.key, "title": h.title, "score": h.score, "rank": h.rank,
             "text": texts[h.row]} for h in hits]  # fmt: skip


def _assert_hits(served: list[dict[str, Any]], offline: list[dict[str, Any]]) -> None:
    assert [(h["key"], h["title"], h["rank"], h["text"]) for h in served] == [
        (h["key"], h["title"], h["rank"], h["text"]) for h in offline]
    # float32: the query encoder rounds differently with the batch's shape, by ~1e-6.
    assert [h["score"] for h in served] == pytest.approx([h["score"] for h in offline],
                                                         rel=1e-5, abs=1e-6)


async def _check_tools(client: Client, searcher: Any) -> None:
    """What both transports must do: list, answer like the offline searcher, refuse bad input."""
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"retrieve", "explain", "stats"}
    props = tools["retrieve"].input_schema["properties"]
    assert {"query", "top_k", "mode"} <= set(props) and props["top_k"]["default"] == 10

    for query in QUESTIONS:
        for mode, top_k in (("hipporag2", 10), ("dense", 3), ("hybrid", 5)):
            r = await client.call_tool("retrieve", {"query": query, "top_k": top_k, "mode": mode})
            assert not r.is_error, r.content
            assert r.structured_content is not None
            assert r.structured_content["index"] == "default"
            assert r.structured_content["version"] == searcher.index.version is not None
            _assert_hits(r.structured_content["hits"], offline_hits(searcher, query, top_k, mode))
    # Defaults: top_k 10, hipporag2.
    r = await client.call_tool("retrieve", {"query": QUESTIONS[0]})
    _assert_hits(r.structured_content["hits"],
                 offline_hits(searcher, QUESTIONS[0], 10, "hipporag2"))
    # hipporag1 with the caller's entities.
    r = await client.call_tool("retrieve", {"query": QUESTIONS[0], "mode": "hipporag1",
                                            "entities": ["tidal clock"], "top_k": 4})
    _assert_hits(r.structured_content["hits"],
                 offline_hits(searcher, QUESTIONS[0], 4, "hipporag1", ["tidal clock"]))

    bad: list[tuple[dict[str, Any], str]] = [
        ({"query": "x", "top_k": 0}, "top_k"),
        ({"query": "x", "top_k": 1001}, "top_k"),
        ({"query": "x", "mode": "bm25"}, "mode"),
        ({"query": ""}, "query"),
        ({"query": "   "}, "blank"),
        ({"top_k": 3}, "query"),
        ({"query": "x", "top_k": "many"}, "top_k"),
        ({"query": "x", "index": "nope"}, "unknown index 'nope'"),
    ]
    for args, needle in bad:
        r = await client.call_tool("retrieve", args)
        assert r.is_error, args
        assert needle in r.content[0].text, (args, r.content[0].text)
    # The session survives every refusal.
    r = await client.call_tool("retrieve", {"query": QUESTIONS[1], "top_k": 2, "mode": "dense"})
    assert not r.is_error
    _assert_hits(r.structured_content["hits"], offline_hits(searcher, QUESTIONS[1], 2, "dense"))

    # explain: retrieve's hits, each score split by seed, as the offline Searcher.explain
    r = await client.call_tool("explain", {"query": QUESTIONS[0], "top_k": 3})
    assert not r.is_error, r.content
    served = r.structured_content["explanation"]
    (want,) = searcher.explain([QUESTIONS[0]], top_k=3)
    assert r.structured_content["index"] == "default"
    assert [h["title"] for h in served["hits"]] == [h.hit.title for h in want.hits]
    assert [s["phrase"] for s in served["seeds"]] == [s.phrase for s in want.seeds]
    for got, exp in zip(served["hits"], want.hits, strict=True):
        assert got["total"] == pytest.approx(exp.total, rel=1e-4)
        assert abs(got["total"] - got["value"]) <= got["bound"]
    # hipporag1 without entities links the question's capitalised spans, as every surface does
    named = "Who designed the lighthouse on Skerrow?"
    r = await client.call_tool("retrieve", {"query": named, "top_k": 4, "mode": "hipporag1"})
    assert not r.is_error, r.content
    assert r.structured_content["entities"] == ["Skerrow"]
    _assert_hits(r.structured_content["hits"], offline_hits(searcher, named, 4, "hipporag1",
                                                            ["Skerrow"]))
    r = await client.call_tool("explain", {"query": "x", "mode": "hipporag1"})
    assert not r.is_error and r.structured_content["explanation"]["entities"] == []

    r = await client.call_tool("stats", {})
    assert not r.is_error
    (info,) = r.structured_content["indexes"]
    assert info["name"] == "default" and info["passages"] == len(searcher.index.passage_keys)
    assert info["version"] == searcher.index.version
    assert info["counts"]["facts"] == searcher.index.stats()["facts"]

    key = searcher.index.passage_keys[7]
    res = await client.read_resource(f"passage://{key}")
    body = json.loads(res.contents[0].text)
    assert body == {"key": key, "title": searcher.index.passage_titles[7],
                    "text": searcher.index.passage_texts[7], "indexes": ["default"]}
    with pytest.raises(MCPError, match="no served index holds passage"):
        await client.read_resource("passage://chunk-00000000000000000000000000000000")


def test_stdio_command(sample_hash_index_dir: Path, sample_hash_searcher: Any) -> None:
    # the hash:64 index: the child starts without importing sentence-transformers (~5 s); the
    # claim is the stdio transport, checked against the offline searcher of the same index
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "hippo_gpu.cli", "mcp", "--index", str(sample_hash_index_dir), "--device",
              "cpu", "--no-warmup"],
        env=env, cwd=str(REPO))  # fmt: skip

    async def run() -> None:
        async with Client(params, read_timeout_seconds=300) as client:
            await _check_tools(client, sample_hash_searcher)

    asyncio.run(asyncio.wait_for(run(), 600))


@pytest.mark.slow  # the local LLM loaded in a child process
def test_stdio_command_with_an_llm_serves_ircot(sample_index_dir: Path,
                                               sample_searcher: Any) -> None:
    """`hippo-gpu mcp --llm SPEC` adds retrieve_ircot: the merged ranking and the thoughts of
    the offline batched loop fed the same scripted thoughts; its max_steps capped."""
    from hippo_gpu.llm.ircot import IRCoTReasoner
    from hippo_gpu.retrieval.ircot import ircot_retrieve
    from tests.retrieval.ircot_thoughts import QUESTIONS as IRCOT_QUESTIONS
    from tests.retrieval.ircot_thoughts import SCRIPT
    from tests.scripted_llm import fast_backend, scripted_llm

    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with scripted_llm(SCRIPT) as (llm, spec):
        offline = ircot_retrieve(sample_searcher, IRCOT_QUESTIONS, IRCoTReasoner(
            fast_backend(spec)), max_steps=3, top_k=4).results
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "hippo_gpu.cli", "mcp", "--index", str(sample_index_dir), "--device",
                  "cpu", "--no-warmup", "--llm", spec, "--max-ircot-steps", "3"],
            env=env, cwd=str(REPO))  # fmt: skip

        version = read_manifest(sample_index_dir)["version"]
        assert version is not None

        async def run() -> None:
            async with Client(params, read_timeout_seconds=300) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                assert set(tools) == {"retrieve", "retrieve_ircot", "explain", "stats"}
                steps = tools["retrieve_ircot"].input_schema["properties"]["max_steps"]
                assert steps["maximum"] == 3 and steps["default"] == 3
                for question, want in zip(IRCOT_QUESTIONS, offline, strict=True):
                    r = await client.call_tool("retrieve_ircot",
                                               {"query": question, "top_k": 4})
                    assert not r.is_error, r.content
                    got = r.structured_content
                    assert [h["key"] for h in got["hits"]] == [h.key for h in want.hits]
                    assert [h["score"] for h in got["hits"]] == pytest.approx(
                        [h.score for h in want.hits], rel=1e-5, abs=1e-6)
                    assert (got["thoughts"], got["steps"], got["stop"], got["error"]) == (
                        want.thoughts, want.steps, want.stop, None)
                    assert got["version"] == version  # every step read the one version
                for args, needle in (({"query": "x", "max_steps": 4}, "max_steps"),
                                     ({"query": " ", "mode": "hipporag1"}, "query is blank")):
                    r = await client.call_tool("retrieve_ircot", args)
                    assert r.is_error and needle in r.content[0].text, r.content

        asyncio.run(asyncio.wait_for(run(), 600))
    assert llm.requests, "the thoughts came from the scripted endpoint"


def _holds_mcp_error(e: BaseException) -> bool:
    """`e` is an MCPError or an exception group (3.10: the backport) holding one."""
    inner = getattr(e, "exceptions", None)
    if inner is not None:
        return any(_holds_mcp_error(x) for x in inner)
    return isinstance(e, MCPError)


@asynccontextmanager
async def _http_client(url: str, token: str | None) -> AsyncIterator[Client]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
        async with Client(streamable_http_client(url + "/mcp", http_client=http)) as client:
            yield client


def test_streamable_http_with_token(sample_searcher: Any) -> None:
    with serving(sample_searcher, ServerConfig(token=TOKEN)) as (url, _):

        async def run() -> None:
            async with _http_client(url, TOKEN) as client:
                await _check_tools(client, sample_searcher)
            for token in (None, "wrong-token"):
                # The SDK's task groups may wrap the refusal in an exception group; the assert
                # below requires an MCPError in it.
                with pytest.raises(BaseException) as info:  # noqa: B017
                    async with _http_client(url, token) as client:
                        await client.list_tools()
                assert _holds_mcp_error(info.value), repr(info.value)

        asyncio.run(run())
        # The same refusals, seen as plain HTTP: 401 before any MCP handling.
        init = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": TOKEN}):
            r = httpx.post(url + "/mcp", json=init, headers={
                **headers, "accept": "application/json, text/event-stream"})
            assert r.status_code == 401, headers
            assert r.headers["www-authenticate"] == "Bearer" and TOKEN not in r.text


def test_the_tools_keep_the_work_budget(sample_searcher: Any) -> None:
    """A call over `ServerConfig.cost` is a tool error naming the estimate and the limit (the
    estimate of serve/budget.py, as HTTP's 413), counted; the session goes on."""
    from hippo_gpu.retrieval.modes import HIPPORAG2
    from hippo_gpu.serve.budget import request_cost
    from hippo_gpu.serve.config import CostLimits
    from tests.serve.prometheus_samples import delta, scrape

    passages = len(sample_searcher.index.passage_keys)
    with serving(sample_searcher, ServerConfig(cost=CostLimits(max_request_cost=60))) as (
            url, _), httpx.Client(base_url=url, timeout=60) as http:
        before = scrape(http)

        async def run() -> None:
            async with _http_client(url, None) as client:
                # 0.22 x 29 + 5 + 4 x 30 = 131.4 units over 60
                r = await client.call_tool("explain", {"query": QUESTIONS[0], "top_k": 30})
                assert r.is_error
                text = r.content[0].text
                estimate = request_cost([QUESTIONS[0]], None, top_k=30, mode=HIPPORAG2,
                                        explain=True, passages=passages)
                assert f"estimated {estimate} work units" in text and "limit of 60" in text
                assert QUESTIONS[0] not in text
                for tool, top_k in (("explain", 3), ("retrieve", 30)):
                    r = await client.call_tool(tool, {"query": QUESTIONS[0], "top_k": top_k})
                    assert not r.is_error, r.content

        asyncio.run(run())
        after = scrape(http)
    assert delta(before, after, "hippo_rejected_requests_total", reason="over_budget") == 1


def test_mcp_and_http_share_the_batcher(sample_searcher: Any) -> None:
    """An HTTP request and an MCP call sent together are answered in ONE batched call."""
    gate = Gate(sample_searcher)
    config = ServerConfig(BatcherConfig(max_batch=8, max_wait_ms=0, max_queue=64))
    with serving(gate, config) as (url, _):

        async def run() -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
            async with _http_client(url, None) as client, httpx.AsyncClient(
                    base_url=url, timeout=120) as http:  # fmt: skip
                # A first request holds the worker, so the next two wait in the queue together.
                blocker = asyncio.create_task(http.post("/v1/retrieve", json={
                    "queries": ["blocker"], "top_k": 3, "mode": "dense"}))
                while not gate.entered.is_set():
                    await asyncio.sleep(0.005)
                before = (await http.get("/v1/stats")).json()["batcher"]
                via_http = asyncio.create_task(http.post("/v1/retrieve", json={
                    "queries": [QUESTIONS[0]], "top_k": 5, "mode": "dense"}))
                via_mcp = asyncio.create_task(client.call_tool("retrieve", {
                    "query": QUESTIONS[1], "top_k": 5, "mode": "dense"}))
                for _ in range(4000):
                    if (await http.get("/v1/stats")).json()["batcher"]["queue_depth"] == 2:
                        break
                    await asyncio.sleep(0.005)
                gate.opened.set()
                await blocker
                after_http, after_mcp = await via_http, await via_mcp
                after = (await http.get("/v1/stats")).json()["batcher"]
                return after_http, after_mcp, before, after

        h, m, before, after = asyncio.run(run())
    assert h.status_code == 200
    assert not m.is_error
    _assert_hits(m.structured_content["hits"],
                 offline_hits(sample_searcher, QUESTIONS[1], 5, "dense"))
    _assert_hits(h.json()["results"][0], offline_hits(sample_searcher, QUESTIONS[0], 5, "dense"))
    # blocker's batch, then one batch holding both the HTTP and the MCP query
    assert after["batches_served"] - before["batches_served"] == 2
    assert after["queries_served"] - before["queries_served"] == 3
    assert after["max_batch_size_seen"] == 2


def test_two_indexes_by_name(sample_searcher: Any, subset_searcher: Any) -> None:
    app_indexes = {"full": sample_searcher, "part": subset_searcher}
    with serving(app_indexes, ServerConfig()) as (url, _):

        async def run() -> None:
            async with _http_client(url, None) as client:
                for name, searcher in app_indexes.items():
                    r = await client.call_tool("retrieve", {"query": QUESTIONS[0], "top_k": 25,
                                                            "index": name})
                    assert r.structured_content["index"] == name
                    _assert_hits(r.structured_content["hits"],
                                 offline_hits(searcher, QUESTIONS[0], 25, "hipporag2"))
                r = await client.call_tool("retrieve", {"query": QUESTIONS[0], "top_k": 25})
                assert r.structured_content["index"] == "full"  # the first is the default
                stats = (await client.call_tool("stats", {})).structured_content["indexes"]
                assert [(s["name"], s["passages"]) for s in stats] == [("full", 30), ("part", 20)]
                key = sample_searcher.index.passage_keys[-1]  # not in the subset
                in_both = subset_searcher.index.passage_keys[0]
                body = json.loads((await client.read_resource(f"passage://{key}")).contents[0].text)
                assert body["indexes"] == ["full"]
                body = json.loads(
                    (await client.read_resource(f"passage://{in_both}")).contents[0].text)
                assert body["indexes"] == ["full", "part"]

        asyncio.run(run())


@pytest.fixture(scope="module")
def subset_searcher(tmp_path_factory: pytest.TempPathFactory, sample_searcher: Any) -> Any:
    from tests.serve.helpers import subset_index

    return subset_index(tmp_path_factory.mktemp("subset"), sample_searcher, 20)


def test_create_app_without_mcp(sample_searcher: Any) -> None:
    with serving(sample_searcher, ServerConfig(mcp=False)) as (url, _):
        r = httpx.post(url + "/mcp", json={}, headers={"accept": "application/json"})
        assert r.status_code == 404
