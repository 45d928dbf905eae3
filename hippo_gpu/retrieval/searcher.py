"""Searcher: batched retrieval over one Index, queries -> ranked passages.

A `Searcher` owns the query-time state of one index on one device: the query encoder, the PPR
solvers and the lookup tables they need. The index itself stays plain data. What it runs is in
the modules below it: the ranking primitives (hippo_gpu.retrieval.ranking), the chunk plan, fact
top-k and reset vectors (hippo_gpu.retrieval.seeds), the hybrid fusion and entity ranking
(hippo_gpu.retrieval.hybrid), legacy HippoRAG 1 (hippo_gpu.retrieval.hipporag1) and the PPR solvers
(hippo_gpu.ppr).

All per-query work is batched tensor work: one encoder call per instruction type, one GEMM for
queries x facts and one for queries x passages, `torch.topk` for candidate facts, scatter-adds for
seed weights, one batched PPR solve, `torch.topk` for the ranking. No Python loop over nodes,
passages or queries in the hot path.

Memory (issue 13). Nothing of size Q x F or Q x N outgrows `RetrievalConfig.chunk_bytes`
(`plan_chunks` sizes the chunks): fact scores are taken in blocks of fact rows with a running
exact top-k (`fact_topk`); passage scores, seeds, PPR, fusion and the final top-k run per chunk
of query columns, each chunk seeing only its [c, P] scores and [N, c] seeds. Chunks change no
result: each query's numbers come from the same float operations in the same order whatever
its chunk (hippo_gpu.retrieval.blockwise: padded GEMM panels, aligned row blocks; the PPR kernel
solves each column alone), tested bit for bit against one chunk in
tests/retrieval/test_chunked_search.py. An index that fits the budget runs as one chunk.

Modes:
    hipporag2  official HippoRAG 2 (main@c617143) retrieval, step by step (parity mode)
    dense      DPR with the index's encoder
    hybrid     our improvement (hippo_gpu.retrieval.hybrid): phrase seeds as hipporag2 but
    normalised, a
               sharp softmax passage prior instead of 0.05 x min-max, then reciprocal-rank
               fusion of the PPR, dense and entity rankings
    hipporag1  HippoRAG 1: query entities -> nearest phrase -> specificity-weighted PPR on the
               phrase graph -> passage scores (needs query entities)

`explain` answers like `retrieve` and splits each hit's score exactly into one term per seed
and one for the dense prior (hippo_gpu.retrieval.explain), from the inputs `rank` records for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, overload

import torch
from torch import Tensor

from hippo_gpu.config import MODES, RetrievalConfig, solver_method
from hippo_gpu.data import Triple
from hippo_gpu.device import ppr_dtype, set_threads
from hippo_gpu.embed import Encoder, runnable_precision
from hippo_gpu.indexing.index import Index
from hippo_gpu.ppr import PPRSolver
from hippo_gpu.ppr.linear import LinearPPR
from hippo_gpu.retrieval import hipporag1
from hippo_gpu.retrieval.blockwise import scores_against, spans
from hippo_gpu.retrieval.entities import heuristic_entities
from hippo_gpu.retrieval.entity_ranker import Clock, EntityPaths, check_entities
from hippo_gpu.retrieval.explain import Capture, explain_ranking, explain_solver
from hippo_gpu.retrieval.explanation import QueryExplanation
from hippo_gpu.retrieval.hybrid import hybrid_fusion
from hippo_gpu.retrieval.passage_ppr import iterate_chunk, linear_ppr, solve_linear_chunk
from hippo_gpu.retrieval.ranking import cat_topk, minmax_rows, topk_stable
from hippo_gpu.retrieval.results import (
    FactFilter,
    FilterResult,
    Hit,
    PPRReport,
    QueryFailure,
    Ranking,
)
from hippo_gpu.retrieval.seeds import fact_topk, leading_block, plan_chunks, reset_vectors
from hippo_gpu.storage.directory import IndexFormatError
from hippo_gpu.versions.load import refresh_index

__all__ = ["Searcher"]


def _check_queries(queries: Sequence[str]) -> list[str]:
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, not one string")
    out = list(queries)
    for i, q in enumerate(out):
        if not isinstance(q, str):
            raise TypeError(f"queries[{i}] is {type(q).__name__}, expected str")
    return out


def _kept_mask(outcome: FilterResult, shape: torch.Size, limit: int) -> Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    for qi, kept in enumerate(outcome.kept):
        for j in kept[:limit]:
            if 0 <= j < shape[1]:
                mask[qi, j] = True
    return mask



class Searcher(EntityPaths):
    """Answers batches of queries over one `Index`, on the index's device.

    Owns the query-time state: the query encoder (loaded on first use), the PPR solvers (one per
    graph and setting, built on first use) and lookup tables. Build one per index and device and
    reuse it: the first query pays for the encoder load and the solver build.

    Args:
        index: the index to search (its device is the searcher's device).
        config: default retrieval settings (defaults reproduce upstream); `rank`/`retrieve`
            accept a per-call override.
        query_precision: query encoder precision (default: the index's encoder precision, as
            the index's device runs it: float32 for a float16 encoder off CUDA).
        query_batch_size: query encoder batch size (default: the index's encoder setting).
        query_backend: what runs the query encoder: "auto" (ONNX Runtime on a CPU when the
            `onnx` extra is installed and its vectors pass the parity check against torch,
            else torch), "torch" or "onnx". See hippo_gpu.embed.Encoder.
        encoder: an already loaded query encoder of the index's model to reuse.
        cache_dir: embedding cache for the encoder (queries are not cached; entity texts are).
        query_base_url: for an index built with a server encoder ("openai:MODEL"), the URL of
            the server to query instead of the one the index recorded (None: the index's).
        profile: synchronise CUDA between stages so `Ranking.stage_seconds` charges each stage
            its own device work (benchmarks, eval); off by default, so a served GPU query pays
            no syncs.
    """

    def __init__(self, index: Index, config: RetrievalConfig | None = None, *,
                 query_precision: str | None = None, query_batch_size: int | None = None,
                 query_backend: str = "auto", encoder: Encoder | None = None,
                 cache_dir: str | Path | None = None, profile: bool = False,
                 query_base_url: str | None = None) -> None:
        self.index = index
        self.profile = profile
        self.config = config or RetrievalConfig()
        enc = self.index.config.encoder
        if query_base_url is not None and not enc.is_remote:
            raise ValueError(f"query_base_url is for an index built with a server encoder; "
                             f"this one was built with {enc.model!r}")
        self.encoder_config = replace(
            enc, precision=query_precision or runnable_precision(enc.precision, index.device),
            query_batch_size=query_batch_size or enc.query_batch_size,
            backend=query_backend, base_url=query_base_url or enc.base_url)
        self._query_encoder = encoder
        self._cache_dir = cache_dir
        self._solvers: dict[tuple[Any, ...], PPRSolver] = {}
        self._hipporag1: hipporag1.V1Graph | None = None  # v1 graph, built on first use
        self._incidences: dict[torch.dtype, Tensor] = {}  # passage-phrase incidence per dtype
        self._linears: dict[float, LinearPPR] = {}  # hipporag2 by linearity, per damping
        self._uncased: bool | None = None

    @property
    def device(self) -> torch.device:
        return self.index.device

    def refresh(self) -> Searcher:
        """A searcher over the current version of this index's directory, reached by replaying
        the segments committed since (versions.refresh_index: no reload of the base), with the
        same settings and query encoder; this searcher itself when nothing was committed."""
        index = refresh_index(self.index)
        return self if index is self.index else self.over(index)

    def over(self, index: Index) -> Searcher:
        """A searcher with this one's settings and query encoder over another version of the
        same index (a commit's, a refresh's)."""
        enc = self.encoder_config
        return Searcher(index, self.config, query_precision=enc.precision,
                        query_batch_size=enc.query_batch_size, query_backend=enc.backend,
                        encoder=self._query_encoder, cache_dir=self._cache_dir,
                        profile=self.profile,
                        query_base_url=enc.base_url if enc.is_remote else None)

    @property
    def encoder(self) -> Encoder:
        """The query encoder (the index's own model), loaded on first use."""
        if self._query_encoder is None:
            # a server encoder checks every answer against the index's dimension
            dim = int(self.index.passage_emb.shape[1]) if self.encoder_config.is_remote else None
            enc = Encoder(self.encoder_config, self.device, cache_dir=self._cache_dir, dim=dim)
            if enc.dim != self.index.passage_emb.shape[1]:
                raise IndexFormatError(
                    f"encoder {self.encoder_config.model!r} gives dim {enc.dim}, "
                    f"the index holds dim {self.index.passage_emb.shape[1]}")
            self._query_encoder = enc
        return self._query_encoder

    @property
    def loaded_encoder(self) -> Encoder | None:
        """The query encoder if it is loaded, else None (reading it loads nothing)."""
        return self._query_encoder

    @property
    def encoder_is_uncased(self) -> bool:
        """Whether the query encoder's tokenizer lower-cases its input (checked on a probe), so
        that a text and its lower-cased form get the same vector. False when unknown."""
        if self._uncased is None:
            tok = getattr(getattr(self.encoder, "model", None), "tokenizer", None)
            probe = "Marta Quill Of HARROWGATE"
            try:
                self._uncased = tok is not None and \
                    tok(probe)["input_ids"] == tok(probe.lower())["input_ids"]
            except (TypeError, KeyError):
                self._uncased = False
        return self._uncased

    def warm_up(self, modes: Sequence[str] = ("dense", "hipporag2")) -> None:
        """Load the encoder and build the solvers now, so the first real query does not wait."""
        for mode in modes:
            if mode != "hipporag1":
                self.rank(["warm-up query"], top_k=1, mode=mode)

    def encode_queries(self, queries: list[str],
                       query_emb: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Query vectors for passages and for facts ([Q, D] each, on the index device).

        One encoder call when both purposes share an instruction (then the two are the same
        tensor); `query_emb` supplies precomputed vectors in that case.
        """
        index = self.index
        dev = index.device
        instructions = index.config.encoder.query_instructions
        same = instructions.get("query_to_fact", "") == instructions.get("query_to_passage", "")
        if query_emb is not None:
            if not same:
                raise ValueError("query_emb needs one instruction for facts and passages")
            if query_emb.shape != (len(queries), index.passage_emb.shape[1]):
                raise ValueError(
                    f"query_emb must be [{len(queries)}, {index.passage_emb.shape[1]}]")
            e_pass = query_emb.to(dev)
        else:
            e_pass = self.encoder.encode_queries(queries, "query_to_passage").to(dev)
        e_fact = e_pass if same else self.encoder.encode_queries(queries, "query_to_fact").to(dev)
        return e_pass, e_fact

    def _solver(self, cfg: RetrievalConfig, *, phrase_graph: bool = False) -> PPRSolver:
        """The PPR solver of the whole graph (or the phrase-only graph), built on first use."""
        index = self.index
        dtype = ppr_dtype(cfg)
        key = ("ppr", phrase_graph, cfg.damping, cfg.dtype, cfg.ppr_tol,
               solver_method(cfg.ppr_method), cfg.ppr_max_iter)
        solver = self._solvers.get(key)
        if solver is None:
            if phrase_graph:
                m = len(index.phrases)
                adj = leading_block(index.adjacency, m)
                solver = PPRSolver(adj, damping=cfg.damping, dtype=dtype, tol=cfg.ppr_tol,
                                   method=solver_method(cfg.ppr_method),
                                   max_iter=cfg.ppr_max_iter)
            else:
                solver = PPRSolver(index.adjacency, damping=cfg.damping, dtype=dtype,
                                   target_nodes=index.passage_nodes, tol=cfg.ppr_tol,
                                   method=solver_method(cfg.ppr_method),
                                   max_iter=cfg.ppr_max_iter)
            self._solvers[key] = solver
        return solver

    @overload
    def retrieve(self, queries: Sequence[str], *, top_k: int = ..., mode: str = ...,
                 config: RetrievalConfig | None = ..., fact_filter: FactFilter | None = ...,
                 query_entities: Sequence[Sequence[str]] | None = ...,
                 return_seeds: Literal[False] = ...) -> list[list[Hit]]: ...

    @overload
    def retrieve(self, queries: Sequence[str], *, top_k: int = ..., mode: str = ...,
                 config: RetrievalConfig | None = ..., fact_filter: FactFilter | None = ...,
                 query_entities: Sequence[Sequence[str]] | None = ...,
                 return_seeds: Literal[True]) -> tuple[list[list[Hit]], list[list[Triple]]]: ...

    def retrieve(
        self,
        queries: Sequence[str],
        *,
        top_k: int = 200,
        mode: str = "hipporag2",
        config: RetrievalConfig | None = None,
        fact_filter: FactFilter | None = None,
        query_entities: Sequence[Sequence[str]] | None = None,
        return_seeds: bool = False,
    ) -> list[list[Hit]] | tuple[list[list[Hit]], list[list[Triple]]]:
        """Rank passages for each query. Returns, per query, up to `top_k` Hits, best first.

        With `return_seeds=True` returns (hits, seed facts per query): the facts whose phrases
        seeded PPR (empty for dense answers and the hipporag1 mode).

        Args:
            queries: Q query strings.
            mode: "hipporag2" (parity), "hybrid", "dense" or "hipporag1".
            config: retrieval settings (default: the searcher's `config`).
            fact_filter: hipporag2/hybrid only: recognition-memory filter over candidate facts
                (default: keep the top linking_top_k facts, i.e. no filter).
            query_entities: hipporag1 only: named entities of each query.

        Raises:
            QueryFailure: some queries' PPR could not be certified (``max_iter`` ran out while
                the bound still fell); it carries the other queries' hits. Round-off never
                causes it (a stalled float32 solve is finished in float64).
        """
        ranking = self.rank(queries, top_k=top_k, mode=mode, config=config,
                            fact_filter=fact_filter, query_entities=query_entities)
        hits = self.to_hits(ranking)
        if ranking.failed:
            raise QueryFailure(ranking.failed, hits,
                               self.seed_facts(ranking) if return_seeds else None)
        if not return_seeds:
            return hits
        return hits, self.seed_facts(ranking)

    def explain(self, queries: Sequence[str], *, top_k: int = 10, mode: str = "hipporag2",
                config: RetrievalConfig | None = None,
                query_entities: Sequence[Sequence[str]] | None = None
                ) -> list[QueryExplanation]:
        """Why each hit ranked where it did: `retrieve`'s hits, each score split exactly into
        one term per seed, one for the dense passage prior and (hipporag1) the min-max shift,
        within each hit's certified ``bound`` (hippo_gpu.retrieval.explain states and proves it).
        The ranking's own inputs are decomposed (`rank` records them); the seeds' and hits' PPR
        columns are solved in float64, for these queries only.

        Raises:
            QueryFailure: as `retrieve` (some query's PPR is uncertified); it also carries
                every query's explanation (``explanations``; a failed one without hits).
        """
        cfg = config or self.config
        capture = Capture()
        ranking = self.rank(queries, top_k=top_k, mode=mode, config=cfg,
                            query_entities=query_entities, capture=capture)
        hits = self.to_hits(ranking)
        out = explain_ranking(self.index, list(queries), hits, ranking, capture, mode, cfg,
                              top_k, query_entities, self._explain_solver)
        if ranking.failed:
            raise QueryFailure(ranking.failed, hits, explanations=out)
        return out

    def _explain_solver(self, cfg: RetrievalConfig, adjacency: Tensor, name: str) -> PPRSolver:
        """explain's float64 all-node solver of the index graph or the v1 phrase graph."""
        key = ("explain", name, cfg.damping)
        if key not in self._solvers:
            self._solvers[key] = explain_solver(adjacency, cfg)
        return self._solvers[key]

    def seed_facts(self, ranking: Ranking) -> list[list[Triple]]:
        """The seed facts of each query of a ranking (empty where the dense ranking answered)."""
        if ranking.seed_facts is None:
            return [[] for _ in range(ranking.passage_rows.shape[0])]
        rows = torch.where(ranking.dense_fallback.unsqueeze(1).to(ranking.seed_facts.device),
                           torch.full_like(ranking.seed_facts, -1), ranking.seed_facts)
        return [[self.index.facts[j] for j in row if j >= 0] for row in rows.cpu().tolist()]

    def to_hits(self, ranking: Ranking) -> list[list[Hit]]:
        """Hits per query, best first ([] for a query in ``ranking.failed``)."""
        rows = ranking.passage_rows.cpu().tolist()
        scores = ranking.scores.double().cpu().tolist()
        keys, titles = self.index.passage_keys, self.index.passage_titles
        return [
            [] if q in ranking.failed else
            [Hit(key=keys[r], title=titles[r], score=s, rank=i, row=r)
             for i, (r, s) in enumerate(zip(rr, ss))]
            for q, (rr, ss) in enumerate(zip(rows, scores))
        ]

    def rank(
        self,
        queries: Sequence[str],
        *,
        top_k: int = 200,
        mode: str = "hipporag2",
        config: RetrievalConfig | None = None,
        fact_filter: FactFilter | None = None,
        query_entities: Sequence[Sequence[str]] | None = None,
        query_emb: Tensor | None = None,
        capture: Capture | None = None,
    ) -> Ranking:
        """The batched retrieval pipeline behind `retrieve`, returning tensors and stage times.

        `query_emb` ([Q, D], L2-normalised) skips query encoding when the caller already has the
        vectors (hipporag2/hybrid/dense with one instruction for facts and passages). `capture`
        records the tensors behind the ranking for `explain`.

        Never raises for an uncertified PPR column: that query is listed in ``failed`` (with
        its bound in ``ppr_bound``) and the other queries are answered.
        """
        index = self.index
        cfg = config or self.config
        queries = _check_queries(queries)
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        set_threads()  # a server's worker thread computes as the process's count says
        q = len(queries)
        if q == 0 or len(index.passage_keys) == 0:
            empty = torch.zeros((q, 0), dtype=torch.int64, device=index.device)
            return Ranking(empty, empty.float(), {}, torch.zeros(q, dtype=torch.bool))
        clock = Clock(index.device, sync=self.profile)
        capture = capture or Capture(record=False)
        if mode == "hipporag1":
            return self._rank_hipporag1(queries, query_entities, top_k, cfg, clock, capture)
        e_pass, e_fact = self.encode_queries(queries, query_emb)  # [Q, D] each
        clock.lap("encode")
        capture.e_pass = e_pass if capture.record else None
        if mode == "dense" or len(index.facts) == 0:  # no facts: upstream answers dense
            return self._rank_dense(e_pass, top_k, cfg, clock, capture)
        return self._rank_graph(queries, e_pass, e_fact, top_k, mode == "hybrid", cfg, clock,
                                fact_filter, query_entities, capture)

    def _rank_dense(self, e_pass: Tensor, top_k: int, cfg: RetrievalConfig,
                    clock: Clock, capture: Capture) -> Ranking:
        """DPR: min-max scaled query-passage cosine, per chunk of query columns."""
        q = e_pass.shape[0]
        parts = []
        for a, b in spans(q, plan_chunks(self.index, q, cfg).query_cols):
            dense = minmax_rows(capture.cos(self._passage_cos(e_pass[a:b])))  # [c, P]
            clock.lap("dense")
            parts.append(topk_stable(dense, top_k))
            clock.lap("rank")
        scores, rows = cat_topk(parts)
        return Ranking(rows, scores, clock.seconds, torch.ones(q, dtype=torch.bool))

    def _candidate_facts(self, queries: list[str], e_fact: Tensor, link_k: int,
                         cfg: RetrievalConfig, clock: Clock, fact_filter: FactFilter | None
                         ) -> tuple[Tensor, Tensor, Tensor, FilterResult | None]:
        """([Q, L] best facts' min-max scaled cosine, their rows, which are kept, the filter's
        outcome): fact blocks within the budget, then the optional recognition filter."""
        plan = plan_chunks(self.index, len(queries), cfg)
        cand_scores, cand_rows = fact_topk(e_fact, self.index.fact_emb, link_k, plan.fact_rows)
        clock.lap("facts")
        kept = torch.ones_like(cand_rows, dtype=torch.bool)
        outcome = None
        if fact_filter is not None:
            outcome = self._apply_filter(queries, cand_rows, fact_filter)
            kept = _kept_mask(outcome, cand_rows.shape, link_k).to(self.index.device)
            clock.lap("filter")
        return cand_scores, cand_rows, kept, outcome

    def _rank_graph(self, queries: list[str], e_pass: Tensor, e_fact: Tensor, top_k: int,
                    hybrid: bool, cfg: RetrievalConfig, clock: Clock,
                    fact_filter: FactFilter | None,
                    query_entities: Sequence[Sequence[str]] | None,
                    capture: Capture) -> Ranking:
        """hipporag2 / hybrid: kept facts -> reset vectors -> PPR (-> fusion), per chunk."""
        index, q = self.index, len(queries)
        link_k = cfg.hybrid_linking_top_k if hybrid else cfg.linking_top_k
        cand_scores, cand_rows, kept, outcome = self._candidate_facts(
            queries, e_fact, link_k, cfg, clock, fact_filter)
        fallback = ~kept.any(dim=1)  # [Q] nothing left: dense ranking (upstream)
        linked = None  # hybrid: every entity of the batch linked once, ranked per chunk below
        if hybrid and cfg.hybrid_entity_weight > 0:
            if query_entities is None:
                query_entities = heuristic_entities(queries)
            check_entities(queries, query_entities)
            linked = self._link_entities(query_entities, cfg)
            clock.lap("entities")
        report = PPRReport.empty(q)
        query_rows = torch.arange(q)
        parts = []
        linear = None if hybrid else self._linear(cfg)
        for a, b in spans(q, plan_chunks(index, q, cfg).query_cols):  # [c, P], [N, c]
            cos = capture.cos(self._passage_cos(e_pass[a:b]))  # [c, P] query-passage cosine
            clock.lap("dense")
            rows = query_rows[a:b].masked_fill(fallback[a:b].cpu(), -1)
            if linear is not None:
                out = solve_linear_chunk(index, linear, self._solver(cfg), cand_rows[a:b],
                                         cand_scores[a:b], kept[a:b], fallback[a:b],
                                         e_pass[a:b], cos, cfg, clock.lap)
                report.record_push(out, rows)
                solution = out.solution
            else:  # [N, c] reset vectors
                solution = iterate_chunk(index, self._solver(cfg), cand_rows[a:b],
                                         cand_scores[a:b], kept[a:b], fallback[a:b], cos, cfg,
                                         hybrid=hybrid, lap=clock.lap)
                clock.lap("ppr")
            report.record(solution, rows)
            capture.ppr(solution.scores.T if hybrid else None)
            final = self._graph_scores(solution.scores.T, cos, hybrid, linked, a, b, cfg, report,
                                       capture)
            if hybrid:
                clock.lap("entities")
            final = torch.where(fallback[a:b].unsqueeze(1), minmax_rows(cos).to(final.dtype),
                                final)
            parts.append(topk_stable(final, top_k))
            clock.lap("rank")
        scores, rows = cat_topk(parts)
        capture.facts(cand_rows, cand_scores, kept)
        seed_facts = torch.where(kept, cand_rows, torch.full_like(cand_rows, -1))
        return Ranking(rows, scores, clock.seconds, fallback, seed_facts, outcome, report)

    def _linear(self, cfg: RetrievalConfig) -> LinearPPR | None:
        """hipporag2's PPR by linearity for ``cfg`` (passage_ppr.linear_ppr), built once per
        damping; None: iterate."""
        if cfg.ppr_method not in ("auto", "basis_push"):
            return None
        linear = self._linears.get(cfg.damping)
        if linear is None:
            linear = linear_ppr(self.index, cfg)
            if linear is not None:
                self._linears[cfg.damping] = linear
        return linear

    def _graph_scores(self, ppr: Tensor, cos: Tensor, hybrid: bool,
                      linked: tuple[Tensor, Tensor] | None, a: int, b: int,
                      cfg: RetrievalConfig, report: PPRReport, capture: Capture) -> Tensor:
        """[c, P] final scores of query columns a..b-1 from their PPR at the passage nodes:
        the raw PPR (hipporag2), or its fusion with the dense and entity rankings (hybrid)."""
        if not hybrid:
            return ppr.float() if ppr.dtype == torch.float32 else ppr
        entity = None
        if linked is not None:
            doc, has_ent, phrase_solution = self._entity_doc(*linked, a, b, cfg)
            entity = capture.entity((doc, has_ent))
            if phrase_solution is not None:
                report.record(phrase_solution,
                              torch.arange(a, b).masked_fill(~has_ent.cpu(), -1))
        return hybrid_fusion(ppr.float(), cos, cfg, entity)

    def _passage_cos(self, query_emb: Tensor) -> Tensor:
        """[c, D] query vectors -> [c, P] float32 query-passage cosine (blockwise GEMM)."""
        return scores_against(query_emb, self.index.passage_emb).float()

    def _apply_filter(self, queries: list[str], cand_rows: Tensor,
                      fact_filter: FactFilter) -> FilterResult:
        facts = self.index.facts
        candidates = [[facts[j] for j in row] for row in cand_rows.cpu().tolist()]
        outcome = fact_filter(queries, candidates)
        if len(outcome.kept) != len(queries):
            raise ValueError(
                f"fact filter returned {len(outcome.kept)} rows for {len(queries)} queries")
        return outcome

    def hipporag2_reset_vectors(self, queries: Sequence[str],
                                config: RetrievalConfig | None = None) -> Tensor:
        """The [N, Q] float64 HippoRAG 2 reset vectors of `queries` (for PPR benchmarks/tests)."""
        index = self.index
        cfg = config or self.config
        queries = _check_queries(queries)
        e, e_fact = self.encode_queries(queries)
        cos = scores_against(e, index.passage_emb).double()  # [Q, P]: the output is [N, Q]
        plan = plan_chunks(index, len(queries), cfg)
        cs, cr = fact_topk(e_fact, index.fact_emb, cfg.linking_top_k, plan.fact_rows)
        kept = torch.ones_like(cr, dtype=torch.bool)
        return reset_vectors(self.index, cr, cs.double(), kept, cos, cfg, dtype=torch.float64)
