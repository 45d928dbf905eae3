"""The rounding of what a certificate covers: every PPR bound is of the vector *returned*, so it
adds the rounding of that vector, and a tol below that rounding is refused before any step.

**The term (R1).** A solver certifies ‖x − x*‖₁ ≤ ε for a vector x it holds exactly: v ≥ 0
[n] (the iterate clamped at 0, exact values of its dtype) scaled to sum 1, x = v / σ with
σ = Σ v. What it returns is x̂, x computed and rounded into the result's dtype, whose unit
round-off u is 2⁻²⁴ (float32), 2⁻⁵³ (float64), 2⁻¹¹ (float16) or 2⁻⁸ (bfloat16). So the
certificate of x̂ is ε + ‖x̂ − x‖₁, and :func:`normalise` (the torch paths) and the CPU kernel's
emit (kernels/src/ppr_cpu.py) compute x̂ so that ‖x̂ − x‖₁ has a small, proven bound:

* s, the float64 sum of v, is pairwise (:func:`pairwise_sum`: depth ⌈log₂ n⌉; the kernel's
  binary-counter sum, depth ≤ 2⌈log₂ n⌉ + 1): every term goes through at most
  k = 2⌈log₂ n⌉ + 2 roundings, so s = σ(1 + θ) with |θ| ≤ γ_k = k·2⁻⁵³ / (1 − k·2⁻⁵³) for
  v ≥ 0 (Higham, Accuracy and Stability of Numerical Algorithms, §4.2). A plain sum would give
  γ_{n−1}: 1.1e-11 at n = 10⁵, above the float64 default tol 1e-11.
* Each entry is x̂_i = fl(fl₆₄(v_i / s)) (the kernel: v_i · fl₆₄(1/s), one more float64
  rounding): two float64 roundings δ₁, δ₂ (|δ| ≤ 2⁻⁵³) and the cast δ' (|δ'| ≤ u), so
  x̂_i = x_i (1 + δ₁)(1 + δ₂)(1 + δ') / (1 + θ) + η_i, where η_i is the absolute error of a
  result below the dtype's smallest normal number t (subnormal, or 0 under flush-to-zero:
  |η_i| ≤ t, and ≤ 2⁻¹⁰²² for the float64 quotient, so |η_i| ≤ 2t).

With |∏(1 + a_j) − 1| ≤ exp(Σ|a_j|) − 1, 1/(1 + θ) = 1 − θ/(1 + θ), x ≥ 0 and Σ x_i = 1:

    ‖x̂ − x‖₁ ≤ exp(u + 2·2⁻⁵³ + γ_k / (1 − γ_k)) − 1 + 2 n t  =:  ω(dtype, n).        (R1)

ω is 5.96e-8 for float32 (u itself, plus ~1e-14) and ~4e-15 for float64 at n = 10⁵. A result
cast from a float64 solution x̂₆₄ (the float64 finish of stalled float32 columns,
hippo_gpu.ppr.solver) moves by ≤ u‖x̂₆₄‖₁ + n t ≤ ω(dtype, n) (‖x̂₆₄‖₁ ≤ 1 + ω(float64, n)), so
its bound is ε₆₄ + ω(dtype, n), where ε₆₄ already holds ω(float64, n).

**Sums behind a bound.** A bound is itself computed in float64 from sums over the n rows (the
residual Σ|ρ_i| and the mass Σ g_i), each off by a relative γ_n: (3)'s 2‖ρ‖₁/((1 − d)σ) as
computed can be low by a relative 2γ_n + 4·2⁻⁵³ (a ratio of two such sums, a division, a
product). :func:`inflation` (1 + (n + 8)·2⁻⁵²) covers that; it multiplies every bound computed
from the float64 residual (1 + 2e-11 at n = 10⁵).

**The floor, and the refusal.** ε ≥ 0, so no certificate of a dtype result is below
ω(dtype, n), and one finished in float64 carries ω(dtype, n) + ω(float64, n). A tol at or below
floor(dtype, n) = ω(dtype, n) + [dtype ≠ float64]·ω(float64, n) can never be met:
:func:`check_tol` refuses it up front (:class:`ToleranceError`, before any step), naming the
smallest tol the dtype can certify and the one float64 can. A solve stops on ε + ω ≤ tol,
i.e. it aims at tol − ω: a float32 tol of 1e-7 leaves 4e-8 for the iterate, below musique's
float32 floors, so more columns are finished in float64.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hippo_gpu.errors import HippoGpuError

__all__ = ["ToleranceError", "certifiable_floor", "check_tol", "inflation", "normalise",
           "output_rounding", "pairwise_sum", "unit_roundoff"]

U64 = 2.0 ** -53  # float64 unit round-off
NORMALISE_BLOCK = 1 << 24  # entries per float64 block of normalise (128 MB)


class ToleranceError(HippoGpuError, ValueError):
    """A tol no certificate of the result's dtype can meet: at or below the rounding of the
    returned vector itself (module docstring, "The floor").

    Attributes:
        tol: the tol asked for.
        floor: the dtype's floor; any tol above it can be certified.
        floor64: float64's floor for the same size.
    """

    def __init__(self, tol: float, dtype: torch.dtype, n: int, floor: float,
                 floor64: float, what: str | None = None) -> None:
        name = str(dtype).removeprefix("torch.")
        what = what or f"the returned distribution to {name}"
        advice = "" if dtype == torch.float64 and floor <= floor64 else (
            f"; a float64 solve (RetrievalConfig(dtype='float64'), "
            f"PPRSolver(dtype=torch.float64)) certifies tol down to just above {floor64:.3g}")
        super().__init__(
            f"tol {tol:.3g} cannot be certified for a {name} result over {n} rows: rounding "
            f"{what} alone can move it by {floor:.3g} in L1, so the smallest tol it can "
            f"certify is just above {floor:.3g}{advice}")
        self.tol, self.floor, self.floor64 = tol, floor, floor64


def unit_roundoff(dtype: torch.dtype) -> float:
    """u of a float dtype: half the distance from 1 to the next number (2⁻²⁴ for float32)."""
    return torch.finfo(dtype).eps / 2.0


def _gamma(k: int) -> float:
    """Higham's γ_k = k u / (1 − k u) for float64."""
    ku = k * U64
    return ku / (1.0 - ku)


