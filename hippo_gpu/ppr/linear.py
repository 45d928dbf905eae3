"""HippoRAG 2's PPR by linearity: the passage basis for the dense half, the push for the phrase
seeds, the iteration for the queries the push gives up on (ppr_method "basis_push").

For one query with phrase seeds s, passage vector e and cosines cos = E_P e (float32, from the
dense scan), with w = passage_node_weight and α, β the min-max coefficients of cos (basis.py):

    y_T = p_T + w (α Z e + β z1),     x_T = y_T / σ,     σ = cᵀ s + w (α vᵀe + β cᵀ1_P)      (L1)

where p is the push estimate of L s (push.py, eq. P1) and v = E_Pᵀ c_P, so σ = cᵀ r in exact
arithmetic (basis.py: c_j = 1 − d·[j dangling]). With ŷ, σ̂ as computed in float64 and x* = y*_T/σ
(‖y*_T‖₁ ≤ σ), ‖ŷ/σ̂ − x*‖₁ ≤ ‖ŷ − y*_T‖₁/σ̂ + |σ̂ − σ|/σ̂, so the error of the returned x̂_T in L1
is at most

    (hᵀρ + w·B2 + Δσ) / σ̂ + ω_L                                                          (L2)

(push.py P2, basis.py B2), where Δσ bounds |σ̂ − σ|: the float64 dot products of σ̂ (the seeds'
index_add over at most S terms, γ_{S+2} of a non-negative sum; e·v̂, D terms; v̂ itself a pairwise
sum over P passages with error γ_{⌈log₂ P⌉+1} |E_P|ᵀc_P per entry; α, β and cᵀ1_P rounded once
each; one rounding per remaining operation),

    Δσ = γ_{S+4} cᵀs + w (|α| γ_{D+⌈log₂ P⌉+4} (2|e|ᵀa + |e·v̂|) + |β| γ₄ cᵀ1_P) + γ₄ σ̂,

with a = |E_P|ᵀ c_P, and ω_L = (exp(u + 3·2⁻⁵³) − 1)·‖ŷ‖₁/σ̂·(1 + 2⁻²⁰) + 2P t the rounding of
x̂ = fl(fl(ŷ)/σ̂) in the result's dtype (u, t as in hippo_gpu.ppr.rounding, R1: the sum
ŷ = dense + p, the division and the cast, one rounding each). The reported bound is (L2) with
ω_L measured and its first term times g = hippo_gpu.ppr.rounding.inflation(P) (the float64 sums
it is computed from). The push is given the budget (tol − ω⁰_L)σ̂/g − w·B2 − Δσ, with ω⁰_L the
same term at ‖ŷ‖₁/σ̂ = 1 + tol (which a column within its bound cannot exceed), so a query it
finishes is certified to ``tol`` like an iterated one. A query whose seeds reach more than
``MAX_REDUCTION`` times its budget (hᵀs > 2¹⁰·budget: a push would sweep most of the graph),
whose push passes ``work_cap`` edges (``PUSH_WORK_FRACTION`` of the graph's edges) or whose
budget is not positive is solved by the caller's iteration on its full reset vector, today's
path, so every query is certified either way and none costs much more than before. The exact
target of (L1) takes E_P e in exact arithmetic (basis.py); today's iteration feeds the float32
cosines into r instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hippo_gpu.ppr.basis import PassageBasis
from hippo_gpu.ppr.push import PushOperator, PushResult
from hippo_gpu.ppr.rounding import check_tol, inflation, pairwise_sum, unit_roundoff
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
U64 = 2.0 ** -53  # float64 unit round-off


def _gamma(k: int) -> float:
    return k * U64 / (1.0 - k * U64)


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
        emb = passage_emb.cpu().to(torch.float64)
        self.v = pairwise_sum(emb * c_pass.unsqueeze(1))  # [D] E_Pᵀ c_P
        p = emb.shape[0]
        # a = |E_P|ᵀ c_P, rounded up, for Δσ of eq. (L2)
        self.v_abs = (emb.abs().T @ c_pass) * (1.0 + _gamma(p + 2))
        # cᵀ1_P from the two counts: c_p is 1 or 1 − d, so two roundings instead of P
        dangling_passages = int((c_pass != 1.0).sum())
        self.c_pass_sum = (p - dangling_passages) + dangling_passages * (1.0 - self.damping)
        self.sum_depth = max(1, (p - 1).bit_length()) + 1  # of v̂'s pairwise sum, and a product
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
            dtype: of the returned scores (its rounding is in the bound, eq. L2).
            lap: called with "basis", "push" and (if any column iterated) "ppr" as each part
                ends (the Searcher's stage clock).
        """
        lap = lap or (lambda name: None)
        p_rows = cos.shape[1]
        tol = check_tol(tol, dtype, p_rows)  # a tol below the result's rounding: refused
        u_out, tiny = unit_roundoff(dtype), torch.finfo(dtype).tiny
        per_unit = math.expm1(u_out + 3 * U64) * (1.0 + 2.0 ** -20)  # ω_L per unit of ‖ŷ‖₁/σ̂
        grow = inflation(p_rows)
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
        ev = e64 @ self.v  # [c]
        sigma = phrase_mass + weight * (alpha * ev + beta * self.c_pass_sum)
        seeds_each = int(torch.bincount(seed_query.cpu(), minlength=c).max()) if c else 0
        sigma_err = (_gamma(seeds_each + 4) * phrase_mass
                     + weight * (alpha.abs() * _gamma(e64.shape[1] + self.sum_depth + 4)
                                 * (2.0 * (e64.abs() @ self.v_abs) + ev.abs())
                                 + beta.abs() * _gamma(4) * self.c_pass_sum)
                     + _gamma(4) * sigma.abs())  # Δσ of eq. (L2)
        prior = per_unit * (1.0 + tol) + 2 * p_rows * tiny  # ω⁰_L
        budget = (tol - prior) / grow * sigma - dense_bound - sigma_err
        reach = torch.zeros(c, dtype=torch.float64).index_add_(
            0, seed_query.cpu(), w_seed * self.basis.h.cpu()[seed_node.cpu()])
        skip = (reach > MAX_REDUCTION * budget) | (budget <= 0)  # the iteration's queries
        pushed = self.push_op.push(seed_query, seed_node, w_seed, c,
                                   torch.where(skip, math.inf, budget), self.work_cap)
        y = dense.cpu().add_(pushed.scores) if dense.device.type == "cpu" else \
            dense.add_(pushed.scores.to(dense.device))
        y_norm = y.abs().sum(dim=1).cpu() / sigma  # ‖ŷ‖₁/σ̂
        omega = per_unit * y_norm + 2 * p_rows * tiny  # ω_L, measured
        bound = (pushed.bound + dense_bound + sigma_err) / sigma * grow + omega
        ok = (~skip) & (~pushed.capped) & (bound <= tol) & (sigma > 0)
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
