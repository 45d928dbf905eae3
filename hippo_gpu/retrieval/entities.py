"""LLM-free query entities: capitalised spans, a heuristic stand-in for query NER.

HippoRAG 1 and our hybrid mode link query entities to phrase nodes. Where no LLM NER (or a
HippoRAG query-NER file) is given, the hybrid mode uses this English-centric heuristic: maximal
runs of capitalised words, allowing the connectors "of", "the", "and", "de", "in" inside a run,
minus question words. "Who founded Journal of Psychotherapy Integration?" gives
["Journal of Psychotherapy Integration"].
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SPAN = re.compile(r"[A-Z][\w'-]*(?:\s+(?:(?:of|the|and|de|in)\s+)?[A-Z][\w'-]*)*")
_QUESTION_WORDS = frozenset(
    "who whom whose what when where which why how the in is was are were did does do".split())


def capitalized_spans(text: str) -> list[str]:
    """Maximal capitalised word runs of `text`, question words dropped, in order, deduplicated."""
    out: list[str] = []
    for span in _SPAN.findall(text):
        if span.lower() in _QUESTION_WORDS or span in out:
            continue
        out.append(span)
    return out


def heuristic_entities(queries: Sequence[str]) -> list[list[str]]:
    return [capitalized_spans(q) for q in queries]
