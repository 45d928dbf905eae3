"""Ranking primitives shared by every mode: min-max scaling, a deterministic top-k, exact integer
ranks and the concatenation of per-chunk top-k results. Pure tensor functions, any device.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["cat_topk", "minmax_rows", "ranks_of", "scale_rows", "topk_stable"]


def minmax_rows(x: Tensor) -> Tensor:
    """Row-wise (x - min) / (max - min); a row with zero range becomes all ones (as upstream)."""
    return scale_rows(x, x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values)


def scale_rows(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """(x - lo) / (hi - lo) per row with given [Q, 1] bounds (minmax_rows' float operations)."""
    rng = hi - lo
    scaled = (x - lo) / torch.where(rng > 0, rng, torch.ones_like(rng))
    return torch.where(rng > 0, scaled, torch.ones_like(x))


def topk_stable(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k per row, descending, ties broken by the lower column index, on every device.

    The selection S of a row is every entry > v, plus the lowest-indexed entries == v until k
    are taken, v its k-th largest value; S is returned sorted by (value desc, index asc). The
    result does not depend on the device, the batch or the run. Rows must hold no NaN.

    `torch.topk` gives the k largest values exactly but leaves open which of several entries
    equal to v it selects. So it is asked for k + 1: where the (k+1)-th largest value is below
    v, exactly k entries are >= v, so its first k indices are S itself. Those rows keep them,
    sorted; only the rows whose (k+1)-th value equals v (a tie at the cut, rare with float
    scores; -0.0 and 0.0 count as equal) take the exact cut (`_cut_at`, a cumulative count over
    the row). A clean row costs one topk instead of it, five passes and a cumulative sum
    (benchmarks/bench_topk.py).
    """
    q, n = scores.shape
    k = min(k, n)
    if k == 0 or q == 0:
        empty = scores.new_zeros((q, 0))
        return empty, empty.long()
    top_vals, idx = torch.topk(scores, min(k + 1, n), dim=1)
    kth = top_vals[:, k - 1:k]  # [Q, 1] the k-th largest value
    idx = idx[:, :k].sort(dim=1).values  # ascending column index per row
    if k < n:  # (k == n: every entry is taken, nothing can spill)
        spill = top_vals[:, k] == top_vals[:, k - 1]  # [Q] a tie at the cut
        if bool(spill.any()):
            rows = spill.nonzero()[:, 0]
            idx[rows] = _cut_at(scores[rows], kth[rows], k)
    vals = scores.gather(1, idx)
    by_val = torch.sort(vals, dim=1, descending=True, stable=True)
    return by_val.values, idx.gather(1, by_val.indices)


def _cut_at(scores: Tensor, kth: Tensor, k: int) -> Tensor:
    """[R, k] ascending column indices of S (topk_stable) for rows whose k-th largest value is
    `kth` [R, 1]: every entry > kth, then the lowest-indexed entries == kth until k."""
    above = scores > kth
    tied = scores == kth
    need = k - above.sum(dim=1, keepdim=True)  # how many of the tied entries to take
    take = above | (tied & (torch.cumsum(tied, dim=1) <= need))  # exactly k per row
    return take.nonzero()[:, 1].reshape(scores.shape[0], k)  # row-major: ascending per row


def ranks_of(scores: Tensor) -> Tensor:
    """[Q, P] -> int64 0-based rank of each entry in its row (descending; ties by lower index).

    Integer ranks are exact for any P (a float32 rank would be exact only below 2^24).
    """
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(scores.shape[1], device=scores.device).expand_as(order))
    return ranks


def cat_topk(parts: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Concatenate per-chunk (scores [c, K], rows [c, K]) along the queries."""
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
