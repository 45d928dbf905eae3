"""Batched retrieval against a per-query reference written from the upstream description
(the official HippoRAG 2 query, step by step), with plain Python/numpy and the float64 PPR
oracle."""

import numpy as np
import pytest
import torch

from hippo_gpu.config import RetrievalConfig
from hippo_gpu.llm.filter import FilterOutcome
from hippo_gpu.retrieval.ranking import minmax_rows, topk_stable
from hippo_gpu.retrieval.searcher import Searcher
from tests.helpers import QUERIES
from tests.reference import dense_ppr


def _minmax(x):
    rng = x.max() - x.min()
    return np.ones_like(x) if rng == 0 else (x - x.min()) / rng


def reference_reset(index, query, link_k=5, pass_w=0.05):
    """One query, step by step, as upstream does it (§3.3.1-6)."""
    e = Searcher(index).encoder.encode_queries([query], "query_to_passage")[0].double().numpy()
    facts = _minmax(index.fact_emb.double().numpy() @ e)
    cand = sorted(range(len(facts)), key=lambda j: (-facts[j], j))[:link_k]
    w, n = {}, {}
    for j in cand:
        for ph in (index.facts[j][0], index.facts[j][2]):
            row = index.phrases.index(ph)
            w[row] = w.get(row, 0.0) + facts[j] / int(index.phrase_passage_counts[row])
            n[row] = n.get(row, 0) + 1
    mean = {r: w[r] / n[r] for r in w}
    top = sorted(mean, key=lambda r: (-mean[r], r))[:link_k]
    reset = np.zeros(index.num_nodes)
    for r in top:
        reset[r] = mean[r]
    dense = _minmax(index.passage_emb.double().numpy() @ e)
    reset[index.passage_nodes.numpy()] += pass_w * dense
    return reset, dense


def test_reset_vectors_match_reference(sample_index, sample_searcher):
    got = sample_searcher.hipporag2_reset_vectors(QUERIES).numpy()
    for qi, q in enumerate(QUERIES):
        want, _ = reference_reset(sample_index, q)
        np.testing.assert_allclose(got[:, qi], want, atol=1e-6)
        assert 1 <= np.count_nonzero(got[: len(sample_index.phrases), qi]) <= 5


def test_hipporag2_ranking_matches_reference_ppr(sample_index, sample_searcher):
    cfg = RetrievalConfig(dtype="float64", ppr_tol=1e-12)
    r = sample_searcher.rank(QUERIES, top_k=30, mode="hipporag2", config=cfg)
    adj = sample_index.adjacency.to_dense().double().numpy()
    for qi, q in enumerate(QUERIES):
        reset, _ = reference_reset(sample_index, q)
        x = dense_ppr(adj, reset[:, None], damping=0.5)[:, 0]
        scores = x[sample_index.passage_nodes.numpy()]
        order = sorted(range(len(scores)), key=lambda j: (-scores[j], j))
        assert r.passage_rows[qi].tolist() == order
        # the batched path scores queries against float32 embeddings (as upstream does); the
        # reference takes float64 dot products: reset weights differ by ~1e-7 relative
        np.testing.assert_allclose(r.scores[qi].numpy(), scores[order], rtol=1e-5, atol=1e-9)


def test_dense_mode_is_minmax_cosine_ranking(sample_index, sample_searcher):
    r = sample_searcher.rank(QUERIES, top_k=5, mode="dense")
    for qi, q in enumerate(QUERIES):
        _, dense = reference_reset(sample_index, q)
        order = sorted(range(len(dense)), key=lambda j: (-dense[j], j))[:5]
        assert r.passage_rows[qi].tolist() == order
    assert r.dense_fallback.all()


def test_batch_composition_does_not_change_results(sample_index, sample_searcher):
    together = sample_searcher.retrieve(QUERIES, top_k=10)
    for qi, q in enumerate(QUERIES):
        alone = sample_searcher.retrieve([q], top_k=10)[0]
        assert [h.key for h in alone] == [h.key for h in together[qi]]
        np.testing.assert_allclose([h.score for h in alone], [h.score for h in together[qi]],
                                   rtol=1e-5, atol=1e-7)


class KeepFirst:
    """A recognition-memory stand-in: keeps the first candidate, or none for 'drop' queries."""

    def __call__(self, queries, candidates):
        kept = [[] if "drop" in q else [0] for q in queries]
        return FilterOutcome(kept=kept, fallbacks=0)


def test_filter_plugs_in_and_empty_filter_falls_back_to_dense(sample_index, sample_searcher):
    qs = [QUERIES[0], "drop this one: who designed the lighthouse on Skerrow?"]
    r = sample_searcher.rank(qs, top_k=30, mode="hipporag2", fact_filter=KeepFirst())
    assert r.dense_fallback.tolist() == [False, True]
    assert (r.seed_facts[0] >= 0).sum() == 1 and (r.seed_facts[1] >= 0).sum() == 0
    dense = sample_searcher.rank(qs[1:], top_k=30, mode="dense")
    assert r.passage_rows[1].tolist() == dense.passage_rows[0].tolist()
    unfiltered = sample_searcher.rank(qs[:1], top_k=30, mode="hipporag2")
    assert r.passage_rows[0].tolist() != unfiltered.passage_rows[0].tolist() or \
        not torch.allclose(r.scores[0], unfiltered.scores[0])


