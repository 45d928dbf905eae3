"""All kNN backends agree with an exact float64 reference on a small set."""

import numpy as np
import pytest
import torch

from hippo_gpu.synonyms import knn


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
    from hippo_gpu.synonyms import knn_recall

    _, exact = knn(vectors, 10, backend="faiss-flat")
    assert knn_recall(vectors, exact, sample=200) == pytest.approx(1.0)
    shuffled = exact.clone()
    shuffled[:, 5:] = (shuffled[:, 5:] + 500) % 1000  # half of each row replaced: wrong ids
    assert knn_recall(vectors, shuffled, sample=1000) == pytest.approx(0.5, abs=0.02)
