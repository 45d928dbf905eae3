"""All kNN backends agree with an exact float64 reference on a small set."""

import numpy as np
import pytest
import torch

from hippo_gpu.indexing.vector_search import knn


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
    from hippo_gpu.indexing.vector_search import knn_recall

    _, exact = knn(vectors, 10, backend="faiss-flat")
    assert knn_recall(vectors, exact, sample=200) == pytest.approx(1.0)
    shuffled = exact.clone()
    shuffled[:, 5:] = (shuffled[:, 5:] + 500) % 1000  # half of each row replaced: wrong ids
    assert knn_recall(vectors, shuffled, sample=1000) == pytest.approx(0.5, abs=0.02)


def test_auto_backend_is_exact_below_the_threshold_and_approximate_above():
    pytest.importorskip("faiss")
    from hippo_gpu.indexing.vector_search import EXACT_BELOW, resolve_knn_backend

    cpu = torch.device("cpu")
    assert resolve_knn_backend("auto", cpu, 16_235) == "faiss-flat"  # musique_train: exact
    assert resolve_knn_backend("auto", cpu, EXACT_BELOW - 1) == "faiss-flat"
    assert resolve_knn_backend("auto", cpu, EXACT_BELOW) == "ivf-join"
    assert resolve_knn_backend("faiss-flat", cpu, 10 * EXACT_BELOW) == "faiss-flat"


def test_column_chunked_exact_topk_matches_the_reference(vectors):
    from hippo_gpu.indexing.vector_search import exact_topk

    rows = np.array([0, 5, 999, 123])
    ref_s, ref_i = _reference(vectors, 9)
    s, i = exact_topk(vectors, rows, 9, column_chunk=64)  # 16 chunks, merged
    np.testing.assert_allclose(s, ref_s[rows], atol=1e-5)
    assert all(set(a) == set(b) for a, b in zip(i, ref_i[rows]))


def test_edge_recall_counts_pairs():
    from hippo_gpu.indexing.synonyms import SynonymEdges, edge_recall

    def edges(pairs):
        a = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        return SynonymEdges(a[:, 0], a[:, 1], np.ones(len(a), np.float32))

    exact = edges([(0, 1), (1, 0), (2, 3), (3, 2)])
    assert edge_recall(edges([(0, 1), (2, 3), (5, 6)]), exact) == 0.5
    assert edge_recall(edges([]), edges([])) == 1.0


def test_symmetrize_adds_reverse_pairs_drops_ineligible_and_caps_by_score():
    from hippo_gpu.indexing.synonyms import SynonymEdges, symmetrize_synonym_edges

    found = SynonymEdges(np.array([0, 1, 0, 0, 3]), np.array([1, 0, 2, 3, 2]),
                         np.array([0.9, 0.9, 0.85, 0.95, 0.8], np.float32))
    eligible = np.array([True, True, False, True])  # phrase 2 gets no list of its own
    got = symmetrize_synonym_edges(found, eligible, max_neighbors=2)
    pairs = {(int(s), int(d)): float(w) for s, d, w in zip(got.src, got.dst, got.score)}
    # 0's candidates 1 (0.9), 2 (0.85), 3 (0.95): the best two; 3 gets 0 back; 2 gets nothing
    assert pairs == pytest.approx({(0, 3): 0.95, (0, 1): 0.9, (1, 0): 0.9, (3, 0): 0.95,
                                   (3, 2): 0.8})


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                         reason="needs CUDA"))])
@pytest.mark.parametrize("max_neighbors", [8, 101])
def test_synonym_update_equals_the_rule_on_the_changed_set(max_neighbors, device):
    """update_synonym_rows (kept lists renumbered + recomputed ones; the added rows' top-k
    merged from the scan's blocks, the other affected rows' from their own search) against
    the walk over a float64 exact top-k of the whole changed set."""
    from hippo_gpu.config import GraphConfig
    from hippo_gpu.indexing.synonyms import select_synonym_edges, update_synonym_rows

    cfg = GraphConfig(synonym_max_neighbors=max_neighbors)
    g = torch.Generator().manual_seed(3)
    centers = torch.randn(30, 32, generator=g)

    def near(n):  # members of random clusters: cos ~0.9 within a cluster, ~0 across
        c = centers[torch.randint(0, 30, (n,), generator=g)]
        return torch.nn.functional.normalize(c + 0.3 * torch.randn(n, 32, generator=g), dim=1)

    def rule(phrases, x):
        k = min(cfg.synonym_max_neighbors + 2, len(phrases))
        s, i = _reference(x, k)
        return select_synonym_edges(phrases, torch.from_numpy(s).float(), torch.from_numpy(i), cfg)

    old_x = near(600)
    old_phrases = [f"phrase {i}" for i in range(600)]
    removed = np.sort(np.random.default_rng(0).choice(600, 15, replace=False))
    kept_old = np.setdiff1d(np.arange(600), removed)
    # the new set: the kept old rows in order, 25 new ones inserted at random places
    slots = np.sort(np.random.default_rng(1).choice(len(kept_old) + 25, 25, replace=False))
    is_new = np.zeros(len(kept_old) + 25, dtype=bool)
    is_new[slots] = True
    added = np.nonzero(is_new)[0]
    to_new = np.full(600, -1, dtype=np.int64)
    to_new[kept_old] = np.nonzero(~is_new)[0]
    new_x = torch.empty(len(is_new), 32)
    new_x[~torch.from_numpy(is_new)] = old_x[torch.from_numpy(kept_old)]
    new_x[torch.from_numpy(is_new)] = near(25)
    new_phrases = [""] * len(is_new)
    for r, o in zip(to_new[kept_old], kept_old):
        new_phrases[r] = old_phrases[o]
    for j, r in enumerate(added):
        new_phrases[r] = f"new phrase {j}"

    kept, fresh, rows = update_synonym_rows(
        to_new, rule(old_phrases, old_x), new_phrases, new_x, added, old_x[removed], cfg,
        backend="torch", device=torch.device(device), chunk=64)  # 10 scan blocks
    assert set(added) <= set(rows) and len(rows) > len(added) + 50  # old lists recomputed too
    want = rule(new_phrases, new_x)
    got = {(int(s), int(d)): float(w) for e in (kept, fresh)
           for s, d, w in zip(e.src, e.dst, e.score)}
    ref = {(int(s), int(d)): float(w) for s, d, w in zip(want.src, want.dst, want.score)}
    assert got.keys() == ref.keys() and len(ref) > 1000
    assert max(abs(got[p] - ref[p]) for p in ref) < 1e-5
