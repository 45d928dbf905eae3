"""A full disk on demand, for the tests: count the write operations under one folder and fail
the k-th (and, by default, every later one) with OSError(ENOSPC).

    with FullDisk(folder, fail_at=k) as disk:   # fail_at=None: count only (a dry run)
        ...                                     # the code under test
        disk.free()                             # space again: later writes succeed

A write operation is one call that can need space, on a path under `folder`, in call order:
    open    io.open / builtins.open / Path.open in a mode that writes ("w", "a", "x", "+"),
            and os.open with O_WRONLY, O_RDWR or O_CREAT (Path.touch), of a file that does
            not exist yet (the call creates it; opening an existing file takes no space)
    write   write() on a file those opens returned, os.write on a descriptor os.open returned
    fsync   os.fsync of a descriptor opened under the folder (files and folders)
    mkdir   os.mkdir that creates (the path does not exist, its parent does: Path.mkdir,
            os.makedirs)
    rename  os.rename / os.replace (Path.rename / replace) of a path under the folder
Removals (unlink, rmtree) and metadata (chmod) never fail for want of space, and are not
counted. A failing write() first writes half of its data, as a real full disk does (the bytes
that still fitted), then raises; the other operations fail without effect. OSError carries the
path for the os calls and none for write() on a file object, as Python's own errors do.

Only calls made through these Python functions are seen: code that writes through its own I/O
(a Rust or C++ writer) is invisible here, which is why the package writes every file it owns
through Python file objects.
"""

from __future__ import annotations

import builtins
import errno
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT


