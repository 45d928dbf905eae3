"""A write that fails (an unknown key, malformed OpenIE or corpus, an empty result, a directory
that is not an index) raises and changes nothing on disk, byte for byte, and stages nothing.
"""

from __future__ import annotations

import pytest

from hippo_gpu import load_index
from hippo_gpu.data import DataFormatError
from hippo_gpu.storage.directory import MANIFEST
from hippo_gpu.versions.writer import IndexWriter
from tests.versions.index_checks import (
    copy_index,
    manifest_version,
    snapshot,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_unknown_key_raises_and_changes_nothing(enc, sample, base_dir, tmp_path):
    index_dir = copy_index(base_dir, tmp_path / "index")
    before, version = snapshot(index_dir), manifest_version(index_dir)
    known = sample["corpus"][0].key
    with pytest.raises(KeyError, match="chunk-nope"):
        with IndexWriter(index_dir, device="cpu", encoder=enc) as w:
            w.delete([known, "chunk-nope"])
    assert snapshot(index_dir) == before and manifest_version(index_dir) == version
    # nothing of the failed call was staged: a later commit holds only the valid change
    with IndexWriter(index_dir, device="cpu", encoder=enc) as w:
        w.insert(sample["corpus"][20:21], sample["openie_path"])
        with pytest.raises(KeyError, match="chunk-nope"):
            w.delete([known, "chunk-nope"])
        with pytest.raises(KeyError, match="no such title"):
            w.delete_titles(["no such title"])
    got = load_index(index_dir, device="cpu")
    assert got.passage_keys == [p.key for p in sample["corpus"][:21]]


BAD_INPUT = {
    "doc missing": lambda s, new: {"docs": []},
    "docs not a list": lambda s, new: {"docs": "not a list"},
    "doc not an object": lambda s, new: [1, 2],
    "doc without a key": lambda s, new: {"docs": [{"extracted_triples": []}]},
    "no such file": lambda s, new: "/nonexistent/openie.json",
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_malformed_openie_raises_and_changes_nothing(case, enc, sample, base_dir, tmp_path):
    index_dir = copy_index(base_dir, tmp_path / "index")
    before, version = snapshot(index_dir), manifest_version(index_dir)
    new = sample["corpus"][20:22]
    with pytest.raises(DataFormatError):
        with IndexWriter(index_dir, device="cpu", encoder=enc) as w:
            try:
                w.insert(new, BAD_INPUT[case](sample, new))
            finally:
                assert not w.pending  # nothing staged
    assert snapshot(index_dir) == before and manifest_version(index_dir) == version


def test_malformed_corpus_and_empty_result_change_nothing(enc, sample, base_dir, tmp_path):
    index_dir = copy_index(base_dir, tmp_path / "index")
    before = snapshot(index_dir)
    w = IndexWriter(index_dir, device="cpu", encoder=enc).open()
    try:
        with pytest.raises(DataFormatError, match="strings"):
            w.insert([{"title": "t", "text": 5}], sample["openie_path"])
        with pytest.raises(DataFormatError, match="duplicates"):
            w.insert([sample["corpus"][25], sample["corpus"][25]], sample["openie_path"])
        with pytest.raises(TypeError):
            w.delete(sample["corpus"][0].key)  # one string, not a list
        assert not w.pending
        w.delete([p.key for p in sample["corpus"][:20]])
        with pytest.raises(DataFormatError, match="without passages"):
            w.commit()
    finally:
        w.close()  # discards the staged deletes
    assert snapshot(index_dir) == before


def test_a_directory_without_manifest_is_refused_and_kept(enc, base_dir, tmp_path):
    """A writer pointed at a directory that is not an index (a typo, or an index whose manifest
    was lost) raises and changes nothing: no directory created, no version deleted."""
    from hippo_gpu.storage.directory import IndexFormatError

    typo = tmp_path / "no_such_index"
    with pytest.raises(IndexFormatError, match="not a hippo-gpu index"):
        IndexWriter(typo, device="cpu", encoder=enc).open()
    assert not typo.exists()
    index_dir = copy_index(base_dir, tmp_path / "index")
    (index_dir / MANIFEST).rename(tmp_path / "manifest.json.bak")
    before = snapshot(index_dir)
    with pytest.raises(IndexFormatError, match="not a hippo-gpu index"):
        IndexWriter(index_dir, device="cpu", encoder=enc).open()
    assert snapshot(index_dir) == before and (index_dir / "v000001").is_dir()
