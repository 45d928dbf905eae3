"""The PPR equations and their batched iterations: Q queries per solve, one sparse x dense product
per step, each column stopped on a certified bound.

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
checked step where 2·(bound of (3))/σ + ω ≤ ``tol``, ω the rounding of the returned vector
(below, "What is returned is rounded"). The bound is on the L1 error, so it also bounds
the max abs error; it uses only the measured residual, never a spectral estimate, so it holds for
every method below. (In float32 it is certified up to the round-off of computing ρ itself.)

**Power iteration** (``ppr_solve(method="power")``): y_{k+1} = g_k; its error contracts by d
per step in L1 (today's bound (3) on g). About 17 steps for tol 1e-6 and 32 for 1e-11 on
musique_train.

**Chebyshev semi-iteration** (``ppr_solve(method="chebyshev")``, the default). M is similar to
a symmetric matrix: let s_i = √D_ii, s_i = 1 for a dangling node, Σ = diag(s) and
S = Σ⁻¹ A Σ⁻¹ (symmetric). Then (Σ S Σ⁻¹)_ij = A_ij / s_j², which is A_ij / D_jj = M_ij for a
non-dangling j and 0 = M_ij for a dangling j (its column of A is zero: the leak of (2) is kept
exactly). So M = Σ S Σ⁻¹ has real eigenvalues, and |λ| ≤ ‖M‖₁ ≤ 1: the spectrum of G = dM lies
in [−d, d] (both ends occur: the passage–phrase part of the graph is nearly bipartite). For
y = G y + c, c = (1−d) r̂, the Chebyshev semi-iteration (Golub & Varga 1961)

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

**Round-off floor, the float64 check and the float64 finish.** Bound (3) is computed from the
measured residual ρ, and in float32 ρ itself carries round-off: each g_i sums deg(i) products
with relative error up to ~deg(i)·2⁻²⁴, and at a float32 fixed point the measured residual can
vanish while the true one does not. So a float32 bound is no certificate by itself (measured on
a hub graph, tests/ppr/test_roundoff.py: a float32 "bound" of 1e-10 on a column whose true L1
error was 4e-7), and it also stops decreasing at a floor (~2e-8 to ~2e-7 on musique's graphs;
above the float32 default tol 1e-6 on larger or denser graphs). Three rules follow.

1. *Every float32 certificate is checked in float64.* When a column's float32 bound meets tol
   (or its top-k certificate holds), its iterate y is re-checked: with g₆₄ = (1−d) r̂ + d M₆₄ y
   computed in float64 (M₆₄ kept beside the float32 operator, sharing its indices), and g* the
   same step in exact arithmetic, ‖g₆₄ − g*‖₁ ≤ ε₆₄ = (deg_max + 4)·2⁻⁵² (each g_i sums
   deg(i) + 1 non-negative-weighted terms, γ_{deg+1}·((1−d) + d‖y‖₁); M₆₄ is M rounded by
   γ_{deg+2}, d‖y‖₁ more; r̂ and (1−d) r̂ rounded in float64, 3·2⁻⁵³(1−d); ‖y‖₁ ≤ 1 + tol). By
   (3) applied to g*, ‖g* − y*‖₁ ≤ d/(1−d) ‖g* − y‖₁, so

       ‖g − y*‖₁ ≤ ‖g − g₆₄‖₁ + d/(1−d) ‖g₆₄ − y‖₁ + ε₆₄/(1−d)     (torch path, returns g)
       ‖y − y*‖₁ ≤ (‖g₆₄ − y‖₁ + ε₆₄) / (1−d)                        (kernel, returns y)

   each plus what r̂ rounded into float32 moves y* (2⁻²³ in the torch path, which rounds r̂ and
   (1−d) r̂; (1−d)·2⁻²⁴ in residual units in the kernel; ‖L‖₁ ≤ 1). Normalised as above, that
   float64 bound, times :func:`~hippo_gpu.ppr.rounding.inflation` for the float64 sums it is
   computed from, is the one reported. A refuted column iterates on (a step shrinks the true
   residual too, down to float32's own floor) and is checked again.
2. *A stall is detected, not waited out.* In exact arithmetic the bound falls geometrically (the
   power iteration contracts ρ by d per step in L1, ‖dM‖₁ ≤ d; Chebyshev faster), so it halves
   at least every ⌈ln 2 / ln(1/d)⌉ steps. A column whose float32 bound has not halved in
   ``stall_steps(d)`` = max(8, 4⌈ln 2 / ln(1/d)⌉) steps, or whose certificate was refuted that
   many times, is at its floor: it stops at once ("stalled") instead of running to max_iter.
3. *Stalled columns are finished in float64.* :class:`~hippo_gpu.ppr.PPRSolver` solves exactly
   those columns again in float64 (the kept operator), its bound holding ε₆₄ too, to tol − ω
   below: float64's floor is ~2⁻²⁹ of float32's, so it certifies any tol the float32 result can
   hold, and the float32 columns that passed keep float32's speed.

**What is returned is rounded, and the bound says so.** Every bound reported above is of the
vector returned: x clamped, normalised in float64 and rounded into the result's dtype
(:func:`~hippo_gpu.ppr.rounding.normalise`, the kernel's emit), so it adds ω(dtype, N) of
hippo_gpu.ppr.rounding eq. (R1) (2⁻²⁴ for a float32 result; ~4e-15 for float64), and a column
stops when (bound of (3)) + ω ≤ ``tol``. A float32 column finished in float64 reports its float64
bound (holding float64's ω) plus float32's ω for the cast. A tol at or below that floor is
refused before any step (:class:`~hippo_gpu.ppr.rounding.ToleranceError`, naming the smallest
tol the dtype and float64 can certify). Bounds are float64 tensors: a float32 bound would round
below the float64 value it stands for half the time.

Only a column that runs out of ``max_iter`` steps while its bound still falls (or one that
stalls in float64 too: a tol just above the float64 floor) is left uncertified; the solver then
raises :class:`ConvergenceError` naming those columns, and :meth:`PPRSolver.solve` returns them
marked, so a caller can fail those queries alone. A float64 solve's own bound is computed from
its float64 residual without ε₆₄ (its round-off, ~4e-13 in bound units on musique's passage
graph at deg_max 379: far below the float64 default tol 1e-11, but not added), except for the
float64 finish of float32 columns, which adds it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hippo_gpu.errors import HippoGpuError
from hippo_gpu.ppr.certificate import Float64Check, check_top_k, classify, stall_steps
from hippo_gpu.ppr.rounding import check_tol, inflation, normalise, output_rounding

__all__ = [
    "DEFAULT_MAX_ITER",
    "ITERATIONS",
    "ConvergenceError",
    "PPRResult",
    "StepFn",
    "Transition",
    "build_transition",
    "chebyshev_weights",
    "check_adjacency",
    "check_damping",
    "check_seeds",
    "check_seeds_shape",
    "default_tol",
    "normalised_seeds",
    "ppr_solve",
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


def default_tol(dtype: torch.dtype) -> float:
    """L1 error bound used when ``tol`` is None: tight for float64, above round-off for float32."""
    return 1e-11 if dtype == torch.float64 else 1e-6


@dataclass(frozen=True)
class PPRResult:
    """Output of :func:`ppr_solve`.

    Attributes:
        scores: [N, Q] PPR probabilities; each column sums to 1.
        iterations: [Q] int64, the sparse products after which each column was certified (met
            ``tol`` or, with ``top_k``, the top-k certificate) and frozen; max_iter if never,
            the step it stopped at if it stalled. Checks are spaced by the observed decay, so
            this can exceed the first possible step.
        error_bound: [Q] float64 L1 error bound of each column's returned scores (their
            rounding included: module docstring).
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


