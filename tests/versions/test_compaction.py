"""Compaction (IndexWriter.compact, prepare/finish_compaction, the default policy): a commit
writes a segment and defers the basis; a compaction writes a new base of the same content whose
basis is its own graph's and a fresh build's; a commit made during a compaction stays in the
chain after the new base.
"""

from __future__ import annotations

import json

import pytest
import torch

from hippo_gpu import load_index
from hippo_gpu.storage.directory import MANIFEST
from hippo_gpu.versions.writer import IndexWriter
from tests.helpers import assert_basis_close, transition_gap
from tests.versions.index_checks import (
    assert_same_index,
    build,
    copy_index,
    leftovers,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_commit_defers_the_basis_and_a_compaction_solves_it(enc, sample, base_dir, tmp_path):
    """A commit writes a segment and leaves the new version without a basis (it depends on the
    whole graph); the first reader updates it from the base's (versions/live_basis.py) and
    stores it with the segment, where the next reader finds it; `compact` writes a new base
    whose basis is its own graph's (a fresh solve_basis on it, within both bounds) and a fresh
    build's of the same corpus (same graph here, so within the bounds alone), stored with the
    base; loads and the writer agree."""
    from hippo_gpu.config import RetrievalConfig
    from hippo_gpu.ppr.basis import solve_basis

    index_dir = copy_index(base_dir, tmp_path / "index")
    old = load_index(index_dir, device="cpu")
    with IndexWriter(index_dir, device="cpu", encoder=enc, compact_after=None) as w:
        assert w.insert(sample["corpus"][20:], sample["openie_path"]) == 10
        new = w.commit()
        assert new.basis is None and not w.last_change.compacted
        manifest = json.loads((index_dir / MANIFEST).read_text())
        assert [s["name"] for s in manifest["segments"]] == [f"s{new.version:06d}"]
        read = load_index(index_dir, device="cpu")  # updates the basis and stores it
        assert read.basis is not None and read.basis.updates == 1
        assert (index_dir / f"s{new.version:06d}" / "basis.json").exists()
        again = load_index(index_dir, device="cpu")  # reads the stored one
        assert torch.equal(again.basis.z, read.basis.z)
        assert torch.equal(again.basis.h, read.basis.h)
        compacted = w.compact()
        assert "basis" in w.last_compaction
    assert compacted.version == new.version + 1
    manifest = json.loads((index_dir / MANIFEST).read_text())
    assert manifest["segments"] == [] and manifest["base_from"] == new.version
    basis = compacted.basis
    assert basis is not None and basis.z.shape == (30, new.passage_emb.shape[1])
    fresh = solve_basis(new.adjacency, new.passage_nodes, new.passage_emb,
                        damping=RetrievalConfig().damping)
    assert_basis_close(basis, fresh)
    want = build(enc, sample, sample["corpus"])
    assert transition_gap(new.adjacency, want.adjacency) == 0.0  # equal graphs here, so:
    assert_basis_close(basis, want.basis)
    loaded = load_index(index_dir, device="cpu")
    assert torch.equal(loaded.basis.z, basis.z) and torch.equal(loaded.basis.h, basis.h)
    assert old.basis.z.shape[0] == 20  # the old version kept its own


def test_a_commit_during_a_compaction_stays_in_the_chain(enc, sample, base_dir, tmp_path):
    """prepare_compaction writes a base of version V without the writer lock; a commit made
    before finish_compaction is kept as a segment after that base: the load equals the
    writer's version, the base holds V with its basis, and nothing is left behind."""
    index_dir = copy_index(base_dir, tmp_path / "index")
    corpus = sample["corpus"]
    with IndexWriter(index_dir, device="cpu", encoder=enc, compact_after=None) as w:
        w.insert(corpus[20:23], sample["openie_path"])
        v = w.commit().version
        prepared = w.prepare_compaction()
        w.delete([corpus[1].key])
        later = w.commit()
        current = w.finish_compaction(prepared)
        assert current is later and current.basis is None
    manifest = json.loads((index_dir / MANIFEST).read_text())
    assert manifest["base_from"] == v and manifest["version"] == later.version
    assert [s["version"] for s in manifest["segments"]] == [later.version]
    # the base's number was taken when it was prepared: the commit after it got the next
    assert manifest["base"] == prepared.name == f"v{v + 1:06d}" and later.version == v + 2
    assert leftovers(index_dir) == []
    loaded = load_index(index_dir, device="cpu")
    assert_same_index(loaded, later)
    assert_same_index(loaded, build(enc, sample, [p for p in corpus[:23] if p != corpus[1]]))
    assert prepared.index.basis is not None and prepared.index.version == v


def test_the_default_policy_compacts_a_chain_that_outweighs_its_base(enc, sample, base_dir,
                                                                      tmp_path):
    """With the default policy a commit whose segment exceeds a quarter of the base's bytes
    (any insert into the 20-passage sample) compacts at once: one base, no segments, a basis,
    and the compaction's stages in the commit's report."""
    index_dir = copy_index(base_dir, tmp_path / "index")
    with IndexWriter(index_dir, device="cpu", encoder=enc) as w:
        w.insert(sample["corpus"][20:], sample["openie_path"])
        new = w.commit()
        report = w.last_change
    manifest = json.loads((index_dir / MANIFEST).read_text())
    assert report.compacted and manifest["segments"] == [] and report.version == new.version
    assert new.basis is not None and "compact_basis" in report.stage_seconds
    assert leftovers(index_dir) == []
