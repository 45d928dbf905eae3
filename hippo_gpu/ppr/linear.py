"""HippoRAG 2's PPR by linearity: the passage basis for the dense half, the push for the phrase
seeds, the iteration for the queries the push gives up on (ppr_method "basis_push").

For one query with phrase seeds s, passage vector e and cosines cos = E_P e (float32, from the
dense scan), with w = passage_node_weight and α, β the min-max coefficients of cos (basis.py):

    y_T = p_T + w (α Z e + β z1),     x_T = y_T / σ,     σ = cᵀ s + w (α vᵀe + β cᵀ1_P)      (L1)

where p is the push estimate of L s (push.py, eq. P1) and v = E_Pᵀ c_P, so σ = cᵀ r is exact
(basis.py: c_j = 1 − d·[j dangling]). The error of x_T in L1 is at most

    (hᵀρ + w·B2) / σ + 2⁻²⁴                                                              (L2)

(push.py P2, basis.py B2, and the float32 rounding of the returned distribution). The push is
given exactly the budget tol·σ − w·B2 − 2⁻²⁴σ, so a query it finishes is certified to ``tol``
like an iterated one. A query whose seeds reach more than ``MAX_REDUCTION`` times its budget
(hᵀs > 2¹⁰·budget: a push would sweep most of the graph), whose push passes ``work_cap`` edges
(``PUSH_WORK_FRACTION`` of the graph's edges) or whose budget is not positive is solved by the
caller's iteration on its full reset vector, today's path, so every query is certified either
way and none costs much more than before. The exact target of (L1) takes E_P e in exact
arithmetic (basis.py); today's iteration feeds the float32 cosines into r instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hippo_gpu.ppr.basis import PassageBasis
from hippo_gpu.ppr.push import PushOperator, PushResult
from hippo_gpu.ppr.solver import PPRSolution

__all__ = ["MAX_REDUCTION", "PUSH_WORK_FRACTION", "LinearPPR", "LinearSolution", "available"]

# A query's push gives up after scanning this many times the graph's edges. It only bounds a
# pathological query: the iteration a capped query falls back to runs its few columns alone,
# which costs nearly what a lone query costs (13 sweeps of every edge; a push edge costs ~30
# sweep-lane edges, so 4 passes of push cost about a third of that). Measured on the 100k
# synthetic index (edges scanned, so the same on any CPU): the median query scans 0.045x the
# edges, the 90th percentile 0.33x, the worst of 64 about 1x.
PUSH_WORK_FRACTION = 4.0
# A query whose seeds' passage reach hᵀs exceeds its budget by more than this factor is not
# pushed at all: the push would have to remove all but 2⁻¹⁰ of that mass, and measured (edges
# scanned, so on any CPU) such pushes reach most of the graph: musique_train's queries need
# 2¹¹-2¹⁴ and scan 1-3x the graph's edges; the 100k synthetic index's need ~2⁷-2⁸ and scan
# 0.002-0.35x.
MAX_REDUCTION = 2.0 ** 10
ROUNDING32 = 2.0 ** -24  # float32 rounding of the returned distribution (L1, relative)

def available() -> bool:
    """Whether the push kernel (numba, extra 'kernels') can run here."""
    import hippo_gpu.kernels as kernels

    return kernels.AVAILABLE


Fallback = Callable[[Tensor], PPRSolution]  # query columns -> their iterated solution [P, c']


@dataclass(frozen=True)
class LinearSolution:
    """A :class:`PPRSolution` for the chunk ([P, c] scores) and the push's statistics."""

    solution: PPRSolution
    push: PushResult
    pushed: Tensor  # [c] bool: answered by basis + push (else by the iteration)


