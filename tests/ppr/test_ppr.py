"""hippo_gpu.ppr against the float64 dense oracle and igraph prpack (tests/reference.py)."""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest
import torch

from hippo_gpu.ppr import (
    ConvergenceError,
    PPRSolver,
    build_transition,
    chebyshev_weights,
    personalized_pagerank,
    ppr_solve,
)
from tests.reference import (
    dense_adjacency,
    dense_ppr,
    edges_to_csr,
    igraph_ppr,
    random_graph,
    random_reset,
)

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")

needs_igraph = pytest.mark.skipif(
    importlib.util.find_spec("igraph") is None, reason="python-igraph is the upstream reference"
)
needs_numba = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="numba runs the CPU kernel (extra 'kernels')"
)

PARITY_ATOL = 1e-9  # float64 vs prpack / the dense oracle, max abs
FLOAT32_ATOL = 2e-6  # float32 vs float64, max abs (default float32 tol bounds the L1 error by 1e-6)

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
        ],
    ),
]


def _case(n: int, q: int, seed: int):
    rng = np.random.default_rng(seed)
    edges, weights = random_graph(n, rng)
    reset = random_reset(n, q, rng)
    return edges, weights, reset


@functools.lru_cache(maxsize=8)
def _oracle(n: int, q: int, seed: int) -> np.ndarray:
    """Dense float64 PPR of :func:`_case` (cached: several tests share a case)."""
    edges, weights, reset = _case(n, q, seed)
    out = dense_ppr(dense_adjacency(edges, weights, n), reset)
    out.flags.writeable = False
    return out


