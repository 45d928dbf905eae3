"""LangChain and LlamaIndex retrievers (hippo_gpu.integrations) on the bundled sample index.

Local mode is compared with `Searcher.retrieve` on the same searcher (exactly: same call shape);
URL mode talks to a real uvicorn on 127.0.0.1 with a bearer token and is compared with local mode
(same ranking; scores to float32 rounding, as in tests/serve/test_server.py). `batch` is
checked to be ONE retrieval for N queries by counting calls on the real searcher. The LangChain
section also runs langchain-tests' standard retriever suite, locally and against the server. Each
framework
section skips only when its framework is not installed.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hippo_gpu import Searcher, load_index
from hippo_gpu.data import read_questions
from hippo_gpu.integrations import PassageClient, RemoteRetrievalError
from hippo_gpu.sample import paths

TOKEN = "integration-token-5d2e"
MODES = ("dense", "hipporag1", "hipporag2", "hybrid")
QUERIES = [q.question for q in read_questions(paths()["questions"])] + [
    "Which Stanford University professor works on Alzheimer's?",  # no such passage: still ranked
    "lighthouse",
]


def _optional(name: str) -> ModuleType | None:
    """Import an optional framework module, or None when it is not installed (those tests then
    skip through pytest.importorskip; any other import error propagates)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        return None


@pytest.fixture(scope="module")
def searcher(sample_index_dir: Path) -> Searcher:
    """The bundled sample (built once per session by tests/conftest.py), on CPU."""
    return Searcher(load_index(sample_index_dir, device="cpu"))


