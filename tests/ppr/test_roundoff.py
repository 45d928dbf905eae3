"""No query fails on round-off (issue 20), and no certificate is false (issue 47): float32
columns that stall at their round-off floor stop early and are finished in float64 with a real
certificate; every bound covers the vector returned, its rounding included (ppr/rounding.py,
R1), so it holds against a float64 reference with no slack added here; a tol at or below that
rounding is refused before any step; only true non-convergence (max_iter while the bound still
falls) fails, and then only the affected queries.

The float32 floor is reproduced without outside data by asking for a tol near it: on the hub
graph below the power iteration stalls at ~2e-8..6e-8, on musique_train's phrase graph at up to
~1.8e-7 and on its passage graph at ~1.8e-8 (measured, 1 thread); a float32 result leaves the
iterate tol − 2⁻²⁴ of its tol. The reference is a float64 sparse direct solve of eq. (2) of
ppr.py (scipy), independent of every iteration here, of the same reset vectors the solver gets
(float32-representable seeds: a float32 solver certifies the PPR of the seeds it computes with).
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.ppr import (
    ConvergenceError,
    PPRSolver,
    ToleranceError,
    build_transition,
    ppr_solve,
    stall_steps,
)
from hippo_gpu.ppr.rounding import certifiable_floor, output_rounding
from hippo_gpu.retrieval.results import QueryFailure

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")

KERNELS = [
    "torch",
    pytest.param("numba", marks=pytest.mark.skipif(
        importlib.util.find_spec("numba") is None, reason="numba runs the CPU kernel")),
]
TOLS = (1e-6, 1e-7, 5e-9)  # the default, near float32's floor, below it (refused in float32)


def _hub_graph(n: int = 20_000, hubs: int = 2, span: float = 6.0, seed: int = 1) -> sp.csr_matrix:
    """A few hubs joined to every other node, plus a path; weights over 2·span decades."""
    rng = np.random.default_rng(seed)
    leaf = np.arange(hubs, n)
    src = np.concatenate([rng.integers(0, hubs, leaf.size), leaf[:-1]])
    dst = np.concatenate([leaf, leaf[1:]])
    w = 10.0 ** rng.uniform(-span, span, src.size)
    a = sp.coo_matrix((np.concatenate([w, w]), (np.concatenate([src, dst]),
                                                np.concatenate([dst, src]))), shape=(n, n))
    return a.tocsr()


def _torch_csr(a: sp.csr_matrix) -> torch.Tensor:
    a = a.tocsr()
    a.sum_duplicates()
    return torch.sparse_csr_tensor(torch.from_numpy(a.indptr.astype(np.int64)),
                                   torch.from_numpy(a.indices.astype(np.int64)),
                                   torch.from_numpy(a.data.astype(np.float64)), a.shape)


def _direct(a: sp.csr_matrix, seeds: np.ndarray, damping: float = 0.5) -> np.ndarray:
    """x = y / 1ᵀy with (I − dM) y = (1 − d) r̂, M = A D⁻¹: a float64 sparse LU solve."""
    degree = np.asarray(a.sum(axis=0)).ravel()
    inv = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
    m = a @ sp.diags(inv)
    r_hat = seeds / seeds.sum(axis=0, keepdims=True)
    y = spla.splu((sp.identity(a.shape[0]) - damping * m).tocsc()).solve((1 - damping) * r_hat)
    return y / y.sum(axis=0, keepdims=True)


def _seeds(n: int, q: int, seed: int = 2) -> np.ndarray:
    """Five weighted seeds per column, float32-representable (the float32 solver's input)."""
    rng = np.random.default_rng(seed)
    seeds = np.zeros((n, q))
    for c in range(q):
        seeds[rng.integers(0, n, 5), c] = rng.random(5) + 0.1
    return seeds.astype(np.float32).astype(np.float64)


def _errors(scores: torch.Tensor, expected: np.ndarray) -> np.ndarray:
    """True L1 error per column against the float64 reference."""
    return np.abs(scores.double().cpu().numpy() - expected).sum(axis=0)


@pytest.fixture(scope="module")
def hub_case() -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    a = _hub_graph()
    seeds = _seeds(a.shape[0], 6)
    return a, seeds, _direct(a, seeds)


def test_a_stalled_float32_column_stops_at_its_floor_not_at_max_iter(hub_case) -> None:
    a, seeds, _ = hub_case
    transition = build_transition(_torch_csr(a), dtype=torch.float32)
    tol = 6e-8  # leaves the iterate 4e-10 beside the output's 2⁻²⁴: below float32's floor
    result = ppr_solve(transition, torch.from_numpy(seeds).float(), method="power", tol=tol,
                       max_iter=1000)
    assert bool(result.stalled.any()) and not result.converged
    # in exact arithmetic the bound halves every step at d = 0.5: a stall is caught within
    # stall_steps of the floor, hundreds of steps before max_iter
    assert int(result.iterations.max()) < 100 + stall_steps(0.5)
    assert bool((result.error_bound[result.stalled] > tol).all())


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("method", ["power", "chebyshev"])
@pytest.mark.parametrize("tol", [1e-6, 1e-7])
def test_stalled_columns_are_certified_in_float64(hub_case, kernel: str, method: str,
                                                  tol: float) -> None:
    """At 1e-6 the float64 check refutes some hub-graph columns until they stall and are
    finished in float64; 1e-7 is below what any float32 certificate can reach (r̂'s rounding,
    2⁻²³, plus the output's 2⁻²⁴: solver.py), so every column is solved in float64 at once."""
    a, seeds, expected = hub_case
    solver = PPRSolver(_torch_csr(a), dtype=torch.float32, method=method, kernel=kernel, tol=tol)
    solution = solver.solve(torch.from_numpy(seeds))
    assert bool(solution.certified.all()) and bool((solution.bound <= tol).all())
    assert bool(solution.refined.any())
    assert solution.scores.dtype == torch.float32 and solution.bound.dtype == torch.float64
    # the bounds hold as reported: the float32 output rounding is in them
    err = _errors(solution.scores, expected)
    assert bool((err <= solution.bound.numpy()).all()), (err, solution.bound)
    # a refined column reports its float64 bound plus the cast to float32 (solver.py)
    assert bool((solution.bound[solution.refined] >= output_rounding(torch.float32, a.shape[0]))
                .all())
    if tol == 1e-7:
        assert bool(solution.refined.all())
    else:
        assert not bool(solution.refined.all())  # the others passed in float32
    # __call__ agrees and does not raise
    torch.testing.assert_close(solver(torch.from_numpy(seeds)), solution.scores)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", ["power", "chebyshev"])
def test_stalled_columns_are_certified_in_float64_on_cuda(hub_case, method: str) -> None:
    a, seeds, expected = hub_case
    tol = 1e-7
    solver = PPRSolver(_torch_csr(a), dtype=torch.float32, method=method, kernel="torch",
                       device="cuda", tol=tol)
    solution = solver.solve(torch.from_numpy(seeds).cuda())
    assert bool(solution.certified.all()) and bool((solution.bound <= tol).all())
    assert bool(solution.refined.any()) and solution.scores.is_cuda
    err = _errors(solution.scores, expected)
    assert bool((err <= solution.bound.cpu().numpy()).all()), err


@pytest.mark.parametrize("kernel", KERNELS)
def test_default_tol_certificates_hold_against_the_direct_solve(hub_case, kernel: str) -> None:
    a, seeds, expected = hub_case
    solver = PPRSolver(_torch_csr(a), dtype=torch.float32, kernel=kernel)  # default tol 1e-6
    solution = solver.solve(torch.from_numpy(seeds))
    assert bool(solution.certified.all())
    err = _errors(solution.scores, expected)
    assert bool((err <= solution.bound.numpy()).all()), err


@pytest.mark.parametrize("kernel", KERNELS)
def test_real_non_convergence_names_its_columns(hub_case, kernel: str) -> None:
    a, seeds, _ = hub_case
    solver = PPRSolver(_torch_csr(a), dtype=torch.float32, kernel=kernel, max_iter=3)
    solution = solver.solve(torch.from_numpy(seeds))  # never raises
    assert not bool(solution.certified.any()) and not bool(solution.refined.any())
    assert sorted(solution.failures()) == list(range(seeds.shape[1]))
    with pytest.raises(ConvergenceError, match="did not converge") as caught:
        solver(torch.from_numpy(seeds))
    assert caught.value.columns == list(range(seeds.shape[1]))
    assert all(b > solver.tol for b in caught.value.bounds)


@pytest.fixture(scope="module")
def small_hub() -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    a = _hub_graph(n=4_000, seed=5)
    seeds = _seeds(a.shape[0], 5, seed=6)
    return a, seeds, _direct(a, seeds)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_bound_is_below_its_error_at_any_tol(small_hub, kernel: str,
                                                dtype: torch.dtype) -> None:
    """benchmarks/bench_roundoff.py's property on a small graph: at the default tol, near
    float32's floor and below it, every column's true L1 error (float64 oracle) is within its
    bound (error_over_bound 0), or the tol is refused before any step."""
    a, seeds, expected = small_hub
    n = a.shape[0]
    for tol in TOLS:
        if tol <= certifiable_floor(dtype, n):
            with pytest.raises(ToleranceError):
                PPRSolver(_torch_csr(a), dtype=dtype, kernel=kernel, tol=tol)
            continue
        for method in ("chebyshev", "power"):
            solver = PPRSolver(_torch_csr(a), dtype=dtype, kernel=kernel, method=method, tol=tol)
            solution = solver.solve(torch.from_numpy(seeds))
            assert bool(solution.certified.all()) and bool((solution.bound <= tol).all())
            err = _errors(solution.scores, expected)
            over = int((err > solution.bound.numpy()).sum())
            assert over == 0, (tol, method, err, solution.bound)
    # the same through the top-k exit: the bound is still the returned vector's
    solver = PPRSolver(_torch_csr(a), dtype=dtype, kernel=kernel, tol=1e-7)
    solution = solver.solve(torch.from_numpy(seeds), top_k=5)
    assert bool((_errors(solution.scores, expected) <= solution.bound.numpy()).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_closed_form_bound_holds_or_is_refused(small_hub, dtype: torch.dtype) -> None:
    """The closed form reports its certificate (ppr/closed_form.py, C2) instead of 0, within it
    at each tol, certified where it meets the tol; a tol below its floor is refused."""
    a, seeds, expected = small_hub
    targets = torch.arange(0, a.shape[0], 7)
    solver = PPRSolver(_torch_csr(a), dtype=dtype, method="closed_form", target_nodes=targets)
    assert solver._closed is not None
    for tol in TOLS:
        if tol <= solver._closed.floor():
            with pytest.raises(ToleranceError):
                solver.solve(torch.from_numpy(seeds), tol=tol)
            continue
        solution = solver.solve(torch.from_numpy(seeds), tol=tol)
        err = _errors(solution.scores, expected[targets.numpy()])
        assert bool((solution.bound > 0).all()) and bool((err <= solution.bound.numpy()).all())
        assert torch.equal(solution.certified, solution.bound <= tol)
        if tol == TOLS[0]:
            assert bool(solution.certified.all())


def test_a_tol_below_the_output_rounding_is_refused_up_front(small_hub, monkeypatch) -> None:
    """tol ≤ the rounding of the returned distribution can never be certified: a ToleranceError
    (a ValueError) naming the smallest tol of the dtype and of float64, raised at construction
    or at the call, before any step."""
    a, seeds, _ = small_hub
    n = a.shape[0]
    floor32, floor64 = certifiable_floor(torch.float32, n), certifiable_floor(torch.float64, n)
    assert 5.96e-8 < floor32 < 5.97e-8 and floor64 < 1e-14
    with pytest.raises(ToleranceError) as caught:
        PPRSolver(_torch_csr(a), dtype=torch.float32, tol=5e-9)
    message = str(caught.value)
    assert "tol 5e-09 cannot be certified for a float32 result" in message
    assert "rounding the returned distribution to float32 alone" in message
    assert f"just above {floor32:.3g}" in message and f"just above {floor64:.3g}" in message
    assert isinstance(caught.value, ValueError) and caught.value.floor == floor32

    solver = PPRSolver(_torch_csr(a), dtype=torch.float32, kernel="torch")

    def no_step(*args, **kwargs):
        raise AssertionError("a refused tol must not iterate")

    monkeypatch.setattr(solver, "_iterate", no_step)
    with pytest.raises(ToleranceError, match="5.96e-08"):
        solver.solve(torch.from_numpy(seeds), tol=5e-9)
    transition = build_transition(_torch_csr(a), dtype=torch.float32)
    with pytest.raises(ToleranceError):
        ppr_solve(transition, torch.from_numpy(seeds).float(), method="power", tol=floor32,
                  step=no_step)  # type: ignore[arg-type]
    # float64 certifies far below, and refuses only below its own rounding
    with pytest.raises(ToleranceError, match="float64 result") as caught:
        PPRSolver(_torch_csr(a), dtype=torch.float64, tol=1e-16)
    assert "a float64 solve" not in str(caught.value)
    assert str(caught.value).endswith(f"just above {floor64:.3g}")  # and nothing after it
    fine = PPRSolver(_torch_csr(a), dtype=torch.float64, kernel="torch", tol=5e-9)
    assert bool(fine.solve(torch.from_numpy(seeds)).certified.all())


def test_the_refusal_names_a_float64_solve_when_that_certifies_lower() -> None:
    """A float64 result whose floor is above float64's own (the closed form's, with the
    rounding of its G) is told of a float64 solve; one at float64's floor is not; a caller's
    name for what is rounded replaces the default."""
    floor64 = certifiable_floor(torch.float64, 100)
    above = str(ToleranceError(1e-15, torch.float64, 100, 4 * floor64, floor64,
                               what="the closed form's float64 result and its G"))
    assert "rounding the closed form's float64 result and its G alone" in above
    assert "a float64 solve (RetrievalConfig(dtype='float64')" in above
    assert above.endswith(f"just above {floor64:.3g}")
    at = str(ToleranceError(1e-17, torch.float64, 100, floor64, floor64))
    assert "rounding the returned distribution to float64 alone" in at
    assert "a float64 solve" not in at and at.endswith(f"just above {floor64:.3g}")


def test_normalise_in_blocks_and_into_another_dtype(monkeypatch) -> None:
    """normalise(v, dtype) is v / Σv per column, computed in float64 and rounded once into
    `dtype`, the same bits whatever the block of rows (NORMALISE_BLOCK made small here: 11
    rows in blocks of 2), for a vector too; pairwise_sum of no rows is a float64 zero per
    column."""
    from hippo_gpu.ppr import rounding

    gen = torch.Generator().manual_seed(5)
    v = torch.rand(11, 3, generator=gen, dtype=torch.float64)
    want = v / rounding.pairwise_sum(v)
    whole = rounding.normalise(v)
    assert whole.dtype == torch.float64 and torch.equal(whole, want)
    into32 = rounding.normalise(v, torch.float32)
    assert into32.dtype == torch.float32 and torch.equal(into32, want.to(torch.float32))
    monkeypatch.setattr(rounding, "NORMALISE_BLOCK", 6)  # 6 // 3 columns: blocks of 2 rows
    assert torch.equal(rounding.normalise(v), whole)
    assert torch.equal(rounding.normalise(v, torch.float32), into32)
    one = torch.rand(1000, generator=gen)  # a float32 vector: divided in float64, not float32
    alone = rounding.normalise(one)
    assert alone.dtype == torch.float32 and alone.shape == (1000,)
    assert torch.equal(alone, (one.double() / rounding.pairwise_sum(one)).float())
    empty = rounding.pairwise_sum(torch.zeros(0, 3))  # no rows: a float64 zero per column
    assert empty.dtype == torch.float64 and torch.equal(empty, torch.zeros(3, dtype=torch.float64))


def test_the_rounding_constants_are_their_derivations() -> None:
    """Each constant of ppr/rounding.py against its formula in the module docstring, evaluated
    in exact rational arithmetic: γ_k = k u / (1 − k u); the depth of a pairwise sum (eq. R1);
    ω(dtype, n) = expm1(u + 2 u64 + γ/(1 − γ)) + 2 n tiny; the floor of a float32 result
    holding float64's; the inflation 1 + (n + 8) 2⁻⁵². The bounds' own tests pass with any
    looser constant (a bound only grows) and with slightly tighter ones (their slack hides
    it), so the constants are pinned here. Sizes are chosen where each term is visible: k u
    near 2⁻¹³ for γ, 2⁹⁰⁰ rows for γ/(1 − γ) against the unit round-offs, 2¹⁰⁰⁰ rows for the
    subnormal term."""
    from fractions import Fraction

    from hippo_gpu.ppr import rounding

    u64 = Fraction(1, 2 ** 53)

    def gamma(k: int) -> Fraction:
        return k * u64 / (1 - k * u64)

    def close(got: float, want: Fraction | float) -> bool:
        return abs(Fraction(got) - Fraction(want)) <= Fraction(want) * Fraction(1, 10 ** 14)

    assert rounding.unit_roundoff(torch.float32) == 2.0 ** -24
    assert rounding.unit_roundoff(torch.float64) == 2.0 ** -53
    for k in (1, 16, 2 ** 40, 2 ** 50):
        assert close(rounding._gamma(k), gamma(k)), k
    # ⌈log₂ n⌉ roundings of a pairwise sum, at least one, doubled, and the division and product
    assert [rounding._depth(n) for n in (1, 2, 3, 4, 5, 1024, 1025)] == [4, 4, 6, 6, 8, 22, 24]

    def omega(dtype: torch.dtype, n: int) -> float:
        u = Fraction(torch.finfo(dtype).eps) / 2
        g = gamma(2 * max(1, (n - 1).bit_length()) + 2)
        return math.expm1(float(u + 2 * u64 + g / (1 - g))) + 2 * n * torch.finfo(dtype).tiny

    for dtype in (torch.float32, torch.float64):
        for n in (100, 2 ** 900, 2 ** 1000):
            assert close(rounding.output_rounding(dtype, n), omega(dtype, n)), (dtype, n)
    assert close(certifiable_floor(torch.float64, 100), omega(torch.float64, 100))
    assert close(certifiable_floor(torch.float32, 100),
                 Fraction(omega(torch.float32, 100)) + Fraction(omega(torch.float64, 100)))
    for n in (0, 1, 100, 10 ** 6, 2 ** 40):
        assert rounding.inflation(n) == float(1 + (n + 8) * Fraction(1, 2 ** 52)), n
    # check_tol: a tol that is not positive, at the floor, or just above it
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=r"need tol > 0, got tol="):
            rounding.check_tol(bad, torch.float32, 100)
    floor = certifiable_floor(torch.float32, 100)
    with pytest.raises(ToleranceError, match="for a float32 result over 100 rows"):
        rounding.check_tol(floor, torch.float32, 100)
    above = math.nextafter(floor, 1.0)
    assert rounding.check_tol(above, torch.float32, 100) == above


def test_pairwise_sum_is_the_documented_fold() -> None:
    """pairwise_sum adds in float64 by folding halves (the lower ⌈n/2⌉ rows take the upper
    ones, then again on what is left), the order its depth bound ⌈log₂ n⌉ (eq. R1) is proved
    for: the same bits as that fold replayed on Python floats (IEEE float64 additions), on
    float32 rows spread over many magnitudes, where another order rounds differently."""
    from hippo_gpu.ppr import rounding

    def fold(xs: list[float]) -> float:
        n = len(xs)
        half = (n + 1) // 2
        acc = xs[:half]
        for i in range(n - half):
            acc[i] += xs[half + i]
        m = half
        while m > 1:
            h = (m + 1) // 2
            for i in range(m - h):
                acc[i] += acc[h + i]
            m = h
        return acc[0]

    gen = torch.Generator().manual_seed(11)
    for n in (1, 2, 3, 7, 8, 16, 33, 1024):
        v = (torch.randn(n, 2, generator=gen) * 8).exp().float()
        got = rounding.pairwise_sum(v)
        assert got.dtype == torch.float64
        for j in range(2):
            assert got[j].item() == fold([float(x) for x in v[:, j].tolist()]), (n, j)


def test_a_tol_just_above_the_float64_floor_is_certified() -> None:
    """Near float64's rounding (3e-15 here) the float64 solve still certifies: its residual
    keeps falling there on this graph, and the reported bound holds the output rounding."""
    a = _hub_graph(n=2_000)
    seeds = _seeds(2_000, 3)
    tol = 2 * certifiable_floor(torch.float64, 2_000)
    solver = PPRSolver(_torch_csr(a), dtype=torch.float64, kernel="torch", tol=tol)
    solution = solver.solve(torch.from_numpy(seeds))
    assert bool(solution.certified.all())
    assert bool((solution.bound >= output_rounding(torch.float64, 2_000)).all())
    assert bool((solution.bound <= tol).all())


def _drop_first(queries, candidates):
    """A fact filter that keeps nothing for query 0 (dense fallback) and everything else."""
    from hippo_gpu.llm.filter import FilterOutcome

    kept = [[] if i == 0 else list(range(len(c))) for i, c in enumerate(candidates)]
    return FilterOutcome(kept=kept, fallbacks=0)


QUERIES = [
    "Who restored the tidal clock of the Lumen Museum?",
    "Which town is the lighthouse keeper Edwin Pell from?",
    "What did Marta Quill build in Harrowgate?",
]


def test_a_failed_query_fails_alone(sample_searcher) -> None:
    cfg = RetrievalConfig(ppr_max_iter=2)
    ranking = sample_searcher.rank(QUERIES, top_k=5, config=cfg, fact_filter=_drop_first)
    assert ranking.dense_fallback.tolist() == [True, False, False]
    assert sorted(ranking.failed) == [1, 2]  # query 0's PPR column is a discarded placeholder
    assert all("did not converge" in why for why in ranking.failed.values())
    with pytest.raises(QueryFailure) as caught:
        sample_searcher.retrieve(QUERIES, top_k=5, config=cfg, fact_filter=_drop_first)
    hits = caught.value.hits
    assert len(hits[0]) == 5 and hits[1] == [] and hits[2] == []
    dense = sample_searcher.retrieve(QUERIES[:1], top_k=5, mode="dense")[0]
    assert [h.key for h in hits[0]] == [h.key for h in dense]
    # hipporag1 and hybrid report the same way
    ents = [["tidal clock"], ["Edwin Pell"], []]
    r1 = sample_searcher.rank(QUERIES, top_k=5, mode="hipporag1", query_entities=ents, config=cfg)
    assert sorted(r1.failed) == [0, 1]  # query 2 has no entity: uniform scores, no PPR
    assert sorted(sample_searcher.rank(QUERIES, top_k=5, mode="hybrid", config=cfg).failed) \
        == [0, 1, 2]


def test_sample_rankings_report_certified_bounds(sample_searcher) -> None:
    ranking = sample_searcher.rank(QUERIES, top_k=5, mode="hybrid")
    assert ranking.failed == {}
    assert ranking.ppr_bound is not None and bool((ranking.ppr_bound <= 1e-6).all())
    assert bool((ranking.ppr_bound > 0).all())


@pytest.mark.slow
def test_musique_below_the_float32_floor_converges_certified(musique_searcher) -> None:
    """tol near musique's float32 floor on both graphs (the iterate gets tol − 2⁻²⁴: 1e-8 on the
    passage graph, 4e-8 on the phrase graph): every query answered, certified, and the rankings
    equal those of a float64 solve; a tol below float32's output rounding is refused."""
    from hippo_gpu.data import read_questions
    from tests.helpers import MUSIQUE

    texts = [q.question for q in read_questions(MUSIQUE / "questions.json")]
    for mode, tol in (("hipporag2", 7e-8), ("hybrid", 1e-7)):
        fast = musique_searcher.rank(texts, top_k=10, mode=mode,
                                     config=RetrievalConfig(ppr_tol=tol))
        assert fast.failed == {}
        assert fast.ppr_bound is not None and fast.ppr_refined is not None
        assert bool((fast.ppr_bound <= tol).all()) and bool(fast.ppr_refined.any())
        exact = musique_searcher.rank(texts, top_k=10, mode=mode,
                                      config=RetrievalConfig(dtype="float64", ppr_tol=1e-12))
        same = sum(a == b for a, b in zip(fast.passage_rows.tolist(),
                                          exact.passage_rows.tolist()))
        assert same >= 99, (mode, same)
        with pytest.raises(ToleranceError, match="float32 result"):
            musique_searcher.rank(texts[:2], top_k=10, mode=mode,
                                  config=RetrievalConfig(ppr_tol=5e-9))


def _musique_passage_case(index):
    """musique_train's passage graph, 100 HippoRAG 2 reset vectors (float32-representable: the
    float32 solver's input) and their float64 reference at tol 1e-13."""
    from hippo_gpu import Searcher
    from hippo_gpu.data import read_questions
    from tests.helpers import MUSIQUE

    texts = [q.question for q in read_questions(MUSIQUE / "questions.json")][:100]
    seeds = Searcher(index).hipporag2_reset_vectors(texts).float().double()
    exact = PPRSolver(index.adjacency, target_nodes=index.passage_nodes, dtype=torch.float64,
                      tol=1e-13)(seeds)
    return seeds, exact


@pytest.mark.slow
def test_musique_bounds_hold_against_float64_at_every_tol(musique_index) -> None:
    """Every solver path's bound covers its true error on musique_train (no slack), at the
    default tol and below the float32 floor, or the tol is refused: the numba kernel and torch,
    float32 and float64, and the closed form on 2,000 of the passage rows."""
    seeds, exact = _musique_passage_case(musique_index)
    adj, targets = musique_index.adjacency, musique_index.passage_nodes
    n = adj.shape[0]
    kernels = ["torch"] + (["numba"] if importlib.util.find_spec("numba") else [])
    for kernel in kernels:
        for dtype in (torch.float32, torch.float64):
            for tol in TOLS:
                if tol <= certifiable_floor(dtype, n):
                    with pytest.raises(ToleranceError):
                        PPRSolver(adj, target_nodes=targets, dtype=dtype, kernel=kernel, tol=tol)
                    continue
                solver = PPRSolver(adj, target_nodes=targets, dtype=dtype, kernel=kernel,
                                   tol=tol)
                solution = solver.solve(seeds)
                err = (solution.scores.double() - exact).abs().sum(0)
                assert bool(solution.certified.all()), (kernel, dtype, tol)
                assert int((err > solution.bound).sum()) == 0, (kernel, dtype, tol)
    rows = torch.arange(0, targets.numel(), max(1, targets.numel() // 2000))[:2000]
    for dtype in (torch.float32, torch.float64):
        closed = PPRSolver(adj, target_nodes=targets[rows], dtype=dtype, method="closed_form",
                           memory_budget=1 << 31)
        solution = closed.solve(seeds)
        err = (solution.scores.double() - exact[rows]).abs().sum(0)
        assert bool(solution.certified.all()) and int((err > solution.bound).sum()) == 0