def _topk_overlap(a: np.ndarray, b: np.ndarray, k: int) -> float:
    k = min(k, a.shape[0])
    ta = np.argsort(-a, axis=0, kind="stable")[:k]
    tb = np.argsort(-b, axis=0, kind="stable")[:k]
    return float(np.mean([len(set(ta[:, j]) & set(tb[:, j])) / k for j in range(a.shape[1])]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("n", "q"), [(1, 1), (7, 3), (769, 3), (2000, 1)])
def test_matches_dense_oracle(device: str, n: int, q: int) -> None:
    edges, weights, reset = _case(n, q, seed=n + q)
    adjacency = edges_to_csr(edges, weights, n).to(device)
    x = personalized_pagerank(adjacency, torch.from_numpy(reset).to(device))
    expected = dense_ppr(dense_adjacency(edges, weights, n), reset)
    assert x.shape == (n, q) and x.dtype == torch.float64 and x.device.type == device
    np.testing.assert_allclose(x.cpu().numpy(), expected, rtol=0, atol=PARITY_ATOL)
    np.testing.assert_allclose(x.sum(0).cpu().numpy(), np.ones(q), rtol=0, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("n", "q"), [(1, 3), (7, 1), (7, 64), (769, 1), (769, 64), (5125, 3)])
def test_matches_igraph_prpack(device: str, n: int, q: int) -> None:
    edges, weights, reset = _case(n, q, seed=10 * n + q)
    adjacency = edges_to_csr(edges, weights, n).to(device)
    x = personalized_pagerank(adjacency, torch.from_numpy(reset).to(device))
    expected = igraph_ppr(edges, weights, n, reset)
    np.testing.assert_allclose(x.cpu().numpy(), expected, rtol=0, atol=PARITY_ATOL)


@pytest.mark.parametrize("damping", [0.0, 0.15, 0.85])
def test_other_dampings_match_oracle(damping: float) -> None:
    edges, weights, reset = _case(97, 3, seed=5)
    x = personalized_pagerank(
        edges_to_csr(edges, weights, 97), torch.from_numpy(reset), damping=damping
    )
    expected = dense_ppr(dense_adjacency(edges, weights, 97), reset, damping)
    np.testing.assert_allclose(x.numpy(), expected, rtol=0, atol=PARITY_ATOL)


@needs_igraph
def test_dangling_seed_and_zero_weight_edges() -> None:
    """A seed on an isolated node keeps its restart mass; zero-weight edges are ignored."""
    n = 6
    edges = np.array([[0, 1], [1, 2], [2, 3], [4, 5]])
    weights = np.array([1.0, 2.0, 0.5, 0.0])  # 4-5 has weight 0: both are dangling
    reset = np.zeros((n, 3))
    reset[5, 0] = 1.0  # only an isolated node
    reset[[0, 4], 1] = [1.0, 3.0]  # mixed
    reset[:, 2] = 1.0
    adjacency = torch.sparse_csr_tensor(  # keep the explicit zeros in the CSR structure
        torch.tensor([0, 1, 3, 5, 6, 7, 8]),
        torch.tensor([1, 0, 2, 1, 3, 2, 5, 4]),
        torch.tensor([1.0, 1.0, 2.0, 2.0, 0.5, 0.5, 0.0, 0.0], dtype=torch.float64),
        (n, n),
    )
    x = personalized_pagerank(adjacency, torch.from_numpy(reset)).numpy()
    expected = igraph_ppr(edges[:3], weights[:3], n, reset)
    np.testing.assert_allclose(x, expected, rtol=0, atol=PARITY_ATOL)
    np.testing.assert_allclose(x[:, 0], np.eye(n)[5], atol=1e-15)


@pytest.mark.parametrize("device", DEVICES)
def test_float32_agrees_with_float64(device: str) -> None:
    edges, weights, reset = _case(769, 64, seed=3)
    adjacency = edges_to_csr(edges, weights, 769).to(device)
    seeds = torch.from_numpy(reset).to(device)
    x64 = personalized_pagerank(adjacency, seeds).cpu().numpy()
    x32 = personalized_pagerank(adjacency, seeds.float())
    assert x32.dtype == torch.float32
    x32 = x32.cpu().numpy()
    np.testing.assert_allclose(x32, x64, rtol=0, atol=FLOAT32_ATOL)
    assert _topk_overlap(x32, x64, 10) >= 0.97


def test_iterations_reported_and_tol_respected() -> None:
    edges, weights, reset = _case(769, 3, seed=11)
    adjacency = edges_to_csr(edges, weights, 769)
    transition = build_transition(adjacency)
    loose = ppr_solve(transition, torch.from_numpy(reset), method="power", tol=1e-4)
    tight = ppr_solve(transition, torch.from_numpy(reset), method="power", tol=1e-12)
    assert loose.converged and tight.converged
    assert loose.iterations.shape == (3,) and tight.iterations.shape == (3,)
    assert 1 <= int(loose.iterations.max()) < int(tight.iterations.min())
    assert bool((tight.error_bound <= 1e-12).all())
    expected = dense_ppr(dense_adjacency(edges, weights, 769), reset)
    errors = np.abs(loose.scores.numpy() - expected).sum(0)  # true L1 error per column
    assert bool((errors <= 1e-4).all())  # the reported bound is a real bound
    with pytest.raises(ConvergenceError):
        personalized_pagerank(adjacency, torch.from_numpy(reset), tol=1e-12, max_iter=2)


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((7, 2)),  # all-zero columns
        np.array([[1.0, 0.0]] * 6 + [[np.nan, 1.0]]),
        np.array([[1.0, 1.0]] * 6 + [[-0.5, 1.0]]),
        np.ones((6, 2)),  # shape mismatch
        np.ones(7),  # not [N, Q]
    ],
    ids=["zero-column", "nan", "negative", "rows", "1d"],
)
def test_bad_seeds_raise(bad: np.ndarray) -> None:
    edges, weights, _ = _case(7, 1, seed=0)
    with pytest.raises(ValueError):
        personalized_pagerank(edges_to_csr(edges, weights, 7), torch.from_numpy(bad))


