"""What a query batch puts into PPR, and in what pieces: the chunk plan that keeps every [Q, F]
and [N, Q] working set inside the memory budget, the blocked top-k of query-fact scores, and the
HippoRAG 2 reset vectors built from them (phrase seeds from the kept facts, plus the dense
passage prior).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.device import chunk_budget, ppr_dtype
from hippo_gpu.indexing.index import Index
from hippo_gpu.retrieval.blockwise import ROW_ALIGN, block_rows, panel_slabs, scores_against, spans
from hippo_gpu.retrieval.compact_facts import COMPACT_MAX_QUERIES, CompactFacts, compact_topk
from hippo_gpu.retrieval.modes import HIPPORAG2, Mode
from hippo_gpu.retrieval.ranking import minmax_rows, scale_rows, topk_stable

__all__ = ["ChunkPlan", "fact_topk", "leading_block", "phrase_seeds", "plan_chunks",
           "reset_vectors"]

# Working-set bytes per element, as the code below allocates them (estimates; the budget is
# approximate by design, benchmarks/bench_query_memory.py measures the real peak).
FACT_BYTES = 48  # per (query, fact) of a fact block of the torch path (CUDA): raw and
# normalised scores, top-k masks; the CPU kernel path holds only [Q, ROW_ALIGN] scores
PASSAGE_BYTES = 32  # per (query, passage) of a chunk: cosine, min-max, fusion ranks (24 measured)
NODE_VECTORS = 5  # [N] vectors per query column: seeds, their permuted copy, the kernel's three
LANES = 8  # query columns are taken in multiples of this where the budget allows: the CPU
# kernel solves 8 float32 (4 float64) columns per SIMD pass, so a 2-column chunk costs the same
# sweep as an 8-column one
LINK_BYTES = 8  # per (entity, phrase) of a linking block
TIE_SLACK = 8  # raw candidates kept per query beyond k by the CPU fact top-k (see fact_topk)
HALF_TIE_SLACK = 32  # the same for float16 / bfloat16 facts, whose scores tie far more often
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # others: the torch path


@dataclass(frozen=True)
class ChunkPlan:
    """How one batch is cut to fit `RetrievalConfig.chunk_bytes` (see `plan_chunks`)."""

    query_cols: int  # queries per chunk of passage scores, seeds, PPR, fusion and top-k
    fact_rows: int  # fact-embedding rows per block of the fact top-k
    phrase_rows: int  # phrase-embedding rows per block of entity linking


def plan_chunks(index: Index, num_queries: int, cfg: RetrievalConfig,
                num_entities: int = 0) -> ChunkPlan:
    """Chunk sizes for a batch of `num_queries` queries (and entities) within the chunk budget
    (hippo_gpu.device.chunk_budget: cfg.chunk_bytes, or the device's default).

    A query column costs about NODE_VECTORS x itemsize x N (seeds and PPR state) plus
    PASSAGE_BYTES x P (scores, ranks) bytes, so c = budget / that (at least 1, at most Q); a
    fact row costs FACT_BYTES x Q, a phrase row LINK_BYTES x E (blockwise.block_rows: all rows
    when they fit, else aligned blocks). Everything fits at once on small indexes: one chunk.
    """
    budget = chunk_budget(cfg, index.device)
    itemsize = ppr_dtype(cfg).itemsize
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
              rows_per_block: int | None = None,
              compact: CompactFacts | None = None) -> tuple[Tensor, Tensor]:
    """The k best facts per query by min-max normalised cosine, ties by the lower fact row.

    s[q, f] = minmax_f(e_q · v_f) over all F facts; returns ([Q, K] float32 scores s, [Q, K]
    int64 fact rows), K = min(k, F), exactly `topk_stable(minmax_rows(E Vᵀ), k)` with E Vᵀ
    computed by `scores_against` (so the same bits for any batch, blocking or query order).

    CPU (numba kernel available, float32 / float16 / bfloat16 facts): one pass that reads each
    slab of ROW_ALIGN fact rows once per batch (`panel_slabs`: scores_against's own GEMMs, so
    the same raw scores r) and folds it into a running top-m of r (m = k + TIE_SLACK, ties by
    the lower row) and a running min and max per query (kernels/src/topk_cpu.py, RunningTopK).
    Never more than [Q, ROW_ALIGN] scores, whatever rows_per_block. Why the raw top-m suffices: the
    scaling g(r) = (r - lo) / (hi - lo) is monotone (each float operation is), so every fact
    outside the m candidates C has g <= u, the scaled value of C's lowest raw score. With t the
    k-th scaled value of C in (scaled desc, row asc) order: if u < t, every fact outside C
    scores below t, so the k best of all F facts are the k best of C, taken by sorting C's
    scaled values (the same float operations as minmax_rows, so the same bits) by (scaled
    desc, row asc). If u == t, facts outside C may tie with the k-th (two raw scores can scale
    to the same float); that query is redone exactly (rare: counted by the tests). A row
    whose facts all score the same is not redone: its k best are the first k rows, which are
    also C's (raw ties keep row order). (The kernel's min orders -0.0 below +0.0, torch's
    picks either: a score can differ from the torch path's only in the sign of a zero.)

    Elsewhere (CUDA, float64, no numba, or HIPPO_GPU_FORCE_TORCH): `_fact_topk_blocked`, one
    GEMM per block of `rows_per_block` fact rows and torch top-k.

    With `compact` (the int8 codes of float32 `fact_emb`), a batch of fewer than
    COMPACT_MAX_QUERIES queries on the kernel path reads the codes instead
    (hippo_gpu.retrieval.compact_facts: the same answer, bit for bit, by its proof); a query
    whose selection it cannot certify takes the path above.

    Args:
        query_emb: [Q, D] L2-normalised query vectors.
        fact_emb: [F, D] fact vectors (F >= 1; the index's dtype: scores are in it until
            normalised, as in the one-block path).
        rows_per_block: fact rows per block of [Q, rows] scores (None: all at once); on the
            CPU kernel path it bounds only the rare exact redo.
    """
    f = fact_emb.shape[0]
    size = f if rows_per_block is None else max(1, min(rows_per_block, f))
    if _kernel_path(query_emb, fact_emb, k):
        if compact is not None and query_emb.shape[0] < COMPACT_MAX_QUERIES and \
                fact_emb.dtype == torch.float32:
            return _fact_topk_compact(query_emb, fact_emb, k, size, compact)
        return _fact_topk_kernel(query_emb, fact_emb, k, size)
    return _fact_topk_blocked(query_emb, fact_emb, k, size)


def _fact_topk_compact(query_emb: Tensor, fact_emb: Tensor, k: int, size: int,
                       compact: CompactFacts) -> tuple[Tensor, Tensor]:
    """fact_topk of a few queries through the int8 codes, query by query; the queries whose
    selection is not certified take the kernel path together."""
    x = query_emb.to("cpu", torch.float32)
    answers = [compact_topk(x[i:i + 1], fact_emb, compact, k) for i in range(x.shape[0])]
    rest = [i for i, a in enumerate(answers) if a is None]
    if rest:
        val, row = _fact_topk_kernel(x[rest], fact_emb, k, size)
        for j, i in enumerate(rest):
            answers[i] = (val[j:j + 1], row[j:j + 1])
    return (torch.cat([a[0] for a in answers if a is not None]),
            torch.cat([a[1] for a in answers if a is not None]))


def _kernel_path(query_emb: Tensor, fact_emb: Tensor, k: int) -> bool:
    if fact_emb.device.type != "cpu" or fact_emb.dtype not in _KERNEL_DTYPES:
        return False
    if k < 1 or query_emb.shape[0] == 0 or fact_emb.shape[0] == 0:
        return False  # nothing to rank: the torch path's shapes and errors
    import hippo_gpu.kernels as kernels

    return kernels.AVAILABLE and not kernels.FORCE_TORCH


def _fact_topk_kernel(query_emb: Tensor, fact_emb: Tensor, k: int,
                      size: int) -> tuple[Tensor, Tensor]:
    """fact_topk on the CPU: one read of the facts, a running raw top-m (see fact_topk)."""
    from hippo_gpu.kernels.topk_cpu import RunningTopK

    dtype, q, f = fact_emb.dtype, query_emb.shape[0], fact_emb.shape[0]
    slack = TIE_SLACK if dtype == torch.float32 else HALF_TIE_SLACK
    state = RunningTopK(q, k + slack)
    as_f32 = None  # half-precision scores are widened (exactly) for the kernel
    for c, block in panel_slabs(query_emb.to("cpu", dtype), fact_emb):  # [Q', R] per slab
        if dtype != torch.float32:
            if as_f32 is None or as_f32.shape != block.shape:
                as_f32 = torch.empty(block.shape, dtype=torch.float32)
            block = as_f32.copy_(block)
        state.fold(block.numpy(), c)
    vals, rows, lo, hi = (torch.from_numpy(a) for a in state.result())
    lo, hi = lo.to(dtype).unsqueeze(1), hi.to(dtype).unsqueeze(1)  # exact: they are scores
    scaled = scale_rows(vals.to(dtype), lo, hi).float()  # [Q, C], C = min(m, F), raw desc
    by_row = torch.argsort(rows, dim=1)  # then a stable sort by scaled: (scaled desc, row asc)
    cand_val, cand_row = scaled.gather(1, by_row), rows.gather(1, by_row)
    order = torch.sort(cand_val, dim=1, descending=True, stable=True).indices[:, :min(k, f)]
    best_val, best_row = cand_val.gather(1, order), cand_row.gather(1, order)
    if rows.shape[1] < f:  # C is not every fact: check the cut (u == t: redo exactly)
        redo = (scaled[:, -1] == best_val[:, -1]) & ((hi - lo) > 0).squeeze(1)
        if bool(redo.any()):
            at = redo.nonzero().squeeze(1)
            aligned = f if size >= f else max(ROW_ALIGN, size - size % ROW_ALIGN)
            val, row = _fact_topk_blocked(query_emb[at], fact_emb, k, aligned,
                                          (lo[at], hi[at]))
            best_val[at], best_row[at] = val, row
    return best_val, best_row


def _fact_topk_blocked(query_emb: Tensor, fact_emb: Tensor, k: int, size: int,
                       bounds: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """fact_topk in blocks of `size` fact rows, torch top-k (any device).

    With size < F it never holds more than [Q, size] scores: a first pass over the fact
    blocks takes each query's min and max (skipped when `bounds` gives them, [Q, 1] each), a
    second scales each block with them (minmax_rows' own float operations, so the same values)
    and merges its top-k into a running top-k. The merge keeps the tie order: the running
    top-k comes first in the concatenation, holds only lower rows than the block and is sorted
    by (score desc, row asc), so topk_stable's "lower column among ties" is the lower row.
    """
    f = fact_emb.shape[0]
    if size >= f and bounds is None:
        return topk_stable(minmax_rows(scores_against(query_emb, fact_emb)).float(), k)
    blocks = spans(f, size)
    if bounds is None:
        (a0, b0), *rest = blocks
        raw = scores_against(query_emb, fact_emb[a0:b0])  # [Q, rows] in the index dtype
        lo = raw.min(dim=1, keepdim=True).values
        hi = raw.max(dim=1, keepdim=True).values
        for a, b in rest:  # pass 1: per-query min and max over all facts (exact in any order)
            raw = scores_against(query_emb, fact_emb[a:b])
            lo = torch.minimum(lo, raw.min(dim=1, keepdim=True).values)
            hi = torch.maximum(hi, raw.max(dim=1, keepdim=True).values)
        del raw
    else:
        lo, hi = bounds
    (a0, b0), *rest = blocks
    best_val, best_row = topk_stable(
        scale_rows(scores_against(query_emb, fact_emb[a0:b0]), lo, hi).float(), k)
    for a, b in rest:  # pass 2: scale with the global bounds, merge into the running top-k
        scaled = scale_rows(scores_against(query_emb, fact_emb[a:b]), lo, hi).float()
        val, row = topk_stable(scaled, k)
        best_val, pos = topk_stable(torch.cat([best_val, val], dim=1), k)
        best_row = torch.cat([best_row, row + a], dim=1).gather(1, pos)
    return best_val, best_row


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


def phrase_seeds(
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
                  cos: Tensor, cfg: RetrievalConfig, *, mode: Mode = HIPPORAG2,
                  dtype: torch.dtype = torch.float32) -> Tensor:
    """The [N, Q] PPR reset vectors: phrase seeds from the kept facts plus a passage part.

    prior "minmax" (hipporag2, upstream §3.3.6): r = w_phrase + passage_node_weight *
    minmax(cos) at passages.
    prior "softmax" (hybrid): r = w_phrase / 1ᵀw_phrase + hybrid_passage_node_weight *
    softmax(T * cos).

    Args:
        cand_rows, cand_scores, kept: [Q, L] candidate facts, min-max scores, kept mask.
        cos: [Q, P] query-passage cosine.
    """
    sq, sp, sw = phrase_seeds(index, cand_rows, cand_scores.to(dtype), kept, mode.link_k(cfg))
    seeds = torch.zeros((index.num_nodes, cand_rows.shape[0]), dtype=dtype, device=cos.device)
    seeds.index_put_((sp, sq), sw.to(dtype), accumulate=True)
    if mode.prior == "softmax":  # phrase part sums to 1; passage prior: a sharp softmax over cosine
        seeds /= seeds.sum(dim=0, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        prior = torch.softmax(cfg.hybrid_temperature * cos.to(dtype), dim=1)
        seeds[index.passage_nodes] += (cfg.hybrid_passage_node_weight * prior).T
    else:
        seeds[index.passage_nodes] += (cfg.passage_node_weight * minmax_rows(cos.to(dtype))).T
    return seeds


def leading_block(adj: Tensor, m: int) -> Tensor:
    """adj[:m, :m] of a sparse CSR matrix (the phrase-only graph: phrase rows come first)."""
    coo = adj.to_sparse_coo().coalesce()
    r, c = coo.indices()
    keep = (r < m) & (c < m)
    sub = torch.sparse_coo_tensor(torch.stack([r[keep], c[keep]]), coo.values()[keep], (m, m),
                                  check_invariants=False)
    return sub.coalesce().to_sparse_csr()
