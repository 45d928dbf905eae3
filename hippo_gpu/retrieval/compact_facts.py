"""A lone query's fact scan on int8 codes, with the float32 scan's exact answer.

`seeds.fact_topk` ranks all F facts of a query e by s_f = minmax_f(r_f), r_f the float32 score
of e against fact row v_f as `blockwise.scores_against` computes it (fixed-shape GEMMs: one
8-query panel per 1,024-row slab, whatever the batch). A query alone pays for the padded panel
and reads 4 bytes per dimension of every fact row; here it reads 1, and gets the same k rows
and the same bits.

**Codes.** Each fact row is kept as int8 codes c_f = round(v_f / σ_f), σ_f = max_d |v_fd| / 127
(a zero row: codes 0, σ_f = 1), with n_f = ‖c_f‖₁ and ε_f ≥ ‖v_f − σ_f c_f‖∞ (measured per row,
widened for its float64 rounding); the query likewise (c_e, σ_e, n_e, ε_e). The first pass takes
the integer dot products z_f = c_e · c_f, exact in int32 (|z_f| ≤ 127² D), and a_f = σ_e σ_f z_f.

**Bound.** With e = σ_e c_e + δ_e and v_f = σ_f c_f + δ_f (‖δ‖∞ ≤ ε),

    e·v_f − σ_e σ_f z_f = σ_e c_e·δ_f + σ_f δ_e·c_f + δ_e·δ_f,
    so |e·v_f − a*_f| ≤ σ_e n_e ε_f + σ_f n_f ε_e + D ε_e ε_f,                         (Q1)

and the float32 GEMM's r_f, a sum of D rounded products in any order, with or without FMA,
is within γ_D Σ_d |e_d v_fd| ≤ γ_D ‖e‖₂ ‖v_f‖₂ of e·v_f (γ_D = D u / (1 − D u), u = 2⁻²⁴;
Cauchy–Schwarz). B_f is the sum of both, widened by 10⁻⁹ of itself, which covers the float64
rounding of a_f and of B_f (B_f ≥ γ_D‖e‖‖v_f‖ ≫ 2⁻⁵³|a_f|). So L_f ≤ r_f ≤ U_f with
L_f = a_f − B_f and U_f = a_f + B_f, for every fact.

**Selection.** Let t be the k-th largest L_f and C = {f : U_f ≥ t}. The k facts of largest r
each have r ≥ (the k-th largest r) ≥ t, as r ≥ L elementwise, so they lie in C (U ≥ r ≥ t);
every fact outside C has r_f ≤ U_f < t. The fact of least r has L ≤ r ≤ min_g U_g, so it lies
in M = {f : L_f ≤ min_g U_g}. The rows of C ∪ M are re-scored exactly: `scores_against` of the
query against each 1,024-row slab holding one, the full scan's own GEMM shape and operands, so
the same bits. Then hi = max r over C is the global maximum, lo = min r over M the global
minimum, and the scaled values of C are `scale_rows`' float operations on the same operands:
the full scan's bits. C's k best by (scaled desc, row asc) are the full scan's k best when no
fact outside C can scale to the k-th value or above: every such r is at most w, the largest
float32 not above max_{f ∉ C} U_f, and scaling is monotone, so it suffices that
scale(w) < the k-th scaled value. Where that fails (a tie the scaling may make, a zero range),
or k ≥ F, the query takes the full scan: rare, and the answer is the same either way.

Whether a batch takes this path or the full scan is a matter of speed only (the answers are
equal): the Searcher sends batches of fewer than COMPACT_MAX_QUERIES queries here, where the
padded 8-query panel is mostly zeros, on fact tables of at least COMPACT_MIN_ROWS rows. The
codes cost D + 32 bytes per fact beside its 4 D bytes of float32, made once per Searcher in
the background after its first small batch (`CompactFacts.of`: ~2 s for 900k facts here).
Its cost on the 100k synthetic index is the facts stage of hipporag2 at Q = 1 in
benchmarks/results/bench_scale.jsonl; the floors of one read of the float32 and int8 rows and of
the int8 dot products alone are in bench_compact_floor.jsonl.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hippo_gpu.retrieval.blockwise import ROW_ALIGN, scores_against
from hippo_gpu.retrieval.ranking import scale_rows

__all__ = ["COMPACT_MAX_QUERIES", "COMPACT_MIN_ROWS", "CompactFacts", "compact_topk"]

COMPACT_MAX_QUERIES = 3  # 1 or 2 queries: at least 6 of the padded 8-query panel are zeros
# The re-score reads the slabs holding a candidate (16 of 879 for a lone query on 900k random
# facts): the codes pay only where those are a small part of the table, from 128 slabs on
# (measured here at D = 64: even at 64 slabs, slower at 17k facts of D = 384, 2x faster at 200k)
COMPACT_MIN_ROWS = 128 * ROW_ALIGN
CANDIDATES = 1 << 14  # capacity of each candidate list (more: the query takes the full scan)
U32 = 2.0 ** -24
U64 = 2.0 ** -53


def _codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                   np.ndarray]:
    """(codes [n, D] int8, σ [n], n = ‖c‖₁ [n], ε ≥ ‖x − σc‖∞ [n], ‖x‖₂ upper bound [n]) of
    the float32 rows `x`, in float64."""
    x64 = x.astype(np.float64)
    peak = np.abs(x64).max(axis=1)
    scale = np.where(peak > 0, peak / 127.0, 1.0)
    codes = np.clip(np.rint(x64 / scale[:, None]), -127, 127).astype(np.int8)
    resid = np.abs(x64 - scale[:, None] * codes).max(axis=1)
    eps = resid * (1.0 + 1e-12) + 4 * U64 * peak  # the float64 residual's own rounding
    l1 = np.abs(codes.astype(np.int32)).sum(axis=1).astype(np.float64)
    norm = np.sqrt((x64 * x64).sum(axis=1)) * (1.0 + 1e-12)
    return codes, scale, l1, eps, norm


@dataclass(frozen=True)
class CompactFacts:
    """The int8 codes of an index's float32 fact rows (module docstring), on the CPU."""

    codes: np.ndarray  # [F, D] int8
    scale: np.ndarray  # [F] σ_f
    scaled_l1: np.ndarray  # [F] ≥ σ_f n_f
    eps: np.ndarray  # [F] ε_f
    norm: np.ndarray  # [F] ≥ ‖v_f‖₂

    @classmethod
    def of(cls, fact_emb: Tensor) -> CompactFacts:
        """Codes of `fact_emb` ([F, D] float32 on the CPU), made in blocks of rows."""
        x = fact_emb.numpy()
        parts = [_codes(x[a:a + (1 << 16)]) for a in range(0, x.shape[0], 1 << 16)]
        if not parts:
            parts = [_codes(x)]
        codes, scale, l1, eps, norm = (
            np.ascontiguousarray(np.concatenate([p[i] for p in parts])) for i in range(5))
        return cls(codes, scale, scale * l1 * (1.0 + 4 * U64), eps, norm)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.codes, self.scale, self.scaled_l1, self.eps,
                                      self.norm))


