"""Searcher: batched retrieval over one Index, queries -> ranked passages.

A `Searcher` owns the query-time state of one index on one device: the query encoder, the PPR
solvers and the lookup tables they need. The index itself stays plain data.

All per-query work is batched tensor work: one encoder call per instruction type, one GEMM for
queries x facts and one for queries x passages, `torch.topk` for candidate facts, scatter-adds for
seed weights, one batched PPR solve, `torch.topk` for the ranking. No Python loop over nodes,
passages or queries in the hot path.

Memory (issue 13). Nothing of size Q x F or Q x N outgrows `RetrievalConfig.chunk_bytes`
(`plan_chunks` sizes the chunks): fact scores are taken in blocks of fact rows with a running
exact top-k (`fact_topk`); passage scores, seeds, PPR, fusion and the final top-k run per chunk
of query columns, each chunk seeing only its [c, P] scores and [N, c] seeds. Chunks change no
result: each query's numbers come from the same float operations in the same order whatever
its chunk (hippo_gpu.blockwise: padded GEMM panels, aligned row blocks; the PPR kernel solves
each column alone), tested bit for bit against one chunk in tests/test_chunked_search.py.
An index that fits the budget runs as one chunk.

Modes:
    hipporag2  official HippoRAG 2 (main@c617143) retrieval, step by step (parity mode)
    dense      DPR with the index's encoder
    hybrid     our improvement (see `rank`): phrase seeds as hipporag2 but normalised, a sharp
               softmax passage prior instead of 0.05 x min-max, then reciprocal-rank fusion of
               the PPR and dense rankings
    hipporag1  HippoRAG 1: query entities -> nearest phrase -> specificity-weighted PPR on the
               phrase graph -> passage scores (needs query entities)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, overload

import torch
from torch import Tensor

from hippo_gpu import hipporag1
from hippo_gpu.blockwise import block_rows, nearest_rows, scores_against, spans
from hippo_gpu.config import MODES, RetrievalConfig
from hippo_gpu.data import Triple
from hippo_gpu.embed import Encoder, runnable_precision
from hippo_gpu.entities import heuristic_entities
from hippo_gpu.index import Index
from hippo_gpu.ppr import ConvergenceError, PPRSolution, PPRSolver
from hippo_gpu.store import IndexFormatError

__all__ = [
    "ChunkPlan",
    "FactFilter",
    "FilterResult",
    "Hit",
    "Ranking",
    "Searcher",
    "fact_topk",
    "minmax_rows",
    "plan_chunks",
    "ranks_of",
    "reset_vectors",
    "topk_stable",
]


@dataclass(frozen=True)
class Hit:
    """One ranked passage for one query."""

    key: str  # "chunk-" + md5(title + "\n" + text)
    title: str
    score: float
    rank: int  # 0-based position in the ranking
    row: int  # passage row in the index (0..P-1): index.passage_texts[row] is its text


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
    # [Q] float64: the worst certified L1 bound of the PPR solves behind each query (0: none)
    ppr_bound: Tensor | None = None
    ppr_refined: Tensor | None = None  # [Q] bool: a stalled float32 solve finished in float64
    failed: dict[int, str] = field(default_factory=dict)  # query row -> why it has no answer

    def record(self, solution: PPRSolution, rows: Tensor) -> None:
        """Fold one PPR solve into the per-query report; ``rows`` [c] are the query rows of
        its columns (-1: a placeholder column whose PPR is discarded)."""
        q = self.passage_rows.shape[0] if self.ppr_bound is None else self.ppr_bound.numel()
        if self.ppr_bound is None or self.ppr_refined is None:
            self.ppr_bound = torch.zeros(q, dtype=torch.float64)
            self.ppr_refined = torch.zeros(q, dtype=torch.bool)
        rows = rows.cpu()
        used = torch.nonzero(rows >= 0).flatten()
        mine = rows[used]
        bound = solution.bound.cpu().double()[used]
        self.ppr_bound[mine] = torch.maximum(self.ppr_bound[mine], bound)
        self.ppr_refined[mine] |= solution.refined.cpu()[used]
        for col, why in solution.failures().items():
            row = int(rows[col])
            if row >= 0:
                self.failed.setdefault(row, why)


class QueryFailure(ConvergenceError):
    """Some queries of a batch have no answer (their PPR is uncertified); the others do.

    Attributes:
        failures: {query row: why}.
        hits: the answers of every query, [] for a failed one.
        seeds: the seed facts of every query (``return_seeds``), else None.
    """

    def __init__(self, failures: dict[int, str], hits: list[list[Hit]],
                 seeds: list[list[Triple]] | None = None) -> None:
        rows = sorted(failures)
        super().__init__(f"{len(rows)} of {len(hits)} queries failed (rows {rows[:10]}): "
                         f"{failures[rows[0]]}", rows)
        self.failures = failures
        self.hits = hits
        self.seeds = seeds


def minmax_rows(x: Tensor) -> Tensor:
    """Row-wise (x - min) / (max - min); a row with zero range becomes all ones (as upstream)."""
    return _scale_rows(x, x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values)


def _scale_rows(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """(x - lo) / (hi - lo) per row with given [Q, 1] bounds (minmax_rows' float operations)."""
    rng = hi - lo
    scaled = (x - lo) / torch.where(rng > 0, rng, torch.ones_like(rng))
    return torch.where(rng > 0, scaled, torch.ones_like(x))


def topk_stable(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k per row, descending, ties broken by the lower column index, on every device.

    `torch.topk` leaves open which of several equal values at the k-th place it selects, so it
    is used only to find the k-th largest value v; the selection is then exact: every entry
    > v, plus the lowest-indexed entries == v until k are taken. The k selected are sorted by
    (value desc, index asc). The result does not depend on the device, the batch or the run.
    Rows must hold no NaN.
    """
    q, n = scores.shape
    k = min(k, n)
    if k == 0 or q == 0:
        empty = scores.new_zeros((q, 0))
        return empty, empty.long()
    kth = torch.topk(scores, k, dim=1).values[:, -1:]  # [Q, 1] the k-th largest value
    above = scores > kth
    tied = scores == kth
    need = k - above.sum(dim=1, keepdim=True)  # how many of the tied entries to take
    take = above | (tied & (torch.cumsum(tied, dim=1) <= need))  # exactly k per row
    idx = take.nonzero()[:, 1].reshape(q, k)  # row-major: ascending column index per row
    vals = scores.gather(1, idx)
    by_val = torch.sort(vals, dim=1, descending=True, stable=True)
    return by_val.values, idx.gather(1, by_val.indices)


def ranks_of(scores: Tensor) -> Tensor:
    """[Q, P] -> int64 0-based rank of each entry in its row (descending; ties by lower index).

    Integer ranks are exact for any P (a float32 rank would be exact only below 2^24).
    """
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(scores.shape[1], device=scores.device).expand_as(order))
    return ranks


# Working-set bytes per element, as the code below allocates them (estimates; the budget is
# approximate by design, benchmarks/bench_query_memory.py measures the real peak).
FACT_BYTES = 48  # per (query, fact) of a fact block: raw and normalised scores, top-k masks
PASSAGE_BYTES = 32  # per (query, passage) of a chunk: cosine, min-max, fusion ranks (24 measured)
NODE_VECTORS = 5  # [N] vectors per query column: seeds, their permuted copy, the kernel's three
LANES = 8  # query columns are taken in multiples of this where the budget allows: the CPU
# kernel solves 8 float32 (4 float64) columns per SIMD pass, so a 2-column chunk costs the same
# sweep as an 8-column one
LINK_BYTES = 8  # per (entity, phrase) of a linking block


@dataclass(frozen=True)
class ChunkPlan:
    """How one batch is cut to fit `RetrievalConfig.chunk_bytes` (see `plan_chunks`)."""

    query_cols: int  # queries per chunk of passage scores, seeds, PPR, fusion and top-k
    fact_rows: int  # fact-embedding rows per block of the fact top-k
    phrase_rows: int  # phrase-embedding rows per block of entity linking


def plan_chunks(index: Index, num_queries: int, cfg: RetrievalConfig,
                num_entities: int = 0) -> ChunkPlan:
    """Chunk sizes for a batch of `num_queries` queries (and entities) within cfg.chunk_bytes.

    A query column costs about NODE_VECTORS x itemsize x N (seeds and PPR state) plus
    PASSAGE_BYTES x P (scores, ranks) bytes, so c = budget / that (at least 1, at most Q); a
    fact row costs FACT_BYTES x Q, a phrase row LINK_BYTES x E (blockwise.block_rows: all rows
    when they fit, else aligned blocks). Everything fits at once on small indexes: one chunk.
    """
    budget = cfg.chunk_bytes
    itemsize = 8 if cfg.dtype == "float64" else 4
    per_col = NODE_VECTORS * itemsize * index.num_nodes + PASSAGE_BYTES * len(index.passage_keys)
    cols = max(1, min(num_queries, budget // max(per_col, 1)))
    if LANES <= cols < num_queries:
        cols -= cols % LANES
    return ChunkPlan(
        query_cols=cols,
        fact_rows=block_rows(len(index.facts), FACT_BYTES * max(num_queries, 1), budget),
        phrase_rows=block_rows(len(index.phrases), LINK_BYTES * max(num_entities, 1), budget),
    )


def fact_topk(query_emb: Tensor, fact_emb: Tensor, k: int,
              rows_per_block: int | None = None) -> tuple[Tensor, Tensor]:
    """The k best facts per query by min-max normalised cosine, ties by the lower fact row.

    s[q, f] = minmax_f(e_q · v_f) over all F facts; returns ([Q, K] float32 scores s, [Q, K]
    int64 fact rows), exactly `topk_stable(minmax_rows(E Vᵀ), k)`. With rows_per_block < F it
    never holds more than [Q, rows_per_block] scores: a first pass over the fact blocks takes
    each query's min and max, a second scales each block with them (minmax_rows' own float
    operations, so the same values) and merges its top-k into a running top-k. The merge keeps
    the tie order: the running top-k comes first in the concatenation, holds only lower rows
    than the block and is sorted by (score desc, row asc), so topk_stable's "lower column among
    ties" is the lower row. Costs one more pass of the fact GEMM than one block does.

    Args:
        query_emb: [Q, D] L2-normalised query vectors.
        fact_emb: [F, D] fact vectors (F >= 1; the index's dtype: scores are in it until
            normalised, as in the one-block path).
    """
    f = fact_emb.shape[0]
    size = f if rows_per_block is None else max(1, min(rows_per_block, f))
    if size >= f:
        return topk_stable(minmax_rows(scores_against(query_emb, fact_emb)).float(), k)
    (a0, b0), *rest = spans(f, size)
    raw = scores_against(query_emb, fact_emb[a0:b0])  # [Q, rows] in the index dtype
    lo = raw.min(dim=1, keepdim=True).values
    hi = raw.max(dim=1, keepdim=True).values
    for a, b in rest:  # pass 1: per-query min and max over all facts (exact in any order)
        raw = scores_against(query_emb, fact_emb[a:b])
        lo = torch.minimum(lo, raw.min(dim=1, keepdim=True).values)
        hi = torch.maximum(hi, raw.max(dim=1, keepdim=True).values)
    del raw
    best_val, best_row = topk_stable(
        _scale_rows(scores_against(query_emb, fact_emb[a0:b0]), lo, hi).float(), k)
    for a, b in rest:  # pass 2: scale with the global bounds, merge into the running top-k
        scaled = _scale_rows(scores_against(query_emb, fact_emb[a:b]), lo, hi).float()
        val, row = topk_stable(scaled, k)
        best_val, pos = topk_stable(torch.cat([best_val, val], dim=1), k)
        best_row = torch.cat([best_row, row + a], dim=1).gather(1, pos)
    return best_val, best_row


def _cat_topk(parts: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Concatenate per-chunk (scores [c, K], rows [c, K]) along the queries."""
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _segment_mean(values: Tensor, segment: Tensor, n_segments: int) -> Tensor:
    """Mean of `values` per segment id, summed in a fixed order on every device.

    `index_add_` is atomic on CUDA: the order of its float additions, hence the last bits of a
    sum, varies from run to run, enough to reorder near-ties at a top-k cut. Here each segment's
    values are laid out in a [S, W] table in their input order (W = the largest segment) and
    added column by column, so every sum is ((v0 + v1) + v2) + ... whatever the device, the
    batch or the run (padding adds exact zeros at the end). W is at most 2 x linking_top_k.
    """
    order = torch.sort(segment, stable=True).indices  # input order kept within a segment
    seg_sorted = segment.index_select(0, order)
    counts = torch.bincount(segment, minlength=n_segments)  # [S]
    start = torch.cumsum(counts, 0) - counts
    pos = torch.arange(segment.numel(), device=segment.device) - start.index_select(0, seg_sorted)
    width = int(counts.max()) if counts.numel() else 0
    table = values.new_zeros((n_segments, max(width, 1)))
    table[seg_sorted, pos] = values.index_select(0, order)
    total = table[:, 0].clone()
    for j in range(1, width):  # W <= 2 x linking_top_k columns, not a loop over data
        total += table[:, j]
    return total / counts.clamp_min(1).to(values.dtype)


def _phrase_seeds(
    index: Index, fact_rows: Tensor, fact_scores: Tensor, kept: Tensor, top_phrases: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Upstream phrase weights, batched.

    For each kept fact f of query q with normalised score s_f and each of its phrases e:
    w[q, e] = mean over such facts of s_f / |passages containing e|; then only the
    `top_phrases` largest w per query are kept (ties: lower phrase row first).

    Args:
        fact_rows, fact_scores, kept: [Q, L] candidate facts, their min-max scores, kept mask.
    Returns:
        (query, phrase, weight) triplets [S] of the seeds kept.
    """
    q, n_cand = fact_rows.shape
    m = len(index.phrases)
    # [Q, 2L] subject and object phrase rows of each candidate fact
    ends = index.fact_phrases.index_select(0, fact_rows.reshape(-1)).reshape(q, n_cand * 2)
    score2 = fact_scores.repeat_interleave(2, dim=1)
    kept2 = kept.repeat_interleave(2, dim=1)
    counts = index.phrase_passage_counts.index_select(0, ends.reshape(-1)).reshape(q, n_cand * 2)
    contrib = score2 / counts.clamp_min(1).to(score2.dtype)
    qrow = torch.arange(q, device=ends.device).unsqueeze(1).expand(q, n_cand * 2)
    key = (qrow * m + ends)[kept2]
    uniq, inv = torch.unique(key, return_inverse=True)  # sorted by (query, phrase)
    weight = _segment_mean(contrib[kept2], inv, uniq.numel())
    uq, up = uniq // m, uniq % m
    # order by (query asc, weight desc, phrase asc): stable sorts, least significant key first
    o1 = torch.sort(weight, descending=True, stable=True).indices
    o2 = torch.sort(uq.index_select(0, o1), stable=True).indices
    order = o1.index_select(0, o2)
    uq, up, weight = uq[order], up[order], weight[order]
    first = torch.zeros(q + 1, dtype=torch.int64, device=uq.device)
    first[1:] = torch.cumsum(torch.bincount(uq, minlength=q), 0)
    rank = torch.arange(uq.numel(), device=uq.device) - first.index_select(0, uq)
    sel = rank < top_phrases
    return uq[sel], up[sel], weight[sel]


def reset_vectors(index: Index, cand_rows: Tensor, cand_scores: Tensor, kept: Tensor,
                  cos: Tensor, cfg: RetrievalConfig, *, hybrid: bool = False,
                  dtype: torch.dtype = torch.float32) -> Tensor:
    """The [N, Q] PPR reset vectors: phrase seeds from the kept facts plus a passage part.

    hipporag2 (upstream §3.3.6): r = w_phrase + passage_node_weight * minmax(cos) at passages.
    hybrid: r = w_phrase / 1ᵀw_phrase + hybrid_passage_node_weight * softmax(T * cos).

    Args:
        cand_rows, cand_scores, kept: [Q, L] candidate facts, min-max scores, kept mask.
        cos: [Q, P] query-passage cosine.
    """
    link_k = cfg.hybrid_linking_top_k if hybrid else cfg.linking_top_k
    sq, sp, sw = _phrase_seeds(index, cand_rows, cand_scores.to(dtype), kept, link_k)
    seeds = torch.zeros((index.num_nodes, cand_rows.shape[0]), dtype=dtype, device=cos.device)
    seeds.index_put_((sp, sq), sw.to(dtype), accumulate=True)
    if hybrid:  # phrase part sums to 1; passage prior: a sharp softmax over cosine
        seeds /= seeds.sum(dim=0, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        prior = torch.softmax(cfg.hybrid_temperature * cos.to(dtype), dim=1)
        seeds[index.passage_nodes] += (cfg.hybrid_passage_node_weight * prior).T
    else:
        seeds[index.passage_nodes] += (cfg.passage_node_weight * minmax_rows(cos.to(dtype))).T
    return seeds


def _leading_block(adj: Tensor, m: int) -> Tensor:
    """adj[:m, :m] of a sparse CSR matrix (the phrase-only graph: phrase rows come first)."""
    coo = adj.to_sparse_coo().coalesce()
    r, c = coo.indices()
    keep = (r < m) & (c < m)
    sub = torch.sparse_coo_tensor(torch.stack([r[keep], c[keep]]), coo.values()[keep], (m, m),
                                  check_invariants=False)
    return sub.coalesce().to_sparse_csr()


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


def _check_entities(queries: list[str], query_entities: Sequence[Sequence[str]]) -> None:
    if len(query_entities) != len(queries):
        raise ValueError(
            f"query_entities has {len(query_entities)} rows for {len(queries)} queries")
    for i, ents in enumerate(query_entities):
        if isinstance(ents, str) or not all(isinstance(e, str) for e in ents):
            raise TypeError(f"query_entities[{i}] must be a list of strings")


class _Clock:
    """Stage timer (synchronises CUDA so each stage is charged its own work)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.t
        self.t = now


class Searcher:
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
    """

    def __init__(self, index: Index, config: RetrievalConfig | None = None, *,
                 query_precision: str | None = None, query_batch_size: int | None = None,
                 query_backend: str = "auto", encoder: Encoder | None = None,
                 cache_dir: str | Path | None = None) -> None:
        self.index = index
        self.config = config or RetrievalConfig()
        enc = self.index.config.encoder
        self.encoder_config = replace(
            enc, precision=query_precision or runnable_precision(enc.precision, index.device),
            query_batch_size=query_batch_size or enc.query_batch_size,
            backend=query_backend)
        self._query_encoder = encoder
        self._cache_dir = cache_dir
        self._solvers: dict[tuple[Any, ...], PPRSolver] = {}
        self._hipporag1: hipporag1.V1Graph | None = None  # v1 graph, built on first use
        self._incidences: dict[torch.dtype, Tensor] = {}  # passage-phrase incidence per dtype
        self._uncased: bool | None = None

    @property
    def device(self) -> torch.device:
        return self.index.device

    @property
    def encoder(self) -> Encoder:
        """The query encoder (the index's own model), loaded on first use."""
        if self._query_encoder is None:
            enc = Encoder(self.encoder_config, self.device, cache_dir=self._cache_dir)
            if enc.dim != self.index.passage_emb.shape[1]:
                raise IndexFormatError(
                    f"encoder {self.encoder_config.model!r} gives dim {enc.dim}, "
                    f"the index holds dim {self.index.passage_emb.shape[1]}")
            self._query_encoder = enc
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
        dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
        key = ("ppr", phrase_graph, cfg.damping, cfg.dtype, cfg.ppr_tol, cfg.ppr_method,
               cfg.ppr_max_iter)
        solver = self._solvers.get(key)
        if solver is None:
            if phrase_graph:
                m = len(index.phrases)
                adj = _leading_block(index.adjacency, m)
                solver = PPRSolver(adj, damping=cfg.damping, dtype=dtype, tol=cfg.ppr_tol,
                                   method=cfg.ppr_method, max_iter=cfg.ppr_max_iter)
            else:
                solver = PPRSolver(index.adjacency, damping=cfg.damping, dtype=dtype,
                                   target_nodes=index.passage_nodes, tol=cfg.ppr_tol,
                                   method=cfg.ppr_method, max_iter=cfg.ppr_max_iter)
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
    ) -> Ranking:
        """The batched retrieval pipeline behind `retrieve`, returning tensors and stage times.

        `query_emb` ([Q, D], L2-normalised) skips query encoding when the caller already has the
        vectors (hipporag2/hybrid/dense with one instruction for facts and passages).

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
        q = len(queries)
        p = len(index.passage_keys)
        dev = index.device
        if q == 0 or p == 0:
            empty = torch.zeros((q, 0), dtype=torch.int64, device=dev)
            return Ranking(empty, empty.float(), {}, torch.zeros(q, dtype=torch.bool))
        clock = _Clock(dev)

        if mode == "hipporag1":
            return self._rank_hipporag1(queries, query_entities, top_k, cfg, clock)

        e_pass, e_fact = self.encode_queries(queries, query_emb)  # [Q, D] each
        clock.lap("encode")
        plan = plan_chunks(index, q, cfg)
        chunks = spans(q, plan.query_cols)

        f = len(index.facts)
        if mode == "dense" or f == 0:  # no facts at all: upstream answers with the dense ranking
            parts = []
            for a, b in chunks:
                dense = minmax_rows(self._passage_cos(e_pass[a:b]))  # [c, P]
                clock.lap("dense")
                parts.append(topk_stable(dense, top_k))
                clock.lap("rank")
            scores, rows = _cat_topk(parts)
            return Ranking(rows, scores, clock.seconds, torch.ones(q, dtype=torch.bool))

        hybrid = mode == "hybrid"
        link_k = cfg.hybrid_linking_top_k if hybrid else cfg.linking_top_k
        # [Q, L] best facts by min-max normalised query-fact cosine, fact blocks within budget
        cand_scores, cand_rows = fact_topk(e_fact, index.fact_emb, link_k, plan.fact_rows)
        clock.lap("facts")

        kept = torch.ones_like(cand_rows, dtype=torch.bool)
        outcome = None
        if fact_filter is not None:
            outcome = self._apply_filter(queries, cand_rows, fact_filter)
            kept = _kept_mask(outcome, cand_rows.shape, link_k).to(dev)
            clock.lap("filter")
        fallback = ~kept.any(dim=1)  # [Q] nothing left: dense ranking (upstream)

        linked = None  # hybrid: every entity of the batch linked once, ranked per chunk below
        if hybrid and cfg.hybrid_entity_weight > 0:
            if query_entities is None:
                query_entities = heuristic_entities(queries)
            _check_entities(queries, query_entities)
            linked = self._link_entities(query_entities, cfg)
            clock.lap("entities")

        dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
        parts = []
        report = Ranking(cand_rows, cand_scores, {}, fallback)  # collects the PPR certificates
        query_rows = torch.arange(q)
        for a, b in chunks:  # query columns a..b-1: [c, P] scores, [N, c] seeds
            cos = self._passage_cos(e_pass[a:b])  # [c, P] query-passage cosine
            clock.lap("dense")
            seeds = reset_vectors(index, cand_rows[a:b], cand_scores[a:b], kept[a:b], cos, cfg,
                                  hybrid=hybrid, dtype=dtype)  # [N, c]
            seeds[:, fallback[a:b]] = 1.0  # placeholder for fallback columns; PPR discarded
            clock.lap("seeds")
            solution = self._solver(cfg).solve(seeds)
            del seeds
            report.record(solution, query_rows[a:b].masked_fill(fallback[a:b].cpu(), -1))
            ppr = solution.scores.T  # [c, P] raw PPR probabilities at passage nodes
            clock.lap("ppr")
            if hybrid:
                entity = None
                if linked is not None:
                    doc, has_ent, phrase_solution = self._entity_doc(*linked, a, b, cfg)
                    entity = (doc, has_ent)
                    if phrase_solution is not None:
                        report.record(phrase_solution,
                                      query_rows[a:b].masked_fill(~has_ent.cpu(), -1))
                final = self._hybrid_fusion(ppr.float(), cos, cfg, entity)
                clock.lap("entities")
            else:
                final = ppr.float() if dtype == torch.float32 else ppr
            del ppr
            dense = minmax_rows(cos).to(final.dtype)
            final = torch.where(fallback[a:b].unsqueeze(1), dense, final)
            parts.append(topk_stable(final, top_k))
            clock.lap("rank")
        scores, rows = _cat_topk(parts)
        seed_facts = torch.where(kept, cand_rows, torch.full_like(cand_rows, -1))
        return Ranking(rows, scores, clock.seconds, fallback, seed_facts, outcome,
                       report.ppr_bound, report.ppr_refined, report.failed)

    def _passage_cos(self, query_emb: Tensor) -> Tensor:
        """[c, D] query vectors -> [c, P] float32 query-passage cosine (blockwise GEMM)."""
        return scores_against(query_emb, self.index.passage_emb).float()

    def _hybrid_fusion(self, ppr: Tensor, cos: Tensor, cfg: RetrievalConfig,
                       entity: tuple[Tensor, Tensor] | None) -> Tensor:
        """Weighted reciprocal-rank fusion of three rankings of the passages ([c, P] each):

            score = (1 - e) w / (k + rank_ppr) + (1 - e)(1 - w) / (k + rank_dense)
                    + e / (k + rank_entity)

        with w = hybrid_weight, e = hybrid_entity_weight, k = hybrid_rrf_k, ranks from 0. The
        entity ranking is HippoRAG 1's (`entity_scores`; `entity` = its (scores, has_entities)
        for these queries, None when e = 0); passages it scores 0 rank last, and a query with
        no entity uses its dense ranking there.
        """
        w, e, k = cfg.hybrid_weight, cfg.hybrid_entity_weight, cfg.hybrid_rrf_k
        # float64 fusion of exact integer ranks: no rounding collapses two ranks for any P
        rank_dense = ranks_of(cos).double()
        final = (1 - e) * w / (k + ranks_of(ppr).double()) + (1 - e) * (1 - w) / (k + rank_dense)
        if e > 0 and entity is not None:
            doc, has_ent = entity
            rank_ent = ranks_of(doc).masked_fill(doc <= 0, doc.shape[1]).double()
            rank_ent = torch.where(has_ent.unsqueeze(1), rank_ent, rank_dense)
            final = final + e / (k + rank_ent)
        return final

    def _apply_filter(self, queries: list[str], cand_rows: Tensor,
                      fact_filter: FactFilter) -> FilterResult:
        facts = self.index.facts
        candidates = [[facts[j] for j in row] for row in cand_rows.cpu().tolist()]
        outcome = fact_filter(queries, candidates)
        if len(outcome.kept) != len(queries):
            raise ValueError(
                f"fact filter returned {len(outcome.kept)} rows for {len(queries)} queries")
        return outcome

    def entity_scores(self, query_entities: Sequence[Sequence[str]],
                      cfg: RetrievalConfig) -> tuple[Tensor, Tensor]:
        """The hybrid mode's entity ranking: HippoRAG 1's idea, simplified (tuned as it is).

        Each entity is linked to the phrase equal to its lower-cased text, else to its nearest
        phrase by cosine; the phrase gets reset weight 1 / |passages containing it| (node
        specificity); PPR runs on the phrase block of the index graph; a passage scores the sum
        of the PPR of the phrases it mentions (binary passage-phrase incidence, where legacy v1
        weights a phrase by the facts of the passage that name it), min-max normalised per
        query. Legacy v1 itself is mode "hipporag1" (hippo_gpu.hipporag1).

        Retrieval calls the two halves, linking (once per batch) and scoring (per chunk of
        queries), separately; this is the whole batch at once.

        Returns:
            scores: [Q, P] float32 (rows of queries without entities are zero).
            has_entities: [Q] bool.
        """
        linked = self._link_entities(query_entities, cfg)
        doc, has_ent, solution = self._entity_doc(*linked, 0, len(query_entities), cfg)
        if solution is not None:
            report = Ranking(has_ent, has_ent, {}, has_ent)
            report.record(solution, torch.arange(len(query_entities)).masked_fill(
                ~has_ent.cpu(), -1))
            if report.failed:
                raise ConvergenceError(next(iter(report.failed.values())), sorted(report.failed))
        return doc, has_ent

    def _link_entities(self, query_entities: Sequence[Sequence[str]],
                       cfg: RetrievalConfig) -> tuple[Tensor, Tensor]:
        """(phrase row [E], query row [E]) of every entity of a batch (see `entity_scores`)."""
        index = self.index
        dev = index.device
        owner = [qi for qi, ents in enumerate(query_entities) for _ in ents]
        flat = [e for ents in query_entities for e in ents]
        if not flat or len(index.phrases) == 0:
            empty = torch.zeros(0, dtype=torch.int64, device=dev)
            return empty, empty
        # Linking: with an encoder verified uncased, an entity whose lower-cased text is a phrase
        # links to it without encoding (its vector is the phrase's: exactly the cosine argmax);
        # every other entity goes to the nearest phrase by cosine, in blocks of phrase rows.
        row_of = index.row_of_phrase if self.encoder_is_uncased else {}
        exact = [row_of.get(e.lower(), -1) for e in flat]
        todo = [i for i, r in enumerate(exact) if r < 0]
        nearest = torch.tensor(exact, dtype=torch.int64, device=dev)  # [E] phrase rows
        if todo:
            e_ent = self.encoder.encode([flat[i] for i in todo])
            rows = plan_chunks(index, 0, cfg, num_entities=len(todo)).phrase_rows
            nearest[torch.tensor(todo, device=dev)] = nearest_rows(e_ent, index.phrase_emb, rows)
        return nearest, torch.tensor(owner, dtype=torch.int64, device=dev)

    def _entity_doc(self, nearest: Tensor, owner: Tensor, start: int, stop: int,
                    cfg: RetrievalConfig) -> tuple[Tensor, Tensor, PPRSolution | None]:
        """`entity_scores` of queries start..stop-1 from the linked entities of the batch.

        Returns ([c, P] float32 scores, [c] has_entities, the phrase-graph PPR solution of the
        c columns, where those of queries without entities are placeholders; None when no
        query has one), c = stop - start.
        """
        index = self.index
        dev = index.device
        q, m, p = stop - start, len(index.phrases), len(index.passage_keys)
        mine = (owner >= start) & (owner < stop)
        nearest, own = nearest[mine], owner[mine] - start
        has_ent = torch.zeros(q, dtype=torch.bool, device=dev)
        if nearest.numel() == 0 or m == 0:
            return torch.zeros((q, p), device=dev), has_ent, None
        weight = 1.0 / index.phrase_passage_counts.index_select(0, nearest).clamp_min(1).double()
        dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
        seeds = torch.zeros((m, q), dtype=dtype, device=dev)  # [M, c]
        seeds.index_put_((nearest, own), weight.to(dtype))  # assignment, as upstream
        has_ent[own] = True
        seeds[:, ~has_ent] = 1.0  # placeholder for queries without entities; zeroed below
        solution = self._solver(cfg, phrase_graph=True).solve(seeds)
        del seeds
        ppr = solution.scores  # [M, c]
        doc = minmax_rows((self._incidence(ppr.dtype) @ ppr).T.float())  # [c, P]
        return doc * has_ent.unsqueeze(1), has_ent, solution

    def _incidence(self, dtype: torch.dtype) -> Tensor:
        """[P, M] binary passage-phrase incidence as sparse CSR (built once per dtype)."""
        inc = self._incidences.get(dtype)
        if inc is None:
            index = self.index
            inc = torch.sparse_coo_tensor(
                torch.stack([index.incidence_passage, index.incidence_phrase]),
                torch.ones(index.incidence_phrase.numel(), dtype=dtype, device=index.device),
                (len(index.passage_keys), len(index.phrases)), check_invariants=False,
            ).to_sparse_csr()
            self._incidences[dtype] = inc
        return inc

    def _rank_hipporag1(self, queries: list[str],
                        query_entities: Sequence[Sequence[str]] | None, top_k: int,
                        cfg: RetrievalConfig, clock: _Clock) -> Ranking:
        """Legacy HippoRAG 1 ranking (hippo_gpu.hipporag1, eqs. 1-2): entities -> nearest
        phrase by the index encoder's cosine -> specificity-weighted PPR on the v1 phrase graph
        -> minmax(D FP x). A query without entities gets uniform scores 1/P (row order), as v1
        does; dense_fallback is False for every query (no dense ranking is used)."""
        if query_entities is None:
            raise ValueError(
                "mode 'hipporag1' needs the named entities of each query: pass query_entities "
                "(from an LLM via hippo_gpu.llm.ner.QueryNER, or a HippoRAG "
                "*_queries.named_entity_output.tsv via hippo_gpu.llm.ner.read_query_ner_tsv)")
        _check_entities(queries, query_entities)
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
        key = ("hipporag1", cfg.damping, cfg.dtype, cfg.ppr_tol, cfg.ppr_method, cfg.ppr_max_iter)
        if key not in self._solvers:
            self._solvers[key] = hipporag1.make_solver(self._hipporag1, cfg)
        own = torch.tensor(owner, dtype=torch.int64, device=dev)
        parts = []
        no_fallback = torch.zeros(len(queries), dtype=torch.bool, device=dev)
        report = Ranking(no_fallback, no_fallback, {}, no_fallback)  # the PPR certificates
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
        top_scores, top_rows = _cat_topk(parts)
        return Ranking(top_rows, top_scores, clock.seconds, no_fallback,
                       ppr_bound=report.ppr_bound, ppr_refined=report.ppr_refined,
                       failed=report.failed)

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
