"""PPRSolver: PPR for many query batches on one fixed graph, with its backends chosen once.

The equations, the iterations and their certified bounds are in hippo_gpu.ppr.iteration; the
closed form in hippo_gpu.ppr.closed_form; the rounding every bound adds for the returned vector,
and the refusal of a tol below it, in hippo_gpu.ppr.rounding. This module holds what is built
once per index and graph (the normalised operator in float32 and float64, the locality order,
the kernel's buffers) and the per-call dispatch: the numba CPU kernel, torch (MKL / cuSPARSE),
Triton, or the closed form, plus the float64 finish of stalled columns.

**The float64 finish of a float32 column, and its bound.** The float64 solve of a stalled
column stops on ε₆₄ + ω(float64, N) ≤ tol − ω(float32, N) (its bound holds ε₆₄, the round-off
of its float64 steps: iteration.py, "Round-off floor"); its result x̂₆₄ is then cast to float32,
which moves it by ≤ ω(float32, N) (rounding.py, R1), so the column reports that bound plus
ω(float32, N) ≤ tol. The float64 solve is asked for the largest float below tol − ω(float32, N),
so the sum, rounded, stays ≤ tol. A float32 certificate itself cannot fall below what rounding
r̂ into float32 moves y* (2⁻²³ in the kernel's ‖y − y*‖₁, 2⁻²² in the torch path's ‖g − y*‖₁,
which rounds r̂ and (1 − d) r̂: iteration.py, rule 1) over the mass σ ≲ 1, plus ω(float32, N):
for a tol at or below that (and no top-k exit) every column goes to the float64 solve at once,
with no float32 step spent (only the choice of path rests on σ ≲ 1, never a certificate).
"""

from __future__ import annotations

import copy
import math
import threading
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hippo_gpu.config import check_ppr_method
from hippo_gpu.ppr.certificate import check_top_k, stall_steps
from hippo_gpu.ppr.closed_form import ClosedForm, build_bytes
from hippo_gpu.ppr.iteration import (
    DEFAULT_MAX_ITER,
    ConvergenceError,
    StepFn,
    Transition,
    build_transition,
    chebyshev_weights,
    check_adjacency,
    check_damping,
    check_seeds,
    check_seeds_shape,
    default_tol,
    normalised_seeds,
    ppr_solve,
)
from hippo_gpu.ppr.ordering import permute_csr, rcm_permutation
from hippo_gpu.ppr.rounding import (
    check_tol,
    inflation,
    output_rounding,
    unit_roundoff,
)

__all__ = ["PPRSolution", "PPRSolver", "personalized_pagerank"]


@dataclass(frozen=True)
class PPRSolution:
    """Output of :meth:`PPRSolver.solve`: scores at the target rows and each column's certificate.

    Attributes:
        scores: [T, Q] PPR probabilities in the solver's dtype.
        steps: [Q] int64 sparse products per column (float32 and float64 steps added for a
            refined column; 0 for the closed form).
        bound: [Q] float64 certified L1 bound of each column's returned scores, their
            rounding to the solver's dtype included (rounding.py, R1); for a refined column
            the float64 solve's bound plus the cast to float32.
        certified: [Q] bool, bound <= tol (or the top-k certificate held).
        refined: [Q] bool, the float32 columns that stalled and were finished in float64.
        tol: the tolerance asked for.
    """

    scores: Tensor  # [T, Q]
    steps: Tensor  # [Q]
    bound: Tensor  # [Q]
    certified: Tensor  # [Q] bool
    refined: Tensor  # [Q] bool
    tol: float

    def failures(self) -> dict[int, str]:
        """{batch column: why it is uncertified} for every column that is not certified."""
        bad = torch.nonzero(~self.certified.cpu()).flatten().tolist()
        bounds = self.bound.cpu().tolist()
        return {c: (f"PPR did not converge: L1 bound {bounds[c]:.3g} > tol {self.tol:.3g} after "
                    f"{int(self.steps[c])} steps") for c in bad}

    def raise_if_uncertified(self) -> None:
        """Raise :class:`ConvergenceError` naming the uncertified columns, if any."""
        failures = self.failures()
        if failures:
            cols = sorted(failures)
            worst = max(float(self.bound[c]) for c in cols)
            raise ConvergenceError(
                f"PPR did not converge for {len(cols)} of {self.certified.numel()} columns "
                f"(first {cols[:10]}; worst L1 bound {worst:.3g} > tol {self.tol:.3g})",
                cols, [float(self.bound[c]) for c in cols])


