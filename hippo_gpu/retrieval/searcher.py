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
               phrase graph -> passage scores (query entities: given, else capitalised spans)

`explain` answers like `retrieve` and splits each hit's score exactly into one term per seed
and one for the dense prior (hippo_gpu.retrieval.explain), from the inputs `rank` records for it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.device import set_threads
from hippo_gpu.embed import Encoder, runnable_precision
from hippo_gpu.errors import BLANK
from hippo_gpu.indexing.index import Index
from hippo_gpu.ppr import PPRSolver
from hippo_gpu.ppr.linear import LinearPPR
from hippo_gpu.retrieval.blockwise import scores_against, spans
from hippo_gpu.retrieval.call import Clock, RankCall
from hippo_gpu.retrieval.compact_facts import COMPACT_MAX_QUERIES, COMPACT_MIN_ROWS, CompactFacts
from hippo_gpu.retrieval.entities import heuristic_entities
from hippo_gpu.retrieval.entity_ranker import EntityRanker, check_entities
from hippo_gpu.retrieval.explain import Capture, explain_ranking
from hippo_gpu.retrieval.explanation import QueryExplanation
from hippo_gpu.retrieval.hybrid import hybrid_fusion
from hippo_gpu.retrieval.modes import DENSE, HIPPORAG2, Mode, mode_of
from hippo_gpu.retrieval.options import SearcherOptions
from hippo_gpu.retrieval.passage_ppr import iterate_chunk, linear_ppr, solve_linear_chunk
from hippo_gpu.retrieval.query_encoder import QueryEncoder
from hippo_gpu.retrieval.ranking import cat_topk, minmax_rows
from hippo_gpu.retrieval.results import (
    FactFilter,
    FilterResult,
    Hit,
    PPRReport,
    QueryFailure,
    Ranking,
)
from hippo_gpu.retrieval.seeds import fact_topk, plan_chunks, reset_vectors
from hippo_gpu.retrieval.solvers import SolverCache
from hippo_gpu.versions.load import refresh_index

log = logging.getLogger(__name__)
MATCH_CACHE = 64  # metadata filters whose passage rows a Searcher keeps

__all__ = ["Searcher"]


def _check_queries(queries: Sequence[str]) -> list[str]:
    if isinstance(queries, str):
        raise TypeError("queries must be a list of strings, not one string")
    out = list(queries)
    for i, q in enumerate(out):
        if not isinstance(q, str):
            raise TypeError(f"queries[{i}] is {type(q).__name__}, expected str")
        if not q.strip():
            raise ValueError(f"queries[{i}] {BLANK}")
    return out


def entities_for(mode: Mode, cfg: RetrievalConfig, queries: list[str],
                 query_entities: Sequence[Sequence[str]] | None) -> list[list[str]] | None:
    """The entities each query's entity ranking links: the caller's, else the LLM-free
    extractor's (capitalised spans, hippo_gpu.retrieval.entities); None in a mode that links
    none (dense, hipporag2, hybrid with its entity weight at 0)."""
    if mode.linking != "entities" and not mode.links_entities(cfg):
        return None
    if query_entities is None:
        return heuristic_entities(queries)
    check_entities(queries, query_entities)
    return [list(e) for e in query_entities]


def _kept_mask(outcome: FilterResult, shape: torch.Size, limit: int) -> Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    for qi, kept in enumerate(outcome.kept):
        for j in kept[:limit]:
            if 0 <= j < shape[1]:
                mask[qi, j] = True
    return mask


