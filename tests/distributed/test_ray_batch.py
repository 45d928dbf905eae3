"""hippo_gpu.distributed on a local Ray instance: `retrieve --ray` answers equal the local
command's (same keys in the same order per id, scores within 1e-6), a replica that dies mid-run
is restarted and its batch retried with every id exactly once, and `extract --ray` over two
fake OpenAI-compatible endpoints writes the local command's OpenIE JSON, never sending a passage
twice.

One Ray instance per module (2 CPUs, no dashboard). Its start and each actor pool's start
(importing torch and loading the encoder in every replica) dominate the run time, so the index
is the sample's with the hash:64 encoder (tests/conftest.py): a replica opens it without loading
a model, and how texts are embedded is no part of these claims.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pytest.importorskip("pyarrow")

from hippo_gpu.data import DataFormatError  # noqa: E402
from hippo_gpu.distributed.ray_batch import IndexActor, retrieve_ray  # noqa: E402
from hippo_gpu.retrieval.batch import retrieve_file  # noqa: E402
from hippo_gpu.retrieval.spec import SearcherSpec  # noqa: E402
from tests.helpers import QUERIES, REPO  # noqa: E402

CRASH = "crash trigger "  # + marker path + ": " + question (see CrashOnce)


@pytest.fixture(scope="module")
def ray_local():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _rows(n: int) -> list[dict]:
    qs = QUERIES + ["lighthouse", "Alzheimer", "Who designed it?", "tidal clock river"]
    rows: list[dict] = [{"id": i if i % 3 else f"q{i}", "query": qs[i % len(qs)]}
                        for i in range(n)]
    for i in range(0, n, 5):  # some rows carry their own entities (batched apart)
        rows[i]["entities"] = ["Skerrow"]
    return rows


def _write_jsonl(path: Path, rows: list, blank_after: int | None = None) -> Path:
    lines = [json.dumps(r) + "\n" for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "\n")
    path.write_text("".join(lines))
    return path


def _assert_same(got: list[dict], want: list[dict]) -> None:
    assert [g["id"] for g in got] == [w["id"] for w in want]  # every id once, input order
    for g, w in zip(got, want):
        assert list(g) == list(w) == ["id", "keys", "titles", "scores"]
        assert g["keys"] == w["keys"] and g["titles"] == w["titles"]
        assert g["scores"] == pytest.approx(w["scores"], abs=1e-6)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_ray_answers_equal_local_command(ray_local, sample_hash_index_dir, sample_hash_searcher,
                                         tmp_path):
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    rows = _rows(41)
    q = _write_jsonl(tmp_path / "q.jsonl", rows, blank_after=7)
    local = tmp_path / "local.jsonl"
    retrieve_file(sample_hash_searcher, q, local, top_k=5, batch_size=6, part_size=10,
                  show_progress=False)
    out = tmp_path / "ray.jsonl"
    # Through the CLI; Ray is already up in this process, so --ray uses it and leaves it up.
    res = CliRunner().invoke(app, [
        "retrieve", "--index", str(sample_hash_index_dir), "--queries", str(q), "--out", str(out),
        "--top-k", "5", "--batch-size", "6", "--part-size", "9", "--device", "cpu",
        "--threads", "1", "--ray", "local", "--workers", "2", "--cpus-per-worker", "0.5"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "41 rows" in said and "2 workers" in said
    assert "41 answered, 0 from committed parts, 0 malformed" in said
    _assert_same(_jsonl(out), _jsonl(local))
    assert not out.with_name("ray.jsonl.parts").exists()
    assert ray.is_initialized()


def test_ray_is_imported_only_by_hippo_gpu_distributed():
    import ast

    root = REPO / "hippo_gpu"
    for path in root.rglob("*.py"):
        if "distributed" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                core = path.relative_to(root).parts[0] != "cli"
                assert not (name == "ray" or name.startswith("ray.")) or not core, path
                assert not (core and name.startswith("hippo_gpu.distributed")), path


class CrashOnce(IndexActor):
    """Dies (os._exit, as a killed process) on the first chunk holding a query
    "crash trigger MARKER: ..."; it creates MARKER first, so the chunk retried on the
    restarted replica succeeds."""

    def answer(self, rows):
        for query in rows.column("query").to_pylist():
            if query and query.startswith(CRASH):
                marker = Path(query[len(CRASH):].split(": ", 1)[0])
                if not marker.exists():
                    marker.write_text(str(os.getpid()))
                    os._exit(1)
        return super().answer(rows)


@pytest.mark.slow
def test_killed_replica_is_retried_every_id_once_parquet(ray_local, sample_hash_index_dir,
                                                        sample_hash_searcher, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**r, "id": str(r["id"]), "entities": r.get("entities")} for r in _rows(30)]
    marker = tmp_path / "crashed"
    rows[17]["query"] = f"{CRASH}{marker}: Who designed the lighthouse on Skerrow?"
    rows[23] = {"id": "bad", "query": "", "entities": None}  # malformed: recorded, not fatal
    q = tmp_path / "q.parquet"
    out = tmp_path / "ray.parquet"
    pq.write_table(pa.Table.from_pylist(rows), q, row_group_size=13)  # 3 row groups
    report = retrieve_ray(SearcherSpec(sample_hash_index_dir, device="cpu"), q, out, workers=2,
                          cpus_per_worker=0.5, top_k=4, batch_size=4, part_size=5,
                          skip_bad=True, actor_cls=CrashOnce)
    assert report.parts == 7  # row groups of 13, 13 and 4 rows in chunks of at most 5
    assert marker.exists()  # a replica did die mid-run
    assert (report.rows, report.answered, report.bad) == (30, 29, 1)
    bad = [json.loads(line) for line in Path(report.bad_file).read_text().splitlines()]
    assert bad == [{"row": 23, "where": f"{q} row 23",
                    "error": f"{q} row 23: 'query' is blank"}]
    got = pq.read_table(out).to_pylist()
    good = [r for r in rows if r["id"] != "bad"]
    assert [g["id"] for g in got] == [r["id"] for r in good]  # every id exactly once, in order
    local = tmp_path / "local.parquet"
    retrieve_file(sample_hash_searcher, q, local, top_k=4, skip_bad=True, show_progress=False)
    _assert_same(got, pq.read_table(local).to_pylist())


def test_malformed_row_fails_the_run_naming_it(ray_local, sample_hash_index_dir, tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": 1, "query": "lighthouse"}\n{"id": 2}\n')
    with pytest.raises(DataFormatError, match=r"q\.jsonl: line at byte 33: malformed row "
                       r"'\{\"id\": 2\}': 'query' must be a string"):
        retrieve_ray(SearcherSpec(sample_hash_index_dir, device="cpu"), q, tmp_path / "o.jsonl",
                     workers=1)
    assert not (tmp_path / "o.jsonl").exists()


def test_plan_cuts_jsonl_at_line_ends_and_parquet_by_row_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hippo_gpu.distributed.ray_batch import plan_parts

    lines = [json.dumps({"id": i, "query": "q" * (i * 37 % 300)}) for i in range(50)]
    lines[20] = ""  # blank
    lines[30] = json.dumps({"id": 30, "query": "x" * 5000})  # longer than a chunk
    data = ("\n".join(lines)).encode()  # no newline after the last line
    q = tmp_path / "q.jsonl"
    q.write_bytes(data)
    plan = plan_parts(q, 4)
    assert plan[0][0] == 0 and plan[-1][1] == len(data)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(plan, plan[1:]))  # contiguous
    pieces = [data[lo:hi] for lo, hi in plan]
    assert all(p.endswith(b"\n") for p in pieces[:-1])  # every chunk ends at a line end
    assert [line for p in pieces for line in p.decode().split("\n")[:-1]] + \
        [pieces[-1].decode().split("\n")[-1]] == lines  # every line in exactly one chunk
    assert 8 <= len(plan) <= 20  # about 4 lines a chunk
    assert plan_parts(q, 4) == plan  # deterministic

    pq.write_table(pa.Table.from_pylist([{"id": str(i), "query": "q"} for i in range(20)]),
                   tmp_path / "q.parquet", row_group_size=7)
    assert plan_parts(tmp_path / "q.parquet", 3) == [
        [0, 0, 3], [0, 3, 6], [0, 6, 7], [1, 0, 3], [1, 3, 6], [1, 6, 7], [2, 0, 3], [2, 3, 6]]


@pytest.mark.slow
def test_killed_driver_then_rerun_answers_every_id_once(ray_local, sample_hash_index_dir,
                                                       sample_hash_searcher, tmp_path):
    """SIGKILL of the `retrieve --ray` driver (a subprocess joined to this module's Ray) after
    some parts are committed; rerunning the same command answers only the other chunks, discards
    a half-written part, and the output equals the local command's, every id once."""
    import signal
    import subprocess
    import sys
    import time

    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from hippo_gpu.cli import app

    rows = _rows(300)
    q = _write_jsonl(tmp_path / "q.jsonl", rows, blank_after=101)
    out = tmp_path / "ray.jsonl"
    parts = tmp_path / "ray.jsonl.parts"
    args = ["retrieve", "--index", str(sample_hash_index_dir), "--queries", str(q), "--out",
            str(out), "--top-k", "3", "--batch-size", "4", "--part-size", "10", "--device",
            "cpu", "--threads", "1", "--workers", "1", "--cpus-per-worker", "0.5", "--ray"]
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-m", "hippo_gpu.cli", *args, address], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while len(list(parts.glob("part-*.parquet"))) < 2:
            assert child.poll() is None, child.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no part committed in 180 s"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert not out.exists()
    chunks = len(json.loads((parts / "ray-run.json").read_text())["plan"])
    committed = list(parts.glob("part-*.parquet"))
    assert 2 <= len(committed) < chunks
    answered_before = sum(pq.read_table(p).column("status").to_pylist().count("ok")
                          for p in committed)
    # A part whose writer died before its rename: the rerun must not read it.
    (parts / ".part-00000029.parquet.tmp-dead").write_bytes(b"half a parquet file")

    # Other arguments on the same parts: refused, naming the difference.
    with pytest.raises(DataFormatError, match="differs in top_k"):
        retrieve_ray(SearcherSpec(sample_hash_index_dir, device="cpu"), q, out, top_k=4,
                     batch_size=4, part_size=10)

    # The same command again, in this process (Ray is up here, so --ray uses it).
    res = CliRunner().invoke(app, [*args, "local"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    resumed = int(said.split(" from committed parts")[0].rsplit(", ", 1)[1])
    answered = int(said.split(" answered")[0].rsplit(": ", 1)[1])
    # (A replica of the killed driver may commit a part more before Ray stops it.)
    assert answered_before <= resumed < len(rows) and resumed + answered == len(rows)
    local = tmp_path / "local.jsonl"
    retrieve_file(sample_hash_searcher, q, local, top_k=3, batch_size=4, part_size=10,
                  show_progress=False)
    _assert_same(_jsonl(out), _jsonl(local))  # every id exactly once, in input order
    assert not parts.exists()


# --- extract --ray over two fake OpenAI-compatible endpoints ---------------------------------

def _endpoints(*servers) -> list[str]:
    return [f"openai:fake@{s.url}" for s in servers]


FAKE_OPTIONS = {"timeout": 1.0, "max_retries": 1, "backoff": 0.01, "max_backoff": 0.05,
                "seed": 0, "concurrency": 2}


def test_extract_over_two_endpoints_equals_local(ray_local, tmp_path):
    pytest.importorskip("openai")
    from hippo_gpu.distributed.ray_extract import extract_openie_ray
    from hippo_gpu.llm.extract import extract_openie
    from tests.llm.fake_llm_server import FaultServer, backend, corpus

    docs = corpus(13)
    one = FaultServer()
    try:
        extract_openie(docs, backend(one.url), tmp_path / "local.json", show_progress=False)
    finally:
        one.close()
    a, b = FaultServer(), FaultServer()
    # Transient faults the backend's own retry absorbs, on both endpoints.
    a.faults = {"P000": ["500"], "P006": ["garbage"]}  # shards of 3: P006 is in a's shard 2
    b.faults = {"P004": ["500"]}
    try:
        report = extract_openie_ray(docs, _endpoints(a, b), tmp_path / "ray.json",
                                    shard_size=3, wave_size=2, backend_options=FAKE_OPTIONS,
                                    retry_rounds=1, show_progress=False)
    finally:
        a.close(), b.close()
    assert json.loads((tmp_path / "ray.json").read_text()) == \
        json.loads((tmp_path / "local.json").read_text())
    assert report.done == 13 and report.failed == 0 and report.cached == 0
    # Round-robin: both endpoints worked; no passage's triples were asked for twice.
    triples = Counter(t for s in (a, b) for (t, stage), n in s.requests.items()
                      if stage == "triples" for _ in range(n))
    assert sorted(triples) == [f"P{i:03d}" for i in range(13)]
    assert set(triples.values()) == {1}
    assert any(st == "triples" for _, st in a.requests) and \
        any(st == "triples" for _, st in b.requests)
    # P006's garbage reply failed its NER on endpoint a; the retry round sent it to b.
    assert a.requests[("P006", "ner")] == 1 and b.requests[("P006", "ner")] == 1


def test_extract_dead_endpoint_then_resume_sends_only_unfinished(ray_local, tmp_path):
    pytest.importorskip("openai")
    from hippo_gpu.distributed.ray_extract import extract_openie_ray
    from hippo_gpu.llm.extract import extract_openie
    from tests.llm.fake_llm_server import FaultServer, backend, corpus

    docs = corpus(12)
    out, cache = tmp_path / "ray.json", tmp_path / "c.sqlite"
    dying, healthy = FaultServer(die_after=4), FaultServer()
    try:  # no retry round: the dead endpoint's passages fail, with their reasons
        first = extract_openie_ray(docs, _endpoints(dying, healthy), out, cache_path=cache,
                                   shard_size=3, wave_size=3, retry_rounds=0,
                                   backend_options=FAKE_OPTIONS, show_progress=False)
    finally:
        dying.thread.join(timeout=10)
        healthy.close()
    assert first.failed > 0 and first.done + first.failed == 12
    failed_docs = [d for d in json.loads(out.read_text())["docs"] if "error" in d]
    assert len(failed_docs) == first.failed

    # Rerun (a fresh driver, as after a crash): only the unfinished passages are sent.
    c, d = FaultServer(), FaultServer()
    try:
        second = extract_openie_ray(docs, _endpoints(c, d), out, cache_path=cache,
                                    shard_size=3, wave_size=3, backend_options=FAKE_OPTIONS,
                                    show_progress=False)
    finally:
        c.close(), d.close()
    assert second.cached == first.done and second.done == first.failed and second.failed == 0
    sent = {t for s in (c, d) for (t, stage) in s.requests if stage == "triples"}
    assert sent == {doc["passage"].split("\n")[0] for doc in failed_docs}

    local = FaultServer()
    try:
        extract_openie(docs, backend(local.url), tmp_path / "local.json", show_progress=False)
    finally:
        local.close()
    assert json.loads(out.read_text()) == json.loads((tmp_path / "local.json").read_text())


_DRIVER = """
import json, sys
from hippo_gpu.cli import app
sys.argv = ["hippo-gpu", "extract", "--corpus", sys.argv[1], "--out", sys.argv[2],
            "--cache", sys.argv[3], "--llm", sys.argv[4], "--ray", sys.argv[5],
            "--shard-size", "2", "--wave-size", "2", "--concurrency", "1"]
app()
"""


def _ok_passages(cache: Path) -> int:
    import sqlite3

    if not cache.exists():
        return 0
    db = sqlite3.connect(cache, timeout=5)
    try:
        return db.execute("SELECT COUNT(*) FROM results WHERE task = 'openie' AND "
                          "status = 'ok'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


@pytest.mark.slow
def test_extract_driver_killed_then_rerun_finishes_the_rest(ray_local, tmp_path):
    """SIGKILL of the `extract --ray` driver (a subprocess joined to this module's Ray): the
    rerun sends only the passages whose shard the driver had not committed."""
    import signal
    import subprocess
    import sys
    import time

    pytest.importorskip("openai")
    from hippo_gpu.distributed.ray_extract import extract_openie_ray
    from hippo_gpu.llm.extract import extract_openie
    from tests.llm.fake_llm_server import FaultServer, backend, corpus

    n = 24
    docs = corpus(n)
    (tmp_path / "corpus.json").write_text(json.dumps(docs))
    out, cache = tmp_path / "ray.json", tmp_path / "c.sqlite"
    a, b = FaultServer(delay=0.3), FaultServer(delay=0.3)
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(tmp_path / "corpus.json"), str(out), str(cache),
         ",".join(_endpoints(a, b)), address],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while _ok_passages(cache) < 4 and time.time() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert child.poll() is None, child.stderr.read().decode()[-2000:]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
        a.close(), b.close()
    assert not out.exists()  # the output is only ever written whole
    committed = _ok_passages(cache)
    assert 4 <= committed < n

    c, d = FaultServer(), FaultServer()
    try:
        report = extract_openie_ray(docs, _endpoints(c, d), out, cache_path=cache,
                                    shard_size=2, wave_size=2, backend_options=FAKE_OPTIONS,
                                    show_progress=False)
    finally:
        c.close(), d.close()
    assert report.cached == committed and report.done == n - committed and report.failed == 0
    sent = Counter(t for s in (c, d) for (t, stage), k in s.requests.items()
                   if stage == "triples" for _ in range(k))
    assert sum(sent.values()) == n - committed and set(sent.values()) == {1}
    local = FaultServer()
    try:
        extract_openie(docs, backend(local.url), tmp_path / "local.json", show_progress=False)
    finally:
        local.close()
    assert json.loads(out.read_text()) == json.loads((tmp_path / "local.json").read_text())