class LinearPPR:
    """Basis + push for one index graph and damping (module docstring).

    Args:
        adjacency: [N, N] the index graph.
        passage_nodes: [P] node row of each passage.
        passage_emb: [P, D] the passage vectors the basis was solved from.
        basis: the :class:`PassageBasis` of this graph and damping (on the device to run its
            GEMM on).
    """

    def __init__(self, adjacency: Tensor, passage_nodes: Tensor, passage_emb: Tensor,
                 basis: PassageBasis) -> None:
        self.basis = basis
        self.damping = basis.damping
        self.push_op = PushOperator(adjacency, passage_nodes, basis.h, damping=basis.damping)
        dangling = torch.from_numpy(self.push_op.deg <= 0)[self.push_op.position]
        keep = 1.0 - self.damping * dangling.to(torch.float64)  # [N] c = 1ᵀL
        self.keep = keep
        c_pass = keep[passage_nodes.cpu()]
        self.v = passage_emb.cpu().to(torch.float64).T @ c_pass  # [D] E_Pᵀ c_P
        self.c_pass_sum = float(c_pass.sum())
        self.work_cap = max(1, int(PUSH_WORK_FRACTION * self.push_op.nnz))

    def solve(self, seed_query: Tensor, seed_node: Tensor, seed_weight: Tensor, e: Tensor,
              cos: Tensor, weight: float, tol: float, fallback: Fallback, *,
              dtype: torch.dtype = torch.float32,
              lap: Callable[[str], None] | None = None) -> LinearSolution:
        """x_T of each query column (eq. L1) with its certificate (L2).

        Args:
            seed_query, seed_node, seed_weight: [S] phrase seeds (column, node, weight), sorted
                by column.
            e: [c, D] query passage vectors; cos: [c, P] their float32 cosines.
            weight: w, the passage_node_weight.
            tol: the L1 tol to certify.
            fallback: solves the given columns by the iteration (on their full reset vectors).
            dtype: of the returned scores (float32 adds its rounding, 2⁻²⁴, to the bound).
            lap: called with "basis", "push" and (if any column iterated) "ppr" as each part
                ends (the Searcher's stage clock).
        """
        lap = lap or (lambda name: None)
        rounding = ROUNDING32 if dtype == torch.float32 else 2.0 ** -52
        c = cos.shape[0]
        lo = cos.amin(dim=1).double().cpu()
        hi = cos.amax(dim=1).double().cpu()
        rng = hi - lo
        flat = rng <= 0
        alpha = torch.where(flat, torch.zeros_like(rng), 1.0 / torch.where(flat, 1.0, rng))
        beta = torch.where(flat, torch.ones_like(rng), -lo * alpha)
        dense, dense_bound = self.basis.dense_part(e, alpha, beta)  # [c, P], [c]
        dense.mul_(weight)
        dense_bound = dense_bound.cpu() * weight
        lap("basis")
        e64 = e.cpu().to(torch.float64)
        w_seed = seed_weight.cpu().to(torch.float64)
        phrase_mass = torch.zeros(c, dtype=torch.float64).index_add_(
            0, seed_query.cpu(), w_seed * self.keep[seed_node.cpu()])
        sigma = phrase_mass + weight * (alpha * (e64 @ self.v) + beta * self.c_pass_sum)
        budget = tol * sigma - dense_bound - rounding * sigma
        reach = torch.zeros(c, dtype=torch.float64).index_add_(
            0, seed_query.cpu(), w_seed * self.basis.h.cpu()[seed_node.cpu()])
        skip = (reach > MAX_REDUCTION * budget) | (budget <= 0)  # the iteration's queries
        pushed = self.push_op.push(seed_query, seed_node, w_seed, c,
                                   torch.where(skip, math.inf, budget), self.work_cap)
        bound = (pushed.bound + dense_bound) / sigma + rounding
        ok = (~skip) & (~pushed.capped) & (bound <= tol) & (sigma > 0)
        y = dense.cpu().add_(pushed.scores) if dense.device.type == "cpu" else \
            dense.add_(pushed.scores.to(dense.device))
        scores = (y / sigma.to(y.device).unsqueeze(1)).to(dtype).T  # [P, c]
        lap("push")
        steps = torch.zeros(c, dtype=torch.int64)
        certified = ok.clone()
        refined = torch.zeros(c, dtype=torch.bool)
        if not bool(ok.all()):
            cols = torch.nonzero(~ok).flatten()
            iterated = fallback(cols)
            scores[:, cols.to(scores.device)] = iterated.scores.to(scores.dtype)
            steps[cols] = iterated.steps.cpu()
            bound[cols] = iterated.bound.cpu().double()
            certified[cols] = iterated.certified.cpu()
            refined[cols] = iterated.refined.cpu()
            lap("ppr")
        solution = PPRSolution(scores, steps, bound, certified, refined, tol)
        return LinearSolution(solution, pushed, ok)
