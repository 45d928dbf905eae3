"""Same numbers on every device and batch: exact tie-breaking, fixed-order aggregation, explicit
precision (issue 10). References are plain Python sorts and sums."""

from __future__ import annotations

import random

import pytest
import torch

from hippo_gpu.config import MODES
from hippo_gpu.retrieval.ranking import cat_topk, minmax_rows, ranks_of, scale_rows, topk_stable
from hippo_gpu.retrieval.seeds import _segment_mean
from tests.helpers import QUERIES

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _reference_topk(row: list[float], k: int) -> list[int]:
    return sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]


@pytest.mark.parametrize("device", DEVICES)
def test_topk_stable_takes_the_lowest_indices_among_ties_at_the_cut(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        q, n = 1 + trial % 4, 1 + trial % 37
        # few distinct values: ties everywhere, including at the k-th place
        scores = torch.randint(0, 4, (q, n), generator=gen).float().to(device)
        k = 1 + trial % (n + 2)
        vals, idx = topk_stable(scores, k)
        for r in range(q):
            want = _reference_topk(scores[r].tolist(), k)
            assert idx[r].tolist() == want, (scores[r].tolist(), k)
            assert vals[r].tolist() == [scores[r, j].item() for j in want]


def test_topk_stable_mixes_clean_and_spilling_rows_in_one_batch() -> None:
    """topk's own indices serve the rows whose ties at the cut it took whole; the rows whose
    ties spill past the k-th place take the exact cut: both in one batch, against the Python
    sort, with signed zeros and infinities among the ties (== treats -0.0 and 0.0 alike)."""
    gen = torch.Generator().manual_seed(3)
    values = torch.tensor([-float("inf"), -1.0, -0.0, 0.0, 0.5, 1.0, float("inf")])
    for trial in range(300):
        q, n = 1 + trial % 7, 1 + trial % 53
        scores = values[torch.randint(0, len(values), (q, n), generator=gen)]
        distinct = torch.rand(q, n, generator=gen)  # float scores: no ties in these rows
        scores = torch.where((torch.arange(q) % 2 == 0).unsqueeze(1), distinct, scores)
        k = 1 + trial % (n + 1)
        vals, idx = topk_stable(scores, k)
        for r in range(q):
            want = _reference_topk(scores[r].tolist(), k)
            assert idx[r].tolist() == want, (scores[r].tolist(), k)
            assert vals[r].tolist() == [scores[r, j].item() for j in want]


def test_topk_stable_of_empty_batches_and_k_past_the_row() -> None:
    scores = torch.tensor([[0.5, 0.7, 0.5], [0.1, 0.1, 0.3]])
    for q, k in ((0, 3), (2, 0), (0, 0)):
        vals, idx = topk_stable(scores[:q], k)
        assert vals.shape == idx.shape == (q, 0) and idx.dtype == torch.int64
        assert vals.dtype == scores.dtype
    vals, idx = topk_stable(scores, 5)  # k > P: every column, ranked
    assert idx.tolist() == [[1, 0, 2], [2, 0, 1]]
    assert torch.equal(vals, scores.gather(1, idx))


def test_ranks_are_exact_integers() -> None:
    scores = torch.tensor([[0.5, 0.7, 0.5, 0.1], [1.0, 1.0, 1.0, 1.0]])
    r = ranks_of(scores)
    assert r.dtype == torch.int64
    assert r.tolist() == [[1, 0, 2, 3], [0, 1, 2, 3]]
    gen = torch.Generator().manual_seed(5)
    for trial in range(50):
        x = torch.randint(0, 4, (1 + trial % 3, 1 + trial % 11), generator=gen).float()
        for row, got in zip(x.tolist(), ranks_of(x).tolist()):
            order = _reference_topk(row, len(row))
            assert got == [order.index(j) for j in range(len(row))]


def test_ties_keep_row_order_in_long_rows() -> None:
    """Rows long enough that an unstable sort does reorder ties on the CPU (from ~100
    entries): ranks and the top-k still break every tie by the lower index."""
    gen = torch.Generator().manual_seed(6)
    x = torch.randint(0, 3, (2, 1000), generator=gen).float()
    ranks = ranks_of(x).tolist()
    vals, idx = topk_stable(x, 700)
    for r, row in enumerate(x.tolist()):
        order = _reference_topk(row, len(row))
        assert ranks[r] == [order.index(j) for j in range(len(row))]
        assert idx[r].tolist() == order[:700]
        assert vals[r].tolist() == [row[j] for j in order[:700]]


def test_minmax_rows_is_the_formula_per_row_and_ones_for_a_flat_row() -> None:
    """(x − min) / (max − min) per row with the row's own min and max, in x's dtype; a row of
    zero range becomes ones (upstream's rule)."""
    x = torch.tensor([[0.25, 0.75, 0.5, 0.3], [2.0, 2.0, 2.0, 2.0], [-3.0, 5.0, 1.0, -1.0],
                      [0.1, 0.1, 0.2, 0.15]])
    got = minmax_rows(x)
    lo, hi = x.min(dim=1, keepdim=True).values, x.max(dim=1, keepdim=True).values
    want = (x - lo) / (hi - lo)
    want[1] = 1.0
    assert got.dtype == x.dtype and torch.equal(got, want)
    assert torch.equal(minmax_rows(x.double()), ((x.double() - lo.double())
                                                  / (hi - lo).double()).nan_to_num(1.0))
    got = scale_rows(x, torch.full((4, 1), -4.0), torch.full((4, 1), -4.0))  # zero range
    assert torch.equal(got, torch.ones_like(x))


def test_cat_topk_concatenates_chunks_along_the_queries() -> None:
    a = (torch.tensor([[0.9, 0.1]]), torch.tensor([[4, 2]]))
    b = (torch.tensor([[0.8, 0.7], [0.5, 0.4]]), torch.tensor([[0, 1], [3, 5]]))
    scores, rows = cat_topk([a, b])
    assert scores.tolist() == torch.cat([a[0], b[0]]).tolist()
    assert rows.tolist() == [[4, 2], [0, 1], [3, 5]] and rows.dtype == torch.int64


@pytest.mark.parametrize("device", DEVICES)
def test_segment_mean_sums_in_input_order(device: str) -> None:
    rnd = random.Random(1)
    values = [rnd.uniform(-1, 1) * 10 ** rnd.randint(-8, 8) for _ in range(300)]
    seg = [rnd.randrange(40) for _ in values]
    got = _segment_mean(torch.tensor(values, dtype=torch.float32, device=device),
                        torch.tensor(seg, device=device), 40).cpu()
    for s in range(40):
        acc, n = torch.tensor(0.0), 0
        for v, g in zip(values, seg):
            if g == s:  # float32 additions in input order, as the docstring promises
                acc = torch.tensor(v, dtype=torch.float32) if n == 0 else \
                    acc + torch.tensor(v, dtype=torch.float32)
                n += 1
        want = acc / max(n, 1) if n else torch.tensor(0.0)
        assert got[s].item() == want.item(), s


@pytest.mark.parametrize("mode", [m for m in MODES if m != "hipporag1"])
def test_rankings_do_not_depend_on_batch_order_or_size(sample_searcher, mode: str) -> None:
    """float32: the same queries alone, batched, permuted and repeated give identical top-10.

    Given the same query vectors, the scores are identical too, bit for bit: the passage and
    fact products are blockwise's fixed-shape GEMMs, where one plain GEMM of the batch's shape
    gives other bits for a query alone (a GEMV) than in a batch. (The query encoder's own bits
    depend on the batch's padding, so the vectors are encoded once, one query at a time.)
    """
    queries = QUERIES + [q.replace("?", "") for q in QUERIES] + ["lighthouse", "Alzheimer"]
    vec = {q: sample_searcher.encode_queries([q])[0] for q in queries}  # [1, D] each
    alone = {q: sample_searcher.rank([q], top_k=10, mode=mode) for q in queries}
    fixed = {q: sample_searcher.rank([q], top_k=10, mode=mode, query_emb=vec[q])
             for q in queries}
    rnd = random.Random(7)
    for batch in (2, 3, 9, len(queries)):
        order = queries[:]
        rnd.shuffle(order)
        for i in range(0, len(order), batch):
            chunk = order[i:i + batch]
            r = sample_searcher.rank(chunk, top_k=10, mode=mode)
            f = sample_searcher.rank(chunk, top_k=10, mode=mode,
                                     query_emb=torch.cat([vec[q] for q in chunk]))
            for j, q in enumerate(chunk):
                assert r.passage_rows[j].tolist() == alone[q].passage_rows[0].tolist(), (q, batch)
                assert torch.equal(f.passage_rows[j], fixed[q].passage_rows[0]), (q, batch)
                assert torch.equal(f.scores[j], fixed[q].scores[0]), (q, batch)
    twice = sample_searcher.rank(queries, top_k=10, mode=mode)
    again = sample_searcher.rank(queries, top_k=10, mode=mode)
    assert torch.equal(twice.passage_rows, again.passage_rows)
    assert torch.equal(twice.scores, again.scores)


def test_precision_is_explicit_and_the_same_on_every_device(sample_index_dir) -> None:
    from hippo_gpu import Searcher, load_index

    default = load_index(sample_index_dir, device="cpu")
    assert default.precision == "float32" and default.passage_emb.dtype == torch.float32
    assert default.stats()["precision"] == "float32"
    half = load_index(sample_index_dir, device="cpu", precision="float16")
    assert half.precision == "float16"
    assert {t.dtype for t in (half.passage_emb, half.phrase_emb, half.fact_emb)} == {torch.float16}
    hits = Searcher(half).retrieve(QUERIES, top_k=5, mode="hipporag2")
    assert [len(h) for h in hits] == [5] * len(QUERIES)
    with pytest.raises(ValueError, match="precision"):
        load_index(sample_index_dir, device="cpu", precision="float8")
    if torch.cuda.is_available():
        on_gpu = load_index(sample_index_dir, device="cuda")
        assert on_gpu.precision == "float32" and on_gpu.passage_emb.dtype == torch.float32
        cpu_rows = Searcher(default).rank(QUERIES, top_k=10).passage_rows
        gpu_rows = Searcher(on_gpu).rank(QUERIES, top_k=10).passage_rows.cpu()
        assert torch.equal(cpu_rows, gpu_rows)


def test_exact_match_linking_only_with_an_uncased_encoder(sample_index, sample_searcher):
    from hippo_gpu import Searcher
    from hippo_gpu.config import RetrievalConfig

    assert sample_searcher.encoder_is_uncased  # all-MiniLM-L6-v2 lower-cases its input

    class CountingEncoder:  # the real encoder behind a cased tokenizer, counting encodes
        def __init__(self, real) -> None:
            self.real, self.calls = real, []
            self.dim = real.dim

        def token_ids(self, text: str) -> list[int]:
            return [ord(c) for c in text]

        def encode(self, texts, **kw):
            self.calls.append(list(texts))
            return self.real.encode(texts, **kw)

    enc = CountingEncoder(sample_searcher.encoder)
    cased = Searcher(sample_index, encoder=enc)
    assert not cased.encoder_is_uncased
    entity = sample_index.phrases[5].title()  # lower-cases to an indexed phrase
    cased.entity_scores([[entity]], RetrievalConfig())
    assert enc.calls == [[entity]]  # encoded, not linked by its text
    enc.calls.clear()
    uncased = Searcher(sample_index, encoder=enc)
    uncased.query_encoder.uncased = True
    uncased.entity_scores([[entity]], RetrievalConfig())
    assert enc.calls == []  # the shortcut: no encoding


@pytest.mark.parametrize("mode", ["hybrid", "hipporag2"])
def test_a_query_in_another_os_thread_gives_the_same_bits(sample_searcher, mode: str) -> None:
    """torch's OpenMP thread count is per OS thread (device.set_threads): with one thread set,
    a query answered in a fresh thread (as a server's workers answer) gives the very scores of
    the main thread's, on a machine of any core count."""
    import threading

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        want = sample_searcher.rank(QUERIES, top_k=10, mode=mode)
        got: list = []
        worker = threading.Thread(
            target=lambda: got.append(sample_searcher.rank(QUERIES, top_k=10, mode=mode)))
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(before)
    assert torch.equal(got[0].passage_rows, want.passage_rows)
    assert torch.equal(got[0].scores, want.scores)
