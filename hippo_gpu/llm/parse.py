"""Parse LLM output: `json.loads`, a schema check, and tolerant repair of common defects.

Never `eval`: model output is data. The pipeline for one output is

    size check -> strip code fences -> skip leading prose -> JSON decode (text after the value is
    ignored) -> on failure, close a truncated value at its last complete element -> schema check
    -> per-item repair (non-strings to strings, wrong arity dropped, duplicates dropped, length
    limits)

Every rejection raises `OutputRejected(reason)` and every rejection and repair is counted in a
`ParseStats` by reason, so a run can report how its model misbehaved.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hippo_gpu.errors import HippoGpuError

T = TypeVar("T", bound=Hashable)

#: reasons an output is rejected (the keys of ParseStats.rejected)
REJECT_REASONS = (
    "empty",  # no text at all
    "too_large",  # over Limits.max_chars
    "too_deep",  # nesting over Limits.max_depth
    "no_json",  # no '{' or '[' in the text
    "invalid_json",  # not decodable even after repair
    "wrong_type",  # decoded, but not the expected object/list
    "missing_field",  # object without the expected key
)


class OutputRejected(HippoGpuError, ValueError):
    """An LLM output that could not be parsed; `reason` is one of REJECT_REASONS."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True)
class Limits:
    """Size limits applied before and after decoding."""

    max_chars: int = 65_536  # raw output
    max_depth: int = 32  # bracket nesting
    max_items: int = 256  # list items kept
    max_item_chars: int = 256  # characters per string item


@dataclass
class ParseStats:
    """Counts of accepted outputs, rejections by reason and repairs by kind."""

    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return self.accepted + sum(self.rejected.values())

    def merge(self, other: ParseStats) -> None:
        self.accepted += other.accepted
        self.rejected.update(other.rejected)
        self.repairs.update(other.repairs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "repairs": dict(self.repairs),
        }


