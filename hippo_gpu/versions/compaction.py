"""When a writer compacts, and what a compaction writes before it becomes current.

`compaction_due` is the one compaction policy (IndexWriter.commit, the server's background
compactor in serve/writes.py and `hippo-gpu compact`); `PreparedBase` is a compaction's new base,
written but not yet installed (IndexWriter.prepare_compaction / finish_compaction).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from hippo_gpu.indexing.build import Stages
from hippo_gpu.indexing.index import Index

__all__ = ["COMPACT_AFTER", "SEGMENT_FRACTION", "PreparedBase", "compaction_due"]

COMPACT_AFTER = 16  # segments a writer lets accumulate before it compacts (IndexWriter)
SEGMENT_FRACTION = 0.25  # segments of more than this share of the base's bytes: compact


def compaction_due(manifest: dict[str, Any], held: Index | None = None, *,
                   max_segments: int = COMPACT_AFTER) -> bool:
    """Whether to compact now: the one policy of `IndexWriter.commit`, the server's background
    compactor (serve/writes.py) and `hippo-gpu compact` (`max_segments=1`: any segment).

    Due when loads replay too much of the chain `manifest` names: `max_segments` segments or
    more, or segment files of more than SEGMENT_FRACTION of the base's bytes; or, given `held`
    (the version that manifest names, as its writer holds it), when `held` lacks the passage
    basis its config keeps, which only a compaction solves. A commit passes no `held`: every
    commit leaves the basis stale, which must not compact each time.
    """
    if held is not None and held.config.ppr_basis and held.basis is None:
        return True
    segments = manifest.get("segments", [])
    if not segments:
        return False
    seg_bytes = sum(f["bytes"] for s in segments for f in s["files"].values())
    base_bytes = sum(f["bytes"] for f in manifest.get("files", {}).values())
    return len(segments) >= max_segments or seg_bytes > SEGMENT_FRACTION * base_bytes


@dataclass
class PreparedBase:
    """A compaction's base directory, written but not yet current (IndexWriter)."""

    index: Index  # the version it holds, with its basis
    name: str  # vNNNNNN
    files: dict[str, Any]
    manifest: dict[str, Any]  # the base's own manifest fields
    hold: contextlib.ExitStack  # the lock that keeps garbage collection off it
    stages: Stages
