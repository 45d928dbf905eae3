"""Files written durably: the one atomic replace of the package, fsyncs, checksums, and the
DiskFullError of a full disk naming the file the user knows.

Every file hippo_gpu owns (index versions and segments, the embedding cache's shards, a batch
job's parts and answers, OpenIE output) goes through `write_atomic` or, for a directory of files
(storage/directory.py), through `fsync_path` and `naming_full_disk`, so a crash leaves the old file
or the new one and a full disk names the file and changes nothing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hippo_gpu.errors import DiskFullError

__all__ = ["FULL_DISK", "disk_full", "fsync_path", "naming_full_disk", "sha256_file",
           "sha256_files", "umask", "write_atomic"]

log = logging.getLogger(__name__)

FULL_DISK = (errno.ENOSPC, errno.EDQUOT)  # the errnos of a full filesystem or a spent quota


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_files(paths: Sequence[Path]) -> list[str]:
    """sha256_file of each path, up to 4 files at a time (hashlib releases the GIL)."""
    with ThreadPoolExecutor(max(1, min(len(paths), os.cpu_count() or 1, 4))) as pool:
        return list(pool.map(sha256_file, paths))


def disk_full(path: str | Path, error: OSError) -> DiskFullError:
    """The DiskFullError of a write of `path` that failed with `error` (errno in FULL_DISK)."""
    quota = " (the disk quota is exceeded)" if error.errno == errno.EDQUOT else ""
    err = DiskFullError(f"{path}: no space left on device{quota}; it was not written and what "
                        "was there before is unchanged: free some space and run again")
    err.errno, err.path = error.errno, str(path)
    return err


@contextlib.contextmanager
def naming_full_disk(path: str | Path) -> Iterator[None]:
    """Re-raise an OSError of a full disk (FULL_DISK) raised inside as DiskFullError naming
    `path`: a write() on a file object raises ENOSPC without a file name, and os calls name a
    temporary file where the user knows the file it becomes."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as e:
        if e.errno not in FULL_DISK:
            raise
        raise disk_full(path, e) from e


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes | Callable[[Path], None], *,
                 before_replace: Callable[[], None] | None = None) -> Path:
    """Replace the file at `path` by `data`: readers see the old file or the new one, never a
    part of either. The one atomic write of the package.

    Writes `.NAME.tmp-UNIQUE` beside `path`, fsyncs it, renames it over `path` and fsyncs the
    folder, so the rename itself survives a power loss. An exception removes the temporary file
    and means that `path` was not replaced (a full disk raises DiskFullError naming `path`);
    once the rename is done nothing raises (a failed fsync of the folder is logged: the new
    file is complete and current, only its survival of a power loss is in doubt), so a caller
    whose rename is a commit point (a manifest) knows from the exception alone whether it
    committed. A killed writer leaves the temporary file, for the folder's owner to remove by
    that name (directory.collect_garbage, hippo_gpu.storage.parts). The folder must exist.

    Args:
        path: the file to replace (or create).
        data: UTF-8 text, bytes, or a function that writes the whole file at the path it is
            given (Parquet, safetensors and streamed JSON writers).
        before_replace: called after the fsync, before the rename (a fault-injection point).

    Returns:
        `path`, as a Path.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    with naming_full_disk(path):
        try:
            if callable(data):
                data(tmp)
                os.chmod(tmp, 0o666 & ~umask())  # safetensors writes 0600: the user's permissions
            else:
                with tmp.open("wb") as f:
                    f.write(data.encode("utf-8") if isinstance(data, str) else data)
            fsync_path(tmp)
            if before_replace is not None:
                before_replace()
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    try:
        fsync_path(path.parent)
    except OSError as e:
        log.warning("%s: written, but syncing its folder failed (%s); it may not survive a "
                    "power loss", path, e)
    return path


def umask() -> int:
    """The process umask, read without changing it (Linux), else by the set-and-restore dance."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