def test_bad_adjacency_and_damping_raise() -> None:
    edges, weights, reset = _case(7, 1, seed=0)
    seeds = torch.from_numpy(reset)
    dense = torch.from_numpy(dense_adjacency(edges, weights, 7))
    with pytest.raises(ValueError):
        personalized_pagerank(dense, seeds)  # not CSR
    with pytest.raises(ValueError):
        personalized_pagerank((-dense).to_sparse_csr(), seeds)
    with pytest.raises(ValueError):
        personalized_pagerank(dense.to_sparse_csr(), seeds, damping=1.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("method", "kernel", "reorder"),
    [
        ("closed_form", "auto", False),
        ("power", "torch", False),
        ("power", "torch", True),
        ("chebyshev", "torch", False),
        ("chebyshev", "torch", True),
        pytest.param("chebyshev", "numba", None, marks=needs_numba),
        pytest.param("power", "numba", False, marks=needs_numba),
    ],
)
def test_solver_matches_function(
    device: str, dtype: torch.dtype, method: str, kernel: str, reorder: bool | None
) -> None:
    if kernel == "numba" and device != "cpu":
        pytest.skip("the numba kernel is the CPU backend")
    n, q = 769, 64
    edges, weights, reset = _case(n, q, seed=21)
    adjacency = edges_to_csr(edges, weights, n)
    targets = torch.from_numpy(np.random.default_rng(1).choice(n, 200, replace=False))
    solver = PPRSolver(
        adjacency, target_nodes=targets, dtype=dtype, device=device, method=method,
        reorder=reorder, kernel=kernel,
    )
    if method != "closed_form":
        assert solver.backend == kernel
    seeds = torch.from_numpy(reset)
    out = solver(seeds)
    assert out.shape == (200, q) and out.dtype == dtype and out.device.type == device
    expected = _oracle(n, q, 21)[targets.numpy()]
    atol = PARITY_ATOL if dtype == torch.float64 else FLOAT32_ATOL
    np.testing.assert_allclose(out.cpu().numpy(), expected, rtol=0, atol=atol)
    if method != "closed_form":
        assert solver.last_iterations > 0
        assert solver.last_steps is not None and solver.last_steps.shape == (q,)
        assert bool((solver.last_error_bound <= solver.tol).all())
    # A second batch through the same precomputed solver (buffers, gathers) stays exact.
    out2 = solver(seeds[:, :5].flip(1)).cpu().numpy()
    np.testing.assert_allclose(out2, expected[:, :5][:, ::-1], rtol=0, atol=atol)


def test_solver_all_rows_and_to() -> None:
    edges, weights, reset = _case(50, 3, seed=2)
    adjacency = edges_to_csr(edges, weights, 50)
    expected = dense_ppr(dense_adjacency(edges, weights, 50), reset)
    for method in ("closed_form", "power", "chebyshev"):
        solver = PPRSolver(adjacency, dtype=torch.float64, method=method).to("cpu")
        np.testing.assert_allclose(
            solver(torch.from_numpy(reset)).numpy(), expected, rtol=0, atol=PARITY_ATOL
        )
    auto = PPRSolver(adjacency, dtype=torch.float64)  # CPU: chebyshev
    assert auto.method == "chebyshev"
    with pytest.raises(ValueError):
        auto(torch.zeros(50, 1, dtype=torch.float64))


