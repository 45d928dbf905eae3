"""SearcherHolder: the version a served index answers from now, switched atomically.

Readers never wait for a writer and never see a mix: the server answers each batch with the
`Searcher` it finds in `SearcherHolder.current` when the batch starts, and a write (or a
background compaction: serve/writes.py's `WritableHolder`) replaces that reference only after
its commit, with a searcher over the new version that reuses the query encoder. A batch that
started before keeps the searcher it took, so a version lives on while a batch reads it and is
dropped after; each switch hands the memory of the dropped version back to the OS
(`release_freed_memory`).
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from pathlib import Path
from typing import Any

from hippo_gpu.indexing.index import Index
from hippo_gpu.retrieval.searcher import Searcher

__all__ = ["SearcherHolder", "release_freed_memory"]


class SearcherHolder:
    """The searcher queries use now, over one version of one index (read-only as it is; a
    `WritableHolder` switches it after each write)."""

    # the directory a writable holder changes; None: the index is served read-only
    index_dir: Path | None = None

    def __init__(self, searcher: Searcher) -> None:
        self._searcher = searcher
        # every version served here, weakly: how many this process still holds (a leak test)
        self._served: list[weakref.ref[Index]] = [weakref.ref(searcher.index)]

    @property
    def current(self) -> Searcher:
        return self._searcher

    @property
    def versions_in_memory(self) -> int:
        """Versions served here that something in this process still holds: 1 (the current
        one) plus those batches in flight read; an old version that stays is a leak."""
        return sum(r() is not None for r in self._served)

    def switch(self, index: Index) -> None:
        """Answer from `index` from now on: a searcher over it, moved to the current one's
        device and precision, with the same settings and query encoder (loaded now if it was
        not, so every later version shares it); the memory of the dropped version goes back
        to the OS."""
        old = self._searcher
        old.encoder  # noqa: B018 - load it now, so every later version shares this one
        self._searcher = old.over(index.to(old.device, old.index.precision))
        self._served = [r for r in self._served if r() is not None]
        self._served.append(weakref.ref(self._searcher.index))
        del old
        release_freed_memory()


@functools.cache
def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Give the heap memory freed by the versions a write dropped back to the OS.

    A commit allocates the new version's arrays while the old one lives, then frees the old
    one; glibc keeps such freed memory in its arenas, so without this a writable server's RSS
    climbs over a write stream until it plateaus at several copies of the index, though no
    object leaks (one version and one searcher stay alive; benchmarks/bench_soak.py reports
    the RSS under load). A no-op where the C library has no malloc_trim.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
