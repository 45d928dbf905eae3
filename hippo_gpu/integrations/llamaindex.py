"""LlamaIndex retriever over hippo_gpu: a local `Searcher` or a `hippo-gpu serve` URL.

    from hippo_gpu.integrations.llamaindex import HippoRetriever
    retriever = HippoRetriever(searcher=Searcher(index), k=10, mode="hipporag2")
    retriever = HippoRetriever(url="http://127.0.0.1:8000", token="...")     # a server
    nodes = retriever.retrieve("Who founded ...?")       # list[NodeWithScore], best first
    per_query = retriever.retrieve_batch(["q1", "q2"])   # ONE batched retrieval

Each passage becomes `NodeWithScore(node=TextNode(id_=its own id, else its key, text=text,
metadata={its own metadata..., "key", "title", "rank", "row"}), score=score)`; `row` is the
passage row in the index in local mode and None over HTTP (the server does not send rows). Only
`title` and the passage's own metadata reach the LLM or an embedder through the node's content
(key, rank and row are bookkeeping). `where=` filters by metadata. LlamaIndex's BaseRetriever
has no batch entry point, so `retrieve_batch` / `aretrieve_batch` are this class's own (they
skip the per-query callback events of `retrieve`). Needs the `llamaindex` extra.

IRCoT: `ircot_steps=S` (with `reasoner=` in local mode; over HTTP the server's LLM) returns each
query's merged IRCoT list (hippo_gpu.retrieval.ircot), up to k x S nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from hippo_gpu.integrations.client import Passage, PassageClient, check_ircot_steps, check_mode
from hippo_gpu.retrieval.searcher import Searcher

__all__ = ["HippoRetriever"]

_BOOKKEEPING = ["key", "rank", "row"]  # metadata kept out of the text an LLM or embedder sees


class HippoRetriever(BaseRetriever):
    """HippoRAG retrieval as a LlamaIndex `BaseRetriever`.

    Give exactly one of `searcher` (in-process) and `url` (a `hippo-gpu serve` server).

    Args:
        searcher: a `hippo_gpu.Searcher` (local mode).
        url: base URL of a server, e.g. "http://127.0.0.1:8000" (URL mode).
        token: bearer token of the server (URL mode).
        k: passages returned per query.
        mode: one of hippo_gpu.config.MODES (hipporag1 and hybrid link the capitalised
            spans of the query).
        timeout: seconds per HTTP request (URL mode).
        max_queries_per_request: most queries per HTTP request (URL mode; server default 64).
        ircot_steps: None (one retrieval), or IRCoT with this many steps per query.
        reasoner: the IRCoT thought source in local mode (hippo_gpu.llm.ircot.IRCoTReasoner).
        where: a metadata filter (Searcher.retrieve's: applied after the PPR), e.g.
            {"source": "wiki"}; None: every passage.
        callback_manager, verbose: as for any LlamaIndex retriever.
    """

    def __init__(
        self,
        searcher: Searcher | None = None,
        url: str | None = None,
        token: str | None = None,
        *,
        k: int = 10,
        mode: str = "hipporag2",
        timeout: float = 60.0,
        max_queries_per_request: int = 64,
        ircot_steps: int | None = None,
        reasoner: Any = None,
        where: dict[str, Any] | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        check_mode(mode)
        check_ircot_steps(ircot_steps)
        self.k = k
        self.mode = mode
        self.ircot_steps = ircot_steps
        self.where = where
        self._client = PassageClient(searcher=searcher, url=url, token=token, timeout=timeout,
                                     max_queries_per_request=max_queries_per_request,
                                     reasoner=reasoner)
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return _nodes(self._client.retrieve([query_bundle.query_str], k=self.k,
                                            mode=self.mode, ircot_steps=self.ircot_steps,
                                            where=self.where))[0]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return _nodes(await self._client.aretrieve([query_bundle.query_str], k=self.k,
                                                   mode=self.mode,
                                                   ircot_steps=self.ircot_steps,
                                                   where=self.where))[0]

    def retrieve_batch(self, queries: Sequence[str]) -> list[list[NodeWithScore]]:
        """Nodes for every query from ONE batched retrieval (no per-query callback events)."""
        return _nodes(self._client.retrieve(queries, k=self.k, mode=self.mode,
                                            ircot_steps=self.ircot_steps, where=self.where))

    async def aretrieve_batch(self, queries: Sequence[str]) -> list[list[NodeWithScore]]:
        """Async `retrieve_batch` (httpx.AsyncClient in URL mode, a worker thread locally)."""
        return _nodes(await self._client.aretrieve(queries, k=self.k, mode=self.mode,
                                                   ircot_steps=self.ircot_steps, where=self.where))


def _nodes(found: list[list[Passage]]) -> list[list[NodeWithScore]]:
    return [
        [NodeWithScore(node=TextNode(id_=p.document_id(), text=p.text,
                                     metadata=p.document_metadata(title=p.title, rank=p.rank,
                                                                  row=p.row),
                                     excluded_llm_metadata_keys=list(_BOOKKEEPING),
                                     excluded_embed_metadata_keys=list(_BOOKKEEPING)),
                       score=p.score)
         for p in passages]
        for passages in found
    ]
