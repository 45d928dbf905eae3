"""An embedding matrix's rows at their places in the next version: copied by runs, or left
pending (PendingRows) and copied once at the end of a chain.

A change keeps the surviving rows in their order (delta's module docstring, step 2), so the map
from old rows to new ones is monotone and cuts into few runs of consecutive rows: c changed rows
give at most 2c + 1 runs, and a copy by runs is c + 1 slice copies at memory speed. A replay of a
chain (chain.replay_chain) places each intermediate version's rows by index only (12 bytes a row)
and copies the final version's rows once (`settle`). The buffers come from device.host_empty
(huge pages for the matrices of a large index).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from hippo_gpu.device import host_empty
from hippo_gpu.indexing.index import Index

__all__ = ["PendingRows", "placed", "runs", "settle"]


def runs(to_new: np.ndarray) -> list[tuple[int, int, int]]:
    """The monotone map `to_new` [n] (-1: dropped) as copy runs (old start, new start, length):
    maximal stretches of consecutive old rows landing on consecutive new rows. A change of c
    rows gives at most 2c + 1 runs, so a copy by runs is c + 1 memcpy calls."""
    live = np.nonzero(to_new >= 0)[0]
    if not len(live):
        return []
    dest = to_new[live]
    cut = np.nonzero((np.diff(live) != 1) | (np.diff(dest) != 1))[0] + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(live)]])
    return [(int(live[a]), int(dest[a]), int(b - a)) for a, b in zip(starts, ends)]


_SLICE_ROWS = 16  # a run this long is one slice copy in PendingRows.settle; shorter: gathered


@dataclass
class PendingRows:
    """An embedding matrix not yet copied: row i is `sources[src[i]][row[i]]`.

    A replay of a chain of segments (chain.replay_chain) places the final version's rows by
    index only, 12 bytes per row instead of the row itself, lets the chain redirect a row to a
    later stored vector, and copies every row once at the end (`settle`).
    """

    sources: list[torch.Tensor]
    src: np.ndarray  # [n] int32
    row: np.ndarray  # [n] int64

    @classmethod
    def of(cls, t: torch.Tensor) -> PendingRows:
        return cls([t], np.zeros(t.shape[0], np.int32), np.arange(t.shape[0], dtype=np.int64))

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.src), int(self.sources[0].shape[1])

    def settle(self) -> torch.Tensor:
        """The matrix: [n, D] float32, copied by runs of consecutive source rows (one slice
        copy each, as `placed`), the rows of short runs gathered per source: a chain keeps the
        base's rows in long runs (c changed rows cut at most 2c + 1), so this is memcpy speed."""
        out = host_empty(self.shape)
        n = len(self.src)
        if not n:
            return out
        sources = [t.detach().cpu().float() for t in self.sources]
        cut = np.nonzero((np.diff(self.src) != 0) | (np.diff(self.row) != 1))[0] + 1
        starts = np.concatenate([[0], cut])
        lengths = np.diff(np.concatenate([starts, [n]]))
        long = lengths >= _SLICE_ROWS
        for a, k in zip(starts[long].tolist(), lengths[long].tolist()):
            r = int(self.row[a])
            out[a:a + k] = sources[int(self.src[a])][r:r + k]
        short = np.repeat(~long, lengths)  # [n] rows left to the gather
        for s, t in enumerate(sources):
            at = np.nonzero(short & (self.src == s))[0]
            if len(at):
                out.index_copy_(0, torch.from_numpy(at),
                                t.index_select(0, torch.from_numpy(self.row[at])))
        return out


def settle(index: Index) -> Index:
    """`index` with its pending embedding matrices (PendingRows) copied into tensors."""

    def one(t: Any) -> torch.Tensor:
        return t.settle() if isinstance(t, PendingRows) else t

    return replace(index, passage_emb=one(index.passage_emb), phrase_emb=one(index.phrase_emb),
                   fact_emb=one(index.fact_emb))


def placed(old: torch.Tensor | PendingRows, to_new: np.ndarray, n_new: int, rows: np.ndarray,
            fresh: torch.Tensor, *, pending: bool = False) -> torch.Tensor | PendingRows:
    """[n_new, D] float32: the old rows at their new rows (copied by runs), the fresh ones at
    `rows`; with `pending` (or pending old rows) the same as PendingRows, nothing copied."""
    if pending or isinstance(old, PendingRows):
        prev = old if isinstance(old, PendingRows) else PendingRows.of(old)
        src, row = np.empty(n_new, np.int32), np.empty(n_new, np.int64)
        for a, b, n in runs(to_new):
            src[b:b + n], row[b:b + n] = prev.src[a:a + n], prev.row[a:a + n]
        sources = prev.sources
        if len(rows):
            sources = [*sources, fresh.float().cpu()]
            src[rows], row[rows] = len(sources) - 1, np.arange(len(rows))
        return PendingRows(sources, src, row)
    out = host_empty((n_new, int(old.shape[1])))
    src_t = old.detach().cpu()
    for a, b, n in runs(to_new):
        out[b:b + n] = src_t[a:a + n]
    if len(rows):
        out[torch.from_numpy(rows)] = fresh.float().cpu()
    return out
