"""What retrieval returns: a Hit per ranked passage, the batched Ranking behind them with its
PPR certificates (PPRReport), the failure of some queries of a batch (QueryFailure), and the
recognition-memory filter protocol the Searcher accepts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

from hippo_gpu.data import Triple
from hippo_gpu.ppr import ConvergenceError, PPRSolution
from hippo_gpu.ppr.linear import LinearSolution

__all__ = ["FactFilter", "FilterResult", "Hit", "PPRReport", "QueryFailure", "Ranking",
           "SeedTriple", "label_fields"]


@dataclass(frozen=True)
class Hit:
    """One ranked passage for one query."""

    key: str  # "chunk-" + md5(title + "\n" + text)
    title: str
    score: float
    rank: int  # 0-based position in the ranking
    row: int  # passage row in the index (0..P-1): index.passage_texts[row] is its text
    id: str | None = None  # the passage's own id (its corpus item's "id"), if it has one
    metadata: dict[str, Any] | None = field(default=None, hash=False)  # its "metadata", if any


def label_fields(passage_id: str | None, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """A passage's own "id" and "metadata" as every JSON answer carries them: each only when
    set, so an unlabelled index answers as it did before labels existed."""
    out: dict[str, Any] = {}
    if passage_id is not None:
        out["id"] = passage_id
    if metadata is not None:
        out["metadata"] = metadata
    return out


class SeedTriple(NamedTuple):
    """A fact whose phrases seeded a query's PPR (a `Triple`: it equals the tuple)."""

    subject: str
    predicate: str
    object: str

    def as_json(self) -> list[str]:
        """[subject, predicate, object], as the HTTP and MCP answers carry it."""
        return [self.subject, self.predicate, self.object]


class FilterResult(Protocol):
    """What retrieval reads of a filter's answer (hippo_gpu.llm.filter.FilterOutcome or alike)."""

    kept: list[list[int]]
    fallbacks: int


class FactFilter(Protocol):
    """Recognition memory: (queries, candidate facts per query) -> kept candidate indices."""

    def __call__(self, queries: list[str], candidates: list[list[Triple]]) -> FilterResult: ...


@dataclass
class Ranking:
    """Batched retrieval output. Shapes: Q queries, K = min(top_k, P)."""

    passage_rows: Tensor  # [Q, K] int64 passage rows, best first
    scores: Tensor  # [Q, K] float
    stage_seconds: dict[str, float]
    dense_fallback: Tensor  # [Q] bool: query answered by the dense ranking
    seed_facts: Tensor | None = None  # [Q, L] int64 fact rows used as seeds (-1 = none)
    filter_outcome: FilterResult | None = None
    ppr: PPRReport | None = None  # the PPR certificates behind each query (None: no PPR ran)
    fact_table: Sequence[Triple] = ()  # the index's facts, which seed_facts' rows index
    # hipporag1 and hybrid: per query, the entities its entity ranking linked: the caller's, or
    # when none were given the LLM-free extractor's (hippo_gpu.retrieval.entities). An empty
    # list: none, so hipporag1 scored every passage 1/P and hybrid fused no entity ranking.
    # None in the modes that link no entity.
    entities: list[list[str]] | None = None

    @property
    def seeds(self) -> list[list[SeedTriple]]:
        """The seed facts of each query: the kept facts whose phrases seeded its PPR (empty
        where the dense ranking answered, and in modes dense and hipporag1)."""
        if self.seed_facts is None:
            return [[] for _ in range(self.passage_rows.shape[0])]
        rows = torch.where(self.dense_fallback.unsqueeze(1).to(self.seed_facts.device),
                           torch.full_like(self.seed_facts, -1), self.seed_facts)
        return [[SeedTriple(*self.fact_table[j]) for j in row if j >= 0]
                for row in rows.cpu().tolist()]

    @property
    def failed(self) -> dict[int, str]:
        """{query row: why it has no answer} (its PPR is uncertified; empty when all are)."""
        return {} if self.ppr is None else self.ppr.failed

    @property
    def ppr_bound(self) -> Tensor | None:
        """[Q] float64 worst certified L1 bound per query (None: no PPR ran)."""
        return None if self.ppr is None else self.ppr.bound

    @property
    def ppr_refined(self) -> Tensor | None:
        """[Q] bool: a stalled float32 solve of the query was finished in float64."""
        return None if self.ppr is None else self.ppr.refined


@dataclass
class PPRReport:
    """The PPR certificates of a batch of Q queries, folded in solve by solve.

    Attributes:
        bound: [Q] float64, the worst certified L1 bound of the solves behind each query
            (0: none).
        refined: [Q] bool, a stalled float32 solve of the query was finished in float64.
        failed: {query row: why} for queries with an uncertified solve.
        pushed: [Q] bool, answered by PPR by linearity (basis + push, hippo_gpu.ppr.linear).
        push_work: [Q] int64 edges its push scanned (also for a push that gave up).
        push_touched: [Q] int64 nodes its push reached.
    """

    bound: Tensor
    refined: Tensor
    failed: dict[int, str] = field(default_factory=dict)
    pushed: Tensor | None = None
    push_work: Tensor | None = None
    push_touched: Tensor | None = None

    @classmethod
    def empty(cls, num_queries: int) -> PPRReport:
        return cls(torch.zeros(num_queries, dtype=torch.float64),
                   torch.zeros(num_queries, dtype=torch.bool))

    def record_push(self, out: LinearSolution, rows: Tensor) -> None:
        """Fold in the push statistics of one chunk solved by linearity (``record`` folds its
        certificates); ``rows`` as in ``record``."""
        q = self.bound.numel()
        if self.pushed is None or self.push_work is None or self.push_touched is None:
            self.pushed = torch.zeros(q, dtype=torch.bool)
            self.push_work = torch.zeros(q, dtype=torch.int64)
            self.push_touched = torch.zeros(q, dtype=torch.int64)
        rows = rows.cpu()
        used = torch.nonzero(rows >= 0).flatten()
        mine = rows[used]
        self.pushed[mine] = out.pushed[used]
        self.push_work[mine] = out.push.work[used]
        self.push_touched[mine] = out.push.touched[used]

    def record(self, solution: PPRSolution, rows: Tensor) -> None:
        """Fold one PPR solve in; ``rows`` [c] are the query rows of its columns (-1: a
        placeholder column whose PPR is discarded)."""
        rows = rows.cpu()
        used = torch.nonzero(rows >= 0).flatten()
        mine = rows[used]
        self.bound[mine] = torch.maximum(self.bound[mine], solution.bound.cpu().double()[used])
        self.refined[mine] |= solution.refined.cpu()[used]
        for col, why in solution.failures().items():
            if int(rows[col]) >= 0:
                self.failed.setdefault(int(rows[col]), why)


class QueryFailure(ConvergenceError):
    """Some queries of a batch have no answer (their PPR is uncertified); the others do.

    Attributes:
        failures: {query row: why}.
        hits: the answers of every query, [] for a failed one.
        explanations: `Searcher.explain`'s answer for every query (a failed one without
            hits), else None.
    """

    def __init__(self, failures: dict[int, str], hits: list[list[Hit]],
                 explanations: list[Any] | None = None) -> None:
        rows = sorted(failures)
        super().__init__(f"{len(rows)} of {len(hits)} queries failed (rows {rows[:10]}): "
                         f"{failures[rows[0]]}", rows)
        self.failures = failures
        self.hits = hits
        self.explanations = explanations
