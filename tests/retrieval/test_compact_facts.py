"""The int8 first pass of a lone query's fact scan (retrieval/compact_facts.py) gives the full
float32 scan's answer bit for bit: on random rows, on rows built to tie (duplicates, a shared
minimum, zero rows, signed zeros), and through the Searcher; where it cannot certify its
selection it hands the query to the full scan, and it does certify nearly always."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")

from hippo_gpu.retrieval import compact_facts  # noqa: E402
from hippo_gpu.retrieval.compact_facts import CompactFacts, compact_topk  # noqa: E402
from hippo_gpu.retrieval.seeds import fact_topk  # noqa: E402


def _unit(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    return torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)


def _same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and \
        torch.equal(torch.signbit(a[0]), torch.signbit(b[0]))


@pytest.mark.parametrize("dim", [64, 384])
def test_the_compact_scan_is_the_full_scan_on_random_rows(dim: int) -> None:
    gen = torch.Generator().manual_seed(dim)
    facts = _unit(5_000 if dim == 384 else 20_000, dim, gen)
    compact = CompactFacts.of(facts)
    certified = 0
    for trial in range(40):
        q = 1 + trial % 2
        queries = _unit(q, dim, gen)
        for k in (1, 5, 17):
            want = fact_topk(queries, facts, k)
            assert _same(fact_topk(queries, facts, k, compact=compact), want), (trial, k)
            certified += sum(compact_topk(queries[i:i + 1], facts, compact, k) is not None
                             for i in range(q))
    assert certified >= 0.95 * 3 * sum(1 + t % 2 for t in range(40))  # the fallback is rare


def test_ties_duplicates_zero_rows_and_signed_zeros() -> None:
    gen = torch.Generator().manual_seed(7)
    base = _unit(3_000, 64, gen)
    query = _unit(1, 64, gen)
    orth = base[:40] - (base[:40] @ query.T) * query  # rows orthogonal to the query: r ~ 0
    facts = torch.cat([base, base[:300], torch.zeros(5, 64), orth, -orth, query, query,
                       -query, -query])  # duplicates of whole rows, a shared top and bottom
    facts = facts[torch.randperm(facts.shape[0], generator=gen)].contiguous()
    compact = CompactFacts.of(facts)
    for q in (query, -query, base[:1], base[1:3], orth[:1]):
        for k in (1, 2, 3, 5, 40):
            want = fact_topk(q, facts, k)
            assert _same(fact_topk(q, facts, k, compact=compact), want), k
    same = torch.zeros(50, 64)
    same[:, 0] = 1.0  # every row alike: a zero range, which the full scan answers
    assert compact_topk(query, same, CompactFacts.of(same), 5) is None
    assert _same(fact_topk(query, same, 5, compact=CompactFacts.of(same)),
                 fact_topk(query, same, 5))
    assert compact_topk(query, base[:4], CompactFacts.of(base[:4]), 5) is None  # k >= F


def test_an_uncertified_query_takes_the_full_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(3)
    facts, queries = _unit(4_000, 64, gen), _unit(2, 64, gen)
    compact = CompactFacts.of(facts)
    want = fact_topk(queries, facts, 5)
    real = compact_facts.compact_topk
    calls = []

    def flaky(query, fact_emb, codes, k):  # the second query cannot be certified
        calls.append(1)
        return None if len(calls) == 2 else real(query, fact_emb, codes, k)

    monkeypatch.setattr("hippo_gpu.retrieval.seeds.compact_topk", flaky)
    assert _same(fact_topk(queries, facts, 5, compact=compact), want) and len(calls) == 2


def test_a_lone_query_ranks_as_it_does_in_a_batch(sample_searcher,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the Searcher: a lone query reads the codes, a batch of 8 the float32 rows (the
    vectors encoded once, one query at a time: the encoder's bits move with its padding). The
    sample's fact table is below COMPACT_MIN_ROWS, where the Searcher keeps the full scan (a
    matter of speed only): the threshold is lowered for the comparison."""
    from hippo_gpu.retrieval import searcher as searcher_module
    from tests.helpers import QUERIES

    assert sample_searcher._compact_facts(1) is None  # a small table: the full scan
    monkeypatch.setattr(searcher_module, "COMPACT_MIN_ROWS", 1)

    batch = (QUERIES + [q.replace("?", "") for q in QUERIES] + ["lighthouse", "Alzheimer"])[:8]
    vec = torch.cat([sample_searcher.encode_queries([q])[0] for q in batch])
    together = sample_searcher.rank(batch, top_k=10, query_emb=vec)
    sample_searcher._compact_facts(1)  # starts the codes' background build
    sample_searcher.wait_for_codes(60)
    assert sample_searcher._compact_facts(1) is not None
    assert sample_searcher._compact_facts(8) is None
    for i, text in enumerate(batch):
        alone = sample_searcher.rank([text], top_k=10, query_emb=vec[i:i + 1])
        assert torch.equal(alone.passage_rows[0], together.passage_rows[i])
        assert torch.equal(alone.scores[0], together.scores[i])
        assert alone.seeds[0] == together.seeds[i]  # the same facts seeded its PPR
