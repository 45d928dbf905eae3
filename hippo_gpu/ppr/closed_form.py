"""PPR in closed form: the passage rows of L = (1−d)(I − dM)⁻¹, solved once per index.

y is linear in r, so x_T = G r / (cᵀ r) with G = L[T, :] and c = 1ᵀL. Because dangling nodes
of a symmetric graph are isolated, c_j = 1 − d·[j dangling] exactly. G is solved once (T
right-hand sides, :func:`solve_target_rows`); a query batch is then one [T, T] x [T, Q] GEMM
for the target rows of r plus a gathered GEMM over the few other nonzero rows (HippoRAG 2: ~5
phrase seeds per query). It needs T·N values of memory, so :class:`~hippo_gpu.ppr.PPRSolver`
picks it ("auto") only on CUDA and within its memory budget.

**Its certificate.** What a query needs is ‖(Ĝ − G) r‖₁ over the T rows, for r ≥ 0: at most
‖r‖₁ · max_j ‖Ĝ[:, j] − G[:, j]‖₁, the largest column L1 error of G. The build iterates
Z = Gᵀ ([N, T], row j of Z is column j of G) by Z ← (1−d) E_T + d Mᵀ Z, where Mᵀ = D⁻¹A is
row-stochastic (zero on a dangling row): ‖(Mᵀ W)[j, :]‖₁ ≤ Σ_i Mᵀ_ji ‖W[i, :]‖₁ ≤ max_i ‖W[i, :]‖₁,
so the map contracts by d in the norm |||W||| = max_j ‖W[j, :]‖₁, and after step k

    |||Z_k − Z*||| ≤ (d |||Z_k − Z_{k−1}||| + ε_k) / (1 − d) =: E                              (C1)

where ε_k = (deg_max + 3)·2⁻⁵² |||Z_k||| bounds the float64 round-off of the step (Z ≥ 0: each
entry sums deg + 1 non-negative terms, γ_{deg+1} of the result, and M is rounded by γ_{deg+2}).
The build stops once d |||Z_k − Z_{k−1}|||/(1 − d) ≤ its tol (ε_k, which no step shrinks,
is reported in E but not waited on). A query then computes, with G stored in the solver's dtype
(relative rounding u_G per entry), the product accumulated in float64 (the float32 G upcast by
row blocks: a float32 accumulation over T ~ 10⁴ terms has the worst-case bound γ_T ≈ 6e-4, far
above any tol) and σ = cᵀr by pairwise float64 sums,

    ‖x̂ − x*‖₁ ≤ (E ‖r‖₁ + (u_G + γ_K)(1 + 2⁻²⁰) Σŷ + θ_σ ‖r‖₁) / σ̂ + ω(dtype, T)·max(1, Σŷ/σ̂)   (C2)

for x* = G r / cᵀr with r the reset vector as given: ŷ the computed G r (K terms per entry,
γ_K for their float64 dot products, all non-negative), θ_σ = γ_L(1 + d) + 3·2⁻⁵³ the relative
error of σ̂ (two pairwise sums of depth L − 1 = ⌈log₂ N⌉ and an axpy), using ‖y*_T‖₁ ≤ σ so that
x̂'s normalisation by σ̂ instead of σ costs |σ̂ − σ|/σ̂; ω of hippo_gpu.ppr.rounding (R1) is
the division and the cast of the result (a float64 division of ŷ, whose L1 is Σŷ/σ̂ ≤ 1 + the
bound). As ‖r‖₁ ≥ σ and the last term is at least ω(dtype, T), no bound falls below
floor(dtype, T) + E (hippo_gpu.ppr.rounding's floor, which holds ω(float64, T) too):
:meth:`ClosedForm.check_tol` refuses a tol at or below it. The storage term u_G Σŷ/σ̂ is as large
as the share of the mass the targets hold: ~6e-8 for a float32 G whose targets hold it all.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hippo_gpu.ppr.iteration import ConvergenceError, Transition, build_transition
from hippo_gpu.ppr.rounding import (
    ToleranceError,
    certifiable_floor,
    output_rounding,
    pairwise_sum,
    unit_roundoff,
)

__all__ = ["ClosedForm", "build_bytes", "solve_target_rows"]

U64 = 2.0 ** -53
# [N, T] float64 arrays the build holds at once: the constant term, Z_k, Z_{k+1} and the
# temporary |Z_k − Z_{k+1}| of the step's bound; G's stored copies come after, from one of them
BUILD_ARRAYS = 4
UPCAST_BLOCK = 1 << 24  # entries of G upcast to float64 at a time (128 MB)


def _gamma(k: int) -> float:
    return k * U64 / (1.0 - k * U64)


def build_bytes(num_nodes: int, num_targets: int) -> int:
    """The bytes the closed form's build holds at its peak, BUILD_ARRAYS [N, T] float64 arrays
    (whatever G's storage dtype: it is solved in float64); the sparse operator is extra, and
    small beside them. tests/ppr/test_closed_form_memory.py measures the peak on the CPU."""
    return BUILD_ARRAYS * 8 * num_nodes * num_targets


def solve_target_rows(
    transition: Transition, targets: Tensor, *, tol: float, max_iter: int
) -> tuple[Tensor, int, float]:
    """Rows ``targets`` of L = (1−d)(I − dM)⁻¹, i.e. G = L[T, :] as an [N, T] matrix Gᵀ.

    Gᵀ = (1−d)(I − dMᵀ)⁻¹ E_T solves Z = (1−d) E_T + d Mᵀ Z, with Mᵀ = P = D⁻¹A (row-stochastic
    or zero rows, so the map contracts by d in the norm max_j ‖Z[j, :]‖₁: module docstring, C1).
    Returns (Gᵀ [N, T], steps, E): E bounds the largest column L1 error of G, float64 round-off
    included; ``tol`` bounds its contraction part.
    """
    d = transition.damping
    matrix = transition.matrix
    n = transition.num_nodes
    crow = matrix.crow_indices()
    deg_max = int((crow[1:] - crow[:-1]).max()) if n else 0
    # Mᵀ as CSR: transpose of M = A D⁻¹ is D⁻¹ A; build it from M's COO with rows/cols swapped.
    coo = matrix.to_sparse_coo().coalesce()
    idx = coo.indices()
    m_t = torch.sparse_coo_tensor(idx.flip(0), coo.values(), (n, n)).coalesce().to_sparse_csr()
    t = targets.numel()
    base = torch.zeros(n, t, dtype=matrix.dtype, device=matrix.device)  # [N, T]
    base[targets, torch.arange(t, device=matrix.device)] = 1.0 - d
    z = base.clone()
    z_next = torch.empty_like(z)
    step_round = (deg_max + 3) * 2.0 ** -52  # ε_k per unit of |||Z_k||| (C1)
    bound = math.inf
    for step in range(1, max_iter + 1):
        torch.addmm(base, m_t, z, beta=1.0, alpha=d, out=z_next)
        z.sub_(z_next)
        delta = float(z.abs().sum(dim=1).max()) if z.numel() else 0.0  # |||Z_k − Z_{k−1}|||
        size = float(z_next.sum(dim=1).max()) if z.numel() else 0.0  # |||Z_k||| (Z ≥ 0)
        z, z_next = z_next, z
        # the float64 row sums behind delta and size are low by at most γ_T each
        grow = 1.0 + (t + 8) * 2.0 ** -52
        if d * delta * grow / (1.0 - d) <= tol:  # the round-off part does not shrink: apart
            return z, step, (d * delta + step_round * size) * grow / (1.0 - d)
        bound = d * delta * grow / (1.0 - d)
    raise ConvergenceError(f"target-row solve did not reach {tol} in {max_iter} iterations "
                           f"(bound {bound:.3g})")


class ClosedForm:
    """G = L[T, :] of one graph, split by column for the product with sparse reset vectors.

    Args:
        adjacency: [N, N] symmetric sparse CSR.
        targets: [T] int64 rows to return.
        damping: d.
        dtype: storage dtype of G (it is solved in float64) and of the returned scores.
        device: where G lives.
        max_iter: step cap of the build.
    """

    def __init__(self, adjacency: Tensor, targets: Tensor, *, damping: float, dtype: torch.dtype,
                 device: torch.device, max_iter: int) -> None:
        n = adjacency.shape[0]
        transition = build_transition(adjacency, damping=damping, dtype=torch.float64,
                                      device=device)
        build_tol = 1e-12 if dtype == torch.float64 else 1e-9
        g_t, _, self.build_error = solve_target_rows(
            transition, targets.to(device), tol=build_tol * (1 - damping), max_iter=max_iter)
        is_target = torch.zeros(n, dtype=torch.bool)
        is_target[targets] = True
        others = torch.nonzero(~is_target).flatten()
        # [T, T] for the target rows of r, and the rest stored transposed ([N−T, T], row-major)
        # so gathering a few nonzero seed rows is contiguous.
        self.g_target = g_t[targets.to(device)].T.contiguous().to(dtype)  # [T, T]
        self.g_rest_t = g_t[others.to(device)].to(dtype).contiguous()  # [N−T, T]
        del g_t
        self.targets = targets.to(device)
        self.others = others.to(device)
        self.dangling = transition.dangling
        self.damping = damping
        self.dtype = dtype
        self.num_nodes = n

    def to(self, device: torch.device) -> ClosedForm:
        """Move G and its row lists to ``device`` (in place); returns self."""
        for name in ("g_target", "g_rest_t", "targets", "others", "dangling"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def floor(self) -> float:
        """A tol no bound of (C2) can meet: the result's rounding and the build's error (module
        docstring)."""
        return certifiable_floor(self.dtype, self.targets.numel()) + self.build_error

    def check_tol(self, tol: float) -> None:
        """Refuse a tol at or below :meth:`floor` (:class:`ToleranceError`)."""
        floor = self.floor()
        if tol <= floor:
            name = str(self.dtype).removeprefix("torch.")
            raise ToleranceError(tol, self.dtype, self.targets.numel(), floor,
                                 certifiable_floor(torch.float64, self.targets.numel()),
                                 what=f"the closed form's {name} result and its G")

    def __call__(self, r: Tensor) -> tuple[Tensor, Tensor]:
        """(x_T [T, Q] in the storage dtype, its L1 bound [Q] float64, eq. C2) of x_T =
        G r / (cᵀ r) for [N, Q] non-negative reset weights r (the ratio is scale-free)."""
        r64 = r.to(torch.float64)
        t = self.targets.numel()
        r_target = r64.index_select(0, self.targets)  # [T, Q]
        y = torch.empty(t, r.shape[1], dtype=torch.float64, device=r.device)  # [T, Q]
        rows = max(1, UPCAST_BLOCK // max(t, 1))
        for a in range(0, t, rows):  # blocks of G's rows upcast: a float64 accumulation
            y[a:a + rows] = self.g_target[a:a + rows].to(torch.float64) @ r_target
        terms = t
        if self.others.numel():
            r_rest = r64.index_select(0, self.others)  # [N−T, Q]
            active = torch.nonzero(r_rest.ne(0).any(dim=1)).flatten()  # [K] rows with any seed
            if active.numel():
                g = self.g_rest_t.index_select(0, active).to(torch.float64)  # [K, T]
                y.addmm_(g.T, r_rest.index_select(0, active))
                terms += active.numel()
        mass = pairwise_sum(r64)  # [Q] ‖r‖₁
        sigma = mass - self.damping * pairwise_sum(r64 * self.dangling.unsqueeze(1))  # cᵀr
        y_sum = pairwise_sum(y.clamp(min=0))  # Σŷ (ŷ ≥ 0 up to round-off)
        depth = math.ceil(math.log2(max(self.num_nodes, 2))) + 1
        theta = _gamma(depth) * (1.0 + self.damping) + 3 * U64
        storage = (unit_roundoff(self.dtype) + _gamma(terms + 2)) * (1.0 + 2.0 ** -20)
        err = (self.build_error + theta) * mass * (1.0 + _gamma(depth)) + storage * y_sum
        ratio = torch.clamp(y_sum / sigma, min=1.0)
        bound = err / sigma + output_rounding(self.dtype, t) * ratio
        return (y / sigma).to(self.dtype), bound
