"""hippo_gpu.kernels: the numba CPU solve and the Triton step against the float64 oracles and the
torch path (tests/reference.py). Timings live in benchmarks/, not here."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hippo_gpu import kernels
from hippo_gpu.ppr import PPRSolver, build_transition
from tests.helpers import REPO  # noqa: E402
from tests.reference import (
    dense_adjacency,
    dense_ppr,
    edges_to_csr,
    igraph_ppr,
    random_graph,
    random_reset,
)

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")

PARITY_ATOL = 1e-9
FLOAT32_ATOL = 2e-6


def _case(n: int, q: int, seed: int):
    rng = np.random.default_rng(seed)
    edges, weights = random_graph(n, rng)
    return edges, weights, random_reset(n, q, rng)


@functools.lru_cache(maxsize=8)
def _oracle(n: int, q: int, seed: int) -> np.ndarray:
    edges, weights, reset = _case(n, q, seed)
    return dense_ppr(dense_adjacency(edges, weights, n), reset)


def _numba_solver(adjacency, **kw) -> PPRSolver:
    pytest.importorskip("numba")
    solver = PPRSolver(adjacency, kernel="numba", **kw)
    assert solver.backend == "numba"
    return solver


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("n", "q", "method"),
    [(1, 1, "chebyshev"), (7, 3, "chebyshev"), (769, 1, "chebyshev"), (769, 64, "chebyshev"),
     (2000, 3, "chebyshev"), (769, 64, "power")],
)
def test_numba_matches_dense_oracle(dtype: torch.dtype, n: int, q: int, method: str) -> None:
    edges, weights, reset = _case(n, q, seed=n + q)
    solver = _numba_solver(edges_to_csr(edges, weights, n), dtype=dtype, method=method)
    out = solver(torch.from_numpy(reset))
    assert out.shape == (n, q) and out.dtype == dtype
    atol = PARITY_ATOL if dtype == torch.float64 else FLOAT32_ATOL
    np.testing.assert_allclose(out.numpy(), _oracle(n, q, n + q), rtol=0, atol=atol)
    np.testing.assert_allclose(out.double().sum(0).numpy(), np.ones(q), rtol=0, atol=atol)
    assert bool((out >= 0).all())


@pytest.mark.skipif(importlib.util.find_spec("igraph") is None, reason="needs python-igraph")
@pytest.mark.parametrize(("n", "q"), [(7, 64), (5125, 3)])
def test_numba_matches_igraph_prpack(n: int, q: int) -> None:
    edges, weights, reset = _case(n, q, seed=10 * n + q)
    solver = _numba_solver(edges_to_csr(edges, weights, n), dtype=torch.float64)
    out = solver(torch.from_numpy(reset)).numpy()
    np.testing.assert_allclose(out, igraph_ppr(edges, weights, n, reset), rtol=0, atol=1e-8)


def test_numba_is_batch_and_thread_invariant() -> None:
    """Every column sums in CSR order in its own SIMD lane: a query's scores are bit-identical
    whatever else is in its batch and however many threads run."""
    n, q = 769, 40
    edges, weights, reset = _case(n, q, seed=5)
    solver = _numba_solver(edges_to_csr(edges, weights, n), dtype=torch.float32)
    seeds = torch.from_numpy(reset)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = solver(seeds)
        steps = solver.last_steps.clone()
        torch.set_num_threads(2)
        two = solver(seeds)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    cols = [3, 17, 39, 0]
    sub = solver(seeds[:, cols])
    assert torch.equal(sub, one[:, cols])
    assert torch.equal(solver.last_steps, steps[cols])


def test_numba_solver_is_thread_safe() -> None:
    """Concurrent calls on one solver (a server's threads) give the serial results exactly."""
    from concurrent.futures import ThreadPoolExecutor

    n, q = 769, 12
    edges, weights, reset = _case(n, q, seed=6)
    solver = _numba_solver(edges_to_csr(edges, weights, n), dtype=torch.float64)
    seeds = torch.from_numpy(reset)
    batches = [[0, 1, 2], [3, 4], [5, 6, 7, 8], [9, 10, 11]] * 3
    serial = [solver(seeds[:, cols]) for cols in batches]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda cols: solver(seeds[:, cols]), batches))
    for a, b in zip(serial, parallel):
        assert torch.equal(a, b)


