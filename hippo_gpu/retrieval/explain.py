"""Why a passage was retrieved: every hit's score split exactly into one term per phrase seed and
one for the dense passage prior, because PPR is linear in its reset vector.

**What is decomposed (HippoRAG 2, and the PPR ranking of hybrid).** A query's reset vector is
r = Σ_s w_s e_s + m: the phrase seeds s with weights w_s (hippo_gpu.retrieval.seeds.phrase_seeds;
hybrid normalises them to sum 1) and the dense prior m at the passage rows (w·minmax(cos), hybrid:
w_h·softmax(T·cos)), exactly the vector the iteration solves
(hippo_gpu.retrieval.seeds.reset_vectors, here in float64). Upstream divides r by its sum; PPR is
then (ppr/iteration.py, eq. 2) x = L r / cᵀr with L = (1 − d)(I − dM)⁻¹ and c = 1ᵀL, c_j = 1 − d·[j
dangling] (ppr/basis.py), so the normalisation is the single number σ = cᵀr = Σ_s w_s c_s + cᵀm and,
L being linear,

    x_p = Σ_s a_s x̂_s[p] + a_m x̂_m[p],   a_s = w_s c_s / σ,   a_m = cᵀm / σ,          (E1)

where x̂_b = L b / cᵀb is the normalised PPR of the column b (what PPRSolver returns): e_s for a
seed, m for the prior. Each term is exact, not a share of some approximation; the weights a
sum to 1 (a_s is the fraction of all the PPR mass that starts at s, since 1ᵀL e_s = c_s). The
prior's term is split once more by the same linearity: own = m_p c_p x̂_{e_p}[p] / σ, the mass
the passage's own prior weight keeps or gets back, and spread = a_m x̂_m[p] − own, what the
prior of the other passages sends it.

**Bridges.** The fixed point y = (1 − d) b + d M y, y = L b, read at row p (a passage, never a
seed phrase) gives (L e_s)_p = d Σ_{v ∈ N(p)} A_pv / D_v · (L e_s)_v, so a seed's term is the sum
over the passage's neighbours v (the phrases it mentions) of

    d A_pv / D_v · a_s x̂_s[v]                                                          (E2)

the mass that entered p from v: the path seed -> v -> passage. The largest BRIDGES are kept;
``other`` holds the rest of the term, which includes the iterate's residual at p (E2 holds at
the exact fixed point).

**Error bound.** Each column is solved in float64 by the certified iteration (ppr/iteration.py,
bound 3): ‖x̂_b − x̂*_b‖₁ ≤ ε_b, where x̂_b is the float64 vector the solver returned and ε_b
holds its rounding (ppr/rounding.py, R1). As x*_p = Σ_b a_b x̂*_b[p] exactly, the terms' sum is
off the exact PPR by at most Σ_b a_b ε_b ≤ max_b ε_b, plus the float64 rounding of the weights a,
the products and the sum, (K + 8)·2⁻⁵³ Σ|t| for K terms. The hit's score came from the search's
own solve, certified to its bound β (an L1 bound, so per entry too), which is a bound of the
score as returned, its float32 rounding included (R1; the float64 finish and the basis-push path
add theirs too); the 2⁻²³·score added for a float32 score is that rounding counted once more, a
margin kept so a score that went through one more float32 cast stays covered;
a query the search answered by linearity (ppr_method basis_push) solved the target with E_P e
in exact arithmetic instead of the float32 cosines (ppr/basis.py), which moves x by at most
2‖Δr‖₁/σ (‖L‖₁ ≤ 1), added too. Each hit's ``bound`` is the sum: |Σ terms − score| ≤ bound.

**HippoRAG 1** (hippo_gpu.retrieval.hipporag1): reset r_e = 1/|docs(e)| at the linked phrases of the
phrase graph W, y = B x with B = D FP [P, M], score = (y_p − lo) / R, lo, hi the min and max of
y over the passages, R = hi − lo. By (E1) on W, y = Σ_e a_e B x̂_e, so

    score_p = Σ_e a_e (B x̂_e)_p / R  +  (−lo / R)                                        (E3)

one term per seed and the min-max shift (``offset``). A seed's term is the finite sum over
the passage's phrases v of B_pv a_e x̂_e[v] / R, its bridges (exact, no residual). Our y and the
search's y' both approximate the exact y* = B x*: entry by entry, ours within b_max Σ a_e ε_e
(b_max the largest entry of B; an L1 error of x moves an entry of B x by at most b_max times
it), the search's within b_max β, each plus its sparse product's rounding. With Δ the sum, y and
y' differ by at most Δ in every entry, hence also in their min and max, and

    |(y_p − lo)/R − (y'_p − lo')/R'| ≤ (2Δ + 2Δ·score)/R' ≤ 4Δ / (R − 2Δ)

(score ≤ 1, R' ≥ R − 2Δ), plus the search's three rounded min-max operations; R ≤ 2Δ gives no
bound (inf). A zero range scores all ones (offset 1), a query without entities 1/P everywhere
(offset 1/P).

**hybrid**: the score is the sum of three reciprocal-rank terms of exact integer ranks
(hippo_gpu.retrieval.hybrid.fusion_terms, float64 in the fusion's own order: they sum to the score
bit for bit); ``value`` is then the passage's PPR probability, decomposed by (E1). **dense**, and a
hipporag2 query with no kept fact (answered by the dense ranking): the score is the min-max cosine
itself, one dense term.

What is decomposed is exactly what the ranking computed: `Searcher.rank` records its inputs
(query vectors, candidate facts, cosines, hybrid's PPR and entity ranking, HippoRAG 1's linked
phrases) in a `Capture`, and the reset vectors are rebuilt from them by the search's own
functions (hippo_gpu.retrieval.seeds.reset_vectors, in float64). Cost: the unit columns of the seeds
of queries with hits, the hits' passage columns and one prior column per query, float64, solved for
the explained queries only (`query_chunk` keeps them within RetrievalConfig.chunk_bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.device import chunk_budget, ppr_dtype
from hippo_gpu.indexing.index import Index
from hippo_gpu.ppr import ConvergenceError, PPRSolver
from hippo_gpu.retrieval.blockwise import spans
from hippo_gpu.retrieval.explanation import (
    Bridge,
    DensePrior,
    Fusion,
    HitExplanation,
    PhraseInfo,
    QueryExplanation,
    Seed,
    SeedContribution,
    SeedFact,
)
from hippo_gpu.retrieval.hipporag1 import V1Graph
from hippo_gpu.retrieval.hybrid import fusion_ranks, fusion_terms
from hippo_gpu.retrieval.modes import HIPPORAG1, Mode
from hippo_gpu.retrieval.results import Hit, Ranking
from hippo_gpu.retrieval.seeds import NODE_VECTORS, phrase_seeds, reset_vectors

__all__ = ["BRIDGES", "PHRASE_PASSAGES", "Capture", "GraphQueries", "explain_dense",
           "explain_graph", "explain_hipporag1", "explain_ranking", "query_chunk"]

BRIDGES = 5  # bridges kept per (hit, seed)
PHRASE_PASSAGES = 50  # passages listed per phrase
PHRASE_SYNONYMS = 20  # synonyms listed per phrase
U64 = 2.0 ** -53  # float64 unit round-off
U32 = 2.0 ** -24


def query_chunk(index: Index, top_k: int, cfg: RetrievalConfig) -> int:
    """Queries explained at once: each solves up to linking_top_k + top_k + 1 float64 columns of
    NODE_VECTORS [N] vectors each, kept within the chunk budget (device.chunk_budget)."""
    link_k = max(cfg.linking_top_k, cfg.hybrid_linking_top_k)
    cols = link_k + min(top_k, len(index.passage_keys)) + 1
    per_query = cols * NODE_VECTORS * 8 * max(index.num_nodes, 1)
    return max(1, chunk_budget(cfg, index.device) // per_query)


@dataclass(frozen=True)
class GraphQueries:
    """What the Searcher hands over for one chunk of c hipporag2 / hybrid queries.

    Attributes:
        queries, hits: the query strings and their ranked hits.
        cand_rows, cand_scores, kept: [c, L] candidate facts, min-max scores, kept mask.
        cos: [c, P] float32 query-passage cosine; e_pass: [c, D] the query vectors.
        dense_answer: [c] bool, answered by the dense ranking (no kept fact).
        score_bound: [c] float64 certified L1 bound of each query's PPR in the search.
        score_dtype: the dtype the search's PPR ran in.
        pushed: [c] bool, answered by PPR by linearity (basis + push), or None.
        ppr: hybrid only: [c, P] the search's PPR at the passages (its PPR ranking's input).
        entity: hybrid only: entity_doc's (scores [c, P], has_entities [c]), or None.
    """

    queries: list[str]
    hits: list[list[Hit]]
    cand_rows: Tensor
    cand_scores: Tensor
    kept: Tensor
    cos: Tensor
    e_pass: Tensor
    dense_answer: Tensor
    score_bound: Tensor
    score_dtype: torch.dtype
    pushed: Tensor | None = None
    ppr: Tensor | None = None
    entity: tuple[Tensor, Tensor] | None = None


class Capture:
    """What `explain_ranking` reads of one ranking, recorded by `Searcher.rank` as it computes
    it, so that the decomposition is of exactly the ranking's inputs (the same query vectors,
    candidate facts, cosines, hybrid PPR and entity ranking; nothing is recomputed). With
    ``record=False`` (every plain `rank` call) each method only passes its value through."""

    def __init__(self, record: bool = True) -> None:
        self.record = record
        self.e_pass: Tensor | None = None  # [Q, D] query vectors
        self.cos_parts: list[Tensor] = []  # per chunk [c, P] query-passage cosines
        self.ppr_parts: list[Tensor] = []  # hybrid: per chunk [c, P] PPR at the passages
        self.entity_parts: list[tuple[Tensor, Tensor]] = []  # hybrid: entity_doc per chunk
        self.cand: tuple[Tensor, Tensor, Tensor] | None = None  # [Q, L] rows, scores, kept
        self.v1_graph: V1Graph | None = None  # hipporag1: the graph, linked rows, owners
        self.v1_rows: Tensor | None = None
        self.v1_owner: Tensor | None = None

    def cos(self, cos: Tensor) -> Tensor:
        if self.record:
            self.cos_parts.append(cos)
        return cos

    def ppr(self, ppr: Tensor | None) -> None:
        if self.record and ppr is not None:
            self.ppr_parts.append(ppr)

    def entity(self, entity: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        if self.record:
            self.entity_parts.append(entity)
        return entity

    def facts(self, rows: Tensor, scores: Tensor, kept: Tensor) -> None:
        if self.record:
            self.cand = (rows, scores, kept)

    def v1(self, graph: V1Graph | None, rows: Tensor, owner: Tensor) -> None:
        if self.record:
            self.v1_graph, self.v1_rows, self.v1_owner = graph, rows, owner


# (cfg, adjacency, name) -> the float64 PPR of the adjacency at every node, certified to the
# float64 default tol within the default step cap (cfg.ppr.exact(), not the search's settings:
# these columns are the decomposition's own)
SolverOf = Callable[[RetrievalConfig, Tensor, str], PPRSolver]


def explain_ranking(index: Index, queries: list[str], hits: list[list[Hit]], ranking: Ranking,
                    capture: Capture, mode: Mode, cfg: RetrievalConfig, top_k: int,
                    query_entities: Sequence[Sequence[str]] | None,
                    solver_of: SolverOf) -> list[QueryExplanation]:
    """The explanation of every query of a ranking from what its `rank` recorded, each naming
    the entities its ranking linked (`query_entities`, the ranking's own; None: a mode that
    links none).

    Args:
        solver_of: the Searcher's cache of these float64 solvers (SolverOf).
    """
    out = _explanations(index, queries, hits, ranking, capture, mode, cfg, top_k, query_entities,
                        solver_of)
    if query_entities is None:
        return out
    return [replace(e, entities=tuple(ents))
            for e, ents in zip(out, query_entities, strict=True)]


def _explanations(index: Index, queries: list[str], hits: list[list[Hit]], ranking: Ranking,
                  capture: Capture, mode: Mode, cfg: RetrievalConfig, top_k: int,
                  query_entities: Sequence[Sequence[str]] | None,
                  solver_of: SolverOf) -> list[QueryExplanation]:
    """explain_ranking's explanations, before their entities are named."""
    q = len(queries)
    if not capture.cos_parts and capture.v1_graph is None:  # nothing ran: no passage
        return [QueryExplanation(text, mode.name, (), (), (), 0.0, False, ())
                for text in queries]
    bound = ranking.ppr.bound if ranking.ppr is not None else torch.zeros(q, dtype=torch.float64)
    if mode.linking == "entities" and capture.v1_graph is not None \
            and capture.v1_rows is not None and capture.v1_owner is not None:
        graph = capture.v1_graph
        return explain_hipporag1(index, graph, solver_of(cfg, graph.adjacency, "v1"), queries,
                                 hits, query_entities or [[] for _ in queries], capture.v1_rows,
                                 capture.v1_owner, bound, ppr_dtype(cfg))
    cos = torch.cat(capture.cos_parts)  # [Q, P]
    if capture.cand is None or capture.e_pass is None:  # the dense ranking answered
        return explain_dense(index, queries, hits, cos, mode.name)
    rows, scores, kept = capture.cand
    ppr = torch.cat(capture.ppr_parts) if capture.ppr_parts else None
    entity = None
    if capture.entity_parts:
        entity = (torch.cat([d for d, _ in capture.entity_parts]),
                  torch.cat([h for _, h in capture.entity_parts]))
    pushed = None if ranking.ppr is None else ranking.ppr.pushed
    solver = solver_of(cfg, index.adjacency, "graph")
    out: list[QueryExplanation] = []
    for a, b in spans(q, query_chunk(index, top_k, cfg)):
        inp = GraphQueries(
            queries[a:b], hits[a:b], rows[a:b], scores[a:b], kept[a:b], cos[a:b],
            capture.e_pass[a:b], ranking.dense_fallback[a:b], bound[a:b], ppr_dtype(cfg),
            None if pushed is None else pushed[a:b], None if ppr is None else ppr[a:b],
            None if entity is None else (entity[0][a:b], entity[1][a:b]))
        out += explain_graph(index, solver, inp, cfg, mode)
    return out