def compact_topk(query: Tensor, fact_emb: Tensor, compact: CompactFacts,
                 k: int) -> tuple[Tensor, Tensor] | None:
    """(the [1, k] scaled scores, [1, k] fact rows) of `seeds.fact_topk` for one query ([1, D]
    float32 on the CPU) through the int8 codes, or None where the selection cannot be
    certified (the caller then takes the full scan; module docstring)."""
    from hippo_gpu.kernels.compact_cpu import bounded_scan

    f, dim = compact.codes.shape
    if k >= f:
        return None
    e = query[0].numpy()
    c_e, s_e, n_e, eps_e, norm_e = (a[0] for a in _codes(e[None, :]))
    gamma_d = dim * U32 / (1.0 - dim * U32)
    # B_f = ε_f (σ_e n_e + D ε_e) + ε_e (σ_f n_f) + γ_D ‖e‖ ‖v_f‖, coefficients rounded up
    up = 1.0 + 8 * U64
    alpha = (float(s_e) * float(n_e) + dim * float(eps_e)) * up
    beta, gamma = float(eps_e) * up, gamma_d * float(norm_e) * up
    top_low = np.empty(k)
    c_rows, c_up = np.empty(CANDIDATES, np.int64), np.empty(CANDIDATES)
    m_rows, m_low = np.empty(CANDIDATES, np.int64), np.empty(CANDIDATES)
    n_top, n_min, left_out, overflow = bounded_scan(
        compact.codes, c_e, compact.scale, compact.scaled_l1, compact.eps, compact.norm,
        float(s_e), alpha, beta, gamma, k, top_low, c_rows, c_up, m_rows, m_low)
    if overflow:
        return None
    top_rows, min_rows = c_rows[:n_top], m_rows[:n_min]
    raw = _exact_scores(query, fact_emb, np.union1d(top_rows, min_rows))
    lo = torch.tensor([[_extreme([raw[int(r)] for r in min_rows], lowest=True)]])
    hi = torch.tensor([[_extreme([raw[int(r)] for r in top_rows], lowest=False)]])
    if not bool(hi > lo):
        return None  # a zero range: every fact scales to 1 (the full scan takes rows 0..k-1)
    rows = torch.from_numpy(top_rows)  # ascending
    vals = torch.tensor([[raw[int(r)] for r in top_rows]], dtype=torch.float32)
    scaled = scale_rows(vals, lo, hi).float()
    order = torch.sort(scaled, dim=1, descending=True, stable=True).indices[:, :k]
    best_val, best_row = scaled.gather(1, order), rows[order[0]].unsqueeze(0)
    if left_out > -math.inf:  # no fact outside C may scale to the k-th value
        w = np.float32(left_out)
        if float(w) > left_out:
            w = np.nextafter(w, np.float32(-np.inf))
        reach = scale_rows(torch.tensor([[float(w)]], dtype=torch.float32), lo, hi).float()
        if not bool(reach[0, 0] < best_val[0, -1]):
            return None
    return best_val, best_row


def _extreme(values: list[float], *, lowest: bool) -> float:
    """The least (greatest) of `values`, a zero taking the sign the full scan's kernel gives it
    (RunningTopK orders -0.0 below 0.0): every fact at the extreme is among `values`."""
    best = min(values) if lowest else max(values)
    if best == 0.0:
        signs = {math.copysign(1.0, v) for v in values if v == 0.0}
        best = (-0.0 if -1.0 in signs else 0.0) if lowest else (0.0 if 1.0 in signs else -0.0)
    return best


def _exact_scores(query: Tensor, fact_emb: Tensor, rows: np.ndarray) -> dict[int, float]:
    """The full scan's float32 scores of `rows`: scores_against over each ROW_ALIGN slab that
    holds one (the scan's own GEMM shape and operands)."""
    out: dict[int, float] = {}
    for slab in np.unique(rows // ROW_ALIGN):
        a = int(slab) * ROW_ALIGN
        block = scores_against(query, fact_emb[a:a + ROW_ALIGN])[0]
        for r in rows[(rows >= a) & (rows < a + ROW_ALIGN)]:
            out[int(r)] = float(block[int(r) - a])
    return out
