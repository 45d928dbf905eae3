"""The build at scale: weightless and precomputed embeddings, approximate synonym kNN with its
recall measured, and the lazy store (texts memory-mapped, read on demand)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from hippo_gpu import Searcher, build_index, load_index
from hippo_gpu.config import EncoderConfig, GraphConfig
from hippo_gpu.embed import Encoder, HashEncoder, hash_encoder_dim, save_precomputed
from hippo_gpu.indexing.graph import extract_elements, fact_text
from hippo_gpu.indexing.synonyms import (
    approximate_synonym_edges,
    select_synonym_edges,
    synonym_candidates_k,
)
from hippo_gpu.indexing.vector_search import knn
from hippo_gpu.storage.directory import IndexFormatError
from hippo_gpu.synthetic import synthetic_corpus
from hippo_gpu.tables import StringTable

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return synthetic_corpus(600, seed=5).write(tmp_path_factory.mktemp("synthetic"))


@pytest.fixture(scope="module")
def hash_index_dir(corpus_files, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hash") / "index"
    build_index(corpus_files["corpus"], corpus_files["openie"], out, encoder="hash:64",
                device="cpu")
    return out


# --- the hash encoder ---------------------------------------------------------------------------


def _reference_hash(text: str, enc: HashEncoder) -> np.ndarray:
    """Trigram counts of " " + lower(text) + " " projected by the table, one trigram at a time."""
    raw = (" " + text.lower() + " ").encode()
    counts = Counter((raw[i] << 16) | (raw[i + 1] << 8) | raw[i + 2] for i in range(len(raw) - 2))
    v = np.zeros(enc.dim)
    for gram, c in counts.items():
        bucket = ((gram * 2654435761) & 0xFFFFFFFF) >> (32 - enc.BUCKET_BITS)
        v += c * enc.table[bucket].double().numpy()
    norm = np.linalg.norm(v)
    return v / norm if norm > 0 else v


def test_hash_encoder_matches_a_per_trigram_reference() -> None:
    enc = HashEncoder(64)
    texts = ["Kafo River", "the kafo river", "", "a", "Ünïcode — text", "x" * 300]
    got = enc(texts)
    assert got.shape == (6, 64) and got.dtype == np.float32
    for row, text in zip(got, texts):
        np.testing.assert_allclose(row, _reference_hash(text, enc), atol=1e-5)
    np.testing.assert_array_equal(got, HashEncoder(64)(texts))  # deterministic
    np.testing.assert_array_equal(enc(texts[:2]), enc(texts)[:2])  # independent of the batch
    np.testing.assert_array_equal(enc(texts, chunk_bytes=8), got)  # of the chunking


def test_hash_encoder_near_duplicates_are_closer_than_unrelated_phrases() -> None:
    corpus = synthetic_corpus(2000, seed=2)
    enc = HashEncoder(64)
    bases = corpus.phrase_text[:400]
    variants = [f"The {b}" for b in bases] + [f"{b}s" for b in bases]
    x, y = enc(bases + bases), enc(variants)
    near = (x * y).sum(1)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, len(corpus.phrase_text), (2, 2000))
    keep = a != b
    pa = enc([corpus.phrase_text[i] for i in a[keep]])
    pb = enc([corpus.phrase_text[i] for i in b[keep]])
    unrelated = (pa * pb).sum(1)
    assert np.median(near) > 0.75 and np.mean(near >= 0.8) > 0.3
    assert np.quantile(unrelated, 0.99) < 0.5
    assert near.mean() - unrelated.mean() > 0.6


def test_hash_encoder_through_the_encoder_plumbing() -> None:
    enc = Encoder(EncoderConfig(model="hash:32"), torch.device("cpu"))
    assert enc.dim == 32 and enc.backend == "hash" and enc.model is None
    v = enc.encode(["Kafo River", "kafo river"])
    torch.testing.assert_close(v[0], v[1])  # uncased
    q = enc.encode_queries(["Kafo River"], "query_to_passage")
    torch.testing.assert_close(q, v[:1])
    assert hash_encoder_dim("sentence-transformers/all-MiniLM-L6-v2") is None
    for bad in ("hash:", "hash:x", "hash:4", "hash:99999"):
        with pytest.raises(ValueError, match="hash:D"):
            hash_encoder_dim(bad)
    with pytest.raises(ValueError, match="hash:D"):
        build_index([{"title": "a", "text": "b"}], {"docs": []}, encoder="hash:7", device="cpu")


# --- precomputed embeddings -------------------------------------------------------------------


def _assert_same_index(a, b) -> None:
    for name in ("passage_emb", "phrase_emb", "fact_emb"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=1e-6, rtol=0)
    assert torch.equal(a.adjacency.crow_indices(), b.adjacency.crow_indices())
    assert torch.equal(a.adjacency.col_indices(), b.adjacency.col_indices())
    torch.testing.assert_close(a.adjacency.values(), b.adjacency.values(), atol=1e-6, rtol=0)
    assert a.phrases == b.phrases and a.facts == b.facts


def test_precomputed_embeddings_need_no_encoder(hash_index_dir, corpus_files, tmp_path,
                                                monkeypatch) -> None:
    ref = load_index(hash_index_dir, device="cpu")
    pre = tmp_path / "vectors"
    save_precomputed(pre, "passages", list(ref.passage_texts), ref.passage_emb.numpy())
    save_precomputed(pre, "phrases", list(ref.phrases), ref.phrase_emb.numpy())
    save_precomputed(pre, "facts", [fact_text(f) for f in ref.facts], ref.fact_emb.numpy())

    class NoEncoder:
        def __init__(self, *args, **kwargs) -> None:
            raise AssertionError("the encoder was loaded although every vector was given")

    monkeypatch.setattr("hippo_gpu.indexing.build.Encoder", NoEncoder)
    got = build_index(corpus_files["corpus"], corpus_files["openie"], tmp_path / "idx",
                      encoder="hash:64", device="cpu", embeddings=pre)
    _assert_same_index(got, ref)
    assert load_index(tmp_path / "idx", device="cpu").config.encoder.model == "hash:64"

    calls: list[str] = []

    def embed(texts, kind):
        calls.append(kind)
        return 3.0 * HashEncoder(64)(texts)  # not normalised: the build normalises

    got = build_index(corpus_files["corpus"], corpus_files["openie"], encoder="hash:64",
                      device="cpu", embeddings=embed)
    assert calls == ["passages", "phrases", "facts"]
    _assert_same_index(got, ref)


def test_precomputed_embeddings_with_gaps_encode_the_rest(hash_index_dir, corpus_files,
                                                           tmp_path) -> None:
    ref = load_index(hash_index_dir, device="cpu")
    pre = tmp_path / "vectors"
    half = len(ref.phrases) // 2
    save_precomputed(pre, "phrases", list(ref.phrases)[:half], ref.phrase_emb[:half].numpy())
    got = build_index(corpus_files["corpus"], corpus_files["openie"], encoder="hash:64",
                      device="cpu", embeddings=str(pre))
    _assert_same_index(got, ref)


def test_precomputed_embeddings_bad_input_is_named(tmp_path) -> None:
    from hippo_gpu.embed import PrecomputedEmbeddings

    with pytest.raises(ValueError, match="not a directory"):
        PrecomputedEmbeddings(tmp_path / "nope")
    with pytest.raises(ValueError, match="holds no"):
        PrecomputedEmbeddings(tmp_path)
    np.save(tmp_path / "phrases.npy", np.zeros((3, 4), np.float32))
    (tmp_path / "phrases.json").write_text(json.dumps(["a", "b"]))
    with pytest.raises(ValueError, match="phrases.npy"):
        PrecomputedEmbeddings(tmp_path)
    with pytest.raises(ValueError, match="shape"):
        build_index([{"title": "t", "text": "x"}],
                    {"docs": [{"idx": "chunk-" + "0" * 32, "extracted_triples": []}]},
                    encoder="hash:8", device="cpu", allow_missing_openie=True,
                    embeddings=lambda texts, kind: np.zeros((len(texts) + 1, 8)))


# --- approximate synonym kNN ------------------------------------------------------------------


@pytest.fixture(scope="module")
def phrase_set():
    docs = synthetic_corpus(3000, seed=9).docs()
    phrases = extract_elements(docs).phrases
    return phrases, torch.from_numpy(HashEncoder(64)(phrases))


def _exact_edges(phrases, x, cfg):
    scores, ids = knn(x, synonym_candidates_k(cfg, len(phrases)), backend="faiss-flat")
    return select_synonym_edges(phrases, scores, ids, cfg)


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_approximate_synonym_edges_recall_vs_exact(phrase_set, kind) -> None:
    pytest.importorskip("faiss")
    phrases, x = phrase_set
    cfg = GraphConfig()
    exact = _exact_edges(phrases, x, cfg)
    assert len(exact.src) > 500  # the near-duplicates give the kNN real work
    got, info = approximate_synonym_edges(phrases, x, cfg, kind=kind, target_recall=0.97,
                                          recall_sample=1000)
    want = set(zip(exact.src.tolist(), exact.dst.tolist()))
    have = set(zip(got.src.tolist(), got.dst.tolist()))
    recall = len(want & have) / len(want)
    assert recall >= 0.95, (kind, recall, info)
    assert info["recall_vs_exact"] >= 0.97 or info.get("ef_search", 0) >= 4096 or \
        info.get("nprobe") == info.get("nlist")
    assert abs(info["recall_vs_exact"] - recall) < 0.05  # the sample estimates the whole
    # every approximate edge is a true one, with its exact score (nothing invented)
    extra = have - want
    assert len(extra) <= 0.01 * len(have)
    cos = (x[torch.from_numpy(got.src)] * x[torch.from_numpy(got.dst)]).sum(1).numpy()
    np.testing.assert_allclose(got.score, cos, atol=1e-5)
    assert (got.score >= cfg.synonym_threshold).all() and (got.src != got.dst).all()


def test_build_records_the_measured_recall_in_the_manifest(corpus_files, tmp_path) -> None:
    pytest.importorskip("faiss")
    build_index(corpus_files["corpus"], corpus_files["openie"], tmp_path / "idx",
                encoder="hash:64", device="cpu", graph=GraphConfig(knn_backend="faiss-hnsw"))
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    knn_info = manifest["openie_report"]["synonym_knn"]
    assert knn_info["backend"] == "faiss-hnsw" and knn_info["recall_vs_exact"] >= 0.95
    assert knn_info["recall_sample"] > 0
    exact = load_index(build_index(corpus_files["corpus"], corpus_files["openie"],
                                   tmp_path / "exact", encoder="hash:64",
                                   device="cpu").path, device="cpu")
    assert exact.report["synonym_knn"]["recall_vs_exact"] == 1.0
    approx = load_index(tmp_path / "idx", device="cpu")
    want = set(zip(exact.synonym_src.tolist(), exact.synonym_dst.tolist()))
    have = set(zip(approx.synonym_src.tolist(), approx.synonym_dst.tolist()))
    assert len(want & have) / max(len(want), 1) >= 0.95


# --- the lazy store ---------------------------------------------------------------------------


def test_lazy_load_reads_texts_on_demand_and_ranks_as_the_eager_index(corpus_files,
                                                                      tmp_path) -> None:
    eager = build_index(corpus_files["corpus"], corpus_files["openie"], tmp_path / "idx",
                        encoder="hash:64", device="cpu")
    assert isinstance(eager.passage_texts, list)
    lazy = load_index(tmp_path / "idx", device="cpu")
    assert isinstance(lazy.passage_texts, StringTable)
    owner = lazy.passage_texts._blob  # mapped, not read: a view whose bases reach the map
    while owner is not None and not isinstance(owner, np.memmap):
        owner = owner.base
    assert isinstance(owner, np.memmap)
    texts = list(eager.passage_texts)
    assert len(lazy.passage_texts) == len(texts)
    assert lazy.passage_texts[7] == texts[7] and lazy.passage_texts[-1] == texts[-1]
    assert lazy.passage_texts[3:9:2] == texts[3:9:2]
    assert lazy.passage_texts == texts and lazy.passage_keys == eager.passage_keys
    assert lazy.phrases == eager.phrases and lazy.facts == eager.facts
    assert lazy.passage_triples == eager.passage_triples
    with pytest.raises(IndexError):
        lazy.passage_texts[len(texts)]
    queries = [f"Who or what {p} {o}?" for _, p, o in list(eager.facts)[:40:3]]
    for mode in ("hipporag2", "dense"):
        a = Searcher(eager).retrieve(queries, top_k=10, mode=mode)
        b = Searcher(lazy).retrieve(queries, top_k=10, mode=mode)
        assert [[(h.key, h.row) for h in hs] for hs in a] == \
            [[(h.key, h.row) for h in hs] for hs in b]
        assert [[h.score for h in hs] for hs in a] == [[h.score for h in hs] for hs in b]
        assert all(lazy.passage_texts[h.row].startswith(h.title + "\n") for hs in b for h in hs)


def test_old_format_index_names_the_rebuild_command(hash_index_dir, tmp_path) -> None:
    old = tmp_path / "old"
    shutil.copytree(hash_index_dir, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["format_version"] = 2
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="format version 2.*hippo-gpu index --corpus"):
        load_index(old, device="cpu")


def test_flipped_byte_in_a_string_table_names_it(hash_index_dir, tmp_path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(hash_index_dir, bad)
    version = json.loads((bad / "manifest.json").read_text())["version"]
    path = bad / f"v{version:06d}" / "passage_texts.strings"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=r"passage_texts\.strings"):
        load_index(bad, device="cpu")


# --- the passage basis stage --------------------------------------------------------------------


def test_build_solves_the_basis_as_its_own_stage(hash_index_dir) -> None:
    """A build stores the basis of its graph (stage "basis" in the timings), equal within the
    certified bounds to solving it again from the loaded graph and vectors."""
    from hippo_gpu.config import RetrievalConfig
    from hippo_gpu.ppr.basis import solve_basis
    from tests.helpers import assert_basis_close

    idx = load_index(hash_index_dir, device="cpu")
    assert "basis" in idx.timings and idx.config.ppr_basis
    assert idx.basis is not None and idx.basis.damping == RetrievalConfig().damping
    assert idx.stats()["basis_bytes"] == idx.basis.nbytes > 0
    again = solve_basis(idx.adjacency, idx.passage_nodes, idx.passage_emb,
                        damping=RetrievalConfig().damping)
    assert_basis_close(idx.basis, again)


def test_a_build_without_the_basis_has_none(corpus_files, tmp_path) -> None:
    out = tmp_path / "index"
    idx = build_index(corpus_files["corpus"], corpus_files["openie"], out, encoder="hash:64",
                      device="cpu", ppr_basis=False)
    assert idx.basis is None and "basis" not in idx.timings and not idx.config.ppr_basis
    assert not list(out.glob("v*/basis.safetensors"))
    assert json.loads((out / "manifest.json").read_text())["config"]["ppr_basis"] is False
    loaded = load_index(out, device="cpu")
    assert loaded.basis is None and not loaded.config.ppr_basis


def test_string_table_search_is_bisect_on_the_decoded_rows(tmp_path) -> None:
    """StringTable's byte-wise search (tables.sorted_position) against bisect over the decoded
    strings, on multi-byte text (UTF-8 byte order must be code point order), in memory and
    memory-mapped from its file."""
    import bisect
    import random

    from hippo_gpu.tables import sorted_position

    rng = random.Random(0)
    alphabet = ["a", "b", "z", " ", "\u00e9", "\u00e8", "\u4e2d", "\U0001f600", "0"]
    words = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
                    for _ in range(400)})
    table = StringTable.from_strings(words)
    table.write(tmp_path / "t.strings")
    mapped = StringTable.open(tmp_path / "t.strings")
    probes = words + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
                      for _ in range(400)]
    for t in (table, mapped):
        assert [sorted_position(t, p) for p in probes] == \
            [bisect.bisect_left(words, p) for p in probes]
    assert list(mapped) == words
