"""What a written index is checked against: a fresh `build_index` of the final corpus (same
passages in order, tables, vectors, edge weights and synonym pairs by name, counts, basis within
its certified bounds, top-k rankings of every mode up to exact ties), and its directory on disk
(file hashes, the manifest's version, entries no version names). Also the sample's builds through
one cached encoder, so equal texts get bit-identical vectors on both sides."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch

from hippo_gpu import build_index
from hippo_gpu.config import GraphConfig
from hippo_gpu.data import Passage
from hippo_gpu.embed import Encoder
from hippo_gpu.indexing.index import Index
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.storage.directory import MANIFEST
from hippo_gpu.storage.locks import SERVER_LOCK, WRITER_LOCK
from tests.helpers import assert_basis_close, transition_gap

MODES = ("dense", "hipporag2", "hybrid")

WEIGHT_TOL = 1e-6

SCORE_TOL = 1e-6


def docs_for(sample: dict, passages: list[Passage]) -> dict:
    """The sample OpenIE restricted to `passages` (what a user would pass along with them)."""
    keys = {p.key for p in passages}
    return {"docs": [d for d in sample["openie"]["docs"] if d["idx"] in keys]}


def build(enc: Encoder, sample: dict, passages: list[Passage], out: Path | None = None,
          graph: GraphConfig | None = None) -> Index:
    return build_index(passages, sample["openie"], out, encoder=enc, device="cpu", graph=graph)


def copy_index(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# -- comparison with the reference -------------------------------------------------------------


def edge_weights(index: Index) -> dict[tuple[str, str], float]:
    """Adjacency entries by (node name, node name): phrase text or passage key."""
    names = list(index.phrases) + [""] * len(index.passage_keys)
    for key, node in zip(index.passage_keys, index.passage_nodes.tolist()):
        names[node] = key
    assert len(names) == index.num_nodes and all(names[len(index.phrases):])
    adj = index.adjacency
    crow, col, val = adj.crow_indices().tolist(), adj.col_indices().tolist(), adj.values().tolist()
    out = {}
    for r in range(len(crow) - 1):
        for j in range(crow[r], crow[r + 1]):
            out[(names[r], names[col[j]])] = val[j]
    return out


def synonym_pairs(index: Index) -> dict[tuple[str, str], float]:
    ph = index.phrases
    return {(ph[a], ph[b]): s for a, b, s in zip(index.synonym_src.tolist(),
                                                 index.synonym_dst.tolist(),
                                                 index.synonym_score.tolist())}


def close_maps(got: dict, want: dict, tol: float, what: str) -> None:
    assert got.keys() == want.keys(), (
        f"{what}: only in writer {sorted(got.keys() - want.keys())[:5]}, "
        f"only in build {sorted(want.keys() - got.keys())[:5]}")
    bad = [(k, got[k], want[k]) for k in want if abs(got[k] - want[k]) > tol]
    assert not bad, f"{what}: {len(bad)} weights differ, e.g. {bad[:3]}"


def content_stats(index: Index) -> dict:
    """stats() without the basis entries (a commit defers the basis to the next compaction,
    so equal contents may differ in having one; tests compare bases apart)."""
    return {k: v for k, v in index.stats().items() if not k.startswith("basis_")}


def assert_same_index(got: Index, want: Index) -> None:
    """Same passages (in order), phrases, facts, vectors, edges and weights, synonym pairs,
    counts and passage basis (within its certified bounds) as the fresh build."""
    assert got.passage_keys == want.passage_keys
    assert got.passage_texts == want.passage_texts
    assert got.phrases == want.phrases
    assert got.facts == want.facts
    assert got.passage_triples == want.passage_triples
    assert content_stats(got) == content_stats(want)
    triple_fields = ("passages", "triples_read", "triples_kept", "malformed_triples",
                     "malformed_by_reason", "passages_without_triples", "passages_with_error")
    assert {k: got.report[k] for k in triple_fields} == {k: want.report[k] for k in triple_fields}
    assert [got.row_of_key[k] for k in want.passage_keys] == list(range(len(want.passage_keys)))
    # a commit leaves its version without a basis; a reader updates it (versions/live_basis.py)
    if got.basis is not None and want.basis is not None:
        assert_same_basis(got, want)
    for name in ("passage_emb", "phrase_emb", "fact_emb", "fact_phrases",
                 "phrase_passage_counts"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    close_maps(edge_weights(got), edge_weights(want), WEIGHT_TOL, "edges")
    close_maps(synonym_pairs(got), synonym_pairs(want), WEIGHT_TOL, "synonym pairs")


def assert_same_basis(got: Index, want: Index) -> None:
    """The bases agree within their bounds, widened by what the graphs' own difference can move
    them (the writer's synonym scores may differ from a fresh build's by float32 rounding,
    ~1e-7, within WEIGHT_TOL; that moves the basis ~1e-9, above its 1e-10 bounds). Equal graphs
    get no widening."""
    assert_basis_close(got.basis, want.basis, passage_emb=want.passage_emb,
                       gap=transition_gap(got.adjacency, want.adjacency))


def assert_same_ranking(got: list, want: list) -> None:
    """Equal top-k key lists up to exact ties: scores agree position by position, and where the
    keys differ, each key is found in the other list at a tied score (or both sit at a tied
    cut-off)."""
    gs, ws = [h.score for h in got], [h.score for h in want]
    assert len(gs) == len(ws)
    torch.testing.assert_close(torch.tensor(gs), torch.tensor(ws), rtol=0, atol=SCORE_TOL)
    gk, wk = [h.key for h in got], [h.key for h in want]
    for i, (a, b) in enumerate(zip(gk, wk)):
        if a == b:
            continue
        for key, score, other, other_scores in ((a, gs[i], wk, ws), (b, ws[i], gk, gs)):
            if key in other:
                assert abs(other_scores[other.index(key)] - score) <= SCORE_TOL, (i, key)
            else:  # dropped at the cut: it must tie with the last kept score
                assert abs(other_scores[-1] - score) <= SCORE_TOL, (i, key)


def assert_same_rankings(got: Index, want: Index, enc: Encoder, questions: list[str],
                         top_k: int = 10) -> None:
    """Top-k hits of every mode agree (Searcher.retrieve's pipeline; the query vectors are
    encoded once and shared, which is what retrieve would compute for both)."""
    query_emb = enc.encode_queries(questions, "query_to_passage")
    sg, sw = Searcher(got, encoder=enc), Searcher(want, encoder=enc)
    for mode in MODES:
        hits = [s.to_hits(s.rank(questions, top_k=top_k, mode=mode, query_emb=query_emb))
                for s in (sg, sw)]
        assert len(hits[0]) == len(questions)
        for hg, hw in zip(*hits):
            assert_same_ranking(hg, hw)


# -- the directory on disk ---------------------------------------------------------------------


def snapshot(index_dir: Path) -> dict[str, str]:
    """sha256 of every file in an index directory (the lock file's content is a pid: skipped)."""
    return {str(p.relative_to(index_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(index_dir.rglob("*")) if p.is_file() and p.name != WRITER_LOCK}


def manifest_version(index_dir: Path) -> int:
    return json.loads((index_dir / MANIFEST).read_text())["version"]


def leftovers(index_dir: Path) -> list[str]:
    """Entries other than the manifest, the lock files (the writer's, and a writable server's
    claim) and the current version's base and segments."""
    manifest = json.loads((index_dir / MANIFEST).read_text())
    named = {manifest.get("base", f"v{manifest['version']:06d}"),
             *(seg["name"] for seg in manifest.get("segments", []))}
    return sorted(p.name for p in index_dir.iterdir()
                  if p.name not in (MANIFEST, WRITER_LOCK, SERVER_LOCK, *named))
