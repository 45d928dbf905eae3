"""An index directory's versions: a base plus a chain of segments; load, refresh, segment files.

A version is what manifest.json names (storage/directory.py): one base directory (vNNNNNN, a full
copy of some version, written by a build or a compaction) and, after it, the segments (sNNNNNN) of
the commits since, in order. A segment holds the change of one commit and what it would be costly to
recompute, nothing derived from the rest of the index:

    change.safetensors  removed [r] passage rows of the previous version; the vectors of the
                        texts it lacked (passages [A, D], phrases [k_m, D], facts [k_f, D], in
                        delta.Plan's row order); the recomputed synonym lists (affected source
                        rows and their accepted edges, in the new version's rows)
    change.json         the added passages (title, text), their normalised triples, malformed
                        counts and error flags; the new version's phrase, fact and passage
                        counts (a replay that disagrees is refused)

Loading replays the chain: the base, then the chain's net change as ONE delta.plan_change and
delta.apply_change with the stored vectors and synonym lists (no encoder, no kNN), composed so
that the result equals replaying each segment in turn, which is the computation each commit ran
(same rows, same bits; versions/chain.py states and proves the composition). A chain of k segments
costs one plan and apply of the index plus a small per-segment walk, not k of them. The embeddings
of the versions in between are never built: rows are placed by index (placed_rows.PendingRows) and
the last version's rows are copied once (placed_rows.settle). A reader that holds version v moves to
the current one by replaying only the segments after v (`refresh_index`): no base is re-read or
re-verified.

A replayed version's passage basis: the newest segment that stores one (its version's basis,
brought current by a low-rank update: versions/live_basis.py) is where the replay splits: the
chain up to it is replayed and gets that basis, the rest is replayed from there, and the current
version's basis is then updated from it (or from the base's when no segment stores one) and
stored with the current segment, so the next reader reads it. A compaction
(`IndexWriter.compact`) writes the current version as a new base with its basis solved, and the
chain starts again from there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hippo_gpu.data import Passage
from hippo_gpu.device import precision_dtype, resolve_device
from hippo_gpu.indexing.index import Index, basis_of, index_of_files
from hippo_gpu.indexing.synonyms import SynonymEdges
from hippo_gpu.storage.directory import Files, IndexFormatError, read_index_dir, read_manifest
from hippo_gpu.versions.chain import Segment, expected_counts, replay_chain
from hippo_gpu.versions.delta import Change, NewVectors, SynonymUpdate
from hippo_gpu.versions.live_basis import Anchor, bring_basis_current
from hippo_gpu.versions.placed_rows import settle

__all__ = ["Segment", "expected_counts", "load_index", "load_version", "load_with_anchor",
           "refresh_index", "refresh_version", "refresh_with_anchor", "segment_files"]


def segment_files(segment: Segment) -> tuple[dict[str, dict[str, torch.Tensor]],
                                               dict[str, dict[str, Any]]]:
    """(tensor groups, tables) of a segment, for directory.write_segment."""
    c, v, s = segment.change, segment.vectors, segment.synonyms
    tensors = {"change": {
        "removed": torch.from_numpy(np.ascontiguousarray(c.removed, dtype=np.int64)),
        "passage_vectors": v.passages.float().contiguous(),
        "phrase_vectors": v.phrases.float().contiguous(),
        "fact_vectors": v.facts.float().contiguous(),
        "synonym_affected": torch.from_numpy(np.ascontiguousarray(s.affected, dtype=np.int64)),
        "synonym_src": torch.from_numpy(s.edges.src.astype(np.int64)),
        "synonym_dst": torch.from_numpy(s.edges.dst.astype(np.int64)),
        "synonym_score": torch.from_numpy(s.edges.score.astype(np.float32)),
    }}
    passages = [{"title": p.title, "text": p.text, "triples": [list(t) for t in ts],
                 "malformed": m, "error": bool(e),
                 **({} if p.id is None else {"id": p.id}),
                 **({} if p.metadata is None else {"metadata": p.metadata})}
                for p, ts, m, e in zip(c.passages, c.triples, c.malformed, c.error)]
    return tensors, {"change": {"passages": passages, "expect": segment.expect}}


def _segment_of(path: Path, files: Files) -> Segment:
    tensors, tables = files
    try:
        t, j = tensors["change"], tables["change"]
        rows = j["passages"]
        change = Change(
            removed=t["removed"].numpy().astype(np.int64),
            passages=[Passage(title=r["title"], text=r["text"], id=r.get("id"),
                              metadata=r.get("metadata")) for r in rows],
            triples=[[tuple(x) for x in r["triples"]] for r in rows],  # type: ignore[misc]
            malformed=[dict(r["malformed"]) for r in rows],
            error=[bool(r["error"]) for r in rows],
        )
        vectors = NewVectors(t["passage_vectors"], t["phrase_vectors"], t["fact_vectors"])
        synonyms = SynonymUpdate(t["synonym_affected"].numpy().astype(np.int64), SynonymEdges(
            t["synonym_src"].numpy().astype(np.int64), t["synonym_dst"].numpy().astype(np.int64),
            t["synonym_score"].numpy().astype(np.float32)))
        return Segment(change, vectors, synonyms, {k: int(v) for k, v in j["expect"].items()})
    except (KeyError, TypeError, ValueError) as err:
        raise IndexFormatError(f"{path}: malformed segment ({err!r})") from err


def load_index(
    path: str | Path,
    device: str | torch.device = "auto",
    *,
    precision: str = "float32",
    encoder: str | None = None,
    verify: bool = True,
) -> Index:
    """Load an index directory's current version onto `device`: its base, verified, then its
    segments replayed (module docstring).

    Args:
        precision: dtype of the embeddings on the device (and so of the scores): "float32"
            (default, on every device), "float16" or "bfloat16" (half the memory; see the
            README for their measured effect on rankings).
        encoder: if given, the encoder the caller intends to query with; a mismatch with the
            encoder the index was built with raises IndexFormatError.
        verify: check every file's sha256 against the manifest.
    """
    precision_dtype(precision)  # validate before reading anything
    index, _ = load_version(path, encoder=encoder, verify=verify)
    return index.to(resolve_device(device), precision)


def load_version(path: str | Path, *, encoder: str | None = None,
                 verify: bool = True) -> tuple[Index, dict[str, Any]]:
    """What `load_index` reads: the current version on the CPU in float32, and the manifest
    that names it (read once; a writer keeps it, so its compaction policy reads nothing)."""
    index, manifest, _ = load_with_anchor(path, encoder=encoder, verify=verify)
    return index, manifest


def load_with_anchor(path: str | Path, *, encoder: str | None = None, verify: bool = True,
                     live_basis: bool = True) -> tuple[Index, dict[str, Any], Anchor | None]:
    """`load_version`, and the anchor of the version's basis updates (live_basis.Anchor). With
    `live_basis`, a version without a stored basis gets one updated from the anchor (and
    stored); without, it is left to whoever holds the anchor (a writer)."""
    root = Path(path)
    manifest, base, segments = read_index_dir(root, verify=verify)
    assert base is not None
    index = index_of_files(root, manifest, base, encoder=encoder)
    index, anchor = _replay(index, Anchor.of(index), segments, root)
    index.version = manifest.get("version")
    if live_basis:
        index, anchor = bring_basis_current(index, anchor)
    return index, manifest, anchor


def _replay(index: Index, anchor: Anchor | None, segments: list[tuple[int, Files]],
            root: Path) -> tuple[Index, Anchor | None]:
    """`index` with `segments` replayed (settled), split at the newest one that stores a basis
    (module docstring), and the anchor of the result."""
    chain = [(v, _segment_of(root, f)) for v, f in segments]
    stored = [i for i, (_, (t, _)) in enumerate(segments) if "basis" in t]
    if stored:
        k = stored[-1]
        index, _ = replay_chain(index, chain[:k + 1], path=root)
        index = settle(index)
        index.basis = basis_of(segments[k][1][0]["basis"], index)
        anchor = Anchor.of(index)
        chain = chain[k + 1:]
    if chain:
        index, node_map = replay_chain(index, chain, path=root)
        anchor = anchor.after(node_map) if anchor is not None else None
    return settle(index), anchor


def refresh_index(index: Index, *, verify: bool = True) -> Index:
    """The current version of `index`'s directory, reached from `index` by replaying only the
    segments committed after it when the directory's base is still the one `index` descends
    from; otherwise (a compaction happened, or `index` was never saved) a full `load_index`.
    Returns `index` itself when it is current. The result lives where `index` does."""
    return refresh_version(index, verify=verify)[0]


def refresh_version(index: Index, *, verify: bool = True) -> tuple[Index, dict[str, Any]]:
    """`refresh_index`, and the manifest that names the version it returns (read once; a
    writer keeps it)."""
    out, manifest, _ = refresh_with_anchor(index, verify=verify)
    return out, manifest


def refresh_with_anchor(index: Index, *, verify: bool = True, live_basis: bool = True,
                        anchor: Anchor | None = None
                        ) -> tuple[Index, dict[str, Any], Anchor | None]:
    """`refresh_version`, and the anchor of the version returned (`load_with_anchor`):
    `anchor` is the held version's (default: the held version itself when it has a basis)."""
    if index.path is None:
        raise ValueError("refresh_index needs an index loaded from (or saved to) a directory")
    root = Path(index.path)
    manifest = read_manifest(root)
    held = anchor if anchor is not None else Anchor.of(index)
    if manifest.get("version") == index.version:
        return index, manifest, held
    chain = {int(s["version"]) for s in manifest.get("segments", [])}
    same = {int(str(manifest.get("base", "v0"))[1:] or 0), manifest.get("base_from")} | chain
    if index.version is None or index.version not in same:
        out, manifest, held = load_with_anchor(root, verify=verify, live_basis=live_basis)
        return out.to(index.device, index.precision), manifest, held
    manifest, _, segments = read_index_dir(root, verify=verify, after=int(index.version))
    out = index.to("cpu", "float32")
    out, held = _replay(out, held, segments, root)
    out.version = manifest.get("version")
    if live_basis:
        out, held = bring_basis_current(out, held)
    return out.to(index.device, index.precision), manifest, held
