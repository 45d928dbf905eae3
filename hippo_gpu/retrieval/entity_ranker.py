"""The entity-seeded half of a Searcher: hybrid's entity ranking and legacy HippoRAG 1.

Both start from a query's named entities (not its fact matches): each entity is linked to a
phrase of the index, the phrases seed a PPR, and passages score by the mass of their phrases
(hippo_gpu.retrieval.hybrid for the hybrid mode's entity ranking, hippo_gpu.retrieval.hipporag1 for
the legacy mode). `EntityPaths` holds the Searcher methods that run them; the Searcher
(retrieval/searcher.py) mixes it in and owns the state they use (index, encoder, solvers, the v1
graph, incidence cache).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from hippo_gpu.config import RetrievalConfig, solver_method
from hippo_gpu.embed import Encoder
from hippo_gpu.indexing.index import Index
from hippo_gpu.ppr import ConvergenceError, PPRSolution, PPRSolver
from hippo_gpu.retrieval import hipporag1
from hippo_gpu.retrieval.blockwise import spans
from hippo_gpu.retrieval.explain import Capture
from hippo_gpu.retrieval.hybrid import entity_doc, link_entities, passage_phrase_incidence
from hippo_gpu.retrieval.ranking import cat_topk, topk_stable
from hippo_gpu.retrieval.results import PPRReport, Ranking
from hippo_gpu.retrieval.seeds import plan_chunks

__all__ = ["Clock", "EntityPaths", "check_entities"]


class Clock:
    """Stage timer. With ``sync`` (Searcher.profile) it synchronises CUDA at each lap so each
    stage is charged its own work; without, a served GPU query pays no syncs and the laps only
    split the host time (the total is still right)."""

    def __init__(self, device: torch.device, *, sync: bool = False) -> None:
        self.sync = sync and device.type == "cuda"
        self.device = device
        self.seconds: dict[str, float] = {}
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.sync:
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.t
        self.t = now


def check_entities(queries: list[str], query_entities: Sequence[Sequence[str]]) -> None:
    if len(query_entities) != len(queries):
        raise ValueError(
            f"query_entities has {len(query_entities)} rows for {len(queries)} queries")
    for i, ents in enumerate(query_entities):
        if isinstance(ents, str) or not all(isinstance(e, str) for e in ents):
            raise TypeError(f"query_entities[{i}] must be a list of strings")



class EntityPaths:
    """Searcher methods of the entity-seeded modes (module docstring)."""

    index: Index
    _solvers: dict[tuple[Any, ...], PPRSolver]
    _hipporag1: hipporag1.V1Graph | None
    _incidences: dict[torch.dtype, Tensor]

    def _solver(self, cfg: RetrievalConfig, *, phrase_graph: bool = False) -> PPRSolver:
        raise NotImplementedError  # the Searcher's

    @property
    def encoder(self) -> Encoder:
        raise NotImplementedError  # the Searcher's

    @property
    def encoder_is_uncased(self) -> bool:
        raise NotImplementedError  # the Searcher's

    def entity_scores(self, query_entities: Sequence[Sequence[str]],
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
        linked = self._link_entities(query_entities, cfg)
        doc, has_ent, solution = self._entity_doc(*linked, 0, len(query_entities), cfg)
        if solution is not None:
            report = PPRReport.empty(len(query_entities))
            report.record(solution, torch.arange(len(query_entities)).masked_fill(
                ~has_ent.cpu(), -1))
            if report.failed:
                raise ConvergenceError(next(iter(report.failed.values())), sorted(report.failed))
        return doc, has_ent

    def _link_entities(self, query_entities: Sequence[Sequence[str]],
                       cfg: RetrievalConfig) -> tuple[Tensor, Tensor]:
        """(phrase row [E], query row [E]) of every entity of a batch (hybrid.link_entities)."""
        uncased = any(query_entities) and len(self.index.phrases) > 0 and \
            self.encoder_is_uncased  # probes the encoder only when there is something to link
        return link_entities(self.index, query_entities, cfg,
                             lambda texts: self.encoder.encode(texts), uncased)

    def _entity_doc(self, nearest: Tensor, owner: Tensor, start: int, stop: int,
                    cfg: RetrievalConfig) -> tuple[Tensor, Tensor, PPRSolution | None]:
        """hybrid.entity_doc with this searcher's phrase-graph solver and incidence."""
        solver = self._solver(cfg, phrase_graph=True)
        return entity_doc(self.index, solver, self._incidence(solver.dtype), nearest, owner,
                          start, stop, cfg)

    def _incidence(self, dtype: torch.dtype) -> Tensor:
        """[P, M] binary passage-phrase incidence as sparse CSR (built once per dtype)."""
        inc = self._incidences.get(dtype)
        if inc is None:
            inc = passage_phrase_incidence(self.index, dtype)
            self._incidences[dtype] = inc
        return inc

    def _rank_hipporag1(self, queries: list[str],
                        query_entities: Sequence[Sequence[str]] | None, top_k: int,
                        cfg: RetrievalConfig, clock: Clock, capture: Capture) -> Ranking:
        """Legacy HippoRAG 1 ranking (hippo_gpu.retrieval.hipporag1, eqs. 1-2): entities -> nearest
        phrase by the index encoder's cosine -> specificity-weighted PPR on the v1 phrase graph
        -> minmax(D FP x). A query without entities gets uniform scores 1/P (row order), as v1
        does; dense_fallback is False for every query (no dense ranking is used)."""
        if query_entities is None:
            raise ValueError(
                "mode 'hipporag1' needs the named entities of each query: pass query_entities "
                "(from an LLM via hippo_gpu.llm.ner.QueryNER, or a HippoRAG "
                "*_queries.named_entity_output.tsv via hippo_gpu.llm.ner.read_query_ner_tsv)")
        check_entities(queries, query_entities)
        index, dev = self.index, self.index.device
        if self._hipporag1 is None:
            self._hipporag1 = hipporag1.build_v1_graph(index)
            clock.lap("graph")
        texts, owner = hipporag1.flatten_entities(query_entities)
        plan = plan_chunks(index, len(queries), cfg, num_entities=len(texts))
        rows = torch.zeros(0, dtype=torch.int64, device=dev)
        if texts and index.phrases:
            rows = hipporag1.link_entities(self.encoder.encode(texts), index.phrase_emb,
                                           plan.phrase_rows)
        clock.lap("link")
        key = ("hipporag1", cfg.damping, cfg.dtype, cfg.ppr_tol, solver_method(cfg.ppr_method),
               cfg.ppr_max_iter)
        if key not in self._solvers:
            self._solvers[key] = hipporag1.make_solver(self._hipporag1, cfg)
        own = torch.tensor(owner, dtype=torch.int64, device=dev)
        capture.v1(self._hipporag1, rows, own)
        parts = []
        no_fallback = torch.zeros(len(queries), dtype=torch.bool, device=dev)
        report = PPRReport.empty(len(queries))
        query_rows = torch.arange(len(queries))
        for a, b in spans(len(queries), plan.query_cols):  # [M, c] seeds, [c, P] scores
            mine = (own >= a) & (own < b)
            scores, has, solution = hipporag1.passage_scores(
                self._hipporag1, self._solvers[key], rows[mine], own[mine] - a, b - a)
            if solution is not None:
                report.record(solution, query_rows[a:b][has.cpu()])
            clock.lap("ppr")
            parts.append(topk_stable(scores, top_k))
            clock.lap("rank")
        top_scores, top_rows = cat_topk(parts)
        return Ranking(top_rows, top_scores, clock.seconds, no_fallback, ppr=report)

