"""A metadata filter acts after the PPR: in every mode the filtered ranking is the unfiltered one
with the non-matching passages taken out (same scores, same order, ties included), it holds
fewer than top_k hits when fewer passages match, and each hit's explanation is the one it has
unfiltered (so it still sums to its score)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hippo_gpu import Searcher, build_index
from hippo_gpu.config import MODES
from hippo_gpu.data import DataFormatError
from hippo_gpu.sample import paths
from tests.helpers import QUERIES


@pytest.fixture(scope="module")
def labelled() -> Searcher:
    files = paths()
    corpus = json.loads(Path(files["corpus"]).read_text())
    for i, p in enumerate(corpus):
        p["id"] = f"doc-{i}"
        p["metadata"] = {"third": i % 3, "tags": ["x"] if i % 4 == 0 else ["y"]}
    return Searcher(build_index(corpus, files["openie"], None, device="cpu",
                                encoder="hash:64"))


WHERE = [{"third": 0}, {"third": [1, 2]}, {"tags": "x", "third": 0}]


@pytest.mark.parametrize("mode", MODES)
def test_the_filtered_ranking_is_the_unfiltered_one_less_the_others(labelled: Searcher,
                                                                    mode: str) -> None:
    p = len(labelled.index.passage_keys)
    full = labelled.retrieve(QUERIES, top_k=p, mode=mode)
    for where in WHERE:
        keep = labelled.index.labels.matching_keys(where)
        assert 0 < len(keep) < p
        got = labelled.retrieve(QUERIES, top_k=p, mode=mode, where=where)
        short = labelled.retrieve(QUERIES, top_k=3, mode=mode, where=where)
        for q in range(len(QUERIES)):
            want = [(h.key, h.score) for h in full[q] if h.key in keep]
            assert [(h.key, h.score) for h in got[q]] == want, (mode, where)
            assert [h.rank for h in got[q]] == list(range(len(want)))
            assert [(h.key, h.score) for h in short[q]] == want[:3]
            assert all(h.metadata is not None and h.id is not None for h in got[q])


def test_no_match_gives_no_hits_and_a_bad_filter_is_refused(labelled: Searcher) -> None:
    assert labelled.retrieve(QUERIES[:2], top_k=5, where={"third": 7}) == [[], []]
    assert labelled.retrieve(QUERIES[:1], top_k=5, mode="hipporag1",
                             where={"nothing": "here"}) == [[]]
    with pytest.raises(DataFormatError, match="metadata filter"):
        labelled.retrieve(QUERIES[:1], top_k=5, where={})


@pytest.mark.parametrize("mode", MODES)
def test_a_filtered_hit_is_explained_as_it_is_unfiltered(labelled: Searcher, mode: str) -> None:
    p = len(labelled.index.passage_keys)
    where = {"third": [1, 2]}
    full = labelled.explain(QUERIES[:2], top_k=p, mode=mode)
    got = labelled.explain(QUERIES[:2], top_k=6, mode=mode, where=where)
    keep = labelled.index.labels.matching_keys(where)
    for f, g in zip(full, got):
        by_key = {h.hit.key: h for h in f.hits}
        assert len(g.hits) == 6 and all(h.hit.key in keep for h in g.hits)
        for h in g.hits:
            twin = by_key[h.hit.key]
            assert (h.total, h.value, h.bound, h.hit.score) == \
                (twin.total, twin.value, twin.bound, twin.hit.score)
            if h.bound is not None:
                assert abs(h.total - h.value) <= h.bound
