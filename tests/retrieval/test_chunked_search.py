"""The chunked query path (issue 13) gives the one-chunk results bit for bit, within its budget.

References: the same Searcher with a budget that fits everything (one chunk: today's path), and
plain float64 / Python sorts for the blockwise pieces. Budgets are forced tiny so that every
stage runs in many chunks: one query column per PPR solve, fact and phrase blocks of
blockwise.ROW_ALIGN rows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.ppr import PPRSolver
from hippo_gpu.retrieval import blockwise, seeds
from hippo_gpu.retrieval.blockwise import block_rows, nearest_rows, scores_against, spans
from hippo_gpu.retrieval.entities import heuristic_entities
from hippo_gpu.retrieval.ranking import minmax_rows, topk_stable
from hippo_gpu.retrieval.results import Hit, SeedTriple
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.retrieval.seeds import fact_topk, plan_chunks
from tests.helpers import QUERIES

ONE_CHUNK = 1 << 40  # bytes: everything fits, the unchunked path
TINY = 1  # bytes: one query per chunk, ROW_ALIGN-row embedding blocks


# ---------------------------------------------------------------- blockwise pieces


@pytest.mark.parametrize("dim", [64, 384])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scores_against_is_the_product_and_does_not_depend_on_the_blocking(dim, dtype) -> None:
    gen = torch.Generator().manual_seed(dim)
    x = torch.nn.functional.normalize(torch.randn(37, dim, generator=gen), dim=1)
    rows_total = 3 * blockwise.ROW_ALIGN + 500  # three full slabs and a tail
    emb = torch.nn.functional.normalize(torch.randn(rows_total, dim, generator=gen),
                                        dim=1).to(dtype)
    whole = scores_against(x, emb)
    assert whole.shape == (37, rows_total) and whole.dtype == dtype
    want = x.to(dtype).double() @ emb.double().T  # float64 dot products of the same inputs
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(whole.double(), want, atol=tol, rtol=0)
    alone = torch.cat([scores_against(x[i:i + 1], emb) for i in range(37)])
    assert torch.equal(alone, whole)  # a query alone: the same bits as in the batch
    # the fact stage's slabs (panel_slabs' contiguous buffer) hold the same bits: GEMMs that
    # wrote straight into windows of the output (leading dimension rows_total) gave other bits
    # at two threads, D = 384 (measured on a Xeon, torch 2.13's MKL)
    slabs = torch.cat([block[:37].clone() for _, block in blockwise.panel_slabs(x.to(dtype), emb)],
                      dim=1)
    assert torch.equal(slabs, whole)
    # query chunks at multiples of QUERY_PANEL, row blocks at multiples of ROW_ALIGN (the
    # contract search keeps), one thread and two: the bits of the whole product
    align, before = blockwise.ROW_ALIGN, torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)  # MKL's bits depend on its thread count: compare
            whole = scores_against(x, emb)  # at one count
            for qc, rows in ((8, align), (16, 2 * align), (32, 3 * align)):
                blocked = torch.cat([torch.cat([scores_against(x[a:b], emb[c:d])
                                                for c, d in spans(rows_total, rows)], dim=1)
                                     for a, b in spans(37, qc)])
                assert torch.equal(blocked, whole), (threads, qc, rows)
    finally:
        torch.set_num_threads(before)


def test_nearest_rows_takes_the_first_maximum_across_blocks() -> None:
    gen = torch.Generator().manual_seed(3)
    emb = torch.nn.functional.normalize(torch.randn(1000, 16, generator=gen), dim=1)
    emb[700] = emb[5]  # exact duplicates in different blocks: the lower row must win
    emb[999] = emb[300]
    queries = torch.cat([emb[[5, 300, 42]], torch.randn(6, 16, generator=gen)])
    want = (queries.double() @ emb.double().T).argmax(dim=1)  # float64, first maximum
    assert want[:3].tolist() == [5, 300, 42]
    for rows in (None, 256, 512, 7, 1):
        assert nearest_rows(queries, emb, rows).tolist() == want.tolist(), rows


def test_nearest_rows_holds_one_block_of_scores_at_a_time(monkeypatch) -> None:
    """The memory bound of its docstring: never more than [E, rows_per_block] scores (the
    blocks it asks scores_against for), all rows when rows_per_block is None; one row works,
    none is refused."""
    seen: list[tuple[int, int]] = []
    real = blockwise.scores_against
    monkeypatch.setattr(blockwise, "scores_against",
                        lambda q, e: seen.append((len(q), len(e))) or real(q, e))
    gen = torch.Generator().manual_seed(4)
    emb = torch.randn(10, 8, generator=gen)
    queries = torch.randn(3, 8, generator=gen)
    want = (queries @ emb.T).argmax(dim=1).tolist()
    for rows, blocks in ((None, [10]), (4, [4, 4, 2]), (10, [10]), (64, [10]), (0, [1] * 10)):
        seen.clear()
        assert nearest_rows(queries, emb, rows).tolist() == want, rows
        assert seen == [(3, b) for b in blocks], rows
    assert nearest_rows(queries, emb[4:5]).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="^nearest_rows needs at least one embedding row$"):
        nearest_rows(queries, emb[:0])


def test_block_rows_and_spans() -> None:
    align = blockwise.ROW_ALIGN
    assert block_rows(1000, 10, 10_000) == 1000  # fits: one block of everything
    assert block_rows(1, 10, 10_000) == 1 and block_rows(0, 10, 10_000) == 1  # never empty
    assert type(block_rows(100_000, 10, 10 * (3 * align + 7))) is int  # a row count, not a float
    assert block_rows(100_000, 10, 10 * (3 * align + 7)) == 3 * align  # rounded down to align
    assert block_rows(100_000, 10, 10 * 5 * align) == 5 * align
    assert block_rows(100_000, 10, 1) == align  # never below ROW_ALIGN
    assert block_rows(100_000, 1, 7 * align) == 7 * align  # one byte per row
    assert spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert spans(0, 4) == [(0, 0)]
    assert spans(3, 1) == spans(3, 0) == [(0, 1), (1, 2), (2, 3)]  # one row per span, at least


def test_chunk_budget_is_validated_and_sizes_the_plan(sample_index) -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        RetrievalConfig(chunk_bytes=0)
    p = len(sample_index.passage_keys)
    per_col = 5 * 4 * sample_index.num_nodes + 32 * p  # NODE_VECTORS x float32 x N + P bytes
    for cols in (1, 2, 5):
        plan = plan_chunks(sample_index, 9, RetrievalConfig(chunk_bytes=cols * per_col))
        assert plan.query_cols == cols
    assert plan_chunks(sample_index, 9, RetrievalConfig(chunk_bytes=per_col - 1)).query_cols == 1
    # from 8 columns on, whole SIMD passes of the CPU kernel: 8 of 20 (not 10), 16 of 20 (not 17)
    for cols, want in ((8, 8), (10, 8), (17, 16)):
        plan = plan_chunks(sample_index, 20, RetrievalConfig(chunk_bytes=cols * per_col))
        assert plan.query_cols == want
    big = plan_chunks(sample_index, 9, RetrievalConfig())  # the default budget: one chunk
    assert (big.query_cols, big.fact_rows) == (9, len(sample_index.facts))


def _reference_fact_topk(scores: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
    """Python sort of min-max normalised float64 rows, ties by the lower row."""
    vals, rows = [], []
    for row in scores.double().tolist():
        lo, hi = min(row), max(row)
        norm = [(v - lo) / (hi - lo) if hi > lo else 1.0 for v in row]
        order = sorted(range(len(row)), key=lambda j: (-norm[j], j))[:k]
        rows.append(order)
        vals.append([norm[j] for j in order])
    return vals, rows


def test_fact_topk_blocks_give_the_whole_top_k_with_ties() -> None:
    gen = torch.Generator().manual_seed(11)
    # small integer vectors: every dot product is exact in float32 and ties are everywhere
    emb = torch.randint(-2, 3, (1500, 8), generator=gen).float()
    x = torch.randint(-2, 3, (13, 8), generator=gen).float()
    for k in (1, 5, 40):
        want_vals, want_rows = _reference_fact_topk(x @ emb.T, k)
        whole = fact_topk(x, emb, k)
        assert whole[1].tolist() == want_rows
        torch.testing.assert_close(whole[0].double(), torch.tensor(want_vals, dtype=torch.float64),
                                   atol=1e-7, rtol=0)
        for rows in (1, 3, 256, 700, 1499):
            got = fact_topk(x, emb, k, rows)
            assert torch.equal(got[1], whole[1]), (k, rows)
            assert torch.equal(got[0], whole[0]), (k, rows)


def test_fact_topk_on_real_vectors_is_bit_identical(sample_index) -> None:
    e = sample_index.passage_emb[:9]  # passage vectors stand in for queries
    emb = torch.cat([sample_index.fact_emb] * 6)  # > 2 blocks of ROW_ALIGN rows
    whole = topk_stable(minmax_rows(e @ emb.T), 7)  # today's one-GEMM expression
    got = fact_topk(e, emb, 7, blockwise.ROW_ALIGN)
    assert torch.equal(got[1], whole[1]) and torch.equal(got[0], whole[0])


# ---------------------------------------------------------------- Searcher, whole pipeline


@dataclass
class _Run:
    rows: list[list[int]]
    scores: torch.Tensor
    fallback: list[bool]
    seed_facts: list[list[int]] | None
    ppr_columns: list[int]  # columns of every PPR solve


class _KeepOdd:
    """A fact filter that keeps the odd candidates, and nothing for every third query."""

    def __call__(self, queries, candidates):
        from hippo_gpu.llm.filter import FilterOutcome

        kept = [[] if i % 3 == 2 else [j for j in range(len(c)) if j % 2] for i, c in
                enumerate(candidates)]
        return FilterOutcome(kept=kept, fallbacks=0)


def _run(searcher: Searcher, queries, mode: str, budget: int, monkeypatch, *,
         dtype: str = "float32", entities=None, fact_filter=None, top_k: int = 20) -> _Run:
    calls: list[int] = []
    solve = PPRSolver.solve  # the Searcher's entry point (it never raises per batch)

    def spy(self, seeds, **kw):
        calls.append(int(seeds.shape[1]))
        return solve(self, seeds, **kw)

    with monkeypatch.context() as m:
        m.setattr(PPRSolver, "solve", spy)
        cfg = RetrievalConfig(dtype=dtype, chunk_bytes=budget)
        r = searcher.rank(queries, top_k=top_k, mode=mode, config=cfg,
                          query_entities=entities, fact_filter=fact_filter)
    seeds = None if r.seed_facts is None else r.seed_facts.tolist()
    return _Run(r.passage_rows.tolist(), r.scores, r.dense_fallback.tolist(), seeds, calls)


def _assert_same(chunked: _Run, whole: _Run) -> None:
    assert chunked.rows == whole.rows
    assert chunked.scores.dtype == whole.scores.dtype
    assert torch.equal(chunked.scores, whole.scores)  # bit for bit
    assert chunked.fallback == whole.fallback
    assert chunked.seed_facts == whole.seed_facts


CASES = [  # mode, dtype, use entities, use the filter
    ("dense", "float32", False, False),
    ("hipporag2", "float32", False, False),
    ("hipporag2", "float64", False, False),
    ("hipporag2", "float32", False, True),
    ("hybrid", "float32", False, False),
    ("hybrid", "float32", True, True),
    ("hipporag1", "float32", True, False),
]


def _sample_queries() -> list[str]:
    return QUERIES + [q.replace("?", "") for q in QUERIES] + ["lighthouse", "Alzheimer", "river"]


@pytest.mark.parametrize("mode,dtype,with_entities,with_filter", CASES)
def test_sample_chunked_equals_one_chunk(sample_searcher, monkeypatch, mode, dtype,
                                         with_entities, with_filter) -> None:
    queries = _sample_queries()  # Q = 9: not a multiple of the GEMM panel
    ents = heuristic_entities(queries) if with_entities else None
    if ents is not None:
        ents[1] = []  # a query without entities
    filt = _KeepOdd() if with_filter else None
    # the sample's facts fit one ROW_ALIGN block: 64-row GEMM slabs and blocks split them (the
    # slab width fixes the bits, so the one-chunk reference runs with it too)
    monkeypatch.setattr(blockwise, "ROW_ALIGN", 64)
    whole = _run(sample_searcher, queries, mode, ONE_CHUNK, monkeypatch, dtype=dtype,
                 entities=ents, fact_filter=filt)
    idx = sample_searcher.index
    assert plan_chunks(idx, len(queries), RetrievalConfig()).query_cols == 9
    tiny = plan_chunks(idx, len(queries), RetrievalConfig(chunk_bytes=TINY))
    assert tiny.query_cols == 1 and tiny.fact_rows == 64 < len(idx.facts)
    for budget in (TINY, 3 * _column_bytes(sample_searcher, dtype)):
        chunked = _run(sample_searcher, queries, mode, budget, monkeypatch, dtype=dtype,
                       entities=ents, fact_filter=filt)
        _assert_same(chunked, whole)
        if mode != "dense":
            assert max(chunked.ppr_columns) <= (1 if budget == TINY else 3)
            # hybrid: a chunk whose queries have no entity skips the entity PPR
            assert sum(chunked.ppr_columns) <= sum(whole.ppr_columns)
    if mode != "dense":
        assert max(whole.ppr_columns) > 1  # the reference really solved a batch at once
    if with_filter:
        assert any(whole.fallback) and not all(whole.fallback)


def _column_bytes(searcher: Searcher, dtype: str) -> int:
    """The budget plan_chunks charges one query column (so k x it gives k columns)."""
    itemsize = 8 if dtype == "float64" else 4
    idx = searcher.index
    return (seeds.NODE_VECTORS * itemsize * idx.num_nodes
            + seeds.PASSAGE_BYTES * len(idx.passage_keys))


def test_sample_retrieve_hits_are_identical(sample_searcher) -> None:
    queries = _sample_queries()

    def retrieve(config: RetrievalConfig) -> tuple[list[list[Hit]], list[list[SeedTriple]]]:
        ranking = sample_searcher.rank(queries, top_k=10, mode="hybrid", config=config)
        return sample_searcher.to_hits(ranking), ranking.seeds

    whole = retrieve(RetrievalConfig(chunk_bytes=ONE_CHUNK))
    chunked = retrieve(RetrievalConfig(chunk_bytes=TINY))
    assert chunked == whole  # keys, titles, scores, ranks, rows and seed facts


def test_hipporag2_reset_vectors_use_the_blocked_fact_top_k(sample_searcher,
                                                            monkeypatch) -> None:
    monkeypatch.setattr(blockwise, "ROW_ALIGN", 64)  # several fact blocks on the sample
    whole = sample_searcher.hipporag2_reset_vectors(QUERIES, RetrievalConfig())
    assert plan_chunks(sample_searcher.index, 3, RetrievalConfig(chunk_bytes=TINY)).fact_rows \
        < len(sample_searcher.index.facts)
    tiny = sample_searcher.hipporag2_reset_vectors(QUERIES, RetrievalConfig(chunk_bytes=TINY))
    assert torch.equal(whole, tiny)


# ---------------------------------------------------------------- musique_train


@pytest.fixture(scope="module")
def musique_queries():
    from hippo_gpu.data import read_questions
    from tests.helpers import musique_or_skip

    qs = read_questions(musique_or_skip() / "questions.json")
    return [q.question for q in qs[:61]]  # Q = 61: several panels and a ragged tail


# hybrid and hipporag1 in float64: in float32 their phrase-graph PPR stops short of the
# solver's certified tolerance on some musique queries (ConvergenceError in the one-chunk path
# alike, a solver matter); their float32 paths are compared on the sample and synthetic index.
@pytest.mark.slow
@pytest.mark.parametrize("mode,dtype", [("dense", "float32"), ("hipporag2", "float32"),
                                        ("hybrid", "float64"), ("hipporag1", "float64")])
def test_musique_chunked_equals_one_chunk(musique_searcher, musique_queries, monkeypatch,
                                          mode, dtype) -> None:
    idx = musique_searcher.index
    ents = heuristic_entities(musique_queries) if mode == "hipporag1" else None
    whole = _run(musique_searcher, musique_queries, mode, ONE_CHUNK, monkeypatch,
                 entities=ents, top_k=200, dtype=dtype)
    # tiny: 1 query per solve, 256-row fact and phrase blocks (musique: ~17k facts)
    budget_cases = [TINY, 4 * _column_bytes(musique_searcher, dtype)]
    assert plan_chunks(idx, 61, RetrievalConfig(chunk_bytes=TINY)).fact_rows \
        == blockwise.ROW_ALIGN < len(idx.facts)
    for budget in budget_cases:
        chunked = _run(musique_searcher, musique_queries, mode, budget, monkeypatch,
                       entities=ents, top_k=200, dtype=dtype)
        _assert_same(chunked, whole)
        if mode != "dense":
            assert max(chunked.ppr_columns) <= (1 if budget == TINY else 4)


# ---------------------------------------------------------------- synthetic, 10k passages


@pytest.fixture(scope="module")
def synthetic_searcher(tmp_path_factory):
    from hippo_gpu import build_index
    from hippo_gpu.synthetic import synthetic_corpus

    corpus = synthetic_corpus(10_000, seed=0)
    paths = corpus.write(tmp_path_factory.mktemp("synthetic"))
    index = build_index(paths["corpus"], paths["openie"], None, encoder="hash:64",
                        device="cpu")
    return Searcher(index), corpus


@pytest.mark.parametrize("mode", ["dense", "hipporag2", "hybrid", "hipporag1"])
def test_synthetic_10k_chunked_equals_one_chunk(synthetic_searcher, monkeypatch, mode) -> None:
    searcher, corpus = synthetic_searcher
    rnd = random.Random(5)
    passages = corpus.passages()
    picks = rnd.sample(range(len(passages)), 37)
    queries = [f"what connects {passages[i].title} and {passages[j].title}?"
               for i, j in zip(picks, picks[1:] + picks[:1])]
    ents = [[passages[i].title] for i in picks] if mode in ("hipporag1", "hybrid") else None
    whole = _run(searcher, queries, mode, ONE_CHUNK, monkeypatch, entities=ents, top_k=100)
    budget = 5 * _column_bytes(searcher, "float32")
    plan = plan_chunks(searcher.index, len(queries), RetrievalConfig(chunk_bytes=budget))
    assert plan.query_cols == 5 and plan.fact_rows < len(searcher.index.facts)
    chunked = _run(searcher, queries, mode, budget, monkeypatch, entities=ents, top_k=100)
    _assert_same(chunked, whole)
    if mode != "dense":
        assert max(chunked.ppr_columns) <= 5 < max(whole.ppr_columns)