def test_chebyshev_weights() -> None:
    d = 0.5
    w = chebyshev_weights(d, 40)
    assert w[0] == 1.0 and w[1] == pytest.approx(2 / (2 - d * d))
    # ω_k decreases to the optimal SOR-like limit 2 / (1 + sqrt(1 - d²))
    assert all(a >= b for a, b in zip(w[1:], w[2:]))
    assert w[-1] == pytest.approx(2 / (1 + np.sqrt(1 - d * d)), rel=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tol", [1e-4, 1e-8, 1e-12])
def test_chebyshev_bound_is_real_and_saves_steps(device: str, tol: float) -> None:
    """The reported L1 bound covers the true error (float64 oracle); fewer steps than power."""
    n, q = 769, 8
    edges, weights, reset = _case(n, q, seed=31)
    transition = build_transition(edges_to_csr(edges, weights, n), device=device)
    seeds = torch.from_numpy(reset).to(device)
    cheb = ppr_solve(transition, seeds, method="chebyshev", tol=tol)
    power = ppr_solve(transition, seeds, method="power", tol=tol)
    assert cheb.converged and power.converged
    expected = _oracle(n, q, 31)
    for result in (cheb, power):
        errors = np.abs(result.scores.cpu().numpy() - expected).sum(0)  # true L1 per column
        bound = result.error_bound.cpu().numpy()
        assert bool((bound <= tol).all())
        assert bool((errors <= bound + 1e-14).all())
        assert bool((result.scores.cpu() >= 0).all())
    assert int(cheb.iterations.max()) < int(power.iterations.max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", ["torch", pytest.param("numba", marks=needs_numba)])
@pytest.mark.parametrize("k", [1, 10, 300])
def test_top_k_exit_certifies_order(device: str, kernel: str, k: int) -> None:
    """With top_k, each column's top-k targets and their order equal the oracle's, in no more
    steps than the tol-only solve (often far fewer)."""
    if kernel == "numba" and device != "cpu":
        pytest.skip("the numba kernel is the CPU backend")
    n, q = 769, 16
    edges, weights, reset = _case(n, q, seed=41)
    adjacency = edges_to_csr(edges, weights, n)
    targets = torch.from_numpy(np.random.default_rng(2).choice(n, 250, replace=False))
    expected = _oracle(n, q, 41)[targets.numpy()]
    solver = PPRSolver(adjacency, target_nodes=targets, dtype=torch.float64, device=device,
                       kernel=kernel, tol=1e-11)
    full = solver(torch.from_numpy(reset)).cpu().numpy()
    full_steps = solver.last_steps.clone()
    out = solver(torch.from_numpy(reset), top_k=k).cpu().numpy()
    assert bool((solver.last_steps <= full_steps).all())
    if k == 1:
        assert bool((solver.last_steps < full_steps).any())
    m = min(k, targets.numel())
    for j in range(q):
        want = np.argsort(-expected[:, j], kind="stable")[:m]
        assert np.array_equal(np.argsort(-out[:, j], kind="stable")[:m], want)
        assert np.array_equal(np.argsort(-full[:, j], kind="stable")[:m], want)
    # the scores themselves are still within the reported (looser) bound
    errors = np.abs(out - expected).sum(0)
    assert bool((errors <= solver.last_error_bound.cpu().numpy() + 1e-14).all())


def test_top_k_rejects_bad_values() -> None:
    edges, weights, reset = _case(7, 1, seed=0)
    solver = PPRSolver(edges_to_csr(edges, weights, 7), dtype=torch.float64)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError):
            solver(torch.from_numpy(reset), top_k=bad)


# -- hippo_gpu/ppr/certificate.py's rules, against their definitions ---------------------------


def test_stall_steps_is_four_halving_periods_and_at_least_eight() -> None:
    """4·⌈ln 2 / ln(1/d)⌉ steps, at least 8: the bound halves at least every ⌈ln 2/ln(1/d)⌉
    steps in exact arithmetic, so 4 such periods without a halving mean round-off."""
    from hippo_gpu.ppr.certificate import stall_steps

    # ln 2 / ln(1/d): 1 (d = 0.5), 4.27 (0.85), 6.58 (0.9), 68.97 (0.99)
    assert [stall_steps(d) for d in (0.0, 0.3, 0.5, 0.85, 0.9, 0.99)] == [8, 8, 8, 20, 28, 276]


def test_check_top_k_takes_positive_ints_or_none() -> None:
    from hippo_gpu.ppr.certificate import check_top_k

    assert [check_top_k(k) for k in (None, 1, 2, 3.0, 300)] == [0, 1, 2, 3, 300]
    for bad in (0, -3, 2.5, 0.0):
        with pytest.raises(ValueError, match=f"top_k must be a positive int or None, got {bad!r}"):
            check_top_k(bad)


def _certified_reference(z: torch.Tensor, rows: list[int] | None, k: int,
                         eps: list[float]) -> list[bool]:
    """topk_certified's definition in plain Python (float64): every consecutive gap among the
    k + 1 largest values of z[rows, q] exceeds eps[q]."""
    out = []
    for q in range(z.shape[1]):
        col = z[:, q].double().tolist()
        top = sorted(col if rows is None else [col[r] for r in rows], reverse=True)[:k + 1]
        out.append(all(a - b > eps[q] for a, b in zip(top, top[1:])))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_topk_certified_is_its_definition(device: str) -> None:
    """Random small columns with many exact ties and gaps exactly equal to eps (half-integer
    values: exact differences), with and without a row subset, every k from 1 past T; and a
    gap that float32 would round up past eps, taken in float64."""
    from hippo_gpu.ppr.certificate import topk_certified

    # 1 + 2⁻²³ − 2⁻²⁶ = 1 + 0.875 ulp: below eps = 1 + 0.9 ulp, rounded to 1 + 1 ulp in float32
    z = torch.tensor([[1.0 + 2.0 ** -23], [2.0 ** -26]], device=device)
    eps = torch.tensor([1.0 + 0.9 * 2.0 ** -23], dtype=torch.float64, device=device)
    got = topk_certified(z, None, 1, eps)
    assert got.device == z.device and got.tolist() == [False]
    got = topk_certified(z[:1], None, 1, eps)  # one row: nothing to separate
    assert got.device == z.device and got.dtype == torch.bool and got.tolist() == [True]
    gen = torch.Generator().manual_seed(3)
    for trial in range(400):
        t, q = 1 + trial % 9, 1 + trial % 5
        z = torch.randint(0, 7, (t + 2, q), generator=gen).float() * 0.5
        eps = [float(e) for e in torch.randint(0, 3, (q,), generator=gen) * 0.5]
        rows = None if trial % 2 else torch.randperm(t + 2, generator=gen)[:t].tolist()
        k = 1 + trial % (t + 2)
        got = topk_certified(z.to(device), None if rows is None else
                             torch.tensor(rows, device=device), k,
                             torch.tensor(eps, dtype=torch.float32, device=device))
        assert got.dtype == torch.bool and got.shape == (q,)
        assert got.tolist() == _certified_reference(z, rows, k, eps), (z, rows, k, eps)


def test_classify_applies_the_bound_the_halving_record_and_the_stall_rule() -> None:
    """classify's rules on hand-made columns (dyadic values: every comparison exact), the
    equalities included: certified when solve + ω ≤ tol; the halving record moves where
    solve ≤ halved / 2; stalled when uncertified and k − halved_at ≥ patience."""
    from hippo_gpu.ppr.certificate import classify

    f64 = functools.partial(torch.tensor, dtype=torch.float64)
    solve = f64([1.0, 0.75, 0.5, 2.0, 0.0])
    halved = f64([2.0, 1.5, 2.0, 3.0, 1.0])
    halved_at = torch.tensor([0, 3, 1, 2, 4])
    refuted = torch.tensor([0, 1, 2, 3, 4])
    g = torch.zeros(3, 5)
    ok, stall, now, halved2, at2, refuted2 = classify(
        10, solve, f64([9.0] * 5), g, g, g, halved, halved_at, refuted, tol=1.0, omega=0.25,
        top_k=0, target_rows=None, patience=8, check=None)
    assert ok.tolist() == [False, True, True, False, True]
    assert stall.tolist() == [False, False, False, True, False]
    assert now.tolist() == [1.25, 1.0, 0.75, 2.25, 0.25]
    assert halved2.tolist() == [1.0, 0.75, 0.5, 3.0, 0.0]
    assert at2.tolist() == [10, 10, 10, 2, 10]
    assert refuted2.tolist() == [0, 1, 2, 3, 4]
    _, stall, *_ = classify(9, solve, f64([9.0] * 5), g, g, g, halved, halved_at, refuted,
                            tol=1.0, omega=0.25, top_k=0, target_rows=None, patience=8,
                            check=None)
    assert stall.tolist() == [False] * 5  # 9 − 2 < 8


def test_classify_certifies_the_top_k_by_its_gaps() -> None:
    """With top_k, a column over tol is certified when its top-k gaps exceed its error (the
    solve bound's err, not the bound with ω), over target_rows only."""
    from hippo_gpu.ppr.certificate import classify

    f64 = functools.partial(torch.tensor, dtype=torch.float64)
    g = torch.tensor([[0.0, 0.0, 9.0, 9.0], [4.0, 4.0, 4.0, 4.0], [3.0, 3.5, 3.9, 3.9],
                      [1.0, 1.0, 1.0, 1.0]])
    rows = torch.tensor([1, 2, 3])
    ok, *_ = classify(1, f64([5.0] * 4), f64([0.5, 0.5, 0.05, 0.2]), g, g, g, f64([1.0] * 4),
                      torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64),
                      tol=1.0, omega=0.0, top_k=1, target_rows=rows, patience=8, check=None)
    # gaps 1.0, 0.5 (= err: not certified), 0.1 and 0.1 (< err 0.2: row 0's gap of 5 is not a
    # target row's, so it does not count)
    assert ok.tolist() == [True, False, True, False]


