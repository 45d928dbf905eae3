"""The user's passage ids and metadata through inserts, deletes (by id), reloads of the chain and a
compaction: after every step the index's labels are those of a fresh build of its corpus, and
every hit carries its passage's own id and metadata."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hippo_gpu import Searcher, build_index, load_index
from hippo_gpu.data import DataFormatError
from hippo_gpu.sample import paths
from hippo_gpu.versions.writer import IndexWriter

ENCODER = "hash:64"


def _labelled(corpus: list[dict]) -> list[dict]:
    return [{**p, "id": f"doc-{i}", "metadata": {"n": i, "half": "low" if i < 15 else "high",
                                                 "tags": ["even"] if i % 2 == 0 else []}}
            for i, p in enumerate(corpus)]


def _check(index_dir: Path, corpus: list[dict], openie: dict) -> None:
    """The directory's current version (its chain replayed) has the labels of a fresh build of
    `corpus`, and its hits carry them."""
    loaded = load_index(index_dir, device="cpu")
    fresh = build_index(corpus, openie, None, device="cpu", encoder=ENCODER)
    assert loaded.labels == fresh.labels
    assert sorted(loaded.passage_keys) == sorted(fresh.passage_keys)
    own = {f"{p['title']}\n{p['text']}": (p.get("id"), p.get("metadata")) for p in corpus}
    hits = Searcher(loaded).retrieve(["Who founded the museum?", "Which river?"],
                                     top_k=len(corpus))
    for row in hits:
        assert len(row) == len(corpus)
        for h in row:
            assert (h.id, h.metadata) == own[loaded.passage_texts[h.row]]


def test_labels_are_a_fresh_builds_after_every_write(tmp_path: Path) -> None:
    files = paths()
    corpus = _labelled(json.loads(Path(files["corpus"]).read_text()))
    openie = json.loads(Path(files["openie"]).read_text())
    index_dir = tmp_path / "idx"
    build_index(corpus[:25], openie, index_dir, device="cpu", encoder=ENCODER)
    _check(index_dir, corpus[:25], openie)

    with IndexWriter(index_dir, device="cpu") as w:  # insert labelled, delete by own id
        assert w.insert(corpus[25:], openie) == 5
        assert w.delete_ids(["doc-3", "doc-26"]) == 2  # a base passage and a staged one
        w.commit()
    now = [p for p in corpus if p["id"] not in ("doc-3", "doc-26")]
    _check(index_dir, now, openie)

    # doc-3's passage back with another id and no metadata; doc-5 gives its id up to it
    back = {"title": corpus[3]["title"], "text": corpus[3]["text"], "id": "doc-5"}
    with IndexWriter(index_dir, device="cpu") as w:
        with pytest.raises(DataFormatError, match="the id 'doc-5' already names a passage"):
            w.insert([back], openie)
        assert not w.pending  # refused: nothing staged
        w.delete_ids(["doc-5"])
        assert w.insert([back], openie) == 1
        w.commit()
    now = [p for p in now if p["id"] != "doc-5"] + [back]
    _check(index_dir, now, openie)  # a chain of two segments replayed

    with IndexWriter(index_dir, device="cpu") as w:
        with pytest.raises(KeyError, match="1 unknown passage id.*'doc-3'"):
            w.delete_ids(["doc-3", "doc-7"])
        assert not w.pending
        w.compact()
    _check(index_dir, now, openie)  # the compacted base stores them
    assert load_index(index_dir, device="cpu").labels.key_of_id("doc-5") is not None


def test_an_unlabelled_index_stores_no_labels(tmp_path: Path) -> None:
    files = paths()
    index = build_index(files["corpus"], files["openie"], tmp_path / "idx", device="cpu",
                        encoder=ENCODER)
    assert not index.labels
    assert "passage_labels" not in index.payload()[2]["tables"]
    hits = Searcher(index).retrieve(["Who designed the lighthouse?"], top_k=3)[0]
    assert all(h.id is None and h.metadata is None for h in hits)
