"""PPR by linearity (issue 22): the passage basis, the certified push and their sum, against the
float64 dense oracle and igraph prpack (tests/reference.py, which imports nothing of ours).

The graphs are tests/reference.py's awkward random multigraphs (dangling nodes, weights over six
decades, disconnected parts) with the last third of the nodes as "passages" carrying random unit
embeddings, and a HippoRAG-2-shaped synthetic graph.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks"),
    pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                       reason="the push kernel needs numba (extra 'kernels')"),
]

from hippo_gpu.ppr import linear as linear_mod  # noqa: E402
from hippo_gpu.ppr.basis import passage_mass, solve_basis  # noqa: E402
from hippo_gpu.ppr.linear import LinearPPR  # noqa: E402
from hippo_gpu.ppr.push import PushOperator  # noqa: E402
from tests.reference import dense_adjacency, dense_ppr, igraph_ppr, random_graph  # noqa: E402

D = 0.5


def _operator(a: np.ndarray) -> np.ndarray:
    """L = (1 − d)(I − d A D⁻¹)⁻¹ densely (dangling columns of M are zero)."""
    deg = a.sum(axis=0)
    m = np.divide(a, deg[None, :], out=np.zeros_like(a), where=deg[None, :] > 0)
    return (1 - D) * np.linalg.inv(np.eye(a.shape[0]) - D * m)


@pytest.fixture(scope="module")
def graph():
    rng = np.random.default_rng(7)
    n = 240
    edges, weights = random_graph(n, rng, avg_degree=5.0)
    a = dense_adjacency(edges, weights, n)
    passages = torch.arange(160, n)
    emb = torch.from_numpy(rng.normal(size=(80, 8)))
    emb = emb / emb.norm(dim=1, keepdim=True)
    adj = torch.from_numpy(a).to_sparse_csr()
    return {"a": a, "adj": adj, "edges": edges, "weights": weights, "passages": passages,
            "emb": emb.float(), "L": _operator(a), "rng": rng}


def _seeds(rng: np.random.Generator, q: int, phrases: int, k: int = 4):
    sq = np.repeat(np.arange(q), k)
    sp = np.concatenate([rng.choice(phrases, k, replace=False) for _ in range(q)])
    sw = rng.uniform(0.05, 1.0, q * k)
    return torch.from_numpy(sq), torch.from_numpy(sp), torch.from_numpy(sw)


def test_basis_columns_within_their_bounds(graph) -> None:
    basis = solve_basis(graph["adj"], graph["passages"], graph["emb"], damping=D, tol=1e-9)
    t = graph["passages"].numpy()
    lt = graph["L"][np.ix_(t, t)]
    z_ref = lt @ graph["emb"].double().numpy()
    z1_ref = lt @ np.ones(t.size)
    err = np.abs(basis.z.numpy() - z_ref).sum(axis=0)
    assert np.all(err <= basis.col_bound.numpy()), (err, basis.col_bound)
    assert np.abs(basis.z1.numpy() - z1_ref).sum() <= basis.z1_bound
    assert float(basis.col_bound.max()) < 1e-6  # the bound is tight enough to be useful
    h_ref = graph["L"][t].sum(axis=0)  # h = Lᵀ 1_T
    h = basis.h.numpy()
    assert np.all(h >= h_ref - 1e-15) and np.all(h - h_ref <= 1e-10)
    torch.testing.assert_close(passage_mass(graph["adj"], graph["passages"], damping=D)[0],
                               basis.h, rtol=0, atol=0)


@pytest.mark.parametrize("budget", [1e-2, 1e-5, 1e-9])
def test_push_bound_is_the_passage_error_and_meets_its_budget(graph, budget: float) -> None:
    rng = np.random.default_rng(1)
    h = torch.from_numpy(graph["L"][graph["passages"].numpy()].sum(axis=0) + 1e-12)
    op = PushOperator(graph["adj"], graph["passages"], h, damping=D, threads=1)
    sq, sp, sw = _seeds(rng, 6, 160)
    out = op.push(sq, sp, sw, 6, torch.full((6,), budget), work_cap=10**9)
    assert not bool(out.capped.any())
    t = graph["passages"].numpy()
    for q in range(6):
        s = np.zeros(graph["a"].shape[0])
        np.add.at(s, sp[sq == q].numpy(), sw[sq == q].numpy())
        y_t = (graph["L"] @ s)[t]
        p_t = out.scores[q].numpy()
        assert np.all(p_t <= y_t + 1e-12)  # (P1): p never overshoots, L ≥ 0 and ρ ≥ 0
        err = np.abs(y_t - p_t).sum()
        assert err <= float(out.bound[q]) <= budget
        # (P2) is an equality, up to the h offset and the float64 round-off slack
        assert float(out.bound[q]) <= err * (1 + 1e-6) + 1e-10


def test_push_against_igraph(graph) -> None:
    rng = np.random.default_rng(2)
    n = graph["a"].shape[0]
    h = torch.from_numpy(graph["L"][graph["passages"].numpy()].sum(axis=0) + 1e-12)
    op = PushOperator(graph["adj"], graph["passages"], h, damping=D, threads=1)
    sq, sp, sw = _seeds(rng, 3, 160)
    out = op.push(sq, sp, sw, 3, torch.full((3,), 1e-10), work_cap=10**9)
    reset = np.zeros((n, 3))
    np.add.at(reset, (sp.numpy(), sq.numpy()), sw.numpy())
    x_ig = igraph_ppr(graph["edges"], graph["weights"], n, reset, damping=D)
    dangling = graph["a"].sum(axis=1) <= 0
    for q in range(3):
        sigma = float(((1 - D * dangling) * reset[:, q]).sum())  # cᵀs, exact
        x_push = out.scores[q].numpy() / sigma
        err = np.abs(x_push - x_ig[graph["passages"].numpy(), q]).sum()
        assert err <= float(out.bound[q]) / sigma + 1e-9, err


def test_push_is_bit_identical_across_batches_and_threads(graph) -> None:
    rng = np.random.default_rng(3)
    h = torch.from_numpy(graph["L"][graph["passages"].numpy()].sum(axis=0) + 1e-12)
    sq, sp, sw = _seeds(rng, 9, 160)
    budget = torch.full((9,), 1e-6)
    one = PushOperator(graph["adj"], graph["passages"], h, damping=D, threads=1)
    two = PushOperator(graph["adj"], graph["passages"], h, damping=D, threads=2)
    a = one.push(sq, sp, sw, 9, budget, work_cap=10**9)
    b = two.push(sq, sp, sw, 9, budget, work_cap=10**9)
    assert torch.equal(a.scores, b.scores) and torch.equal(a.bound, b.bound)
    keep = sq >= 5  # queries 5..8 alone, renumbered
    c = one.push(sq[keep] - 5, sp[keep], sw[keep], 4, budget[:4], work_cap=10**9)
    assert torch.equal(c.scores, a.scores[5:]) and torch.equal(c.work, a.work[5:])
    again = one.push(sq, sp, sw, 9, budget, work_cap=10**9)  # the workspace was left clean
    assert torch.equal(again.scores, a.scores)


def test_push_visits_count_every_push_and_change_nothing(graph) -> None:
    """The diagnostics of bench_hipporag2_floor: visits[position[u]] counts u's pushes over all
    queries (their sum is the pushes reported, on a two-thread operator too, which then runs
    on one), and the scores are the same bits as without them."""
    rng = np.random.default_rng(5)
    h = torch.from_numpy(graph["L"][graph["passages"].numpy()].sum(axis=0) + 1e-12)
    sq, sp, sw = _seeds(rng, 6, 160)
    budget = torch.full((6,), 1e-6)
    op = PushOperator(graph["adj"], graph["passages"], h, damping=D, threads=2)
    plain = op.push(sq, sp, sw, 6, budget, work_cap=10**9)
    visits = np.zeros(op.num_nodes, dtype=np.int64)
    counted = op.push(sq, sp, sw, 6, budget, work_cap=10**9, visits=visits)
    assert torch.equal(counted.scores, plain.scores) and torch.equal(counted.work, plain.work)
    assert int(visits.sum()) == int(plain.pushes.sum()) > 0
    deg = np.diff(op.indptr)
    assert int((visits * deg).sum()) == int(plain.work.sum())  # each push scans its edges
    with pytest.raises(ValueError, match="visits must be an int64 array"):
        op.push(sq, sp, sw, 6, budget, work_cap=10**9, visits=np.zeros(3, dtype=np.int64))


def test_push_gives_up_at_the_work_cap(graph) -> None:
    rng = np.random.default_rng(4)
    h = torch.from_numpy(graph["L"][graph["passages"].numpy()].sum(axis=0) + 1e-12)
    op = PushOperator(graph["adj"], graph["passages"], h, damping=D, threads=1)
    sq, sp, sw = _seeds(rng, 2, 160)
    out = op.push(sq, sp, sw, 2, torch.full((2,), 1e-12), work_cap=5)
    assert bool(out.capped.all()) and bool((out.bound > 1e-12).all())
    with pytest.raises(ValueError, match="sorted by query"):
        op.push(sq.flip(0), sp, sw, 2, torch.ones(2), work_cap=5)


def _linear_case(graph, tol: float, dtype: torch.dtype, monkeypatch, *, cap=10**9,
                 reduction=float("inf")):
    monkeypatch.setattr(linear_mod, "MAX_REDUCTION", reduction)
    rng = np.random.default_rng(5)
    basis = solve_basis(graph["adj"], graph["passages"], graph["emb"], damping=D)
    lin = LinearPPR(graph["adj"], graph["passages"], graph["emb"], basis)
    lin.work_cap = cap  # the default, half the edges, is a few hundred on this tiny graph
    q = 5
    sq, sp, sw = _seeds(rng, q, 160)
    e = torch.from_numpy(rng.normal(size=(q, 8)))
    e = (e / e.norm(dim=1, keepdim=True)).float()
    cos = (e @ graph["emb"].T).float()
    n = graph["a"].shape[0]
    t = graph["passages"].numpy()
    reset = np.zeros((n, q))
    np.add.at(reset, (sp.numpy(), sq.numpy()), sw.numpy())
    lo, hi = cos.double().amin(1), cos.double().amax(1)
    exact_cos = e.double() @ graph["emb"].double().T  # the exact target of eq. (L1)
    reset[t] += 0.05 * ((exact_cos - lo[:, None]) / (hi - lo)[:, None]).T.numpy()
    ref = dense_ppr(graph["a"], reset, damping=D)[t]  # [P, Q]
    return lin, (sq, sp, sw, e, cos), ref


@pytest.mark.parametrize("tol,dtype", [(1e-6, torch.float32), (1e-7, torch.float32),
                                       (1e-9, torch.float64), (5e-9, torch.float64)])
def test_linear_solve_meets_tol_against_float64_oracle(graph, monkeypatch, tol, dtype) -> None:
    lin, (sq, sp, sw, e, cos), ref = _linear_case(graph, tol, dtype, monkeypatch)

    def no_fallback(cols):
        raise AssertionError(f"iterated {cols.tolist()}")

    out = lin.solve(sq, sp, sw, e, cos, 0.05, tol, no_fallback, dtype=dtype)
    assert bool(out.pushed.all()) and bool(out.solution.certified.all())
    err = (out.solution.scores.double() - torch.from_numpy(ref)).abs().sum(dim=0)
    assert bool((err <= out.solution.bound).all()), (err, out.solution.bound)
    assert bool((out.solution.bound <= tol).all())
    assert out.solution.scores.dtype == dtype


def test_linear_refuses_a_tol_below_the_rounding_of_its_result(graph, monkeypatch) -> None:
    """A float32 result cannot be certified to 5e-9 (its own rounding is 2⁻²⁴ in L1): refused
    before the basis GEMM or any push, naming the smallest tol; float64 certifies it."""
    from hippo_gpu.ppr import ToleranceError

    lin, args, _ = _linear_case(graph, 5e-9, torch.float32, monkeypatch)

    def no_push(*a, **k):
        raise AssertionError("a refused tol must not push")

    monkeypatch.setattr(lin.push_op, "push", no_push)
    with pytest.raises(ToleranceError, match="float32 result.*5.96e-08"):
        lin.solve(*args, 0.05, 5e-9, pytest.fail, dtype=torch.float32)


def test_linear_hands_capped_and_skipped_queries_to_the_iteration(graph, monkeypatch) -> None:
    lin, args, _ = _linear_case(graph, 1e-6, torch.float32, monkeypatch, cap=1)
    asked = []

    def iterate(cols):
        asked.append(cols.tolist())
        from hippo_gpu.ppr import PPRSolution
        c = cols.numel()
        return PPRSolution(torch.full((80, c), 7.0), torch.full((c,), 3), torch.zeros(c),
                           torch.ones(c, dtype=torch.bool), torch.zeros(c, dtype=torch.bool),
                           1e-6)

    out = lin.solve(*args, 0.05, 1e-6, iterate)
    assert asked == [[0, 1, 2, 3, 4]] and not bool(out.pushed.any())
    assert bool((out.solution.scores == 7.0).all()) and bool((out.solution.steps == 3).all())
    lin, args, _ = _linear_case(graph, 1e-6, torch.float32, monkeypatch, reduction=0.0)
    asked.clear()
    out = lin.solve(*args, 0.05, 1e-6, iterate)
    assert asked == [[0, 1, 2, 3, 4]] and int(out.push.work.sum()) == 0  # skipped: no push


def test_linear_on_a_hipporag2_shaped_graph(monkeypatch) -> None:
    """A synthetic HippoRAG 2 graph at the default tol, every query pushed (at 3k passages
    the default rules would iterate most of them): certified, and top-10 equal to a float64
    iteration at tol 1e-13 for each query."""
    monkeypatch.setattr(linear_mod, "MAX_REDUCTION", float("inf"))
    from hippo_gpu.synthetic import synthetic_graph

    g = synthetic_graph(3000, seed=1)
    rng = np.random.default_rng(0)
    p = g.num_passages
    emb = torch.from_numpy(rng.normal(size=(p, 16)))
    emb = (emb / emb.norm(dim=1, keepdim=True)).float()
    basis = solve_basis(g.adjacency, g.passage_nodes, emb, damping=D)
    lin = LinearPPR(g.adjacency, g.passage_nodes, emb, basis)
    lin.work_cap = 10**9
    q = 16
    sq, sp, sw = _seeds(rng, q, g.num_phrases, k=5)
    sw = sw / torch.from_numpy(np.maximum(g.phrase_passage_count[sp.numpy()], 1))
    e = torch.from_numpy(rng.normal(size=(q, 16)))
    e = (e / e.norm(dim=1, keepdim=True)).float()
    cos = (e @ emb.T).float()
    out = lin.solve(sq, sp, sw, e, cos, 0.05, 1e-6,
                    lambda cols: pytest.fail(f"iterated {cols.tolist()}"))
    assert bool(out.pushed.all()) and bool((out.solution.bound <= 1e-6).all())
    reset = torch.zeros(g.num_nodes, q, dtype=torch.float64)
    reset.index_put_((sp, sq), sw, accumulate=True)
    lo, hi = cos.double().amin(1), cos.double().amax(1)
    exact_cos = e.double() @ emb.double().T
    reset[g.passage_nodes] += 0.05 * ((exact_cos - lo[:, None]) / (hi - lo)[:, None]).T
    # float64 fixed-point iteration of y = (1 − d) r + d M y in scipy, 80 steps (error
    # ≤ d⁸⁰/(1 − d)·‖r‖₁ in L1), x = y / cᵀr (the min-max of the exact cosines can dip ~1e-8
    # below 0, which the solvers' seed check refuses; a direct solve fills in on this graph)
    import scipy.sparse as sp_

    a = g.adjacency.to_sparse_coo().coalesce()
    i, j = a.indices().numpy()
    n = g.num_nodes
    adj = sp_.csc_matrix((a.values().double().numpy(), (i, j)), shape=(n, n))
    deg = np.asarray(adj.sum(axis=0)).ravel()
    m = adj @ sp_.diags(np.divide(1.0, deg, out=np.zeros_like(deg), where=deg > 0))
    base = (1 - D) * reset.numpy()
    y = base.copy()
    for _ in range(80):
        y = base + D * (m @ y)
    c = 1 - D * (deg <= 0)
    ref = torch.from_numpy(y / (c @ reset.numpy()))[g.passage_nodes]
    err = (out.solution.scores.double() - ref).abs().sum(dim=0)
    assert bool((err <= out.solution.bound).all())
    top = out.solution.scores.T.topk(10).indices
    assert bool((top == ref.T.topk(10).indices).all())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_linear_with_the_basis_on_cuda_matches_the_cpu(graph, monkeypatch) -> None:
    # the GEMMs of the dense half run on the device, the push on host threads (push.py)
    lin, (sq, sp, sw, e, cos), _ = _linear_case(graph, 1e-6, torch.float32, monkeypatch)
    gpu = LinearPPR(graph["adj"], graph["passages"], graph["emb"], lin.basis.to("cuda"))
    gpu.work_cap = lin.work_cap
    cpu_out = lin.solve(sq, sp, sw, e, cos, 0.05, 1e-6, pytest.fail)
    gpu_out = gpu.solve(sq, sp, sw, e.cuda(), cos.cuda(), 0.05, 1e-6, pytest.fail)
    torch.testing.assert_close(gpu_out.solution.scores.cpu(), cpu_out.solution.scores,
                               rtol=0, atol=1e-7)
    assert bool((gpu_out.solution.bound <= 1e-6).all())


def _power_reference(adjacency: torch.Tensor, reset: torch.Tensor, steps: int = 80):
    """y with y = (1 − d) r + d M y by `steps` float64 fixed-point steps (error ≤ d^steps/(1 − d)
    ·‖r‖₁ in L1: ~1e-24 of ‖r‖₁ at 80), and c = 1 − d·[dangling]: x = y / cᵀr."""
    a = adjacency.to_sparse_coo().coalesce()
    i, j = a.indices()
    vals = a.values().double()
    n = adjacency.shape[0]
    deg = torch.zeros(n, dtype=torch.float64).index_add_(0, j, vals)
    inv = torch.where(deg > 0, 1.0 / deg, torch.zeros_like(deg))
    m = torch.sparse_coo_tensor(a.indices(), vals * inv[j], (n, n)).coalesce().to_sparse_csr()
    base = (1 - D) * reset
    y = base.clone()
    for _ in range(steps):
        y = torch.addmm(base, m, y, beta=1.0, alpha=D)
    c = 1 - D * (deg <= 0).double()
    return y, c


@pytest.mark.slow
def test_linear_and_solver_bounds_hold_on_the_100k_synthetic_graph(monkeypatch) -> None:
    """At the 100k scale (600k nodes, 5.8M edges, hubs of degree 8k): every query pushed by
    linearity, and the iteration's float32 and float64 solves, each within its reported bound
    of a float64 reference at the default tol and at 1e-7 (near float32's floor); 5e-9 in
    float32 refused, in float64 certified."""
    monkeypatch.setattr(linear_mod, "MAX_REDUCTION", float("inf"))
    from hippo_gpu.ppr import PPRSolver, ToleranceError
    from hippo_gpu.synthetic import synthetic_graph

    g = synthetic_graph(100_000, seed=1)
    rng = np.random.default_rng(0)
    p, q, dim = g.num_passages, 8, 16
    emb = torch.from_numpy(rng.normal(size=(p, dim)))
    emb = (emb / emb.norm(dim=1, keepdim=True)).float()
    basis = solve_basis(g.adjacency, g.passage_nodes, emb, damping=D)
    lin = LinearPPR(g.adjacency, g.passage_nodes, emb, basis)
    lin.work_cap = 10**10
    sq, sp, sw = _seeds(rng, q, g.num_phrases, k=5)
    sw = sw / torch.from_numpy(np.maximum(g.phrase_passage_count[sp.numpy()], 1))
    e = torch.from_numpy(rng.normal(size=(q, dim)))
    e = (e / e.norm(dim=1, keepdim=True)).float()
    cos = (e @ emb.T).float()
    lo, hi = cos.double().amin(1), cos.double().amax(1)
    pn = g.passage_nodes

    # by linearity: its exact target takes E_P e in exact arithmetic (ppr/basis.py)
    reset = torch.zeros(g.num_nodes, q, dtype=torch.float64)
    reset.index_put_((sp, sq), sw, accumulate=True)
    reset[pn] += 0.05 * ((e.double() @ emb.double().T - lo[:, None]) / (hi - lo)[:, None]).T
    y, c = _power_reference(g.adjacency, reset)
    ref = (y / (c @ reset))[pn]
    for tol, dtype in ((1e-6, torch.float32), (1e-7, torch.float32), (5e-9, torch.float64)):
        out = lin.solve(sq, sp, sw, e, cos, 0.05, tol,
                        lambda cols: pytest.fail(f"iterated {cols.tolist()}"), dtype=dtype)
        err = (out.solution.scores.double() - ref).abs().sum(dim=0)
        assert bool(out.pushed.all()) and bool((out.solution.bound <= tol).all())
        assert bool((err <= out.solution.bound).all()), (tol, err, out.solution.bound)

    # the iteration, on the float32 reset vectors its solver computes with
    reset = torch.zeros(g.num_nodes, q, dtype=torch.float64)
    reset.index_put_((sp, sq), sw, accumulate=True)
    reset[pn] += 0.05 * ((cos.double() - lo[:, None]) / (hi - lo)[:, None]).T
    reset = reset.float().double()
    y, _ = _power_reference(g.adjacency, reset)
    ref = (y / y.sum(dim=0))[pn]
    for tol, dtype in ((1e-6, torch.float32), (1e-7, torch.float32), (5e-9, torch.float32),
                       (5e-9, torch.float64)):
        if dtype == torch.float32 and tol < 1e-8:
            with pytest.raises(ToleranceError):
                PPRSolver(g.adjacency, target_nodes=pn, dtype=dtype, tol=tol)
            continue
        solver = PPRSolver(g.adjacency, target_nodes=pn, dtype=dtype, tol=tol)
        solution = solver.solve(reset)
        err = (solution.scores.double() - ref).abs().sum(dim=0)
        assert bool(solution.certified.all())
        assert bool((err <= solution.bound).all()), (tol, dtype, err, solution.bound)
