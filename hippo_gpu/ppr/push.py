"""Certified forward push: the PPR of a few phrase seeds, touching only where their mass goes.

Semantics: the leaky system (2) of iteration.py, y = L s with L = (1 − d)(I − dM)⁻¹ and
M = A D⁻¹, for a non-negative, unnormalised seed vector s (HippoRAG 2: at most linking_top_k
phrase seeds per query). The push (Andersen, Chung & Lang 2006, on this operator) keeps an
estimate p and a residual ρ, both ≥ 0, starting from p = 0, ρ = s, with the invariant

    y* = p + L ρ.                                                                       (P1)

Pushing node u moves its residual m = ρ_u: p_u += (1 − d) m, ρ_u = 0 and ρ += d m M e_u (each
neighbour v gets d m A_vu / D_u; a dangling u passes nothing on). (P1) is kept because
L = (1 − d) I + d L M (from (I − dM) L = (1 − d) I, L and M commuting): L(m e_u) =
(1 − d) m e_u + L(d m M e_u). As L ≥ 0 and ρ ≥ 0, p ≤ y* entrywise and, at the passage rows T,

    ‖y*_T − p_T‖₁ = ‖(L ρ)_T‖₁ = hᵀρ,    h = Lᵀ 1_T,                                        (P2)

an equality, not only a bound: h_v is the mass a walk restarting at v leaves on passages
(hippo_gpu.ppr.basis stores an upper bound of h; with h ≤ 1 entrywise, hᵀρ ≤ ‖ρ‖₁, the bound
(3) of iteration.py for a residual). Each push removes (1 − d)·m·[u ∈ T] from hᵀρ (h =
(1 − d) 1_T + d Mᵀ h): mass reaches the passages only by being pushed at a passage, and the
stopping rule tracks exactly that. The push stops at the first moment hᵀρ ≤ budget; the kernel
recomputes hᵀρ over the touched nodes at the end (the running sum drifts by round-off) and adds
the float64 round-off of its updates.

**Round-off, and what is returned.** The push returns p itself, float64 at the passage rows,
with the bound of (P2) plus a round-off slack that covers every float64 operation behind p and
ρ. All quantities are non-negative and at most the seed mass μ = ‖s‖₁ (mass is only kept or
moved), so each operation errs by at most 2⁻⁵³μ: p_u += (1 − d)m (two roundings), an edge's
product and its residual update (two per edge). The operator itself is rounded: coef_e =
fl(d A_vu / D_u), with D_u a float64 sum of deg(u) terms, is off by γ_{deg(u)+2} relatively, so a
push of u sends at most (deg(u) + 2)·2⁻⁵³·μ(1 + 2⁻⁴⁰) elsewhere than the exact operator would.
Each such error changes the invariant (P1) by a vector of that L1 size, which moves (L ρ)_T by
at most as much (‖L‖₁ ≤ 1), and the final hᵀρ over the nt touched nodes errs by ≤ nt·2⁻⁵³μ
(h ≤ 1). With work = Σ deg(u) over the pushes, that is at most
(3·work + 4·pushes + nt)·2⁻⁵³μ ≤ (2(work + pushes + nt) + 4)·2⁻⁵²·μ, the slack the kernel adds.
h is an upper bound of Lᵀ1_T, its own float64 round-off included (basis.py), so the reported
bound is ≥ ‖y*_T − p_T‖₁ for the p returned; hippo_gpu.ppr.linear adds the rounding of what it
builds from p (eq. L2).

Order (kernels/src/push_cpu.py): phases of a threshold ε, dividing by 4 per phase; within a phase a
FIFO queue of the nodes with ρ_u ≥ ε·max(D_u, 1). Every order keeps (P1); this one makes a
push's cost (D_u edges) buy at least ε of residual per edge, which is the ACL work bound
(‖s‖₁ / ((1 − d) ε) edges for a phase's threshold ε).

Why it is local here: with 1 − d = 0.5 half of the mass pushed stays, and HippoRAG 2's budget is
relative to the whole reset vector, whose dense half (0.05 x min-max cosine over every passage)
outweighs the ~5 phrase seeds by ~500x at 100k passages: the push needs to remove only a factor
~10³ of the seed mass (measured: 0.09 x nnz edges scanned per query at the median on the 100k
synthetic graph, vs 13 sweeps of all edges for the iteration). On small graphs (musique: the
seeds carry ~15 % of the reset mass) it needs ~10⁵ and touches most of the graph, so a query
gives up after ``work_cap`` edges and its column is solved by the iteration instead
(hippo_gpu.ppr.linear).

On CUDA the push runs on host threads over a CPU copy of the graph (it is a sequential,
data-dependent traversal per query; the GPU runs the GEMMs); its [Q, P] output is moved to the
device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hippo_gpu.ppr.ordering import permute_csr, rcm_permutation

__all__ = ["PushOperator", "PushResult"]


@dataclass(frozen=True)
class PushResult:
    """Output of :meth:`PushOperator.push` for Q queries (CPU tensors).

    Attributes:
        scores: [Q, P] float64, p at the passage rows.
        bound: [Q] float64, hᵀρ plus round-off (eq. P2): the L1 error of scores at T.
        pushes: [Q] int64 nodes pushed.
        work: [Q] int64 edges scanned.
        touched: [Q] int64 nodes whose residual became nonzero.
        capped: [Q] bool, gave up at the work cap (its bound may exceed its budget).
    """

    scores: Tensor
    bound: Tensor
    pushes: Tensor
    work: Tensor
    touched: Tensor
    capped: Tensor


class PushOperator:
    """The push of one graph, built once: CSR, per-edge d·A_uv/D_u, degrees, h, workspaces.

    Args:
        adjacency: [N, N] symmetric sparse CSR.
        passage_nodes: [P] node row of each passage (the target rows T).
        h: [N] float64 upper bound of Lᵀ 1_T (hippo_gpu.ppr.basis.PassageBasis.h).
        damping: d.
        threads: push threads (default torch.get_num_threads() at each call).
    """

    def __init__(self, adjacency: Tensor, passage_nodes: Tensor, h: Tensor, *,
                 damping: float, threads: int | None = None) -> None:
        from hippo_gpu.kernels import push_cpu

        self._kernel = push_cpu
        adj = adjacency.cpu()
        n = adj.shape[0]
        self.num_nodes = n
        self.num_passages = int(passage_nodes.numel())
        self.damping = float(damping)
        if h.numel() != n:
            raise ValueError(f"h has {h.numel()} entries for a graph of {n} nodes")
        # nodes in reverse Cuthill-McKee order, so a push's neighbours sit near it in memory
        # (the CPU kernel of the iteration does the same); position[u] is node u's place
        perm = rcm_permutation(adj)
        self.position = torch.empty_like(perm)
        self.position[perm] = torch.arange(n)
        adj = permute_csr(adj, perm)
        self.indptr = adj.crow_indices().to(torch.int64).numpy()
        self.indices = adj.col_indices().to(torch.int64).numpy()
        values = adj.values().to(torch.float64).numpy()
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.indptr))
        deg = np.zeros(n, dtype=np.float64)
        np.add.at(deg, rows, values)
        self.deg = deg  # in push order
        inv = np.divide(1.0, deg, out=np.zeros_like(deg), where=deg > 0)
        self.coef = values * inv[rows] * self.damping  # d·A_uv / D_u for the edge (u, v)
        self.nnz = int(values.size)
        self.h = h.to("cpu", torch.float64)[perm].contiguous().numpy()
        passage_row = np.full(n, -1, dtype=np.int64)
        passage_row[self.position[passage_nodes.cpu()].numpy()] = np.arange(self.num_passages)
        self.passage_row = passage_row
        self.threads = threads
        self._workspaces: list = []
        self._lock = threading.Lock()

    def push(self, seed_query: Tensor, seed_node: Tensor, seed_weight: Tensor, num_queries: int,
             budget: Tensor, work_cap: int, *, visits: np.ndarray | None = None) -> PushResult:
        """Push each query's seeds until its bound (P2) is within its budget.

        Args:
            seed_query, seed_node, seed_weight: [S] (query, node, weight > 0) triplets, sorted
                by query (hippo_gpu.retrieval.seeds' phrase seeds are).
            num_queries: Q.
            budget: [Q] float64 L1 error allowed at the passage rows.
            work_cap: edges a query may scan before it gives up (``capped``).
            visits: [N] int64 or None: when given, visits[u] += 1 for each push of the node at
                push-order position u (``position[node]``) by any query (diagnostics, e.g. the
                push floor benchmark; the call then runs on one thread).
        """
        sq = seed_query.cpu().to(torch.int64).numpy()
        if sq.size and np.any(np.diff(sq) < 0):
            raise ValueError("push seeds must be sorted by query")
        counts = np.bincount(sq, minlength=num_queries) if sq.size else \
            np.zeros(num_queries, dtype=np.int64)
        seed_ptr = np.zeros(num_queries + 1, dtype=np.int64)
        np.cumsum(counts, out=seed_ptr[1:])
        nodes = np.ascontiguousarray(self.position[seed_node.cpu().to(torch.int64)].numpy())
        weights = np.ascontiguousarray(seed_weight.cpu().to(torch.float64).numpy())
        if weights.size and not np.all(weights >= 0):
            raise ValueError("push seed weights must be non-negative")
        budget_np = np.ascontiguousarray(budget.cpu().to(torch.float64).numpy())
        if visits is not None and (visits.shape != (self.num_nodes,) or visits.dtype != np.int64):
            raise ValueError(f"visits must be an int64 array of {self.num_nodes} entries")
        threads = max(1, self.threads or torch.get_num_threads())
        with self._lock:  # one call at a time: the workspaces are shared
            while len(self._workspaces) < min(threads, max(num_queries, 1)):
                self._workspaces.append(
                    self._kernel.make_workspace(self.num_nodes, self.h, self.deg))
            out = self._kernel.push_queries(
                self.indptr, self.indices, self.coef, self.deg, seed_ptr, nodes,
                weights, budget_np, int(work_cap), self.damping, self.passage_row,
                self.num_passages, self._workspaces[:max(1, min(threads, num_queries))],
                visits)
        scores, bound, pushes, work, touched, capped = (torch.from_numpy(a) for a in out)
        return PushResult(scores, bound, pushes, work, touched, capped)
