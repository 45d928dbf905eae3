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

A replayed version carries no passage basis (it depends on the whole graph; hipporag2 then
iterates): a compaction (`IndexWriter.compact`) writes the current version as a new base with
its basis solved, and the chain starts again from there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hippo_gpu.data import Passage
from hippo_gpu.device import precision_dtype, resolve_device
from hippo_gpu.indexing.index import Index, index_of_files
from hippo_gpu.indexing.synonyms import SynonymEdges
from hippo_gpu.storage.directory import Files, IndexFormatError, read_index_dir, read_manifest
from hippo_gpu.versions.chain import Segment, expected_counts, replay_chain
from hippo_gpu.versions.delta import Change, NewVectors, SynonymUpdate
from hippo_gpu.versions.placed_rows import settle

__all__ = ["Segment", "expected_counts", "load_index", "load_version", "refresh_index",
           "refresh_version", "segment_files"]


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
    root = Path(path)
    manifest, base, segments = read_index_dir(root, verify=verify)
    assert base is not None
    index = index_of_files(root, manifest, base, encoder=encoder)
    if segments:
        index = replay_chain(index, [(v, _segment_of(root, f)) for v, f in segments], path=root)
    index = settle(index)  # the embeddings of the last version only, each row copied once
    index.version = manifest.get("version")
    return index, manifest


def refresh_index(index: Index, *, verify: bool = True) -> Index:
    """The current version of `index`'s directory, reached from `index` by replaying only the
    segments committed after it when the directory's base is still the one `index` descends
    from; otherwise (a compaction happened, or `index` was never saved) a full `load_index`.
    Returns `index` itself when it is current. The result lives where `index` does."""
    return refresh_version(index, verify=verify)[0]


def refresh_version(index: Index, *, verify: bool = True) -> tuple[Index, dict[str, Any]]:
    """`refresh_index`, and the manifest that names the version it returns (read once; a
    writer keeps it)."""
    if index.path is None:
        raise ValueError("refresh_index needs an index loaded from (or saved to) a directory")
    root = Path(index.path)
    manifest = read_manifest(root)
    if manifest.get("version") == index.version:
        return index, manifest
    chain = {int(s["version"]) for s in manifest.get("segments", [])}
    same = {int(str(manifest.get("base", "v0"))[1:] or 0), manifest.get("base_from")} | chain
    if index.version is None or index.version not in same:
        out, manifest = load_version(root, verify=verify)
        return out.to(index.device, index.precision), manifest
    manifest, _, segments = read_index_dir(root, verify=verify, after=int(index.version))
    out = index.to("cpu", "float32")
    if segments:
        out = replay_chain(out, [(v, _segment_of(root, f)) for v, f in segments], path=root)
    out = settle(out)
    out.version = manifest.get("version")
    return out.to(index.device, index.precision), manifest