class _Verdicts:
    """A float64 re-check that returns given verdicts and records what it was asked."""

    def __init__(self, held: list[bool]) -> None:
        self.held, self.calls = torch.tensor(held), []

    def verify(self, base, y, g, ok, now, tol, top_k, target_rows):
        self.calls.append((ok.clone(), now.clone(), tol, top_k, target_rows))
        now += 100.0  # the float64 bounds, written in place
        return self.held.clone()


def test_classify_keeps_only_what_the_float64_check_confirms() -> None:
    """A refuted certificate iterates on, counts a refutation, and stalls once the count
    reaches the patience; the check is not asked when no column is certified."""
    from hippo_gpu.ppr.certificate import classify

    f64 = functools.partial(torch.tensor, dtype=torch.float64)
    g = torch.zeros(2, 5)
    rows = torch.tensor([0, 1])
    check = _Verdicts([True, False, False, False, False])
    # the last column is uncertified with a halving record 8 steps old: stalled by the halving
    # rule, which a refuted certificate elsewhere must not clear
    ok, stall, now, _, _, refuted = classify(
        3, f64([0.5, 0.5, 0.5, 4.0, 4.0]), f64([9.0] * 5), g, g, g, f64([0.1] * 5),
        torch.tensor([3, 3, 3, 3, -5]), torch.tensor([0, 0, 7, 0, 0]), tol=1.0, omega=0.0,
        top_k=2, target_rows=rows, patience=8, check=check)  # type: ignore[arg-type]
    assert len(check.calls) == 1
    asked, now_then, tol, top_k, target = check.calls[0]
    assert asked.tolist() == [True, True, True, False, False]
    assert now_then.tolist() == [0.5] * 3 + [4, 4]
    assert (tol, top_k, target) == (1.0, 2, rows)
    assert ok.tolist() == [True, False, False, False, False]
    assert refuted.tolist() == [0, 1, 8, 0, 0]
    assert stall.tolist() == [False, False, True, False, True]
    assert now.tolist() == [100.5] * 3 + [104.0] * 2
    check = _Verdicts([True] * 4)
    classify(3, f64([4.0] * 4), f64([9.0] * 4), g, g, g, f64([9.0] * 4), torch.zeros(4),
             torch.zeros(4), tol=1.0, omega=0.0, top_k=0, target_rows=None, patience=8,
             check=check)  # type: ignore[arg-type]
    assert check.calls == []


