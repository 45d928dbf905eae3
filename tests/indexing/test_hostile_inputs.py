"""Hostile inputs to every reader of user data: the corpus, OpenIE and questions readers
(hippo_gpu.data, from files and from in-memory objects) and the batch job's query-file reader
(hippo_gpu.retrieval.batch), with the command line run on a few hostile files.

The guarantee: whatever the input, a reader either returns well-formed values or raises
DataFormatError (a HippoGpuError) whose message starts with the source, briefly (the path, or
"in-memory corpus (list of 3)"), names the field, and is short: never a repr of the data. Every
generated value may hold LONG, a 5,000-character string; a message that held any of it would be
echoing the input. A file and the object parsed from it get the same answer, the messages
differing only in how they name the source. On the command line the same inputs end with exit
status 2 and the message, never a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hippo_gpu.data import (
    DataFormatError,
    OpenIEDoc,
    Passage,
    as_passages,
    read_corpus,
    read_openie,
    read_questions,
)
from hippo_gpu.errors import HippoGpuError
from hippo_gpu.retrieval.batch import check_row, read_query_rows
from tests.helpers import REPO

LONG = "\u2603" * 4_990 + "LONG-END.."  # 5,000 characters; never to be seen in a message
MAX_MESSAGE = 800  # characters of a message beyond the name of its source
CORPUS = [Passage("A", "alpha"), Passage("B", LONG), Passage("C", "gamma")]  # for OpenIE
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

FIELDS = ["title", "text", "paragraph_text", "docs", "idx", "passage", "extracted_triples",
          "extracted_entities", "error", "question", "id", "_id", "answer", "answer_aliases",
          "paragraphs", "is_supporting", "context", "supporting_facts", "query", "entities"]
leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                 st.text(max_size=6), st.just(LONG), st.just("chunk-" + "0" * 32))
json_value = st.recursive(
    leaf, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=3), inner, max_size=5),
    max_leaves=16)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def outcome(read: Callable[[], Any], source: str) -> tuple[str, Any]:
    """("ok", value) or ("error", the message after the source name), checked: only a
    DataFormatError, starting with `source`, short, without the long string."""
    try:
        return "ok", read()
    except DataFormatError as e:
        msg = str(e)
    except Exception as e:  # noqa: BLE001 - the property under test: nothing untyped escapes
        pytest.fail(f"untyped {type(e).__name__} from a reader: {str(e)[:300]}")
    assert msg.startswith(source) and msg[len(source):][:1] in (":", " "), msg[:300]
    rest = msg[len(source):]
    assert len(rest) <= MAX_MESSAGE, f"{len(msg)}-character message: {msg[:300]}"
    assert not echoes_long(msg), msg[:300]
    return "error", rest


def echoes_long(msg: str) -> bool:
    """Whether `msg` holds more of LONG than a cut title (60 characters) would."""
    return LONG[:100] in msg or "LONG-END" in msg


def names_a_field(rest: str, *fields: str) -> bool:
    """A message names where the defect is: an item index or one of `fields`."""
    return "[" in rest or any(f in rest for f in fields)


def from_file_and_memory(scratch: Path, data: Any, read: Callable[[Any], Any],
                         what: str) -> tuple[str, Any]:
    """Read `data` from memory and from a JSON file; both must agree."""
    path = scratch / f"{what}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    on_disk = outcome(lambda: read(path), str(path))
    if isinstance(data, str):  # in memory, a str is a path (test_a_path_...)
        return on_disk
    memory = outcome(lambda: read(data), described(data, what))
    assert memory[0] == on_disk[0], (memory, on_disk)
    if memory[0] == "error":
        assert memory[1] == on_disk[1]
    return memory


def described(data: Any, what: str) -> str:
    size = f" of {len(data)}" if hasattr(data, "__len__") else ""
    return f"in-memory {what} ({type(data).__name__}{size})"


@pytest.mark.parametrize("read", [read_corpus, read_questions,
                                  lambda s: read_openie(s, CORPUS)])
def test_a_path_that_cannot_be_read(scratch: Path, read: Callable[[Any], Any]) -> None:
    for path, why in [(scratch / "missing.json", "no such file"), (scratch, "Is a directory"),
                      ("x" * 5_000, "File name too long")]:
        name = str(path) if len(str(path)) <= 200 else str(path)[:200] + "..."
        kind, rest = outcome(functools.partial(read, path), name)
        assert kind == "error" and why in rest, rest
    deep = scratch / "deep.json"
    for text, why in [("[" * 100_000 + "]" * 100_000, "RecursionError"),
                      ("[" + "9" * 5_000 + "]", "ValueError"), ("[1,", "not valid JSON")]:
        deep.write_text(text)
        kind, rest = outcome(functools.partial(read, deep), str(deep))
        assert kind == "error" and why in rest, rest


# ---------------------------------------------------------------------------------------------
# corpus


corpus_item = st.one_of(
    json_value,
    st.fixed_dictionaries({"title": st.text(max_size=5) | st.just(LONG),
                           "text": st.text(max_size=5) | json_value}),
)


@SETTINGS
@given(items=st.lists(corpus_item, max_size=6) | json_value)
def test_corpus_reader_accepts_or_names_the_defect(scratch: Path, items: Any) -> None:
    kind, value = from_file_and_memory(scratch, items, read_corpus, "corpus")
    if kind == "ok":
        assert len(value) == len(items)
        assert all(isinstance(p.title, str) and isinstance(p.text, str) for p in value)
        assert len({p.key for p in value}) == len(value)
    else:
        assert names_a_field(value, "list", "title", "text"), value


@SETTINGS
@given(items=st.lists(st.one_of(
    st.builds(Passage, st.text(max_size=3) | st.just(LONG), st.text(max_size=3)),
    corpus_item), max_size=5))
def test_passage_objects_and_dicts_mixed(items: list[Any]) -> None:
    kind, value = outcome(lambda: as_passages(items), described(items, "corpus"))
    if kind == "error":
        assert names_a_field(value, "title", "text"), value


def test_duplicate_of_a_huge_passage_is_named_by_a_cut_title() -> None:
    twice = [Passage(LONG, LONG)] * 2
    kind, rest = outcome(lambda: as_passages(twice), "in-memory corpus (list of 2)")
    assert kind == "error" and "corpus[1] duplicates corpus[0]" in rest


# ---------------------------------------------------------------------------------------------
# OpenIE

triple = st.lists(st.text(max_size=4) | leaf, min_size=2, max_size=4)


def _doc(k: int, how: str, triples: Any, entities: Any) -> dict[str, Any]:
    p = CORPUS[k]
    named = {"idx": {"idx": p.key}, "passage": {"passage": p.content},
             "title_text": {"title": p.title, "text": p.text}}[how]
    return {**named, "extracted_triples": triples, "extracted_entities": entities}


openie_doc = st.one_of(
    st.builds(_doc, st.integers(0, 2), st.sampled_from(["idx", "passage", "title_text"]),
              st.lists(triple, max_size=4) | json_value, json_value),
    json_value,
)
openie_data = st.one_of(st.builds(lambda docs: {"docs": docs}, st.lists(openie_doc, max_size=6)),
                        st.lists(openie_doc, max_size=6), json_value)


def check_openie(docs: list[OpenIEDoc]) -> None:
    assert len(docs) == len(CORPUS)
    for d in docs:
        assert all(len(t) == 3 and all(isinstance(x, str) and x.strip() for x in t)
                   for t in d.triples)
        assert all(isinstance(e, str) for e in d.entities)


@SETTINGS
@given(data=openie_data, allow_missing=st.booleans())
def test_openie_reader_accepts_or_names_the_defect(scratch: Path, data: Any,
                                                   allow_missing: bool) -> None:
    kind, value = from_file_and_memory(
        scratch, data, lambda s: read_openie(s, CORPUS, allow_missing=allow_missing), "OpenIE")
    if kind == "ok":
        check_openie(value[0])
    else:
        assert names_a_field(value, "docs", "cover"), value


@SETTINGS
@given(docs=st.lists(st.one_of(openie_doc, st.builds(OpenIEDoc.from_raw, json_value, json_value),
                               st.builds(Passage, st.just(LONG), st.just(LONG))), max_size=4))
def test_openie_objects_in_memory(docs: list[Any]) -> None:
    data = {"docs": docs}
    kind, value = outcome(lambda: read_openie(data, CORPUS, allow_missing=True),
                          "in-memory OpenIE (dict of 1)")
    if kind == "ok":
        check_openie(value[0])
    else:
        assert "docs[" in value, value


def test_openie_docs_as_objects_beside_a_large_corpus_get_a_short_message() -> None:
    """The report that opened issue 26: build_index(passages, {"docs": [OpenIEDoc(...), ...]})
    raised a 38 MB message, the repr of the whole OpenIE object."""
    corpus = [Passage(f"title {i}", f"{i} " + "words " * 400) for i in range(3_000)]
    docs = [OpenIEDoc(entities=("e",), triples=(("s", "p", f"o{i}"),)) for i in range(3_000)]
    with pytest.raises(DataFormatError) as e:
        read_openie({"docs": docs}, corpus)
    msg = str(e.value)
    assert len(msg) < 400, len(msg)
    assert msg.startswith("in-memory OpenIE (dict of 1): docs[0]: ")
    assert "got OpenIEDoc" in msg and "IndexWriter.insert_docs" in msg


# ---------------------------------------------------------------------------------------------
# questions

question = st.one_of(
    json_value,
    st.fixed_dictionaries(
        {"question": st.text(max_size=5) | st.just(LONG)},
        optional={"id": json_value, "answer": json_value, "answer_aliases": json_value,
                  "paragraphs": st.lists(st.one_of(
                      st.fixed_dictionaries({"title": st.text(max_size=3), "text": leaf,
                                             "is_supporting": st.booleans()}),
                      json_value), max_size=3) | json_value,
                  "context": json_value, "supporting_facts": json_value}),
    st.fixed_dictionaries({
        "question": st.just("q"),
        "context": st.lists(st.tuples(st.sampled_from(["A", "B"]),
                                      st.lists(st.text(max_size=4), max_size=2)).map(list)
                            | json_value, max_size=3),
        "supporting_facts": st.lists(st.tuples(st.sampled_from(["A", "B"]),
                                               st.integers(0, 2)).map(list) | json_value,
                                     max_size=3)}),
)


@SETTINGS
@given(items=st.lists(question, max_size=4) | json_value)
def test_questions_reader_accepts_or_names_the_defect(scratch: Path, items: Any) -> None:
    kind, value = from_file_and_memory(scratch, items, read_questions, "questions")
    if kind == "ok":
        assert len(value) == len(items)
        for q in value:
            assert isinstance(q.question, str) and all(isinstance(a, str) for a in q.answers)
            assert all(isinstance(p.title, str) and isinstance(p.text, str) for p in q.gold)
    else:
        assert names_a_field(value, "list"), value


# ---------------------------------------------------------------------------------------------
# the batch job's query file

row = st.one_of(
    json_value,
    st.fixed_dictionaries({"id": st.integers() | st.text(max_size=4) | json_value,
                           "query": st.text(max_size=6) | st.just(LONG) | json_value},
                          optional={"entities": st.lists(st.text(max_size=3)) | json_value}),
)
line = st.one_of(row.map(lambda r: json.dumps(r).encode()), st.binary(max_size=12),
                 st.just(b'{"id": 1, "query": "q"'), st.just(b"[" * 100_000),
                 st.just(b'{"id": ' + b"9" * 5_000 + b', "query": "q"}'))


@SETTINGS
@given(lines=st.lists(line, min_size=1, max_size=6), skip_bad=st.booleans())
def test_query_file_reader_accepts_or_names_the_row(scratch: Path, lines: list[bytes],
                                                    skip_bad: bool) -> None:
    path = scratch / "queries.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    bad: list[dict[str, Any]] = []
    kind, value = outcome(lambda: list(read_query_rows(path, skip_bad=skip_bad, bad=bad)),
                          str(path))
    if kind == "error":
        assert value.startswith(":") or value.startswith(" row"), value  # path:LINE: ...
    else:
        assert all(r is None or (isinstance(r.query, str) and r.query.strip()) for r in value)
        assert len(bad) == sum(r is None for r in value)
        for b in bad:
            assert b["where"].startswith(str(path)) and len(b["error"]) <= MAX_MESSAGE + 200
            assert not echoes_long(b["error"])


@SETTINGS
@given(raw=json_value | row)
def test_query_row_check_in_memory(raw: Any) -> None:
    try:
        rid, query, ents = check_row(raw)
    except DataFormatError as e:
        assert len(str(e)) <= 200 and not echoes_long(str(e)) and "'" in str(e), str(e)
        return
    assert isinstance(query, str) and query.strip()
    assert isinstance(rid, (str, int)) and not isinstance(rid, bool)


def test_parquet_that_is_not_parquet(scratch: Path) -> None:
    pytest.importorskip("pyarrow")
    path = scratch / "queries.parquet"
    path.write_bytes(b"PAR1" + os.urandom(64))
    assert outcome(lambda: list(read_query_rows(path)), str(path))[0] == "error"


# ---------------------------------------------------------------------------------------------
# the command line, in a subprocess


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hippo_gpu.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_clean_failure(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr[-2000:]
    err = " ".join(done.stderr.split())  # rich wraps long lines
    for text in expected:
        assert text in err, (text, err[-1000:])
    assert len(done.stderr) < 2_000 and not echoes_long(err)


def test_cli_index_on_hostile_files_exits_2_with_the_message(tmp_path: Path) -> None:
    # a folder name holding console markup, a corpus that is not UTF-8
    odd = tmp_path / "odd [" / "x] [bold]"  # the path holds "[/x]", a closing tag to rich
    odd.mkdir(parents=True)
    (odd / "corpus.json").write_bytes(b'[{"title": "\xff\xfe", "text": "x"}]')
    openie = odd / "openie.json"
    openie.write_text(json.dumps({"docs": []}))
    done = run_cli("index", "--corpus", str(odd / "corpus.json"), "--openie", str(openie),
                   "--out", str(tmp_path / "idx"), "--encoder", "hash:16", cwd=tmp_path)
    assert_clean_failure(done, "odd [/x] [bold]", "not UTF-8")
    # a valid corpus, and OpenIE whose docs hold the long string where an object belongs
    (odd / "corpus.json").write_text(json.dumps([{"title": "A", "text": LONG}]))
    openie.write_text(json.dumps({"docs": [LONG]}))
    done = run_cli("index", "--corpus", str(odd / "corpus.json"), "--openie", str(openie),
                   "--out", str(tmp_path / "idx"), "--encoder", "hash:16", cwd=tmp_path)
    assert_clean_failure(done, "docs[0]: expected an object", "got str")
    assert not (tmp_path / "idx").exists()


def test_cli_eval_and_retrieve_on_hostile_files_exit_2(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "openie.json").write_text("{}")
    (data / "questions.json").write_text(json.dumps(
        [{"question": "q", "paragraphs": [LONG]}]))
    done = run_cli("eval", "--data", str(data), cwd=tmp_path)
    assert_clean_failure(done, "questions[0].paragraphs[0]")
    from hippo_gpu import build_index
    from hippo_gpu.sample import paths

    files = paths()
    build_index(files["corpus"], files["openie"], tmp_path / "index", encoder="hash:16",
                device="cpu", ppr_basis=False)
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"id": 1, "query": "fine"}) + "\n"
                       + json.dumps({"id": [LONG], "query": "q"}) + "\n")
    done = run_cli("retrieve", "--index", str(tmp_path / "index"), "--queries", str(queries),
                   "--out", str(tmp_path / "out.jsonl"), "--device", "cpu", cwd=tmp_path)
    assert_clean_failure(done, f"{queries}:2: 'id' must be a string or an integer, got list")
    queries.write_bytes(b'{"id": 1, "query": "fine"}\n\xff\n')
    done = run_cli("retrieve", "--index", str(tmp_path / "index"), "--queries", str(queries),
                   "--out", str(tmp_path / "out2.jsonl"), "--device", "cpu", cwd=tmp_path)
    assert_clean_failure(done, f"{queries}:2: not UTF-8")
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "out2.jsonl").exists()


def test_every_reader_error_is_a_hippo_gpu_error() -> None:
    assert issubclass(DataFormatError, HippoGpuError) and issubclass(DataFormatError, ValueError)
