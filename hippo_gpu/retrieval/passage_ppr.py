"""HippoRAG 2's PPR for one chunk of queries, by either method: the iteration on full reset
vectors (hippo_gpu.retrieval.seeds.reset_vectors + a PPRSolver), or by linearity
(hippo_gpu.ppr.linear: the index's passage basis for the dense half, the push for the phrase seeds),
whose give-ups are iterated the same way. The Searcher picks and caches; this module holds what it
runs.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.device import ppr_dtype
from hippo_gpu.indexing.index import Index
from hippo_gpu.ppr import PPRSolution, PPRSolver, default_tol
from hippo_gpu.ppr.basis import solve_basis
from hippo_gpu.ppr.linear import LinearPPR, LinearSolution
from hippo_gpu.ppr.linear import available as linear_available
from hippo_gpu.retrieval.modes import HIPPORAG2, Mode
from hippo_gpu.retrieval.seeds import phrase_seeds, reset_vectors

__all__ = ["iterate_chunk", "linear_ppr", "solve_linear_chunk"]


def linear_ppr(index: Index, cfg: RetrievalConfig) -> LinearPPR | None:
    """The PPR by linearity of ``index`` where ``cfg.ppr_method`` picks it ("basis_push", or
    "auto" on the CPU with a stored basis of this damping and the numba kernels); None:
    iterate. An explicit "basis_push" on an index without a basis for this damping solves one
    now.

    "auto" iterates on CUDA: the push is a host kernel (numba), so the linear path would send
    every chunk's seeds to the host and its [c, P] dense half back, while the iteration is one
    batched device solve of the chunk's [N, c] reset vectors with no host round trip. A device
    solve of the seeds' part alone would cost the same sweeps as the whole reset vector (the
    sweeps visit every edge whatever the reset), so the basis saves nothing there. (Not yet run
    on a GPU.)"""
    if cfg.ppr_method not in ("auto", "basis_push") or len(index.passage_keys) == 0:
        return None
    basis = index.basis
    if basis is not None and basis.damping != cfg.damping:
        basis = None
    if cfg.ppr_method == "auto" and (basis is None or not linear_available()
                                     or index.device.type == "cuda"):
        return None
    if not linear_available():
        raise ValueError("ppr_method 'basis_push' needs numba (the 'kernels' extra)")
    if basis is None:
        basis = solve_basis(index.adjacency, index.passage_nodes, index.passage_emb,
                            damping=cfg.damping, device=index.device)
    return LinearPPR(index.adjacency, index.passage_nodes, index.passage_emb,
                     basis.to(index.device))


def iterate_chunk(index: Index, solver: PPRSolver, cand_rows: Tensor, cand_scores: Tensor,
                  kept: Tensor, fallback: Tensor, cos: Tensor, cfg: RetrievalConfig, *,
                  mode: Mode = HIPPORAG2, lap: Callable[[str], None] | None = None) -> PPRSolution:
    """PPR of a chunk's queries by the iteration on their [N, c] reset vectors (the columns of
    ``fallback`` queries get a placeholder seed: their PPR is discarded); ``lap("seeds")`` is
    called once the reset vectors exist."""
    seeds = reset_vectors(index, cand_rows, cand_scores, kept, cos, cfg, mode=mode,
                          dtype=ppr_dtype(cfg))
    seeds[:, fallback] = 1.0
    if lap is not None:
        lap("seeds")
    return solver.solve(seeds)


def solve_linear_chunk(index: Index, linear: LinearPPR, solver: PPRSolver, cand_rows: Tensor,
                       cand_scores: Tensor, kept: Tensor, fallback: Tensor, e_pass: Tensor,
                       cos: Tensor, cfg: RetrievalConfig,
                       lap: Callable[[str], None]) -> LinearSolution:
    """hipporag2 PPR of a chunk by linearity; the queries whose push gives up are iterated on
    their full reset vectors (:func:`iterate_chunk`). ``lap`` gets "seeds", then LinearPPR's
    stage names."""
    dtype = ppr_dtype(cfg)
    sq, sp, sw = phrase_seeds(index, cand_rows, cand_scores.to(dtype), kept, cfg.linking_top_k)
    lap("seeds")

    def iterate(cols: Tensor) -> PPRSolution:
        cols = cols.to(cand_rows.device)
        return iterate_chunk(index, solver, cand_rows[cols], cand_scores[cols], kept[cols],
                             fallback[cols], cos[cols], cfg)

    tol = cfg.ppr_tol if cfg.ppr_tol is not None else default_tol(dtype)
    return linear.solve(sq, sp, sw, e_pass, cos, cfg.passage_node_weight, tol, iterate,
                        dtype=dtype, lap=lap)

