"""Edge semantics on a hand-made corpus, with the expected adjacency written out."""

import numpy as np
import torch

from hippo_gpu.config import GraphConfig
from hippo_gpu.data import OpenIEDoc
from hippo_gpu.indexing.graph import build_graph, extract_elements, fact_text, normalize_text
from hippo_gpu.indexing.synonyms import SynonymEdges, select_synonym_edges


def test_normalize_text_is_upstreams_text_processing():
    assert normalize_text("  Barack  Obama!  ") == "barack  obama"  # inner runs kept
    assert normalize_text("U.S.A.") == "u s a"
    assert normalize_text("$") == ""
    assert fact_text(("a b", "born in", "c")) == "('a b', 'born in', 'c')"


def _docs():
    return [
        OpenIEDoc(entities=(), triples=(("Alice", "knows", "Bob"), ("alice", "likes", "BOB!"))),
        OpenIEDoc(entities=(), triples=(("Bob", "lives in", "Paris"),)),
        OpenIEDoc(entities=(), triples=()),  # no triples: isolated passage node
    ]


def test_elements_phrases_facts_counts():
    el = extract_elements(_docs())
    assert el.phrases == ["alice", "bob", "paris"]
    assert el.facts == [("alice", "knows", "bob"), ("alice", "likes", "bob"),
                        ("bob", "lives in", "paris")]
    pairs = {(int(s), int(d)): c for s, d, c in
             zip(el.fact_pair_src, el.fact_pair_dst, el.fact_pair_count)}
    assert pairs == {(0, 1): 2.0, (1, 0): 2.0, (1, 2): 1.0, (2, 1): 1.0}
    inc = sorted(zip(el.passage_phrase_passage.tolist(), el.passage_phrase_phrase.tolist()))
    assert inc == [(0, 0), (0, 1), (1, 1), (1, 2)]


def test_adjacency_written_out():
    el = extract_elements(_docs())
    # synonyms: alice->bob 0.9 (overwrites the fact count 2 on that orientation only),
    # paris->bob 0.85 (one orientation of the bob-paris fact pair)
    syn = SynonymEdges(src=np.array([0, 2]), dst=np.array([1, 1]), score=np.array([0.9, 0.85]))
    g = build_graph(el, syn, GraphConfig())
    # nodes: alice 0, bob 1, paris 2, passage0 3, passage1 4, passage2 5
    want = np.zeros((6, 6))
    want[0, 1] = want[1, 0] = 0.9 + 2.0  # stats[(a,b)] = 0.9 (overwritten), stats[(b,a)] = 2
    want[1, 2] = want[2, 1] = 1.0 + 0.85  # stats[(b,p)] = 1, stats[(p,b)] = 0.85 (overwritten)
    want[3, 0] = want[0, 3] = 1.0
    want[3, 1] = want[1, 3] = 1.0
    want[4, 1] = want[1, 4] = 1.0
    want[4, 2] = want[2, 4] = 1.0
    got = g.adjacency.to_dense().double().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert g.adjacency.layout == torch.sparse_csr and g.adjacency.dtype == torch.float32
    assert g.passage_nodes.tolist() == [3, 4, 5]
    # upstream graph_info: edges = 4 fact keys + 0 new synonym keys + 4 passage keys
    assert g.counts["edges"] == 8 and g.counts["passage_edges"] == 4
    assert g.counts["facts"] == 3 and g.counts["synonym_edges"] == 8 - 3 - 4

    added = build_graph(el, syn, GraphConfig(synonym_overwrites_facts=False))
    assert abs(float(added.adjacency.to_dense()[0, 1]) - (2.9 + 2.0)) < 1e-6