def _depth(n: int) -> int:
    """k of (R1): roundings a term of a pairwise (or binary-counter) sum of n terms goes through,
    with the division and product after it."""
    return 2 * max(1, math.ceil(math.log2(max(n, 2)))) + 2


def output_rounding(dtype: torch.dtype, n: int) -> float:
    """ω(dtype, n) of eq. (R1): the L1 rounding of an n-entry distribution returned in ``dtype``
    (normalised by :func:`normalise` or the CPU kernel's emit)."""
    g = _gamma(_depth(n))
    tiny = torch.finfo(dtype).tiny
    return math.expm1(unit_roundoff(dtype) + 2 * U64 + g / (1.0 - g)) + 2 * n * tiny


def certifiable_floor(dtype: torch.dtype, n: int) -> float:
    """floor(dtype, n): the largest tol no certificate of a ``dtype`` result can meet (module
    docstring); a float32 solve's floor holds float64's, for its float64 finish."""
    floor = output_rounding(dtype, n)
    if dtype != torch.float64:
        floor += output_rounding(torch.float64, n)
    return floor


def check_tol(tol: float, dtype: torch.dtype, n: int) -> float:
    """``tol`` as a float, or :class:`ToleranceError` when it is at or below the floor of a
    ``dtype`` result over ``n`` rows (or ValueError when it is not positive)."""
    tol = float(tol)
    if not tol > 0:
        raise ValueError(f"need tol > 0, got tol={tol}")
    floor = certifiable_floor(dtype, n)
    if tol <= floor:
        raise ToleranceError(tol, dtype, n, floor, certifiable_floor(torch.float64, n))
    return tol


def inflation(n: int) -> float:
    """1 + (n + 8)·2⁻⁵²: the factor that covers the float64 rounding of the sums over n rows a
    bound is computed from (module docstring, "Sums behind a bound")."""
    return 1.0 + (n + 8) * 2.0 ** -52


def pairwise_sum(v: Tensor) -> Tensor:
    """Σ over dim 0 of [n, q] as float64, pairwise: each term goes through at most ⌈log₂ n⌉
    roundings (the error γ_⌈log₂ n⌉·Σ|v|, not γ_{n−1}). ⌈log₂ n⌉ batched adds on halves."""
    n = v.shape[0]
    if n == 0:
        return torch.zeros(v.shape[1:], dtype=torch.float64, device=v.device)
    half = (n + 1) // 2
    acc = v[:half].to(torch.float64, copy=True)  # [⌈n/2⌉, q]
    acc[:n - half] += v[half:]  # float32 values are exact in float64
    m = half
    while m > 1:  # fold the upper half onto the lower one; an odd middle row waits a level
        h = (m + 1) // 2
        acc[:m - h] += acc[h:m]
        m = h
    return acc[0]


def normalise(v: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """x̂ = v / Σv per column of [n, q] non-negative ``v``, computed in float64 (pairwise sum,
    one division) and rounded once into ``dtype`` (default ``v``'s): within ω(dtype, n) of the
    exact v / Σv in L1 (eq. R1). Blocks of rows keep the float64 copies under 128 MB."""
    dtype = v.dtype if dtype is None else dtype
    total = pairwise_sum(v)  # [q]
    out = torch.empty(v.shape, dtype=dtype, device=v.device)
    rows = max(1, NORMALISE_BLOCK // max(1, v.shape[1] if v.dim() > 1 else 1))
    for a in range(0, v.shape[0], rows):  # blocks of rows, not a loop over nodes
        out[a:a + rows] = (v[a:a + rows].to(torch.float64) / total).to(dtype)
    return out
