"""Batched personalized PageRank (PPR): Q queries per solve, one sparse x dense product per step.

Semantics are those of igraph's ``Graph.personalized_pagerank(directed=False, weights=...,
reset=r, implementation='prpack')`` as HippoRAG calls it. With d = ``damping``, A the symmetric
weighted adjacency [N, N], D = diag(A 1) and r̂ = r / 1ᵀr, the PPR vector x is the fixed point

    x = (1 - d) r̂ + d Aᵀ D⁻¹ x + d (Σ_{i: D_ii = 0} x_i) r̂        (1)

i.e. a walker follows an edge with probability d (proportionally to its weight) and otherwise
restarts at r̂; a walker on a dangling (zero-degree) node always restarts at r̂.

We solve the equivalent "leaky" system instead. Let M = A D⁻¹ (columns of dangling nodes are zero;
as A is symmetric, M = Pᵀ with P = D⁻¹ A the row-normalised transition) and

    y = (1 - d) r̂ + d M y,    x = y / 1ᵀy.                         (2)

Proof: 1ᵀM y = Σ_{j not dangling} y_j, so any solution of (2) rescaled to sum 1 satisfies (1), and
(1) has a unique solution for d < 1. Form (2) needs no per-step dangling correction: each step is
one fused ``addmm`` for all Q columns, and y is *linear* in r̂, which :class:`PPRSolver` exploits.

Convergence: ‖M z‖₁ ≤ ‖z‖₁, so the map contracts by d in L1 and
‖y_k − y*‖₁ ≤ d/(1−d) ‖y_k − y_{k−1}‖₁. Normalising, ‖x_k − x*‖₁ ≤ 2‖y_k − y*‖₁ / 1ᵀy_k. We stop a
column when that bound is ≤ ``tol``; the batch stops when every column has. The bound is on the L1
error, so it also bounds the max abs error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "ConvergenceError",
    "PPRResult",
    "PPRSolver",
    "Transition",
    "build_transition",
    "default_tol",
    "personalized_pagerank",
    "ppr_iterate",
    "rcm_permutation",
]

DEFAULT_MAX_ITER = 1000


class ConvergenceError(RuntimeError):
    """Raised when PPR has not reached ``tol`` within ``max_iter`` steps."""


def default_tol(dtype: torch.dtype) -> float:
    """L1 error bound used when ``tol`` is None: tight for float64, above round-off for float32."""
    return 1e-11 if dtype == torch.float64 else 1e-6


@dataclass(frozen=True)
class PPRResult:
    """Output of :func:`ppr_iterate`.

    Attributes:
        scores: [N, Q] PPR probabilities; each column sums to 1.
        iterations: [Q] int64, the first checked step at which each column met ``tol`` (max_iter
            if never); checks are spaced by the observed decay, so this can exceed the true step.
        error_bound: [Q] L1 error bound of each column at exit.
        converged: whether every column met ``tol``.
    """

    scores: Tensor  # [N, Q]
    iterations: Tensor  # [Q]
    error_bound: Tensor  # [Q]
    converged: bool

    @property
    def steps(self) -> int:
        """Number of sparse products the batch ran (the slowest column's count)."""
        return int(self.iterations.max()) if self.iterations.numel() else 0


@dataclass(frozen=True)
class Transition:
    """The normalised walk operator of one graph, built once per index.

    Attributes:
        matrix: [N, N] sparse CSR, M = A D⁻¹ (M[i, j] = A[i, j] / deg(j)); dangling columns empty.
        dangling: [N] bool, zero weighted degree.
        damping: probability d of following an edge.
    """

    matrix: Tensor  # [N, N] CSR
    dangling: Tensor  # [N] bool
    damping: float

    @property
    def num_nodes(self) -> int:
        return int(self.matrix.shape[0])

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> Transition:
        """Copy to another device and/or value dtype."""
        return Transition(
            self.matrix.to(device=device, dtype=dtype), self.dangling.to(device), self.damping
        )


def _check_damping(damping: float) -> float:
    damping = float(damping)
    if not 0.0 <= damping < 1.0:
        raise ValueError(f"damping must be in [0, 1), got {damping}")
    return damping


def _check_adjacency(adjacency: Tensor) -> None:
    if not isinstance(adjacency, Tensor) or adjacency.layout != torch.sparse_csr:
        raise ValueError("adjacency must be a torch sparse CSR tensor (Tensor.to_sparse_csr())")
    if adjacency.dim() != 2 or adjacency.shape[0] != adjacency.shape[1]:
        raise ValueError(f"adjacency must be square [N, N], got {tuple(adjacency.shape)}")
    values = adjacency.values()
    if not values.is_floating_point():
        raise ValueError(f"adjacency values must be floating point, got {values.dtype}")
    if values.numel() and not bool(torch.isfinite(values).all()):
        raise ValueError("adjacency has non-finite weights")
    if values.numel() and bool((values < 0).any()):
        raise ValueError("adjacency has negative weights")


def build_transition(
    adjacency: Tensor,
    *,
    damping: float = 0.5,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Transition:
    """Normalise a symmetric adjacency into M = A D⁻¹ (weights summed in float64, then cast).

    Args:
        adjacency: [N, N] sparse CSR, symmetric, non-negative weights (zeros carry no walk).
        damping: probability d of following an edge, in [0, 1).
        dtype: value dtype of the returned operator.
        device: target device (default: the adjacency's).

    Returns:
        The :class:`Transition`. Symmetry is assumed, not checked (it would cost a transpose).
    """
    damping = _check_damping(damping)
    _check_adjacency(adjacency)
    device = adjacency.device if device is None else torch.device(device)
    crow = adjacency.crow_indices()
    col = adjacency.col_indices()
    values = adjacency.values().to(torch.float64)
    n = adjacency.shape[0]
    rows = torch.repeat_interleave(torch.arange(n, device=crow.device), crow[1:] - crow[:-1])
    degree = torch.zeros(n, dtype=torch.float64, device=values.device).index_add_(0, rows, values)
    dangling = degree <= 0
    inv_degree = torch.where(dangling, torch.zeros_like(degree), 1.0 / degree)
    scaled = (values * inv_degree[col]).to(dtype)  # M[i, j] = A[i, j] / deg(j)
    if max(n, col.numel()) < 2**31 - 1:  # int32 indices: MKL's fast path, ~1.4x on the CPU
        crow, col = crow.to(torch.int32), col.to(torch.int32)
    matrix = torch.sparse_csr_tensor(crow, col, scaled, (n, n), check_invariants=False).to(device)
    return Transition(matrix, dangling.to(device), damping)


def _normalised_seeds(seeds: Tensor, num_nodes: int) -> Tensor:
    """Validate [N, Q] reset weights and return r̂ = r / 1ᵀr (column-wise)."""
    if not isinstance(seeds, Tensor) or seeds.layout != torch.strided:
        raise ValueError("seeds must be a dense torch.Tensor [N, Q]")
    if seeds.dim() != 2 or seeds.shape[0] != num_nodes:
        raise ValueError(f"seeds must have shape [N={num_nodes}, Q], got {tuple(seeds.shape)}")
    if seeds.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"seeds must be float32 or float64, got {seeds.dtype}")
    if seeds.numel() == 0:
        raise ValueError("seeds has no entries")
    if bool(torch.isnan(seeds).any()) or bool(torch.isinf(seeds).any()):
        raise ValueError("seeds contains NaN or inf")
    if bool((seeds < 0).any()):
        raise ValueError("seeds contains negative entries")
    total = seeds.sum(dim=0, keepdim=True)  # [1, Q]
    if bool((total <= 0).any()):
        bad = torch.nonzero(total[0] <= 0).flatten().tolist()[:10]
        raise ValueError(
            f"seed columns {bad} are all zero; each query needs a positive reset weight"
        )
    return seeds / total


def ppr_iterate(
    transition: Transition,
    reset: Tensor,
    *,
    tol: float | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
    normalised: bool = False,
) -> PPRResult:
    """Iterate y ← (1−d) r̂ + d M y for all Q columns at once and return x = y / 1ᵀy.

    Args:
        transition: operator from :func:`build_transition`, same device as ``reset``; its value
            dtype should equal ``reset``'s.
        reset: [N, Q] non-negative reset weights (normalised here unless ``normalised``).
        tol: L1 error bound per column (default :func:`default_tol` of the dtype).
        max_iter: at most this many sparse products.
        normalised: skip validation; ``reset`` columns already sum to 1.

    Returns:
        :class:`PPRResult` with scores [N, Q].
    """
    n = transition.num_nodes
    r_hat = reset if normalised else _normalised_seeds(reset, n)
    tol = default_tol(r_hat.dtype) if tol is None else float(tol)
    if tol <= 0 or max_iter < 1:
        raise ValueError(f"need tol > 0 and max_iter >= 1, got tol={tol}, max_iter={max_iter}")
    d = transition.damping
    q = r_hat.shape[1]
    iterations = torch.full((q,), max_iter, dtype=torch.int64, device=r_hat.device)
    if d == 0.0:  # no walk: x = r̂ exactly
        zeros = torch.zeros(q, dtype=r_hat.dtype, device=r_hat.device)
        return PPRResult(r_hat.clone(), iterations.zero_(), zeros, True)
    matrix = transition.matrix
    base = r_hat * (1.0 - d)  # [N, Q]
    y = r_hat.clone()  # [N, Q]  any start converges; r̂ keeps the first residual ≤ 2
    y_next = torch.empty_like(y)
    factor = 2.0 * d / (1.0 - d)
    bound = torch.full((q,), math.inf, dtype=r_hat.dtype, device=r_hat.device)
    done = torch.zeros(q, dtype=torch.bool, device=r_hat.device)
    converged = False
    # The residual check costs ~40 % of an SpMM on the CPU and a device sync, so after the first
    # checks we extrapolate the observed geometric decay and check next where tol should be met.
    next_check, last_check, last_worst = 1, 0, math.inf
    for step in range(1, max_iter + 1):
        torch.addmm(base, matrix, y, beta=1.0, alpha=d, out=y_next)  # y' = (1-d) r̂ + d M y
        if step == next_check or step == max_iter:
            residual = y.sub_(y_next).abs_().sum(dim=0)  # [Q]; y is dead after this, reuse it
            bound = factor * residual / y_next.sum(dim=0)
            now = bound <= tol
            iterations = torch.where(now & ~done, step, iterations)
            done |= now
            if bool(done.all()):
                y = y_next
                converged = True
                break
            worst = float(bound[~done].max())
            next_check = step + _steps_to_tol(worst, last_worst, step - last_check, tol)
            last_check, last_worst = step, worst
        y, y_next = y_next, y
    scores = y / y.sum(dim=0, keepdim=True)
    return PPRResult(scores, iterations, bound, converged)


def _steps_to_tol(worst: float, previous: float, gap: int, tol: float) -> int:
    """Steps until the next residual check, from the decay rate seen between the last two."""
    if not math.isfinite(previous) or worst <= 0 or worst >= previous:
        return 1
    rate = (worst / previous) ** (1.0 / gap)
    return max(1, min(16, math.ceil(math.log(tol / worst) / math.log(rate))))


def personalized_pagerank(
    adjacency: Tensor,
    seeds: Tensor,
    *,
    damping: float = 0.5,
    tol: float | None = None,
    max_iter: int = DEFAULT_MAX_ITER,
) -> Tensor:
    """PPR for Q reset vectors at once, igraph-prpack semantics (see module docstring, eq. 1).

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
        ConvergenceError: ``tol`` not reached within ``max_iter``.
    """
    _check_adjacency(adjacency)
    r_hat = _normalised_seeds(seeds, adjacency.shape[0])
    transition = build_transition(
        adjacency, damping=damping, dtype=seeds.dtype, device=seeds.device
    )
    result = ppr_iterate(transition, r_hat, tol=tol, max_iter=max_iter, normalised=True)
    if not result.converged:
        raise ConvergenceError(
            f"PPR did not reach tol within {max_iter} iterations "
            f"(worst L1 bound {float(result.error_bound.max()):.3g})"
        )
    return result.scores


def rcm_permutation(adjacency: Tensor) -> Tensor:
    """Reverse Cuthill–McKee order of a symmetric CSR graph (scipy), as an [N] int64 permutation.

    ``perm[k]`` is the original node placed at position k; it clusters neighbours in memory.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    a = adjacency.to("cpu")
    n = a.shape[0]
    graph = csr_matrix(
        (
            np.ones(a.values().numel(), dtype=np.int8),
            a.col_indices().numpy(),
            a.crow_indices().numpy(),
        ),
        shape=(n, n),
    )
    perm = reverse_cuthill_mckee(graph, symmetric_mode=True)
    return torch.from_numpy(np.ascontiguousarray(perm, dtype=np.int64))


def _permute_csr(adjacency: Tensor, perm: Tensor) -> Tensor:
    """Return A[perm][:, perm] as CSR (on the CPU, via scipy)."""
    from scipy.sparse import csr_matrix

    a = adjacency.to("cpu")
    n = a.shape[0]
    sp = csr_matrix(
        (a.values().numpy(), a.col_indices().numpy(), a.crow_indices().numpy()), shape=(n, n)
    )
    p = perm.numpy()
    sp = sp[p][:, p].tocsr()
    sp.sort_indices()
    return torch.sparse_csr_tensor(
        torch.from_numpy(sp.indptr.astype(np.int64)),
        torch.from_numpy(sp.indices.astype(np.int64)),
        torch.from_numpy(sp.data),
        (n, n),
        check_invariants=False,
    )


def _solve_target_rows(
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


class PPRSolver:
    """PPR for many query batches on one fixed graph, precomputed once per index.

    ``solver(seeds)`` returns the raw PPR probabilities x[T, Q] at ``target_nodes`` (all N rows
    when None), in the original node order, equal to ``personalized_pagerank(A, seeds)[targets]``
    up to the solver tolerance. Two methods:

    * ``"iterate"``: eq. (2) power iteration on the precomputed M (optionally RCM-reordered for
      locality; seeds are permuted in and results mapped back).
    * ``"closed_form"``: y is linear in r, so x_T = G r / (cᵀ r) with G = L[T, :],
      L = (1−d)(I − dM)⁻¹ and c = 1ᵀL. Because dangling nodes of a symmetric graph are isolated,
      c_j = 1 − d·[j dangling] exactly. G is solved once (T right-hand sides); a query batch is then
      one [T, T] x [T, Q] GEMM for the target rows of r plus a gathered GEMM over the few other
      nonzero rows (HippoRAG 2: ~5 phrase seeds per query). Needs T·N values of memory.

    ``method="auto"`` picks closed form on CUDA when T·N·itemsize ≤ ``memory_budget`` bytes, else
    iterate: on the CPU the build (T columns x ~40 sparse steps: 13 s for T = 2k, N = 12k on one
    core) outweighs its ~1.3x per-query gain over iterate (benchmarks/bench_ppr.py).

    Args:
        adjacency: [N, N] symmetric sparse CSR, non-negative weights.
        damping: probability d of following an edge.
        target_nodes: [T] int64 rows to return (e.g. passage nodes), or None for all N.
        dtype: float32 (fast) or float64 (parity).
        device: where the operator lives (default: the adjacency's device).
        method: "auto", "iterate" or "closed_form".
        reorder: reverse Cuthill–McKee reordering for the iterate method.
        memory_budget: bytes allowed for G in "auto".
        tol: default L1 error bound per column (iterate) / build tolerance (closed form).
        max_iter: default iteration cap.
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
        reorder: bool = False,
        memory_budget: int = 1 << 30,
        tol: float | None = None,
        max_iter: int = DEFAULT_MAX_ITER,
    ) -> None:
        _check_adjacency(adjacency)
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"dtype must be float32 or float64, got {dtype}")
        if method not in ("auto", "iterate", "closed_form"):
            raise ValueError(f"unknown method {method!r}")
        device = adjacency.device if device is None else torch.device(device)
        n = adjacency.shape[0]
        if target_nodes is not None:
            target_nodes = torch.as_tensor(target_nodes, dtype=torch.int64).flatten().cpu()
            if target_nodes.numel() and (target_nodes.min() < 0 or target_nodes.max() >= n):
                raise ValueError(f"target_nodes out of range [0, {n})")
        t = n if target_nodes is None else target_nodes.numel()
        itemsize = torch.finfo(dtype).bits // 8
        if method == "closed_form" and t * n * itemsize > memory_budget:
            raise ValueError(f"closed form needs {t * n * itemsize} bytes > memory_budget")
        if method == "auto":  # closed form pays off where its T-column build is cheap: CUDA
            fits = 0 < t * n * itemsize <= memory_budget
            method = "closed_form" if fits and device.type == "cuda" else "iterate"
        self.num_nodes = n
        self.damping = _check_damping(damping)
        self.dtype = dtype
        self.method = method
        self.tol = default_tol(dtype) if tol is None else float(tol)
        self.max_iter = int(max_iter)
        self.last_iterations = 0  # sparse products run by the last call (0 for closed form)
        self.build_iterations = 0
        targets = torch.arange(n) if target_nodes is None else target_nodes
        self.target_nodes = target_nodes

        if method == "closed_form":
            # Built in float64 on the CPU/device for accuracy, stored in the requested dtype.
            transition = build_transition(
                adjacency, damping=damping, dtype=torch.float64, device=device
            )
            build_tol = 1e-12 if dtype == torch.float64 else 1e-9
            g_t, steps = _solve_target_rows(
                transition,
                targets.to(device),
                tol=build_tol * (1 - self.damping),
                max_iter=max_iter,
            )
            self.build_iterations = steps
            is_target = torch.zeros(n, dtype=torch.bool)
            is_target[targets] = True
            others = torch.nonzero(~is_target).flatten()
            # G = L[T, :] split by column: [T, T] for the target rows of r, and the rest stored
            # transposed ([N−T, T], row-major) so gathering a few nonzero seed rows is contiguous.
            self._g_target = g_t[targets.to(device)].T.contiguous().to(dtype)  # [T, T]
            self._g_rest_t = g_t[others.to(device)].to(dtype).contiguous()  # [N−T, T]
            del g_t
            self._targets = targets.to(device)
            self._others = others.to(device)
            self._dangling = transition.dangling
            self.transition = None
            self._perm = None
            self._out_rows = None
        else:
            perm = rcm_permutation(adjacency) if reorder else None
            adj = _permute_csr(adjacency, perm) if perm is not None else adjacency
            self.transition = build_transition(adj, damping=damping, dtype=dtype, device=device)
            if perm is not None:
                inverse = torch.empty_like(perm)
                inverse[perm] = torch.arange(n)
                self._perm = perm.to(device)
                self._out_rows = inverse[targets].to(device)  # position of each target after perm
            else:
                self._perm = None
                self._out_rows = None if target_nodes is None else targets.to(device)
        self.device = device

    def to(self, device: torch.device | str) -> PPRSolver:
        """Move every precomputed tensor to ``device`` (in place); returns self."""
        device = torch.device(device)
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                setattr(self, name, value.to(device))
        if self.transition is not None:
            self.transition = self.transition.to(device)
        self.device = device
        return self

    def __call__(
        self, seeds: Tensor, *, tol: float | None = None, max_iter: int | None = None
    ) -> Tensor:
        """PPR probabilities at the target rows.

        Args:
            seeds: [N, Q] non-negative reset weights in original node order (any device/dtype;
                cast to the solver's).
            tol: L1 error bound per column (iterate method; closed form is exact to its build tol).
            max_iter: iteration cap (iterate method).

        Returns:
            [T, Q] (or [N, Q]) tensor in the solver's dtype and device.
        """
        seeds = seeds.to(device=self.device, dtype=self.dtype)
        if self.method == "closed_form":
            return self._closed_form(seeds)
        r_hat = _normalised_seeds(seeds, self.num_nodes)
        if self._perm is not None:
            r_hat = r_hat.index_select(0, self._perm)
        if self.transition is None:  # only the closed form drops it
            raise RuntimeError("PPRSolver has no transition for the iterate method")
        result = ppr_iterate(
            self.transition,
            r_hat,
            tol=self.tol if tol is None else tol,
            max_iter=self.max_iter if max_iter is None else max_iter,
            normalised=True,
        )
        self.last_iterations = result.steps
        if not result.converged:
            raise ConvergenceError(
                f"PPR did not converge (worst L1 bound {float(result.error_bound.max()):.3g})"
            )
        scores = result.scores
        return scores if self._out_rows is None else scores.index_select(0, self._out_rows)

    def _closed_form(self, seeds: Tensor) -> Tensor:
        """x_T = G r / (cᵀ r); r needs no normalisation (the ratio is scale-free)."""
        r = _normalised_seeds(seeds, self.num_nodes)  # validation; also keeps magnitudes tame
        self.last_iterations = 0
        r_target = r.index_select(0, self._targets)  # [T, Q]
        out = self._g_target @ r_target  # [T, Q]
        if self._others.numel():
            r_rest = r.index_select(0, self._others)  # [N−T, Q]
            active = torch.nonzero(r_rest.ne(0).any(dim=1)).flatten()  # [K] rows with any seed
            if active.numel():
                g = self._g_rest_t.index_select(0, active)  # [K, T]
                out.addmm_(g.T, r_rest.index_select(0, active))
        dangling_mass = (r * self._dangling.unsqueeze(1)).sum(dim=0)  # [Q]
        return out / (1.0 - self.damping * dangling_mass)