def test_numba_agrees_with_torch_path() -> None:
    """Same iterates up to round-off: same step counts, scores within the bounds."""
    n, q = 2000, 16
    edges, weights, reset = _case(n, q, seed=9)
    adjacency = edges_to_csr(edges, weights, n)
    seeds = torch.from_numpy(reset)
    for method in ("chebyshev", "power"):
        fast = _numba_solver(adjacency, dtype=torch.float64, method=method, reorder=False)
        ref = PPRSolver(adjacency, dtype=torch.float64, method=method, kernel="torch")
        a, b = fast(seeds), ref(seeds)
        assert (a - b).abs().max() <= 1e-10
        # the kernel returns y_k (bound ρ/(1−d)), torch g_k (bound dρ/(1−d)): at most 2 steps apart
        assert (fast.last_steps - ref.last_steps).abs().max() <= 2


def test_numba_top_k_and_uncertified_columns() -> None:
    pytest.importorskip("numba")
    from hippo_gpu.kernels import ppr_cpu

    n, q = 769, 9
    edges, weights, reset = _case(n, q, seed=12)
    transition = build_transition(edges_to_csr(edges, weights, n), dtype=torch.float64)
    m = transition.matrix
    args = (m.crow_indices().numpy(), m.col_indices().numpy(), 0.5 * m.values().numpy(),  # d·M
            reset, np.arange(n), np.arange(n))
    weights_ = np.ones(3)  # 3 power steps: not enough for tol
    out, steps, bounds, certified, stalled = ppr_cpu.solve_blocks(
        *args, weights_, damping=0.5, tol=1e-12, top_k=0, threads=1, stall_steps=8)
    assert not certified.any() and not stalled.any()
    assert (steps == 3).all() and (bounds > 1e-12).all()
    np.testing.assert_allclose(out.sum(0), 1.0, atol=1e-12)
    # k >= T: the whole order of all N rows must be certain; k = 1 certifies early
    out, steps, bounds, certified, stalled = ppr_cpu.solve_blocks(
        *args, np.ones(200), damping=0.5, tol=1e-14, top_k=1, threads=2, stall_steps=8)
    assert certified.all()
    expected = _oracle(n, q, 12)
    assert np.array_equal(out.argmax(0), expected.argmax(0))


def test_block_layout() -> None:
    pytest.importorskip("numba")
    from hippo_gpu.kernels import ppr_cpu

    for itemsize, lanes in ((4, 8), (8, 4)):
        for n, widest in ((18_000, 4 * lanes), (6_000_000, 8 * lanes)):  # in L3 / DRAM-bound
            for q in (1, 3, 8, 31, 32, 33, 100, 256):
                for threads in (1, 2, 4):
                    starts, widths, got = ppr_cpu.block_layout(q, itemsize, threads, n)
                    assert got == lanes
                    assert set(widths.tolist()) <= {lanes * v for v in (1, 2, 4, 8)}
                    assert widths.max() <= widest
                    covered = np.concatenate([np.arange(s, s + w) for s, w in zip(starts, widths)])
                    assert np.array_equal(covered[covered < q], np.arange(q))  # each column once
                    assert widths.sum() - q < widest  # padding below one block
            assert ppr_cpu.block_layout(256, itemsize, 1, n)[1].max() == widest


def test_force_torch_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    edges, weights, reset = _case(50, 2, seed=3)
    adjacency = edges_to_csr(edges, weights, 50)
    monkeypatch.setattr(kernels, "FORCE_TORCH", True)
    solver = PPRSolver(adjacency, dtype=torch.float64)
    assert solver.backend == "torch" and solver.method == "chebyshev"
    np.testing.assert_allclose(solver(torch.from_numpy(reset)).numpy(), _oracle(50, 2, 3),
                               rtol=0, atol=PARITY_ATOL)
    with pytest.raises(ValueError):
        PPRSolver(adjacency, kernel="triton")  # CUDA only
    with pytest.raises(ValueError):
        PPRSolver(adjacency, kernel="cuda-magic")