def test_self_pairs_dropped_but_counted_as_upstream_keys():
    el = extract_elements([OpenIEDoc((), (("x", "is", "X"),))])
    none = SynonymEdges(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
    g = build_graph(el, none, GraphConfig())
    dense = g.adjacency.to_dense()
    assert dense[0, 0] == 0 and dense[0, 1] == 1 and dense[1, 0] == 1
    assert g.counts["edges"] == 2  # (x, x) fact key + (passage, x)


def test_synonym_walk_semantics():
    phrases = ["alpha", "alpha co", "", "ab", "beta"]
    # neighbours per row in descending order (row, then self, then others)
    ids = torch.tensor([[0, 1, 2, 4, 3],
                        [1, 0, 4, 3, 2],
                        [2, 0, 1, 3, 4],
                        [3, 0, 1, 2, 4],
                        [4, 2, 0, 1, 3]])
    scores = torch.tensor([[1.0, 0.95, 0.9, 0.85, 0.5],
                           [1.0, 0.95, 0.79, 0.9, 0.1],  # stops at 0.79 even though 0.9 follows
                           [1.0, 0.9, 0.9, 0.9, 0.9],
                           [1.0, 0.99, 0.99, 0.99, 0.99],
                           [1.0, 0.99, 0.97, 0.96, 0.95]])
    cfg = GraphConfig(synonym_threshold=0.8, synonym_max_neighbors=2)
    e = select_synonym_edges(phrases, scores, ids, cfg)
    got = sorted(zip(e.src.tolist(), e.dst.tolist(), [round(float(s), 2) for s in e.score]))
    # row 0: skip self, accept 1, skip empty (2), accept 4, then the cap of 2 is reached
    # row 1: accept 0, stop at 0.79; row 2 is the empty phrase and row 3 ('ab') has <= 2 alnum
    # chars: no edges; row 4: skip empty, accept 0 and 1 (cap)
    assert got == [(0, 1, 0.95), (0, 4, 0.85), (1, 0, 0.95), (4, 0, 0.97), (4, 1, 0.96)]


def _reference_elements(docs):
    """The per-triple Python construction (the pre-vectorisation code), as an oracle."""
    per_doc, phrase_set, fact_set = [], set(), set()
    for doc in docs:
        triples = [tuple(normalize_text(x) for x in t) for t in doc.triples]
        per_doc.append(triples)
        for s, _, o in triples:
            phrase_set.update((s, o))
        fact_set.update(triples)
    phrases, facts = sorted(phrase_set), sorted(fact_set)
    row = {p: i for i, p in enumerate(phrases)}
    pair_count: dict[tuple[int, int], int] = {}
    inc = set()
    occurrences = []
    for d, triples in enumerate(per_doc):
        for s, _, o in triples:
            for a, b in ((row[s], row[o]), (row[o], row[s])):
                pair_count[(a, b)] = pair_count.get((a, b), 0) + 1
            inc.update(((d, row[s]), (d, row[o])))
        occurrences.append(list(triples))
    return phrases, facts, pair_count, sorted(inc), occurrences


def test_vectorised_elements_equal_the_per_triple_reference_on_musique():
    from hippo_gpu.data import read_corpus, read_openie
    from tests.helpers import musique_or_skip

    data = musique_or_skip()
    passages = read_corpus(data / "corpus.json")
    docs, _ = read_openie(data / "openie_gpt-3.5-turbo-1106.json", passages)
    phrases, facts, pair_count, inc, occurrences = _reference_elements(docs)
    el = extract_elements(docs)
    assert (len(el.phrases), len(el.facts)) == (16235, 17036)  # the official counts
    assert el.phrases == phrases and list(el.facts) == facts
    row = {p: i for i, p in enumerate(phrases)}
    np.testing.assert_array_equal(el.fact_phrases, [[row[s], row[o]] for s, _, o in facts])
    got = {(int(s), int(d)): c for s, d, c in
           zip(el.fact_pair_src, el.fact_pair_dst, el.fact_pair_count)}
    assert got == pair_count
    assert list(zip(el.passage_phrase_passage.tolist(), el.passage_phrase_phrase.tolist())) == inc
    rows = [[el.facts[r] for r in el.occurrence_fact[el.occurrence_ptr[p]:
                                                    el.occurrence_ptr[p + 1]]]
            for p in range(len(docs))]
    assert rows == occurrences


def test_elements_of_pre_normalised_triples_are_the_same():
    el = extract_elements(_docs())
    again = extract_elements([[tuple(normalize_text(x) for x in t) for t in d.triples]
                              for d in _docs()], normalized=True)
    assert again.phrases == el.phrases and again.facts == el.facts
    np.testing.assert_array_equal(again.fact_pair_count, el.fact_pair_count)
    assert el.predicates == ["knows", "likes", "lives in"]
    np.testing.assert_array_equal(el.occurrence_ptr, [0, 2, 3, 3])
    np.testing.assert_array_equal(el.occurrence_fact, [0, 1, 2])
