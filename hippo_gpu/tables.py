"""Columnar tables behind the Index's text fields: n strings, facts or per-passage triples stored
as a few flat arrays, each item built on access.

`StringTable` (one UTF-8 blob and [n + 1] offsets, memory-mapped from its file), `FactTable`
(facts as [F, 3] rows into the phrase and predicate tables) and `PassageTriples` (per passage,
its fact rows in CSR form). Each compares equal to the list it stands for (`_SequenceEq`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np

from hippo_gpu.data import DataFormatError, Triple

WRITE_CHUNK = 1 << 26  # bytes per write() call of write_array


def write_array(f: BinaryIO, array: np.ndarray) -> None:
    """Write an array's bytes (C order) to the binary file `f` through `f.write`, in chunks of
    WRITE_CHUNK bytes from a view of the array (no copy of a large array; unlike
    ndarray.tofile, every byte goes through the file object, whose errors are then raised
    where the caller expects them)."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    for start in range(0, len(raw), WRITE_CHUNK):
        f.write(raw[start:start + WRITE_CHUNK].data)


class _SequenceEq(Sequence):  # type: ignore[type-arg]
    """Sequence equality by elements, so a lazy table compares equal to the list it stands for."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(x) for x in self[:3])
        return f"{type(self).__name__}([{head}{', ...' if len(self) > 3 else ''}], n={len(self)})"


class StringTable(_SequenceEq):
    """n strings as one UTF-8 blob and [n + 1] byte offsets; item i is decoded on access.

    File layout (`write`): int64 n, int64 offsets[n + 1], then the blob; `open` memory-maps it,
    so a table of a million passages costs nothing until a row is read.
    """

    def __init__(self, offsets: np.ndarray, blob: np.ndarray) -> None:
        self._off = offsets  # [n + 1] int64
        self._blob = blob  # [bytes] uint8

    @classmethod
    def from_strings(cls, strings: Sequence[str]) -> StringTable:
        raw = [s.encode("utf-8") for s in strings]
        lengths = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return cls(offsets, np.frombuffer(b"".join(raw), dtype=np.uint8))

    @classmethod
    def open(cls, path: str | Path) -> StringTable:
        # a plain ndarray over the map (it keeps the map alive): a memmap's own indexing makes
        # a memmap object per element read, ~4x the cost of a row lookup (a bisect reads ~20)
        mm = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
        try:
            n = int(mm[:8].view(np.int64)[0])
            offsets = mm[8:8 * (n + 2)].view(np.int64)
            blob = mm[8 * (n + 2):]
            if len(offsets) != n + 1 or int(offsets[-1]) != len(blob):
                raise ValueError("offsets do not match the blob")
        except (ValueError, IndexError) as e:
            raise DataFormatError(f"{path}: not a string table ({e})") from e
        return cls(offsets, blob)

    def write(self, path: str | Path) -> None:
        with Path(path).open("wb") as f:
            f.write(np.int64(len(self)).tobytes())
            f.write(np.ascontiguousarray(self._off, dtype=np.int64).tobytes())
            write_array(f, self._blob)

    def __len__(self) -> int:
        return len(self._off) - 1

    def splice(self, keep: np.ndarray, at: np.ndarray, strings: Sequence[str]) -> StringTable:
        """A new table: the rows where `keep` [n] is true, with `strings[i]` inserted before old
        row `at[i]` (`at` sorted, n meaning the end; strings at one position keep their order).

        Array work at memory speed: the kept rows are copied as contiguous runs of the blob
        (one run between two changes), never decoded.
        """
        n = len(self)
        at = np.asarray(at, dtype=np.int64)
        removed = np.nonzero(~np.asarray(keep, dtype=bool))[0]
        cuts = np.unique(np.concatenate([[0, n], removed, removed + 1, at]))
        raw = [s.encode("utf-8") for s in strings]
        starts = np.searchsorted(at, cuts[:-1], side="left")
        ends = np.searchsorted(at, cuts[:-1], side="right")
        blobs: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        lens = np.diff(self._off)
        for a, b, i, j in zip(cuts[:-1].tolist(), cuts[1:].tolist(), starts.tolist(),
                              ends.tolist()):
            if j > i:  # the strings inserted before row a
                blobs.append(np.frombuffer(b"".join(raw[i:j]), dtype=np.uint8))
                lengths.append(np.fromiter(map(len, raw[i:j]), np.int64, count=j - i))
            if a < n and keep[a]:  # rows a .. b-1 are one kept run
                blobs.append(self._blob[self._off[a]:self._off[b]])
                lengths.append(lens[a:b])
        tail = np.searchsorted(at, n, side="left")
        if tail < len(raw):  # appended at the end
            blobs.append(np.frombuffer(b"".join(raw[tail:]), dtype=np.uint8))
            lengths.append(np.fromiter(map(len, raw[tail:]), np.int64, count=len(raw) - tail))
        blob = np.concatenate(blobs) if blobs else np.zeros(0, np.uint8)
        length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        return StringTable(np.concatenate([[0], np.cumsum(length)]).astype(np.int64), blob)

    def bisect_left(self, s: str) -> int:
        """bisect.bisect_left(self, s) for a sorted table, on the rows' UTF-8 bytes: byte order
        is code point order (Python's str order), so no row is decoded."""
        key = s.encode("utf-8")
        off, blob = self._off.data, self._blob.data  # memoryviews: ints and bytes per index
        lo, hi = 0, len(off) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if bytes(blob[off[mid]:off[mid + 1]]) < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _get(self, i: int) -> str:
        a, b = self._off[i:i + 2].tolist()
        return str(self._blob.data[a:b], "utf-8")

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} out of range for {n} strings")
        return self._get(i % n if n else i)

    def __iter__(self) -> Iterator[str]:
        off = self._off.tolist()
        blob = bytes(self._blob) if len(self._blob) < (1 << 28) else None
        for i in range(len(off) - 1):
            yield (blob[off[i]:off[i + 1]].decode("utf-8") if blob is not None
                   else self._get(i))