# ---- Triton: the fused step, in the interpreter on CPU (and on CUDA when present) ----------------

# TRITON_INTERPRET must be set before triton is first imported (its own helpers are jitted at
# import), so the interpreter checks run in a fresh interpreter process.
_INTERPRETED_CHECK = """
import numpy as np, torch
from hippo_gpu.kernels import ppr_triton
from hippo_gpu.ppr import build_transition, ppr_solve, torch_step
from tests.reference import dense_adjacency, dense_ppr, edges_to_csr, random_graph, random_reset

assert ppr_triton.INTERPRET
rng = np.random.default_rng(7)
n, q = 40, 5
edges, weights = random_graph(n, rng)
reset = random_reset(n, q, rng)
for dtype, atol in ((torch.float64, 1e-14), (torch.float32, 1e-6)):
    transition = build_transition(edges_to_csr(edges, weights, n), dtype=dtype)
    r_hat = torch.from_numpy(reset / reset.sum(0)).to(dtype)
    base = r_hat * (1 - transition.damping)
    y = r_hat + 0.01 * torch.rand(n, q, dtype=dtype)
    for omega in (None, 1.25):
        outs = []
        for step in (torch_step(transition),
                     ppr_triton.make_step(transition.matrix, transition.damping)):
            prev, g = r_hat.clone(), torch.full_like(r_hat, float("nan"))  # poison: all written
            outs.append((g, prev, *step(base, y, prev, g, omega, True)))
        for a, b in zip(*outs):
            torch.testing.assert_close(b, a, rtol=0, atol=atol)
n, q = 24, 3
edges, weights = random_graph(n, rng)
reset = random_reset(n, q, rng)
expected = dense_ppr(dense_adjacency(edges, weights, n), reset)
transition = build_transition(edges_to_csr(edges, weights, n), dtype=torch.float64)
step = ppr_triton.make_step(transition.matrix, transition.damping)
for method in ("chebyshev", "power"):
    result = ppr_solve(transition, torch.from_numpy(reset), method=method, tol=1e-10, step=step)
    assert result.converged
    np.testing.assert_allclose(result.scores.numpy(), expected, rtol=0, atol=1e-9)
print("ok")
"""


def test_triton_step_interpreted_matches_torch_and_oracle() -> None:
    """The fused step equals the torch step (g, y_prev update, residual, mass; both dtypes, with
    and without ω), and full solves through it match the float64 oracle."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (extra 'kernels')")
    root = REPO
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", _INTERPRETED_CHECK], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_triton_solver_on_cuda(dtype: torch.dtype) -> None:
    pytest.importorskip("triton")
    n, q = 2000, 40
    edges, weights, reset = _case(n, q, seed=2000 + 3)
    adjacency = edges_to_csr(edges, weights, n)
    solver = PPRSolver(adjacency, dtype=dtype, device="cuda", method="chebyshev", kernel="triton")
    assert solver.backend == "triton"
    out = solver(torch.from_numpy(reset)).cpu().numpy()
    expected = dense_ppr(dense_adjacency(edges, weights, n), reset)
    atol = PARITY_ATOL if dtype == torch.float64 else FLOAT32_ATOL
    np.testing.assert_allclose(out, expected, rtol=0, atol=atol)


def test_numba_bad_seed_columns_are_named_in_batch_numbering() -> None:
    """Values are validated per column group (on the group's copy); errors still name the
    batch's own column numbers, also past the first group of 32 float32 columns."""
    n, q = 769, 70
    edges, weights, reset = _case(n, q, seed=13)
    solver = _numba_solver(edges_to_csr(edges, weights, n), dtype=torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # groups of 32 columns: 0-31, 32-63, 64-69
        for col in (3, 40, 66):
            bad = torch.from_numpy(reset.copy())
            bad[:, col] = 0
            with pytest.raises(ValueError, match=rf"seed columns \[{col}\] are all zero"):
                solver(bad)
        bad = torch.from_numpy(reset.copy())
        bad[5, 50] = float("nan")
        with pytest.raises(ValueError, match="NaN"):
            solver(bad)
    finally:
        torch.set_num_threads(threads)
