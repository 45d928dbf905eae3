"""The index directory's locks: one writer at a time, and writable servers kept apart from a
replace (storage/directory.py's docstring has the directory layout they sit in).

    DIR/.writer.lock   the single-writer lock (flock; the OS releases it if a writer dies)
    DIR/.server.lock   held shared by every server that writes DIR (`serve --writable`) for its
                       life (`claim_for_serving`): a new base replacing DIR's content (a build's
                       save, `hippo-gpu index --replace`) is refused while one runs
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from hippo_gpu.errors import HippoGpuError
from hippo_gpu.storage.durable import naming_full_disk

WRITER_LOCK = ".writer.lock"
SERVER_LOCK = ".server.lock"


class WriterLockedError(HippoGpuError, RuntimeError):
    """Another writer holds the index directory's lock."""


@contextlib.contextmanager
def writer_lock(index_dir: str | Path) -> Iterator[None]:
    """Hold DIR's single-writer lock (non-blocking: a second writer gets WriterLockedError)."""
    root = Path(index_dir)
    path = root / WRITER_LOCK
    with naming_full_disk(path):
        root.mkdir(parents=True, exist_ok=True)
        lock = path.open("a+")
    with lock as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                f.seek(0)
                holder = f.read().strip() or "unknown"
                raise WriterLockedError(
                    f"{root}: another writer holds the index (pid {holder}); wait for it to "
                    "commit, or stop it") from None
            raise
        f.seek(0)
        f.truncate()
        # the pid only names the holder to a refused writer: unbuffered, and a full disk may
        # leave it out (a writer that frees space, a compaction, must still get the lock)
        with contextlib.suppress(OSError):
            os.write(f.fileno(), str(os.getpid()).encode())
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            f.flush()
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def claim_for_serving(index_dir: str | Path) -> IO[bytes]:
    """A writable server's claim on DIR for its whole life: a shared flock on DIR/.server.lock
    (waiting out a replace in progress), returned as the open file; closing it, or the process
    ending, releases the claim. Why: such a server's writer keeps its last version in memory
    and holds the writer lock only while it writes, so an index built over DIR between two
    writes would be overwritten by the next one (an inserted passage gone, a deleted one back);
    `Index.save` is therefore refused while any claim is held (`servers_kept_off`)."""
    path = Path(index_dir) / SERVER_LOCK
    with naming_full_disk(path):
        f = path.open("a+b")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
        with contextlib.suppress(OSError):  # only names a holder to a refused replace
            f.seek(0)
            f.truncate()
            os.write(f.fileno(), str(os.getpid()).encode())
    except BaseException:
        f.close()
        raise
    return f


def _try_exclusive(path: Path) -> tuple[IO[bytes] | None, str | None]:
    """(the file, None) with an exclusive flock taken on `path`, (None, holder) when another
    file description holds a lock on it ("unknown" when it names no pid), (None, None) when
    there is no such file. Creates nothing."""
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return None, None
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = f.read(32).decode("ascii", "replace").strip() or "unknown"
        f.close()
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return None, holder
        raise
    return f, None


def holder_of(index_dir: str | Path) -> str | None:
    """Who holds DIR now, as a phrase for a refusal ("a writer (pid 12)", "a writable server
    (pid 34)"), or None when nobody does. A probe: each lock is tried without waiting and
    released at once, and no file is created."""
    root = Path(index_dir)
    for name, who in ((WRITER_LOCK, "a writer"), (SERVER_LOCK, "a writable server")):
        f, holder = _try_exclusive(root / name)
        if f is not None:
            f.close()
        if holder is not None:
            return f"{who} (pid {holder})"
    return None


@contextlib.contextmanager
def servers_kept_off(index_dir: str | Path) -> Iterator[None]:
    """While a new base replaces DIR's content (`Index.save`): no writable server holds DIR,
    and none starts (`claim_for_serving` waits). Raises WriterLockedError naming the server
    otherwise. A directory no server ever claimed has no .server.lock: nothing is created."""
    root = Path(index_dir)
    f, holder = _try_exclusive(root / SERVER_LOCK)
    if holder is not None:
        raise WriterLockedError(
            f"{root}: a writable server (pid {holder}) serves this index; its next write would "
            "undo the new build: stop the server first")
    try:
        yield
    finally:
        if f is not None:
            f.close()
