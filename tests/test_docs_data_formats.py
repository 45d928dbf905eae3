"""Every example in docs/data_formats.md is accepted by the reader it documents.

Each fenced ``json`` / ``jsonl`` block of the page follows a ``<!-- reader: NAME -->`` line that
names its reader (corpus, openie, questions, queries); a block without one fails, so no example
escapes. The OpenIE examples must cover the page's corpus exactly, in both shapes, with the same
triples; the questions' gold passages must be passages of that corpus; and every ``chunk-`` key
the page prints must be the key of one of them.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from pathlib import Path

from hippo_gpu.data import Passage, read_corpus, read_openie, read_questions
from hippo_gpu.retrieval.batch import read_query_rows
from tests.helpers import REPO

PAGE = REPO / "docs" / "data_formats.md"
BLOCK = re.compile(r"(?:<!-- reader: (\w+) -->\n)?```(json|jsonl)\n(.*?)\n```", re.S)


@cache
def examples() -> dict[str, list[str]]:
    """Reader name -> the page's examples for it, in page order."""
    out: dict[str, list[str]] = {}
    for reader, _lang, body in BLOCK.findall(PAGE.read_text(encoding="utf-8")):
        assert reader, f"a JSON example has no <!-- reader: NAME --> line:\n{body[:200]}"
        out.setdefault(reader, []).append(body)
    return out


def corpus() -> list[Passage]:
    (only,) = examples()["corpus"]
    return read_corpus(json.loads(only))


def test_every_example_names_a_known_reader() -> None:
    assert set(examples()) == {"corpus", "openie", "questions", "queries"}


def test_the_openie_examples_cover_the_corpus_in_both_shapes_alike() -> None:
    passages = corpus()
    read = []
    for body in examples()["openie"]:
        docs, report = read_openie(json.loads(body), passages)
        assert report.missing_passages == report.extra_passages == 0
        assert sum(report.malformed_triples.values()) == 0
        assert all(d.triples for d in docs)
        read.append(docs)
    assert len(read) == 2 and read[0] == read[1]


def test_the_questions_gold_passages_are_corpus_passages() -> None:
    keys = {p.key for p in corpus()}
    for body in examples()["questions"]:
        questions = read_questions(json.loads(body))
        assert questions and all(q.gold and {g.key for g in q.gold} <= keys for q in questions)


def test_the_query_lines_are_read(tmp_path: Path) -> None:
    (body,) = examples()["queries"]
    path = tmp_path / "queries.jsonl"
    path.write_text(body + "\n", encoding="utf-8")
    rows = list(read_query_rows(path))
    assert len(rows) == len(body.splitlines()) and all(r is not None for r in rows)


def test_every_printed_key_is_a_corpus_passage_key() -> None:
    printed = set(re.findall(r"chunk-[0-9a-f]{32}", PAGE.read_text(encoding="utf-8")))
    assert printed and printed <= {p.key for p in corpus()}


def test_the_key_rule_as_written() -> None:
    """The page's rule, computed by hand, is the reader's key."""
    for p in corpus():
        content = p.title + "\n" + p.text
        assert p.key == "chunk-" + hashlib.md5(content.encode("utf-8")).hexdigest()