def check_damping(damping: float) -> float:
    damping = float(damping)
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping}")
    return damping


def check_adjacency(adjacency: Tensor) -> None:
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
    damping = check_damping(damping)
    check_adjacency(adjacency)
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


def check_seeds_shape(seeds: Tensor, num_nodes: int) -> None:
    """The checks of :func:`check_seeds` that read no values."""
    if not isinstance(seeds, Tensor) or seeds.layout != torch.strided:
        raise ValueError("seeds must be a dense torch.Tensor [N, Q]")
    if seeds.dim() != 2 or seeds.shape[0] != num_nodes:
        raise ValueError(f"seeds must have shape [N={num_nodes}, Q], got {tuple(seeds.shape)}")
    if seeds.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"seeds must be float32 or float64, got {seeds.dtype}")
    if seeds.numel() == 0:
        raise ValueError("seeds has no entries")


def check_seeds(seeds: Tensor, num_nodes: int, *, first_column: int = 0) -> Tensor:
    """Validate [N, Q] reset weights; return their column sums 1ᵀr [1, Q] (two passes).

    ``first_column``: the batch column of ``seeds``' column 0 (errors name batch columns)."""
    check_seeds_shape(seeds, num_nodes)
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


def normalised_seeds(seeds: Tensor, num_nodes: int) -> Tensor:
    """Validate [N, Q] reset weights and return r̂ = r / 1ᵀr (column-wise)."""
    return seeds / check_seeds(seeds, num_nodes)


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


