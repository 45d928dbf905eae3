"""The PPR solvers a Searcher keeps: one per (graph, PPRSettings), built on first use.

A solver precomputes its operator once (the transition, its float64 twin, a locality order, or
the closed form), so a Searcher builds each at most once and reuses it for every batch. The
settings value (hippo_gpu.config.PPRSettings, `RetrievalConfig.ppr`) is the key: two configs
that ask for the same solve share a solver. This is the one place outside hippo_gpu.ppr that
constructs a PPRSolver.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from hippo_gpu.config import PPRSettings
from hippo_gpu.device import ppr_dtype
from hippo_gpu.ppr import PPRSolver

__all__ = ["SolverCache", "build_solver"]


def build_solver(adjacency: Tensor, settings: PPRSettings,
                 target_nodes: Tensor | None = None) -> PPRSolver:
    """The PPRSolver of ``adjacency`` with ``settings`` (rows ``target_nodes`` out; None: all)."""
    return PPRSolver(adjacency, damping=settings.damping, dtype=ppr_dtype(settings),
                     target_nodes=target_nodes, tol=settings.tol, method=settings.method,
                     max_iter=settings.max_iter)


class SolverCache:
    """Solvers by (graph name, settings). ``get`` builds a missing one from the graph's
    adjacency, which ``adjacency()`` makes only then (a phrase block, a v1 graph)."""

    def __init__(self) -> None:
        self._solvers: dict[tuple[str, PPRSettings], PPRSolver] = {}

    def get(self, graph: str, settings: PPRSettings, adjacency: Callable[[], Tensor],
            target_nodes: Tensor | None = None) -> PPRSolver:
        key = (graph, settings)
        solver = self._solvers.get(key)
        if solver is None:
            solver = build_solver(adjacency(), settings, target_nodes)
            self._solvers[key] = solver
        return solver