class _File:
    """A file object of the real open() whose write() counts (everything else is the file's)."""

    def __init__(self, disk: FullDisk, f: Any, path: str) -> None:
        self._disk, self._f, self._path = disk, f, path

    def write(self, data: Any) -> int:
        if self._disk._fails("write", self._path):
            half = memoryview(data)[:len(data) // 2] if not isinstance(data, str) \
                else data[:len(data) // 2]
            self._f.write(half)
            self._f.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(self._f.write(data))

    def close(self) -> None:
        self._disk._fds.pop(self._fd, None)
        self._f.close()

    def __enter__(self) -> _File:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Any:
        return iter(self._f)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    @property
    def _fd(self) -> int:
        try:
            return int(self._f.fileno())
        except (OSError, ValueError):
            return -1


@dataclass
class FullDisk:
    """See the module docstring. `ops` lists the operations seen ("write PATH", ...), paths
    relative to the folder; `count` is their number; `failed` the operations that failed."""

    folder: Path
    fail_at: int | None = None  # 1-based; None: never fail
    sticky: bool = True  # fail every operation after fail_at too (until free())
    ops: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    _free: bool = False
    _fds: dict[int, str] = field(default_factory=dict)
    _saved: list[tuple[Any, str, Any]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.ops)

    def free(self) -> None:
        """Space again: no later operation fails."""
        self._free = True

    # -- bookkeeping -------------------------------------------------------------------------

    def _under(self, path: Any) -> str | None:
        """`path` relative to the folder, or None when it lies elsewhere (or is a descriptor)."""
        if isinstance(path, int):
            return None
        full = os.path.realpath(os.fspath(path))
        root = os.path.realpath(self.folder)
        if full == root or full.startswith(root + os.sep):
            return os.path.relpath(full, root)
        return None

    def _fails(self, kind: str, rel: str) -> bool:
        """Record operation `kind` on `rel`; whether it fails."""
        self.ops.append(f"{kind} {rel}")
        n = len(self.ops)
        fails = not self._free and self.fail_at is not None and \
            (n == self.fail_at or (self.sticky and n > self.fail_at))
        if fails:
            self.failed.append(self.ops[-1])
        return fails

    def _error(self, path: Any) -> OSError:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))

    # -- the patched calls -------------------------------------------------------------------

    def _open(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        rel = self._under(file)
        writes = any(c in mode for c in "wax+")
        if rel is None or not writes:
            return self._real["open"](file, mode, *args, **kwargs)
        if not os.path.lexists(file) and self._fails("open", rel):
            raise self._error(file)
        f = self._real["open"](file, mode, *args, **kwargs)
        wrapped = _File(self, f, rel)
        self._fds[wrapped._fd] = rel
        return wrapped

    def _os_open(self, path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        rel = self._under(path)
        if rel is not None and flags & _WRITE_FLAGS and not os.path.lexists(path) and \
                self._fails("open", rel):
            raise self._error(path)
        fd = int(self._real["os.open"](path, flags, *args, **kwargs))
        if rel is not None:
            self._fds[fd] = rel
        return fd

    def _os_close(self, fd: int) -> None:
        self._fds.pop(fd, None)
        self._real["os.close"](fd)

    def _os_write(self, fd: int, data: Any) -> int:
        rel = self._fds.get(fd)
        if rel is not None and self._fails("write", rel):
            self._real["os.write"](fd, memoryview(data)[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return int(self._real["os.write"](fd, data))

    def _os_fsync(self, fd: Any) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        rel = self._fds.get(fd)
        if rel is not None and self._fails("fsync", rel):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._real["os.fsync"](fd)

    def _os_mkdir(self, path: Any, *args: Any, **kwargs: Any) -> None:
        rel = self._under(path)
        creates = rel is not None and not os.path.lexists(path) and \
            os.path.isdir(os.path.dirname(os.path.abspath(path)))
        if creates and self._fails("mkdir", rel):
            raise self._error(path)
        self._real["os.mkdir"](path, *args, **kwargs)

    def _renamer(self, key: str) -> Any:
        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            rel = self._under(src)
            if rel is not None and self._fails(key.removeprefix("os."),
                                               f"{rel} -> {self._under(dst)}"):
                raise self._error(src)
            self._real[key](src, dst, *args, **kwargs)
        return rename

    # -- patching ------------------------------------------------------------------------------

    def __enter__(self) -> FullDisk:
        self._real = {"open": io.open, "os.open": os.open, "os.close": os.close,
                      "os.write": os.write, "os.fsync": os.fsync, "os.mkdir": os.mkdir,
                      "os.rename": os.rename, "os.replace": os.replace}
        patches = [(io, "open", self._open), (builtins, "open", self._open),
                   (os, "open", self._os_open), (os, "close", self._os_close),
                   (os, "write", self._os_write), (os, "fsync", self._os_fsync),
                   (os, "mkdir", self._os_mkdir), (os, "rename", self._renamer("os.rename")),
                   (os, "replace", self._renamer("os.replace"))]
        for module, name, fn in patches:
            self._saved.append((module, name, getattr(module, name)))
            setattr(module, name, fn)
        return self

    def __exit__(self, *exc: object) -> None:
        for module, name, fn in reversed(self._saved):
            setattr(module, name, fn)
        self._saved.clear()


def generic(op: str) -> str:
    """An operation without what differs between runs: temporary names' random part and pid."""
    op = re.sub(r"\.tmp-[0-9a-f]{32}", ".tmp-*", op)
    return re.sub(r"(\.tmp-[vs]\d{6})-\d+", r"\1-PID", op)


def distinct_steps(ops: list[str]) -> list[int]:
    """The 1-based numbers of the operations that leave distinct states when they fail: all
    but the inner write() calls of a file (between its first and last write, a failure leaves
    the same partial temporary file)."""
    writes: dict[str, list[int]] = {}
    for i, op in enumerate(ops, 1):
        if op.startswith("write "):
            writes.setdefault(op, []).append(i)
    inner = {i for numbers in writes.values() for i in numbers[1:-1]}
    return [i for i in range(1, len(ops) + 1) if i not in inner]


def count_writes(folder: Path, act: Any) -> list[str]:
    """The write operations `act()` makes under `folder` (a dry run: nothing fails)."""
    with FullDisk(Path(folder)) as disk:
        act()
    return disk.ops
