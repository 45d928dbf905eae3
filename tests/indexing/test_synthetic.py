"""hippo_gpu.synthetic: seeded, HippoRAG-2-shaped graphs and reset vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hippo_gpu.ppr import personalized_pagerank
from hippo_gpu.synthetic import synthetic_graph, synthetic_reset_vectors

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


def _dense(adjacency: torch.Tensor) -> np.ndarray:
    return adjacency.to_dense().numpy()


def test_graph_is_seeded_symmetric_and_shaped() -> None:
    g = synthetic_graph(300, seed=7)
    again = synthetic_graph(300, seed=7)
    other = synthetic_graph(300, seed=8)
    a = _dense(g.adjacency)
    assert g.adjacency.layout == torch.sparse_csr and g.adjacency.dtype == torch.float32
    np.testing.assert_array_equal(a, _dense(again.adjacency))
    assert not np.array_equal(a, _dense(other.adjacency))
    np.testing.assert_array_equal(a, a.T)
    assert (a >= 0).all() and np.all(np.diag(a) == 0)
    n, p = g.num_nodes, g.num_passages
    assert p == 300 and n == 6 * p and g.num_phrases == n - p
    torch.testing.assert_close(g.passage_nodes, torch.arange(n - p, n))
    # Passages link only to phrases, with weight 1 per distinct phrase.
    passage_block = a[n - p :]
    assert np.all(passage_block[:, n - p :] == 0)
    assert set(np.unique(passage_block)) <= {0.0, 1.0}
    entries_per_passage = g.adjacency.values().numel() / p
    assert 40 <= entries_per_passage <= 80  # issue: ~60 directed entries per passage
    counts = (passage_block[:, : n - p] > 0).sum(0)
    np.testing.assert_array_equal(counts, g.phrase_passage_count)
    assert counts.min() >= 1  # every phrase is mentioned by some passage
    assert counts.max() > 10 * np.median(counts)  # heavy-tailed phrase popularity


def test_reset_vectors_are_hipporag2_shaped() -> None:
    g = synthetic_graph(500, seed=1)
    reset = synthetic_reset_vectors(g, 16, seed=3)
    v = g.num_phrases
    assert reset.shape == (g.num_nodes, 16) and reset.dtype == torch.float64
    assert bool((reset >= 0).all())
    phrase_nonzero = (reset[:v] > 0).sum(0)
    assert bool((phrase_nonzero >= 1).all()) and bool((phrase_nonzero <= 5).all())
    passage = reset[v:]
    torch.testing.assert_close(passage.max(0).values, torch.full((16,), 0.05, dtype=torch.float64))
    torch.testing.assert_close(passage.min(0).values, torch.zeros(16, dtype=torch.float64))
    torch.testing.assert_close(reset, synthetic_reset_vectors(g, 16, seed=3))
    x = personalized_pagerank(g.adjacency, reset.float())
    torch.testing.assert_close(x.sum(0), torch.ones(16), atol=1e-5, rtol=0)


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError):
        synthetic_graph(0)
    with pytest.raises(ValueError):
        synthetic_reset_vectors(synthetic_graph(5), 0)


# --- synthetic corpora (users' input formats) ---------------------------------------------------


def test_corpus_is_deterministic_by_seed(tmp_path) -> None:
    from hippo_gpu.synthetic import synthetic_corpus

    a = synthetic_corpus(400, seed=3).write(tmp_path / "a")
    b = synthetic_corpus(400, seed=3).write(tmp_path / "b")
    c = synthetic_corpus(400, seed=4).write(tmp_path / "c")
    for kind in ("corpus", "openie"):
        assert a[kind].read_bytes() == b[kind].read_bytes()
        assert a[kind].read_bytes() != c[kind].read_bytes()


def test_written_files_read_back_as_the_in_memory_types(tmp_path) -> None:
    from dataclasses import replace

    from hippo_gpu.data import read_corpus, read_openie
    from hippo_gpu.synthetic import synthetic_corpus

    corpus = synthetic_corpus(300, seed=1)
    files = corpus.write(tmp_path)
    passages = read_corpus(files["corpus"])
    docs, report = read_openie(files["openie"], passages)
    assert passages == corpus.passages()
    # the file states some triples twice in a passage; read_openie keeps each once and counts
    # the repeats in raw_counts, which the in-memory docs (deduplicated) do not carry
    assert any(d.raw_counts for d in docs)
    assert all(c >= 1 for d in docs for c in d.repeat_counts())
    docs = [replace(d, raw_counts=()) for d in docs]
    assert docs == corpus.docs()
    assert report.malformed_triples == {} and report.missing_passages == 0
    assert report.passages_without_triples == 0
    # every passage's text states its triples, and its title is its first subject
    for p, d in zip(passages[:20], docs[:20]):
        assert p.title == d.triples[0][0]
        assert all(f"{s} {r} {o}." in p.text for s, r, o in d.triples)
    # a range of rows builds those rows only, the same objects as the whole list's
    for start, stop in ((0, 0), (0, 1), (117, 160), (299, None), (250, 10_000)):
        assert corpus.passages(start, stop) == passages[start:stop]
        assert corpus.docs(start, stop) == docs[start:stop]


def test_statistics_of_hand_made_docs() -> None:
    from hippo_gpu.data import OpenIEDoc
    from hippo_gpu.synthetic import corpus_statistics

    docs = [OpenIEDoc((), (("A", "is", "B"), ("A", "has", "C!"))),
            OpenIEDoc((), (("a", "is", "D"),)),
            OpenIEDoc((), (("E", "near", "F"), ("F", "near", "e")))]
    s = corpus_statistics(docs)
    # phrases a b c d e f (normalised: "A" = "a", "C!" = "c", "e" = "E"); a in 2 passages
    assert s["facts_per_passage"] == round(5 / 3, 4)
    assert s["phrases_per_passage"] == 2.0
    assert s["distinct_phrases_per_passage"] == round((3 + 2 + 2) / 3, 4)
    assert s["single_passage_phrases"] == round(5 / 6, 4)
    assert s["max_phrase_passages"] == 2.0
    assert s["predicates_per_passage"] == 1.0  # is, has, near


def test_statistics_match_musique_train() -> None:
    from hippo_gpu.embed import HashEncoder
    from hippo_gpu.synthetic import MUSIQUE_STATISTICS, corpus_statistics, synthetic_corpus

    s = corpus_statistics(synthetic_corpus(20_000, seed=0).docs(), embed=HashEncoder(64))
    for key, want in MUSIQUE_STATISTICS.items():
        tol = 0.03 if key == "single_passage_phrases" else 0.05 * want
        assert abs(s[key] - want) <= tol, (key, s[key], want)
    assert 0.3 <= s["zipf_slope"] <= 0.7  # musique_train: 0.52
    assert 0.08 <= s["near_duplicate_phrases"] <= 0.25  # musique_train (hash:64): 0.15


def test_statistics_of_musique_train_are_the_recorded_ones() -> None:
    from hippo_gpu.data import read_corpus, read_openie
    from hippo_gpu.synthetic import MUSIQUE_STATISTICS, corpus_statistics
    from tests.helpers import musique_or_skip

    data = musique_or_skip()
    passages = read_corpus(data / "corpus.json")
    docs, _ = read_openie(data / "openie_gpt-3.5-turbo-1106.json", passages)
    s = corpus_statistics(docs)
    for key, want in MUSIQUE_STATISTICS.items():
        assert abs(s[key] - want) <= 0.01, (key, s[key], want)


def test_corpus_bad_arguments_raise() -> None:
    from hippo_gpu.synthetic import corpus_statistics, synthetic_corpus

    with pytest.raises(ValueError, match="num_passages"):
        synthetic_corpus(0)
    with pytest.raises(ValueError, match="variant_rate"):
        synthetic_corpus(10, variant_rate=1.0)
    with pytest.raises(ValueError, match="at least one doc"):
        corpus_statistics([])
