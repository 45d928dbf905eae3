"""The retrieval service every transport answers through: named indexes, each with its searcher
holder and its own micro-batcher.

HTTP (server.py) and MCP (mcp.py) both call `RetrievalService.admit` (the work budget,
serve/budget.py), then `RetrievalService.retrieve`, so a query reaches a `Searcher` the same way
whichever protocol carried it: merged with concurrent queries of the same index and batch key into
one batched `Searcher.retrieve` call on that index's worker thread.

Several indexes: each has a name (`INDEX_NAME`: letters, digits, "_", "-", "." ; at most 64
characters), its own batcher (a batch never mixes indexes: rankings are per index) and its own
`SearcherHolder`, so a write to one index switches only that index's queries. The first index is
the default for requests that name none.

Batching rule: only requests with the same (mode, top_k, return_seeds, with_entities) share a
batch. `Searcher.retrieve` takes entities for every query of a call or for none (none: hybrid's
capitalised-span fallback), so queries with and without entities cannot share a call; each query
then gets exactly the ranking it would get alone. Running a merged batch at the largest top_k and
truncating would also be sound in exact arithmetic, but ties broken differently by a larger `topk`
could reorder equal-score passages and break the promise that a served ranking equals the offline
`retrieve()` for the same arguments; clients normally send one top_k, so the grouping costs little.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from hippo_gpu.errors import HippoGpuError
from hippo_gpu.retrieval.explanation import explanation_dict
from hippo_gpu.retrieval.modes import Mode
from hippo_gpu.retrieval.results import Hit, QueryFailure, label_fields
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.serve.batcher import (
    BatcherClosedError,
    BatcherConfig,
    BatchOutputError,
    MicroBatcher,
    QueueFullError,
)
from hippo_gpu.serve.budget import OverBudgetError, request_cost
from hippo_gpu.serve.holder import SearcherHolder

if TYPE_CHECKING:
    from hippo_gpu.serve.config import CostLimits
    from hippo_gpu.serve.metrics import Metrics

__all__ = [
    "DEFAULT_INDEX",
    "INDEX_NAME",
    "Answer",
    "BatchKey",
    "Query",
    "RetrievalService",
    "ServedIndex",
    "UnknownIndexError",
    "hit_dict",
    "parse_index_spec",
    "parse_index_specs",
    "tensor_bytes",
]

# The name of the index served by the single-index forms (`create_app(searcher)`, `--index DIR`).
DEFAULT_INDEX = "default"
INDEX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


class UnknownIndexError(HippoGpuError, LookupError):
    """A request named an index this server does not serve."""

    def __init__(self, name: str, served: Sequence[str]) -> None:
        self.name = name
        self.served = list(served)
        super().__init__(f"unknown index {_short(name)}: this server serves "
                         f"{', '.join(repr(s) for s in self.served)}")

    def __str__(self) -> str:  # KeyError-style quoting would wrap the message in quotes
        return str(self.args[0])


def _short(name: str, limit: int = 64) -> str:
    """repr of a client-given name, cut to `limit` characters (error messages stay short)."""
    return repr(name if len(name) <= limit else name[:limit] + "...")


def check_index_name(name: str) -> str:
    if not INDEX_NAME.fullmatch(name):
        raise ValueError(f"bad index name {_short(name)}: use 1-64 letters, digits, '_', '-' or "
                         "'.', starting with a letter or digit")
    return name


def parse_index_spec(spec: str) -> tuple[str, Path]:
    """`NAME=DIR` -> (NAME, DIR); a bare `DIR` -> (DEFAULT_INDEX, DIR).

    The text before the first "=" is a name only if it is a valid index name, so a path such as
    `./a=b` (a "/" before the "=") is a directory.
    """
    name, sep, rest = spec.partition("=")
    if sep and INDEX_NAME.fullmatch(name):
        if not rest:
            raise ValueError(f"--index {spec!r}: no directory after '='")
        return name, Path(rest)
    return DEFAULT_INDEX, Path(spec)


def parse_index_specs(values: Sequence[str]) -> dict[str, Path]:
    """`--index` values (each `NAME=DIR` or `DIR`) -> {name: directory}, in the given order.

    Raises:
        ValueError: a directory does not exist, or a name is given twice (naming the culprit).
    """
    specs: dict[str, Path] = {}
    for value in values:
        name, path = parse_index_spec(value)
        if not path.is_dir():
            raise ValueError(f"--index {value!r}: {path} is not a directory")
        if name in specs:
            raise ValueError(f"--index: the name {name!r} is given twice; name each index: "
                             "--index NAME=DIR")
        specs[name] = path
    return specs


class BatchKey(NamedTuple):
    mode: Mode
    top_k: int
    return_seeds: bool
    with_entities: bool  # every query of the batch carries its entities, or none does
    explain: bool = False  # answer with Searcher.explain (each hit's score decomposed)
    where: str | None = None  # the metadata filter as canonical JSON (None: none)

    def filter(self) -> dict[str, Any] | None:
        return None if self.where is None else json.loads(self.where)


class Query(NamedTuple):
    """One query as it travels through the batcher."""

    text: str
    entities: list[str] | None  # None: not given, or not read by the mode


class Answer(NamedTuple):
    hits: list[dict[str, Any]]  # JSON-ready {"key", "title", "text", "score", "rank"}
    seeds: list[Any] | None
    error: str | None = None  # why this query has no answer (its PPR is uncertified)
    explanation: dict[str, Any] | None = None  # explain batches: explanation's JSON
    version: int | None = None  # the index version that answered (None: never saved)
    # hipporag1 and hybrid: the entities the query's entity ranking linked (the caller's or
    # the LLM-free extractor's; [] none); None in the other modes (Ranking.entities)
    entities: list[str] | None = None


def answered_version(answers: list[Answer]) -> int | None:
    """The index version that answered every one of `answers` (one batch, pinned to one
    version, answers a request); None when they name none (an index never saved, an IRCoT
    request whose steps a write split) or several."""
    versions = {a.version for a in answers}
    return versions.pop() if len(versions) == 1 else None


class _SearcherAdapter:
    """Runs one batch through `Searcher.rank` and turns hits into JSON-ready dicts.

    A query whose PPR could not be certified gets an `Answer` with `error` set and no hits; the
    rest of its batch is answered (hippo_gpu.retrieval.results.Ranking.failed).

    Each batch takes the holder's current searcher once, at its start (`pinned`, the
    batcher's session: every chunk of a batch too large for one call), and uses only it: a
    write that commits meanwhile switches later batches, never this one (no mixed versions).
    Each answer names that searcher's index version.
    """

    def __init__(self, holder: SearcherHolder) -> None:
        self._holder = holder
        self._pinned: Searcher | None = None  # the batch's searcher (one worker thread)

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        self._pinned = self._holder.current
        try:
            yield
        finally:
            self._pinned = None

    def __call__(self, queries: list[Query], key: BatchKey) -> list[Answer]:
        searcher = self._pinned or self._holder.current  # one version for the whole batch
        version = searcher.index.version
        texts = [q.text for q in queries]
        # a batch keyed with_entities holds only queries with entities (the batching rule)
        entities = [q.entities or [] for q in queries] if key.with_entities else None
        if key.explain:
            return [a._replace(version=version) for a in _explain(searcher, texts, entities, key)]
        ranking = searcher.rank(texts, top_k=key.top_k, mode=key.mode, query_entities=entities,
                                where=key.filter())
        hits = searcher.to_hits(ranking)  # a failed query has none; the others are answered
        if len(hits) != len(queries):
            raise BatchOutputError(f"retrieve returned {len(hits)} rankings for {len(queries)}")
        seeds: list[list[Any] | None] = [None] * len(queries)
        if key.return_seeds:
            seeds = [[s.as_json() for s in per_query] for per_query in ranking.seeds]
        passage_texts = searcher.index.passage_texts
        used = ranking.entities
        return [
            Answer([hit_dict(h, passage_texts) for h in per_query], s, ranking.failed.get(i),
                   version=version, entities=None if used is None else used[i])
            for i, (per_query, s) in enumerate(zip(hits, seeds, strict=True))
        ]


def _explain(searcher: Searcher, texts: list[str], entities: list[list[str]] | None,
             key: BatchKey) -> list[Answer]:
    """An explain batch: `Searcher.explain` on the queries; a query whose PPR is uncertified
    gets its error, the others their explanation."""
    index = searcher.index
    failed: dict[int, str] = {}
    try:
        explained = searcher.explain(texts, top_k=key.top_k, mode=key.mode,
                                     query_entities=entities, where=key.filter())
    except QueryFailure as e:
        explained, failed = e.explanations or [], e.failures
    if len(explained) != len(texts):
        raise BatchOutputError(f"explain returned {len(explained)} answers for {len(texts)}")
    return [
        Answer([], None, failed[i]) if i in failed else
        Answer([hit_dict(h.hit, index.passage_texts) for h in ex.hits], None, None,
               explanation_dict(ex, index.passage_keys, index.passage_titles,
                                index.passage_texts))
        for i, ex in enumerate(explained)
    ]


def hit_dict(h: Hit, passage_texts: Sequence[str]) -> dict[str, Any]:
    """A `Hit` as the JSON both transports return ("id" and "metadata" when it has them)."""
    return {
        "key": h.key,
        "title": h.title,
        "text": passage_texts[h.row],
        "score": float(h.score),
        "rank": int(h.rank),
        **label_fields(h.id, h.metadata),
    }


def tensor_bytes(obj: Any) -> int:
    """Bytes held by the tensors among `obj`'s dataclass fields (sparse: indices + values).

    For an `Index`: its graph and embeddings on its device. Python-side tables (keys, titles,
    texts) and a searcher's solvers and encoder are not counted.
    """
    total = 0
    for f in dataclasses.fields(obj):
        t = getattr(obj, f.name)
        if not isinstance(t, torch.Tensor):
            continue
        if t.layout == torch.sparse_csr:
            parts = [t.crow_indices(), t.col_indices(), t.values()]
        elif t.layout == torch.sparse_coo:
            parts = [t._indices(), t._values()]
        else:
            parts = [t]
        total += sum(p.element_size() * p.nelement() for p in parts)
    return total


class ServedIndex:
    """One named index: its searcher holder and its micro-batcher."""

    def __init__(self, name: str, holder: SearcherHolder, config: BatcherConfig,
                 metrics: Metrics | None = None) -> None:
        self.name = check_index_name(name)
        self.holder = holder
        on_batch = None if metrics is None else metrics.observe_batch(name)
        adapter = _SearcherAdapter(holder)
        self.batcher: MicroBatcher[Query, BatchKey, Answer] = MicroBatcher(
            adapter, config, on_batch=on_batch, session=adapter.pinned)

    @property
    def passages(self) -> int:
        """Passages of the version now served: the most hits a query can get."""
        return len(self.holder.current.index.passage_keys)

    def describe(self) -> dict[str, Any]:
        """name, version (None: never saved), passages, memory_bytes, device, precision."""
        index = self.holder.current.index
        return {
            "name": self.name,
            "version": index.version,
            "passages": len(index.passage_keys),
            "memory_bytes": tensor_bytes(index),
            "device": str(index.device),
            "precision": index.precision,
        }


class RetrievalService:
    """Named indexes behind one process, each answered through its own micro-batcher.

    Use from one asyncio event loop: `await start()` (or `async with`), then `retrieve` from any
    number of tasks, then `await close()`, which drains every batcher.
    """

    def __init__(self, indexes: Mapping[str, Searcher | SearcherHolder], batcher: BatcherConfig,
                 metrics: Metrics | None = None) -> None:
        if not indexes:
            raise ValueError("serve at least one index")
        self.metrics = metrics
        self.indexes: dict[str, ServedIndex] = {}
        for name, s in indexes.items():
            holder = s if isinstance(s, SearcherHolder) else SearcherHolder(s)
            self.indexes[name] = ServedIndex(name, holder, batcher, metrics)
        self.default = next(iter(self.indexes))

    @property
    def names(self) -> list[str]:
        return list(self.indexes)

    def get(self, name: str | None) -> ServedIndex:
        """The index called `name` (None: the default); UnknownIndexError names a wrong one."""
        if name is None:
            return self.indexes[self.default]
        try:
            return self.indexes[name]
        except KeyError:
            raise UnknownIndexError(name, self.names) from None

    async def start(self) -> None:
        for served in self.indexes.values():
            await served.batcher.start()

    async def close(self) -> None:
        """Refuse new queries, then answer every queued one (each index's batcher drains)."""
        for served in self.indexes.values():
            await served.batcher.close()

    async def __aenter__(self) -> RetrievalService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def accepting(self) -> bool:
        return all(s.batcher.accepting for s in self.indexes.values())

    def admit(self, limits: CostLimits, queries: Sequence[str], *, top_k: int, mode: Mode,
              entities: Sequence[Sequence[str]] | None = None, index: str | None = None,
              explain: bool = False, steps: int = 1) -> int:
        """The request's estimated work (serve/budget.request_cost) on index `index`, when it is
        within `limits`; call before `retrieve`, once per request (IRCoT: `steps` of them).

        Raises:
            UnknownIndexError: `index` is not served.
            OverBudgetError: the estimate is over `limits.max_request_cost` (and is counted).
        """
        cost = request_cost(queries, entities, top_k=top_k, mode=mode, explain=explain,
                            passages=self.get(index).passages, steps=steps)
        if cost > limits.max_request_cost:
            if self.metrics is not None:
                self.metrics.rejected.labels(reason="over_budget").inc()
            raise OverBudgetError(cost, limits.max_request_cost)
        return cost

    async def retrieve(self, queries: Sequence[str], *, top_k: int, mode: Mode,
                       entities: Sequence[Sequence[str]] | None = None,
                       return_seeds: bool = False, index: str | None = None,
                       transport: str = "http", explain: bool = False,
                       where: dict[str, Any] | None = None) -> list[Answer]:
        """Rank passages of index `index` for `queries`, batched with concurrent callers
        (`where`: a metadata filter, Searcher.retrieve's; requests batch with those of the
        same filter).

        Arguments are taken as validated by the transport (limits, modes); `entities` is one
        list per query or None, and is dropped for modes that do not read it. With `explain`
        each answer also carries the decomposition of its hits (`Searcher.explain`; explain
        requests are batched among themselves).

        Raises:
            UnknownIndexError: `index` is not served.
            QueueFullError, BatcherClosedError: see MicroBatcher.submit (and are counted).
        """
        served = self.get(index)
        with_entities = entities is not None and mode.reads_entities
        batch = [Query(q, list(entities[i]) if with_entities and entities is not None else None)
                 for i, q in enumerate(queries)]  # fmt: skip
        key = BatchKey(mode, top_k, return_seeds, with_entities, explain,
                       None if where is None else json.dumps(where, sort_keys=True))
        started = time.monotonic()
        status = "error"
        try:
            answers = await served.batcher.submit(batch, key)
            status = "ok"
            return answers
        except QueueFullError:
            status = "queue_full"
            raise
        except BatcherClosedError:
            status = "shutting_down"
            raise
        except asyncio.CancelledError:  # the caller went away
            status = "cancelled"
            raise
        finally:
            if self.metrics is not None:
                self.metrics.observe_retrieve(
                    index=served.name, mode=mode.name, transport=transport, status=status,
                    queries=len(batch),
                    seconds=time.monotonic() - started if status == "ok" else None)

    def passage(self, key: str) -> dict[str, Any] | None:
        """The passage with `key` and the served indexes that hold it (None: none does).

        Keys are content hashes of the indexed text, so every index holding a key holds the same
        title and text.
        """
        found: dict[str, Any] | None = None
        for served in self.indexes.values():
            index = served.holder.current.index
            row = index.row_of_key.get(key)
            if row is None:
                continue
            if found is None:
                found = {"key": key, "title": index.passage_titles[row],
                         "text": index.passage_texts[row], "indexes": []}
            found["indexes"].append(served.name)
        return found
