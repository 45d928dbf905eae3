"""LangChain retriever over hippo_gpu: a local `Searcher` or a `hippo-gpu serve` URL.

    from hippo_gpu.integrations.langchain import HippoRetriever
    retriever = HippoRetriever(searcher=Searcher(index), k=10, mode="hipporag2")
    retriever = HippoRetriever(url="http://127.0.0.1:8000", token="...")     # a server
    docs = retriever.invoke("Who founded ...?")            # list[Document], best first
    docs = retriever.invoke("Who founded ...?", k=3)       # k per call
    per_query = retriever.batch(["q1", "q2", ...])         # ONE batched retrieval

Each passage becomes `Document(id=its own id, else its key, page_content=text, metadata={its own
metadata..., "key", "title", "score", "rank", "row"})`; `row` is the passage row in the index in
local mode and None over HTTP (the server does not send rows). `where=` filters by metadata.
`batch`/`abatch` are overridden: LangChain's default runs `invoke` once per input
on a thread pool, which here would give up the batched encoder GEMM and the single multi-column
PPR solve; the override makes one retrieval for all inputs (one HTTP request per 64 queries in URL
mode) and still reports one retriever run per input to the callbacks. Needs the `langchain` extra.

IRCoT: `HippoRetriever(..., ircot_steps=3, reasoner=IRCoTReasoner("openai:..."))` (local) or
`HippoRetriever(url=..., ircot_steps=3)` (the server's LLM) returns each query's merged IRCoT
list (hippo_gpu.retrieval.ircot), up to k x ircot_steps documents.
"""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForRetrieverRun,
    CallbackManager,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config, get_config_list
from pydantic import Field, PrivateAttr, SecretStr, field_validator

from hippo_gpu.integrations.client import Passage, PassageClient, check_ircot_steps, check_mode
from hippo_gpu.retrieval.searcher import Searcher

__all__ = ["HippoRetriever"]


