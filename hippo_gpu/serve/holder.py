"""SearcherHolder: the version a served index answers from now, switched atomically.

Readers never wait for a writer and never see a mix: the server answers each batch with the
`Searcher` it finds in `SearcherHolder.current` when the batch starts, and a write (or a
background compaction: serve/writes.py's `WritableHolder`) replaces that reference only after
its commit, with a searcher over the new version that reuses the query encoder. A batch that
started before keeps the searcher it took, so a version lives on while a batch reads it and is
dropped after; each switch hands the memory of the dropped version back to the OS
(`release_freed_memory`).

A read-only server follows the versions other processes commit (`hippo-gpu insert`, `delete`,
`compact`, `index --replace`): `follow` polls the directory's manifest.json (its inode, size and
mtime: a commit replaces it by a rename, so one stat a poll sees it) and, when it changed, moves
to the current version as a writable server's writer does, by replaying only the segments
committed since (versions.load.refresh_index; a full load after a compaction or a replace), then
switches. Each answer names the version that gave it (serve/service.py). A version older than
the one served is never switched to, so a follower and a writer of the same holder cannot undo
each other's switch.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
import weakref
from pathlib import Path
from typing import Any

from hippo_gpu.errors import HippoGpuError
from hippo_gpu.indexing.index import Index
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.storage.directory import MANIFEST
from hippo_gpu.versions.load import refresh_index

__all__ = ["FOLLOW_SECONDS", "SearcherHolder", "release_freed_memory"]

log = logging.getLogger(__name__)

FOLLOW_SECONDS = 0.5  # how often a following holder looks at the manifest (one stat)


class SearcherHolder:
    """The searcher queries use now, over one version of one index (read-only as it is; a
    `WritableHolder` switches it after each write)."""

    # the directory a writable holder changes; None: the index is served read-only
    index_dir: Path | None = None

    def __init__(self, searcher: Searcher) -> None:
        self._searcher = searcher
        # every version served here, weakly: how many this process still holds (a leak test)
        self._served: list[weakref.ref[Index]] = [weakref.ref(searcher.index)]
        self._switching = threading.Lock()  # a follower's switch against a writer's
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None

    @property
    def current(self) -> Searcher:
        return self._searcher

    @property
    def versions_in_memory(self) -> int:
        """Versions served here that something in this process still holds: 1 (the current
        one) plus those batches in flight read; an old version that stays is a leak."""
        return sum(r() is not None for r in self._served)

    def switch(self, index: Index, *, warm: bool = False) -> None:
        """Answer from `index` from now on: a searcher over it, moved to the current one's
        device and precision, with the same settings and query encoder (loaded now if it was
        not, so every later version shares it); the memory of the dropped version goes back
        to the OS. With `warm`, the new searcher builds its solvers and fact codes first
        (Searcher.warm_up, seconds at 100k passages) while queries go on answering from the
        current one: for a switch nothing waits on (a basis update's), not a commit's."""
        fresh = None
        if warm:
            old = self._searcher
            old.encoder  # noqa: B018 - load it now, so every later version shares this one
            fresh = old.over(index.to(old.device, old.index.precision))
            fresh.warm_up()
        with self._switching:
            old = self._searcher
            if index.version is not None and old.index.version is not None \
                    and index.version < old.index.version:
                return  # a follower's refresh (or a warmed update) that a commit overtook
            old.encoder  # noqa: B018 - load it now, so every later version shares this one
            self._searcher = fresh if fresh is not None else \
                old.over(index.to(old.device, old.index.precision))
            self._served = [r for r in self._served if r() is not None]
            self._served.append(weakref.ref(self._searcher.index))
            del old
        release_freed_memory()

    def follow(self, seconds: float = FOLLOW_SECONDS) -> None:
        """Follow the versions other processes commit to the served index's directory (module
        docstring): a daemon thread looks at the manifest every `seconds` and switches to a new
        version within about that long after its commit. A failed refresh (a version removed
        under it, a corrupt file) is logged and the served version kept; the next change of the
        manifest tries again. No-op for an index with no directory."""
        path = self.current.index.path
        if path is None or self._follower is not None:
            return
        manifest = Path(path) / MANIFEST
        self._stop.clear()
        self._follower = threading.Thread(target=self._follow, args=(manifest, seconds),
                                          daemon=True, name="hippo-gpu-follow")
        self._follower.start()

    def _follow(self, manifest: Path, seconds: float) -> None:
        seen = _stamp(manifest)
        while not self._stop.wait(seconds):
            now = _stamp(manifest)
            if now == seen:
                continue
            seen = now
            self._refresh(manifest.parent)

    def _refresh(self, root: Path) -> None:
        """Switch to the directory's current version (a function of its own, so that this
        thread holds no version while it waits: the dropped one is freed at once)."""
        current = self.current.index
        try:
            index = refresh_index(current)
        except (OSError, HippoGpuError, ValueError) as e:  # kept: the next change retries
            log.warning("could not follow %s to its new version: %s", root, e)
            return
        if index is not current:
            del current
            self.switch(index)
            log.info("%s: now answering from version %s", root, index.version)

    def close(self) -> None:
        """Stop following (the served version stays)."""
        self._stop.set()
        if self._follower is not None:
            self._follower.join()
            self._follower = None


def _stamp(manifest: Path) -> tuple[int, int, int] | None:
    """What changes when a commit replaces `manifest` (None while there is none)."""
    try:
        st = os.stat(manifest)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


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