class FactTable(_SequenceEq):
    """Facts as rows: fact j = (phrases[spo[j, 0]], predicates[spo[j, 1]], phrases[spo[j, 2]]),
    built on access (no Python object per fact until one is read)."""

    def __init__(self, phrases: Sequence[str], predicates: Sequence[str],
                 spo: np.ndarray) -> None:
        self.phrases, self.predicates = phrases, predicates
        self.spo = spo  # [F, 3] int64

    @classmethod
    def from_triples(cls, facts: Sequence[Triple], phrases: Sequence[str]) -> FactTable:
        """The table of a list of facts whose subjects and objects are among `phrases`."""
        row = {p: i for i, p in enumerate(phrases)}
        predicates = sorted({f[1] for f in facts})
        prow = {p: i for i, p in enumerate(predicates)}
        spo = np.array([[row[s], prow[p], row[o]] for s, p, o in facts],
                       dtype=np.int64).reshape(-1, 3)
        return cls(phrases, predicates, spo)

    def __len__(self) -> int:
        return len(self.spo)

    def __getitem__(self, j):  # type: ignore[no-untyped-def, override]
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        s, p, o = self.spo[j].tolist()
        return (self.phrases[s], self.predicates[p], self.phrases[o])

    def __iter__(self) -> Iterator[Triple]:
        ph, pr = self.phrases, self.predicates
        for s, p, o in self.spo.tolist():
            yield (ph[s], pr[p], ph[o])


class PassageTriples(_SequenceEq):
    """Per passage, its normalised triples in OpenIE order with multiplicity:
    item p = [facts[r] for r in rows[ptr[p]:ptr[p + 1]]]."""

    def __init__(self, facts: Sequence[Triple], ptr: np.ndarray, rows: np.ndarray) -> None:
        self.facts, self.ptr, self.rows = facts, ptr, rows  # [P + 1], [T]

    def __len__(self) -> int:
        return len(self.ptr) - 1

    def __getitem__(self, p):  # type: ignore[no-untyped-def, override]
        if isinstance(p, slice):
            return [self[k] for k in range(*p.indices(len(self)))]
        n = len(self)
        if not -n <= p < n:
            raise IndexError(f"passage {p} out of range for {n} passages")
        p %= n
        return [self.facts[r] for r in self.rows[self.ptr[p]:self.ptr[p + 1]].tolist()]


class KeyRows:
    """Passage key -> row without a Python object per key: the keys sorted as fixed-width bytes
    and each one's row, looked up by binary search (O(log P) per key).

    A version's KeyRows follows from the last one's by `spliced` (removed rows dropped, the
    survivors' rows renumbered, added keys merged in) with array work at memory speed, so a
    commit never rebuilds a dict of every key.
    """

    def __init__(self, sorted_keys: np.ndarray, rows: np.ndarray) -> None:
        self._keys = sorted_keys  # [P] fixed-width bytes ("S<w>"), ascending
        self._rows = rows  # [P] int64, the row of each sorted key

    @classmethod
    def of(cls, keys: Sequence[str]) -> KeyRows:
        arr = np.array([k.encode("utf-8") for k in keys], dtype=bytes) if len(keys) else \
            np.zeros(0, dtype="S1")
        order = np.argsort(arr, kind="stable")
        return cls(arr[order], order.astype(np.int64))

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: str, default: int | None = None) -> int | None:
        raw = key.encode("utf-8")
        if len(raw) > self._keys.dtype.itemsize or raw.endswith(b"\0"):
            return default  # longer than every key (a padded compare would cut it)
        i = int(np.searchsorted(self._keys, raw))
        if i < len(self._keys) and self._keys[i] == raw:
            return int(self._rows[i])
        return default

    def __getitem__(self, key: str) -> int:
        row = self.get(key)
        if row is None:
            raise KeyError(key)
        return row

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def spliced(self, removed: np.ndarray, added: Sequence[str], num_kept: int) -> KeyRows:
        """The KeyRows after removing the sorted passage rows `removed` and appending `added`
        (rows num_kept, num_kept + 1, ...), as delta.apply_change lays passages out."""
        keep = np.ones(len(self._rows), dtype=bool)
        removed = np.asarray(removed, dtype=np.int64)
        if len(removed):
            keep[np.isin(self._rows, removed)] = False
        rows = self._rows[keep]
        # a kept row moves down by the removed rows before it (removed is sorted)
        rows = rows - np.searchsorted(removed, rows)
        keys = self._keys[keep]
        if len(added):
            new = np.array([k.encode("utf-8") for k in added], dtype=bytes)
            width = max(keys.dtype.itemsize, new.dtype.itemsize)
            keys, new = keys.astype(f"S{width}"), new.astype(f"S{width}")
            order = np.argsort(new, kind="stable")
            at = np.searchsorted(keys, new[order])
            keys = np.insert(keys, at, new[order])
            rows = np.insert(rows, at, num_kept + order.astype(np.int64))
        return KeyRows(keys, rows)


def sorted_position(table: Sequence[str], s: str) -> int:
    """bisect.bisect_left(table, s) for a sorted `table`; a StringTable by its own search."""
    if isinstance(table, StringTable):
        return table.bisect_left(s)
    return bisect.bisect_left(table, s)  # type: ignore[arg-type]
