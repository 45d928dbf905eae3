"""The int8 first pass of a lone query's fact scan (numba), behind
:mod:`hippo_gpu.retrieval.compact_facts` (which states the bounds and proves the selection).

`bounded_scan` reads every fact row's int8 codes once: the exact int32 dot product with the
query's codes gives a_f = σ_e σ_f z_f, and the row's bound B_f = α ε_f + β (σ_f n_f) + γ ‖v_f‖
(α, β, γ the query's coefficients) gives L_f = a_f − B_f and U_f = a_f + B_f. In the same pass
it keeps the k largest L (t, the k-th, only grows), the least U (it only falls), and two short
candidate lists: the rows whose U reaches the running t (the final C is among them, since the
final t is at least the running one) and the rows whose L is at most the running least U (the
final M is among them); a row rejected on the way has U below the final t. The lists are then
cut to the final t and least U, and the largest U of a row left out of C is returned.
"""

from __future__ import annotations

import numpy as np
from hippo_gpu.kernels.topk_cpu import _insert
from numba import njit

__all__ = ["bounded_scan"]


@njit(nogil=True, cache=True, inline="always")
def _append(rows, values, n, row, value):
    """Append (row, value) to the candidate list of length n; -1 when it is full."""
    if n < 0 or n >= rows.shape[0]:
        return -1
    rows[n] = row
    values[n] = value
    return n + 1


@njit(nogil=True, cache=True, boundscheck=False)
def bounded_scan(codes, query_codes, scale, scaled_l1, eps, norm, s_e, alpha, beta, gamma, k,
                 top_low, c_rows, c_up, m_rows, m_low):
    """Fill top_low[:k] (descending) and the candidate lists (module docstring); returns
    (|C|, |M|, the largest U outside C (-inf: none), overflowed: a list outgrew its buffer,
    so the caller takes the full scan)."""
    f_rows, dim = codes.shape
    q16 = query_codes.astype(np.int16)
    low_rows = np.empty(k, np.int64)  # _insert's ids (unused: only the k-th value counts)
    n_low = 0
    least_up = np.inf
    out_up = -np.inf
    n_c = 0
    n_m = 0
    overflow = False
    for f in range(f_rows):
        acc = np.int32(0)
        for d in range(dim):
            acc += np.int16(codes[f, d]) * q16[d]
        a = s_e * scale[f] * np.float64(acc)
        b = (alpha * eps[f] + beta * scaled_l1[f] + gamma * norm[f]) * (1.0 + 1e-9) + 1e-300
        low = a - b
        up = a + b
        if n_low < k or low > top_low[k - 1]:  # the k largest lower bounds, descending
            n_low = _insert(top_low, low_rows, n_low, k, low, f)
        if up < least_up:
            least_up = up
        if n_low < k or up >= top_low[k - 1]:
            n_c = _append(c_rows, c_up, n_c, f, up)
            overflow |= n_c < 0
        elif up > out_up:
            out_up = up
        if low <= least_up:
            n_m = _append(m_rows, m_low, n_m, f, low)
            overflow |= n_m < 0
        if overflow:
            break
    cut = top_low[k - 1]
    kept = 0
    for i in range(n_c):  # the final C: U >= the final t
        if c_up[i] >= cut:
            c_rows[kept] = c_rows[i]
            kept += 1
        elif c_up[i] > out_up:
            out_up = c_up[i]
    n_c = kept
    kept = 0
    for i in range(n_m):  # the final M: L <= the final least U
        if m_low[i] <= least_up:
            m_rows[kept] = m_rows[i]
            kept += 1
    return n_c, kept, out_up, overflow
