"""The passage basis: PPR of the embedding dimensions, solved once per index version.

HippoRAG 2's reset vector (hippo_gpu.retrieval.seeds.reset_vectors) is r = s + w·minmax(E_P e) at
the passage rows, with s the few phrase seeds of the query, w = ``passage_node_weight``, E_P the [P,
D] passage embeddings and e the query's passage vector. With lo and hi the min and max of E_P e,
minmax(E_P e) = α E_P e + β 1_P for the two scalars α = 1/(hi − lo), β = −lo/(hi − lo) (all ones
when hi = lo: α = 0, β = 1, as upstream). PPR is linear in the reset vector (iteration.py eq. 2: y =
L r̂ with L = (1 − d)(I − dM)⁻¹), so at the passage rows T

    y_T(r) = (L s)_T + w α Z e + w β z1,    Z = L[T, P] E_P  [P, D],   z1 = L[T, P] 1_P  [P],   (B1)

and Z, z1 do not depend on the query: they are D + 1 PPR solves, done once per index version and
damping (:func:`solve_basis`). A query then costs one [P, D] x [D, Q] GEMM for its dense half,
dense retrieval's own price, plus the PPR of its ~5 phrase seeds s, which is local
(hippo_gpu.ppr.push). The normalised scores are x_T = y_T / σ with σ = cᵀ r exactly, where
c = 1ᵀL: c_j = 1 − d·[j dangling] (a non-dangling column of L keeps its mass, iteration.py; an
isolated node keeps 1 − d), so σ needs no solve.

**How Z is solved, and its bound.** The certified solver (:class:`~hippo_gpu.ppr.PPRSolver`,
float64) takes non-negative reset vectors and returns normalised PPR with a certified L1 bound,
so each dimension j is solved as the non-negative column b_j = E_P[:, j] + 1_P (embedding entries
of unit rows lie in [−1, 1]) and then Z_j = L b_j − z1, with L b_j = σ_j x_j, σ_j = cᵀ b_j.
The solver certifies the vector it returns, ‖x̂_j − x*(b̂_j)‖₁ ≤ ε_j, its float64 rounding
included (hippo_gpu.ppr.rounding, R1), for the seed column b̂_j = fl(E_P[:, j] + 1) it was given
(‖b̂_j − b_j‖₁ ≤ 2⁻⁵³‖b_j‖₁, and ‖L‖₁ ≤ 1). The column Y_j = fl(σ̂_j x̂_j) uses σ̂_j, a pairwise
float64 sum of the products c_p b̂_p (σ̂_j = cᵀb̂_j (1 + θ), |θ| ≤ γ_{⌈log₂ P⌉+1}), so with
‖x*‖₁ ≤ 1 at T

    ‖Y_j − (L b_j)_T‖₁ ≤ σ̂_j ε_j + σ̂_j (2⁻⁵³(1 + ε_j) + θ(1 + θ)) + 2⁻⁵³ ‖b̂_j‖₁(1 + 2⁻⁵³)
                       =: β_j,                                                              (B0)

and Z_j = fl(Y_j − z1) adds 2⁻⁵³(‖Y_j‖₁ + ‖z1‖₁) (one rounding per entry). So
‖ΔZ_j‖₁ ≤ β_j + δ₁ + 2⁻⁵³(‖Y_j‖₁ + ‖z1‖₁) =: δ_j, with δ₁ := β of the column 1_P (exact, no
seed rounding) the bound of z1. For a query, the dense half of (B1) is then off by at most

    w (|α| Σ_j |e_j| δ_j + |β| δ₁ + γ),                                                   (B2)

with γ = 2(D + 2)·2⁻⁵³ (|α| Σ_j |e_j| ‖Z_j‖₁ + |β| ‖z1‖₁) the float64 round-off of the GEMM
(Higham's γ_n for an n-term dot product, doubled for the products with α, β). The exact target
is y* = L(s + w α E_P e + w β 1_P) with E_P e in exact arithmetic; the float32 cosines of the
dense scan only choose lo and hi (today's iteration instead feeds those float32 cosines into r:
the two targets differ by the scan's own round-off, which neither method certifies).

**The passage-mass vector h.** The push stops on the error that can reach the passage rows:
for a non-negative residual ρ, ‖(L ρ)_T‖₁ = hᵀρ exactly, with h = Lᵀ 1_T (h_v: the PPR mass a walk
restarting at v leaves on passages). h solves h = (1 − d) 1_T + d D⁻¹A h; D⁻¹A is row-stochastic
(or zero on a dangling row), so that map contracts by d in the max norm and after step k
‖h_k − h*‖_∞ ≤ (d‖h_k − h_{k−1}‖_∞ + ε)/(1 − d), ε = (deg_max + 3)·2⁻⁵² ‖h_k‖_∞ the float64
round-off of a step (each h_j sums deg + 1 non-negative terms, γ_{deg+1}; D⁻¹A is rounded by
γ_{deg+2}). :func:`solve_basis` stores h_k plus that bound, an upper bound of h, so a push
certified with it is certified for the true h. On the synthetic
graphs most phrase mass stays on phrases (mean h ≈ 0.1 over phrases, 0.55 over passages), so
this bound is ~10x tighter than ‖ρ‖₁.

**After a commit: an update, not a patch by push.** With M' the transition after a commit, the
resolvent identity gives L' b'_j = x_j + L' u_j with u_j = d/(1 − d)(M' − M) x_j + (b'_j − b_j),
supported on the few nodes S whose transition column changed, so an update needs x_j at S
(mostly phrase rows the basis does not hold) and the new graph's PPR from S. Computing x_j[u]
by a push is not local at the accuracy the bound needs (benchmarks/bench_basis_locality.py: 3-50x
the graph's edges per node at 100k, more than a re-solve). hippo_gpu.ppr.basis_update instead
solves one certified column a_u = (I − dM)⁻¹ e_u per changed node on the *old* graph (every
quantity of the Woodbury form, x_j at S by the symmetry below included, follows from those
columns) and weights its bound by ‖(M' − M) e_u‖₁, so a hub's large x_j[u] meets its small
column change and its error stays at the solve tolerance; the result is certified like the
basis (basis_update.py, U1-U4). `h_err` records how far h may lie above the true passage mass,
which an update needs and carries forward.

Memory: Z is [P, D] float64 (8·P·D bytes: 51 MB at 100k passages and D = 64), z1 [P], h [N].
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from hippo_gpu.ppr.iteration import ConvergenceError, build_transition
from hippo_gpu.ppr.rounding import pairwise_sum
from hippo_gpu.ppr.solver import PPRSolver

__all__ = ["BASIS_TOL", "PassageBasis", "passage_mass", "solve_basis"]

BASIS_TOL = 1e-11  # per-column L1 tol of the float64 solves (relative to each column's mass)
GEMM_ROUNDING = 2.0 ** -53  # float64 unit round-off
U64 = GEMM_ROUNDING


@dataclass(frozen=True)
class PassageBasis:
    """Z = L[T, P] E_P, z1 = L[T, P] 1_P and h = Lᵀ 1_T of one graph and damping (module doc).

    Attributes:
        z: [P, D] float64.
        z1: [P] float64.
        h: [N] float64, an upper bound of the passage mass reached from each node.
        col_bound: [D] float64 δ_j, L1 bound of each column of z (eq. B2).
        z1_bound: δ₁, L1 bound of z1.
        z_norm1: [D] float64 ‖Z_j‖₁ (for the GEMM round-off term of B2).
        damping: d of the operator.
        tol: per-column tol of the solves.
        steps: the largest number of sparse products of a column solve.
        seconds: wall time of the solve.
        h_err: max-norm distance of h from the true passage mass (h is rounded up by half of
            it); inf when unknown (a basis stored before it was recorded: no update from it).
        updates: low-rank updates since the last full solve (hippo_gpu.ppr.basis_update).
    """

    z: Tensor
    z1: Tensor
    h: Tensor
    col_bound: Tensor
    z1_bound: float
    z_norm1: Tensor
    damping: float
    tol: float
    steps: int
    seconds: float
    h_err: float = float("inf")
    updates: int = 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.z, self.z1, self.h,
                                                          self.col_bound, self.z_norm1))

    def to(self, device: torch.device | str) -> PassageBasis:
        """A copy with every tensor on ``device``."""
        return PassageBasis(self.z.to(device), self.z1.to(device), self.h.to(device),
                            self.col_bound.to(device), self.z1_bound, self.z_norm1.to(device),
                            self.damping, self.tol, self.steps, self.seconds, self.h_err,
                            self.updates)

    def tensors(self) -> dict[str, Tensor]:
        """The tensors to store (names without prefix) and the scalars as 0-d tensors."""
        return {"z": self.z, "z1": self.z1, "h": self.h, "col_bound": self.col_bound,
                "z_norm1": self.z_norm1,
                "scalars": torch.tensor([self.z1_bound, self.damping, self.tol,
                                         float(self.steps), self.seconds, self.h_err,
                                         float(self.updates)], dtype=torch.float64)}

    @classmethod
    def from_tensors(cls, t: dict[str, Tensor]) -> PassageBasis:
        """Inverse of :meth:`tensors` (a basis stored before h_err has 5 scalars: h_err inf)."""
        scalars = t["scalars"].tolist()
        z1_bound, damping, tol, steps, seconds = scalars[:5]
        h_err, updates = scalars[5:7] if len(scalars) >= 7 else (float("inf"), 0.0)
        return cls(t["z"], t["z1"], t["h"], t["col_bound"], z1_bound, t["z_norm1"], damping,
                   tol, int(steps), seconds, h_err, int(updates))

    def dense_part(self, e: Tensor, alpha: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
        """(α Z e + β z1 as [Q, P] float64, its L1 bound [Q] from eq. B2, without the factor w).

        Args:
            e: [Q, D] query vectors (any float dtype; used as float64).
            alpha, beta: [Q] the min-max coefficients of each query.
        """
        e64 = e.to(self.z.device, torch.float64)
        alpha = alpha.to(self.z.device, torch.float64)
        beta = beta.to(self.z.device, torch.float64)
        out = (e64 @ self.z.T).mul_(alpha.unsqueeze(1))  # [Q, P]
        out.add_(beta.unsqueeze(1) * self.z1.unsqueeze(0))
        ae = e64.abs()
        d_plus = self.z.shape[1] + 2
        solve = alpha.abs() * (ae @ self.col_bound) + beta.abs() * self.z1_bound
        rounding = 2 * d_plus * GEMM_ROUNDING * (
            alpha.abs() * (ae @ self.z_norm1) + beta.abs() * float(self.z1.abs().sum()))
        return out, solve + rounding


def passage_mass(adjacency: Tensor, targets: Tensor, *, damping: float,
                 tol: float = 1e-12, max_iter: int = 200) -> tuple[Tensor, float]:
    """(h, b): h = Lᵀ 1_T rounded up by its max-norm bound b (module docstring), [N] float64;
    the true h lies within 2b below it."""
    n = adjacency.shape[0]
    transition = build_transition(adjacency, damping=damping, dtype=torch.float64,
                                  device=adjacency.device)
    # Mᵀ = D⁻¹A as CSR: M's COO with rows and columns swapped (M = A D⁻¹)
    coo = transition.matrix.to_sparse_coo().coalesce()
    # (indices of a coalesced tensor, swapped: valid, so the invariant check is skipped)
    m_t = torch.sparse_coo_tensor(coo.indices().flip(0), coo.values(), (n, n),
                                  check_invariants=False).coalesce().to_sparse_csr()
    crow = m_t.crow_indices()
    step_round = (int((crow[1:] - crow[:-1]).max()) + 3) * 2.0 ** -52 if n else 0.0
    base = torch.zeros(n, 1, dtype=torch.float64, device=adjacency.device)
    base[targets.to(adjacency.device)] = 1.0 - damping
    h = base.clone()
    for _ in range(max_iter):
        nxt = torch.addmm(base, m_t, h, beta=1.0, alpha=damping)
        delta = float((nxt - h).abs().max()) if n else 0.0
        h = nxt
        if damping / (1.0 - damping) * delta <= tol:
            # (d Δ + ε)/(1 − d); each |difference| is within 2⁻⁵³ of itself: rounded up by 2⁻⁵⁰
            bound = (damping * delta + step_round * float(h.max())) / (1.0 - damping) \
                * (1.0 + 2.0 ** -50) if n else 0.0
            return (h[:, 0] + bound).cpu(), bound
    raise ConvergenceError(f"passage-mass solve did not reach {tol} in {max_iter} steps")


def solve_basis(adjacency: Tensor, passage_nodes: Tensor, passage_emb: Tensor, *,
                damping: float = 0.5, tol: float = BASIS_TOL, device: torch.device | str = "cpu",
                memory_budget: int = 2 << 30, max_iter: int = 1000) -> PassageBasis:
    """Z, z1 and h of one graph (module docstring), float64, in column blocks of the budget.

    Args:
        adjacency: [N, N] symmetric sparse CSR (the index graph).
        passage_nodes: [P] node row of each passage.
        passage_emb: [P, D] passage vectors, entries in [−1, 1] (unit rows).
        damping: d.
        tol: per-column L1 tol of the float64 solves.
        device: where to solve (the result is returned on the CPU).
        memory_budget: bytes for one block of [N] float64 columns (about 6 per column in flight:
            seeds, their copies and the solver's state).
        max_iter: step cap per column.

    Raises:
        ConvergenceError: a column could not be certified (it cannot happen above float64
            round-off: tol 1e-11 is certified in ~25-40 steps on every graph we build).
    """
    t0 = time.perf_counter()
    device = torch.device(device)
    n = adjacency.shape[0]
    targets = passage_nodes.to(torch.int64).cpu()
    emb = passage_emb.detach().to("cpu", torch.float64)
    p, dim = emb.shape
    if p == 0:
        raise ValueError("solve_basis needs at least one passage")
    if float(emb.abs().max()) > 1.0 + 1e-6:
        raise ValueError("passage_emb entries must lie in [-1, 1] (L2-normalised rows)")
    solver = PPRSolver(adjacency.to(device), damping=damping, target_nodes=targets,
                       dtype=torch.float64, device=device, method="chebyshev", tol=tol,
                       max_iter=max_iter)
    transition = build_transition(adjacency, damping=damping, dtype=torch.float64)
    c_pass = 1.0 - damping * transition.dangling.cpu()[targets].to(torch.float64)  # [P]
    per_col = 6 * 8 * n
    block = max(1, min(dim + 1, memory_budget // max(per_col, 1)))
    y = torch.empty(p, dim + 1, dtype=torch.float64)  # L b_j at T, then z1 in the last column
    bounds = torch.empty(dim + 1, dtype=torch.float64)  # β_j of eq. (B0)
    depth = max(1, (p - 1).bit_length()) + 1  # ⌈log₂ P⌉ + 1: the pairwise sum and a product
    theta = depth * U64 / (1.0 - depth * U64)
    steps = 0
    for a in range(0, dim + 1, block):
        b = min(a + block, dim + 1)
        seeds = torch.zeros(n, b - a, dtype=torch.float64)
        for j in range(a, b):
            seeds[targets, j - a] = emb[:, j] + 1.0 if j < dim else 1.0
        sigma = pairwise_sum(c_pass.unsqueeze(1) * seeds[targets])  # [b - a] cᵀ b̂_j
        b_norm = seeds[targets].sum(dim=0) * (1.0 + (p + 2) * U64)  # ‖b̂_j‖₁, rounded up
        solution = solver.solve(seeds.to(device))
        solution.raise_if_uncertified()
        eps = solution.bound.cpu().to(torch.float64)
        y[:, a:b] = solution.scores.cpu() * sigma
        bounds[a:b] = (sigma * (eps + U64 * (1.0 + eps) + theta * (1.0 + theta))
                       + U64 * b_norm * (1.0 + U64)) * (1.0 + 4 * U64)  # (B0)
        steps = max(steps, int(solution.steps.max()))
        del seeds, solution
    z1 = y[:, dim].clone()
    # Z_j = fl(Y_j − z1): one rounding per entry, 2⁻⁵³(‖Y_j‖₁ + ‖z1‖₁) (module docstring)
    subtract = U64 * (y[:, :dim].abs().sum(dim=0) + z1.abs().sum()) * (1.0 + (p + 2) * U64)
    z = y[:, :dim].sub_(z1.unsqueeze(1)).contiguous()
    z1_bound = float(bounds[dim])
    h, h_bound = passage_mass(adjacency.to(device), targets, damping=damping)
    return PassageBasis(z=z, z1=z1, h=h, col_bound=bounds[:dim] + z1_bound + subtract,
                        z1_bound=z1_bound, z_norm1=z.abs().sum(dim=0), damping=float(damping),
                        tol=float(tol), steps=steps, seconds=time.perf_counter() - t0,
                        h_err=2.0 * h_bound * (1.0 + 2.0 ** -50))