class HippoRetriever(BaseRetriever):
    """HippoRAG retrieval as a LangChain `BaseRetriever`.

    Give exactly one of `searcher` (in-process) and `url` (a `hippo-gpu serve` server).

    Attributes:
        searcher: a `hippo_gpu.Searcher` (local mode).
        url: base URL of a server, e.g. "http://127.0.0.1:8000" (URL mode).
        token: bearer token of the server (URL mode; kept out of repr and serialisation).
        k: passages returned per query; `invoke(query, k=3)` overrides it per call.
        mode: one of hippo_gpu.config.MODES (hipporag1 and hybrid link the capitalised
            spans of the query).
        timeout: seconds per HTTP request (URL mode).
        max_queries_per_request: most queries per HTTP request (URL mode; the server's default
            limit is 64).
        ircot_steps: None (one retrieval), or IRCoT with this many steps per query.
        reasoner: the IRCoT thought source in local mode (hippo_gpu.llm.ircot.IRCoTReasoner).
        where: a metadata filter (Searcher.retrieve's: applied after the PPR), e.g.
            {"source": "wiki"}; None: every passage.
    """

    searcher: Searcher | None = None
    url: str | None = None
    token: SecretStr | None = None
    k: int = Field(default=10, ge=1)
    mode: str = "hipporag2"
    timeout: float = Field(default=60.0, gt=0)
    max_queries_per_request: int = Field(default=64, ge=1)
    ircot_steps: int | None = None
    reasoner: Any = None
    where: dict[str, Any] | None = None

    _client: PassageClient = PrivateAttr()

    @field_validator("mode")
    @classmethod
    def _valid_mode(cls, mode: str) -> str:
        check_mode(mode)
        return mode

    @field_validator("ircot_steps")
    @classmethod
    def _valid_steps(cls, steps: int | None) -> int | None:
        check_ircot_steps(steps)
        return steps

    def model_post_init(self, context: Any, /) -> None:
        self._client = PassageClient(
            searcher=self.searcher, url=self.url,
            token=self.token.get_secret_value() if self.token is not None else None,
            timeout=self.timeout, max_queries_per_request=self.max_queries_per_request,
            reasoner=self.reasoner)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        found = self._client.retrieve([query], k=self.k if k is None else k, mode=self.mode,
                                      ircot_steps=self.ircot_steps,
                                      where=self.where)
        return self._documents(found)[0]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
    ) -> list[Document]:
        found = await self._client.aretrieve([query], k=self.k if k is None else k,
                                             mode=self.mode, ircot_steps=self.ircot_steps,
                                      where=self.where)
        return self._documents(found)[0]

    def batch(
        self,
        inputs: list[str],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[list[Document]]:  # type: ignore[override]
        """Retrieve for every input with ONE batched retrieval (per-input runs for callbacks).

        A failure fails every input alike (they share one call): raised, or with
        `return_exceptions=True` returned in every input's place.
        """
        if not inputs:
            return []
        k = _pop_k(kwargs, self.k)
        runs = [self._start(query, cfg, kwargs)
                for query, cfg in zip(inputs, get_config_list(config, len(inputs)))]
        try:
            docs = self._documents(self._client.retrieve(inputs, k=k, mode=self.mode,
                                                         ircot_steps=self.ircot_steps,
                                      where=self.where))
        except Exception as e:  # reported to every run, then raised or returned (not swallowed)
            for run in runs:
                run.on_retriever_error(e)
            if return_exceptions:
                return [e] * len(inputs)  # type: ignore[list-item]
            raise
        for run, result in zip(runs, docs):
            run.on_retriever_end(result)
        return docs

    async def abatch(
        self,
        inputs: list[str],
        config: RunnableConfig | list[RunnableConfig] | None = None,
        *,
        return_exceptions: bool = False,
        **kwargs: Any,
    ) -> list[list[Document]]:  # type: ignore[override]
        """Async `batch`: one retrieval for all inputs (httpx.AsyncClient / a worker thread)."""
        if not inputs:
            return []
        k = _pop_k(kwargs, self.k)
        runs = [await self._astart(query, cfg, kwargs)
                for query, cfg in zip(inputs, get_config_list(config, len(inputs)))]
        try:
            docs = self._documents(await self._client.aretrieve(inputs, k=k, mode=self.mode,
                                                                ircot_steps=self.ircot_steps,
                                      where=self.where))
        except Exception as e:  # reported to every run, then raised or returned (not swallowed)
            for run in runs:
                await run.on_retriever_error(e)
            if return_exceptions:
                return [e] * len(inputs)  # type: ignore[list-item]
            raise
        for run, result in zip(runs, docs):
            await run.on_retriever_end(result)
        return docs

    @staticmethod
    def _documents(found: list[list[Passage]]) -> list[list[Document]]:
        return [
            [Document(id=p.document_id(), page_content=p.text,
                      metadata=p.document_metadata(title=p.title, score=p.score, rank=p.rank,
                                                   row=p.row))
             for p in passages]
            for passages in found
        ]

    def _callback_args(self, config: RunnableConfig | None, kwargs: dict[str, Any]
                       ) -> tuple[RunnableConfig, dict[str, Any]]:
        """What `BaseRetriever.invoke` passes to CallbackManager.configure, for one input."""
        cfg = ensure_config(config)
        return cfg, {
            "inheritable_callbacks": cfg.get("callbacks"),
            "local_callbacks": None,
            "verbose": bool(kwargs.get("verbose", False)),
            "inheritable_tags": cfg.get("tags"),
            "local_tags": self.tags,
            "inheritable_metadata": {**(cfg.get("metadata") or {}), **self._get_ls_params()},
            "local_metadata": self.metadata,
        }

    def _start(self, query: str, config: RunnableConfig | None, kwargs: dict[str, Any]
               ) -> CallbackManagerForRetrieverRun:
        cfg, args = self._callback_args(config, kwargs)
        return CallbackManager.configure(**args).on_retriever_start(
            None, query, name=cfg.get("run_name") or self.get_name(), run_id=_run_id(cfg))

    async def _astart(self, query: str, config: RunnableConfig | None, kwargs: dict[str, Any]
                      ) -> AsyncCallbackManagerForRetrieverRun:
        cfg, args = self._callback_args(config, kwargs)
        return await AsyncCallbackManager.configure(**args).on_retriever_start(
            None, query, name=cfg.get("run_name") or self.get_name(), run_id=_run_id(cfg))


def _pop_k(kwargs: dict[str, Any], default: int) -> int:
    """The per-call `k` of batch/abatch; any other keyword is an error, as in `invoke`."""
    k = kwargs.pop("k", None)
    unknown = set(kwargs) - {"verbose"}
    if unknown:
        raise TypeError(f"unexpected keyword arguments: {sorted(unknown)}")
    return default if k is None else k


def _run_id(config: RunnableConfig) -> uuid.UUID | None:
    run_id = config.get("run_id")
    return run_id if isinstance(run_id, uuid.UUID) else None
