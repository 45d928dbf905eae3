"""The retrievers' IRCoT option (`ircot_steps`): locally with a reasoner, over HTTP with the
server's; both give the offline loop's merged lists (hippo_gpu.retrieval.ircot.ircot_retrieve), with
the scripted LLM of tests/scripted_llm.py writing the thoughts."""

from __future__ import annotations

import pytest

pytest.importorskip("openai")

from hippo_gpu.integrations import PassageClient  # noqa: E402
from hippo_gpu.llm.ircot import IRCoTReasoner  # noqa: E402
from hippo_gpu.retrieval.ircot import ircot_retrieve  # noqa: E402
from hippo_gpu.serve.server import ServerConfig, create_app  # noqa: E402
from tests.loopback import serve_asgi  # noqa: E402
from tests.retrieval.ircot_thoughts import QUESTIONS, SCRIPT  # noqa: E402
from tests.scripted_llm import fast_backend, scripted_llm  # noqa: E402


@pytest.fixture(scope="module")
def llm():
    with scripted_llm(SCRIPT) as (server, spec):
        yield server, spec


@pytest.fixture(scope="module")
def offline(sample_searcher, llm) -> list[list[str]]:
    report = ircot_retrieve(sample_searcher, QUESTIONS, IRCoTReasoner(fast_backend(llm[1])),
                            max_steps=3, top_k=4, mode="hybrid")
    return [[h.key for h in r.hits] for r in report.results]


def test_passage_client_ircot_local_and_over_http(sample_searcher, llm, offline) -> None:
    _, spec = llm
    local = PassageClient(searcher=sample_searcher, reasoner=IRCoTReasoner(fast_backend(spec)))
    got = local.retrieve(QUESTIONS, k=4, mode="hybrid", ircot_steps=3)
    assert [[p.key for p in ps] for ps in got] == offline
    assert [len(ps) for ps in local.retrieve(QUESTIONS, k=4, mode="hybrid")] == [4] * 4
    app = create_app(sample_searcher, ServerConfig(mcp=False),
                     reasoner=IRCoTReasoner(fast_backend(spec)))
    with serve_asgi(app) as (url, _):
        remote = PassageClient(url=url, max_queries_per_request=3)  # two requests
        got = remote.retrieve(QUESTIONS, k=4, mode="hybrid", ircot_steps=3)
    assert [[p.key for p in ps] for ps in got] == offline
    with pytest.raises(ValueError, match="reasoner= is for searcher="):
        PassageClient(url="http://127.0.0.1:1", reasoner=local.reasoner)
    with pytest.raises(ValueError, match="ircot_steps needs reasoner="):
        PassageClient(searcher=sample_searcher).retrieve(QUESTIONS, k=2, mode="dense",
                                                         ircot_steps=2)
    with pytest.raises(ValueError, match="ircot_steps"):
        local.retrieve(QUESTIONS, k=2, mode="dense", ircot_steps=0)


def test_langchain_and_llamaindex_retrievers_take_ircot_steps(sample_searcher, llm,
                                                              offline) -> None:
    _, spec = llm
    reasoner = IRCoTReasoner(fast_backend(spec))
    found = []
    try:
        from hippo_gpu.integrations.langchain import HippoRetriever as LangChainRetriever
    except ModuleNotFoundError:
        pass
    else:
        lc = LangChainRetriever(searcher=sample_searcher, k=4, mode="hybrid", ircot_steps=3,
                                reasoner=reasoner)
        found.append([[d.id for d in docs] for docs in lc.batch(QUESTIONS)])
        assert [d.id for d in lc.invoke(QUESTIONS[0])] == offline[0]
        with pytest.raises(ValueError, match="ircot_steps"):
            LangChainRetriever(searcher=sample_searcher, ircot_steps=0, reasoner=reasoner)
    try:
        from hippo_gpu.integrations.llamaindex import HippoRetriever as LlamaIndexRetriever
    except ModuleNotFoundError:
        pass
    else:
        li = LlamaIndexRetriever(searcher=sample_searcher, k=4, mode="hybrid", ircot_steps=3,
                                 reasoner=reasoner)
        found.append([[n.node.id_ for n in nodes] for nodes in li.retrieve_batch(QUESTIONS)])
    if not found:
        pytest.skip("neither langchain-core nor llama-index-core is installed")
    assert all(f == offline for f in found)
