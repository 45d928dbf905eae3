"""Legacy HippoRAG 1 retrieval (hippo_gpu.retrieval.hipporag1, mode "hipporag1") against a reference
written from the legacy code's retrieval (create_graph.py, hipporag.py), in plain
Python/numpy with the float64 dense PPR oracle (tests/reference.py).

The reference rebuilds everything from the raw OpenIE triples (normalisation, phrase list,
graph_plus counts, v1's synonym walk, build_graph's self-loop drop, docs_to_facts,
facts_to_phrases, node specificity, min-max). It shares with the package only the inputs no
reference can recompute bit for bit: the phrase embeddings, the kNN cosine scores
(hippo_gpu.indexing.vector_search.knn, whose float32 scores the synonym weights are) and the query
encoder.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from hippo_gpu import Searcher, build_index
from hippo_gpu.config import RetrievalConfig
from hippo_gpu.data import as_passages, read_openie
from hippo_gpu.indexing.vector_search import knn
from hippo_gpu.retrieval import hipporag1 as v1
from hippo_gpu.retrieval.entities import heuristic_entities
from hippo_gpu.retrieval.solvers import build_solver
from hippo_gpu.sample import paths
from tests.reference import dense_adjacency, dense_ppr

CFG64 = RetrievalConfig(dtype="float64", ppr_tol=1e-13)
ATOL = 1e-9

# A tiny corpus with every awkward case of the v1 graph: a triple repeated inside one passage
# (dropped on read, as HippoRAG 2's filter does) and across passages (counted twice), raw texts
# that normalise to one phrase ("marta quill!"), a near-duplicate phrase with the identical
# embedding ("marta  quill": the encoder ignores the double space, cos = 1, a mutual synonym
# pair, and an exact tie when linking), a fact pair with one synonym orientation ("the uk" ->
# "uk": "uk" has too few characters to get synonyms of its own, so S[(uk, the uk)] stays the
# count), a fact whose subject is its object, a passage without triples, a passage that
# mentions both ends of a fact it does not state (D' != D), and a disconnected component.
TINY_TRIPLES = {
    "Quill": ("Marta Quill invented the tidal clock and was born in Harrowgate.",
              [["Marta Quill", "invented", "tidal clock"], ["Marta Quill", "born in", "Harrowgate"],
               ["Marta Quill", "invented", "tidal clock"],
               ["marta quill!", "profession", "instrument maker"]]),
    "Harrowgate": ("Harrowgate lies on the River Selden and is a port of the UK.",
                   [["Harrowgate", "lies on", "River Selden"], ["Harrowgate", "port of", "the UK"],
                    ["the UK", "abbreviated", "UK"]]),
    "Tidal clock": ("The tidal clock was invented by Marta Quill.",
                    [["tidal clock", "invented by", "Marta  Quill"],
                     ["Marta Quill", "invented", "tidal clock"]]),
    "River Selden": ("The River Selden flows through Harrowgate into the North Sea.",
                     [["The River Selden", "flows into", "the North Sea"],
                      ["River Selden", "flows through", "Harrowgate"]]),
    "Lumen Museum": ("The Lumen Museum displays the tidal clock.",
                     [["Lumen Museum", "is", "Lumen Museum"],
                      ["Lumen Museum", "displays", "tidal clock"]]),
    "Empty": ("A passage from which nothing was extracted.", []),
    "Visitors": ("Marta Quill visited the Lumen Museum, which Harrowgate hosts.",
                 [["Marta Quill", "visited", "Lumen Museum"],
                  ["Harrowgate", "hosts", "Lumen Museum"]]),
    "Skerrow": ("The Skerrow lighthouse was designed by Edwin Pell.",
                [["Skerrow lighthouse", "designed by", "Edwin Pell"]]),
}
TINY_ENTITIES = [["Marta Quill"], ["the UK", "River Selden"], [], ["Edwin Pell"],
                 ["lumen museum", "Lumen Museum!"], ["Nonexistent Person"]]
SAMPLE_ENTITIES_EXTRA = [["tidal clock"], ["Lumen Museum", "Edwin Pell"], []]


def tiny_corpus() -> tuple[list[dict], dict]:
    corpus = [{"title": t, "text": text} for t, (text, _) in TINY_TRIPLES.items()]
    openie = {"docs": [{"passage": f"{t}\n{text}", "extracted_triples": triples}
                       for t, (text, triples) in TINY_TRIPLES.items()]}
    return corpus, openie


# --- the reference ------------------------------------------------------------------------------

def _norm(s: str) -> str:  # v1's processing_phrases
    return re.sub("[^A-Za-z0-9 ]", " ", s.lower()).strip()


def _minmax(x: np.ndarray) -> np.ndarray:
    rng = x.max() - x.min()
    return np.ones_like(x) if rng == 0 else (x - x.min()) / rng


class V1Reference:
    """Legacy v1 from the raw OpenIE docs, one query at a time (create_graph.py + hipporag.py)."""

    def __init__(self, openie_docs: list[dict], index, *, derived: bool = False,
                 repeats: bool = False) -> None:
        # per passage: clean triples. With `repeats` every occurrence counts in the graph, as in
        # create_graph.py; without, raw exact repeats inside a passage count once, as the index
        # keeps them (what a Searcher sees, without the OpenIE docs)
        triples, occurrences = [], []
        for d in openie_docs:
            seen, clean = set(), []
            for t in d["extracted_triples"]:
                if tuple(t) not in seen:
                    seen.add(tuple(t))
                    clean.append(tuple(_norm(x) for x in t))
            triples.append(clean)
            occurrences.append([tuple(_norm(x) for x in t) for t in d["extracted_triples"]]
                               if repeats else clean)
        self.phrases = sorted({t[i] for ts in triples for t in ts for i in (0, 2)})
        assert self.phrases == index.phrases  # rows line up with the index's
        pid = {p: i for i, p in enumerate(self.phrases)}
        facts = sorted({t for ts in triples for t in ts})
        fid = {f: i for i, f in enumerate(facts)}
        m, f, p = len(self.phrases), len(facts), len(triples)

        graph: dict[tuple[int, int], float] = {}  # graph_plus: ordered pair -> weight
        for ts in occurrences:
            for s, _, o in ts:
                a, b = pid[s], pid[o]
                graph[(a, b)] = graph.get((a, b), 0.0) + 1.0
                graph[(b, a)] = graph.get((b, a), 0.0) + 1.0
        scores, ids = knn(index.phrase_emb, m, backend="faiss-flat")  # all M, descending
        for u, phrase in enumerate(self.phrases):
            if len(re.sub("[^A-Za-z0-9]", "", phrase)) <= 2:
                continue
            accepted = 0
            for nn, score in zip(ids[u].tolist(), scores[u].tolist()):
                if score < 0.8 or accepted > 100:
                    break
                if nn != u:
                    graph[(u, nn)] = 1.0 * score  # overwrites a fact count
                    accepted += 1
        edges = [e for e in graph if e[0] != e[1]]  # build_graph: a set of ordered pairs
        self.w = dense_adjacency(np.array(edges, dtype=np.int64).reshape(-1, 2),
                                 np.array([graph[e] for e in edges]), m)

        self.docs_to_facts = np.zeros((p, f))
        for pi, ts in enumerate(triples):
            for t in ts:
                self.docs_to_facts[pi, fid[t]] = 1.0
        self.facts_to_phrases = np.zeros((f, m))
        for t, j in fid.items():
            self.facts_to_phrases[j, pid[t[0]]] = self.facts_to_phrases[j, pid[t[2]]] = 1.0
        doc_phrases = (self.docs_to_facts @ self.facts_to_phrases) > 0
        self.num_doc = doc_phrases.sum(axis=0)
        if derived:  # D': a passage "states" every fact whose two ends it mentions
            self.docs_to_facts = np.array(
                [[float(doc_phrases[pi, pid[t[0]]] and doc_phrases[pi, pid[t[2]]])
                  for t in facts] for pi in range(p)])
        self.phrase_emb = index.phrase_emb.double().numpy()

    def scores(self, entity_emb: np.ndarray | None, damping: float = 0.5) -> np.ndarray:
        """[P] v1 rank_docs scores of one query (entity_emb: [E, D] of its entities, or None)."""
        p = self.docs_to_facts.shape[0]
        if entity_emb is None:
            return np.ones(p) / p
        weights = np.zeros(len(self.phrases))
        for row in np.argmax(entity_emb @ self.phrase_emb.T, axis=1):
            weights[row] = 1.0 / self.num_doc[row] if self.num_doc[row] else 1.0
        ppr = dense_ppr(self.w, weights[:, None], damping=damping)[:, 0]
        return _minmax(self.docs_to_facts @ (self.facts_to_phrases @ ppr))


def reference_scores(ref: V1Reference, searcher: Searcher, entities) -> np.ndarray:
    out = []
    for ents in entities:
        emb = searcher.encoder.encode([_norm(e) for e in ents]).double().numpy() if ents else None
        out.append(ref.scores(emb))
    return np.stack(out)


# --- helpers ------------------------------------------------------------------------------------

def full_scores(ranking, p: int) -> np.ndarray:
    """[Q, P] scores by passage row from a Ranking of top_k = P."""
    out = np.full((ranking.passage_rows.shape[0], p), np.nan)
    rows = ranking.passage_rows.numpy()
    np.put_along_axis(out, rows, ranking.scores.double().numpy(), axis=1)
    return out


def assert_ranking(rows: list[int], ref: np.ndarray, atol: float = ATOL) -> None:
    """`rows` ranks every passage by the reference scores, best first, ties by the lower row."""
    assert sorted(rows) == list(range(len(ref)))
    for a, b in zip(rows, rows[1:]):
        assert ref[a] >= ref[b] - atol, (a, b, ref[a], ref[b])
        if abs(ref[a] - ref[b]) <= atol:
            assert a < b, (a, b, ref[a])


def functional_scores(searcher, graph, entities, cfg=CFG64):
    texts, owner = v1.flatten_entities(entities)
    rows = v1.link_entities(searcher.encoder.encode(texts), searcher.index.phrase_emb)
    scores, has, _ = v1.passage_scores(graph, build_solver(graph.adjacency, cfg.ppr), rows,
                                    torch.tensor(owner, dtype=torch.int64), len(entities))
    return scores.numpy(), has


# --- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(sample_searcher):
    corpus, openie = tiny_corpus()
    index = build_index(corpus, openie, None, device="cpu", encoder=sample_searcher.encoder)
    searcher = Searcher(index, encoder=sample_searcher.encoder)
    docs, _ = read_openie(openie, as_passages(corpus))
    return index, searcher, openie["docs"], docs


@pytest.fixture(scope="module")
def sample(sample_index, sample_searcher):
    files = paths()
    raw = json.loads(files["openie"].read_text())["docs"]
    docs, _ = read_openie(files["openie"], as_passages(files["corpus"]))
    questions = json.loads(files["questions"].read_text())
    ents = heuristic_entities([q["question"] for q in questions]) + SAMPLE_ENTITIES_EXTRA
    return sample_index, sample_searcher, raw, docs, ents


def _cases(tiny, sample):
    t_index, t_searcher, t_raw, t_docs = tiny
    s_index, s_searcher, s_raw, s_docs, s_ents = sample
    return [(t_index, t_searcher, t_raw, t_docs, TINY_ENTITIES),
            (s_index, s_searcher, s_raw, s_docs, s_ents)]


# --- tests --------------------------------------------------------------------------------------

def test_phrase_graph_is_eq1_in_float64(tiny, sample):
    for index, _, raw, _, _ in _cases(tiny, sample):
        graph = v1.build_v1_graph(index)
        assert graph.weights == "reconstructed"
        ref = V1Reference(raw, index)
        np.testing.assert_array_equal(graph.adjacency.to_dense().numpy(), ref.w)
        # ... which is the phrase block of the index's own (float32) graph
        m = len(index.phrases)
        block = index.adjacency.to_dense()[:m, :m]
        torch.testing.assert_close(graph.adjacency.to_dense().float(), block, atol=0, rtol=0)


def test_tiny_graph_weights_by_hand(tiny):
    index, *_ = tiny
    w = v1.build_v1_graph(index).adjacency.to_dense().numpy()
    row = index.row_of_phrase
    mq, tc = row["marta quill"], row["tidal clock"]
    assert w[mq, tc] == 4.0  # one fact stated by two passages: c = 2, both orientations
    uk, the_uk = row["uk"], row["the uk"]
    s = float(torch.dot(index.phrase_emb[the_uk], index.phrase_emb[uk]))
    assert 0.8 <= s < 1 and abs(w[uk, the_uk] - (1.0 + s)) < 1e-6  # c + one synonym orientation
    lm = row["lumen museum"]
    assert w[lm, lm] == 0.0  # a fact whose subject is its object: a self-loop, dropped


def test_openie_docs_count_repeated_triples_as_v1(tiny, sample):
    for index, _, raw, docs, _ in _cases(tiny, sample):
        graph = v1.build_v1_graph(index, openie_docs=docs)
        assert graph.weights == "reconstructed"
        np.testing.assert_array_equal(graph.adjacency.to_dense().numpy(),
                                      V1Reference(raw, index, repeats=True).w)
    index, _, _, docs = tiny
    row = index.row_of_phrase
    mq, tc = row["marta quill"], row["tidal clock"]
    # stated twice in "Quill" and once in "Tidal clock": c = 3 in v1, 2 from the index alone
    assert v1.build_v1_graph(index, openie_docs=docs).adjacency.to_dense()[mq, tc] == 6.0
    assert v1.build_v1_graph(index).adjacency.to_dense()[mq, tc] == 4.0
    keys, extra = v1.fact_repeats(index, docs)
    assert keys.tolist() == [min(mq, tc) * len(index.phrases) + max(mq, tc)]
    assert extra.tolist() == [1.0]


def test_exact_passage_facts_match_reference(tiny, sample):
    for index, searcher, raw, docs, ents in _cases(tiny, sample):
        graph = v1.build_v1_graph(index, openie_docs=docs)
        assert graph.passage_facts == "openie"
        got, has = functional_scores(searcher, graph, ents)
        want = reference_scores(V1Reference(raw, index, repeats=True), searcher, ents)
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
        assert has.tolist() == [bool(e) for e in ents]


def test_searcher_mode_matches_reference_with_exact_facts(tiny, sample):
    for index, searcher, raw, docs, ents in _cases(tiny, sample):
        p = len(index.passage_keys)
        queries = [f"query {i}" for i in range(len(ents))]
        r = searcher.rank(queries, top_k=p, mode="hipporag1", config=CFG64, query_entities=ents)
        stored = set(zip(*(a.tolist() for a in v1.stored_passage_facts(index))))
        assert stored == set(zip(*(a.tolist() for a in v1.passage_facts_from_openie(index, docs))))
        want = reference_scores(V1Reference(raw, index), searcher, ents)
        np.testing.assert_allclose(full_scores(r, p), want, atol=ATOL, rtol=0)
        for qi in range(len(ents)):
            assert_ranking(r.passage_rows[qi].tolist(), want[qi])
        assert not r.dense_fallback.any()


def test_derived_passage_facts_are_a_superset(tiny):
    index, _, _, docs = tiny
    exact = set(zip(*(a.tolist() for a in v1.passage_facts_from_openie(index, docs))))
    derived = set(zip(*(a.tolist() for a in v1.derived_passage_facts(index))))
    assert exact < derived
    visitors = index.passage_titles.index("Visitors")
    born = index.facts.index(("marta quill", "born in", "harrowgate"))
    assert (visitors, born) in derived - exact


def test_linking_takes_the_first_nearest_phrase(tiny):
    index, searcher, _, _ = tiny
    row = index.row_of_phrase
    texts, owner = v1.flatten_entities([["Marta Quill"], ["Lumen Museum!"]])
    assert texts == ["marta quill", "lumen museum"] and owner == [0, 1]
    linked = v1.link_entities(searcher.encoder.encode(texts), index.phrase_emb).tolist()
    # "marta  quill" (double space) embeds exactly like "marta quill" and sorts first: argmax
    # returns the first maximum, as np.argmax does in v1
    assert torch.equal(index.phrase_emb[row["marta  quill"]], index.phrase_emb[row["marta quill"]])
    assert linked == [row["marta  quill"], row["lumen museum"]]


def test_queries_without_entities_score_uniformly_in_row_order(sample_index, sample_searcher):
    p = len(sample_index.passage_keys)
    ents = [[], ["tidal clock"], []]
    r = sample_searcher.rank(["a", "b", "c"], top_k=10, mode="hipporag1", query_entities=ents)
    for qi in (0, 2):
        assert r.passage_rows[qi].tolist() == list(range(10))
        torch.testing.assert_close(r.scores[qi], torch.full((10,), 1.0 / p))
    assert r.dense_fallback.tolist() == [False, False, False]
    assert r.scores[1, 0] == 1.0  # min-max: the best passage scores 1


def test_batch_composition_does_not_change_results(tiny):
    index, searcher, _, _ = tiny
    p = len(index.passage_keys)
    queries = [f"q{i}" for i in range(len(TINY_ENTITIES))]
    together = searcher.rank(queries, top_k=p, mode="hipporag1", config=CFG64,
                             query_entities=TINY_ENTITIES)
    for qi, ents in enumerate(TINY_ENTITIES):
        alone = searcher.rank([queries[qi]], top_k=p, mode="hipporag1", config=CFG64,
                              query_entities=[ents])
        assert alone.passage_rows[0].tolist() == together.passage_rows[qi].tolist()
        torch.testing.assert_close(alone.scores[0], together.scores[qi], atol=ATOL, rtol=0)


def test_float32_ranking_agrees_with_float64(sample):
    index, searcher, _, _, ents = sample
    queries = [f"q{i}" for i in range(len(ents))]
    r32 = searcher.rank(queries, top_k=5, mode="hipporag1", query_entities=ents)
    r64 = searcher.rank(queries, top_k=5, mode="hipporag1", config=CFG64, query_entities=ents)
    assert r32.scores.dtype == torch.float32 and r64.scores.dtype == torch.float64
    torch.testing.assert_close(r32.scores.double(), r64.scores, atol=1e-5, rtol=0)


def test_unverifiable_weights_fall_back_to_the_stored_block(tiny):
    index, *_ = tiny
    m = len(index.phrases)
    dense = index.adjacency.to_dense()
    u, v = (int(x) for x in torch.nonzero(dense[:m, :m])[0])  # a phrase-phrase edge
    dense[u, v] *= 1.5  # no longer what the index's own statistics give
    dense[v, u] *= 1.5
    changed = replace(index, adjacency=dense.to_sparse_csr())
    graph = v1.build_v1_graph(changed)
    assert graph.weights == "stored-float32" and graph.synonym_pairs == -1
    torch.testing.assert_close(graph.adjacency.to_dense(),
                               changed.adjacency.to_dense()[:m, :m].double(), atol=0, rtol=0)


def test_openie_of_another_index_is_rejected(tiny, sample):
    t_index = tiny[0]
    s_docs = sample[3]
    with pytest.raises(ValueError, match="OpenIE docs"):
        v1.passage_facts_from_openie(t_index, s_docs[: len(t_index.passage_keys)])
    with pytest.raises(ValueError, match="passages"):
        v1.passage_facts_from_openie(t_index, s_docs)


def test_the_searcher_builds_the_v1_structures_once(tiny):
    index, _, _, _ = tiny
    searcher = Searcher(index, encoder=tiny[1].encoder)
    searcher.rank(["q"], top_k=3, mode="hipporag1", query_entities=[["Harrowgate"]])
    graph = searcher.entities.v1_graph
    r = searcher.rank(["q"], top_k=3, mode="hipporag1", query_entities=[["Harrowgate"]])
    assert searcher.entities.v1_graph is graph and "graph" not in r.stage_seconds
