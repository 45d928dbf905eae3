"""Insertion-buffer top-k kernels (numba) over float32 score blocks.

* `top_p_rows`: per-row top-p column ids of one score block, behind
  :func:`hippo_gpu.indexing.cosine_join.nearest_lists` on the CPU.
* `RunningTopK`: a running top-m and min/max per query, fed one slab of scores at a time,
  behind :func:`hippo_gpu.retrieval.seeds.fact_topk` on the CPU (the fact stage reads each fact slab
  once per query batch and never holds [Q, F] scores).

torch.topk runs at ~0.2-0.4 G scores/s on 2 cores for p = 16-64 of C = 2k-12k columns (its
per-row selection is generic); a row's p best change rarely after the first few hundred columns,
so an insertion buffer that rejects most scores with one comparison against its current p-th
value runs several times faster. Each row keeps its p best in descending order; a score equal to
the p-th is rejected and equal scores keep column order, so the result is deterministic (the
lowest column wins a tie) and independent of how rows are split among threads. NaN scores are
skipped by `top_p_rows`; a row with fewer than p other scores pads its ids with -1.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

__all__ = ["RunningTopK", "top_p_rows"]


@njit(nogil=True, cache=True, inline="always")
def _insert(vals, ids, n, p, v, j):
    """Insert score v with id j into the n-long descending buffer vals/ids of capacity p (the
    caller has checked that v enters: n < p or v > vals[p - 1]); returns the new length. Equal
    scores keep their arrival order (the strict < stops at an equal one)."""
    k = n if n < p else p - 1
    while k > 0 and vals[k - 1] < v:
        if k < p:
            vals[k] = vals[k - 1]
            ids[k] = ids[k - 1]
        k -= 1
    vals[k] = v
    ids[k] = j
    return n + 1 if n < p else n


@njit(nogil=True, cache=True)
def _top_p(sim, p, out, start, stop):  # sim [B, C] float32, out [B, p] int32
    c = sim.shape[1]
    vals = np.empty(p, dtype=np.float32)
    ids = np.empty(p, dtype=np.int32)
    for i in range(start, stop):
        row = sim[i]
        n = 0
        for j in range(c):
            v = row[j]
            if v != v or (n == p and not v > vals[p - 1]):  # NaN never enters
                continue
            n = _insert(vals, ids, n, p, v, j)
        for k in range(p):
            out[i, k] = ids[k] if k < n else -1


def top_p_rows(sim: np.ndarray, p: int, out: np.ndarray, threads: int = 1) -> np.ndarray:
    """out[i] = the ids of the p largest sim[i, :], best first (ties: lower id first).

    sim: [B, C] float32 C-contiguous; out: [B, p] int32; rows split into `threads` ranges.
    """
    if sim.dtype != np.float32 or not sim.flags.c_contiguous or sim.ndim != 2:
        raise ValueError("sim must be a C-contiguous [B, C] float32 array")
    b = sim.shape[0]
    if out.shape != (b, p) or out.dtype != np.int32:
        raise ValueError(f"out must be [{b}, {p}] int32, got {out.shape} {out.dtype}")
    if p < 1 or p > sim.shape[1]:
        raise ValueError(f"p must be in [1, {sim.shape[1]}], got {p}")
    if threads <= 1 or b < 2 * threads:
        _top_p(sim, p, out, 0, b)
        return out
    cuts = np.linspace(0, b, threads + 1).astype(np.int64)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda i: _top_p(sim, p, out, int(cuts[i]), int(cuts[i + 1])),
                      range(threads)))
    return out


# Order keys of float32 bit patterns: key(x) = bits ^ ((bits >> 31) & 0x7fffffff) is a signed
# integer increasing with x for every non-NaN float (-0.0 sorts just below +0.0) and is its own
# inverse. Integer min/max reductions vectorise without fast-math (they are exact in any order),
# float ones do not, so the per-slab min and max are taken on keys (~3.4 G scores/s, 1 thread).
_MASK31 = 0x7FFFFFFF


@njit(nogil=True, cache=True)
def _fold_slab(scores, keys, nq, row0, vals, vkeys, rows, fill, lo, hi):
    # scores [Qp, R] float32, keys: the same memory as int32; state of queries i < nq:
    # vals [Q, m] float32 (descending; vkeys: its int32 view), rows [Q, m] int64,
    # fill [Q] int64 (entries used), lo / hi [Q] int64 order keys of the running min / max
    r = scores.shape[1]
    m = vals.shape[1]
    for i in range(nq):
        krow = keys[i]
        a = lo[i]
        top = hi[i]
        slab_top = -(1 << 40)
        for j in range(r):  # vectorised: integer min / max of the keys
            x = krow[j]
            key = x ^ ((x >> 31) & _MASK31)
            a = key if key < a else a
            slab_top = key if key > slab_top else slab_top
        lo[i] = a
        hi[i] = slab_top if slab_top > top else top
        n = fill[i]
        if n == m:  # full: only a slab holding a score above the m-th can change the buffer
            x = vkeys[i, m - 1]
            if not slab_top > (x ^ ((x >> 31) & _MASK31)):
                continue
        row = scores[i]
        best = vals[i]
        ids = rows[i]
        for j in range(r):  # rows ascending: an equal score later keeps the earlier row first
            v = row[j]
            if n == m and not v > best[m - 1]:
                continue
            n = _insert(best, ids, n, m, v, row0 + j)
        fill[i] = n


def _key_to_float(key: np.ndarray) -> np.ndarray:
    """Inverse of the order key: int64 keys in int32 range -> float32 values."""
    x = key.astype(np.int32)
    return (x ^ ((x >> 31) & np.int32(_MASK31))).view(np.float32)


class RunningTopK:
    """Per query: the m largest scores seen so far (ties: the lower row first) and min / max.

    Fed slabs of a [Q, F] score matrix in ascending row order, `fold(scores, row0)` with
    scores [Qp >= Q, R] float32 C-contiguous holding rows row0 .. row0 + R - 1 (rows past Q are
    padding and ignored); the state after the last slab is that of one scan of all F rows, so it
    does not depend on the slab sizes. Scores must hold no NaN. `result()` returns
    (vals [Q, c] float32 descending, rows [Q, c] int64, lo [Q] float32, hi [Q] float32) with
    c = min(m, rows seen).
    """

    def __init__(self, num_queries: int, m: int) -> None:
        if num_queries < 0 or m < 1:
            raise ValueError(f"need num_queries >= 0 and m >= 1, got {num_queries}, {m}")
        self.num_queries = num_queries
        self.vals = np.zeros((num_queries, m), dtype=np.float32)
        self.rows = np.zeros((num_queries, m), dtype=np.int64)
        self.fill = np.zeros(num_queries, dtype=np.int64)
        self.lo = np.full(num_queries, np.iinfo(np.int32).max, dtype=np.int64)
        self.hi = np.full(num_queries, np.iinfo(np.int32).min, dtype=np.int64)
        self.seen = 0

    def fold(self, scores: np.ndarray, row0: int) -> None:
        """Take rows row0 .. row0 + R - 1 of every query's scores (row0: the rows seen so far)."""
        if scores.dtype != np.float32 or scores.ndim != 2 or not scores.flags.c_contiguous:
            raise ValueError("scores must be a C-contiguous [Qp, R] float32 array")
        if scores.shape[0] < self.num_queries or row0 != self.seen:
            raise ValueError(f"scores [{scores.shape[0]}, R] from row {row0}: need >= "
                             f"{self.num_queries} rows, from row {self.seen}")
        _fold_slab(scores, scores.view(np.int32), self.num_queries, row0, self.vals,
                   self.vals.view(np.int32), self.rows, self.fill, self.lo, self.hi)
        self.seen += scores.shape[1]

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        c = min(self.vals.shape[1], self.seen)
        return (self.vals[:, :c], self.rows[:, :c], _key_to_float(self.lo),
                _key_to_float(self.hi))
