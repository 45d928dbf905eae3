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
