"""PassageClient: one batched retrieval for a list of queries, in-process or over HTTP.

The framework adapters (langchain.py, llamaindex.py) are thin shells around this class, so both
behave alike:

- local mode holds a `Searcher`: `retrieve(queries, k=, mode=)` is one `Searcher.retrieve` call
  for all queries; the passage text is `index.passage_texts[hit.row]`. Calls are serialised by
  a lock (a Searcher builds its encoder and solvers lazily and is not documented as thread-safe;
  torch already spreads one batch over the CPU threads). The async variant runs on a worker
  thread.
- URL mode talks to `hippo-gpu serve`: POST {url}/v1/retrieve {"queries", "top_k", "mode"} with
  `Authorization: Bearer <token>` when a token is given. A list of queries is sent as one request
  (split into requests of at most `max_queries_per_request`, the server's default limit, 64).
  The server does not return passage rows, so `Passage.row` is None in this mode.

IRCoT (`ircot_steps=S`, hippo_gpu.retrieval.ircot): each query's ranking is its merged IRCoT list
(up to k x S passages). Locally the client's `reasoner` (hippo_gpu.llm.ircot.IRCoTReasoner or any
ThoughtSource) writes the thoughts; over HTTP the request carries {"ircot": {"max_steps": S}} and
the server's own LLM (`serve --llm`) writes them.

The two modes return the same ranking for the same index, queries, k and mode (the server is a
`Searcher` behind a micro-batcher; tests/integrations/test_integrations.py checks it). Scores may
differ in the last float32 bits, because the query encoder rounds differently with the batch's
shape.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hippo_gpu.errors import HippoGpuError
from hippo_gpu.retrieval.ircot import ThoughtSource, ircot_retrieve
from hippo_gpu.retrieval.modes import mode_of
from hippo_gpu.retrieval.searcher import Searcher

__all__ = ["Passage", "PassageClient", "RemoteRetrievalError"]


class RemoteRetrievalError(HippoGpuError, RuntimeError):
    """The server answered a retrieval request with an error status or a malformed body."""


@dataclass(frozen=True)
class Passage:
    """One ranked passage for one query, as both modes return it."""

    key: str  # passage key, "chunk-" + md5(title + "\n" + text)
    title: str
    text: str
    score: float
    rank: int  # 0-based position in the ranking
    row: int | None  # passage row in the index; None over HTTP (the server does not send it)
    id: str | None = None  # the passage's own id (its corpus item's "id"), if any
    metadata: dict[str, Any] | None = field(default=None, hash=False)  # its own metadata

    def document_id(self) -> str:
        """The id a framework document carries: the passage's own, else its key."""
        return self.key if self.id is None else self.id

    def document_metadata(self, **ours: Any) -> dict[str, Any]:
        """A framework document's metadata: the passage's own, then "key" and `ours` (the
        retriever's fields, which win over an own field of the same name)."""
        return {**(self.metadata or {}), "key": self.key, **ours}


