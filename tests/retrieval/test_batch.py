"""`hippo-gpu retrieve` / hippo_gpu.retrieval.batch: same answers as Searcher.retrieve, input order,
every id exactly once after a crash and a rerun, malformed rows named or recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hippo_gpu.cli import app
from hippo_gpu.data import DataFormatError
from hippo_gpu.retrieval.batch import retrieve_file
from tests.helpers import QUERIES

ROOT = Path(__file__).resolve().parents[2]


def _rows(n: int) -> list[dict]:
    qs = QUERIES + ["lighthouse", "Alzheimer", "Who designed it?", "tidal clock river"]
    return [{"id": i if i % 3 else f"q{i}", "query": qs[i % len(qs)]} for i in range(n)]


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_answers_equal_searcher_in_input_order(sample_searcher, tmp_path):
    rows = _rows(53)
    out = tmp_path / "out.jsonl"
    report = retrieve_file(sample_searcher, _write_jsonl(tmp_path / "q.jsonl", rows), out,
                           top_k=5, batch_size=7, part_size=10, show_progress=False)
    assert (report.rows, report.answered, report.parts) == (53, 53, 6)
    got = [json.loads(line) for line in out.read_text().splitlines()]
    want = sample_searcher.retrieve([r["query"] for r in rows], top_k=5)
    assert [g["id"] for g in got] == [r["id"] for r in rows]
    for g, hits in zip(got, want):
        assert g["keys"] == [h.key for h in hits]
        assert g["titles"] == [h.title for h in hits]
        assert g["scores"] == pytest.approx([h.score for h in hits], abs=1e-6)
    assert not (tmp_path / "out.jsonl.parts").exists()


def test_malformed_rows_are_named_or_recorded(sample_searcher, tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": 1, "query": "lighthouse"}\n{"id": 2}\nnot json\n'
                 '{"id": 3, "query": "Alzheimer", "entities": ["Alzheimer"]}\n')
    with pytest.raises(DataFormatError, match=r"q\.jsonl:2: 'query'"):
        retrieve_file(sample_searcher, q, tmp_path / "a.jsonl", show_progress=False)
    report = retrieve_file(sample_searcher, q, tmp_path / "b.jsonl", skip_bad=True,
                           mode="hybrid", show_progress=False)
    assert (report.answered, report.bad) == (2, 2)
    bad = [json.loads(line) for line in Path(report.bad_file).read_text().splitlines()]
    assert [b["row"] for b in bad] == [1, 2] and "not JSON" in bad[1]["error"]
    assert [json.loads(x)["id"] for x in (tmp_path / "b.jsonl").read_text().splitlines()] == [1, 3]


def test_parts_of_another_run_are_refused(sample_searcher, tmp_path):
    q = _write_jsonl(tmp_path / "q.jsonl", _rows(5))
    parts = tmp_path / "o.jsonl.parts"
    parts.mkdir()
    (parts / "run.json").write_text(json.dumps({"mode": "dense"}))
    with pytest.raises(DataFormatError, match="another run"):
        retrieve_file(sample_searcher, q, tmp_path / "o.jsonl", show_progress=False)


def test_killed_run_resumes_with_every_id_once(sample_hash_index_dir, sample_hash_searcher,
                                               tmp_path):
    # the hash:64 index: the child starts without importing sentence-transformers (~5 s)
    rows = _rows(400)
    q = _write_jsonl(tmp_path / "q.jsonl", rows)
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "hippo_gpu.cli", "retrieve", "--index", str(sample_hash_index_dir),
           "--queries", str(q), "--out", str(out), "--top-k", "3", "--batch-size", "4",
           "--part-size", "20", "--device", "cpu", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    parts = tmp_path / "out.jsonl.parts"
    deadline = time.monotonic() + 180
    while not (parts.exists() and len(list(parts.glob("part-*.jsonl"))) >= 2):
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "no part committed in 180 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    done_before = len(list(parts.glob("part-*.jsonl")))
    assert not out.exists() and done_before < 20
    res = CliRunner().invoke(app, cmd[3:])
    assert res.exit_code == 0, res.output
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["id"] for g in got] == [r["id"] for r in rows]  # every id once, in order
    want = sample_hash_searcher.retrieve([r["query"] for r in rows], top_k=3)
    assert [g["keys"] for g in got] == [[h.key for h in hits] for hits in want]
    assert f"{done_before * 20} from committed parts" in res.output.replace("\n", " ")


def test_parquet_round_trip(sample_searcher, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = _rows(12)
    q = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "id": str(r["id"])} for r in rows]), q)
    retrieve_file(sample_searcher, q, tmp_path / "o.parquet", top_k=4, show_progress=False)
    got = pq.read_table(tmp_path / "o.parquet").to_pylist()
    want = sample_searcher.retrieve([r["query"] for r in rows], top_k=4)
    assert [g["id"] for g in got] == [str(r["id"]) for r in rows]
    assert [g["keys"] for g in got] == [[h.key for h in hits] for hits in want]


def test_failed_queries_go_to_the_side_file(sample_index, tmp_path):
    """A query whose PPR cannot converge (capped at 2 steps) is recorded in OUT.bad.jsonl with
    its reason, not written as an answer; a resumed run reports the same."""
    from hippo_gpu import Searcher
    from hippo_gpu.config import RetrievalConfig

    capped = Searcher(sample_index, RetrievalConfig(ppr_max_iter=2))
    q = tmp_path / "q.jsonl"
    q.write_text('{"id": 1, "query": "lighthouse"}\n{"id": 2}\n{"id": 3, "query": "clock"}\n')
    out = tmp_path / "a.jsonl"
    report = retrieve_file(capped, q, out, skip_bad=True, part_size=1, show_progress=False)
    assert (report.rows, report.answered, report.bad, report.failed) == (3, 0, 1, 2)
    assert out.read_text() == ""
    bad = [json.loads(line) for line in Path(report.bad_file).read_text().splitlines()]
    assert [b["row"] for b in bad] == [1, 0, 2]  # the malformed row, then the failed ones
    assert [b.get("id") for b in bad[1:]] == [1, 3]
    assert all("did not converge" in b["error"] for b in bad[1:])
    dense = retrieve_file(capped, q, tmp_path / "d.jsonl", mode="dense", skip_bad=True,
                          show_progress=False)
    assert (dense.answered, dense.failed) == (2, 0)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_explain_columns_sum_to_each_score(sample_searcher, tmp_path, fmt):
    # `retrieve --explain`: the decomposition beside keys; a hit's score is the sum of its
    # seed terms (aligned with "seeds"), its dense term and its offset, within its bound
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    rows = [{"id": i, "query": q, "entities": [["Marta Quill"], [], ["Skerrow"]][i]}
            for i, q in enumerate(QUERIES)]
    q = _write_jsonl(tmp_path / "q.jsonl", rows)
    out = tmp_path / f"o.{fmt}"
    res = CliRunner().invoke(app, ["retrieve", "--index", "unused", "--queries", str(q),
                                   "--out", str(out), "--explain", "--ray", "local"])
    assert res.exit_code != 0 and "--explain runs locally" in res.output
    for mode in ("hybrid", "hipporag1"):
        retrieve_file(sample_searcher, q, out, top_k=4, mode=mode, show_progress=False,
                      explain=True)
        if fmt == "jsonl":
            got = [json.loads(line) for line in out.read_text().splitlines()]
        else:
            import pyarrow.parquet as pq

            got = pq.read_table(out).to_pylist()
        want = sample_searcher.retrieve([r["query"] for r in rows], top_k=4, mode=mode,
                                        query_entities=[r["entities"] for r in rows])
        for g, hits in zip(got, want, strict=True):
            assert g["keys"] == [h.key for h in hits]
            assert len(g["contributions"]) == len(hits)
            for i in range(len(hits)):
                assert len(g["contributions"][i]) == len(g["seeds"])
                total = sum(g["contributions"][i]) + (g["dense"][i] or 0.0) + g["offset"][i]
                assert abs(total - g["value"][i]) <= g["bound"][i]
            if mode == "hybrid":
                assert g["value"] != g["scores"] and len(g["fused_ranks"]) == len(hits)
            else:
                assert g["value"] == g["scores"] and g["fused_ranks"] is None
    # the run's identity holds the flag: a resumed run cannot mix explained and plain parts
    parts = tmp_path / f"o.{fmt}.parts"
    parts.mkdir()
    (parts / "run.json").write_text(json.dumps({"identity": {"explain": True}}))
    with pytest.raises(DataFormatError, match="explain"):
        retrieve_file(sample_searcher, q, out, top_k=4, show_progress=False)
