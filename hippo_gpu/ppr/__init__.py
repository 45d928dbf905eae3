"""Batched personalized PageRank: Q queries per solve, certified per column, on CPU or CUDA.

- ``iteration``: the equations (igraph semantics, the leaky form, bound (3)), the power and
  Chebyshev iterations with their certified stops, the round-off floor.
- ``certificate``: when a column may stop (bound with the output rounding, top-k exit, stall
  rule, float64 re-check) and what it reports.
- ``closed_form``: the passage rows of the PPR operator, solved once per index.
- ``ordering``: reverse Cuthill–McKee order for the CPU kernel's gathers.
- ``rounding``: the rounding of the returned vector that every bound adds (R1), and the refusal
  of a tol below it (:class:`ToleranceError`).
- ``solver``: :class:`PPRSolver`, built once per graph, and :func:`personalized_pagerank`.
"""

from hippo_gpu.ppr.certificate import stall_steps
from hippo_gpu.ppr.iteration import (
    ConvergenceError,
    PPRResult,
    StepFn,
    Transition,
    build_transition,
    chebyshev_weights,
    default_tol,
    ppr_solve,
    torch_step,
)
from hippo_gpu.ppr.ordering import rcm_permutation
from hippo_gpu.ppr.rounding import ToleranceError
from hippo_gpu.ppr.solver import PPRSolution, PPRSolver, personalized_pagerank

__all__ = [
    "ConvergenceError",
    "PPRResult",
    "PPRSolution",
    "PPRSolver",
    "StepFn",
    "ToleranceError",
    "Transition",
    "build_transition",
    "chebyshev_weights",
    "default_tol",
    "personalized_pagerank",
    "ppr_solve",
    "rcm_permutation",
    "stall_steps",
    "torch_step",
]
