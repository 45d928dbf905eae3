"""Fault tests of the real OpenAI client path against a fault-injecting HTTP server.

The server speaks the chat-completions protocol and answers OpenIE prompts with a deterministic
extraction; per passage it can instead return garbage, truncated JSON, HTTP 500, hang past the
client timeout, or die (stop listening). A SIGKILL test kills an extraction subprocess mid-run.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openai")

from hippo_gpu.llm.extract import extract_openie  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.llm.fake_llm_server import FaultServer, backend, corpus, send_json  # noqa: E402


@pytest.fixture
def server():
    s = FaultServer()
    yield s
    s.close()


def test_retries_recover_from_500_and_timeouts(server: FaultServer, tmp_path: Path) -> None:
    server.faults = {"P000": ["500", "500"], "P001": ["hang"], "P002": ["ok", "500"]}
    report = extract_openie(corpus(4), backend(server.url), tmp_path / "o.json",
                            show_progress=False)
    assert report.failed == 0 and report.done == 4
    assert server.requests[("P000", "ner")] == 3  # two 500s, then success
    assert server.requests[("P001", "ner")] == 2  # one timeout, then success
    assert server.requests[("P002", "triples")] == 2
    docs = json.loads((tmp_path / "o.json").read_text())["docs"]
    assert docs[0]["extracted_triples"] == [["P000", "located in", "P000 Town"]]


def test_persistent_faults_recorded_then_retried(server: FaultServer, tmp_path: Path) -> None:
    server.faults = {"P001": ["garbage"], "P002": ["500"] * 3, "P003": ["truncated"],
                     "P004": ["ok", "hang", "hang", "hang"]}
    out, cache = tmp_path / "o.json", tmp_path / "c.sqlite"
    report = extract_openie(corpus(6), backend(server.url), out, cache_path=cache,
                            show_progress=False)
    docs = {d["passage"].split("\n")[0]: d for d in json.loads(out.read_text())["docs"]}
    assert len(docs) == 6
    assert docs["P001"]["error"] == "ner:no_json"
    assert docs["P002"]["error"] == "ner:http_500"
    assert docs["P004"]["error"] == "triples:timeout"
    assert docs["P003"]["extracted_entities"] == []  # truncated reply repaired, not failed
    for title in ("P001", "P002", "P004"):
        assert docs[title]["extracted_entities"] == [] and docs[title]["extracted_triples"] == []
    assert report.failed == 3 and report.done == 3
    assert report.failures == {"ner:no_json": 1, "ner:http_500": 1, "triples:timeout": 1}
    assert report.parse.repairs["truncated"] == 1
    db = sqlite3.connect(cache)
    failed = dict(db.execute("SELECT error, COUNT(*) FROM results WHERE status = 'failed' "
                             "GROUP BY error").fetchall())
    assert failed == {"ner:no_json": 1, "ner:http_500": 1, "triples:timeout": 1}
    db.close()

    # Healthy server: the rerun sends only the failed passages (P004 keeps its cached NER).
    server.requests.clear()
    report2 = extract_openie(corpus(6), backend(server.url), out, cache_path=cache,
                             show_progress=False)
    assert report2.failed == 0 and report2.cached == 3 and report2.done == 3
    assert server.requests == Counter({("P001", "ner"): 1, ("P001", "triples"): 1,
                                       ("P002", "ner"): 1, ("P002", "triples"): 1,
                                       ("P004", "triples"): 1})
    assert not any("error" in d for d in json.loads(out.read_text())["docs"])


def test_server_killed_mid_run_rerun_redoes_only_unfinished(tmp_path: Path) -> None:
    dying = FaultServer(die_after=9)
    out, cache = tmp_path / "o.json", tmp_path / "c.sqlite"
    try:
        report = extract_openie(corpus(10), backend(dying.url, concurrency=1, max_retries=1),
                                out, cache_path=cache, wave_size=2, show_progress=False)
    finally:
        dying.thread.join(timeout=10)
    # 9 requests served: 4 passages complete + 1 NER; every other passage failed with a reason.
    assert report.done == 4 and report.failed == 6
    assert set(report.failures) <= {f"{stage}:{why}" for stage in ("ner", "triples")
                                    for why in ("connection", "timeout")}
    docs = json.loads(out.read_text())["docs"]
    assert sum("error" in d for d in docs) == 6

    fresh = FaultServer()
    try:
        report2 = extract_openie(corpus(10), backend(fresh.url), out, cache_path=cache,
                                 show_progress=False)
    finally:
        fresh.close()
    assert report2.cached == 4 and report2.done == 6 and report2.failed == 0
    done_titles = {f"P{i:03d}" for i in range(4)}
    assert not any(t in done_titles for t, _ in fresh.requests)
    assert sum(n for (_, stage), n in fresh.requests.items() if stage == "triples") == 6
    assert sum(n for (_, stage), n in fresh.requests.items() if stage == "ner") == 5


_CHILD = """
import sys
from hippo_gpu.llm.extract import extract_openie
from hippo_gpu.llm.backends.openai import OpenAIBackend
corpus = [{"title": f"P{i:03d}", "text": f"Passage number {i}."} for i in range(int(sys.argv[3]))]
extract_openie(corpus, OpenAIBackend("fake", sys.argv[1], concurrency=2, timeout=5),
               sys.argv[2] + "/o.json", cache_path=sys.argv[2] + "/c.sqlite", wave_size=4,
               show_progress=False)
"""


def _ok_count(cache: Path) -> int:
    if not cache.exists():
        return 0
    db = sqlite3.connect(cache, timeout=5)
    try:
        return db.execute("SELECT COUNT(*) FROM results WHERE task = 'openie' AND status = 'ok'"
                          ).fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def test_sigkill_mid_run_leaves_loadable_cache(tmp_path: Path) -> None:
    slow = FaultServer(delay=0.05)
    n = 40
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, slow.url, str(tmp_path), str(n)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cache = tmp_path / "c.sqlite"
    try:
        deadline = time.time() + 60
        while _ok_count(cache) < 6 and time.time() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
        slow.close()
    assert child.returncode == -signal.SIGKILL
    assert not (tmp_path / "o.json").exists()  # output is only ever written whole
    db = sqlite3.connect(cache)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    finished = _ok_count(cache)
    assert 6 <= finished < n

    fresh = FaultServer()
    try:
        report = extract_openie(corpus(n), backend(fresh.url), tmp_path / "o.json",
                                cache_path=cache, show_progress=False)
    finally:
        fresh.close()
    assert report.cached == finished and report.done == n - finished and report.failed == 0
    assert sum(v for (_, s), v in fresh.requests.items() if s == "triples") == n - finished
    docs = json.loads((tmp_path / "o.json").read_text())["docs"]
    assert len(docs) == n and not any("error" in d for d in docs)


def test_schema_mode_downgrades_when_server_rejects_response_format(tmp_path: Path) -> None:
    class NoJsonSchema(FaultServer):  # refuses response_format json_schema with a 400
        def post(self, handler: Any) -> None:
            raw = handler.rfile.read(int(handler.headers["Content-Length"]))
            if "response_format" in json.loads(raw) and "json_schema" in raw.decode():
                send_json(handler, 400, {"error": {
                    "message": "response_format json_schema unsupported",
                    "type": "invalid_request_error"}})
                return
            handler.rfile = io.BytesIO(raw)
            super().post(handler)

    s = NoJsonSchema()
    try:
        b = backend(s.url, concurrency=1)
        report = extract_openie(corpus(2), b, tmp_path / "o.json", show_progress=False)
    finally:
        s.close()
    assert report.failed == 0 and b.schema_mode == "json_object"
