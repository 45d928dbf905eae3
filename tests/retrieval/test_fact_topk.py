"""The one-pass fact top-k (seeds.fact_topk on the CPU kernel path) against the code it replaced.

References: `_old_scores_against` and `_old_fact_topk` below are the implementation before the
one-pass stage, kept verbatim, so "the same output" means bit for bit (values and rows); a
float64 oracle checks that this output is the min-max top-k; a Python sort checks the running
kernel. Awkward sizes throughout: Q not a multiple of QUERY_PANEL, F not a multiple of
ROW_ALIGN, k > F, exact ties, raw scores that differ but scale to the same float32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hippo_gpu import kernels
from hippo_gpu.retrieval import blockwise, seeds
from hippo_gpu.retrieval.blockwise import QUERY_PANEL, ROW_ALIGN, scores_against, spans
from hippo_gpu.retrieval.ranking import minmax_rows, scale_rows, topk_stable
from hippo_gpu.retrieval.seeds import fact_topk

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE or kernels.FORCE_TORCH,
                                reason="the numba kernel path is off")


def _old_scores_against(queries: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    """blockwise.scores_against before panel_slabs (CPU), verbatim."""
    x = queries.to(emb.device, emb.dtype)
    a, b = x.shape[0], emb.shape[0]
    pad = (-a) % QUERY_PANEL
    if pad:
        x = torch.cat([x, x.new_zeros((pad, x.shape[1]))])
    out = torch.empty((a, b), dtype=emb.dtype)
    for c in range(0, b, ROW_ALIGN):
        slab_t = emb[c:c + ROW_ALIGN].T
        for r in range(0, a, QUERY_PANEL):
            block = x[r:r + QUERY_PANEL] @ slab_t
            out[r:r + QUERY_PANEL, c:c + ROW_ALIGN] = block[: a - r]
    return out


def _old_fact_topk(query_emb: torch.Tensor, fact_emb: torch.Tensor, k: int,
                   rows_per_block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """seeds.fact_topk before the one-pass stage, verbatim (two passes when blocked)."""
    f = fact_emb.shape[0]
    size = f if rows_per_block is None else max(1, min(rows_per_block, f))
    if size >= f:
        return topk_stable(minmax_rows(_old_scores_against(query_emb, fact_emb)).float(), k)
    (a0, b0), *rest = spans(f, size)
    raw = _old_scores_against(query_emb, fact_emb[a0:b0])
    lo = raw.min(dim=1, keepdim=True).values
    hi = raw.max(dim=1, keepdim=True).values
    for a, b in rest:
        raw = _old_scores_against(query_emb, fact_emb[a:b])
        lo = torch.minimum(lo, raw.min(dim=1, keepdim=True).values)
        hi = torch.maximum(hi, raw.max(dim=1, keepdim=True).values)
    del raw
    best_val, best_row = topk_stable(
        scale_rows(_old_scores_against(query_emb, fact_emb[a0:b0]), lo, hi).float(), k)
    for a, b in rest:
        scaled = scale_rows(_old_scores_against(query_emb, fact_emb[a:b]), lo, hi).float()
        val, row = topk_stable(scaled, k)
        best_val, pos = topk_stable(torch.cat([best_val, val], dim=1), k)
        best_row = torch.cat([best_row, row + a], dim=1).gather(1, pos)
    return best_val, best_row


def _unit(rows: int, dim: int, gen: torch.Generator) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(rows, dim, generator=gen), dim=1)


def _assert_same(got: tuple[torch.Tensor, torch.Tensor],
                 want: tuple[torch.Tensor, torch.Tensor], msg: object = "") -> None:
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.int64, msg
    assert got[0].shape == want[0].shape and got[1].shape == want[1].shape, msg
    assert torch.equal(got[1], want[1]), msg
    # bit for bit, signed zeros included
    assert torch.equal(got[0].view(torch.int32), want[0].view(torch.int32)), msg


@pytest.fixture
def redo_calls(monkeypatch) -> list[int]:
    """The number of queries each exact redo of the kernel path took."""
    calls: list[int] = []
    blocked = seeds._fact_topk_blocked

    def spy(query_emb, fact_emb, k, size, bounds=None):
        if bounds is not None:
            calls.append(query_emb.shape[0])
        return blocked(query_emb, fact_emb, k, size, bounds)

    monkeypatch.setattr(seeds, "_fact_topk_blocked", spy)
    return calls


# ---------------------------------------------------------------- bits of the raw scores


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scores_against_keeps_the_bits_of_the_old_loop(dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    x = _unit(21, 48, gen)
    emb = _unit(2 * ROW_ALIGN + 333, 48, gen).to(dtype)
    for q in (1, 8, 13, 21):
        got, want = scores_against(x[:q], emb), _old_scores_against(x[:q], emb)
        assert torch.equal(got.view(torch.int16 if dtype != torch.float32 else torch.int32),
                           want.view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert scores_against(x, emb[:0]).shape == (21, 0)
    assert scores_against(x[:0], emb).shape == (0, emb.shape[0])


def test_panel_slabs_yield_each_slab_once_in_order() -> None:
    gen = torch.Generator().manual_seed(6)
    x, emb = _unit(11, 16, gen), _unit(3 * ROW_ALIGN + 5, 16, gen)
    whole = _old_scores_against(x, emb)
    starts = []
    for c, block in blockwise.panel_slabs(x, emb):
        starts.append(c)
        assert block.shape[0] == 16 and block.is_contiguous()  # padded to whole panels
        assert torch.equal(block[:11], whole[:, c:c + block.shape[1]])
        assert not block[11:].any()  # zero queries score zero
    assert starts == [0, ROW_ALIGN, 2 * ROW_ALIGN, 3 * ROW_ALIGN]


# ---------------------------------------------------------------- the one-pass top-k


@pytest.mark.parametrize("facts", [1, 7, ROW_ALIGN - 1, ROW_ALIGN, ROW_ALIGN + 1,
                                   3 * ROW_ALIGN + 500])
def test_fact_topk_is_the_old_output_bit_for_bit(facts: int) -> None:
    gen = torch.Generator().manual_seed(facts)
    x, emb = _unit(13, 32, gen), _unit(facts, 32, gen)
    for k in (1, 5, 30, facts, facts + 3):
        want = _old_fact_topk(x, emb, k)
        assert want[1].shape == (13, min(k, facts))
        for rows in (None, ROW_ALIGN, 2 * ROW_ALIGN, 700, 1):
            _assert_same(fact_topk(x, emb, k, rows), want, (facts, k, rows))
        if facts > ROW_ALIGN:  # the old blocked path too (aligned blocks: the same bits)
            _assert_same(_old_fact_topk(x, emb, k, ROW_ALIGN), want, (facts, k))


def test_fact_topk_matches_the_float64_oracle() -> None:
    gen = torch.Generator().manual_seed(8)
    x, emb = _unit(19, 64, gen), _unit(5000, 64, gen)
    vals, rows = fact_topk(x, emb, 10)
    exact = minmax_rows(x.double() @ emb.double().T)  # [Q, F] float64 min-max cosine
    want = torch.sort(exact, dim=1, descending=True).values[:, :10]
    torch.testing.assert_close(vals.double(), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(exact.gather(1, rows), want, atol=1e-6, rtol=0)
    assert (rows.sort(dim=1).values.diff(dim=1) > 0).all()  # k distinct facts


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fact_topk_in_half_precision_is_the_old_output(dtype) -> None:
    gen = torch.Generator().manual_seed(9)
    x, emb = _unit(29, 64, gen), _unit(20_000, 64, gen).to(dtype)
    for k in (5, 30):
        _assert_same(fact_topk(x, emb, k, 4 * ROW_ALIGN), _old_fact_topk(x, emb, k), k)


def test_fact_topk_with_exact_ties_everywhere() -> None:
    gen = torch.Generator().manual_seed(11)
    # small integer vectors: every dot product is exact and equal scores abound, at the cut too
    emb = torch.randint(-2, 3, (2 * ROW_ALIGN + 77, 8), generator=gen).float()
    emb[ROW_ALIGN + 3] = emb[4]  # a duplicate across slabs: the lower row first
    x = torch.randint(-2, 3, (15, 8), generator=gen).float()
    for k in (1, 5, 40, 200):
        want = _old_fact_topk(x, emb, k)
        for rows in (None, ROW_ALIGN, 700):
            _assert_same(fact_topk(x, emb, k, rows), want, (k, rows))


def _scaling_tie() -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """One query and facts whose raw scores differ but scale to the same float32.

    Raw score = the fact's first coordinate (the query is e_0). With lo = -1 and hi = 1 the
    scaling is (r + 1) / 2, and 0.75 and the next float up both give 1.75 / 2: r + 1 rounds
    to even. Rows 0-19 score 0.75, rows 20-59 the float above, row 60 scores 1 and row 61 -1;
    so the raw top-(k + slack) holds rows 60 and 20..., all tied after scaling with rows 0...,
    which must win the tie (lower rows): the kernel path has to redo the query. The other
    coordinates are random, so that other queries see no such ties.
    """
    up = float(np.nextafter(np.float32(0.75), np.float32(1)))
    filler = ROW_ALIGN + 50
    first = [0.75] * 20 + [up] * 40 + [1.0, -1.0] + torch.linspace(-0.5, 0.5, filler).tolist()
    emb = torch.randn(len(first), 4, generator=torch.Generator().manual_seed(20))
    emb[:, 0] = torch.tensor(first)
    query = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert scale_rows(emb[[0, 20], 0].view(1, 2), torch.tensor([[-1.0]]),
                      torch.tensor([[1.0]])).unique().numel() == 1  # the tie is real
    return query, emb, [60, 0, 1, 2, 3]


def test_a_tie_made_by_the_scaling_is_redone_exactly(redo_calls) -> None:
    query, emb, want_rows = _scaling_tie()
    vals, rows = fact_topk(query, emb, 5)
    assert rows[0].tolist() == want_rows
    assert vals[0].tolist() == [1.0, 0.875, 0.875, 0.875, 0.875]
    assert redo_calls == [1]
    # in a batch (Q not a multiple of the panel), blocked, every query gets the old answer
    gen = torch.Generator().manual_seed(12)
    others = _unit(10, 4, gen)
    batch = torch.cat([others[:4], query, others[4:]])
    for rows_per_block in (None, ROW_ALIGN, 300):
        redo_calls.clear()
        got = fact_topk(batch, emb, 5, rows_per_block)
        _assert_same(got, _old_fact_topk(batch, emb, 5), rows_per_block)
        assert got[1][4].tolist() == want_rows and redo_calls == [1]


def test_random_float32_scores_need_no_redo(redo_calls) -> None:
    gen = torch.Generator().manual_seed(13)
    x, emb = _unit(64, 64, gen), _unit(30_000, 64, gen)
    for k in (5, 30):
        _assert_same(fact_topk(x, emb, k), _old_fact_topk(x, emb, k), k)
    assert redo_calls == []


def test_a_query_whose_facts_all_tie_takes_the_first_rows_without_a_redo(redo_calls) -> None:
    gen = torch.Generator().manual_seed(14)
    x = _unit(5, 16, gen)
    x[2] = 0  # a zero query vector: every fact scores 0, min-max gives all ones
    emb = _unit(2 * ROW_ALIGN + 9, 16, gen)
    got = fact_topk(x, emb, 6)
    _assert_same(got, _old_fact_topk(x, emb, 6))
    assert got[1][2].tolist() == list(range(6)) and got[0][2].tolist() == [1.0] * 6
    assert redo_calls == []


def test_fact_topk_does_not_depend_on_batch_order_or_chunking() -> None:
    gen = torch.Generator().manual_seed(15)
    x, emb = _unit(37, 32, gen), _unit(4 * ROW_ALIGN + 11, 32, gen)
    whole = fact_topk(x, emb, 7)
    _assert_same(whole, _old_fact_topk(x, emb, 7))
    alone = [fact_topk(x[i:i + 1], emb, 7) for i in range(37)]
    _assert_same((torch.cat([a[0] for a in alone]), torch.cat([a[1] for a in alone])), whole)
    perm = torch.randperm(37, generator=gen)
    got = fact_topk(x[perm], emb, 7, 2 * ROW_ALIGN)
    _assert_same((got[0][torch.argsort(perm)], got[1][torch.argsort(perm)]), whole)
    for chunk in (3, 8, 16):
        parts = [fact_topk(x[a:b], emb, 7) for a, b in spans(37, chunk)]
        _assert_same((torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])),
                     whole, chunk)


def test_fact_topk_at_one_and_two_threads_is_the_old_output_at_that_count() -> None:
    gen = torch.Generator().manual_seed(16)
    x, emb = _unit(24, 64, gen), _unit(6 * ROW_ALIGN + 1, 64, gen)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)  # MKL's bits could depend on the count: compare at one
            _assert_same(fact_topk(x, emb, 9, ROW_ALIGN), _old_fact_topk(x, emb, 9), threads)
    finally:
        torch.set_num_threads(before)


def test_the_kernel_path_never_holds_query_by_fact_scores(monkeypatch) -> None:
    gen = torch.Generator().manual_seed(17)
    x, emb = _unit(40, 16, gen), _unit(3 * ROW_ALIGN, 16, gen)
    want = _old_fact_topk(x, emb, 5)
    shapes = []
    slabs = blockwise.panel_slabs

    def spy(queries, rows):
        for c, block in slabs(queries, rows):
            shapes.append(tuple(block.shape))
            yield c, block

    def no_scores(*_a, **_k):
        raise AssertionError("scores_against called: a [Q, rows] block")

    monkeypatch.setattr(seeds, "panel_slabs", spy)
    monkeypatch.setattr(seeds, "scores_against", no_scores)
    _assert_same(fact_topk(x, emb, 5), want)
    assert shapes == [(40, ROW_ALIGN)] * 3


def test_the_torch_path_gives_the_same_output() -> None:
    """What CUDA, float64 and HIPPO_GPU_FORCE_TORCH=1 run, on CPU tensors."""
    gen = torch.Generator().manual_seed(18)
    x, emb = _unit(13, 32, gen), _unit(2 * ROW_ALIGN + 100, 32, gen)
    for size in (emb.shape[0], ROW_ALIGN):
        _assert_same(seeds._fact_topk_blocked(x, emb, 6, size), fact_topk(x, emb, 6), size)
    got = fact_topk(x.double(), emb.double(), 6, ROW_ALIGN)  # float64: the torch path
    want = _old_fact_topk(x.double(), emb.double(), 6)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


# ---------------------------------------------------------------- the running kernel


def test_running_topk_is_a_python_sort_whatever_the_slabs() -> None:
    from hippo_gpu.kernels.topk_cpu import RunningTopK

    rng = np.random.default_rng(19)
    q, f, m = 6, 3000, 11
    scores = rng.integers(-4, 5, (8, f)).astype(np.float32) / np.float32(4)
    scores[:, 5] = -0.0  # signed zeros tie with +0.0 (float comparison)
    scores[3] = 2.5  # one row all equal
    for width in (1, 7, 1024, f):
        state = RunningTopK(q, m)
        for c in range(0, f, width):
            state.fold(np.ascontiguousarray(scores[:, c:c + width]), c)
        vals, rows, lo, hi = state.result()
        for i in range(q):
            order = sorted(range(f), key=lambda j: (-scores[i, j], j))[:m]
            assert rows[i].tolist() == order, (width, i)
            assert np.array_equal(vals[i], scores[i, order])
        assert np.array_equal(lo, scores[:q].min(axis=1))
        assert np.array_equal(hi, scores[:q].max(axis=1))
    few = RunningTopK(2, 9)
    few.fold(np.array([[3, 1, 2], [0, 0, -1]], dtype=np.float32), 0)
    vals, rows, _, _ = few.result()  # fewer rows than m: all of them
    assert rows.tolist() == [[0, 2, 1], [0, 1, 2]] and vals.shape == (2, 3)


def test_running_topk_validates_its_input() -> None:
    from hippo_gpu.kernels.topk_cpu import RunningTopK

    state = RunningTopK(4, 3)
    with pytest.raises(ValueError, match="float32"):
        state.fold(np.zeros((4, 8), dtype=np.float64), 0)
    with pytest.raises(ValueError, match="need >= 4"):
        state.fold(np.zeros((3, 8), dtype=np.float32), 0)
    with pytest.raises(ValueError, match="from row 0"):
        state.fold(np.zeros((4, 8), dtype=np.float32), 8)
    with pytest.raises(ValueError, match="m >= 1"):
        RunningTopK(4, 0)
