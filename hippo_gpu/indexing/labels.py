"""The user's own ids and metadata of an index's passages, and the filter they answer.

A corpus item may carry an "id" and a "metadata" object (hippo_gpu.data.Passage). They label a
passage without being part of it: the passage's identity stays its key, md5 of its title and
text. `PassageLabels` maps passage keys to their labels, for the labelled passages only (an
index without labels stores nothing and pays nothing).

Through writes (the invariant the tests check against a fresh build of the final corpus):

    labels(v + 1) = labels(v) less the removed passages' keys,
                    then each added passage's label set (or cleared, when it has none)

so a passage deleted and inserted again carries the label of its last insertion, and the
labels of version v are those of the corpus that a fresh build of v would read. A commit applies
this to the version before it (versions/delta.apply_change); a chain of segments applies it
segment by segment, which its net change does too (the added passages it keeps are the last
insertions); a compaction writes the labels of the current version into its base.

A filter (`matching_keys`) is a JSON object of metadata fields: a passage matches when, for
every field, its metadata holds that field with a value equal to the filter's (or, when the
filter's value is a list, to one of the list's); a metadata value that is a list matches as
each of its elements too ({"tags": "x"} matches "tags": ["x", "y"]). A passage without
metadata matches no filter. Equality is JSON's: 1 == 1.0, true != 1, strings as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hippo_gpu.data import DataFormatError, Passage

__all__ = ["PassageLabels", "check_filter"]


class PassageLabels:
    """Passage key -> (id, metadata) of the labelled passages of one index version.

    Immutable once made (`after` makes the next version's); `key_of_id` and the filter's
    inverted lists are built on first use.
    """

    def __init__(self, by_key: Mapping[str, tuple[str | None, dict[str, Any] | None]]
                 | None = None) -> None:
        self._by_key: dict[str, tuple[str | None, dict[str, Any] | None]] = {
            k: v for k, v in (by_key or {}).items() if v[0] is not None or v[1] is not None}
        self._key_of_id: dict[str, str] | None = None
        self._postings: dict[str, dict[str, list[str]]] | None = None

    @classmethod
    def of(cls, passages: Iterable[Passage]) -> PassageLabels:
        """The labels a corpus carries."""
        return cls({p.key: (p.id, p.metadata) for p in passages})

    # -- reading --------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._by_key)

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PassageLabels):
            return NotImplemented
        return self._by_key == other._by_key

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PassageLabels({len(self)} labelled passages)"

    def id_of(self, key: str) -> str | None:
        label = self._by_key.get(key)
        return None if label is None else label[0]

    def metadata_of(self, key: str) -> dict[str, Any] | None:
        label = self._by_key.get(key)
        return None if label is None else label[1]

    def key_of_id(self, passage_id: str) -> str | None:
        """The key of the passage with this id (None: no passage of this version has it)."""
        if self._key_of_id is None:
            self._key_of_id = {i: k for k, (i, _) in self._by_key.items() if i is not None}
        return self._key_of_id.get(passage_id)

    # -- the next version ------------------------------------------------------------------------

    def after(self, removed: Sequence[str], added: Sequence[Passage]) -> PassageLabels:
        """The labels of the version that removes the passages with keys `removed` and then
        adds `added` (the module docstring's rule). Raises DataFormatError when an added id is
        already another kept passage's."""
        out = dict(self._by_key)
        for key in removed:
            out.pop(key, None)
        for p in added:
            out[p.key] = (p.id, p.metadata)
        labels = PassageLabels(out)
        seen: dict[str, str] = {}
        for key, (pid, _) in labels._by_key.items():
            if pid is None:
                continue
            if pid in seen:
                raise DataFormatError(f"the id {pid[:60]!r} would name two passages (keys "
                                      f"{seen[pid]}, {key}); ids name one passage each")
            seen[pid] = key
        labels._key_of_id = seen
        return labels

    # -- storage ---------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """{key: {"id"?, "metadata"?}} of the labelled passages (the base's "passage_labels")."""
        out: dict[str, Any] = {}
        for key, (pid, meta) in self._by_key.items():
            entry: dict[str, Any] = {}
            if pid is not None:
                entry["id"] = pid
            if meta is not None:
                entry["metadata"] = meta
            out[key] = entry
        return out

    @classmethod
    def from_json(cls, data: Any) -> PassageLabels:
        """`to_json`'s inverse; ValueError for a malformed table."""
        if not isinstance(data, dict):
            raise ValueError("passage_labels is not an object")
        by_key = {}
        for key, entry in data.items():
            if not isinstance(entry, dict):
                raise ValueError(f"passage_labels[{key[:60]!r}] is not an object")
            pid, meta = entry.get("id"), entry.get("metadata")
            if (pid is not None and not isinstance(pid, str)) or \
                    (meta is not None and not isinstance(meta, dict)):
                raise ValueError(f"passage_labels[{key[:60]!r}] has a malformed id or metadata")
            by_key[key] = (pid, meta)
        return cls(by_key)

    # -- the filter ------------------------------------------------------------------------------

    def matching_keys(self, where: Mapping[str, Any]) -> set[str]:
        """The keys of the passages whose metadata matches `where` (module docstring)."""
        check_filter(where)
        if self._postings is None:
            postings: dict[str, dict[str, list[str]]] = {}
            for key, (_, meta) in self._by_key.items():
                for name, value in (meta or {}).items():
                    for v in {_canonical(x): None for x in _indexed(value)}:
                        postings.setdefault(name, {}).setdefault(v, []).append(key)
            self._postings = postings
        out: set[str] | None = None
        for name, wanted in where.items():
            values = wanted if isinstance(wanted, list) else [wanted]
            lists = self._postings.get(name, {})
            keys = {k for v in values for k in lists.get(_canonical(v), ())}
            out = keys if out is None else out & keys
            if not out:
                return set()
        return out if out is not None else set(self._by_key)


def check_filter(where: Any) -> None:
    """Raise DataFormatError unless `where` is a non-empty JSON object of field -> value (a
    string, number, boolean or null) or field -> non-empty list of such values."""
    if not isinstance(where, Mapping) or not where:
        raise DataFormatError("a metadata filter is a non-empty object of field: value")
    for name, value in where.items():
        if not isinstance(name, str):
            raise DataFormatError("a metadata filter's fields are strings")
        values = value if isinstance(value, list) else [value]
        if not values or not all(v is None or isinstance(v, (str, int, float, bool))
                                 for v in values):
            raise DataFormatError(f"the filter's {name[:60]!r} is a string, number, boolean, "
                                  "null or a non-empty list of them")


def _canonical(value: Any) -> str:
    """A JSON value as a dictionary key with JSON's equality (1 and 1.0 alike, true not 1)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, int) and abs(value) >= 2 ** 53:  # beyond float's exact integers
            return f"i:{value}"
        return f"n:{float(value)!r}"
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _indexed(value: Any) -> Iterable[Any]:
    """The values a metadata value matches as: itself, and each element of a list."""
    yield value
    if isinstance(value, list):
        yield from value
