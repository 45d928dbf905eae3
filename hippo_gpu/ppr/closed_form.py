"""PPR in closed form: the passage rows of L = (1−d)(I − dM)⁻¹, solved once per index.

y is linear in r, so x_T = G r / (cᵀ r) with G = L[T, :] and c = 1ᵀL. Because dangling nodes
of a symmetric graph are isolated, c_j = 1 − d·[j dangling] exactly. G is solved once (T
right-hand sides, :func:`solve_target_rows`); a query batch is then one [T, T] x [T, Q] GEMM
for the target rows of r plus a gathered GEMM over the few other nonzero rows (HippoRAG 2: ~5
phrase seeds per query). It needs T·N values of memory, so :class:`~hippo_gpu.ppr.PPRSolver`
picks it ("auto") only on CUDA and within its memory budget.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hippo_gpu.ppr.iteration import ConvergenceError, Transition, build_transition

__all__ = ["ClosedForm", "solve_target_rows"]


def solve_target_rows(
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


class ClosedForm:
    """G = L[T, :] of one graph, split by column for the product with sparse reset vectors.

    Args:
        adjacency: [N, N] symmetric sparse CSR.
        targets: [T] int64 rows to return.
        damping: d.
        dtype: storage dtype of G (it is solved in float64).
        device: where G lives.
        max_iter: step cap of the build.
    """

    def __init__(self, adjacency: Tensor, targets: Tensor, *, damping: float, dtype: torch.dtype,
                 device: torch.device, max_iter: int) -> None:
        n = adjacency.shape[0]
        transition = build_transition(adjacency, damping=damping, dtype=torch.float64,
                                      device=device)
        build_tol = 1e-12 if dtype == torch.float64 else 1e-9
        g_t, _ = solve_target_rows(transition, targets.to(device),
                                   tol=build_tol * (1 - damping), max_iter=max_iter)
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

    def to(self, device: torch.device) -> ClosedForm:
        """Move G and its row lists to ``device`` (in place); returns self."""
        for name in ("g_target", "g_rest_t", "targets", "others", "dangling"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def __call__(self, r: Tensor) -> Tensor:
        """x_T = G r / (cᵀ r) for [N, Q] normalised reset weights r (the ratio is scale-free)."""
        out = self.g_target @ r.index_select(0, self.targets)  # [T, Q]
        if self.others.numel():
            r_rest = r.index_select(0, self.others)  # [N−T, Q]
            active = torch.nonzero(r_rest.ne(0).any(dim=1)).flatten()  # [K] rows with any seed
            if active.numel():
                g = self.g_rest_t.index_select(0, active)  # [K, T]
                out.addmm_(g.T, r_rest.index_select(0, active))
        dangling_mass = (r * self.dangling.unsqueeze(1)).sum(dim=0)  # [Q]
        return out / (1.0 - self.damping * dangling_mass)
