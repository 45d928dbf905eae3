"""Cache, extraction, filter, query NER and QA with recorded (mocked) LLM replies."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from hippo_gpu.data import as_passages, read_openie
from hippo_gpu.evaluate import f1, normalize_answer, qa_metrics
from hippo_gpu.llm.backends import (
    BackendSpecError,
    ChatRequest,
    Completion,
    parse_spec,
)
from hippo_gpu.llm.cache import LLMCache, cache_key
from hippo_gpu.llm.extract import OpenIEConfig, extract_openie
from hippo_gpu.llm.filter import RecognitionMemoryFilter
from hippo_gpu.llm.ner import NERFileError, QueryNER, read_query_ner_tsv
from hippo_gpu.llm.parse import ParseStats
from hippo_gpu.llm.qa import QAReader
from tests.helpers import (
    REPO,  # noqa: E402
    musique_or_skip,
)
from tests.llm.recorded_llm import CORPUS, REPLIES, RecordedBackend, is_ner, passage_of, recorded

DATA = Path(os.environ.get("HIPPO_DATA_DIR", REPO.parent
                           / "shared" / "data"))


def test_extract_writes_v2_json_with_failures(tmp_path: Path) -> None:
    backend = RecordedBackend(recorded)
    out = tmp_path / "openie.json"
    report = extract_openie(CORPUS, backend, out, show_progress=False)
    doc = json.loads(out.read_text())
    assert [d["idx"] for d in doc["docs"]] == [
        "chunk-" + hashlib.md5(f"{p['title']}\n{p['text']}".encode()).hexdigest() for p in CORPUS]
    alpha, gamma, eps = doc["docs"]
    assert alpha["passage"] == "Alpha\nAlpha was founded by Beta in 1901."
    assert alpha["extracted_entities"] == ["Alpha", "Beta", "1901"]
    assert alpha["extracted_triples"] == [["Alpha", "founded by", "Beta"],
                                          ["Alpha", "founded in", "1901"]]
    assert gamma["extracted_triples"] == [["Gamma", "lies in", "Delta"]]
    assert "error" not in alpha and "error" not in gamma
    assert eps == {"idx": eps["idx"], "passage": "Epsilon\nEpsilon wrote Zeta.",
                   "extracted_entities": [], "extracted_triples": [], "error": "ner:no_json"}
    ents = ["Alpha", "Beta", "1901", "Gamma", "Delta"]
    assert doc["avg_ent_chars"] == round(sum(map(len, ents)) / 5, 4)
    assert doc["avg_ent_words"] == 1.0
    assert (report.done, report.cached, report.failed) == (2, 0, 1)
    assert report.failures == {"ner:no_json": 1}
    assert report.rejected == {"no_json": 1}
    assert report.parse.repairs["code_fence"] == 1 and report.parse.repairs["truncated"] == 1
    # ["Alpha", "x"], and the cut-off ["Gam" closed as []
    assert report.parse.repairs["wrong_arity"] == 2 and report.parse.repairs["duplicate"] == 1
    assert report.requests == 5 and report.completion_tokens == 100
    assert report.docs == read_openie(out, as_passages(CORPUS))[0]  # the file, as objects
    # The triple prompt is conditioned on the NER output.
    assert '["Alpha", "Beta", "1901"]' in backend.requests[3].messages[-1]["content"]

    # Rerun: finished passages come from the cache; the failed one is retried (and now works).
    REPLIES_FIXED = dict(REPLIES, Epsilon=('{"named_entities": ["Epsilon", "Zeta"]}',
                                           '{"triples": [["Epsilon", "wrote", "Zeta"]]}'))
    backend2 = RecordedBackend(lambda r: Completion(
        REPLIES_FIXED[passage_of(r).split("\n", 1)[0]][0 if is_ner(r) else 1]))
    report2 = extract_openie(CORPUS, backend2, out, show_progress=False)
    assert (report2.done, report2.cached, report2.failed) == (1, 2, 0)
    assert len(backend2.requests) == 2
    assert all("Epsilon" in passage_of(r) for r in backend2.requests)
    doc2 = json.loads(out.read_text())
    assert doc2["docs"][2]["extracted_triples"] == [["Epsilon", "wrote", "Zeta"]]
    assert not any("error" in d for d in doc2["docs"])


def test_extract_without_a_file_returns_the_docs(tmp_path: Path) -> None:
    """out_path=None: no OpenIE file, the same docs (the server's path); a cache is needed."""
    with_file = extract_openie(CORPUS, RecordedBackend(recorded), tmp_path / "o.json",
                               show_progress=False)
    cache = tmp_path / "no-file" / "c.sqlite"
    cache.parent.mkdir()
    no_file = extract_openie(CORPUS, RecordedBackend(recorded), None, cache_path=cache,
                             show_progress=False)
    assert no_file.docs == with_file.docs and no_file.docs[2].error == "ner:no_json"
    assert no_file.out_path == "" and "docs" not in no_file.as_dict()
    assert not list(cache.parent.glob("*.json"))
    with pytest.raises(ValueError, match="cache_path"):
        extract_openie(CORPUS, RecordedBackend(recorded), None, show_progress=False)


def test_cache_key_covers_template_model_params(tmp_path: Path) -> None:
    base = ("openie", "t/1/abc", "m", {"max_tokens": 5}, "passage")
    k = cache_key(*base)
    assert k != cache_key("openie", "t/2/abc", "m", {"max_tokens": 5}, "passage")
    assert k != cache_key("openie", "t/1/abc", "m2", {"max_tokens": 5}, "passage")
    assert k != cache_key("openie", "t/1/abc", "m", {"max_tokens": 6}, "passage")
    assert k != cache_key("openie", "t/1/abc", "m", {"max_tokens": 5}, "passage!")
    path = tmp_path / "c.sqlite"
    with LLMCache(path) as cache:
        cache.put_failed(k, "openie", "http_500")
        assert cache.get_ok(k) is None and cache.get(k).error == "http_500"
        cache.put_ok(k, "openie", {"triples": [["a", "b", "c"]]}, completion_tokens=7)
        assert cache.counts() == {"ok": 1}
    with LLMCache(path) as cache:  # reopened: committed, attempts counted
        entry = cache.get(k)
        assert entry.value == {"triples": [["a", "b", "c"]]} and entry.attempts == 2
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_changed_config_invalidates_cache(tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    b1 = RecordedBackend(recorded)
    extract_openie(CORPUS[:2], b1, out, show_progress=False)
    b2 = RecordedBackend(recorded)
    extract_openie(CORPUS[:2], b2, out, show_progress=False, config=OpenIEConfig(max_triples=7))
    assert len(b2.requests) == 4  # new parameters: nothing reused
    b3 = RecordedBackend(recorded, model="other")
    extract_openie(CORPUS[:2], b3, out, show_progress=False)
    assert len(b3.requests) == 4  # new model: nothing reused


def test_extract_replays_recorded_gpt35_openie(tmp_path: Path) -> None:
    """Replay real gpt-3.5 replies (HippoRAG's released OpenIE) through the extraction path."""
    musique_or_skip()
    ref = json.loads((DATA / "musique_train" / "openie_gpt-3.5-turbo-1106.json").read_text())
    docs = ref["docs"][:60]
    by_passage = {d["passage"]: d for d in docs}

    def reply(r: ChatRequest) -> Completion:
        d = by_passage[passage_of(r)]
        if is_ner(r):
            return Completion(json.dumps({"named_entities": d["extracted_entities"]}))
        return Completion(json.dumps({"triples": d["extracted_triples"]}))

    out = tmp_path / "o.json"
    report = extract_openie([{"title": d["title"], "text": d["text"]} for d in docs],
                            RecordedBackend(reply), out, show_progress=False,
                            config=OpenIEConfig(max_triples=200, max_entities=200,
                                                max_item_chars=400))
    got = json.loads(out.read_text())["docs"]
    assert report.failed == 0 and len(got) == len(docs)
    for d, g in zip(docs, got):
        want, seen = [], set()
        for t in d["extracted_triples"]:
            if len(t) == 3 and all(isinstance(x, str) and x.strip() for x in t):
                key = tuple(x.strip() for x in t)
                if key not in seen:
                    seen.add(key)
                    want.append(list(key))
        assert g["extracted_triples"] == want


def _filter_backend(replies: dict[str, Completion]) -> RecordedBackend:
    def reply(r: ChatRequest) -> Completion:
        q = r.messages[-1]["content"].split("Question: ", 1)[1].split("\n", 1)[0]
        return replies[q]
    return RecordedBackend(reply)


def test_recognition_filter_maps_counts_and_caches(tmp_path: Path) -> None:
    cands = [[("a", "born in", "x"), ("b", "wrote", "y"), ("c", "lives in", "z")],
             [("d", "is", "e")], [("f", "g", "h")], []]
    replies = {
        "q0": Completion('{"fact": [["c", "lives in", "z"], ["A", "born in", "x"],'
                         ' ["c", "lives in", "z"]]}'),
        "q1": Completion(None, "http_500"),
        "q2": Completion("no idea"),
    }
    backend = _filter_backend(replies)
    flt = RecognitionMemoryFilter(backend, cache=tmp_path / "f.sqlite")
    out = flt(["q0", "q1", "q2", "q3"], cands)
    assert out.kept == [[2, 0], [], [], []]
    assert out.fallbacks == 2 and out.failed == [1, 2]
    assert out.reasons == {"http_500": 1, "no_json": 1}
    assert len(backend.requests) == 3  # no call for a query without candidates
    schema = backend.requests[0].json_schema
    assert schema["properties"]["fact"]["maxItems"] == 3
    again = flt(["q0", "q1", "q2", "q3"], cands)
    assert again.kept[0] == [2, 0] and again.cached == 1
    assert len(backend.requests) == 5  # only the two failures were retried


def test_query_ner_and_tsv(tmp_path: Path) -> None:
    replies = {"Who wrote Zeta?": Completion('{"named_entities": ["Zeta", "Zeta"]}'),
               "Where is Delta?": Completion(None, "timeout")}
    backend = RecordedBackend(
        lambda r: replies[r.messages[-1]["content"].removeprefix("Question: ")])
    ner = QueryNER(backend, cache=tmp_path / "n.sqlite")
    assert ner(["Who wrote Zeta?", "Where is Delta?"]) == [["Zeta"], []]
    assert ner.failures == {"timeout": 1}
    tsv = tmp_path / "q.named_entity_output.tsv"
    tsv.write_text("\tquestion\ttriples\n"
                   '0\tWho wrote Zeta?\t{"named_entities": ["Zeta"]}\n'
                   "1\tBad row?\t{'named_entities': ['x']}\n", encoding="utf-8")
    stats = ParseStats()
    assert read_query_ner_tsv(tsv, stats) == {"Who wrote Zeta?": ["Zeta"], "Bad row?": []}
    assert stats.rejected == {"invalid_json": 1}
    bad = tmp_path / "bad.tsv"
    bad.write_text("question\tother\nq\tx\n")
    with pytest.raises(NERFileError):
        read_query_ner_tsv(bad)


def test_qa_reader_prompt_and_metrics() -> None:
    backend = RecordedBackend(lambda r: Completion("Thought: easy.\nAnswer: The Paris."))
    reader = QAReader(backend, top_k=2)
    answers = reader(["Where?"], [["T1\nx", "T2\ny", "T3\nz"]])
    assert answers == ["The Paris."]
    user = backend.requests[0].messages[-1]["content"]
    assert user == "Wikipedia Title: T1\nx\n\nWikipedia Title: T2\ny\n\nQuestion: Where?\nThought: "
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert f1("Paris France", "Paris") == pytest.approx(2 / 3)
    m = qa_metrics(["The Paris.", "London", "new york city"],
                   [["paris"], ["Berlin", "london"], ["New York"]])
    assert m["em"] == pytest.approx(2 / 3)
    assert m["f1"] == pytest.approx((1 + 1 + 0.8) / 3)


@pytest.mark.parametrize(
    ("spec", "kind", "model", "url"),
    [("openai:gpt-4o-mini@http://127.0.0.1:8000/v1", "openai", "gpt-4o-mini",
      "http://127.0.0.1:8000/v1"),
     ("openai:org/m@x@https://h/v1/", "openai", "org/m@x", "https://h/v1"),
     ("vllm:Qwen/Qwen2.5-0.5B-Instruct", "vllm", "Qwen/Qwen2.5-0.5B-Instruct", None),
     ("local:smollm2", "local", "smollm2", None)],
)
def test_parse_spec(spec: str, kind: str, model: str, url: str | None) -> None:
    parsed = parse_spec(spec)
    assert (parsed.kind, parsed.model, parsed.base_url) == (kind, model, url)


@pytest.mark.parametrize("spec", ["gpt-4o", "openai:gpt-4o", "openai:m@ftp://x", "foo:bar",
                                  "local:"])
def test_bad_spec(spec: str) -> None:
    with pytest.raises(BackendSpecError):
        parse_spec(spec)


def test_llm_package_imports_no_client() -> None:
    code = ("import sys, hippo_gpu.llm, hippo_gpu.cli.llm, hippo_gpu.retrieval.searcher, "
            "hippo_gpu.ppr;"
            "print([m for m in ('openai', 'xllamacpp', 'vllm') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_no_eval_or_pickle_in_llm_layer() -> None:
    root = REPO / "hippo_gpu" / "llm"
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "eval(" not in text and "pickle" not in text, path
