"""All kNN backends agree with an exact float64 reference on a small set."""

import numpy as np
import pytest
import torch

from hippo_gpu.vector_search import knn


@pytest.fixture(scope="module")
def vectors():
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(40, 32, generator=g)
    x = centers.repeat_interleave(25, 0) + 0.3 * torch.randn(1000, 32, generator=g)
    return torch.nn.functional.normalize(x, dim=1)


def _reference(x, k):
    sim = (x.double() @ x.double().T).numpy()
    ids = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(sim, ids, 1), ids


@pytest.mark.parametrize("backend", ["faiss-flat", "torch"])
def test_exact_backends_match_reference(vectors, backend):
    k = 12
    ref_s, ref_i = _reference(vectors, k)
    s, i = knn(vectors, k, backend=backend)
    assert s.shape == (1000, k) and i.dtype == torch.int64
    np.testing.assert_allclose(s.numpy(), ref_s, atol=1e-5)
    # same neighbour sets (order may differ only among float ties)
    same = np.mean([set(a) == set(b) for a, b in zip(i.numpy(), ref_i)])
    assert same > 0.99


@pytest.mark.parametrize("backend", ["faiss-hnsw", "faiss-ivf"])
def test_approximate_backends_reach_high_recall(vectors, backend):
    k = 10
    _, ref_i = _reference(vectors, k)
    _, i = knn(vectors, k, backend=backend, ivf_probe=8)
    recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(i.numpy(), ref_i)])
    assert recall > 0.9, recall


def test_k_is_clipped_and_bad_input_rejected(vectors):
    s, i = knn(vectors[:5], 50, backend="faiss-flat")
    assert s.shape == (5, 5)
    with pytest.raises(ValueError):
        knn(vectors[0], 3)
    with pytest.raises(ValueError, match="unknown"):
        knn(vectors, 3, backend="nope")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_backend_on_cuda_matches_cpu(vectors):
    s_cpu, i_cpu = knn(vectors, 8, backend="faiss-flat")
    s_gpu, _ = knn(vectors.cuda(), 8, backend="torch")
    np.testing.assert_allclose(s_gpu.numpy(), s_cpu.numpy(), atol=1e-4)


def test_knn_recall_reports_approximate_quality(vectors):
    from hippo_gpu.vector_search import knn_recall

    _, exact = knn(vectors, 10, backend="faiss-flat")
    assert knn_recall(vectors, exact, sample=200) == pytest.approx(1.0)
    shuffled = exact.clone()
    shuffled[:, 5:] = (shuffled[:, 5:] + 500) % 1000  # half of each row replaced: wrong ids
    assert knn_recall(vectors, shuffled, sample=1000) == pytest.approx(0.5, abs=0.02)


def test_auto_backend_is_exact_below_the_threshold_and_approximate_above():
    pytest.importorskip("faiss")
    from hippo_gpu.vector_search import EXACT_BELOW, resolve_knn_backend

    cpu = torch.device("cpu")
    assert resolve_knn_backend("auto", cpu, 16_235) == "faiss-flat"  # musique_train: exact
    assert resolve_knn_backend("auto", cpu, EXACT_BELOW - 1) == "faiss-flat"
    assert resolve_knn_backend("auto", cpu, EXACT_BELOW) == "ivf-join"
    assert resolve_knn_backend("faiss-flat", cpu, 10 * EXACT_BELOW) == "faiss-flat"


def test_column_chunked_exact_topk_matches_the_reference(vectors):
    from hippo_gpu.vector_search import exact_topk

    rows = np.array([0, 5, 999, 123])
    ref_s, ref_i = _reference(vectors, 9)
    s, i = exact_topk(vectors, rows, 9, column_chunk=64)  # 16 chunks, merged
    np.testing.assert_allclose(s, ref_s[rows], atol=1e-5)
    assert all(set(a) == set(b) for a, b in zip(i, ref_i[rows]))


def test_edge_recall_counts_pairs():
    from hippo_gpu.synonyms import SynonymEdges, edge_recall

    def edges(pairs):
        a = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        return SynonymEdges(a[:, 0], a[:, 1], np.ones(len(a), np.float32))

    exact = edges([(0, 1), (1, 0), (2, 3), (3, 2)])
    assert edge_recall(edges([(0, 1), (2, 3), (5, 6)]), exact) == 0.5
    assert edge_recall(edges([]), edges([])) == 1.0


def test_symmetrize_adds_reverse_pairs_drops_ineligible_and_caps_by_score():
    from hippo_gpu.synonyms import SynonymEdges, symmetrize_synonym_edges

    found = SynonymEdges(np.array([0, 1, 0, 0, 3]), np.array([1, 0, 2, 3, 2]),
                         np.array([0.9, 0.9, 0.85, 0.95, 0.8], np.float32))
    eligible = np.array([True, True, False, True])  # phrase 2 gets no list of its own
    got = symmetrize_synonym_edges(found, eligible, max_neighbors=2)
    pairs = {(int(s), int(d)): float(w) for s, d, w in zip(got.src, got.dst, got.score)}
    # 0's candidates 1 (0.9), 2 (0.85), 3 (0.95): the best two; 3 gets 0 back; 2 gets nothing
    assert pairs == pytest.approx({(0, 3): 0.95, (0, 1): 0.9, (1, 0): 0.9, (3, 0): 0.95,
                                   (3, 2): 0.8})