def test_float64_check_is_its_formula() -> None:
    """Float64Check against its docstring's bound, recomputed here in float64: slack
    (deg_max + 4)·2⁻⁵²/(1 − d) + 2⁻²³; for the asked columns err = (‖g − g₆₄‖₁ + d/(1 − d)
    ‖g₆₄ − y‖₁ + slack)·grow, the bound 2·err/Σg·grow + ω (∞ for a column of no mass), held
    when ≤ tol or (top_k) when the top-k gaps exceed err; other columns untouched."""
    from hippo_gpu.ppr.certificate import Float64Check

    gen = torch.Generator().manual_seed(9)
    n, q, d, omega, grow = 6, 5, 0.5, 0.01, 1.5
    dense = torch.rand(n, n, generator=gen, dtype=torch.float64)
    dense[dense < 0.5] = 0.0
    dense[2] = torch.tensor([0.2, 0.3, 0.1, 0.0, 0.4, 0.5], dtype=torch.float64)  # 5 entries
    dense[4] = 0.0
    matrix = dense.to_sparse_csr()
    deg_max = int((dense != 0).sum(dim=1).max())
    check = Float64Check(matrix, d, omega, grow)
    assert check.slack == (deg_max + 4) * 2.0 ** -52 / (1 - d) + 2.0 ** -23
    assert Float64Check(torch.zeros(0, 0, dtype=torch.float64).to_sparse_csr(), d, omega,
                        grow).slack == 4 * 2.0 ** -52 / (1 - d) + 2.0 ** -23

    base = (torch.rand(n, q, generator=gen) * 0.1).float()
    y = torch.rand(n, q, generator=gen).float()
    g = (base.double() + d * dense @ y.double()).float() + 1e-3 * torch.rand(n, q, generator=gen)
    g[:, 3] = 0.0  # no mass
    ok = torch.tensor([True, True, False, True, True])
    g64 = base.double() + d * dense @ y.double()
    err = ((g.double() - g64).abs().sum(0) + d / (1 - d) * (g64 - y.double()).abs().sum(0)
           + check.slack) * grow
    mass = g.double().sum(0)
    want = torch.where(mass > 0, 2.0 * err / mass * grow, torch.inf) + omega
    now = torch.full((q,), -1.0, dtype=torch.float64)
    assert not check.verify(base, y, g, ok, now, 0.0, 0, None).any()
    torch.testing.assert_close(now[ok], want[ok], rtol=1e-12, atol=0)
    assert now[2] == -1.0 and now[3] == torch.inf
    tol = float(now[[0, 1, 4]].sort().values[1])  # the middle one held at equality
    held = check.verify(base, y, g, ok, now, tol, 0, None)
    assert held.dtype == torch.bool
    assert held.tolist() == [bool(b) for b in (ok & (now <= tol)).tolist()]
    assert held.tolist().count(True) == 2
    # top_k: held also where the top-k gaps of g exceed err, over target_rows: near a fixed
    # point (err ~ 1e-6), rows 0 and 2 of M equal, so g's rows 0 and 2 differ by base's
    dense[2] = dense[0]
    matrix = dense.to_sparse_csr()
    check = Float64Check(matrix, d, omega, grow)
    base64 = torch.rand(n, q, generator=gen, dtype=torch.float64) * 0.1
    base64[2] = base64[0] + 0.02
    base64[2, 1] = base64[0, 1]  # a tie in column 1
    base64[3] = 5.0  # the largest, outside target_rows
    base = base64.float()
    y = torch.linalg.solve(torch.eye(n, dtype=torch.float64) - d * dense, base.double()).float()
    g = (base.double() + d * dense @ y.double()).float()
    g64 = base.double() + d * dense @ y.double()
    err = ((g.double() - g64).abs().sum(0) + d / (1 - d) * (g64 - y.double()).abs().sum(0)
           + check.slack) * grow
    rows = torch.tensor([0, 2, 5])
    gaps_ok = []
    for j in range(q):
        top = sorted(g[rows, j].double().tolist(), reverse=True)[:3]
        gaps_ok.append(all(a - b > float(err[j]) for a, b in zip(top, top[1:])))
    now = torch.zeros(q, dtype=torch.float64)
    held = check.verify(base, y, g, ok, now, 0.0, 2, rows)
    assert held.tolist() == [bool(o) and c for o, c in zip(ok.tolist(), gaps_ok)]
    assert gaps_ok[0] and not gaps_ok[1]  # both outcomes among the asked columns
    tol = float(now[1])  # column 1 (tied) held by its bound: the top-k test adds, never removes
    held = check.verify(base, y, g, ok, now, tol, 2, rows)
    assert held[1]
    assert held.tolist() == [bool(o) and (c or b <= tol) for o, c, b in
                             zip(ok.tolist(), gaps_ok, now.tolist())]