class PPRSolver:
    """PPR for many query batches on one fixed graph, precomputed once per index.

    ``solver(seeds)`` returns the raw PPR probabilities x[T, Q] at ``target_nodes`` (all N rows
    when None), in the original node order, equal to ``personalized_pagerank(A, seeds)[targets]``
    up to the solver tolerance. Methods:

    * ``"chebyshev"``: eq. (4) on the precomputed M, certified by (3) (the default on the CPU).
    * ``"power"``: eq. (2) power iteration, same bound, ~30 % more steps.
    * ``"closed_form"``: x_T = G r / (cᵀ r) with G = L[T, :] solved once
      (hippo_gpu.ppr.closed_form); its build holds four [N, T] float64 arrays
      (closed_form.build_bytes), G then T·N values.

    ``method="auto"`` picks closed form on CUDA when its build (32·T·N bytes) fits
    ``memory_budget``, else chebyshev: on the CPU the build (T columns x ~40 sparse steps: 13 s
    for T = 2k, N = 12k on one core) outweighs its per-query gain (benchmarks/bench_ppr.py).

    Backends for the two iterations (``kernel``): ``"numba"``, the fused cache-blocked CPU kernel
    of hippo_gpu.kernels.ppr_cpu (default on the CPU when ``kernels.AVAILABLE`` and
    ``HIPPO_GPU_FORCE_TORCH`` is unset); ``"torch"`` (MKL / cuSPARSE; default on CUDA);
    ``"triton"``, a fused CUDA step (opt-in: ``kernel="triton"`` or ``HIPPO_GPU_PPR_TRITON=1``,
    until a GPU run shows it faster than cuSPARSE). All compute the same iterates and certify the
    same bound; ``solver.backend`` says which one runs.

    Args:
        adjacency: [N, N] symmetric sparse CSR, non-negative weights.
        damping: probability d of following an edge.
        target_nodes: [T] int64 rows to return (e.g. passage nodes), or None for all N.
        dtype: float32 (fast) or float64 (parity).
        device: where the operator lives (default: the adjacency's device).
        method: one of hippo_gpu.config.SOLVER_METHODS ("auto", "chebyshev", "power",
            "closed_form").
        reorder: reverse Cuthill–McKee reordering of the rows (None: on for the numba kernel,
            whose gathers it keeps cache-local; off for torch).
        memory_budget: bytes allowed for the closed form's build (closed_form.build_bytes);
            "auto" picks it only within them, an explicit "closed_form" beyond them is refused.
        tol: default L1 error bound per column, of the scores as returned (a tol at or below
            the rounding of a ``dtype`` result is refused: ToleranceError, rounding.py).
        max_iter: default iteration cap.
        top_k: default certified top-k exit over the target rows (None: off; module docstring).
        kernel: "auto", "numba", "torch" or "triton".
    """

    def __init__(
        self,
        adjacency: Tensor,
        *,
        damping: float = 0.5,
        target_nodes: Tensor | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        method: str = "auto",
        reorder: bool | None = None,
        memory_budget: int = 1 << 30,
        tol: float | None = None,
        max_iter: int = DEFAULT_MAX_ITER,
        top_k: int | None = None,
        kernel: str = "auto",
    ) -> None:
        check_adjacency(adjacency)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype}")
        check_ppr_method(method, solver=True)
        device = adjacency.device if device is None else torch.device(device)
        n = adjacency.shape[0]
        target_nodes = _check_targets(target_nodes, n)
        targets = torch.arange(n) if target_nodes is None else target_nodes
        self.num_nodes = n
        self.damping = check_damping(damping)
        self.dtype = dtype
        self.method = _resolve_method(method, build_bytes(n, targets.numel()), memory_budget,
                                      device)
        self.tol = check_tol(default_tol(dtype) if tol is None else tol, dtype, n)
        self.max_iter = int(max_iter)
        self.top_k = check_top_k(top_k) or None
        self.last_iterations = 0  # sparse products run by the last call (0 for closed form)
        self.last_steps: Tensor | None = None  # [Q] per-column steps of the last call
        self.last_error_bound: Tensor | None = None  # [Q] per-column L1 bounds of the last call
        self.target_nodes = target_nodes
        self.device = device
        self.transition: Transition | None = None
        self._closed: ClosedForm | None = None
        self._twin: PPRSolver | None = None  # the float64 finish, made on the first stall
        self._round_off = 0.0  # ε₆₄ of a float64 finish (iteration.py), added to its bounds
        self._exact: Transition | None = None  # the float64 operator of a float32 iteration
        self._max_row_nnz = 0
        self._perm: Tensor | None = None
        self._out_rows: Tensor | None = None
        self._workspace: np.ndarray | None = None  # the numba kernel's buffers, grown on demand
        self._scaled_values: np.ndarray | None = None  # d·M values for the numba kernel
        self._scaled_values64: np.ndarray | None = None  # ... in float64, for its verification
        self._identity: np.ndarray | None = None  # [N] 0..N-1 for the numba kernel, made once
        self._workspace_lock = threading.Lock()  # concurrent calls must not share them
        if self.method == "closed_form":
            self.backend = "closed_form"
            self._closed = ClosedForm(adjacency, targets, damping=self.damping, dtype=dtype,
                                      device=device, max_iter=max_iter)
            self._closed.check_tol(self.tol)
        else:
            self.backend = _pick_backend(kernel, device)
            self._prepare_iteration(adjacency, targets, reorder)

    def _prepare_iteration(self, adjacency: Tensor, targets: Tensor,
                           reorder: bool | None) -> None:
        """The operator of the iterations, in locality order for the numba kernel, and in
        float64 beside a float32 one (sharing its indices): a float32 solve checks each
        certificate on the float64 residual and finishes stalled columns in float64
        (iteration.py, "Round-off floor"); 8 more bytes per edge than float32 alone."""
        n, device = self.num_nodes, self.device
        if reorder is None:
            reorder = self.backend == "numba"
        perm = rcm_permutation(adjacency) if reorder else None
        adj = permute_csr(adjacency, perm) if perm is not None else adjacency
        exact = build_transition(adj, damping=self.damping, dtype=torch.float64, device=device)
        self.transition = exact if self.dtype == torch.float64 else \
            _cast_transition(exact, self.dtype)
        self._exact = None if self.dtype == torch.float64 else exact
        self._max_row_nnz = int((adj.crow_indices()[1:] - adj.crow_indices()[:-1]).max()) \
            if n else 0
        if perm is not None:
            inverse = torch.empty_like(perm)
            inverse[perm] = torch.arange(n)
            self._perm = perm.to(device)
            self._out_rows = inverse[targets].to(device)  # position of each target after perm
        elif self.target_nodes is not None:
            self._out_rows = targets.to(device)

    def to(self, device: torch.device | str) -> PPRSolver:
        """Move every precomputed tensor to ``device`` (in place); returns self.

        A numba-backed solver moved to CUDA switches to the torch backend, and back.
        """
        device = torch.device(device)
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                setattr(self, name, value.to(device))
        if self._exact is not None:
            self._exact = self._exact.to(device)
        if self._closed is not None:
            self._closed = self._closed.to(device)
        if self.transition is not None:
            self.transition = self.transition.to(device)
            if self.backend == "numba" and device.type != "cpu":
                self.backend = "torch"
            elif self.backend == "torch" and device.type == "cpu":
                self.backend = _pick_backend("auto", device)
        self.device = device
        return self

    def __call__(
        self,
        seeds: Tensor,
        *,
        tol: float | None = None,
        max_iter: int | None = None,
        top_k: int | None = None,
    ) -> Tensor:
        """PPR probabilities at the target rows; raises if any column is left uncertified.

        Args:
            seeds: [N, Q] non-negative reset weights in original node order (any device/dtype;
                cast to the solver's).
            tol: L1 error bound per column of the returned scores (the closed form reports
                its own bound, closed_form.py C2, certified where it meets tol).
            max_iter: iteration cap (iterations).
            top_k: certified top-k exit for this call (default the solver's ``top_k``).

        Returns:
            [T, Q] (or [N, Q]) tensor in the solver's dtype and device.

        Raises:
            ConvergenceError: some columns are uncertified (see :meth:`solve`).
            ToleranceError: ``tol`` is at or below the rounding of a result in the solver's
                dtype (before any step).
        """
        solution = self.solve(seeds, tol=tol, max_iter=max_iter, top_k=top_k)
        solution.raise_if_uncertified()
        return solution.scores

    def solve(
        self,
        seeds: Tensor,
        *,
        tol: float | None = None,
        max_iter: int | None = None,
        top_k: int | None = None,
    ) -> PPRSolution:
        """Like ``solver(seeds)``, but never raises for an uncertified column: the returned
        :class:`PPRSolution` marks it (its scores are the last iterate), so a caller can fail
        that query alone. Stalled float32 columns are finished in float64 (module docstring)."""
        seeds = seeds.to(device=self.device, dtype=self.dtype)
        n = self.num_nodes
        tol = self.tol if tol is None else check_tol(tol, self.dtype, n)
        max_iter = self.max_iter if max_iter is None else int(max_iter)
        top_k = self.top_k if top_k is None else check_top_k(top_k)
        if self.method == "closed_form":
            if self._closed is None:
                raise RuntimeError("PPRSolver has no closed form")
            self._closed.check_tol(tol)
            scores, bound = self._closed(normalised_seeds(seeds, n))
            q = scores.shape[1]
            zeros = torch.zeros(q, dtype=torch.int64, device=scores.device)
            solution = PPRSolution(scores, zeros, bound, bound <= tol,
                                   torch.zeros_like(zeros, dtype=torch.bool), tol)
        else:
            if self.dtype == torch.float32 and not top_k and tol <= self._float32_reach():
                stalled = torch.ones(seeds.shape[1], dtype=torch.bool, device=seeds.device)
                scores, steps, bound, certified = self._unsolved(seeds.shape[1])
            else:
                scores, steps, bound, certified, stalled = self._iterate(seeds, tol, max_iter,
                                                                         top_k)
            refined = torch.zeros_like(stalled)
            if self.dtype == torch.float32 and bool(stalled.any()):
                cols = torch.nonzero(stalled).flatten()
                cast = output_rounding(self.dtype, n)  # x̂₆₄ rounded into float32 (R1)
                inner = math.nextafter(tol - cast, 0.0)  # module docstring: the sum stays ≤ tol
                exact = self._float64_twin().solve(seeds.index_select(1, cols).double(),
                                                   tol=inner, max_iter=max_iter, top_k=top_k)
                scores[:, cols] = exact.scores.to(scores.dtype)
                steps[cols] += exact.steps.to(steps.device)
                bound[cols] = exact.bound.to(bound.device) + cast
                certified[cols] = exact.certified.to(certified.device)
                refined[cols] = True
            solution = PPRSolution(scores, steps, bound, certified, refined, tol)
        self.last_steps, self.last_error_bound = solution.steps, solution.bound
        self.last_iterations = int(solution.steps.max()) if solution.steps.numel() else 0
        return solution

    def _float32_reach(self) -> float:
        """No float32 certificate of this backend can be ≤ this (module docstring): r̂ rounded
        into float32 alone costs 2⁻²³/σ (kernel) or 2⁻²²/σ (torch: r̂ and (1 − d) r̂), σ ≲ 1
        the iterate's mass, plus ω(float32, N). It only picks the path."""
        slack = 2.0 ** -23 if self.backend == "numba" else 2.0 ** -22
        return slack * (1.0 - 2.0 ** -20) + output_rounding(torch.float32, self.num_nodes)

    def _unsolved(self, q: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(scores, steps, bound, certified) of q columns no float32 step was spent on."""
        rows = self.num_nodes if self.target_nodes is None else self.target_nodes.numel()
        dev = self.device
        return (torch.zeros(rows, q, dtype=self.dtype, device=dev),
                torch.zeros(q, dtype=torch.int64, device=dev),
                torch.full((q,), math.inf, dtype=torch.float64, device=dev),
                torch.zeros(q, dtype=torch.bool, device=dev))

    def _iterate(self, seeds: Tensor, tol: float, max_iter: int,
                 top_k: int | None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(scores [T, Q], steps, bound, certified, stalled [Q]) of the iteration's backend."""
        transition = self.transition
        if transition is None:  # only the closed form drops it
            raise RuntimeError("PPRSolver has no transition for the iterate method")
        if self.backend == "numba" and self.damping > 0:  # normalises in-kernel: batch-invariant
            check_seeds_shape(seeds, self.num_nodes)  # values: per column group, in _numba
            return self._numba(seeds, tol, max_iter, top_k or 0)
        r_hat = normalised_seeds(seeds, self.num_nodes)
        if self._perm is not None:
            r_hat = r_hat.index_select(0, self._perm)
        rows = self._out_rows
        step = _triton_step(transition) if self.backend == "triton" else None
        result = ppr_solve(transition, r_hat, method=self.method, tol=tol, max_iter=max_iter,
                           normalised=True, top_k=top_k, target_rows=rows, step=step,
                           exact=self._exact, round_off=self._round_off)
        scores = result.scores if rows is None else result.scores.index_select(0, rows)
        return scores, result.iterations, result.error_bound, result.certified, result.stalled

    def _float64_twin(self) -> PPRSolver:
        """This solver in float64 (same method, backend, order and targets, the kept float64
        operator), made on the first stall: the float64 finish of the module docstring."""
        with self._workspace_lock:
            if self._twin is None:
                twin = copy.copy(self)
                twin.dtype = torch.float64
                twin.transition, twin._exact = self._exact, None
                twin._round_off = self._float64_round_off()
                twin._workspace = None
                twin._scaled_values = twin._scaled_values64 = None
                twin._workspace_lock = threading.Lock()
                self._twin = twin
            return self._twin

    def _float64_round_off(self) -> float:
        """ε₆₄ = (deg_max + 4)·2⁻⁵²: an L1 bound of the round-off of one float64 step from an
        iterate of mass ≤ 1 + tol, r̂'s float64 rounding included (iteration.py, "Round-off
        floor", rule 1)."""
        return (self._max_row_nnz + 4) * 2.0 ** -52

    def _numba(self, seeds: Tensor, tol: float, max_iter: int,
               top_k: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The fused CPU kernel (hippo_gpu.kernels.ppr_cpu): same iterates as the torch path;
        ``seeds`` are validated but not normalised (the kernel divides by its own column sums)."""
        from hippo_gpu.kernels import ppr_cpu

        if self.transition is None:
            raise RuntimeError("PPRSolver has no transition for the numba kernel")
        n, q = seeds.shape
        if self._identity is None:  # seeds arrive permuted, so the kernel's own perm is identity
            self._identity = np.arange(n, dtype=np.int64)
        identity = self._identity
        rows = identity if self._out_rows is None else self._out_rows.numpy()
        weights = np.asarray(
            chebyshev_weights(self.damping, max_iter)
            if self.method == "chebyshev"
            else [1.0] * max_iter,
            dtype=np.float64,
        )
        matrix = self.transition.matrix
        if self._scaled_values is None:  # d·M once per solver; indices are shared zero-copy
            self._scaled_values = (matrix.values() * self.damping).numpy()
            if self._exact is not None:
                self._scaled_values64 = (self._exact.matrix.values() * self.damping).numpy()
        # Residual units. With the float64 check (a float32 solve): r̂ rounded once into
        # float32 moves y* by ≤ 2⁻²⁴ in L1 (‖L‖₁ ≤ 1), (1 − d)·2⁻²⁴ in residual, plus ε₆₄ of
        # the float64 check's step. Without it: the float64 finish's own ε₆₄, or 0.
        if self._scaled_values64 is not None:
            slack = (1.0 - self.damping) * unit_roundoff(torch.float32) + \
                self._float64_round_off()
        else:
            slack = self._round_off
        itemsize = seeds.element_size()
        threads = torch.get_num_threads()
        # Column groups of one block per thread: each group is copied (and permuted) into its
        # own contiguous [N, G] array, so the kernel streams exactly the layout of a G-column
        # call and a batch of 256 costs what 8 batches of 32 cost (measured: a strided fill from
        # one wide [N, Q] array made Q = 256 ~20 % slower per query than Q = 32 on musique).
        _, widths, _ = ppr_cpu.block_layout(q, itemsize, threads, n)
        group = int(widths.max()) * max(1, min(threads, widths.size))
        parts: list[tuple[np.ndarray, ...]] = []
        with self._workspace_lock:  # one call at a time per solver: they share the buffers
            for q0 in range(0, q, group):
                cols = seeds[:, q0:q0 + group]
                if self._perm is not None:  # the copy also applies the locality order
                    cols = cols.index_select(0, self._perm)
                cols = cols.contiguous()
                check_seeds(cols, n, first_column=q0)  # on the copy, while it is in cache
                reset = cols.numpy()
                _, widths, _ = ppr_cpu.block_layout(reset.shape[1], itemsize, threads, n)
                slots = min(threads, widths.size)
                if self._workspace is None or not ppr_cpu.workspace_fits(
                    self._workspace, n, int(widths.max()), slots, reset.dtype
                ):
                    self._workspace = ppr_cpu.make_workspace(
                        n, int(widths.max()), slots, reset.dtype
                    )
                parts.append(ppr_cpu.solve_blocks(
                    matrix.crow_indices().numpy(),  # zero-copy views of the torch CSR
                    matrix.col_indices().numpy(),
                    self._scaled_values,
                    reset,
                    identity,
                    rows,
                    weights,
                    damping=self.damping,
                    tol=tol,
                    top_k=top_k,
                    threads=threads,
                    stall_steps=stall_steps(self.damping),
                    data64=self._scaled_values64,
                    slack=slack,
                    rounding=output_rounding(self.dtype, n),
                    inflate=inflation(n),
                    workspace=self._workspace,
                ))
        joined = [np.concatenate([p[k] for p in parts], axis=1 if k == 0 else 0)
                  for k in range(5)] if len(parts) > 1 else list(parts[0])
        scores, steps, bound, certified, stalled = (torch.from_numpy(a) for a in joined)
        return scores, steps, bound, certified, stalled


def personalized_pagerank(
    adjacency: Tensor,
    seeds: Tensor,
    *,
    damping: float = 0.5,
    tol: float | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
) -> Tensor:
    """PPR for Q reset vectors at once, igraph-prpack semantics (see module docstring, eq. 1).

    Solved by the Chebyshev semi-iteration (eq. 4) with the certified bound (3), in torch
    (a one-off :class:`PPRSolver`: float32 columns that stall are finished in float64).

    Args:
        adjacency: [N, N] symmetric sparse CSR, non-negative weights (zeros ignored).
        seeds: [N, Q] dense, non-negative; each column is normalised to sum 1. Its dtype
            (float64 parity / float32 fast) and device set those of the computation.
        damping: probability of following an edge, in [0, 1).
        tol: L1 error bound per column (default 1e-11 for float64, 1e-6 for float32).
        max_iter: cap on iterations.

    Returns:
        [N, Q] tensor, each column the PPR distribution (sums to 1).

    Raises:
        ValueError: bad shapes, an all-zero / NaN / negative seed column, bad adjacency.
        ToleranceError: ``tol`` at or below the rounding of a result in the seeds' dtype.
        ConvergenceError: ``tol`` not reached within ``max_iter``.
    """
    check_adjacency(adjacency)
    check_seeds_shape(seeds, adjacency.shape[0])
    solver = PPRSolver(adjacency, damping=damping, dtype=seeds.dtype, device=seeds.device,
                       method="chebyshev", kernel="torch", reorder=False, tol=tol,
                       max_iter=max_iter)
    return solver(seeds)


def _cast_transition(transition: Transition, dtype: torch.dtype) -> Transition:
    """The same operator with values cast to ``dtype`` (index tensors shared, not copied)."""
    m = transition.matrix
    matrix = torch.sparse_csr_tensor(m.crow_indices(), m.col_indices(), m.values().to(dtype),
                                     m.shape, check_invariants=False)
    return Transition(matrix, transition.dangling, transition.damping)


def _pick_backend(kernel: str, device: torch.device) -> str:
    """Resolve ``kernel`` for ``device`` once per solver (see :class:`PPRSolver`)."""
    import hippo_gpu.kernels as kernels

    if kernel not in ("auto", "numba", "torch", "triton"):
        raise ValueError(f"kernel must be auto, numba, torch or triton, got {kernel!r}")
    if kernel == "auto":
        if kernels.FORCE_TORCH:
            return "torch"
        if device.type == "cpu":
            return "numba" if kernels.AVAILABLE else "torch"
        return "triton" if device.type == "cuda" and kernels.USE_TRITON else "torch"
    if kernel == "numba" and (device.type != "cpu" or not kernels.AVAILABLE):
        raise ValueError("kernel='numba' needs a CPU device and numba (extra 'kernels')")
    if kernel == "triton" and device.type != "cuda":
        raise ValueError("kernel='triton' needs a CUDA device")
    return kernel


def _triton_step(transition: Transition) -> StepFn:
    from hippo_gpu.kernels import ppr_triton

    return ppr_triton.make_step(transition.matrix, transition.damping)


def _check_targets(target_nodes: Tensor | None, n: int) -> Tensor | None:
    if target_nodes is None:
        return None
    target_nodes = torch.as_tensor(target_nodes, dtype=torch.int64).flatten().cpu()
    if target_nodes.numel() and (target_nodes.min() < 0 or target_nodes.max() >= n):
        raise ValueError(f"target_nodes out of range [0, {n})")
    return target_nodes


def _resolve_method(method: str, closed_form_bytes: int, memory_budget: int,
                    device: torch.device) -> str:
    """"auto" -> closed form where its T-column build is cheap (CUDA) and G fits, else
    Chebyshev; an explicit closed form that does not fit is refused."""
    if method == "closed_form" and closed_form_bytes > memory_budget:
        raise ValueError(f"closed form needs {closed_form_bytes} bytes > memory_budget")
    if method == "auto":
        fits = 0 < closed_form_bytes <= memory_budget
        return "closed_form" if fits and device.type == "cuda" else "chebyshev"
    return method