_FENCE = re.compile(r"```[a-zA-Z0-9_-]*[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_DECODER = json.JSONDecoder()
_CLOSER = {"{": "}", "[": "]"}


@dataclass
class _Scan:
    max_depth: int
    in_string: bool
    closers: str  # closers for the containers still open at the end, innermost last
    cuts: list[tuple[int, str]]  # (cut position, closers needed there)


def _scan(text: str) -> _Scan:
    """One pass over a JSON-ish text: nesting depth and places where it can be cut and closed.

    A cut point is a position just after an opening bracket or just after a complete element of
    an array/object (before a ',' or after a closing bracket): the prefix up to it, plus closers
    for the open containers, is valid JSON if the prefix was.
    """
    stack: list[str] = []
    cuts: list[tuple[int, str]] = []
    in_string = escape = False
    depth = 0
    for i, ch in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(_CLOSER[ch])
            depth = max(depth, len(stack))
            cuts.append((i + 1, "".join(reversed(stack))))
        elif ch in "}]":
            if stack:
                stack.pop()
            cuts.append((i + 1, "".join(reversed(stack))))
            if not stack:
                break
        elif ch == "," and stack:
            cuts.append((i, "".join(reversed(stack))))
    return _Scan(depth, in_string, "".join(reversed(stack)), cuts)


def _repair_truncated(text: str, scan: _Scan, attempts: int = 64) -> Any:
    """Close a truncated JSON value at its last complete element; raise OutputRejected if none."""
    candidates: list[str] = []
    if not scan.in_string and scan.closers:
        candidates.append(text.rstrip().rstrip(",:") + scan.closers)
    # A cut right after the outermost bracket would "repair" by discarding everything: not kept.
    candidates.extend(
        text[:pos] + closers for pos, closers in reversed(scan.cuts[-attempts:]) if pos > 1
    )
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
    raise OutputRejected("invalid_json", "could not repair")


_MAX_STARTS = 32  # bracket positions tried as the start of the JSON value


def _first_value(text: str, starts: list[int], limits: Limits) -> tuple[Any, str, int]:
    """Decode from the first bracket that starts a complete JSON value.

    A bracket group that closes but does not decode (prose like "[sic]") is skipped; one that
    never closes is taken as the truncated answer. Returns (value, body, end) with body = text
    from the chosen bracket and end = -1 when it needs truncation repair.
    """
    skip_to = -1
    for start in starts:
        if start < skip_to:
            continue  # inside a bracket group already tried
        body = text[start:]
        scan = _scan(body)
        if scan.max_depth > limits.max_depth:
            raise OutputRejected("too_deep", f"depth {scan.max_depth} > {limits.max_depth}")
        try:
            value, end = _DECODER.raw_decode(body)
        except (json.JSONDecodeError, RecursionError):
            if scan.closers or scan.in_string:
                return None, body, -1  # never closed: truncated
            skip_to = start + (scan.cuts[-1][0] if scan.cuts else 1)
            continue
        return value, body, end
    return None, text[starts[0]:], -1


def load_json(
    text: str | None, limits: Limits = Limits(), stats: ParseStats | None = None
) -> tuple[Any, list[str]]:
    """Decode the first JSON value in an LLM output, repairing common defects.

    Returns:
        (value, repairs) where repairs names each defect fixed.

    Raises:
        OutputRejected: see REJECT_REASONS.
    """
    repairs: list[str] = []
    try:
        if text is None or not text.strip():
            raise OutputRejected("empty")
        if len(text) > limits.max_chars:
            raise OutputRejected("too_large", f"{len(text)} chars > {limits.max_chars}")
        fenced = _FENCE.search(text)
        if fenced is not None:
            text = fenced.group(1)
            repairs.append("code_fence")
        starts = [i for i, ch in enumerate(text) if ch in "{["][:_MAX_STARTS]
        if not starts:
            raise OutputRejected("no_json")
        value, body, end = _first_value(text, starts, limits)
        if text[: len(text) - len(body)].strip():
            repairs.append("leading_text")
        if end < 0:
            value = _repair_truncated(body, _scan(body))
            repairs.append("truncated")
        elif body[end:].strip():
            repairs.append("trailing_text")
    except OutputRejected as e:
        if stats is not None:
            stats.rejected[e.reason] += 1
        raise
    return value, repairs


def _as_item(value: Any, repairs: list[str], limits: Limits) -> str | None:
    """A list element as a clean string, or None to drop it (recording why)."""
    if isinstance(value, str):
        item = value.strip()
    elif isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        repairs.append("dropped_item")
        return None
    elif isinstance(value, (int, float)):
        repairs.append("non_string")
        item = str(value)
    else:
        repairs.append("dropped_item")
        return None
    if not item:
        repairs.append("empty_item")
        return None
    if len(item) > limits.max_item_chars:
        repairs.append("too_long")
        return None
    return item


def _field(value: Any, names: Sequence[str], repairs: list[str]) -> list[Any]:
    """The list under one of `names` in an object (or a bare list)."""
    if isinstance(value, list):
        repairs.append("bare_list")
        return value
    if not isinstance(value, dict):
        raise OutputRejected("wrong_type", type(value).__name__)
    for name in names:
        if name in value:
            items = value[name]
            if not isinstance(items, list):
                raise OutputRejected("wrong_type", f"{name} is {type(items).__name__}")
            return items
    raise OutputRejected("missing_field", f"none of {list(names)}")


def _finish(
    items: list[Any], repairs: list[str], limits: Limits, stats: ParseStats | None
) -> list[Any]:
    if len(items) > limits.max_items:
        repairs.append("too_many")
        items = items[: limits.max_items]
    if stats is not None:
        stats.accepted += 1
        stats.repairs.update(repairs)
    return items


def _checked(fn: Any) -> Any:
    """Count a schema-level rejection raised after `load_json` succeeded."""

    def wrapper(text: str | None, *args: Any, stats: ParseStats | None = None, **kw: Any) -> Any:
        try:
            return fn(text, *args, stats=stats, **kw)
        except OutputRejected as e:
            if stats is not None and e.reason in ("wrong_type", "missing_field"):
                stats.rejected[e.reason] += 1
            raise

    wrapper.__doc__ = fn.__doc__
    wrapper.__name__ = fn.__name__
    return wrapper


@_checked
def parse_entities(
    text: str | None,
    *,
    limits: Limits = Limits(),
    stats: ParseStats | None = None,
    names: Sequence[str] = ("named_entities", "entities"),
) -> list[str]:
    """`{"named_entities": [str, ...]}` -> unique, stripped, bounded strings, in output order.

    An empty list is a valid answer (a passage or question may name nothing).
    """
    value, repairs = load_json(text, limits, stats)
    raw = _field(value, names, repairs)
    out = _unique((_as_item(e, repairs, limits) for e in raw), repairs)
    return _finish(out, repairs, limits, stats)


def _unique(items: Iterable[T | None], repairs: list[str]) -> list[T]:
    """Drop rejected (None) items and repeats, keeping first occurrences in order."""
    seen: set[T] = set()
    out: list[T] = []
    for item in items:
        if item is None:
            continue
        if item in seen:
            repairs.append("duplicate")
            continue
        seen.add(item)
        out.append(item)
    return out


_TRIPLE_KEYS = (("subject", "predicate", "object"), ("subject", "relation", "object"))


def _as_triple(element: Any, repairs: list[str], limits: Limits) -> tuple[str, str, str] | None:
    if isinstance(element, dict):
        for keys in _TRIPLE_KEYS:
            if all(k in element for k in keys):
                repairs.append("object_triple")
                element = [element[k] for k in keys]
                break
        else:
            repairs.append("dropped_item")
            return None
    if not isinstance(element, list):
        repairs.append("dropped_item")
        return None
    if len(element) != 3:
        repairs.append("wrong_arity")
        return None
    parts = [_as_item(p, repairs, limits) for p in element]
    if parts[0] is None or parts[1] is None or parts[2] is None:
        repairs.append("bad_triple")
        return None
    return (parts[0], parts[1], parts[2])


@_checked
def parse_triples(
    text: str | None,
    *,
    limits: Limits = Limits(),
    stats: ParseStats | None = None,
    names: Sequence[str] = ("triples",),
) -> list[list[str]]:
    """`{"triples": [[s, p, o], ...]}` -> unique 3-string triples, in output order.

    Triples without exactly three non-empty scalar parts are dropped (HippoRAG keeps only
    3-element triples too); `{"subject", "predicate"/"relation", "object"}` objects are accepted.
    """
    value, repairs = load_json(text, limits, stats)
    raw = _field(value, names, repairs)
    triples = _unique((_as_triple(e, repairs, limits) for e in raw), repairs)
    return _finish([list(t) for t in triples], repairs, limits, stats)


def _norm_fact(fact: Sequence[str]) -> str:
    return " | ".join(" ".join(part.lower().split()) for part in fact)


def match_facts(
    generated: Sequence[Sequence[str]],
    candidates: Sequence[Sequence[str]],
    *,
    cutoff: float = 0.0,
) -> list[int]:
    """Map facts the filter LLM wrote back to candidate indices, keeping the LLM's order.

    A fact equal to a candidate (case and whitespace aside) maps to it; otherwise to the most
    similar candidate by `difflib` ratio, if that ratio is >= `cutoff` (HippoRAG uses 0.0: every
    generated fact maps somewhere). Repeated indices are dropped; at most len(candidates) kept.
    """
    keys = [_norm_fact(c) for c in candidates]
    exact = {k: i for i, k in reversed(list(enumerate(keys)))}
    kept: list[int] = []
    for fact in generated:
        key = _norm_fact(fact)
        idx = exact.get(key)
        if idx is None:
            best, best_ratio = -1, -1.0
            for i, cand in enumerate(keys):
                ratio = difflib.SequenceMatcher(None, key, cand, autojunk=False).ratio()
                if ratio > best_ratio:
                    best, best_ratio = i, ratio
            if best < 0 or best_ratio < cutoff:
                continue
            idx = best
        if idx not in kept:
            kept.append(idx)
        if len(kept) == len(candidates):
            break
    return kept


def parse_answer(text: str | None) -> str:
    """The QA reader's answer: the text after the first "Answer:", else the whole reply."""
    if not text:
        return ""
    head, sep, tail = text.partition("Answer:")
    answer = tail if sep else head
    return answer.strip()