class _Graph:
    """The adjacency on the host: neighbours, degrees and c_j = 1 − d·[j dangling]."""

    def __init__(self, adjacency: Tensor, damping: float) -> None:
        adj = adjacency.to("cpu")
        self.crow = adj.crow_indices().numpy()
        self.col = adj.col_indices().numpy()
        self.val = adj.values().to(torch.float64).numpy()
        n = adj.shape[0]
        rows = np.repeat(np.arange(n), np.diff(self.crow))
        self.degree = np.bincount(rows, weights=self.val, minlength=n)  # [N]
        self.keep = 1.0 - damping * (self.degree <= 0)  # [N] c = 1ᵀL
        self.damping = damping

    def neighbours(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.crow[node], self.crow[node + 1]
        return self.col[a:b], self.val[a:b]


def _solve_columns(solver: PPRSolver, columns: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(x̂ [N, K] float64 on the host, ε [K]) of K non-negative columns; raises for any
    uncertified column."""
    if columns.shape[1] == 0:
        return np.zeros((columns.shape[0], 0)), np.zeros(0)
    solution = solver.solve(columns)
    failures = solution.failures()
    if failures:
        raise ConvergenceError(f"explain: {next(iter(failures.values()))}", sorted(failures))
    return solution.scores.cpu().double().numpy(), solution.bound.cpu().double().numpy()


def _unit_columns(n: int, nodes: np.ndarray, device: torch.device) -> Tensor:
    cols = torch.zeros((n, len(nodes)), dtype=torch.float64, device=device)
    if len(nodes):
        cols[torch.as_tensor(nodes, device=device), torch.arange(len(nodes), device=device)] = 1.0
    return cols


def _bridges(graph: _Graph, index: Index, node: int, mass_of: np.ndarray,
             term: float) -> tuple[tuple[Bridge, ...], float]:
    """The BRIDGES largest entries of ``mass_of`` (one per neighbour of ``node``, in CSR order)
    as Bridges, and the rest of ``term``."""
    nbrs, _ = graph.neighbours(node)
    order = np.argsort(-mass_of, kind="stable")[:BRIDGES]
    kept = tuple(Bridge(_label(index, int(nbrs[i])), int(nbrs[i]), float(mass_of[i]))
                 for i in order if mass_of[i] > 0)
    return kept, term - math.fsum(b.mass for b in kept)


def _label(index: Index, node: int) -> str:
    m = len(index.phrases)
    return index.phrases[node] if node < m else index.passage_titles[node - m]


def _score_slack(value: float, score_dtype: torch.dtype) -> float:
    """The rounding of a score returned in ``score_dtype``."""
    return 2 * U32 * abs(value) if score_dtype == torch.float32 else 4 * U64 * abs(value)


def explain_graph(index: Index, solver: PPRSolver, inp: GraphQueries, cfg: RetrievalConfig,
                  mode: Mode) -> list[QueryExplanation]:
    """Decompose the hits of hipporag2 / hybrid queries by (E1) and (E2) (module docstring).

    Args:
        solver: the float64 solver of ``index.adjacency`` (SolverOf).
        inp: the chunk's queries, hits and what their search computed.
        mode: HIPPORAG2 or HYBRID.
    """
    hybrid = mode.fusion
    link_k = mode.link_k(cfg)
    n, c = index.num_nodes, len(inp.queries)
    dev = index.device
    reset = reset_vectors(index, inp.cand_rows, inp.cand_scores, inp.kept, inp.cos, cfg,
                          mode=mode, dtype=torch.float64)  # [N, c], the search's own r
    seed_q, seed_p, _ = phrase_seeds(index, inp.cand_rows, inp.cand_scores.double(), inp.kept,
                                     link_k)
    sq, sp = seed_q.cpu().numpy(), seed_p.cpu().numpy()  # [S] query and phrase row of a seed
    graph_q = np.flatnonzero(~inp.dense_answer.cpu().numpy())  # the queries PPR answered
    mine = np.isin(sq, [q for q in graph_q if inp.hits[q]])  # seeds that reach a hit
    seed_nodes = np.unique(sp[mine])
    hit_rows = np.unique([h.row for q in graph_q for h in inp.hits[q]]).astype(np.int64)
    passage_nodes = index.passage_nodes.cpu().numpy()
    prior = torch.zeros((n, len(graph_q)), dtype=torch.float64, device=dev)  # [N, g] m
    pn = index.passage_nodes.to(dev)
    prior[pn] = reset[pn][:, torch.as_tensor(graph_q, dtype=torch.int64, device=dev)]
    has_prior = (prior.sum(dim=0) > 0).cpu().numpy() & np.array(
        [bool(inp.hits[q]) for q in graph_q], dtype=bool)  # solved only for a query with hits
    columns = torch.cat([_unit_columns(n, seed_nodes, dev),
                         _unit_columns(n, passage_nodes[hit_rows], dev),
                         prior[:, torch.as_tensor(np.flatnonzero(has_prior), device=dev)]],
                        dim=1)
    x, eps = _solve_columns(solver, columns)
    col_of_seed = {int(v): i for i, v in enumerate(seed_nodes)}
    col_of_hit = {int(r): len(seed_nodes) + i for i, r in enumerate(hit_rows)}
    prior_col = np.cumsum(has_prior) - 1 + len(seed_nodes) + len(hit_rows)
    g = _Graph(index.adjacency, cfg.damping)
    r_host = reset.cpu().numpy()
    fusion = None
    if hybrid and inp.ppr is not None:  # the fusion's ranks and terms, as the search's
        entity = None if inp.entity is None else (inp.entity[0].cpu(), inp.entity[1].cpu())
        ranks = fusion_ranks(inp.ppr.float().cpu(), inp.cos.cpu(), cfg, entity)
        fusion = (ranks, fusion_terms(ranks, cfg))
    gap = _scan_gap(index, inp, r_host, g, cfg.passage_node_weight)
    graph_set = set(graph_q.tolist())
    cand_rows = inp.cand_rows.cpu().numpy()
    cand_scores = inp.cand_scores.cpu().double().numpy()
    kept = inp.kept.cpu().numpy()
    cos = inp.cos.cpu().double().numpy()
    out = []
    for q in range(c):
        facts = tuple(SeedFact(int(cand_rows[q, j]), index.facts[int(cand_rows[q, j])],
                               float(cand_scores[q, j]))
                      for j in range(cand_rows.shape[1]) if kept[q, j])
        if q not in graph_set:
            out.append(_dense_answer(index, inp.queries[q], mode.name, inp.hits[q], cos[q],
                                      facts))
            continue
        gi = int(np.searchsorted(graph_q, q))
        nodes = sp[sq == q]
        w = r_host[nodes, q]
        m = r_host[passage_nodes, q]
        sigma = math.fsum((w * g.keep[nodes]).tolist() + (m * g.keep[passage_nodes]).tolist())
        a_seed = w * g.keep[nodes] / sigma
        a_prior = math.fsum((m * g.keep[passage_nodes]).tolist()) / sigma
        seed_cols = np.array([col_of_seed.get(int(v), 0) for v in nodes], dtype=np.int64)
        pcol = int(prior_col[gi]) if has_prior[gi] else -1
        hits = []
        decomp = 0.0 if not inp.hits[q] else float(a_seed @ eps[seed_cols]) + (
            a_prior * eps[pcol] if pcol >= 0 else 0.0)
        for h in inp.hits[q]:
            node = int(passage_nodes[h.row])
            t_seed = a_seed * x[node, seed_cols]
            t_prior = a_prior * x[node, pcol] if pcol >= 0 else 0.0
            own = m[h.row] * g.keep[node] * x[node, col_of_hit[h.row]] / sigma
            nbrs, weights = g.neighbours(node)
            scale = cfg.damping * weights / np.where(g.degree[nbrs] > 0, g.degree[nbrs], 1.0)
            contribs = []
            for k, v in enumerate(nodes):
                bridges, other = _bridges(g, index, node,
                                          scale * a_seed[k] * x[nbrs, seed_cols[k]],
                                          float(t_seed[k]))
                contribs.append(SeedContribution(index.phrases[int(v)], int(v),
                                                 float(t_seed[k]), bridges, other))
            contribs.sort(key=lambda s: -s.contribution)
            value = float(inp.ppr[q, h.row]) if hybrid and inp.ppr is not None else h.score
            terms = [abs(float(t)) for t in t_seed] + [abs(float(t_prior))]
            bound = (decomp + float(inp.score_bound[q]) + float(gap[q])
                     + (len(terms) + 8) * U64 * (math.fsum(terms) + abs(value))
                     + _score_slack(value, inp.score_dtype))
            fu = None if fusion is None else _fusion(*fusion, q, h.row)
            dense = DensePrior(float(t_prior), float(own), float(t_prior - own),
                               float(m[h.row]), float(cos[q, h.row]))
            hits.append(HitExplanation(h, value, tuple(contribs), dense, 0.0, bound, fu))
        seeds = _seeds(index, nodes, w, a_seed, facts, _facts_of(index, facts))
        out.append(QueryExplanation(inp.queries[q], mode.name, tuple(hits), seeds, facts,
                                    a_prior, False, _phrases(index, seeds, hits)))
    return out


def _fusion(ranks: tuple[Tensor, Tensor, Tensor | None],
            terms: tuple[Tensor, Tensor, Tensor | None], q: int, row: int) -> Fusion:
    """The Fusion of passage ``row`` of query ``q`` from fusion_ranks / fusion_terms."""
    ent_rank, ent_term = ranks[2], terms[2]
    return Fusion(int(ranks[0][q, row]), int(ranks[1][q, row]),
                  None if ent_rank is None else int(ent_rank[q, row]),
                  float(terms[0][q, row]), float(terms[1][q, row]),
                  0.0 if ent_term is None else float(ent_term[q, row]))


def _scan_gap(index: Index, inp: GraphQueries, r_host: np.ndarray, g: _Graph,
              weight: float) -> np.ndarray:
    """[c] 2‖Δr‖₁/σ: how far the target of a query answered by linearity (E_P e in exact
    arithmetic) can be from the iteration's (float32 cosines), module docstring; 0 for the
    others. ``weight``: passage_node_weight."""
    gap = np.zeros(len(inp.queries))
    if inp.pushed is None or not bool(inp.pushed.any()):
        return gap
    rows = torch.nonzero(inp.pushed.cpu()).flatten()
    cos32 = inp.cos.cpu()[rows].double()  # [c', P]
    cos64 = inp.e_pass.cpu()[rows].double() @ index.passage_emb.cpu().double().T
    rng = cos32.amax(dim=1, keepdim=True) - cos32.amin(dim=1, keepdim=True)
    flat = rng <= 0  # then both targets hold all ones: no gap
    dim = index.passage_emb.shape[1]  # float64 rounding of each dot product: ≤ D·2⁻⁵³
    delta = torch.where(flat, 0.0, ((cos32 - cos64).abs() + dim * U64)
                        / torch.where(flat, 1.0, rng))  # [c', P] |Δ minmax(cos)|
    for i, q in enumerate(rows.tolist()):
        sigma = float(r_host[:, q] @ g.keep)
        gap[q] = 2.0 * weight * float(delta[i].sum()) / sigma
    return gap


def _facts_of(index: Index, facts: Sequence[SeedFact]) -> dict[int, list[SeedFact]]:
    """phrase row -> the kept facts naming it."""
    ends = index.fact_phrases.cpu()
    out: dict[int, list[SeedFact]] = {}
    for f in facts:
        for e in sorted(set(ends[f.row].tolist())):
            out.setdefault(int(e), []).append(f)
    return out


def _seeds(index: Index, nodes: np.ndarray, weight: np.ndarray, share: np.ndarray,
           facts: Sequence[SeedFact], by_phrase: dict[int, list[SeedFact]],
           entities: dict[int, list[str]] | None = None) -> tuple[Seed, ...]:
    seeds = [Seed(index.phrases[int(v)], int(v), float(weight[k]), float(share[k]),
                  tuple(by_phrase.get(int(v), ())), tuple((entities or {}).get(int(v), ())))
             for k, v in enumerate(nodes)]
    return tuple(sorted(seeds, key=lambda s: (-s.weight, s.node)))


def _phrases(index: Index, seeds: Sequence[Seed],
             hits: Sequence[HitExplanation]) -> tuple[PhraseInfo, ...]:
    """PhraseInfo of every phrase named by ``seeds`` and the hits' bridges."""
    m = len(index.phrases)
    named = {s.node for s in seeds}
    named |= {b.node for h in hits for s in h.seeds for b in s.bridges if b.node < m}
    if not named:
        return ()
    rows = np.array(sorted(named), dtype=np.int64)
    inc_e = index.incidence_phrase.cpu().numpy()
    inc_p = index.incidence_passage.cpu().numpy()
    src = index.synonym_src.cpu().numpy()
    dst = index.synonym_dst.cpu().numpy()
    score = index.synonym_score.cpu().double().numpy()
    sel = np.isin(inc_e, rows)
    inc_e, inc_p = inc_e[sel], inc_p[sel]
    syn = np.isin(src, rows) | np.isin(dst, rows)
    src, dst, score = src[syn], dst[syn], score[syn]
    out = []
    for v in rows.tolist():
        passages = np.unique(inc_p[inc_e == v])
        best: dict[int, float] = {}
        for a, b, s in zip(src.tolist(), dst.tolist(), score.tolist()):
            other = b if a == v else a if b == v else -1
            if other >= 0 and other != v:
                best[other] = max(best.get(other, -1.0), s)
        synonyms = sorted(best.items(), key=lambda t: (-t[1], t[0]))[:PHRASE_SYNONYMS]
        out.append(PhraseInfo(index.phrases[v], v,
                              tuple(int(p) for p in passages[:PHRASE_PASSAGES]), len(passages),
                              tuple((index.phrases[o], s) for o, s in synonyms)))
    return tuple(out)


def _dense_answer(index: Index, query: str, mode: str, hits: Sequence[Hit], cos: np.ndarray,
                  facts: tuple[SeedFact, ...] = ()) -> QueryExplanation:
    """A query answered by the dense ranking: each score is its min-max cosine, one term."""
    out = tuple(HitExplanation(h, h.score, (), DensePrior(h.score, h.score, 0.0, h.score,
                                                          float(cos[h.row])), 0.0, 0.0)
                for h in hits)
    return QueryExplanation(query, mode, out, (), facts, 1.0, True, ())


def explain_dense(index: Index, queries: Sequence[str], hits: Sequence[Sequence[Hit]],
                  cos: Tensor, mode: str = "dense") -> list[QueryExplanation]:
    """Queries answered by the dense ranking (mode dense; hipporag2 / hybrid on an index without
    facts): each hit's score is its min-max cosine (``cos``: [c, P] the raw cosines)."""
    cos_np = cos.cpu().double().numpy()
    return [_dense_answer(index, q, mode, h, cos_np[i])
            for i, (q, h) in enumerate(zip(queries, hits))]


def explain_hipporag1(index: Index, graph: V1Graph, solver: PPRSolver, queries: Sequence[str],
                      hits: Sequence[Sequence[Hit]], query_entities: Sequence[Sequence[str]],
                      phrase_rows: Tensor, owner: Tensor, score_bound: Tensor,
                      score_dtype: torch.dtype) -> list[QueryExplanation]:
    """Decompose HippoRAG 1 hits by (E3) (module docstring).

    Args:
        graph: the Searcher's V1Graph; solver: the float64 solver of ``graph.adjacency``.
        query_entities: the entities of each query, as given; phrase_rows, owner: [E] the
            phrase each (flattened) entity was linked to and its query row, as rank linked them.
        score_bound: [c] the search's certified L1 bound of each query's PPR.
        score_dtype: the dtype the search's PPR ran in.
    """
    given = [e for ents in query_entities for e in ents]
    m, p = graph.num_phrases, graph.num_passages
    rows, own = phrase_rows.cpu().numpy(), owner.cpu().numpy()
    seeds_of = [np.unique(rows[own == q]) for q in range(len(queries))]
    seed_nodes = np.unique(np.concatenate(seeds_of)) if seeds_of else np.zeros(0, np.int64)
    dev = graph.adjacency.device
    x, eps = _solve_columns(solver, _unit_columns(m, seed_nodes, dev))
    col_of = {int(v): i for i, v in enumerate(seed_nodes)}
    b_mat = graph.passage_phrase.to("cpu")
    b_crow, b_col = b_mat.crow_indices().numpy(), b_mat.col_indices().numpy()
    b_val = b_mat.values().double().numpy()
    b_max = float(b_val.max()) if b_val.size else 0.0
    row_nnz = int(np.diff(b_crow).max()) if p else 0
    y_cols = (b_mat.double() @ torch.from_numpy(x)).numpy() if x.shape[1] else np.zeros((p, 0))
    g = _Graph(graph.adjacency, solver.damping)
    spec = graph.specificity.cpu().double().numpy()
    u_search = U32 if score_dtype == torch.float32 else U64
    out = []
    for q, query in enumerate(queries):
        nodes = seeds_of[q]
        ents: dict[int, list[str]] = {}
        for i in np.flatnonzero(own == q).tolist():
            ents.setdefault(int(rows[i]), []).append(given[i])
        if len(nodes) == 0:  # v1: uniform 1/P, no seed
            hx = tuple(HitExplanation(h, h.score, (), None, 1.0 / p, _score_slack(h.score,
                                      score_dtype) + 4 * U64) for h in hits[q])
            out.append(QueryExplanation(query, HIPPORAG1.name, hx, (), (), 0.0, False, ()))
            continue
        w = spec[nodes]
        sigma = float(w @ g.keep[nodes])
        a = w * g.keep[nodes] / sigma
        cols = np.array([col_of[int(v)] for v in nodes], dtype=np.int64)
        y = y_cols[:, cols] @ a  # [P]
        lo, hi = float(y.min()), float(y.max())
        rng = hi - lo
        y_max = float(np.abs(y).max())
        delta = (b_max * (float(a @ eps[cols]) + float(score_bound[q]))
                 + (row_nnz + len(nodes) + 4) * (u_search + U64) * y_max)
        hx_list = []
        for h in hits[q]:
            seeds: list[SeedContribution] = []
            if rng > 0:
                a0, a1 = b_crow[h.row], b_crow[h.row + 1]
                phr, bv = b_col[a0:a1], b_val[a0:a1]
                for k, v in enumerate(nodes):
                    term = float(a[k] * y_cols[h.row, cols[k]] / rng)
                    mass = bv * a[k] * x[phr, cols[k]] / rng
                    order = np.argsort(-mass, kind="stable")[:BRIDGES]
                    br = tuple(Bridge(index.phrases[int(phr[i])], int(phr[i]), float(mass[i]))
                               for i in order if mass[i] > 0)
                    seeds.append(SeedContribution(index.phrases[int(v)], int(v), term, br,
                                                  term - math.fsum(b.mass for b in br)))
                seeds.sort(key=lambda s: -s.contribution)
                offset = -lo / rng
                bound = (4 * delta / (rng - 2 * delta) if rng > 2 * delta else math.inf)
                bound += 3 * u_search + (len(nodes) + 8) * U64 * (1 + abs(offset))
            else:  # every passage scores 1
                offset, bound = 1.0, _score_slack(1.0, score_dtype)
            hx_list.append(HitExplanation(h, h.score, tuple(seeds), None, offset, bound))
        seed_objs = _seeds(index, nodes, w, a, (), {}, ents)
        out.append(QueryExplanation(query, HIPPORAG1.name, tuple(hx_list), seed_objs, (), 0.0,
                                    False, _phrases(index, seed_objs, hx_list)))
    return out