def test_hybrid_and_hipporag1_modes(sample_index, sample_searcher):
    hits = sample_searcher.retrieve(QUERIES, top_k=4, mode="hybrid")
    assert [len(h) for h in hits] == [4, 4, 4]
    assert all(a.score >= b.score for h in hits for a, b in zip(h, h[1:]))
    # without given entities, hipporag1 seeds from the LLM-free extractor: the same
    # ranking as passing its entities, and the ranking reports which it used
    from hippo_gpu.retrieval.entities import heuristic_entities

    auto = sample_searcher.rank(QUERIES, top_k=5, mode="hipporag1")
    given = sample_searcher.rank(QUERIES, top_k=5, mode="hipporag1",
                                 query_entities=heuristic_entities(QUERIES))
    assert auto.entities == heuristic_entities(QUERIES)
    assert auto.passage_rows.tolist() == given.passage_rows.tolist()
    assert torch.equal(auto.scores, given.scores)
    ents = [["tidal clock"], ["Lumen Museum", "Edwin Pell"], []]
    r = sample_searcher.rank(QUERIES, top_k=5, mode="hipporag1", query_entities=ents)
    # legacy v1: a query without entities gets uniform scores (not the dense ranking)
    assert r.dense_fallback.tolist() == [False, False, False]
    assert r.scores[2].unique().numel() == 1 and r.passage_rows[2].tolist() == list(range(5))
    titles = [sample_index.passage_titles[j] for j in r.passage_rows[0].tolist()]
    assert "Tidal clock" in titles[:3]


def test_hybrid_entity_part(sample_index, sample_searcher):
    from hippo_gpu.retrieval.entities import heuristic_entities

    cfg0 = RetrievalConfig(hybrid_entity_weight=0.0)
    cfg = RetrievalConfig(hybrid_entity_weight=0.4)
    auto = sample_searcher.rank(QUERIES, top_k=30, mode="hybrid", config=cfg)
    given = sample_searcher.rank(QUERIES, top_k=30, mode="hybrid", config=cfg,
                 query_entities=heuristic_entities(QUERIES))
    assert auto.passage_rows.tolist() == given.passage_rows.tolist()
    without = sample_searcher.rank(QUERIES, top_k=30, mode="hybrid", config=cfg0)
    assert auto.passage_rows.tolist() != without.passage_rows.tolist()
    # the entity ranking alone (weight 1) is the v2-graph entity ranking where a query has
    # entities (hybrid keeps its tuned entity scores; hipporag1 is legacy v1, tested apart)
    ents = [["tidal clock"], ["Lumen Museum"]]
    only = sample_searcher.rank(QUERIES[:2], top_k=5, mode="hybrid",
                                config=RetrievalConfig(hybrid_entity_weight=1.0),
                                query_entities=ents)
    doc, has = sample_searcher.entity_scores(ents, RetrievalConfig())
    assert has.all()
    assert only.passage_rows.tolist() == topk_stable(doc, 5)[1].tolist()


def test_bad_arguments(sample_index, sample_searcher):
    with pytest.raises(ValueError, match="unknown mode"):
        sample_searcher.retrieve(QUERIES, mode="magic")
    with pytest.raises(TypeError):
        sample_searcher.retrieve("one string")
    with pytest.raises(ValueError, match="top_k"):
        sample_searcher.retrieve(QUERIES, top_k=0)
    assert sample_searcher.retrieve([], top_k=3) == []


def test_minmax_and_stable_topk():
    x = torch.tensor([[3.0, 1.0, 2.0], [5.0, 5.0, 5.0]])
    torch.testing.assert_close(minmax_rows(x), torch.tensor([[1.0, 0.0, 0.5], [1.0, 1.0, 1.0]]))
    vals, idx = topk_stable(torch.tensor([[1.0, 2.0, 2.0, 0.5, 2.0]]), 3)
    assert idx.tolist() == [[1, 2, 4]] and vals.tolist() == [[2.0, 2.0, 2.0]]


def test_closed_form_ppr_gives_the_iterative_ranking(sample_index, sample_searcher):
    it = sample_searcher.rank(QUERIES, top_k=30,
              config=RetrievalConfig(dtype="float64", ppr_method="power", ppr_tol=1e-12))
    cf = sample_searcher.rank(QUERIES, top_k=30,
              config=RetrievalConfig(dtype="float64", ppr_method="closed_form"))
    assert cf.passage_rows.tolist() == it.passage_rows.tolist()
    torch.testing.assert_close(cf.scores, it.scores, atol=1e-10, rtol=0)
