"""The user's passage ids and metadata (indexing/labels.py): what the corpus reader accepts, the
rule of the next version's labels, their storage, and the metadata filter against a brute-force
oracle over random metadata."""

from __future__ import annotations

import json
import random

import pytest

from hippo_gpu.data import DataFormatError, Passage, as_passages, read_corpus
from hippo_gpu.indexing.labels import PassageLabels, check_filter


def test_the_reader_keeps_ids_and_metadata_and_checks_them():
    got = read_corpus([{"title": "A", "text": "a", "id": "doc-1", "metadata": {"y": 2020}},
                       {"title": "B", "text": "b", "id": 7},
                       {"title": "C", "text": "c"}])
    assert [(p.id, p.metadata) for p in got] == [("doc-1", {"y": 2020}), ("7", None),
                                                 (None, None)]
    # the label is not the passage: same title and text, same passage and key
    assert got[2] == Passage("C", "c", id="x", metadata={"k": 1})
    assert got[2].key == Passage("C", "c", id="x").key
    bad = [({"id": " "}, "'id' must be a non-blank string or an integer"),
           ({"id": True}, "'id' must be a non-blank string or an integer"),
           ({"id": 1.5}, "'id' must be a non-blank string or an integer"),
           ({"metadata": [1]}, "'metadata' must be an object with string keys"),
           ({"metadata": {"x": float("nan")}}, "'metadata' must hold JSON values only"),
           ({"metadata": {"x": {1, 2}}}, "'metadata' must hold JSON values only")]
    for extra, message in bad:
        with pytest.raises(DataFormatError, match=rf"corpus\[0\]: {message}"):
            read_corpus([{"title": "A", "text": "a", **extra}])
    with pytest.raises(DataFormatError, match=r"corpus\[1\] has the id 'd' of corpus\[0\]"):
        as_passages([Passage("A", "a", id="d"), Passage("B", "b", id="d")])


def _passages(n: int, rng: random.Random) -> list[Passage]:
    out = []
    for i in range(n):
        meta = {"src": rng.choice(["wiki", "news", "web"]),
                "year": rng.choice([2019, 2020, 2021.0]),
                "tags": rng.sample(["a", "b", "c", "d"], rng.randint(0, 2)),
                "ok": rng.choice([True, False, None, 1])}
        for name in list(meta):
            if rng.random() < 0.2:
                del meta[name]
        out.append(Passage(f"t{i}", f"text {i}", id=f"id{i}" if rng.random() < 0.8 else None,
                           metadata=meta if rng.random() < 0.9 else None))
    return out


def _matches(meta: dict | None, where: dict) -> bool:
    """The filter's rule, written out directly (the oracle)."""
    if meta is None:
        return False
    for name, wanted in where.items():
        if name not in meta:
            return False
        values = wanted if isinstance(wanted, list) else [wanted]
        have = meta[name]
        cands = [have] + (have if isinstance(have, list) else [])

        def same(a, b):
            num = (int, float)
            if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
                return type(a) is type(b) and a == b
            if isinstance(a, num) and isinstance(b, num):
                return float(a) == float(b)
            return type(a) is type(b) and a == b

        if not any(same(c, v) for c in cands for v in values):
            return False
    return True


def test_the_filter_equals_its_rule_on_random_metadata():
    rng = random.Random(5)
    passages = _passages(300, rng)
    labels = PassageLabels.of(passages)
    filters = [{"src": "wiki"}, {"year": 2021}, {"year": 2021.0}, {"year": [2019, 2020]},
               {"tags": "a"}, {"tags": ["a", "d"], "src": ["news", "web"]}, {"ok": True},
               {"ok": 1}, {"ok": None}, {"missing": 1}, {"src": "wiki", "year": 2019, "tags": "b"}]
    for where in filters:
        want = {p.key for p in passages if _matches(p.metadata, where)}
        assert labels.matching_keys(where) == want, where
    assert labels.matching_keys({"ok": True}) != labels.matching_keys({"ok": 1})  # JSON's equality


def test_a_filter_of_the_wrong_shape_is_refused():
    for where in ({}, [], {"x": []}, {"x": {"y": 1}}, {"x": [[1]]}, {1: "a"}):
        with pytest.raises(DataFormatError, match="filter"):
            check_filter(where)


def test_the_next_version_drops_the_removed_and_sets_the_added():
    a, b, c = Passage("A", "a", id="1", metadata={"v": 1}), Passage("B", "b", id="2"), \
        Passage("C", "c", metadata={"v": 3})
    labels = PassageLabels.of([a, b, c])
    # b deleted; a deleted and inserted again without a label; d new with b's old id
    d = Passage("D", "d", id="2")
    nxt = labels.after([b.key, a.key], [Passage("A", "a"), d])
    assert nxt == PassageLabels.of([c, d])
    assert nxt.key_of_id("2") == d.key and nxt.key_of_id("1") is None
    assert (nxt.id_of(a.key), nxt.metadata_of(a.key)) == (None, None)
    with pytest.raises(DataFormatError, match="the id '1' would name two passages"):
        labels.after([], [Passage("E", "e", id="1")])
    assert len(labels) == 3 and not PassageLabels() and labels  # unchanged by after()


def test_labels_survive_their_json():
    passages = _passages(50, random.Random(1))
    labels = PassageLabels.of(passages)
    again = PassageLabels.from_json(json.loads(json.dumps(labels.to_json())))
    assert again == labels
    assert {k: (again.id_of(k), again.metadata_of(k)) for k in (p.key for p in passages)} == \
        {p.key: (p.id, p.metadata) for p in passages}
    for bad in ([], {"k": 1}, {"k": {"id": 3}}, {"k": {"metadata": "x"}}):
        with pytest.raises(ValueError):
            PassageLabels.from_json(bad)