@pytest.fixture
def counted(searcher: Searcher, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Records the queries of every `searcher.retrieve` call (the real method still runs)."""
    calls: list[list[str]] = []
    real = searcher.retrieve

    def retrieve(queries: Any, **kw: Any) -> Any:
        calls.append(list(queries))
        return real(queries, **kw)

    monkeypatch.setattr(searcher, "retrieve", retrieve)
    return calls


def _expected(searcher: Searcher, queries: list[str], k: int, mode: str) -> list[list[dict]]:
    texts = searcher.index.passage_texts
    return [[{"key": h.key, "title": h.title, "text": texts[h.row], "score": h.score,
              "rank": h.rank, "row": h.row} for h in hits]
            for hits in searcher.retrieve(queries, top_k=k, mode=mode)]


def _same_ranking(got: list[list[dict]], want: list[list[dict]], *, exact: bool) -> None:
    """Equal rankings; `exact` also compares rows, and scores to float32 round-off (the PPR
    stops at a certified error bound whose last bits, and so whose step count, can vary with
    thread scheduling). Over HTTP rows are None."""
    fields = ("key", "title", "text", "rank")
    assert [[tuple(h[f] for f in fields) for h in q] for q in got] == [
        [tuple(h[f] for f in fields) for h in q] for q in want]
    if exact:
        assert [[h["row"] for h in q] for q in got] == [[h["row"] for h in q] for q in want]
        for g, w in zip(got, want, strict=True):
            assert [h["score"] for h in g] == pytest.approx([h["score"] for h in w],
                                                            rel=1e-6, abs=1e-9)
    else:
        for g, w in zip(got, want, strict=True):
            assert [h["score"] for h in g] == pytest.approx([h["score"] for h in w],
                                                            rel=1e-5, abs=1e-6)
            assert all(h["row"] is None for h in g)


# ---------------------------------------------------------------------------------------------
# the shared client (no framework needed)


@pytest.mark.parametrize("mode", MODES)
def test_client_local_equals_searcher(searcher: Searcher, mode: str) -> None:
    client = PassageClient(searcher=searcher)
    got = [[vars(p) for p in q] for q in client.retrieve(QUERIES, k=5, mode=mode)]
    _same_ranking(got, _expected(searcher, QUERIES, 5, mode), exact=True)


def test_client_rejects_bad_arguments(searcher: Searcher) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        PassageClient()
    with pytest.raises(ValueError, match="exactly one"):
        PassageClient(searcher=searcher, url="http://127.0.0.1:1")
    with pytest.raises(TypeError, match="Searcher"):
        PassageClient(searcher=object())  # type: ignore[arg-type]
    client = PassageClient(searcher=searcher)
    with pytest.raises(ValueError, match="is blank"):
        client.retrieve(["q", "  "], k=3, mode="hipporag1")
    with pytest.raises(ValueError, match="unknown mode .*; choose one of"):
        client.retrieve(["q"], k=3, mode="bm25")
    with pytest.raises(ValueError, match="k must be"):
        client.retrieve(["q"], k=0, mode="dense")
    with pytest.raises(TypeError, match="not one string"):
        client.retrieve("q", k=3, mode="dense")
    assert client.retrieve([], k=3, mode="dense") == []


# ---------------------------------------------------------------------------------------------
# LangChain


@pytest.fixture(scope="module")
def lc() -> ModuleType:
    pytest.importorskip("langchain_core")
    return importlib.import_module("hippo_gpu.integrations.langchain")


def _docs(docs_per_query: list[list[Any]]) -> list[list[dict]]:
    return [[{"key": d.id, "title": d.metadata["title"], "text": d.page_content,
              "score": d.metadata["score"], "rank": d.metadata["rank"], "row": d.metadata["row"]}
             for d in docs] for docs in docs_per_query]


@pytest.mark.parametrize("mode", MODES)
def test_langchain_invoke_equals_searcher(lc: ModuleType, searcher: Searcher, mode: str) -> None:
    retriever = lc.HippoRetriever(searcher=searcher, k=10, mode=mode)
    for query in QUERIES[:2]:
        docs = retriever.invoke(query)
        assert len(docs) == 10
        assert set(docs[0].metadata) == {"key", "title", "score", "rank", "row"}
        _same_ranking(_docs([docs]), _expected(searcher, [query], 10, mode), exact=True)
    short = retriever.invoke(QUERIES[0], k=2)
    _same_ranking(_docs([short]), _expected(searcher, QUERIES[:1], 2, mode), exact=True)
    docs = asyncio.run(retriever.ainvoke(QUERIES[1]))
    _same_ranking(_docs([docs]), _expected(searcher, QUERIES[1:2], 10, mode), exact=True)


def test_langchain_batch_is_one_retrieval(lc: ModuleType, searcher: Searcher,
                                          counted: list[list[str]]) -> None:
    from langchain_core.callbacks import BaseCallbackHandler

    class Runs(BaseCallbackHandler):
        def __init__(self) -> None:
            self.started: list[str] = []
            self.ended = 0

        def on_retriever_start(self, serialized: Any, query: str, **kw: Any) -> None:
            self.started.append(query)

        def on_retriever_end(self, documents: Any, **kw: Any) -> None:
            self.ended += 1

    retriever = lc.HippoRetriever(searcher=searcher, k=4, mode="hipporag2")
    runs = Runs()
    out = retriever.batch(QUERIES, config={"callbacks": [runs]})
    assert counted == [QUERIES]  # ONE call with all N queries
    assert runs.started == QUERIES and runs.ended == len(QUERIES)  # one run per input
    want = _expected(searcher, QUERIES, 4, "hipporag2")
    _same_ranking(_docs(out), want, exact=True)

    counted.clear()
    out = asyncio.run(retriever.abatch(QUERIES))
    assert counted == [QUERIES]
    _same_ranking(_docs(out), want, exact=True)

    counted.clear()
    out = retriever.batch(QUERIES[:3], k=2)
    assert counted == [QUERIES[:3]]
    _same_ranking(_docs(out), _expected(searcher, QUERIES[:3], 2, "hipporag2"), exact=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        retriever.batch(QUERIES[:2], top_k=2)
    assert retriever.batch([]) == []


def test_langchain_batch_error_reaches_every_input(lc: ModuleType, searcher: Searcher,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("device lost")

    monkeypatch.setattr(searcher, "retrieve", fail)
    retriever = lc.HippoRetriever(searcher=searcher, k=3)
    with pytest.raises(RuntimeError, match="device lost"):
        retriever.batch(QUERIES[:2])
    out = retriever.batch(QUERIES[:2], return_exceptions=True)
    assert [str(e) for e in out] == ["device lost", "device lost"]


def test_langchain_rejects_bad_settings(lc: ModuleType, searcher: Searcher) -> None:
    with pytest.raises(ValueError, match="unknown mode .*; choose one of"):
        lc.HippoRetriever(searcher=searcher, mode="bm25")
    with pytest.raises(ValueError, match="exactly one"):
        lc.HippoRetriever(k=3)
    with pytest.raises(ValueError):
        lc.HippoRetriever(searcher=searcher, k=0)
    retriever = lc.HippoRetriever(url="http://127.0.0.1:1", token="secret-abc")
    assert "secret-abc" not in repr(retriever)


lc_standard = _optional("langchain_tests.integration_tests")


@pytest.fixture
def anyio_backend() -> str:
    """The suite's async test runs on asyncio (the retriever uses asyncio, not trio)."""
    return "asyncio"


if lc_standard is not None:

    @pytest.mark.anyio  # runs the suite's async test (anyio's plugin comes with httpx)
    class TestLangChainStandardLocal(lc_standard.RetrieversIntegrationTests):
        """langchain-tests' standard retriever suite, in-process."""

        @pytest.fixture(autouse=True)
        def _searcher(self, searcher: Searcher) -> None:
            self._local = searcher

        @property
        def retriever_constructor(self) -> type:
            return importlib.import_module("hippo_gpu.integrations.langchain").HippoRetriever

        @property
        def retriever_constructor_params(self) -> dict[str, Any]:
            return {"searcher": self._local, "k": 5, "mode": "hipporag2"}

        @property
        def retriever_query_example(self) -> str:
            return QUERIES[1]

    @pytest.mark.anyio
    class TestLangChainStandardServer(lc_standard.RetrieversIntegrationTests):
        """The same suite against a live server with a bearer token."""

        @pytest.fixture(autouse=True)
        def _server(self, server_url: str) -> None:
            self._url = server_url

        @property
        def retriever_constructor(self) -> type:
            return importlib.import_module("hippo_gpu.integrations.langchain").HippoRetriever

        @property
        def retriever_constructor_params(self) -> dict[str, Any]:
            return {"url": self._url, "token": TOKEN, "k": 5, "mode": "hybrid"}

        @property
        def retriever_query_example(self) -> str:
            return QUERIES[2]

else:

    def test_langchain_standard_suite() -> None:
        pytest.importorskip("langchain_tests")


# ---------------------------------------------------------------------------------------------
# LlamaIndex


@pytest.fixture(scope="module")
def li() -> ModuleType:
    pytest.importorskip("llama_index.core")
    return importlib.import_module("hippo_gpu.integrations.llamaindex")


def _nodes(nodes_per_query: list[list[Any]]) -> list[list[dict]]:
    return [[{"key": n.node.node_id, "title": n.node.metadata["title"], "text": n.node.text,
              "score": n.score, "rank": n.node.metadata["rank"], "row": n.node.metadata["row"]}
             for n in nodes] for nodes in nodes_per_query]


@pytest.mark.parametrize("mode", MODES)
def test_llamaindex_retrieve_equals_searcher(li: ModuleType, searcher: Searcher,
                                             mode: str) -> None:
    from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode

    retriever = li.HippoRetriever(searcher=searcher, k=6, mode=mode)
    nodes = retriever.retrieve(QUERIES[0])
    assert all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    _same_ranking(_nodes([nodes]), _expected(searcher, QUERIES[:1], 6, mode), exact=True)
    llm_text = nodes[0].node.get_content(metadata_mode=MetadataMode.LLM)
    assert llm_text.startswith(f"title: {nodes[0].node.metadata['title']}\n")
    assert "rank:" not in llm_text and "row:" not in llm_text
    nodes = asyncio.run(retriever.aretrieve(QUERIES[3]))
    _same_ranking(_nodes([nodes]), _expected(searcher, QUERIES[3:4], 6, mode), exact=True)


def test_llamaindex_batch_is_one_retrieval(li: ModuleType, searcher: Searcher,
                                           counted: list[list[str]]) -> None:
    retriever = li.HippoRetriever(searcher=searcher, k=3, mode="hybrid")
    out = retriever.retrieve_batch(QUERIES)
    assert counted == [QUERIES]
    want = _expected(searcher, QUERIES, 3, "hybrid")
    _same_ranking(_nodes(out), want, exact=True)
    counted.clear()
    out = asyncio.run(retriever.aretrieve_batch(QUERIES))
    assert counted == [QUERIES]
    _same_ranking(_nodes(out), want, exact=True)
    with pytest.raises(ValueError, match="unknown mode .*; choose one of"):
        li.HippoRetriever(searcher=searcher, mode="bm25")


# ---------------------------------------------------------------------------------------------
# URL mode: a real server on 127.0.0.1 with a token


@contextmanager
def serving(searcher: Searcher, token: str) -> Iterator[str]:
    """uvicorn on 127.0.0.1, a free port, in a thread; yields the base URL (as in
    tests/serve/test_server.py's helper)."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    from hippo_gpu.serve.server import ServerConfig, create_app
    from tests.loopback import serve_asgi

    with serve_asgi(create_app(searcher, ServerConfig(token=token)),
                    timeout_graceful_shutdown=20) as (url, _):
        yield url


@pytest.fixture(scope="module")
def server_url(searcher: Searcher) -> Iterator[str]:
    pytest.importorskip("httpx")
    with serving(searcher, TOKEN) as url:
        yield url


def _requests_served(url: str) -> int:
    import httpx

    stats = httpx.get(url + "/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    return int(stats["batcher"]["requests_served"])


@pytest.mark.parametrize("mode", MODES)
def test_client_url_equals_local(searcher: Searcher, server_url: str, mode: str) -> None:
    remote = PassageClient(url=server_url, token=TOKEN)
    want = _expected(searcher, QUERIES, 7, mode)
    before = _requests_served(server_url)
    got = [[vars(p) for p in q] for q in remote.retrieve(QUERIES, k=7, mode=mode)]
    assert _requests_served(server_url) == before + 1  # N queries, one request
    _same_ranking(got, want, exact=False)
    got = [[vars(p) for p in q] for q in asyncio.run(remote.aretrieve(QUERIES, k=7, mode=mode))]
    _same_ranking(got, want, exact=False)
    chunked = PassageClient(url=server_url + "/", token=TOKEN, max_queries_per_request=2)
    before = _requests_served(server_url)
    got = [[vars(p) for p in q] for q in chunked.retrieve(QUERIES, k=7, mode=mode)]
    assert _requests_served(server_url) == before + 3  # 6 queries in requests of 2
    _same_ranking(got, want, exact=False)


def test_client_url_errors(server_url: str) -> None:
    for token in (None, "wrong-token"):
        with pytest.raises(RemoteRetrievalError, match="HTTP 401"):
            PassageClient(url=server_url, token=token).retrieve(["q"], k=3, mode="dense")
    with pytest.raises(RemoteRetrievalError, match="HTTP 422"):  # over the server's max_top_k
        PassageClient(url=server_url, token=TOKEN).retrieve(["q"], k=5000, mode="dense")


def test_langchain_url_equals_local(lc: ModuleType, searcher: Searcher,
                                    server_url: str) -> None:
    local = lc.HippoRetriever(searcher=searcher, k=5, mode="hipporag2")
    remote = lc.HippoRetriever(url=server_url, token=TOKEN, k=5, mode="hipporag2")
    for query in QUERIES[:2]:
        _same_ranking(_docs([remote.invoke(query)]), _docs([local.invoke(query)]), exact=False)
        _same_ranking(_docs([asyncio.run(remote.ainvoke(query))]), _docs([local.invoke(query)]),
                      exact=False)
    want = _docs(local.batch(QUERIES))
    before = _requests_served(server_url)
    _same_ranking(_docs(remote.batch(QUERIES)), want, exact=False)
    _same_ranking(_docs(asyncio.run(remote.abatch(QUERIES))), want, exact=False)
    assert _requests_served(server_url) == before + 2  # one request per batch call
    bad = lc.HippoRetriever(url=server_url, token="wrong-token")
    with pytest.raises(RemoteRetrievalError, match="HTTP 401"):
        bad.invoke(QUERIES[0])


def test_llamaindex_url_equals_local(li: ModuleType, searcher: Searcher,
                                     server_url: str) -> None:
    local = li.HippoRetriever(searcher=searcher, k=5, mode="dense")
    remote = li.HippoRetriever(url=server_url, token=TOKEN, k=5, mode="dense")
    _same_ranking(_nodes([remote.retrieve(QUERIES[0])]), _nodes([local.retrieve(QUERIES[0])]),
                  exact=False)
    _same_ranking(_nodes([asyncio.run(remote.aretrieve(QUERIES[1]))]),
                  _nodes([local.retrieve(QUERIES[1])]), exact=False)
    _same_ranking(_nodes(remote.retrieve_batch(QUERIES)), _nodes(local.retrieve_batch(QUERIES)),
                  exact=False)
