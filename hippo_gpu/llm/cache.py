"""Content-addressed, crash-safe cache of LLM results (SQLite in WAL mode).

Key = sha256 of (task, template key, model, generation parameters, content hash). Each result is
committed in its own transaction as soon as it is known, so a process killed with SIGKILL loses at
most the requests in flight; WAL mode keeps the file readable by other processes meanwhile.
Failures are stored too (`status = "failed"`, with the reason) so a run can report them, but
`get_ok` ignores them: the next run retries every failed entry.

Values are stored as JSON text. A full disk raises DiskFullError naming the cache file
(`_disk_full`): the result being stored is not cached, every result committed before stays
(each is its own transaction), and a rerun once there is space resumes from them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hippo_gpu.errors import DiskFullError, HippoGpuError
from hippo_gpu.llm.backends import canonical_json
from hippo_gpu.storage.durable import disk_full

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
    value TEXT,
    error TEXT,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 1,
    updated REAL NOT NULL
)
"""


class CacheError(HippoGpuError, RuntimeError):
    """The cache file cannot be opened or is not a hippo_gpu LLM cache."""


_SQLITE_FULL, _SQLITE_IOERR = 13, 10  # SQLite's primary result codes (sqlite3.SQLITE_*)
_LOW_SPACE = 1 << 20  # an I/O error on a filesystem with less free space than this: a full disk


def _disk_full(path: str, error: sqlite3.Error) -> DiskFullError | None:
    """The DiskFullError of a cache write that SQLite refused for want of space, else None:
    SQLITE_FULL, or an I/O error (SQLite reports a WAL index it cannot size as
    SQLITE_IOERR_SHMSIZE, without the errno) while the cache's filesystem is out of space."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is None or (code & 0xFF) not in (_SQLITE_FULL, _SQLITE_IOERR):
        return None
    if code & 0xFF == _SQLITE_IOERR:
        try:
            if shutil.disk_usage(Path(path).parent).free >= _LOW_SPACE:
                return None
        except OSError:
            return None
    return disk_full(path, OSError(errno.ENOSPC, str(error)))


def cache_key(task: str, template: str, model: str, params: dict[str, Any], content: str) -> str:
    """sha256 over everything that determines an LLM result.

    Args:
        task: e.g. "openie", "filter".
        template: `PromptTemplate.key` values (joined if several).
        model: backend model id.
        params: generation parameters (max tokens, temperature, schema, limits).
        content: the input (passage text, or query + candidates as canonical JSON).
    """
    blob = canonical_json(
        {
            "task": task,
            "template": template,
            "model": model,
            "params": params,
            "content": hashlib.sha256(content.encode()).hexdigest(),
        }
    )
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    """One stored result; `value` is the decoded JSON (None for failures)."""

    key: str
    task: str
    status: str
    value: Any
    error: str | None
    prompt_tokens: int
    completion_tokens: int
    attempts: int


class LLMCache:
    """SQLite-backed result cache; safe to share between threads of one process.

    Args:
        path: database file (created with its folder), or ":memory:".
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a process crash (SIGKILL); only an OS crash
            # or power loss may drop the last commits, never corrupt the file.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
            self._db.commit()
        except sqlite3.DatabaseError as e:
            raise _disk_full(self.path, e) or \
                CacheError(f"cannot open LLM cache {self.path}: {e}") from e
        self._lock = threading.Lock()

    def get(self, key: str) -> CacheEntry | None:
        """The entry under `key`, ok or failed, or None."""
        return self.get_many([key]).get(key)

    def get_ok(self, key: str) -> Any | None:
        """The decoded value of a successful entry, else None (failed entries are retried)."""
        entry = self.get(key)
        return entry.value if entry is not None and entry.status == "ok" else None

    def get_many(self, keys: list[str]) -> dict[str, CacheEntry]:
        """Entries for the keys that exist."""
        out: dict[str, CacheEntry] = {}
        with self._lock:
            for lo in range(0, len(keys), 500):
                chunk = keys[lo : lo + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    "SELECT key, task, status, value, error, prompt_tokens, completion_tokens,"
                    f" attempts FROM results WHERE key IN ({marks})",
                    chunk,
                ).fetchall()
                for row in rows:
                    value = json.loads(row[3]) if row[3] is not None else None
                    out[row[0]] = CacheEntry(row[0], row[1], row[2], value, *row[4:])
        return out

    def put_ok(
        self,
        key: str,
        task: str,
        value: Any,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """Store a successful result and commit."""
        self._put(key, task, "ok", json.dumps(value), None, prompt_tokens, completion_tokens)

    def put_failed(
        self,
        key: str,
        task: str,
        error: str,
        *,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        """Record a failure with its reason and commit; the next run retries it."""
        self._put(key, task, "failed", None, error, prompt_tokens, completion_tokens)

    def _put(
        self,
        key: str,
        task: str,
        status: str,
        value: str | None,
        error: str | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        with self._lock:
            try:
                self._insert(key, task, status, value, error, prompt_tokens, completion_tokens)
            except sqlite3.OperationalError as e:
                full = _disk_full(self.path, e)
                if full is None:
                    raise
                self._db.rollback()
                raise full from e

    def _insert(self, key: str, task: str, status: str, value: str | None, error: str | None,
                prompt_tokens: int, completion_tokens: int) -> None:
        self._db.execute(
            "INSERT INTO results (key, task, status, value, error, prompt_tokens,"
            " completion_tokens, attempts, updated) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)"
            " ON CONFLICT(key) DO UPDATE SET status=excluded.status, value=excluded.value,"
            " error=excluded.error, prompt_tokens=excluded.prompt_tokens,"
            " completion_tokens=excluded.completion_tokens,"
            " attempts=results.attempts + 1, updated=excluded.updated",
            (key, task, status, value, error, prompt_tokens, completion_tokens, time.time()),
        )
        self._db.commit()

    def counts(self, task: str | None = None) -> dict[str, int]:
        """Number of entries by status (optionally for one task)."""
        where, args = ("WHERE task = ?", (task,)) if task is not None else ("", ())
        with self._lock:
            rows = self._db.execute(
                f"SELECT status, COUNT(*) FROM results {where} GROUP BY status", args
            ).fetchall()
        return {status: n for status, n in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> LLMCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_cache(cache: LLMCache | str | Path | None) -> LLMCache | None:
    """Accept a cache object, a path, or None (no caching)."""
    if cache is None or isinstance(cache, LLMCache):
        return cache
    return LLMCache(cache)
