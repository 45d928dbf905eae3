"""chain.replay_chain against its claim: a chain of segments replayed as one composed change
equals the segments replayed one by one (versions before it), bit for bit: tables, every
embedding row, adjacency, synonym lists, counts and report.

The reference is the sequential replay (chain.replay per segment, each checked against a fresh
build in test_writes_equal_a_rebuild.py). So that a text taking the wrong segment's vector is
seen, every
segment's stored vectors are replaced by distinct random ones before both replays (the tables
and synonym lists do not depend on them): a commit's encoder, cached, would give a text the
same vector in every segment.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from hippo_gpu import build_index
from hippo_gpu.config import EncoderConfig, GraphConfig
from hippo_gpu.data import Passage
from hippo_gpu.embed import Encoder
from hippo_gpu.indexing.index import Index, index_of_files
from hippo_gpu.sample import paths
from hippo_gpu.storage.directory import IndexFormatError, read_index_dir
from hippo_gpu.versions.chain import Segment, replay, replay_chain
from hippo_gpu.versions.delta import NewVectors
from hippo_gpu.versions.load import _segment_of, load_index
from hippo_gpu.versions.placed_rows import PendingRows, settle
from hippo_gpu.versions.writer import IndexWriter

GRAPH = GraphConfig(synonym_threshold=0.5, synonym_max_neighbors=2, knn_backend="torch")


@pytest.fixture(scope="module")
def enc(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return Encoder(EncoderConfig(), torch.device("cpu"),
                   cache_dir=tmp_path_factory.mktemp("chain_cache"))


@pytest.fixture(scope="module")
def sample() -> dict:
    files = paths()
    corpus = [Passage(p["title"], p["text"])
              for p in json.loads(files["corpus"].read_text(encoding="utf-8"))]
    return {"corpus": corpus, "openie": json.loads(files["openie"].read_text(encoding="utf-8"))}


def committed_chain(enc: Encoder, sample: dict, root: Path, seed: int, commits: int) -> None:
    """A base of 12 sample passages and `commits` commits of random inserts and deletes, where
    deleted passages (base ones included) come back later, so texts die and are revived."""
    rng = random.Random(seed)
    corpus = sample["corpus"]
    build_index(corpus[:12], sample["openie"], root, encoder=enc, device="cpu", graph=GRAPH)
    alive = list(corpus[:12])
    with IndexWriter(root, device="cpu", encoder=enc, compact_after=None) as w:
        for _ in range(commits):
            out = [p for p in corpus if p not in alive]
            gone = []
            if len(alive) > 3:
                gone = rng.sample(alive, rng.randint(1, min(4, len(alive) - 3)))
                w.delete([p.key for p in gone])
                alive = [p for p in alive if p not in gone]
            if out and rng.random() < 0.8:  # first those deleted before: their texts return
                back = [p for p in out if p in corpus[:12] and p not in gone]
                new = back[:2] + rng.sample([p for p in out if p not in back[:2]],
                                            rng.randint(0, min(3, len(out) - len(back[:2]))))
                w.insert(new, sample["openie"])
                alive += new
            w.commit()


def perturbed(segments: list[tuple[int, Segment]], seed: int) -> list[tuple[int, Segment]]:
    """The segments with their stored vectors replaced by distinct random unit vectors."""
    g = torch.Generator().manual_seed(seed)

    def rand(t: torch.Tensor) -> torch.Tensor:
        x = torch.randn(t.shape, generator=g)
        return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)

    return [(v, replace(s, vectors=NewVectors(rand(s.vectors.passages), rand(s.vectors.phrases),
                                              rand(s.vectors.facts))))
            for v, s in segments]


def base_and_segments(root: Path) -> tuple[Index, list[tuple[int, Segment]]]:
    manifest, base, files = read_index_dir(root)
    assert base is not None
    return index_of_files(root, manifest, base), [(v, _segment_of(root, f)) for v, f in files]


def sequential(index: Index, segments: list[tuple[int, Segment]], root: Path) -> Index:
    for v, s in segments:
        index = replay(index, s, path=root, version=v, pending=True)
    return settle(index)


def assert_identical(got: Index, want: Index) -> None:
    for name in ("passage_keys", "passage_titles", "passage_texts", "phrases", "predicates",
                 "facts", "passage_triples", "passage_malformed", "passage_error", "counts",
                 "report", "version"):
        assert getattr(got, name) == getattr(want, name), name
    for name in ("passage_emb", "phrase_emb", "fact_emb", "passage_nodes", "fact_phrases",
                 "phrase_passage_counts", "incidence_phrase", "incidence_passage",
                 "synonym_src", "synonym_dst", "synonym_score"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    for part in ("crow_indices", "col_indices", "values"):
        assert torch.equal(getattr(got.adjacency, part)(), getattr(want.adjacency, part)()), part


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_chain_replayed_at_once_equals_it_replayed_one_by_one(enc, sample, tmp_path, seed):
    root = tmp_path / "index"
    committed_chain(enc, sample, root, seed, commits=6)
    base, segments = base_and_segments(root)
    segments = perturbed(segments, seed)
    want = sequential(base, segments, root)
    got = settle(replay_chain(base, segments, path=root)[0])
    assert_identical(got, want)
    # the chain did what the test is for: base phrases died and came back, synonyms recomputed
    between = [set(sequential(base, segments[:k], root).phrases) for k in range(1, len(segments))]
    revived = {p for p in set(base.phrases) & set(got.phrases) if any(p not in v for v in between)}
    assert revived and sum(len(s.synonyms.affected) for _, s in segments) > 0


def test_a_chain_from_a_version_in_its_middle_equals_the_rest_one_by_one(enc, sample, tmp_path):
    """What a reader's refresh does: the held version as the base of the remaining segments."""
    root = tmp_path / "index"
    committed_chain(enc, sample, root, seed=3, commits=5)
    base, segments = base_and_segments(root)
    segments = perturbed(segments, 3)
    middle = sequential(base, segments[:2], root)
    assert_identical(settle(replay_chain(middle, segments[2:], path=root)[0]),
                     sequential(middle, segments[2:], root))