class PassageClient:
    """Answers lists of queries with one batched retrieval each (see the module docstring).

    Args:
        searcher: a local Searcher (local mode), or None.
        url: base URL of a `hippo-gpu serve` server, e.g. "http://127.0.0.1:8000" (URL mode),
            or None. Exactly one of `searcher` and `url` must be given.
        token: bearer token for the server (URL mode only).
        timeout: seconds per HTTP request (URL mode).
        max_queries_per_request: most queries per HTTP request (URL mode).
        reasoner: the thought source of IRCoT retrievals (local mode only).
    """

    def __init__(
        self,
        *,
        searcher: Searcher | None = None,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 60.0,
        max_queries_per_request: int = 64,
        reasoner: ThoughtSource | None = None,
    ) -> None:
        if (searcher is None) == (url is None):
            raise ValueError("give exactly one of searcher= (local) and url= (HTTP server)")
        if searcher is not None and not isinstance(searcher, Searcher):
            raise TypeError(f"searcher must be a hippo_gpu.Searcher, got {type(searcher)!r}")
        if searcher is not None and token is not None:
            raise ValueError("token= is for url= mode; a local searcher takes none")
        if reasoner is not None and searcher is None:
            raise ValueError("reasoner= is for searcher= mode; a server writes IRCoT thoughts "
                             "with its own LLM (hippo-gpu serve --llm)")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if max_queries_per_request < 1:
            raise ValueError(f"max_queries_per_request must be >= 1, got "
                             f"{max_queries_per_request}")
        self.searcher = searcher
        self.url = url.rstrip("/") if url is not None else None
        self.timeout = timeout
        self.max_queries_per_request = max_queries_per_request
        self.reasoner = reasoner
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._lock = threading.Lock()

    def retrieve(self, queries: Sequence[str], *, k: int, mode: str,
                 ircot_steps: int | None = None, where: dict[str, Any] | None = None
                 ) -> list[list[Passage]]:
        """Top-k passages for each query, best first, from one batched retrieval (with
        `ircot_steps`: the merged IRCoT list, one batched retrieval per step; `where`: a
        metadata filter, Searcher.retrieve's).

        `mode` is one of hippo_gpu.config.MODES; hipporag1 and hybrid link the capitalised
        spans of each query (the LLM-free extractor, hippo_gpu.retrieval.entities), as every
        surface does without given entities.
        """
        queries = _check(queries, k, mode, ircot_steps)
        if not queries:
            return []
        if self.searcher is not None:
            return self._local(self.searcher, queries, k, mode, ircot_steps, where)
        import httpx

        with httpx.Client(timeout=self.timeout, headers=self._headers) as http:
            out: list[list[Passage]] = []
            for chunk in self._chunks(queries):
                response = http.post(self._endpoint,
                                     json=_body(chunk, k, mode, ircot_steps, where))
                out.extend(_parse(response, chunk))
            return out

    async def aretrieve(self, queries: Sequence[str], *, k: int, mode: str,
                        ircot_steps: int | None = None, where: dict[str, Any] | None = None
                        ) -> list[list[Passage]]:
        """Async `retrieve`: httpx.AsyncClient in URL mode, a worker thread in local mode."""
        queries = _check(queries, k, mode, ircot_steps)
        if not queries:
            return []
        if self.searcher is not None:
            return await asyncio.to_thread(self._local, self.searcher, queries, k, mode,
                                           ircot_steps, where)
        import httpx

        async with httpx.AsyncClient(timeout=self.timeout, headers=self._headers) as http:
            chunks = self._chunks(queries)
            responses = await asyncio.gather(
                *(http.post(self._endpoint, json=_body(c, k, mode, ircot_steps, where))
                  for c in chunks))
        return [p for r, c in zip(responses, chunks) for p in _parse(r, c)]

    @property
    def _endpoint(self) -> str:
        return f"{self.url}/v1/retrieve"

    def _chunks(self, queries: list[str]) -> list[list[str]]:
        n = self.max_queries_per_request
        return [queries[i:i + n] for i in range(0, len(queries), n)]

    def _local(self, searcher: Searcher, queries: list[str], k: int, mode: str,
               ircot_steps: int | None = None, where: dict[str, Any] | None = None
               ) -> list[list[Passage]]:
        texts = searcher.index.passage_texts
        with self._lock:
            if ircot_steps is None:
                hits = searcher.retrieve(queries, top_k=k, mode=mode, where=where)
            elif self.reasoner is None:
                raise ValueError("ircot_steps needs reasoner= in searcher= mode (e.g. "
                                 "hippo_gpu.llm.ircot.IRCoTReasoner)")
            else:
                hits = [r.hits for r in ircot_retrieve(searcher, queries, self.reasoner,
                                                       max_steps=ircot_steps, top_k=k,
                                                       mode=mode, where=where).results]
        return [[Passage(h.key, h.title, texts[h.row], h.score, h.rank, h.row, h.id,
                         h.metadata) for h in row]
                for row in hits]


def check_mode(mode: str) -> None:
    """Raise ValueError unless `mode` is a retrieval mode these retrievers can run."""
    mode_of(mode)  # ValueError: "unknown mode ...; choose one of MODES"


def check_ircot_steps(steps: int | None) -> None:
    """Raise ValueError unless `steps` is None or an integer >= 1."""
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"ircot_steps must be None or an integer >= 1, got {steps!r}")


def _check(queries: Sequence[str], k: int, mode: str, ircot_steps: int | None = None
           ) -> list[str]:
    check_mode(mode)
    check_ircot_steps(ircot_steps)
    if isinstance(queries, str):
        raise TypeError("queries must be a sequence of strings, not one string")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    return list(queries)


def _body(queries: list[str], k: int, mode: str, ircot_steps: int | None = None,
          where: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"queries": queries, "top_k": k, "mode": mode}
    if ircot_steps is not None:
        body["ircot"] = {"max_steps": ircot_steps}
    if where is not None:
        body["where"] = where
    return body


def _parse(response: Any, queries: list[str]) -> list[list[Passage]]:
    """The body of a /v1/retrieve response -> Passages; raise RemoteRetrievalError on errors."""
    if response.status_code != 200:
        detail = response.text[:500]
        raise RemoteRetrievalError(
            f"POST {response.request.url} -> HTTP {response.status_code}: {detail}")
    try:
        results = response.json()["results"]
        if len(results) != len(queries):
            raise ValueError(f"{len(results)} result lists for {len(queries)} queries")
        return [[Passage(str(h["key"]), str(h["title"]), str(h["text"]), float(h["score"]),
                         int(h["rank"]), None, h.get("id"), h.get("metadata"))
                 for h in hits] for hits in results]
    except (ValueError, KeyError, TypeError) as e:
        raise RemoteRetrievalError(f"malformed response from {response.request.url}: {e}") from e
