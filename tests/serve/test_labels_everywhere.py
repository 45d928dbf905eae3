"""The user's passage ids and metadata on every surface: Python, the CLI (query --json --where,
retrieve's file, delete --ids), HTTP (retrieve and explain with "where", insert with ids and
metadata, DELETE by ids) and the LangChain and LlamaIndex retrievers over that server; each
filtered answer equals the Python one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from typer.testing import CliRunner  # noqa: E402

from hippo_gpu import Searcher, build_index, load_index  # noqa: E402
from hippo_gpu.cli import app  # noqa: E402
from hippo_gpu.sample import paths  # noqa: E402
from hippo_gpu.serve.server import ServerConfig, create_app  # noqa: E402
from hippo_gpu.serve.writes import WritableHolder  # noqa: E402
from tests.helpers import QUERIES  # noqa: E402
from tests.loopback import serve_asgi  # noqa: E402

TOKEN = "labels-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WHERE = {"third": 0}


def _corpus() -> tuple[list[dict], dict]:
    files = paths()
    corpus = json.loads(Path(files["corpus"]).read_text())
    openie = json.loads(Path(files["openie"]).read_text())
    for i, p in enumerate(corpus):
        p["id"], p["metadata"] = f"doc-{i}", {"third": i % 3, "n": i}
    return corpus, openie


def _own(hits: list[dict], corpus: list[dict]) -> None:
    """Every hit carries the id and metadata its corpus item gave."""
    by_text = {f"{p['title']}\n{p['text']}": p for p in corpus}
    for h in hits:
        p = by_text[h["text"]]
        assert (h["id"], h["metadata"]) == (p["id"], p["metadata"])


def test_http_carries_ids_and_metadata_filters_and_deletes_by_id(tmp_path: Path) -> None:
    corpus, openie = _corpus()
    index_dir = tmp_path / "idx"
    build_index(corpus[:25], openie, index_dir, device="cpu", encoder="hash:64")
    searcher = Searcher(load_index(index_dir, device="cpu"))
    holder = WritableHolder(searcher, index_dir, device="cpu", compact_quiet=None)
    by_passage = {d["passage"]: d for d in openie["docs"]}
    new = [{**p, "triples": by_passage[f"{p['title']}\n{p['text']}"]["extracted_triples"]}
           for p in corpus[25:]]
    with serve_asgi(create_app(holder, ServerConfig(token=TOKEN))) as (url, _), \
            httpx.Client(base_url=url, timeout=120, headers=AUTH) as c:
        r = c.post("/v1/passages", json={"passages": new})
        assert r.status_code == 200 and r.json()["passages_added"] == 5, r.text
        body = {"queries": QUERIES, "top_k": 30, "where": WHERE}
        for mode in ("hipporag2", "hipporag1", "dense", "hybrid"):
            r = c.post("/v1/retrieve", json={**body, "mode": mode})
            assert r.status_code == 200, r.text
            want = holder.current.retrieve(QUERIES, top_k=30, mode=mode, where=WHERE)
            for hits, w in zip(r.json()["results"], want):
                assert [(h["key"], h["id"]) for h in hits] == [(x.key, x.id) for x in w]
                assert [h["score"] for h in hits] == pytest.approx([x.score for x in w],
                                                                   rel=1e-6)
                assert len(hits) == 10 and all(h["metadata"]["third"] == 0 for h in hits)
                _own(hits, corpus)
        r = c.post("/v1/explain", json={"queries": QUERIES[:1], "top_k": 4, "where": WHERE})
        assert r.status_code == 200, r.text
        _own(r.json()["explanations"][0]["hits"], corpus)
        assert c.post("/v1/retrieve", json={"queries": QUERIES, "where": {}}).status_code == 422

        # the retrievers over this server: their documents carry the same labels
        from hippo_gpu.integrations.langchain import HippoRetriever as LangChainRetriever
        from hippo_gpu.integrations.llamaindex import HippoRetriever as LlamaRetriever

        docs = LangChainRetriever(url=url, token=TOKEN, k=4, where=WHERE).invoke(QUERIES[0])
        local = holder.current.retrieve(QUERIES[:1], top_k=4, where=WHERE)[0]
        assert [d.id for d in docs] == [x.id for x in local]
        assert all(d.metadata["third"] == 0 and d.metadata["key"].startswith("chunk-")
                   for d in docs)
        nodes = LlamaRetriever(url=url, token=TOKEN, k=4, where=WHERE).retrieve(QUERIES[0])
        assert [n.node.node_id for n in nodes] == [x.id for x in local]
        assert all(n.node.metadata["third"] == 0 for n in nodes)

        r = c.request("DELETE", "/v1/passages", json={"ids": ["doc-0", "nope"]})
        assert r.status_code == 404 and "'nope'" in r.text
        both = {"ids": ["doc-0"], "keys": [holder.current.index.passage_keys[0]]}
        assert c.request("DELETE", "/v1/passages", json=both).status_code == 422
        assert c.request("DELETE", "/v1/passages", json={}).status_code == 422
        r = c.request("DELETE", "/v1/passages", json={"ids": ["doc-0", "doc-27"]})
        assert r.status_code == 200 and r.json()["passages_removed"] == 2, r.text
        r = c.post("/v1/retrieve", json={"queries": QUERIES[:1], "top_k": 30})
        ids = {h["id"] for h in r.json()["results"][0]}
        assert ids == {p["id"] for p in corpus} - {"doc-0", "doc-27"}
    assert load_index(index_dir, device="cpu").labels == holder.current.index.labels


def test_the_cli_shows_filters_and_deletes_by_id(tmp_path: Path) -> None:
    corpus, openie = _corpus()
    index_dir = tmp_path / "idx"
    index = build_index(corpus, openie, index_dir, device="cpu", encoder="hash:64")
    runner = CliRunner()
    res = runner.invoke(app, ["query", str(index_dir), QUERIES[1], "--top-k", "5", "--json",
                              "--where", json.dumps(WHERE), "--mode", "hybrid"])
    assert res.exit_code == 0, res.output
    hits = json.loads(res.stdout)["hits"]
    want = Searcher(index).retrieve(QUERIES[1:2], top_k=5, mode="hybrid", where=WHERE)[0]
    assert [(h["key"], h["id"]) for h in hits] == [(x.key, x.id) for x in want]
    _own(hits, corpus)
    bad = runner.invoke(app, ["query", str(index_dir), "q", "--where", "{third: 0}"])
    assert bad.exit_code == 2 and "--where is not JSON" in bad.output

    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps({"id": i, "query": q}) + "\n"
                               for i, q in enumerate(QUERIES)))
    res = runner.invoke(app, ["retrieve", "--index", str(index_dir), "--queries", str(queries),
                              "--out", str(tmp_path / "o.jsonl"), "--top-k", "3"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    by_key = dict(zip(index.passage_keys, (p["id"] for p in corpus)))
    assert all(r["passage_ids"] == [by_key[k] for k in r["keys"]] for r in rows)

    gone = tmp_path / "ids.txt"
    gone.write_text("doc-4\ndoc-9\n")
    res = runner.invoke(app, ["delete", str(index_dir), "--ids", str(gone)])
    assert res.exit_code == 0, res.output
    left = load_index(index_dir, device="cpu")
    assert left.labels.key_of_id("doc-4") is None and len(left.passage_keys) == 28
    res = runner.invoke(app, ["delete", str(index_dir), "--ids", str(gone)])
    assert res.exit_code == 2 and "unknown passage id" in res.output

    # the same file as Parquet (the optional extra): metadata as JSON text
    pq = pytest.importorskip("pyarrow.parquet")
    res = runner.invoke(app, ["retrieve", "--index", str(index_dir), "--queries", str(queries),
                              "--out", str(tmp_path / "o.parquet"), "--top-k", "3"])
    assert res.exit_code == 0, res.output
    table = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert len(table) == 3 and all(
        r["passage_ids"] == [left.labels.id_of(k) for k in r["keys"]] and
        [json.loads(m) for m in r["passage_metadata"]] ==
        [left.labels.metadata_of(k) for k in r["keys"]] for r in table)


def test_mcp_tools_carry_labels_and_filter(tmp_path: Path) -> None:
    """The MCP `retrieve` and `explain` tools over /mcp: the same filter, the same labels."""
    import asyncio

    pytest.importorskip("mcp")
    httpx2 = pytest.importorskip("httpx2")
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    corpus, openie = _corpus()
    searcher = Searcher(build_index(corpus, openie, None, device="cpu", encoder="hash:64"))
    want = searcher.retrieve(QUERIES[:1], top_k=5, mode="hybrid", where=WHERE)[0]

    async def run(url: str) -> None:
        async with httpx2.AsyncClient(headers=AUTH, timeout=120) as http, \
                Client(streamable_http_client(url + "/mcp", http_client=http)) as client:
            r = await client.call_tool("retrieve", {"query": QUERIES[0], "top_k": 5,
                                                    "mode": "hybrid", "where": WHERE})
            hits = r.structured_content["hits"]
            assert [(h["key"], h["id"]) for h in hits] == [(x.key, x.id) for x in want]
            _own(hits, corpus)
            r = await client.call_tool("explain", {"query": QUERIES[0], "top_k": 3,
                                                   "where": WHERE})
            explained = json.loads(r.content[0].text)["explanation"]["hits"]
            assert all(h["metadata"]["third"] == 0 for h in explained) and len(explained) == 3

    with serve_asgi(create_app(searcher, ServerConfig(token=TOKEN))) as (url, _):
        asyncio.run(asyncio.wait_for(run(url), 300))