ITERATIONS = ("chebyshev", "power")  # the methods of ppr_solve


def ppr_solve(
    transition: Transition,
    reset: Tensor,
    *,
    method: str = "chebyshev",
    tol: float | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
    normalised: bool = False,
    top_k: int | None = None,
    target_rows: Tensor | None = None,
    step: StepFn | None = None,
    exact: Transition | None = None,
    round_off: float = 0.0,
) -> PPRResult:
    """PPR of all Q columns at once by an iteration; returns x = y / 1ᵀy.

    Both methods stop on the same certified L1 bound (module docstring): "chebyshev" (the
    semi-iteration (4), the default: about 30 % fewer sparse products on musique_train) or
    "power" (y ← (1−d) r̂ + d M y).

    Args:
        transition: operator from :func:`build_transition`, same device as ``reset``; its value
            dtype should equal ``reset``'s.
        reset: [N, Q] non-negative reset weights (normalised here unless ``normalised``).
        method: one of :data:`ITERATIONS`.
        tol: L1 error bound per column (default :func:`default_tol` of the dtype).
        max_iter: at most this many sparse products.
        normalised: skip validation; ``reset`` columns already sum to 1.
        top_k: also stop a column once its top-k ``target_rows`` (and order) are certain.
        target_rows: [T] rows the top-k certificate ranks (default all N).
        step: replaces the torch step of :data:`StepFn` (e.g. a fused kernel).
        exact: the same operator in float64, for a float32 ``reset``: each certificate is
            checked on the float64 residual, and a column failing it returns stalled.
        round_off: an L1 bound of the round-off of one computed step, ‖ĝ − g*‖₁ (residual
            units), added to every bound: the float64 finish passes ε₆₄ (module docstring).

    Returns:
        :class:`PPRResult` with scores [N, Q].

    Raises:
        ValueError: ``method`` is not one of :data:`ITERATIONS`.
        ToleranceError: ``tol`` is at or below the rounding of the result's dtype.
    """
    if method not in ITERATIONS:
        raise ValueError(f"unknown iteration {method!r}; choose one of {ITERATIONS}")
    weights = chebyshev_weights(transition.damping, max_iter) if method == "chebyshev" else None
    return _solve(transition, reset, weights, tol=tol, max_iter=max_iter, normalised=normalised,
                  top_k=top_k, target_rows=target_rows, step=step, exact=exact,
                  round_off=round_off)


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
    round_off: float = 0.0,
) -> PPRResult:
    """The shared loop: ``weights`` None is the power iteration, else eq. (4) with those ω."""
    n = transition.num_nodes
    r_hat = reset if normalised else normalised_seeds(reset, n)
    tol = default_tol(r_hat.dtype) if tol is None else tol
    tol = check_tol(tol, r_hat.dtype, n)  # refuse a tol below the output's rounding, up front
    if max_iter < 1:
        raise ValueError(f"need max_iter >= 1, got max_iter={max_iter}")
    top_k = check_top_k(top_k)
    d = transition.damping
    q, dev = r_hat.shape[1], r_hat.device
    omega = output_rounding(r_hat.dtype, n)  # (R1): the rounding of the returned columns
    grow = inflation(n)  # the float64 sums a bound is computed from
    iterations = torch.full((q,), max_iter, dtype=torch.int64, device=dev)
    bound = torch.full((q,), math.inf, dtype=torch.float64, device=dev)
    stalled = torch.zeros(q, dtype=torch.bool, device=dev)
    if d == 0.0:  # no walk: x = r̂ exactly, up to its rounding
        return PPRResult(normalise(r_hat), iterations.zero_(), bound.fill_(omega), ~stalled,
                         stalled)
    patience = stall_steps(d)
    halved = torch.full((q,), math.inf, dtype=torch.float64, device=dev)  # bound when halved
    halved_at = torch.zeros(q, dtype=torch.int64, device=dev)  # ... and at which step
    refuted = torch.zeros(q, dtype=torch.int64, device=dev)  # float64 refutations so far
    step = torch_step(transition) if step is None else step
    check = None if exact is None else Float64Check(exact.matrix, exact.damping, omega, grow)
    scores = torch.empty_like(r_hat)  # [N, Q], filled as columns finish
    met = torch.zeros(q, dtype=torch.bool, device=dev)
    cols = torch.arange(q, device=dev)  # original column of each open column
    base = r_hat * (1.0 - d)  # [N, Q']
    y = r_hat.clone()  # any start converges; r̂ keeps the first residual ≤ 2
    y_prev = r_hat.clone() if weights is not None else y
    g = torch.empty_like(y)
    factor = d / (1.0 - d)  # (3): ‖g − y*‖₁ ≤ d/(1−d) ‖ρ‖₁
    slack = round_off / (1.0 - d)  # a step's round-off ε moves that by ε/(1−d) (docstring)
    # The residual costs ~40 % of an SpMM on the CPU and a device sync, so after the first checks
    # we extrapolate the observed decay and check next where tol should be met (every step with
    # top_k, whose certificate can hold any time).
    next_check, last_check, last_worst = 1, 0, math.inf
    for k in range(1, max_iter + 1):
        measure = top_k > 0 or k == next_check or k == max_iter
        omega_k = None if weights is None else weights[k - 1]
        measured = step(base, y, y_prev, g, omega_k, measure)
        if measured is not None:
            residual, mass = (t.to(torch.float64) for t in measured)
            err = (factor * residual + slack) * grow  # bounds ‖g − y*‖₁ per open column
            solve = torch.where(mass > 0, 2.0 * err / mass * grow, math.inf)
            ok, stall, now, halved, halved_at, refuted = classify(
                k, solve, err, base, y, g, halved, halved_at, refuted, tol=tol, omega=omega,
                top_k=top_k, target_rows=target_rows, patience=patience, check=check)
            finish = ok | stall | (k == max_iter)
            if bool(finish.any()):
                idx = torch.nonzero(finish).flatten()
                scores[:, cols[idx]] = normalise(g.index_select(1, idx).clamp_(min=0))
                iterations[cols[idx]] = torch.where(ok[idx] | stall[idx], k, max_iter)
                bound[cols[idx]] = now[idx]
                met[cols[idx]] = ok[idx]
                stalled[cols[idx]] = stall[idx]
                keep = torch.nonzero(~finish).flatten()
                if keep.numel() == 0:
                    break
                cols, solve = cols[keep], solve[keep]
                halved, halved_at, refuted = halved[keep], halved_at[keep], refuted[keep]
                base, y, g = base[:, keep], y[:, keep], g[:, keep]
                y_prev = y_prev[:, keep] if weights is not None else y
            worst = float(solve.max())  # the decay of the solve's bound, without ω
            next_check = k + _steps_to_tol(worst, last_worst, k - last_check, tol - omega)
            last_check, last_worst = k, worst
        if weights is None:
            y, g = g, y  # y_{k+1} = g_k
            y_prev = y
        else:
            y, y_prev = y_prev, y
    return PPRResult(scores, iterations, bound, met, stalled)


def _steps_to_tol(worst: float, previous: float, gap: int, tol: float) -> int:
    """Steps until the next residual check, from the decay rate seen between the last two."""
    if not math.isfinite(previous) or worst <= 0 or worst >= previous:
        return 1
    rate = (worst / previous) ** (1.0 / gap)
    return max(1, min(16, math.ceil(math.log(tol / worst) / math.log(rate))))
