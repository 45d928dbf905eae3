"""The entity-seeded half of a Searcher: hybrid's entity ranking and legacy HippoRAG 1.

Both start from a query's named entities (not its fact matches): each entity is linked to a
phrase of the index, the phrases seed a PPR, and passages score by the mass of their phrases
(hippo_gpu.retrieval.hybrid for the hybrid mode's entity ranking, hippo_gpu.retrieval.hipporag1 for
the legacy mode). An `EntityRanker` runs them over one index and keeps what they build once (the
v1 graph, the passage-phrase incidence); the Searcher owns one and shares its solvers and query
encoder with it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.indexing.index import Index
from hippo_gpu.ppr import ConvergenceError, PPRSolution
from hippo_gpu.retrieval import hipporag1
from hippo_gpu.retrieval.blockwise import spans
from hippo_gpu.retrieval.call import RankCall
from hippo_gpu.retrieval.hybrid import entity_doc, link_entities, passage_phrase_incidence
from hippo_gpu.retrieval.query_encoder import QueryEncoder
from hippo_gpu.retrieval.ranking import cat_topk
from hippo_gpu.retrieval.results import PPRReport, Ranking
from hippo_gpu.retrieval.seeds import leading_block
from hippo_gpu.retrieval.solvers import SolverCache

__all__ = ["EntityRanker", "check_entities"]


def check_entities(queries: list[str], query_entities: Sequence[Sequence[str]]) -> None:
    if len(query_entities) != len(queries):
        raise ValueError(
            f"query_entities has {len(query_entities)} rows for {len(queries)} queries")
    for i, ents in enumerate(query_entities):
        if isinstance(ents, str) or not all(isinstance(e, str) for e in ents):
            raise TypeError(f"query_entities[{i}] must be a list of strings")


class EntityRanker:
    """The entity-seeded rankings of one index (module docstring).

    Args:
        index: the index ranked.
        solvers: the Searcher's solver cache (the phrase graph's and the v1 graph's solvers).
        encoder: the Searcher's query encoder (entity texts are encoded by the index's model,
            loaded on first use; exact-match linking asks whether it lower-cases its input).
    """

    def __init__(self, index: Index, solvers: SolverCache, encoder: QueryEncoder) -> None:
        self.index = index
        self.solvers = solvers
        self.encoder = encoder
        self.v1_graph: hipporag1.V1Graph | None = None  # built on first use
        self._incidences: dict[torch.dtype, Tensor] = {}  # passage-phrase incidence per dtype

    def scores(self, query_entities: Sequence[Sequence[str]],
               cfg: RetrievalConfig) -> tuple[Tensor, Tensor]:
        """The hybrid mode's entity ranking: HippoRAG 1's idea, simplified (tuned as it is).

        Each entity is linked to the phrase equal to its lower-cased text, else to its nearest
        phrase by cosine; the phrase gets reset weight 1 / |passages containing it| (node
        specificity); PPR runs on the phrase block of the index graph; a passage scores the sum
        of the PPR of the phrases it mentions (binary passage-phrase incidence, where legacy v1
        weights a phrase by the facts of the passage that name it), min-max normalised per
        query. Legacy v1 itself is mode "hipporag1" (hippo_gpu.retrieval.hipporag1).

        Retrieval calls the two halves, linking (once per batch) and scoring (per chunk of
        queries), separately; this is the whole batch at once.

        Returns:
            scores: [Q, P] float32 (rows of queries without entities are zero).
            has_entities: [Q] bool.
        """
        linked = self.link(query_entities, cfg)
        doc, has_ent, solution = self.doc(*linked, 0, len(query_entities), cfg)
        if solution is not None:
            report = PPRReport.empty(len(query_entities))
            report.record(solution, torch.arange(len(query_entities)).masked_fill(
                ~has_ent.cpu(), -1))
            if report.failed:
                raise ConvergenceError(next(iter(report.failed.values())), sorted(report.failed))
        return doc, has_ent

    def link(self, query_entities: Sequence[Sequence[str]],
             cfg: RetrievalConfig) -> tuple[Tensor, Tensor]:
        """(phrase row [E], query row [E]) of every entity of a batch (hybrid.link_entities)."""
        uncased = any(query_entities) and len(self.index.phrases) > 0 and \
            self.encoder.uncased  # probes the encoder only when there is something to link
        return link_entities(self.index, query_entities, cfg, self.encoder.encode, uncased)

    def doc(self, nearest: Tensor, owner: Tensor, start: int, stop: int,
            cfg: RetrievalConfig) -> tuple[Tensor, Tensor, PPRSolution | None]:
        """hybrid.entity_doc with the phrase graph's solver and the incidence."""
        index = self.index
        solver = self.solvers.get("phrases", cfg.ppr,
                                  lambda: leading_block(index.adjacency, len(index.phrases)))
        return entity_doc(index, solver, self._incidence(solver.dtype), nearest, owner,
                          start, stop, cfg)

    def _incidence(self, dtype: torch.dtype) -> Tensor:
        """[P, M] binary passage-phrase incidence as sparse CSR (built once per dtype)."""
        inc = self._incidences.get(dtype)
        if inc is None:
            inc = passage_phrase_incidence(self.index, dtype)
            self._incidences[dtype] = inc
        return inc

    def rank_hipporag1(self, call: RankCall, query_entities: Sequence[Sequence[str]]) -> Ranking:
        """Legacy HippoRAG 1 ranking (hippo_gpu.retrieval.hipporag1, eqs. 1-2): entities -> nearest
        phrase by the index encoder's cosine -> specificity-weighted PPR on the v1 phrase graph
        -> minmax(D FP x). A query without entities gets uniform scores 1/P (row order), as v1
        does; dense_fallback is False for every query (no dense ranking is used). The Searcher
        supplies the entities (the caller's or the LLM-free extractor's)."""
        queries, cfg, clock, plan = call.queries, call.cfg, call.clock, call.plan
        check_entities(queries, query_entities)
        index, dev = self.index, self.index.device
        if self.v1_graph is None:
            self.v1_graph = hipporag1.build_v1_graph(index)
            clock.lap("graph")
        graph = self.v1_graph
        texts, owner = hipporag1.flatten_entities(query_entities)
        rows = torch.zeros(0, dtype=torch.int64, device=dev)
        if texts and index.phrases:
            rows = hipporag1.link_entities(self.encoder.encode(texts), index.phrase_emb,
                                           plan.phrase_rows)
        clock.lap("link")
        solver = self.solvers.get("v1", cfg.ppr, lambda: graph.adjacency)
        own = torch.tensor(owner, dtype=torch.int64, device=dev)
        call.capture.v1(graph, rows, own)
        parts = []
        no_fallback = torch.zeros(len(queries), dtype=torch.bool, device=dev)
        report = PPRReport.empty(len(queries))
        query_rows = torch.arange(len(queries))
        for a, b in spans(len(queries), plan.query_cols):  # [M, c] seeds, [c, P] scores
            mine = (own >= a) & (own < b)
            scores, has, solution = hipporag1.passage_scores(
                graph, solver, rows[mine], own[mine] - a, b - a)
            if solution is not None:
                report.record(solution, query_rows[a:b][has.cpu()])
            clock.lap("ppr")
            parts.append(call.top(scores))
            clock.lap("rank")
        top_scores, top_rows = cat_topk(parts)
        return Ranking(top_rows, top_scores, clock.seconds, no_fallback, ppr=report)
