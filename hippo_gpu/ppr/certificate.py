"""When a PPR column may stop, and what it reports: the certificates of the iterations in
hippo_gpu.ppr.iteration (whose module docstring states and proves them).

* :func:`classify`: at a checked step, the open columns' bounds with the output rounding ω
  against ``tol`` ("Certified stopping bound" (3) there), the top-k certificate ("Certified
  top-k exit"), the stall rule and the float64 re-check ("Round-off floor", rules 1-2);
* :class:`Float64Check`: rule 1, a float32 certificate re-checked on the float64 residual;
* :func:`topk_certified`: the top k and their order are the exact solution's;
* :func:`stall_steps`: rule 2's patience, from the damping alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["Float64Check", "check_top_k", "classify", "stall_steps", "topk_certified"]


def stall_steps(damping: float) -> int:
    """Steps without the bound halving after which a column is at its round-off floor: in exact
    arithmetic it halves at least every ⌈ln 2 / ln(1/d)⌉ steps (iteration.py's docstring)."""
    if damping <= 0.0:
        return 8
    return max(8, 4 * math.ceil(math.log(2.0) / -math.log(damping)))


def check_top_k(top_k: int | None) -> int:
    if top_k is None:
        return 0
    if int(top_k) != top_k or top_k < 1:
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    return int(top_k)


def classify(k: int, solve: Tensor, err: Tensor, base: Tensor, y: Tensor, g: Tensor,
              halved: Tensor, halved_at: Tensor, refuted: Tensor, *, tol: float, omega: float,
              top_k: int, target_rows: Tensor | None, patience: int,
              check: Float64Check | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(certified, stalled, bound, halved, halved_at, refuted) of the open columns at a checked
    step k from their solve bounds [Q'] (float64, without ω): the bound with ω against tol or
    the top-k certificate, the halving record of the stall rule (on the solve bound: ω does not
    halve), and (``check``) the float64 re-check of every float32 certificate (module
    docstring, "Round-off floor"): a refuted column iterates on, and counts as stalled after
    ``patience`` refutations. ``bound`` is what a finishing column reports."""
    now = solve + omega
    ok = now <= tol
    if top_k:
        ok |= topk_certified(g, target_rows, top_k, err)
    halving = solve <= 0.5 * halved
    halved = torch.where(halving, solve, halved)
    halved_at = torch.where(halving, k, halved_at)
    stall = ~ok & (k - halved_at >= patience)  # at the round-off floor
    if check is not None and bool(ok.any()):
        held = check.verify(base, y, g, ok, now, tol, top_k, target_rows)
        refuted = refuted + (ok & ~held).to(refuted.dtype)
        stall |= ok & ~held & (refuted >= patience)
        ok &= held
    return ok, stall, now, halved, halved_at, refuted


class Float64Check:
    """The float64 re-check of float32 certificates (iteration.py's docstring, "Round-off floor", 1)
    against ``matrix`` (M₆₄, float64 CSR), with ω and the inflation of the result."""

    def __init__(self, matrix: Tensor, damping: float, omega: float, grow: float) -> None:
        crow = matrix.crow_indices()
        deg_max = int((crow[1:] - crow[:-1]).max()) if matrix.shape[0] else 0
        self.matrix, self.damping, self.omega, self.grow = matrix, damping, omega, grow
        d = damping
        # ε₆₄/(1−d) for the float64 step, 2⁻²³ for r̂ and (1−d) r̂ rounded into float32
        self.slack = (deg_max + 4) * 2.0 ** -52 / (1.0 - d) + 2.0 ** -23

    def verify(self, base: Tensor, y: Tensor, g: Tensor, ok: Tensor, now: Tensor, tol: float,
               top_k: int, target_rows: Tensor | None) -> Tensor:
        """[Q'] bool: which ``ok`` columns keep their certificate on the float64 residual;
        ``now`` (float64) gets their float64 bounds, ω included (in place).

        With g₆₄ = (1−d) r̂ + d M₆₄ y in float64 (base = (1−d) r̂ as stored),
        ‖g − y*‖₁ ≤ ‖g − g₆₄‖₁ + d/(1−d) ‖g₆₄ − y‖₁ + ``slack`` (iteration.py's docstring).
        """
        d = self.damping
        idx = torch.nonzero(ok).flatten()
        y64 = y.index_select(1, idx).double()
        g32 = g.index_select(1, idx).double()
        g64 = torch.addmm(base.index_select(1, idx).double(), self.matrix, y64, beta=1.0,
                          alpha=d)
        err = (g32 - g64).abs().sum(dim=0) + d / (1 - d) * (g64 - y64).abs().sum(dim=0) \
            + self.slack
        err = err * self.grow  # the float64 sums over N rows it was computed from
        mass = g32.sum(dim=0)
        bound = torch.where(mass > 0, 2.0 * err / mass * self.grow, math.inf) + self.omega
        held = bound <= tol
        if top_k:
            held |= topk_certified(g.index_select(1, idx), target_rows, top_k, err)
        now[idx] = bound
        out = torch.zeros_like(ok)
        out[idx] = held
        return out


def topk_certified(z: Tensor, rows: Tensor | None, k: int, eps: Tensor) -> Tensor:
    """[Q'] bool: every consecutive gap among the k + 1 largest ``z[rows]`` exceeds ``eps``.

    ``eps`` [Q'] bounds ‖z − z*‖₁ per column, so the top k and their order are those of z*
    (iteration.py's docstring, "Certified top-k exit"). The gaps are taken in float64, where the
    difference of two float32 scores is exact.
    """
    vals = z if rows is None else z.index_select(0, rows)  # [T, Q']
    m = min(k + 1, vals.shape[0])
    if m < 2:
        return torch.ones(z.shape[1], dtype=torch.bool, device=z.device)
    top = vals.topk(m, dim=0).values.to(torch.float64)  # [m, Q'], descending
    return ((top[:-1] - top[1:]) > eps.to(torch.float64)).all(dim=0)