def test_load_index_replays_the_chain_as_one_change(enc, sample, tmp_path, monkeypatch):
    """load_index plans one change for a chain of segments (not one per segment), and gives
    what the sequential replay gives."""
    from hippo_gpu.versions import chain

    root = tmp_path / "index"
    committed_chain(enc, sample, root, seed=4, commits=4)
    base, segments = base_and_segments(root)
    want = sequential(base, segments, root)
    calls = []
    real = chain.plan_change
    monkeypatch.setattr(chain, "plan_change", lambda *a: calls.append(1) or real(*a))
    got = load_index(root, device="cpu")
    assert len(calls) == 1
    want.version = got.version
    assert_identical(got, want)


def test_a_segment_that_does_not_fit_is_refused_by_name(enc, sample, tmp_path):
    root = tmp_path / "index"
    committed_chain(enc, sample, root, seed=5, commits=3)
    base, segments = base_and_segments(root)
    v, s = segments[1]
    wrong = [segments[0], (v, replace(s, expect={**s.expect, "facts": s.expect["facts"] + 1})),
             segments[2]]
    with pytest.raises(IndexFormatError, match=f"segment {v} gives"):
        replay_chain(base, wrong, path=root)
    v, s = segments[2]
    far = replace(s.change, removed=np.array([10_000], dtype=np.int64))
    with pytest.raises(IndexFormatError, match=f"segment {v} removes passage rows"):
        replay_chain(base, [*segments[:2], (v, replace(s, change=far))], path=root)
    v, s = segments[1]
    short = replace(s.vectors, phrases=s.vectors.phrases[:-1])
    if len(s.vectors.phrases):
        with pytest.raises(IndexFormatError, match=f"segment {v} does not fit"):
            replay_chain(base, [segments[0], (v, replace(s, vectors=short)), segments[2]],
                         path=root)


def test_pending_rows_settle_equals_the_row_by_row_gather():
    """settle copies long runs as slices and gathers the rest: every row must be its source's
    row whatever the mix (runs of 1-40 rows from 1-3 sources, empty matrices included)."""
    rng = np.random.default_rng(0)
    for _ in range(100):
        n, k = int(rng.integers(0, 300)), int(rng.integers(1, 4))
        sources = [torch.randn(int(rng.integers(1, 400)), 5) for _ in range(k)]
        src, row = np.empty(n, np.int32), np.empty(n, np.int64)
        i = 0
        while i < n:
            s = int(rng.integers(0, k))
            start = int(rng.integers(0, sources[s].shape[0]))
            length = min(int(rng.integers(1, 40)), n - i, sources[s].shape[0] - start)
            src[i:i + length], row[i:i + length] = s, np.arange(start, start + length)
            i += length
        got = PendingRows(sources, src, row).settle()
        want = torch.stack([sources[s][r] for s, r in zip(src, row)]) if n else torch.empty(0, 5)
        assert torch.equal(got, want)
