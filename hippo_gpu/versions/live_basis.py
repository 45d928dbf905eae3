"""The live passage basis: each committed version's basis brought current from an earlier one.

A commit changes a few nodes' edges, and the passage basis (hippo_gpu.ppr.basis) depends on the
whole graph; without one, hipporag2 iterates over every edge (3x slower per query at 100k
passages). hippo_gpu.ppr.basis_update brings a basis of an earlier version, the *anchor*, to a
later one by a certified low-rank update: one PPR column per changed node instead of D + 1 over
the whole graph. This module holds what that needs from the versions: the anchor (its graph and
basis) and the node map from it to the version now held, kept through commits and replays
(several commits fold into one update: the map composes, the update's changed set is the
union), and the stored basis of a segment (storage.directory.write_segment_basis).

Who updates, and when:
  * `serve --writable` (serve/writes.py): after each commit a background thread updates the
    basis of the newest version from the anchor, stores it with that version's segment and
    switches queries to it; writes that land meanwhile are folded into the next update.
  * a reader (`load_index`, `Searcher.refresh`) that finds no stored basis for the version it
    loads updates it from the newest stored one (or the base) and stores it (best effort: a
    read-only directory only loses the saving), so the next reader reads it.
  * the CLI's insert and delete do not: at 100k passages the update costs about as much as
    the commit itself, so the first reader (or a server) pays it once instead.
An update whose changed set would cost more than `MAX_SHARE` of a full solve is not run: the
version stays without a basis (hipporag2 iterates) until a compaction solves one. An update whose
certified bound would exceed its budget (a change touching much of a small graph) solves the
basis instead on graphs of up to SMALL_GRAPH nodes (well under a second), and leaves it to a
compaction above.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from hippo_gpu.indexing.index import Index
from hippo_gpu.ppr.basis import PassageBasis, solve_basis
from hippo_gpu.ppr.basis_update import (
    BasisUpdate,
    UpdateReport,
    changed_nodes,
    compose_node_maps,
    update_basis,
)
from hippo_gpu.ppr.iteration import ConvergenceError
from hippo_gpu.ppr.solver import PPRSolver
from hippo_gpu.storage.directory import write_segment_basis

log = logging.getLogger(__name__)

__all__ = ["MAX_SHARE", "Anchor", "bring_basis_current", "store_basis", "update_from_anchor"]

MAX_SHARE = 0.5  # the most solved columns an update may take, as a share of a full solve's D + 1
SMALL_GRAPH = 100_000  # nodes: an update over its bound budget solves the basis instead (< 1 s)


@dataclass(frozen=True)
class Anchor:
    """The newest version with a basis and the node map from it to the version now held.

    Attributes:
        version: its version number (None for an index never saved).
        adjacency, passage_nodes, passage_emb: its graph [N, N], passage rows [P], passage
            vectors [P, D] (CPU).
        basis: its basis.
        node_map: [N] row of each anchor node in the version held, −1 if removed; None when
            the anchor is the version held.
    """

    version: int | None
    adjacency: Tensor
    passage_nodes: Tensor
    passage_emb: Tensor
    basis: PassageBasis
    node_map: np.ndarray | None = None

    @classmethod
    def of(cls, index: Index) -> Anchor | None:
        """`index` as the anchor of itself, or None when it has no basis to update from."""
        if index.basis is None or not np.isfinite(index.basis.h_err):
            return None
        return cls(index.version, index.adjacency, index.passage_nodes, index.passage_emb,
                   index.basis.to("cpu"))

    def after(self, node_map: np.ndarray) -> Anchor:
        """This anchor once the held version changes by a change with node map `node_map`."""
        composed = node_map if self.node_map is None else \
            compose_node_maps(self.node_map, node_map)
        return Anchor(self.version, self.adjacency, self.passage_nodes, self.passage_emb,
                      self.basis, composed)


def update_from_anchor(anchor: Anchor, index: Index, *,
                       solver: PPRSolver | None = None) -> BasisUpdate | None:
    """The basis of `index` (the version held) updated from `anchor`, or None when the update
    would solve more than MAX_SHARE of a full solve's columns (or the anchor is `index`)."""
    if anchor.node_map is None:
        return None
    changed = changed_nodes(anchor.adjacency, index.adjacency, anchor.node_map)
    old = changed[changed < index.num_nodes]
    inverse = np.full(index.num_nodes, -1, dtype=np.int64)
    alive = np.nonzero(anchor.node_map >= 0)[0]
    inverse[anchor.node_map[alive]] = alive
    removed = int((anchor.node_map < 0).sum())
    columns = int((inverse[old] >= 0).sum()) + removed  # an upper bound of the solved columns
    if columns > MAX_SHARE * (anchor.basis.z.shape[1] + 1):
        log.info("basis update from version %s would solve %d columns: left to a compaction",
                 anchor.version, columns)
        return None
    try:
        return update_basis(anchor.basis, anchor.adjacency, anchor.passage_nodes,
                            anchor.passage_emb, index.adjacency, index.passage_nodes,
                            index.passage_emb, anchor.node_map, solver=solver, changed=changed)
    except ConvergenceError as e:  # over its budget: a large change on a small graph
        if index.num_nodes > SMALL_GRAPH:
            log.info("basis update from version %s left to a compaction: %s", anchor.version, e)
            return None
        t0 = time.perf_counter()
        basis = solve_basis(index.adjacency, index.passage_nodes, index.passage_emb,
                            damping=anchor.basis.damping, tol=anchor.basis.tol)
        report = UpdateReport(changed=len(changed), solved=int(basis.z.shape[1]) + 1,
                              steps=basis.steps, tol=basis.tol, added_bound_ratio=0.0,
                              seconds=time.perf_counter() - t0)
        return BasisUpdate(basis, report)


def store_basis(index_dir: str | Path, version: int | None, basis: PassageBasis) -> bool:
    """Store `basis` with segment `version` (write_segment_basis); False when it was not
    stored (no such segment any more, one is stored already, or the directory refuses it:
    logged, the basis still serves this process)."""
    if version is None:
        return False
    try:
        return write_segment_basis(index_dir, int(version), basis.tensors())
    except OSError as e:
        log.warning("%s: the updated basis of version %s was not stored (%s); the next reader "
                    "updates it again", index_dir, version, e)
        return False


def bring_basis_current(index: Index, anchor: Anchor | None,
                        store: bool = True) -> tuple[Index, Anchor | None]:
    """`index` with its basis updated from `anchor` (and stored with its segment when `store`
    and the index has a directory), and the anchor after it; unchanged when it has a basis,
    there is no anchor, its config keeps none, or the update is too large."""
    if index.basis is not None or anchor is None or not index.config.ppr_basis:
        return index, anchor
    update = update_from_anchor(anchor, index)
    if update is None:
        return index, anchor
    index.basis = update.basis
    if store and index.path is not None:
        store_basis(index.path, index.version, update.basis)
    return index, Anchor.of(index)