class Searcher:
    """Answers batches of queries over one `Index`, on the index's device.

    Owns the query-time state: the query encoder (loaded on first use), the PPR solvers (one per
    graph and setting, built on first use) and lookup tables. Build one per index and device and
    reuse it: the first query pays for the encoder load and the solver build.

    Args:
        index: the index to search (its device is the searcher's device).
        config: default retrieval settings (defaults reproduce upstream); `rank`/`retrieve`
            accept a per-call override.
        options: how queries run: the query encoder's precision, batch size, backend, server
            URL and cache, and stage profiling (hippo_gpu.retrieval.options.SearcherOptions).
        encoder: an already loaded query encoder of the index's model to reuse.
    """

    def __init__(self, index: Index, config: RetrievalConfig | None = None,
                 options: SearcherOptions | None = None, *,
                 encoder: Encoder | None = None) -> None:
        self.index = index
        self.config = config or RetrievalConfig()
        self.options = o = options or SearcherOptions()
        enc = self.index.config.encoder
        if o.query_base_url is not None and not enc.is_remote:
            raise ValueError(f"query_base_url is for an index built with a server encoder; "
                             f"this one was built with {enc.model!r}")
        self.encoder_config = replace(
            enc, precision=o.query_precision or runnable_precision(enc.precision, index.device),
            query_batch_size=o.query_batch_size or enc.query_batch_size,
            backend=o.query_backend, base_url=o.query_base_url or enc.base_url)
        self.query_encoder = QueryEncoder(self.encoder_config, index.device,
                                          int(index.passage_emb.shape[1]),
                                          cache_dir=o.cache_dir, loaded=encoder)
        self._solvers = SolverCache()  # one per (graph, PPR settings), built on first use
        self.entities = EntityRanker(index, self._solvers, self.query_encoder)
        self._linears: dict[float, LinearPPR] = {}  # hipporag2 by linearity, per damping
        self._compact: tuple[Tensor, CompactFacts] | None = None  # (fact rows, their codes)
        self._compact_job: threading.Thread | None = None  # the codes' background build
        self._matches: dict[str, Tensor] = {}  # metadata filter (as JSON) -> its passage rows
        self._compact_lock = threading.Lock()  # served queries run on several threads

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
        return Searcher(index, self.config, self.options, encoder=self.query_encoder.loaded)

    @property
    def encoder(self) -> Encoder:
        """The query encoder (the index's own model), loaded on first use."""
        return self.query_encoder.encoder

    @property
    def loaded_encoder(self) -> Encoder | None:
        """The query encoder if it is loaded, else None (reading it loads nothing)."""
        return self.query_encoder.loaded

    @property
    def encoder_is_uncased(self) -> bool:
        """Whether the query encoder's tokenizer lower-cases its input (QueryEncoder.uncased)."""
        return self.query_encoder.uncased

    def warm_up(self, modes: Sequence[str | Mode] = (DENSE, HIPPORAG2)) -> None:
        """Load the encoder and build the solvers now, so the first real query does not wait
        (an entity-linking mode builds nothing ahead: its phrase graph depends on the query)."""
        for mode in map(mode_of, modes):
            if mode.linking != "entities":
                self.rank(["warm-up query"], top_k=1, mode=mode)
        self.wait_for_codes()  # a lone query's fact codes, started by the lone warm-up query

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

    def _solver(self, cfg: RetrievalConfig) -> PPRSolver:
        """The PPR solver of the whole graph (passage rows out), built on first use."""
        index = self.index
        return self._solvers.get("graph", cfg.ppr, lambda: index.adjacency,
                                 target_nodes=index.passage_nodes)

    def entity_scores(self, query_entities: Sequence[Sequence[str]],
                      cfg: RetrievalConfig) -> tuple[Tensor, Tensor]:
        """The hybrid mode's entity ranking of a whole batch (EntityRanker.scores)."""
        return self.entities.scores(query_entities, cfg)

    def retrieve(
        self,
        queries: Sequence[str],
        *,
        top_k: int = 200,
        mode: str | Mode = "hipporag2",
        config: RetrievalConfig | None = None,
        fact_filter: FactFilter | None = None,
        query_entities: Sequence[Sequence[str]] | None = None,
        where: Mapping[str, Any] | None = None,
    ) -> list[list[Hit]]:
        """Rank passages for each query. Returns, per query, up to `top_k` Hits, best first.

        `rank` returns the same ranking as tensors, with the seed facts of each query
        (`Ranking.seeds`); `to_hits` turns it into these Hits.

        Args:
            queries: Q query strings.
            mode: "hipporag2" (parity), "hybrid", "dense" or "hipporag1".
            config: retrieval settings (default: the searcher's `config`).
            fact_filter: hipporag2/hybrid only: recognition-memory filter over candidate facts
                (default: keep the top linking_top_k facts, i.e. no filter).
            query_entities: hipporag1 and hybrid: the named entities of each query (one list
                per query; an empty list: none). Not given: the LLM-free extractor's
                capitalised spans (hippo_gpu.retrieval.entities); `rank` returns the entities
                used (`Ranking.entities`). A query with no entity scores every passage 1/P in
                hipporag1 and gets no entity ranking in hybrid.
            where: a metadata filter, e.g. {"year": 2020, "source": ["a", "b"]}
                (hippo_gpu.indexing.labels: a passage matches when every field equals, or
                is one of a list). Applied AFTER the PPR (and hybrid's fusion): the graph,
                the seeds and every score are the unfiltered ones, and the ranking keeps
                only matching passages, so a query gets fewer than `top_k` hits when fewer
                match, each with its unfiltered score and explanation.

        Raises:
            QueryFailure: some queries' PPR could not be certified (``max_iter`` ran out while
                the bound still fell); it carries the other queries' hits. Round-off never
                causes it (a stalled float32 solve is finished in float64).
        """
        ranking = self.rank(queries, top_k=top_k, mode=mode, config=config,
                            fact_filter=fact_filter, query_entities=query_entities, where=where)
        hits = self.to_hits(ranking)
        if ranking.failed:
            raise QueryFailure(ranking.failed, hits)
        return hits

    def explain(self, queries: Sequence[str], *, top_k: int = 10, mode: str | Mode = "hipporag2",
                config: RetrievalConfig | None = None,
                query_entities: Sequence[Sequence[str]] | None = None,
                where: Mapping[str, Any] | None = None) -> list[QueryExplanation]:
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
                            query_entities=query_entities, capture=capture, where=where)
        hits = self.to_hits(ranking)
        out = explain_ranking(self.index, list(queries), hits, ranking, capture, mode_of(mode),
                              cfg, top_k, ranking.entities, self._explain_solver)
        if ranking.failed:
            raise QueryFailure(ranking.failed, hits, explanations=out)
        return out

    def _explain_solver(self, cfg: RetrievalConfig, adjacency: Tensor, name: str) -> PPRSolver:
        """explain's float64 all-node solver of the index graph or the v1 phrase graph."""
        return self._solvers.get("explain-" + name, cfg.ppr.exact(), lambda: adjacency)

    def to_hits(self, ranking: Ranking) -> list[list[Hit]]:
        """Hits per query, best first ([] for a query in ``ranking.failed``)."""
        rows = ranking.passage_rows.cpu().tolist()
        scores = ranking.scores.double().cpu().tolist()
        keys, titles, labels = self.index.passage_keys, self.index.passage_titles, \
            self.index.labels

        def hit(r: int, s: float, i: int) -> Hit:
            key = keys[r]
            if not labels:
                return Hit(key=key, title=titles[r], score=s, rank=i, row=r)
            return Hit(key=key, title=titles[r], score=s, rank=i, row=r, id=labels.id_of(key),
                       metadata=labels.metadata_of(key))

        return [
            [] if q in ranking.failed else
            [hit(r, s, i) for i, (r, s) in enumerate(zip(rr, ss))]
            for q, (rr, ss) in enumerate(zip(rows, scores))
        ]

    def rank(
        self,
        queries: Sequence[str],
        *,
        top_k: int = 200,
        mode: str | Mode = "hipporag2",
        config: RetrievalConfig | None = None,
        fact_filter: FactFilter | None = None,
        query_entities: Sequence[Sequence[str]] | None = None,
        query_emb: Tensor | None = None,
        capture: Capture | None = None,
        where: Mapping[str, Any] | None = None,
    ) -> Ranking:
        """The batched retrieval pipeline behind `retrieve`, returning tensors and stage times.

        `query_emb` ([Q, D], L2-normalised) skips query encoding when the caller already has the
        vectors (hipporag2/hybrid/dense with one instruction for facts and passages). `capture`
        records the tensors behind the ranking for `explain`. `where` filters the ranking
        by metadata, after the PPR (`retrieve`).

        Never raises for an uncertified PPR column: that query is listed in ``failed`` (with
        its bound in ``ppr_bound``) and the other queries are answered.
        """
        index = self.index
        cfg = config or self.config
        queries = _check_queries(queries)
        how = mode_of(mode)
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        entities = entities_for(how, cfg, queries, query_entities)
        allowed = None if where is None else self._matching_rows(where)
        set_threads()  # a server's worker thread computes as the process's count says
        q = len(queries)
        if q == 0 or len(index.passage_keys) == 0 or (allowed is not None and not len(allowed)):
            empty = torch.zeros((q, 0), dtype=torch.int64, device=index.device)
            return Ranking(empty, empty.float(), {}, torch.zeros(q, dtype=torch.bool),
                           entities=entities)
        linked = sum(len(e) for e in entities) if how.linking == "entities" and entities else 0
        call = RankCall(queries, top_k, how, cfg,
                        plan_chunks(index, q, cfg, num_entities=linked),
                        Clock(index.device, sync=self.options.profile),
                        capture or Capture(record=False), allowed)
        if how.linking == "entities":
            assert entities is not None  # entities_for resolves them in this mode
            ranking = self.entities.rank_hipporag1(call, entities)
        else:
            e_pass, e_fact = self.encode_queries(queries, query_emb)  # [Q, D] each
            call.clock.lap("encode")
            call.capture.e_pass = e_pass if call.capture.record else None
            if how.linking == "none" or len(index.facts) == 0:  # no facts: upstream answers dense
                ranking = self._rank_dense(call, e_pass)
            else:
                ranking = self._rank_graph(call, e_pass, e_fact, fact_filter, entities)
        ranking.entities = entities
        return ranking

    def _matching_rows(self, where: Mapping[str, Any]) -> Tensor:
        """[n] ascending passage rows whose metadata match `where`, on the index device; made
        once per filter and kept (a served filter repeats: its rows are not looked up again per
        call; at most MATCH_CACHE filters are kept)."""
        name = json.dumps(where, sort_keys=True, default=str)
        rows = self._matches.get(name)
        if rows is None:
            index = self.index
            found = np.fromiter((index.row_of_key[k] for k in index.labels.matching_keys(where)),
                                dtype=np.int64)
            rows = torch.from_numpy(np.sort(found)).to(index.device)
            with self._compact_lock:  # served calls run on several threads
                if len(self._matches) >= MATCH_CACHE:
                    self._matches.pop(next(iter(self._matches)))
                self._matches[name] = rows
        return rows

    def _rank_dense(self, call: RankCall, e_pass: Tensor) -> Ranking:
        """DPR: min-max scaled query-passage cosine, per chunk of query columns."""
        q, clock = e_pass.shape[0], call.clock
        parts = []
        for a, b in spans(q, call.plan.query_cols):
            dense = minmax_rows(call.capture.cos(self._passage_cos(e_pass[a:b])))  # [c, P]
            clock.lap("dense")
            parts.append(call.top(dense))
            clock.lap("rank")
        scores, rows = cat_topk(parts)
        return Ranking(rows, scores, clock.seconds, torch.ones(q, dtype=torch.bool))

    def _candidate_facts(self, call: RankCall, e_fact: Tensor, fact_filter: FactFilter | None
                         ) -> tuple[Tensor, Tensor, Tensor, FilterResult | None]:
        """([Q, L] best facts' min-max scaled cosine, their rows, which are kept, the filter's
        outcome): fact blocks within the budget, then the optional recognition filter."""
        link_k = call.mode.link_k(call.cfg)
        cand_scores, cand_rows = fact_topk(e_fact, self.index.fact_emb, link_k,
                                           call.plan.fact_rows,
                                           compact=self._compact_facts(len(call.queries)))
        call.clock.lap("facts")
        kept = torch.ones_like(cand_rows, dtype=torch.bool)
        outcome = None
        if fact_filter is not None:
            outcome = self._apply_filter(call.queries, cand_rows, fact_filter)
            kept = _kept_mask(outcome, cand_rows.shape, link_k).to(self.index.device)
            call.clock.lap("filter")
        return cand_scores, cand_rows, kept, outcome

    def _rank_graph(self, call: RankCall, e_pass: Tensor, e_fact: Tensor,
                    fact_filter: FactFilter | None,
                    query_entities: Sequence[Sequence[str]] | None) -> Ranking:
        """hipporag2 / hybrid: kept facts -> reset vectors -> PPR (-> fusion), per chunk."""
        index, q, mode, cfg = self.index, len(call.queries), call.mode, call.cfg
        clock, capture = call.clock, call.capture
        cand_scores, cand_rows, kept, outcome = self._candidate_facts(call, e_fact, fact_filter)
        fallback = ~kept.any(dim=1)  # [Q] nothing left: dense ranking (upstream)
        linked = None  # hybrid: every entity of the batch linked once, ranked per chunk below
        if query_entities is not None:  # hybrid's entity ranking (entities_for resolved them)
            linked = self.entities.link(query_entities, cfg)
            clock.lap("entities")
        report = PPRReport.empty(q)
        query_rows = torch.arange(q)
        parts = []
        linear = self._linear(cfg) if mode.prior == "minmax" else None
        for a, b in spans(q, call.plan.query_cols):  # [c, P], [N, c]
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
                                         mode=mode, lap=clock.lap)
                clock.lap("ppr")
            report.record(solution, rows)
            capture.ppr(solution.scores.T if mode.fusion else None)
            final = self._graph_scores(call, solution.scores.T, cos, linked, a, b, report)
            if mode.fusion:
                clock.lap("entities")
            final = torch.where(fallback[a:b].unsqueeze(1), minmax_rows(cos).to(final.dtype),
                                final)
            parts.append(call.top(final))
            clock.lap("rank")
        scores, rows = cat_topk(parts)
        capture.facts(cand_rows, cand_scores, kept)
        seed_facts = torch.where(kept, cand_rows, torch.full_like(cand_rows, -1))
        return Ranking(rows, scores, clock.seconds, fallback, seed_facts, outcome, report,
                       fact_table=index.facts)

    def _compact_facts(self, num_queries: int) -> CompactFacts | None:
        """The int8 codes of the index's fact rows for a batch small enough to use them
        (retrieval.compact_facts: fewer than COMPACT_MAX_QUERIES queries, at least
        COMPACT_MIN_ROWS float32 facts on the CPU), else None. They are made off the request
        path: the first such batch starts a background thread and takes the full scan, as
        every batch does until the codes are ready (the answers are the same either way;
        `warm_up` waits for them)."""
        facts = self.index.fact_emb
        if num_queries >= COMPACT_MAX_QUERIES or facts.device.type != "cpu" or \
                facts.dtype != torch.float32 or facts.shape[0] < COMPACT_MIN_ROWS:
            return None
        with self._compact_lock:
            if self._compact is not None and self._compact[0] is facts:
                return self._compact[1]
            if self._compact_job is None:
                self._compact_job = threading.Thread(target=self._make_codes, args=(facts,),
                                                     name="hippo-gpu-fact-codes", daemon=True)
                self._compact_job.start()
        return None

    def _make_codes(self, facts: Tensor) -> None:
        try:
            codes = CompactFacts.of(facts)
        except MemoryError:  # lone queries keep the full scan: slower, the same answers
            log.warning("no memory for the int8 fact codes; lone queries scan float32 rows")
            return
        with self._compact_lock:
            self._compact = (facts, codes)

    def wait_for_codes(self, timeout: float | None = None) -> None:
        """Block until a background build of the fact codes (if one runs) has finished."""
        job = self._compact_job
        if job is not None:
            job.join(timeout)

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

    def _graph_scores(self, call: RankCall, ppr: Tensor, cos: Tensor,
                      linked: tuple[Tensor, Tensor] | None, a: int, b: int,
                      report: PPRReport) -> Tensor:
        """[c, P] final scores of query columns a..b-1 from their PPR at the passage nodes:
        the raw PPR (hipporag2), or its fusion with the dense and entity rankings (hybrid)."""
        if not call.mode.fusion:
            return ppr.float() if ppr.dtype == torch.float32 else ppr
        entity = None
        if linked is not None:
            doc, has_ent, phrase_solution = self.entities.doc(*linked, a, b, call.cfg)
            entity = call.capture.entity((doc, has_ent))
            if phrase_solution is not None:
                report.record(phrase_solution,
                              torch.arange(a, b).masked_fill(~has_ent.cpu(), -1))
        return hybrid_fusion(ppr.float(), cos, call.cfg, entity)

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
