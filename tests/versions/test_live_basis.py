"""The writer's live basis (versions/live_basis.py, IndexWriter.prepare/finish_basis_update): each
commit's basis brought current from the anchor, commits made during an update folded into the
next one, the basis stored with its segment for later readers, and every updated basis within its
certified bounds of a fresh solve on the same graph."""

from __future__ import annotations

import pytest

from hippo_gpu import load_index
from hippo_gpu.ppr.basis import solve_basis
from hippo_gpu.versions.writer import IndexWriter
from tests.helpers import assert_basis_close
from tests.versions.index_checks import copy_index

pytestmark = pytest.mark.usefixtures("one_thread")


def test_each_commit_gets_an_updated_basis_and_later_commits_fold(enc, sample, base_dir,
                                                                  tmp_path):
    index_dir = copy_index(base_dir, tmp_path / "index")
    corpus = sample["corpus"]
    with IndexWriter(index_dir, device="cpu", encoder=enc, compact_after=None) as w:
        w.insert(corpus[20:22], sample["openie_path"])
        first = w.commit()
        assert first.basis is None and w.updates_basis
        prepared = w.prepare_basis_update()  # the held version, from the base
        w.delete([corpus[2].key])  # a commit lands while the update "runs"
        second = w.commit()
        assert w.finish_basis_update(prepared) is None  # not the held version any more
        assert w.store_basis_update(prepared)
        assert (index_dir / f"s{first.version:06d}" / "basis.json").exists()
        prepared = w.prepare_basis_update()  # folds `second` on top of `first`'s basis
        served = w.finish_basis_update(prepared)
        assert served is not None and served.version == second.version
        assert served.basis is not None and served.basis.updates == 2
        assert w.index is served and w.prepare_basis_update() is None  # nothing left to do
        served_basis = served.basis
        served.basis = None
        assert_basis_close(served_basis, fresh_of(served))
    # a reader of `second` finds no stored basis for it: it updates from the newest stored
    # one (first's), and stores its own
    reader = load_index(index_dir, device="cpu")
    assert reader.version == second.version and reader.basis is not None
    assert reader.basis.updates == 2
    assert (index_dir / f"s{second.version:06d}" / "basis.json").exists()
    again = load_index(index_dir, device="cpu")
    assert again.basis.z.equal(reader.basis.z)


def fresh_of(index):
    return solve_basis(index.adjacency, index.passage_nodes, index.passage_emb, damping=0.5)


def test_a_basis_stored_wrong_is_ignored(enc, sample, base_dir, tmp_path):
    """A stored basis whose file does not match its record loads as none (then updated
    again): never an error, never a wrong basis."""
    index_dir = copy_index(base_dir, tmp_path / "index")
    with IndexWriter(index_dir, device="cpu", encoder=enc, compact_after=None) as w:
        w.insert(sample["corpus"][20:21], sample["openie_path"])
        v = w.commit().version
        prepared = w.prepare_basis_update()
        w.finish_basis_update(prepared)
        assert w.store_basis_update(prepared)
        assert not w.store_basis_update(prepared)  # stored once
    path = index_dir / f"s{v:06d}" / "basis.safetensors"
    data = bytearray(path.read_bytes())
    data[-9] ^= 0xFF  # one bit of the last tensor's data
    path.write_bytes(bytes(data))
    from hippo_gpu.ppr.basis import PassageBasis
    from hippo_gpu.storage.safetensors_io import load_safetensors_mmap

    corrupt = PassageBasis.from_tensors(load_safetensors_mmap(path)).tensors()
    got = load_index(index_dir, device="cpu")  # verifies: the record's sha256 does not match
    assert got.basis is not None
    assert any(not t.equal(corrupt[k]) for k, t in got.basis.tensors().items())
    assert_basis_close(got.basis, fresh_of(got))
