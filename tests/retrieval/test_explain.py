"""Searcher.explain against the float64 oracle: every term of every hit (seed, dense prior, its
own and spread parts, the bridges, hipporag1's min-max shift) equals the one a dense linear solve
of the PPR fixed point gives (tests/reference.py), the terms sum to the hit's score within the
certified bound in every mode, and the multi-hop questions of the sample name their bridge."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from hippo_gpu.config import MODES, RetrievalConfig
from hippo_gpu.data import read_questions
from hippo_gpu.retrieval.explanation import explanation_dict
from hippo_gpu.retrieval.hipporag1 import build_v1_graph
from hippo_gpu.sample import paths
from tests.reference import dense_ppr

F64 = RetrievalConfig(dtype="float64", ppr_method="chebyshev")
ENTITIES = [["Marta Quill", "tidal clock"], ["Lumen Museum"], ["Varnholt", "Eastmere"],
            ["Skerrow", "Jonas Vell"]]


@pytest.fixture(scope="module")
def questions() -> list[str]:
    return [q.question for q in read_questions(paths()["questions"])]


def _dense(adjacency: torch.Tensor) -> np.ndarray:
    return adjacency.to_dense().double().cpu().numpy()


def _units(n: int, nodes: list[int]) -> np.ndarray:
    e = np.zeros((n, len(nodes)))
    e[nodes, np.arange(len(nodes))] = 1.0
    return e


def _assert_matches_oracle(searcher: Any, queries: list[str], top_k: int = 10) -> None:
    """hipporag2 explained in float64 = the dense solve, term by term (module docstring)."""
    index, d = searcher.index, F64.damping
    a = _dense(index.adjacency)
    n, m = a.shape[0], len(index.phrases)
    degree = a.sum(axis=1)
    keep = 1.0 - d * (degree <= 0)  # 1ᵀL e_j: a dangling node keeps 1 − d
    reset = searcher.hipporag2_reset_vectors(queries, F64).cpu().numpy()  # [N, Q]
    pn = index.passage_nodes.cpu().numpy()
    explained = searcher.explain(queries, top_k=top_k, config=F64)
    for q, e in enumerate(explained):
        r = reset[:, q]
        seeds = np.flatnonzero(r[:m])
        assert sorted(s.node for s in e.seeds) == seeds.tolist()
        assert all(s.weight == r[s.node] for s in e.seeds)
        sigma = r @ keep
        prior = r.copy()
        prior[:m] = 0.0
        x_full = dense_ppr(a, r[:, None], d)[:, 0]
        x_seed = dense_ppr(a, _units(n, seeds.tolist()), d)
        x_prior = dense_ppr(a, prior[:, None], d)[:, 0]
        hit_nodes = [int(pn[h.hit.row]) for h in e.hits]
        x_own = dense_ppr(a, _units(n, hit_nodes), d)
        col = {int(s): i for i, s in enumerate(seeds)}
        assert sum(s.share for s in e.seeds) + e.dense_share == pytest.approx(1.0, abs=1e-14)
        for i, h in enumerate(e.hits):
            p = hit_nodes[i]
            assert abs(h.total - x_full[p]) <= 1e-10 <= h.bound * 1e2
            assert abs(h.total - h.value) <= h.bound
            for sc in h.seeds:
                s = sc.node
                want = r[s] * keep[s] * x_seed[p, col[s]] / sigma
                assert sc.contribution == pytest.approx(want, rel=1e-9, abs=1e-13)
                # eq. E2: the seed's term is the sum of what each neighbour v of p passes on
                masses = d * a[p] / np.where(degree > 0, degree, 1.0) * r[s] * keep[s] \
                    * x_seed[:, col[s]] / sigma
                assert masses.sum() == pytest.approx(want, rel=1e-9, abs=1e-13)
                top = np.sort(masses[masses > 0])[::-1][:len(sc.bridges)]
                np.testing.assert_allclose([b.mass for b in sc.bridges], top, rtol=1e-9,
                                           atol=1e-13)
                assert all(a[p, b.node] > 0 for b in sc.bridges)
            want_prior = (prior @ keep) * x_prior[p] / sigma
            want_own = r[p] * keep[p] * x_own[p, i] / sigma
            assert h.dense.total == pytest.approx(want_prior, rel=1e-9, abs=1e-13)
            assert h.dense.own == pytest.approx(want_own, rel=1e-9, abs=1e-13)
            assert h.dense.prior == r[p]


def test_hipporag2_terms_equal_the_dense_oracle(sample_searcher, questions) -> None:
    _assert_matches_oracle(sample_searcher, questions)


def test_dangling_passages_keep_their_own_mass_exactly(sample_searcher, tmp_path) -> None:
    # three passages without triples: isolated nodes, whose column of L keeps only 1 − d,
    # so the normalisation σ = cᵀr must weigh their prior by 1 − d (not 1) to be exact
    from hippo_gpu import Searcher, build_index

    files = paths()
    corpus = json.loads(files["corpus"].read_text())
    openie = json.loads(files["openie"].read_text())
    bare = {"Lantern fair", "Grey Sea fisheries", "Corran sheep"}
    for doc in openie["docs"]:
        if doc["passage"].split("\n")[0] in bare:
            doc["extracted_triples"] = []
    index = build_index(corpus, openie, tmp_path / "index", device="cpu", ppr_basis=False,
                        encoder=sample_searcher.encoder)
    searcher = Searcher(index, encoder=sample_searcher.encoder)
    queries = ["When is the lantern fair of Harrowgate held?", "Which fish do Grey Sea "
               "fisheries land?", "Where are Corran sheep raised for their wool?"]
    hits = searcher.retrieve(queries, top_k=10, config=F64)
    assert all(any(h.title in bare for h in per_query) for per_query in hits)
    _assert_matches_oracle(searcher, queries)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", MODES)
def test_terms_sum_to_each_score_within_the_bound(sample_searcher, questions, mode,
                                                  dtype) -> None:
    cfg = RetrievalConfig(dtype=dtype)
    ents = ENTITIES if mode in ("hipporag1", "hybrid") else None
    explained = sample_searcher.explain(questions, top_k=8, mode=mode, config=cfg,
                                        query_entities=ents)
    hits = sample_searcher.retrieve(questions, top_k=8, mode=mode, config=cfg,
                                    query_entities=ents)
    # hipporag1's scores are min-max scaled to [0, 1] (float32: off by ~1e-5), the others'
    # are PPR probabilities (~1e-2, off by ~1e-6)
    limit = 1e-9 if dtype == "float64" else 1e-4 if mode == "hipporag1" else 1e-5
    for e, want in zip(explained, hits, strict=True):
        assert [h.hit for h in e.hits] == want
        for h in e.hits:
            assert abs(h.total - h.value) <= h.bound <= limit, (h.hit.title, h.bound)
            if mode == "hybrid":  # the fusion terms are the score, bit for bit
                fu = h.fusion
                assert (fu.ppr_term + fu.dense_term) + fu.entity_term == h.hit.score
            elif mode != "dense":
                assert h.value == h.hit.score
            if mode == "dense":
                assert h.seeds == () and h.dense.total == h.hit.score


def test_hipporag1_terms_equal_the_dense_oracle(sample_searcher, questions) -> None:
    index, d = sample_searcher.index, F64.damping
    graph = build_v1_graph(index)
    w = _dense(graph.adjacency)
    b = graph.passage_phrase.to_dense().double().numpy()  # [P, M]
    keep = 1.0 - d * (w.sum(axis=1) <= 0)
    counts = index.phrase_passage_counts.double().numpy()
    explained = sample_searcher.explain(questions, top_k=10, mode="hipporag1", config=F64,
                                        query_entities=ENTITIES)
    for e, ents in zip(explained, ENTITIES, strict=True):
        nodes = sorted(s.node for s in e.seeds)
        assert len(nodes) >= 1 and sum(len(s.entities) for s in e.seeds) == len(ents)
        r = np.zeros(w.shape[0])
        r[nodes] = 1.0 / np.maximum(counts[nodes], 1)
        y = b @ dense_ppr(w, r[:, None], d)[:, 0]
        lo, rng = y.min(), y.max() - y.min()
        y_seed = b @ dense_ppr(w, _units(w.shape[0], nodes), d)  # [P, S]
        share = r[nodes] * keep[nodes] / (r @ keep)
        for h in e.hits:
            p = h.hit.row
            assert abs(h.total - (y[p] - lo) / rng) <= 1e-10
            assert abs(h.total - h.hit.score) <= h.bound <= 1e-9
            assert h.offset == pytest.approx(-lo / rng, rel=1e-9)
            for sc in h.seeds:
                k = nodes.index(sc.node)
                assert sc.contribution == pytest.approx(share[k] * y_seed[p, k] / rng, rel=1e-9,
                                                        abs=1e-13)
                # a passage's score is a finite sum over its phrases: bridges + other = term
                assert sum(x.mass for x in sc.bridges) + sc.other == pytest.approx(
                    sc.contribution, rel=1e-12, abs=1e-15)


def test_the_bridge_entity_tops_the_answer_passage_of_each_multi_hop_question(
        sample_searcher, questions) -> None:
    # The answer passage of a two-hop question is reached through an entity the question never
    # names: it is that passage's top seed, and its mass enters through the second hop's phrase.
    explained = sample_searcher.explain(questions, top_k=30, config=F64)
    cases = [  # (question row, answer passage, bridge entity, the phrase its mass enters by)
        (0, "Harrowgate", "marta quill", "harrowgate"),
        (1, "Castellan College", "edwin pell", "castellan college"),
    ]
    for q, title, bridge, via in cases:
        assert bridge not in questions[q].lower()
        (hit,) = [h for h in explained[q].hits if h.hit.title == title]
        top = hit.seeds[0]
        assert (top.phrase, top.bridges[0].phrase) == (bridge, via)
        assert top.contribution > max(s.contribution for s in hit.seeds[1:])
        seed = next(s for s in explained[q].seeds if s.phrase == bridge)
        assert seed.facts  # seeded by a kept fact that names it
        info = next(p for p in explained[q].phrases if p.phrase == via)
        assert hit.hit.row in info.passages


def test_explain_is_chunk_invariant_and_serialises(sample_searcher, questions,
                                                   monkeypatch) -> None:
    from hippo_gpu.retrieval import explain

    whole = sample_searcher.explain(questions, top_k=5, config=F64)
    monkeypatch.setattr(explain, "query_chunk", lambda *a: 1)
    chunked = sample_searcher.explain(questions, top_k=5, config=F64)
    index = sample_searcher.index
    as_json = [explanation_dict(e, index.passage_keys, index.passage_titles) for e in whole]
    assert as_json == [explanation_dict(e, index.passage_keys, index.passage_titles)
                       for e in chunked]
    text = json.dumps(as_json, allow_nan=False)
    first = json.loads(text)[0]
    assert first["hits"][0]["title"] == whole[0].hits[0].hit.title
    assert {s["phrase"] for s in first["seeds"]} == {s.phrase for s in whole[0].seeds}


def test_a_query_answered_by_linearity_is_bounded_with_its_scan_gap(sample_index, questions,
                                                                    monkeypatch) -> None:
    # basis + push solves the target with E_P e in exact arithmetic; the decomposition is of
    # the iteration's (float32 cosines): the bound carries the gap 2‖Δr‖₁/σ between them
    from hippo_gpu import Searcher
    from hippo_gpu.ppr import linear

    monkeypatch.setattr(linear, "MAX_REDUCTION", float("inf"))
    monkeypatch.setattr(linear, "PUSH_WORK_FRACTION", 1e3)
    searcher = Searcher(sample_index)
    cfg = RetrievalConfig(ppr_method="basis_push")
    assert bool(searcher.rank(questions, config=cfg).ppr.pushed.all())
    for e in searcher.explain(questions, top_k=10, config=cfg):
        for h in e.hits:
            assert abs(h.total - h.value) <= h.bound <= 1e-5
