"""The inverted-file threshold join (hippo_gpu.indexing.cosine_join) against brute-force float64
pairs, and its use for synonym edges (synonyms.join_synonym_edges) against the exact walk."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hippo_gpu.config import GraphConfig
from hippo_gpu.indexing.cosine_join import (
    default_lists,
    exact_threshold_pairs,
    nearest_lists,
    probes_needed,
    spherical_kmeans,
    threshold_join,
)

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


@pytest.fixture(scope="module")
def clustered() -> torch.Tensor:
    """1,500 unit rows in 60 tight groups plus noise: many pairs above 0.8, many below."""
    g = torch.Generator().manual_seed(3)
    centers = torch.randn(60, 24, generator=g)
    x = centers.repeat_interleave(25, 0) + 0.45 * torch.randn(1500, 24, generator=g)
    return torch.nn.functional.normalize(x, dim=1)


def _reference_pairs(x: torch.Tensor, rows: np.ndarray, t: float) -> set[tuple[int, int]]:
    sim = (x.double()[torch.from_numpy(rows)] @ x.double().T).numpy()
    r, c = np.nonzero(sim >= t)
    return set(zip(rows[r].tolist(), c.tolist()))


def test_exact_threshold_pairs_match_float64(clustered) -> None:
    rows = np.array([0, 7, 300, 1499])
    s, d, sc = exact_threshold_pairs(clustered, rows, 0.8, column_chunk=100)  # 15 chunks
    assert set(zip(s.tolist(), d.tolist())) == _reference_pairs(clustered, rows, 0.8)
    np.testing.assert_allclose(sc, (clustered[s] * clustered[d]).sum(1).numpy(), atol=1e-6)


def test_join_with_every_list_probed_is_the_brute_force_join(clustered) -> None:
    cent = spherical_kmeans(clustered, 16, seed=1)
    probes = nearest_lists(clustered, cent, 16)  # all lists: nothing can be missed
    rows = np.arange(0, 1500, 3)
    s, d, sc = threshold_join(clustered, probes, rows, 0.8, row_chunk=128, block=37)
    got = list(zip(s.tolist(), d.tolist()))
    assert len(got) == len(set(got))  # each pair compared once
    assert set(got) == _reference_pairs(clustered, rows, 0.8)
    np.testing.assert_allclose(sc, (clustered[s] * clustered[d]).sum(1).numpy(), atol=1e-5)


@pytest.mark.parametrize("p", [1, 2, 4])
def test_probes_needed_predicts_exactly_what_the_join_finds(clustered, p) -> None:
    cent = spherical_kmeans(clustered, 32, seed=0)
    every = np.arange(1500)
    wide = nearest_lists(clustered, cent, 32).numpy()
    s, d, _ = exact_threshold_pairs(clustered, every, 0.8)
    keep = s != d
    s, d = s[keep], d[keep]
    need = probes_needed(s, d, wide, {i: i for i in range(1500)}, np.ones(len(d), dtype=bool))
    a, b, _ = threshold_join(clustered, nearest_lists(clustered, cent, p), every, 0.8)
    found = set(zip(a.tolist(), b.tolist()))
    sym = {(u, v) for u, v in zip(s.tolist(), d.tolist()) if (u, v) in found or (v, u) in found}
    predicted = {(u, v) for u, v, n in zip(s.tolist(), d.tolist(), need) if n <= p}
    assert sym == predicted
    assert len(predicted) > 0
    if p == 1:
        assert len(predicted) < len(s)  # one probe misses pairs here: the test has teeth


def test_kmeans_and_lists_are_deterministic_and_validated(clustered) -> None:
    a, b = spherical_kmeans(clustered, 20, seed=4), spherical_kmeans(clustered, 20, seed=4)
    assert torch.equal(a, b) and a.shape == (20, 24)
    torch.testing.assert_close(a.norm(dim=1), torch.ones(20))
    with pytest.raises(ValueError, match="nlist"):
        spherical_kmeans(clustered, 0)
    with pytest.raises(ValueError, match="positive"):
        threshold_join(clustered, nearest_lists(clustered, a, 2), np.arange(4), 0.0)
    assert default_lists(10) == 1 and default_lists(8_500_000) == 5831


def test_numba_top_p_matches_a_stable_sort_with_ties() -> None:
    from hippo_gpu.kernels.topk_cpu import top_p_rows

    rng = np.random.default_rng(0)
    sim = rng.integers(0, 6, (300, 50)).astype(np.float32)  # many ties
    sim[5] = np.nan
    sim[6, ::2] = np.nan
    for p in (1, 3, 50):
        out = top_p_rows(sim, p, np.empty((300, p), np.int32), threads=2)
        for i in range(300):
            row = np.where(np.isnan(sim[i]), -np.inf, sim[i])
            want = np.argsort(-row, kind="stable")[:p]
            valid = ~np.isnan(sim[i, want])
            assert np.array_equal(out[i][: valid.sum()], want[valid])
            assert (out[i][valid.sum():] == -1).all()
    with pytest.raises(ValueError, match="float32"):
        top_p_rows(sim.astype(np.float64), 2, np.empty((300, 2), np.int32))


def test_nearest_lists_numba_and_torch_paths_agree(clustered, monkeypatch) -> None:
    import hippo_gpu.kernels as kernels

    cent = spherical_kmeans(clustered, 40, seed=2)
    fast = nearest_lists(clustered, cent, 7, chunk=256)
    monkeypatch.setattr(kernels, "FORCE_TORCH", True)
    plain = nearest_lists(clustered, cent, 7, chunk=999)
    assert fast.dtype == torch.int16 and torch.equal(fast, plain)
    ref = torch.topk(clustered.double() @ cent.double().T, 7, dim=1).indices
    assert (fast.long() == ref).float().mean() > 0.999


# --- synonym edges from the join ---------------------------------------------------------------


@pytest.fixture(scope="module")
def phrase_set():
    from hippo_gpu.embed import HashEncoder
    from hippo_gpu.indexing.graph import extract_elements
    from hippo_gpu.synthetic import synthetic_corpus

    # 1,500 documents: 12,714 phrases, 1,998 exact edges, 226 lists of which 5 are probed (recall
    # 0.976, so the join is truly approximate and the checks below can fail); 3,000 documents
    # (25,599 phrases) cost 17 s on 2 cores instead of 3 s and test nothing more
    phrases = extract_elements(synthetic_corpus(1500, seed=9).docs()).phrases
    return phrases, torch.from_numpy(HashEncoder(64)(phrases))


def test_join_synonym_edges_against_the_exact_walk(phrase_set) -> None:
    from hippo_gpu.indexing.synonyms import (
        join_synonym_edges,
        select_synonym_edges,
        synonym_candidates_k,
    )
    from hippo_gpu.indexing.vector_search import knn

    phrases, x = phrase_set
    cfg = GraphConfig()
    scores, ids = knn(x, synonym_candidates_k(cfg, len(phrases)), backend="torch")
    exact = select_synonym_edges(phrases, scores, ids, cfg)
    assert len(exact.src) > 500
    got, info = join_synonym_edges(phrases, x, cfg, recall_sample=1000, seed=1)
    want = set(zip(exact.src.tolist(), exact.dst.tolist()))
    have = set(zip(got.src.tolist(), got.dst.tolist()))
    assert have <= want  # nothing invented: every edge is a true one ...
    np.testing.assert_allclose(got.score, (x[got.src] * x[got.dst]).sum(1).numpy(), atol=1e-5)
    recall = len(have) / len(want)
    assert recall >= 0.95, (recall, info)
    assert info["backend"] == "ivf-join" and info["recall_sample"] == 1000
    assert abs(info["recall_vs_exact"] - recall) < 0.04  # the held-out sample estimates it
    assert 1 <= info["nprobe"] <= info["nlist"]
    # one list holds every phrase: the join is the exact walk
    full, _ = join_synonym_edges(phrases, x, cfg, recall_sample=200, nlist=1)
    assert set(zip(full.src.tolist(), full.dst.tolist())) == want


def test_build_with_ivf_join_records_held_out_recall(tmp_path) -> None:
    from hippo_gpu import build_index, load_index
    from hippo_gpu.synthetic import synthetic_corpus

    files = synthetic_corpus(600, seed=5).write(tmp_path / "in")
    build_index(files["corpus"], files["openie"], tmp_path / "idx", encoder="hash:64",
                device="cpu", graph=GraphConfig(knn_backend="ivf-join"))
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    info = manifest["openie_report"]["synonym_knn"]
    assert info["backend"] == "ivf-join" and info["recall_vs_exact"] >= 0.9
    assert {"nlist", "nprobe", "recall_tune", "recall_edges"} <= set(info)
    exact = build_index(files["corpus"], files["openie"], tmp_path / "exact",
                        encoder="hash:64", device="cpu")
    a = load_index(tmp_path / "idx", device="cpu")
    e = load_index(exact.path, device="cpu")
    want = set(zip(e.synonym_src.tolist(), e.synonym_dst.tolist()))
    have = set(zip(a.synonym_src.tolist(), a.synonym_dst.tolist()))
    assert have <= want and len(have) / len(want) >= 0.95


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_join_on_cuda_matches_cpu(clustered) -> None:
    cent = spherical_kmeans(clustered, 16, seed=1)
    probes = nearest_lists(clustered, cent, 3)
    a = threshold_join(clustered, probes, np.arange(1500), 0.8)
    b = threshold_join(clustered.cuda(), probes, np.arange(1500), 0.8)
    assert set(zip(a[0].tolist(), a[1].tolist())) == set(zip(b[0].tolist(), b[1].tolist()))
