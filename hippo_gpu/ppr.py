"""Batched personalized PageRank (PPR): Q queries per solve, one sparse x dense product per step.

Semantics are those of igraph's ``Graph.personalized_pagerank(directed=False, weights=...,
reset=r, implementation='prpack')`` as HippoRAG calls it. With d = ``damping``, A the symmetric
weighted adjacency [N, N], D = diag(A 1) and r̂ = r / 1ᵀr, the PPR vector x is the fixed point

    x = (1 - d) r̂ + d Aᵀ D⁻¹ x + d (Σ_{i: D_ii = 0} x_i) r̂        (1)

i.e. a walker follows an edge with probability d (proportionally to its weight) and otherwise
restarts at r̂; a walker on a dangling (zero-degree) node always restarts at r̂.

We solve the equivalent "leaky" system instead. Let M = A D⁻¹ (columns of dangling nodes are zero;
as A is symmetric, M = Pᵀ with P = D⁻¹ A the row-normalised transition) and

    y = (1 - d) r̂ + d M y,    x = y / 1ᵀy.                         (2)

Proof: 1ᵀM y = Σ_{j not dangling} y_j, so any solution of (2) rescaled to sum 1 satisfies (1), and
(1) has a unique solution for d < 1. Form (2) needs no per-step dangling correction: each step is
one fused ``addmm`` for all Q columns, and y is *linear* in r̂, which :class:`PPRSolver` exploits.

**Certified stopping bound (any iterate).** For any vector y let ρ = (1−d) r̂ + d M y − y be its
residual and g = y + ρ = (1−d) r̂ + d M y one more step. Since y* − y = (I − dM)⁻¹ ρ and
‖M‖₁ ≤ 1 (columns sum to 1 or 0), ‖(I − dM)⁻¹‖₁ ≤ Σ_k d^k = 1/(1−d), so

    ‖y − y*‖₁ ≤ ‖ρ‖₁ / (1−d),    ‖g − y*‖₁ = ‖d M (y − y*)‖₁ ≤ d ‖ρ‖₁ / (1−d).      (3)

Normalising (y* ≥ 0, σ = 1ᵀy > 0, entries of y of either sign): x − x* = (y − y*)/σ +
y*(σ* − σ)/(σ σ*) and |σ* − σ| = |1ᵀ(y* − y)| ≤ ‖y − y*‖₁, so ‖x − x*‖₁ ≤ 2‖y − y*‖₁ / σ.
Clamping negative entries to 0 before normalising only shrinks each |y_i − y*_i| (y*_i ≥ 0) and
grows σ, so the bound holds for the clamped, renormalised output too. A column stops at the first
checked step where 2·(bound of (3))/σ ≤ ``tol``. The bound is on the L1 error, so it also bounds
the max abs error; it uses only the measured residual, never a spectral estimate, so it holds for
every method below. (In float32 it is certified up to the round-off of computing ρ itself.)

**Power iteration** (``ppr_iterate``, method "power"): y_{k+1} = g_k; its error contracts by d
per step in L1 (today's bound (3) on g). About 17 steps for tol 1e-6 and 32 for 1e-11 on
musique_train.

**Chebyshev semi-iteration** (``ppr_chebyshev``, the default). M is similar to a symmetric matrix:
let s_i = √D_ii, s_i = 1 for a dangling node, Σ = diag(s) and S = Σ⁻¹ A Σ⁻¹ (symmetric). Then
(Σ S Σ⁻¹)_ij = A_ij / s_j², which is A_ij / D_jj = M_ij for a non-dangling j and 0 = M_ij for a
dangling j (its column of A is zero: the leak of (2) is kept exactly). So M = Σ S Σ⁻¹ has real
eigenvalues, and |λ| ≤ ‖M‖₁ ≤ 1: the spectrum of G = dM lies in [−d, d] (both ends occur: the
passage–phrase part of the graph is nearly bipartite). For y = G y + c, c = (1−d) r̂, the
Chebyshev semi-iteration (Golub & Varga 1961)

    y_{k+1} = y_{k−1} + ω_{k+1} (G y_k + c − y_{k−1}),
    ω_1 = 1,  ω_2 = 2 / (2 − d²),  ω_{k+1} = 1 / (1 − d² ω_k / 4)                   (4)

has error e_k = p_k(G) e_0 with p_k(t) = T_k(t/d) / T_k(1/d), the polynomial of degree k with
p_k(1) = 1 that is smallest on [−d, d]. As G = Σ (dS) Σ⁻¹ with dS symmetric,
‖Σ⁻¹e_k‖₂ ≤ ‖Σ⁻¹e_0‖₂ / T_k(1/d) and T_k(1/d) ≥ ½ ((1 + √(1−d²)) / d)^k: at d = 0.5 the error
shrinks by 1/(2 + √3) ≈ 0.27 per step against 0.5 for the power iteration (rate
(√κ − 1)/(√κ + 1), κ = (1+d)/(1−d), the spectrum of I − dM being in [1−d, 1+d]). We do not stop on
this estimate: converting it to L1 costs a factor up to ‖s‖₂ = √(Σ_i D_ii + #dangling) (Cauchy–
Schwarz, Σ s_i |z_i| ≤ ‖s‖₂ ‖z‖₂) and needs the unknown ‖Σ⁻¹e_0‖₂. Each step computes
g_k = G y_k + c anyway, so the exact residual ρ_k = g_k − y_k is free and bound (3) certifies the
stop; (4) only predicts the step count. Measured (benchmarks/bench_ppr.py, 100 musique queries):
13-14 steps instead of 17-18 for tol 1e-6, 22-23 instead of 32 for 1e-11. On graphs whose walk
mixes fast (the synthetic graphs, where the power iteration's residual, of zero total mass,
already shrinks ~0.3x per step) both take 12-13 steps. CG on (I − dS) z = Σ⁻¹c in the
Σ⁻²-weighted inner product needs ~11 steps on musique but two passes and two column
reductions per step, and its recursive residual drifts from the true one, which (3) needs:
Chebyshev's step is one fused pass
with no inner products, so columns never interact.

**Certified top-k exit** (``top_k=k``, opt-in). Ranking is scale-free, so compare unnormalised
scores z (z = g_k in the torch path, y_k in the CPU kernel) with ε the matching bound of (3) on
‖z − z*‖₁. For two rows a, b: z*_a − z*_b ≥ (z_a − z_b) − |e_a| − |e_b| ≥ (z_a − z_b) − ε, because
|e_a| + |e_b| ≤ ‖e‖₁ (a factor 2 better than bounding each entry by ε). Let z_(1) ≥ … ≥ z_(k+1)
be the k + 1 largest target scores. If every consecutive gap z_(i) − z_(i+1), i = 1..k, exceeds
ε, then z*_(1) > … > z*_(k) > z*_j for every other target j (the last gap covers all of them,
since z_(k) − z_j ≥ z_(k) − z_(k+1)): the top k and their order are those of the exact solution.
Such a column stops even though its bound exceeds ``tol``; its scores are off by at most the
reported bound (so ranks below k are not certified). A column that meets ``tol`` first stops as
usual, and its order is then only as exact as ``tol`` (in float32, near-ties around rank 200 of
musique differ from the float64 order in 1-2 % of queries). In float32 the certificate, like the
bound, holds up to the round-off of the iterate. The clamp at 0 keeps this order: as
z*_(k+1) ≥ 0, z_(k) > z_(k+1) + ε ≥ ε − |e_(k+1)| ≥ |e_(k)| ≥ 0, so certified scores are positive.

Per column, the output is the iterate of the first step at which that column's certificate held
(columns are frozen as they finish; the batch runs until the last one does), so a query's result
does not depend on the rest of its batch in the CPU kernel (bit-identical), and only through
check spacing in the torch path.

**Round-off floor and the float64 finish.** Bound (3) is computed from the measured residual ρ,
and in float32 ρ itself carries round-off: each g_i sums deg(i) products with relative error
~deg(i)·2⁻²⁴, so ‖ρ‖₁ cannot fall below a floor of order 2⁻²⁴·‖y‖₁ times the graph's typical
degree, and the certified bound 2 d ‖ρ‖₁ / ((1 − d) σ) stops decreasing there. On musique's phrase
graph the floor is ~5e-7, a factor 2 below the float32 default tol 1e-6; on larger or denser
graphs it is above it, and a float32 solve could never certify tol. In exact arithmetic the bound
falls geometrically (the power iteration contracts ρ by d per step in L1, ‖dM‖₁ ≤ d; Chebyshev
faster), so it halves at least every ⌈ln 2 / ln(1/d)⌉ steps. A column whose bound has not halved in
``stall_steps(d)`` = max(8, 4⌈ln 2 / ln(1/d)⌉) steps is therefore at its floor, not converging
slowly: it stops at once ("stalled"), instead of running to ``max_iter``. :class:`PPRSolver`
then solves exactly those columns again in float64 (a float64 copy of the operator, built from
the adjacency on the first stall and kept), to the same ``tol``: float64's floor is ~2⁻²⁹ of
float32's, so the float64 bound certifies any tol above ~1e-13 on every graph we build, and the
float32 columns that met tol (all of them, on our data) keep float32's speed. The reported bound
of a finished column is the float64 one, so the certificate is real, not up to float32 round-off.
Only a column that runs out of ``max_iter`` steps while its bound still falls (or one that
stalls in float64 too: a tol below float64 round-off) is left uncertified; the solver then raises
:class:`ConvergenceError` naming those columns, and :meth:`PPRSolver.solve` returns them marked,
so a caller can fail those queries alone.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hippo_gpu.config import check_ppr_method
from hippo_gpu.errors import HippoGpuError

__all__ = [
    "ConvergenceError",
    "PPRResult",
    "PPRSolution",
    "PPRSolver",
    "StepFn",
    "Transition",
    "build_transition",
    "chebyshev_weights",
    "default_tol",
    "personalized_pagerank",
    "ppr_chebyshev",
    "ppr_iterate",
    "rcm_permutation",
    "stall_steps",
    "torch_step",
]

DEFAULT_MAX_ITER = 1000


class ConvergenceError(HippoGpuError, RuntimeError):
    """PPR left some columns uncertified: ``max_iter`` ran out while the bound still fell, or
    ``tol`` is below float64 round-off.

    Attributes:
        columns: the batch columns that are not certified.
        bounds: their L1 bounds, in the same order.
    """

    def __init__(self, message: str, columns: list[int] | None = None,
                 bounds: list[float] | None = None) -> None:
        super().__init__(message)
        self.columns = columns or []
        self.bounds = bounds or []


def stall_steps(damping: float) -> int:
    """Steps without the bound halving after which a column is at its round-off floor: in exact
    arithmetic it halves at least every ⌈ln 2 / ln(1/d)⌉ steps (module docstring)."""
    if damping <= 0.0:
        return 8
    return max(8, 4 * math.ceil(math.log(2.0) / -math.log(damping)))


def default_tol(dtype: torch.dtype) -> float:
    """L1 error bound used when ``tol`` is None: tight for float64, above round-off for float32."""
    return 1e-11 if dtype == torch.float64 else 1e-6


@dataclass(frozen=True)
class PPRResult:
    """Output of :func:`ppr_iterate`.

    Attributes:
        scores: [N, Q] PPR probabilities; each column sums to 1.
        iterations: [Q] int64, the sparse products after which each column was certified (met
            ``tol`` or, with ``top_k``, the top-k certificate) and frozen; max_iter if never,
            the step it stopped at if it stalled. Checks are spaced by the observed decay, so
            this can exceed the first possible step.
        error_bound: [Q] L1 error bound of each column's returned scores.
        certified: [Q] bool, the columns that met ``tol`` or the top-k certificate.
        stalled: [Q] bool, the columns stopped at their round-off floor above ``tol``.
    """

    scores: Tensor  # [N, Q]
    iterations: Tensor  # [Q]
    error_bound: Tensor  # [Q]
    certified: Tensor  # [Q] bool
    stalled: Tensor  # [Q] bool

    @property
    def converged(self) -> bool:
        """Whether every column was certified."""
        return bool(self.certified.all())


@dataclass(frozen=True)
class PPRSolution:
    """Output of :meth:`PPRSolver.solve`: scores at the target rows and each column's certificate.

    Attributes:
        scores: [T, Q] PPR probabilities in the solver's dtype.
        steps: [Q] int64 sparse products per column (float32 and float64 steps added for a
            refined column; 0 for the closed form).
        bound: [Q] certified L1 bound of each column (the float64 one for a refined column).
        certified: [Q] bool, bound <= tol (or the top-k certificate held).
        refined: [Q] bool, the float32 columns that stalled and were finished in float64.
        tol: the tolerance asked for.
    """

    scores: Tensor  # [T, Q]
    steps: Tensor  # [Q]
    bound: Tensor  # [Q]
    certified: Tensor  # [Q] bool
    refined: Tensor  # [Q] bool
    tol: float

    def failures(self) -> dict[int, str]:
        """{batch column: why it is uncertified} for every column that is not certified."""
        bad = torch.nonzero(~self.certified.cpu()).flatten().tolist()
        bounds = self.bound.cpu().tolist()
        return {c: (f"PPR did not converge: L1 bound {bounds[c]:.3g} > tol {self.tol:.3g} after "
                    f"{int(self.steps[c])} steps") for c in bad}

    def raise_if_uncertified(self) -> None:
        """Raise :class:`ConvergenceError` naming the uncertified columns, if any."""
        failures = self.failures()
        if failures:
            cols = sorted(failures)
            worst = max(float(self.bound[c]) for c in cols)
            raise ConvergenceError(
                f"PPR did not converge for {len(cols)} of {self.certified.numel()} columns "
                f"(first {cols[:10]}; worst L1 bound {worst:.3g} > tol {self.tol:.3g})",
                cols, [float(self.bound[c]) for c in cols])


@dataclass(frozen=True)
class Transition:
    """The normalised walk operator of one graph, built once per index.

    Attributes:
        matrix: [N, N] sparse CSR, M = A D⁻¹ (M[i, j] = A[i, j] / deg(j)); dangling columns empty.
        dangling: [N] bool, zero weighted degree.
        damping: probability d of following an edge.
    """

    matrix: Tensor  # [N, N] CSR
    dangling: Tensor  # [N] bool
    damping: float

    @property
    def num_nodes(self) -> int:
        return int(self.matrix.shape[0])

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Transition:
        """Copy to another device and/or value dtype."""
        return Transition(
            self.matrix.to(device=device, dtype=dtype), self.dangling.to(device), self.damping
        )


def _check_damping(damping: float) -> float:
    damping = float(damping)
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping}")
    return damping


def _check_adjacency(adjacency: Tensor) -> None:
    if not isinstance(adjacency, Tensor) or adjacency.layout != torch.sparse_csr:
        raise ValueError("adjacency must be a torch sparse CSR tensor (Tensor.to_sparse_csr())")
    if adjacency.dim() != 2 or adjacency.shape[0] != adjacency.shape[1]:
        raise ValueError(f"adjacency must be square [N, N], got {tuple(adjacency.shape)}")
    values = adjacency.values()
    if not values.is_floating_point():
        raise ValueError(f"adjacency values must be floating point, got {values.dtype}")
    if values.numel() and not bool(torch.isfinite(values).all()):
        raise ValueError("adjacency has non-finite weights")
    if values.numel() and bool((values < 0).any()):
        raise ValueError("adjacency has negative weights")


def build_transition(
    adjacency: Tensor,
    *,
    damping: float = 0.5,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Transition:
    """Normalise a symmetric adjacency into M = A D⁻¹ (weights summed in float64, then cast).

    Args:
        adjacency: [N, N] sparse CSR, symmetric, non-negative weights (zeros carry no walk).
        damping: probability d of following an edge, in [0, 1).
        dtype: value dtype of the returned operator.
        device: target device (default: the adjacency's).

    Returns:
        The :class:`Transition`. Symmetry is assumed, not checked (it would cost a transpose).
    """
    damping = _check_damping(damping)
    _check_adjacency(adjacency)
    device = adjacency.device if device is None else torch.device(device)
    crow = adjacency.crow_indices()
    col = adjacency.col_indices()
    values = adjacency.values().to(torch.float64)
    n = adjacency.shape[0]
    rows = torch.repeat_interleave(torch.arange(n, device=crow.device), crow[1:] - crow[:-1])
    degree = torch.zeros(n, dtype=torch.float64, device=values.device).index_add_(0, rows, values)
    dangling = degree <= 0
    inv_degree = torch.where(dangling, torch.zeros_like(degree), 1.0 / degree)
    scaled = (values * inv_degree[col]).to(dtype)  # M[i, j] = A[i, j] / deg(j)
    if max(n, col.numel()) < 2**31 - 1:  # int32 indices: MKL's fast path, ~1.4x on the CPU
        crow, col = crow.to(torch.int32), col.to(torch.int32)
    matrix = torch.sparse_csr_tensor(crow, col, scaled, (n, n), check_invariants=False).to(device)
    return Transition(matrix, dangling.to(device), damping)


def _check_seeds_shape(seeds: Tensor, num_nodes: int) -> None:
    """The checks of :func:`_check_seeds` that read no values."""
    if not isinstance(seeds, Tensor) or seeds.layout != torch.strided:
        raise ValueError("seeds must be a dense torch.Tensor [N, Q]")
    if seeds.dim() != 2 or seeds.shape[0] != num_nodes:
        raise ValueError(f"seeds must have shape [N={num_nodes}, Q], got {tuple(seeds.shape)}")
    if seeds.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"seeds must be float32 or float64, got {seeds.dtype}")
    if seeds.numel() == 0:
        raise ValueError("seeds has no entries")


def _check_seeds(seeds: Tensor, num_nodes: int, *, first_column: int = 0) -> Tensor:
    """Validate [N, Q] reset weights; return their column sums 1ᵀr [1, Q] (two passes).

    ``first_column``: the batch column of ``seeds``' column 0 (errors name batch columns)."""
    _check_seeds_shape(seeds, num_nodes)
    lowest = seeds.amin()  # NaN propagates: `not lowest >= 0` catches NaN and negatives
    if not bool(lowest >= 0):
        what = "NaN" if bool(torch.isnan(lowest)) else "negative entries"
        raise ValueError(f"seeds contains {what}")
    total = seeds.sum(dim=0, keepdim=True)  # [1, Q]; an inf entry makes its column sum inf
    if not bool(torch.isfinite(total).all()):
        raise ValueError("seeds contains inf (or columns whose sum overflows)")
    if bool((total <= 0).any()):
        bad = (torch.nonzero(total[0] <= 0).flatten() + first_column).tolist()[:10]
        raise ValueError(
            f"seed columns {bad} are all zero; each query needs a positive reset weight"
        )
    return total


def _normalised_seeds(seeds: Tensor, num_nodes: int) -> Tensor:
    """Validate [N, Q] reset weights and return r̂ = r / 1ᵀr (column-wise)."""
    return seeds / _check_seeds(seeds, num_nodes)


def chebyshev_weights(damping: float, steps: int) -> list[float]:
    """ω_1..ω_steps of eq. (4) for a spectrum of dM in [−d, d] (ω_1 = 1: a plain first step)."""
    d2 = float(damping) ** 2
    weights = [1.0]
    for k in range(1, steps):
        weights.append(2.0 / (2.0 - d2) if k == 1 else 1.0 / (1.0 - d2 * weights[-1] / 4.0))
    return weights[:steps]


# A step: (base [N, Q'], y, y_prev, g out, ω or None for the power step, whether to measure) ->
# (Σ_i |g_i − y_i| [Q'], Σ_i g_i [Q']) when measuring, else None. It writes g = base + d M y and,
# for ω, y_prev ← y_prev + ω (g − y_prev). :func:`torch_step` is the reference; the Triton kernel
# (hippo_gpu.kernels.ppr_triton) fuses it into one pass on CUDA.
StepFn = Callable[
    [Tensor, Tensor, Tensor, Tensor, "float | None", bool], "tuple[Tensor, Tensor] | None"
]


def torch_step(transition: Transition) -> StepFn:
    """The torch (MKL / cuSPARSE) step of :data:`StepFn` for ``transition``."""
    matrix, d = transition.matrix, transition.damping

    def step(base: Tensor, y: Tensor, y_prev: Tensor, g: Tensor, omega: float | None,
             measure: bool) -> tuple[Tensor, Tensor] | None:
        torch.addmm(base, matrix, y, beta=1.0, alpha=d, out=g)  # g = (1-d) r̂ + d M y
        out = None
        if measure:
            out = (torch.sub(g, y).abs_().sum(dim=0), g.sum(dim=0))
        if omega is not None:
            y_prev.lerp_(g, omega)  # y_{k+1} = y_{k-1} + ω (g − y_{k-1})
        return out

    return step


def ppr_iterate(
    transition: Transition,
    reset: Tensor,
    *,
    tol: float | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
    normalised: bool = False,
    top_k: int | None = None,
    target_rows: Tensor | None = None,
    step: StepFn | None = None,
    exact: Transition | None = None,
) -> PPRResult:
    """Power iteration y ← (1−d) r̂ + d M y for all Q columns at once; returns x = y / 1ᵀy.

    Args:
        transition: operator from :func:`build_transition`, same device as ``reset``; its value
            dtype should equal ``reset``'s.
        reset: [N, Q] non-negative reset weights (normalised here unless ``normalised``).
        tol: L1 error bound per column (default :func:`default_tol` of the dtype).
        max_iter: at most this many sparse products.
        normalised: skip validation; ``reset`` columns already sum to 1.
        top_k: also stop a column once its top-k ``target_rows`` (and order) are certain.
        target_rows: [T] rows the top-k certificate ranks (default all N).
        step: replaces the torch step of :data:`StepFn` (e.g. a fused kernel).
        exact: the same operator in float64, for a float32 ``reset``: each certificate is
            checked on the float64 residual, and a column failing it returns stalled.

    Returns:
        :class:`PPRResult` with scores [N, Q].
    """
    return _solve(transition, reset, None, tol=tol, max_iter=max_iter, normalised=normalised,
                  top_k=top_k, target_rows=target_rows, step=step, exact=exact)


def ppr_chebyshev(
    transition: Transition,
    reset: Tensor,
    *,
    tol: float | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
    normalised: bool = False,
    top_k: int | None = None,
    target_rows: Tensor | None = None,
    step: StepFn | None = None,
    exact: Transition | None = None,
) -> PPRResult:
    """Chebyshev semi-iteration (eq. 4) for all Q columns at once; returns x = y / 1ᵀy.

    Same arguments and result as :func:`ppr_iterate` (same certified L1 bound), in about 30 %
    fewer sparse products on musique_train.
    """
    weights = chebyshev_weights(transition.damping, max_iter)
    return _solve(transition, reset, weights, tol=tol, max_iter=max_iter, normalised=normalised,
                  top_k=top_k, target_rows=target_rows, step=step, exact=exact)


def _solve(
    transition: Transition,
    reset: Tensor,
    weights: list[float] | None,
    *,
    tol: float | None,
    max_iter: int,
    normalised: bool,
    top_k: int | None,
    target_rows: Tensor | None,
    step: StepFn | None = None,
    exact: Transition | None = None,
) -> PPRResult:
    """The shared loop: ``weights`` None is the power iteration, else eq. (4) with those ω."""
    n = transition.num_nodes
    r_hat = reset if normalised else _normalised_seeds(reset, n)
    tol = default_tol(r_hat.dtype) if tol is None else float(tol)
    if tol <= 0 or max_iter < 1:
        raise ValueError(f"need tol > 0 and max_iter >= 1, got tol={tol}, max_iter={max_iter}")
    top_k = _check_top_k(top_k)
    d = transition.damping
    q, dev = r_hat.shape[1], r_hat.device
    iterations = torch.full((q,), max_iter, dtype=torch.int64, device=dev)
    bound = torch.full((q,), math.inf, dtype=r_hat.dtype, device=dev)
    stalled = torch.zeros(q, dtype=torch.bool, device=dev)
    if d == 0.0:  # no walk: x = r̂ exactly
        return PPRResult(r_hat.clone(), iterations.zero_(), bound.zero_(), ~stalled, stalled)
    patience = stall_steps(d)
    halved = torch.full((q,), math.inf, dtype=r_hat.dtype, device=dev)  # bound when last halved
    halved_at = torch.zeros(q, dtype=torch.int64, device=dev)  # ... and at which step
    step = torch_step(transition) if step is None else step
    scores = torch.empty_like(r_hat)  # [N, Q], filled as columns finish
    met = torch.zeros(q, dtype=torch.bool, device=dev)
    cols = torch.arange(q, device=dev)  # original column of each open column
    base = r_hat * (1.0 - d)  # [N, Q']
    y = r_hat.clone()  # any start converges; r̂ keeps the first residual ≤ 2
    y_prev = r_hat.clone() if weights is not None else y
    g = torch.empty_like(y)
    factor = d / (1.0 - d)  # (3): ‖g − y*‖₁ ≤ d/(1−d) ‖ρ‖₁
    # The residual costs ~40 % of an SpMM on the CPU and a device sync, so after the first checks
    # we extrapolate the observed decay and check next where tol should be met (every step with
    # top_k, whose certificate can hold any time).
    next_check, last_check, last_worst = 1, 0, math.inf
    for k in range(1, max_iter + 1):
        measure = top_k > 0 or k == next_check or k == max_iter
        omega = None if weights is None else weights[k - 1]
        measured = step(base, y, y_prev, g, omega, measure)
        if measured is not None:
            residual, mass = measured
            err = factor * residual  # bounds ‖g − y*‖₁ per open column
            now = torch.where(mass > 0, 2.0 * err / mass, math.inf)
            ok = now <= tol
            if top_k:
                ok |= _topk_certified(g, target_rows, top_k, err)
            halving = now <= 0.5 * halved
            halved = torch.where(halving, now, halved)
            halved_at = torch.where(halving, k, halved_at)
            stall = ~ok & (k - halved_at >= patience)  # at the round-off floor (docstring)
            if exact is not None and bool(ok.any()):  # float32 certificates, in float64
                held = _verify64(exact, base, y, g, ok, now, tol, top_k, target_rows)
                stall |= ok & ~held
                ok &= held
            finish = ok | stall | (k == max_iter)
            if bool(finish.any()):
                idx = torch.nonzero(finish).flatten()
                out = g.index_select(1, idx).clamp_(min=0)
                scores[:, cols[idx]] = out / out.sum(dim=0, keepdim=True)
                iterations[cols[idx]] = torch.where(ok[idx] | stall[idx], k, max_iter)
                bound[cols[idx]] = now[idx]
                met[cols[idx]] = ok[idx]
                stalled[cols[idx]] = stall[idx]
                keep = torch.nonzero(~finish).flatten()
                if keep.numel() == 0:
                    break
                cols, now = cols[keep], now[keep]
                halved, halved_at = halved[keep], halved_at[keep]
                base, y, g = base[:, keep], y[:, keep], g[:, keep]
                y_prev = y_prev[:, keep] if weights is not None else y
            worst = float(now.max())
            next_check = k + _steps_to_tol(worst, last_worst, k - last_check, tol)
            last_check, last_worst = k, worst
        if weights is None:
            y, g = g, y  # y_{k+1} = g_k
            y_prev = y
        else:
            y, y_prev = y_prev, y
    return PPRResult(scores, iterations, bound, met, stalled)


def _verify64(exact: Transition, base: Tensor, y: Tensor, g: Tensor, ok: Tensor, now: Tensor,
              tol: float, top_k: int, target_rows: Tensor | None) -> Tensor:
    """[Q'] bool: which ``ok`` columns keep their certificate on the float64 residual; ``now``
    gets their float64 bounds (in place).

    With g₆₄ = (1−d) r̂ + d M₆₄ y in float64 (base = (1−d) r̂ as stored), (3) gives
    ‖g − y*‖₁ ≤ ‖g − g₆₄‖₁ + d/(1−d) ‖g₆₄ − y‖₁, plus 2⁻²³ for r̂ rounded twice into float32
    (‖L‖₁ ≤ 1) and the float64 round-off of the sums (module docstring, "Round-off floor").
    """
    d = exact.damping
    idx = torch.nonzero(ok).flatten()
    y64 = y.index_select(1, idx).double()
    g32 = g.index_select(1, idx).double()
    g64 = torch.addmm(base.index_select(1, idx).double(), exact.matrix, y64, beta=1.0, alpha=d)
    err = (g32 - g64).abs().sum(dim=0) + d / (1 - d) * (g64 - y64).abs().sum(dim=0) + 2.0 ** -23
    mass = g32.sum(dim=0)
    bound = torch.where(mass > 0, 2.0 * err / mass, math.inf)
    held = bound <= tol
    if top_k:
        held |= _topk_certified(g.index_select(1, idx), target_rows, top_k, err.to(g.dtype))
    now[idx] = bound.to(now.dtype)
    out = torch.zeros_like(ok)
    out[idx] = held
    return out


def _check_top_k(top_k: int | None) -> int:
    if top_k is None:
        return 0
    if int(top_k) != top_k or top_k < 1:
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    return int(top_k)


def _topk_certified(z: Tensor, rows: Tensor | None, k: int, eps: Tensor) -> Tensor:
    """[Q'] bool: every consecutive gap among the k + 1 largest ``z[rows]`` exceeds ``eps``.

    ``eps`` [Q'] bounds ‖z − z*‖₁ per column, so the top k and their order are those of z*
    (module docstring, "Certified top-k exit").
    """
    vals = z if rows is None else z.index_select(0, rows)  # [T, Q']
    m = min(k + 1, vals.shape[0])
    if m < 2:
        return torch.ones(z.shape[1], dtype=torch.bool, device=z.device)
    top = vals.topk(m, dim=0).values  # [m, Q'], descending
    return ((top[:-1] - top[1:]) > eps).all(dim=0)


def _steps_to_tol(worst: float, previous: float, gap: int, tol: float) -> int:
    """Steps until the next residual check, from the decay rate seen between the last two."""
    if not math.isfinite(previous) or worst <= 0 or worst >= previous:
        return 1
    rate = (worst / previous) ** (1.0 / gap)
    return max(1, min(16, math.ceil(math.log(tol / worst) / math.log(rate))))


def personalized_pagerank(
    adjacency: Tensor,
    seeds: Tensor,
    *,
    damping: float = 0.5,
    tol: float | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
) -> Tensor:
    """PPR for Q reset vectors at once, igraph-prpack semantics (see module docstring, eq. 1).

    Solved by the Chebyshev semi-iteration (eq. 4) with the certified bound (3), in torch
    (a one-off :class:`PPRSolver`: float32 columns that stall are finished in float64).

    Args:
        adjacency: [N, N] symmetric sparse CSR, non-negative weights (zeros ignored).
        seeds: [N, Q] dense, non-negative; each column is normalised to sum 1. Its dtype
            (float64 parity / float32 fast) and device set those of the computation.
        damping: probability of following an edge, in [0, 1).
        tol: L1 error bound per column (default 1e-11 for float64, 1e-6 for float32).
        max_iter: cap on iterations.

    Returns:
        [N, Q] tensor, each column the PPR distribution (sums to 1).

    Raises:
        ValueError: bad shapes, an all-zero / NaN / negative seed column, bad adjacency.
        ConvergenceError: ``tol`` not reached within ``max_iter``.
    """
    _check_adjacency(adjacency)
    _check_seeds_shape(seeds, adjacency.shape[0])
    solver = PPRSolver(adjacency, damping=damping, dtype=seeds.dtype, device=seeds.device,
                       method="chebyshev", kernel="torch", reorder=False, tol=tol,
                       max_iter=max_iter)
    return solver(seeds)


def rcm_permutation(adjacency: Tensor) -> Tensor:
    """Reverse Cuthill–McKee order of a symmetric CSR graph (scipy), as an [N] int64 permutation.

    ``perm[k]`` is the original node placed at position k; it clusters neighbours in memory.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    a = adjacency.to("cpu")
    n = a.shape[0]
    graph = csr_matrix(
        (
            np.ones(a.values().numel(), dtype=np.int8),
            a.col_indices().numpy(),
            a.crow_indices().numpy(),
        ),
        shape=(n, n),
    )
    perm = reverse_cuthill_mckee(graph, symmetric_mode=True)
    return torch.from_numpy(np.ascontiguousarray(perm, dtype=np.int64))


def _permute_csr(adjacency: Tensor, perm: Tensor) -> Tensor:
    """Return A[perm][:, perm] as CSR (on the CPU, via scipy)."""
    from scipy.sparse import csr_matrix

    a = adjacency.to("cpu")
    n = a.shape[0]
    sp = csr_matrix(
        (a.values().numpy(), a.col_indices().numpy(), a.crow_indices().numpy()), shape=(n, n)
    )
    p = perm.numpy()
    sp = sp[p][:, p].tocsr()
    sp.sort_indices()
    return torch.sparse_csr_tensor(
        torch.from_numpy(sp.indptr.astype(np.int64)),
        torch.from_numpy(sp.indices.astype(np.int64)),
        torch.from_numpy(sp.data),
        (n, n),
        check_invariants=False,
    )


def _solve_target_rows(
    transition: Transition, targets: Tensor, *, tol: float, max_iter: int
) -> tuple[Tensor, int]:
    """Rows ``targets`` of L = (1−d)(I − dM)⁻¹, i.e. G = L[T, :] as an [N, T] matrix Gᵀ.

    Gᵀ = (1−d)(I − dMᵀ)⁻¹ E_T solves Z = (1−d) E_T + d Mᵀ Z, with Mᵀ = P = D⁻¹A (row-stochastic
    or zero rows, so the map contracts by d in the max norm): ‖Z_k − Z*‖_max ≤ d/(1−d)·Δ_k.
    Returns (Gᵀ [N, T], steps).
    """
    d = transition.damping
    matrix = transition.matrix
    n = transition.num_nodes
    # Mᵀ as CSR: transpose of M = A D⁻¹ is D⁻¹ A; build it from M's COO with rows/cols swapped.
    coo = matrix.to_sparse_coo().coalesce()
    idx = coo.indices()
    m_t = torch.sparse_coo_tensor(idx.flip(0), coo.values(), (n, n)).coalesce().to_sparse_csr()
    t = targets.numel()
    base = torch.zeros(n, t, dtype=matrix.dtype, device=matrix.device)  # [N, T]
    base[targets, torch.arange(t, device=matrix.device)] = 1.0 - d
    z = base.clone()
    z_next = torch.empty_like(z)
    factor = d / (1.0 - d)
    for step in range(1, max_iter + 1):
        torch.addmm(base, m_t, z, beta=1.0, alpha=d, out=z_next)
        z.sub_(z_next)
        delta = float(z.abs().max()) if z.numel() else 0.0
        z, z_next = z_next, z
        if factor * delta <= tol:
            return z, step
    raise ConvergenceError(f"target-row solve did not reach {tol} in {max_iter} iterations")


class PPRSolver:
    """PPR for many query batches on one fixed graph, precomputed once per index.

    ``solver(seeds)`` returns the raw PPR probabilities x[T, Q] at ``target_nodes`` (all N rows
    when None), in the original node order, equal to ``personalized_pagerank(A, seeds)[targets]``
    up to the solver tolerance. Methods:

    * ``"chebyshev"``: eq. (4) on the precomputed M, certified by (3) (the default on the CPU).
    * ``"power"``: eq. (2) power iteration, same bound, ~30 % more steps.
    * ``"closed_form"``: y is linear in r, so x_T = G r / (cᵀ r) with G = L[T, :],
      L = (1−d)(I − dM)⁻¹ and c = 1ᵀL. Because dangling nodes of a symmetric graph are isolated,
      c_j = 1 − d·[j dangling] exactly. G is solved once (T right-hand sides); a query batch is then
      one [T, T] x [T, Q] GEMM for the target rows of r plus a gathered GEMM over the few other
      nonzero rows (HippoRAG 2: ~5 phrase seeds per query). Needs T·N values of memory.

    ``method="auto"`` picks closed form on CUDA when T·N·itemsize ≤ ``memory_budget`` bytes, else
    chebyshev: on the CPU the build (T columns x ~40 sparse steps: 13 s for T = 2k, N = 12k on one
    core) outweighs its per-query gain (benchmarks/bench_ppr.py).

    Backends for the two iterations (``kernel``): ``"numba"``, the fused cache-blocked CPU kernel
    of hippo_gpu.kernels.ppr_cpu (default on the CPU when ``kernels.AVAILABLE`` and
    ``HIPPO_GPU_FORCE_TORCH`` is unset); ``"torch"`` (MKL / cuSPARSE; default on CUDA);
    ``"triton"``, a fused CUDA step (opt-in: ``kernel="triton"`` or ``HIPPO_GPU_PPR_TRITON=1``,
    until a GPU run shows it faster than cuSPARSE). All compute the same iterates and certify the
    same bound; ``solver.backend`` says which one runs.

    Args:
        adjacency: [N, N] symmetric sparse CSR, non-negative weights.
        damping: probability d of following an edge.
        target_nodes: [T] int64 rows to return (e.g. passage nodes), or None for all N.
        dtype: float32 (fast) or float64 (parity).
        device: where the operator lives (default: the adjacency's device).
        method: one of hippo_gpu.config.PPR_METHODS ("auto", "chebyshev", "power",
            "closed_form").
        reorder: reverse Cuthill–McKee reordering of the rows (None: on for the numba kernel,
            whose gathers it keeps cache-local; off for torch).
        memory_budget: bytes allowed for G in "auto".
        tol: default L1 error bound per column (iterations) / build tolerance (closed form).
        max_iter: default iteration cap.
        top_k: default certified top-k exit over the target rows (None: off; module docstring).
        kernel: "auto", "numba", "torch" or "triton".
    """

    def __init__(
        self,
        adjacency: Tensor,
        *,
        damping: float = 0.5,
        target_nodes: Tensor | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        method: str = "auto",
        reorder: bool | None = None,
        memory_budget: int = 1 << 30,
        tol: float | None = None,
        max_iter: int = DEFAULT_MAX_ITER,
        top_k: int | None = None,
        kernel: str = "auto",
    ) -> None:
        _check_adjacency(adjacency)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype}")
        check_ppr_method(method)
        device = adjacency.device if device is None else torch.device(device)
        n = adjacency.shape[0]
        if target_nodes is not None:
            target_nodes = torch.as_tensor(target_nodes, dtype=torch.int64).flatten().cpu()
            if target_nodes.numel() and (target_nodes.min() < 0 or target_nodes.max() >= n):
                raise ValueError(f"target_nodes out of range [0, {n})")
        t = n if target_nodes is None else target_nodes.numel()
        itemsize = torch.finfo(dtype).bits // 8
        if method == "closed_form" and t * n * itemsize > memory_budget:
            raise ValueError(f"closed form needs {t * n * itemsize} bytes > memory_budget")
        if method == "auto":  # closed form pays off where its T-column build is cheap: CUDA
            fits = 0 < t * n * itemsize <= memory_budget
            method = "closed_form" if fits and device.type == "cuda" else "chebyshev"
        self.num_nodes = n
        self.damping = _check_damping(damping)
        self.dtype = dtype
        self.method = method
        self.tol = default_tol(dtype) if tol is None else float(tol)
        self.max_iter = int(max_iter)
        self.top_k = _check_top_k(top_k) or None
        self.last_iterations = 0  # sparse products run by the last call (0 for closed form)
        self.last_steps: Tensor | None = None  # [Q] per-column steps of the last call
        self.last_error_bound: Tensor | None = None  # [Q] per-column L1 bounds of the last call
        self._twin: PPRSolver | None = None  # the float64 finish, made on the first stall
        self._exact: Transition | None = None  # the float64 operator of a float32 iteration
        self._max_row_nnz = 0
        targets = torch.arange(n) if target_nodes is None else target_nodes
        self.target_nodes = target_nodes
        self.transition: Transition | None = None
        self._perm: Tensor | None = None
        self._out_rows: Tensor | None = None
        self.device = device

        if method == "closed_form":
            self.backend = "closed_form"
            # Built in float64 on the CPU/device for accuracy, stored in the requested dtype.
            transition = build_transition(
                adjacency, damping=damping, dtype=torch.float64, device=device
            )
            build_tol = 1e-12 if dtype == torch.float64 else 1e-9
            g_t, _ = _solve_target_rows(
                transition,
                targets.to(device),
                tol=build_tol * (1 - self.damping),
                max_iter=max_iter,
            )
            is_target = torch.zeros(n, dtype=torch.bool)
            is_target[targets] = True
            others = torch.nonzero(~is_target).flatten()
            # G = L[T, :] split by column: [T, T] for the target rows of r, and the rest stored
            # transposed ([N−T, T], row-major) so gathering a few nonzero seed rows is contiguous.
            self._g_target = g_t[targets.to(device)].T.contiguous().to(dtype)  # [T, T]
            self._g_rest_t = g_t[others.to(device)].to(dtype).contiguous()  # [N−T, T]
            del g_t
            self._targets = targets.to(device)
            self._others = others.to(device)
            self._dangling = transition.dangling
            return

        self.backend = _pick_backend(kernel, device)
        if reorder is None:
            reorder = self.backend == "numba"
        perm = rcm_permutation(adjacency) if reorder else None
        adj = _permute_csr(adjacency, perm) if perm is not None else adjacency
        # The operator in float64, and in float32 sharing its indices: a float32 solve checks
        # each certificate on the float64 residual and finishes stalled columns in float64
        # (module docstring, "Round-off floor"); 8 more bytes per edge than float32 alone.
        exact = build_transition(adj, damping=damping, dtype=torch.float64, device=device)
        self.transition = exact if dtype == torch.float64 else _cast_transition(exact, dtype)
        self._exact = None if dtype == torch.float64 else exact
        self._max_row_nnz = int((adj.crow_indices()[1:] - adj.crow_indices()[:-1]).max()) \
            if n else 0
        if perm is not None:
            inverse = torch.empty_like(perm)
            inverse[perm] = torch.arange(n)
            self._perm = perm.to(device)
            self._out_rows = inverse[targets].to(device)  # position of each target after perm
        else:
            self._out_rows = None if target_nodes is None else targets.to(device)
        self._workspace = None  # the numba kernel's per-thread buffers, grown on demand
        self._scaled_values: np.ndarray | None = None  # d·M values for the numba kernel
        self._scaled_values64: np.ndarray | None = None  # ... in float64, for its verification
        self._identity: np.ndarray | None = None  # [N] 0..N-1 for the numba kernel, made once
        self._workspace_lock = threading.Lock()  # concurrent calls must not share them

    def to(self, device: torch.device | str) -> PPRSolver:
        """Move every precomputed tensor to ``device`` (in place); returns self.

        A numba-backed solver moved to CUDA switches to the torch backend, and back.
        """
        device = torch.device(device)
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                setattr(self, name, value.to(device))
        if self._exact is not None:
            self._exact = self._exact.to(device)
        if self.transition is not None:
            self.transition = self.transition.to(device)
            if self.backend == "numba" and device.type != "cpu":
                self.backend = "torch"
            elif self.backend == "torch" and device.type == "cpu":
                self.backend = _pick_backend("auto", device)
        self.device = device
        return self

    def __call__(
        self,
        seeds: Tensor,
        *,
        tol: float | None = None,
        max_iter: int | None = None,
        top_k: int | None = None,
    ) -> Tensor:
        """PPR probabilities at the target rows; raises if any column is left uncertified.

        Args:
            seeds: [N, Q] non-negative reset weights in original node order (any device/dtype;
                cast to the solver's).
            tol: L1 error bound per column (iterations; closed form is exact to its build tol).
            max_iter: iteration cap (iterations).
            top_k: certified top-k exit for this call (default the solver's ``top_k``).

        Returns:
            [T, Q] (or [N, Q]) tensor in the solver's dtype and device.

        Raises:
            ConvergenceError: some columns are uncertified (see :meth:`solve`).
        """
        solution = self.solve(seeds, tol=tol, max_iter=max_iter, top_k=top_k)
        solution.raise_if_uncertified()
        return solution.scores

    def solve(
        self,
        seeds: Tensor,
        *,
        tol: float | None = None,
        max_iter: int | None = None,
        top_k: int | None = None,
    ) -> PPRSolution:
        """Like ``solver(seeds)``, but never raises for an uncertified column: the returned
        :class:`PPRSolution` marks it (its scores are the last iterate), so a caller can fail
        that query alone. Stalled float32 columns are finished in float64 (module docstring)."""
        seeds = seeds.to(device=self.device, dtype=self.dtype)
        tol = self.tol if tol is None else float(tol)
        max_iter = self.max_iter if max_iter is None else int(max_iter)
        top_k = self.top_k if top_k is None else _check_top_k(top_k)
        if self.method == "closed_form":
            scores = self._closed_form(seeds)
            q = scores.shape[1]
            zeros = torch.zeros(q, dtype=torch.int64, device=scores.device)
            solution = PPRSolution(scores, zeros, torch.zeros(q, dtype=self.dtype,
                                   device=scores.device), torch.ones_like(zeros, dtype=torch.bool),
                                   torch.zeros_like(zeros, dtype=torch.bool), tol)
        else:
            scores, steps, bound, certified, stalled = self._iterate(seeds, tol, max_iter, top_k)
            refined = torch.zeros_like(stalled)
            if self.dtype == torch.float32 and bool(stalled.any()):
                cols = torch.nonzero(stalled).flatten()
                exact = self._float64_twin().solve(seeds.index_select(1, cols).double(), tol=tol,
                                                   max_iter=max_iter, top_k=top_k)
                scores[:, cols] = exact.scores.to(scores.dtype)
                steps[cols] += exact.steps.to(steps.device)
                bound[cols] = exact.bound.to(bound.dtype)
                certified[cols] = exact.certified.to(certified.device)
                refined[cols] = True
            solution = PPRSolution(scores, steps, bound, certified, refined, tol)
        self.last_steps, self.last_error_bound = solution.steps, solution.bound
        self.last_iterations = int(solution.steps.max()) if solution.steps.numel() else 0
        return solution

    def _iterate(self, seeds: Tensor, tol: float, max_iter: int,
                 top_k: int | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(scores [T, Q], steps, bound, certified, stalled [Q]) of the iteration's backend."""
        transition = self.transition
        if transition is None:  # only the closed form drops it
            raise RuntimeError("PPRSolver has no transition for the iterate method")
        if self.backend == "numba" and self.damping > 0:  # normalises in-kernel: batch-invariant
            _check_seeds_shape(seeds, self.num_nodes)  # values: per column group, in _numba
            return self._numba(seeds, tol, max_iter, top_k or 0)
        r_hat = _normalised_seeds(seeds, self.num_nodes)
        if self._perm is not None:
            r_hat = r_hat.index_select(0, self._perm)
        rows = self._out_rows
        solve = ppr_chebyshev if self.method == "chebyshev" else ppr_iterate
        step = _triton_step(transition) if self.backend == "triton" else None
        result = solve(transition, r_hat, tol=tol, max_iter=max_iter, normalised=True,
                       top_k=top_k, target_rows=rows, step=step, exact=self._exact)
        scores = result.scores if rows is None else result.scores.index_select(0, rows)
        return scores, result.iterations, result.error_bound, result.certified, result.stalled

    def _float64_twin(self) -> PPRSolver:
        """This solver in float64 (same method, backend, order and targets, the kept float64
        operator), made on the first stall: the float64 finish of the module docstring."""
        with self._workspace_lock:
            if self._twin is None:
                twin = copy.copy(self)
                twin.dtype = torch.float64
                twin.transition, twin._exact = self._exact, None
                twin._workspace = None
                twin._scaled_values = twin._scaled_values64 = None
                twin._workspace_lock = threading.Lock()
                self._twin = twin
            return self._twin

    def _numba(self, seeds: Tensor, tol: float, max_iter: int,
               top_k: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The fused CPU kernel (hippo_gpu.kernels.ppr_cpu): same iterates as the torch path;
        ``seeds`` are validated but not normalised (the kernel divides by its own column sums)."""
        from hippo_gpu.kernels import ppr_cpu

        if self.transition is None:
            raise RuntimeError("PPRSolver has no transition for the numba kernel")
        n, q = seeds.shape
        if self._identity is None:  # seeds arrive permuted, so the kernel's own perm is identity
            self._identity = np.arange(n, dtype=np.int64)
        identity = self._identity
        rows = identity if self._out_rows is None else self._out_rows.numpy()
        weights = np.asarray(
            chebyshev_weights(self.damping, max_iter)
            if self.method == "chebyshev"
            else [1.0] * max_iter,
            dtype=np.float64,
        )
        matrix = self.transition.matrix
        if self._scaled_values is None:  # d·M once per solver; indices are shared zero-copy
            self._scaled_values = (matrix.values() * self.damping).numpy()
            if self._exact is not None:
                self._scaled_values64 = (self._exact.matrix.values() * self.damping).numpy()
        # the float64 check's slack, in residual units: r̂ rounded once into float32 moves y*
        # by ≤ 2⁻²⁴ in L1 (‖L‖₁ ≤ 1), plus float64 round-off of the longest row's sum
        slack = (1.0 - self.damping) * 2.0 ** -24 + (self._max_row_nnz + 2) * 2.0 ** -52
        itemsize = seeds.element_size()
        threads = torch.get_num_threads()
        # Column groups of one block per thread: each group is copied (and permuted) into its
        # own contiguous [N, G] array, so the kernel streams exactly the layout of a G-column
        # call and a batch of 256 costs what 8 batches of 32 cost (measured: a strided fill from
        # one wide [N, Q] array made Q = 256 ~20 % slower per query than Q = 32 on musique).
        _, widths, _ = ppr_cpu.block_layout(q, itemsize, threads, n)
        group = int(widths.max()) * max(1, min(threads, widths.size))
        parts: list[tuple[np.ndarray, ...]] = []
        with self._workspace_lock:  # one call at a time per solver: they share the buffers
            for q0 in range(0, q, group):
                cols = seeds[:, q0:q0 + group]
                if self._perm is not None:  # the copy also applies the locality order
                    cols = cols.index_select(0, self._perm)
                cols = cols.contiguous()
                _check_seeds(cols, n, first_column=q0)  # on the copy, while it is in cache
                reset = cols.numpy()
                _, widths, _ = ppr_cpu.block_layout(reset.shape[1], itemsize, threads, n)
                slots = min(threads, widths.size)
                if self._workspace is None or not ppr_cpu.workspace_fits(
                    self._workspace, n, int(widths.max()), slots, reset.dtype
                ):
                    self._workspace = ppr_cpu.make_workspace(
                        n, int(widths.max()), slots, reset.dtype
                    )
                parts.append(ppr_cpu.solve_blocks(
                    matrix.crow_indices().numpy(),  # zero-copy views of the torch CSR
                    matrix.col_indices().numpy(),
                    self._scaled_values,
                    reset,
                    identity,
                    rows,
                    weights,
                    damping=self.damping,
                    tol=tol,
                    top_k=top_k,
                    threads=threads,
                    stall_steps=stall_steps(self.damping),
                    data64=self._scaled_values64,
                    slack=slack,
                    workspace=self._workspace,
                ))
        joined = [np.concatenate([p[k] for p in parts], axis=1 if k == 0 else 0)
                  for k in range(5)] if len(parts) > 1 else list(parts[0])
        scores, steps, bound, certified, stalled = (torch.from_numpy(a) for a in joined)
        return scores, steps, bound, certified, stalled

    def _closed_form(self, seeds: Tensor) -> Tensor:
        """x_T = G r / (cᵀ r); r needs no normalisation (the ratio is scale-free)."""
        r = _normalised_seeds(seeds, self.num_nodes)  # validation; also keeps magnitudes tame
        self.last_iterations = 0
        r_target = r.index_select(0, self._targets)  # [T, Q]
        out = self._g_target @ r_target  # [T, Q]
        if self._others.numel():
            r_rest = r.index_select(0, self._others)  # [N−T, Q]
            active = torch.nonzero(r_rest.ne(0).any(dim=1)).flatten()  # [K] rows with any seed
            if active.numel():
                g = self._g_rest_t.index_select(0, active)  # [K, T]
                out.addmm_(g.T, r_rest.index_select(0, active))
        dangling_mass = (r * self._dangling.unsqueeze(1)).sum(dim=0)  # [Q]
        return out / (1.0 - self.damping * dangling_mass)


def _cast_transition(transition: Transition, dtype: torch.dtype) -> Transition:
    """The same operator with values cast to ``dtype`` (index tensors shared, not copied)."""
    m = transition.matrix
    matrix = torch.sparse_csr_tensor(m.crow_indices(), m.col_indices(), m.values().to(dtype),
                                     m.shape, check_invariants=False)
    return Transition(matrix, transition.dangling, transition.damping)


def _pick_backend(kernel: str, device: torch.device) -> str:
    """Resolve ``kernel`` for ``device`` once per solver (see :class:`PPRSolver`)."""
    import hippo_gpu.kernels as kernels

    if kernel not in ("auto", "numba", "torch", "triton"):
        raise ValueError(f"kernel must be auto, numba, torch or triton, got {kernel!r}")
    if kernel == "auto":
        if kernels.FORCE_TORCH:
            return "torch"
        if device.type == "cpu":
            return "numba" if kernels.AVAILABLE else "torch"
        return "triton" if device.type == "cuda" and kernels.USE_TRITON else "torch"
    if kernel == "numba" and (device.type != "cpu" or not kernels.AVAILABLE):
        raise ValueError("kernel='numba' needs a CPU device and numba (extra 'kernels')")
    if kernel == "triton" and device.type != "cuda":
        raise ValueError("kernel='triton' needs a CUDA device")
    return kernel


def _triton_step(transition: Transition) -> StepFn:
    from hippo_gpu.kernels import ppr_triton

    return ppr_triton.make_step(transition.matrix, transition.damping)
