"""A full disk under the batch job's outputs: retrieve_file failed at each write (run file,
parts, the join) resumes with only the unanswered rows, and the `retrieve` command exits 2 with
one line; Parquet answers (pyarrow's own I/O) on a real small tmpfs fail cleanly and resume.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hippo_gpu import Searcher
from hippo_gpu.cli import app
from hippo_gpu.errors import DiskFullError
from hippo_gpu.retrieval import batch
from hippo_gpu.retrieval.batch import retrieve_file
from tests.storage.diskfull import FullDisk, count_writes
from tests.storage.full_disk_checks import (
    build,
    fill,
    small_tmpfs,
)

pytestmark = pytest.mark.usefixtures("one_thread")

runner = CliRunner()

QUESTIONS = ["Who designed the lighthouse on Skerrow?", "Which river flows north?",
             "Who founded the college?", "Where was the tidal clock invented?"]


@pytest.fixture(scope="module")
def searcher(sample: dict) -> Searcher:
    return Searcher(build(sample, sample["corpus"]))


def query_file(tmp_path: Path, repeat: int) -> tuple[list[dict], Path]:
    """QUESTIONS `repeat` times as a JSONL query file with ids: (rows, path)."""
    rows = [{"id": i, "query": q} for i, q in enumerate(QUESTIONS * repeat)]
    queries = tmp_path / "queries.jsonl"
    queries.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows, queries


def test_retrieve_parts_resume_after_a_full_disk_at_every_write(searcher, tmp_path):
    """retrieve_file failing at each write (run file, parts, the join): the rerun with space
    answers only the rows no committed part holds, and OUT has every id exactly once, in
    order, with the keys of an undisturbed run."""
    rows, queries = query_file(tmp_path, 3)
    kw = {"mode": "hipporag2", "top_k": 3, "batch_size": 3, "part_size": 3,
          "show_progress": False}
    clean = tmp_path / "clean" / "out.jsonl"
    ops = count_writes(clean.parent, lambda: retrieve_file(searcher, queries, clean, **kw))
    want = clean.read_text().splitlines()
    assert [json.loads(x)["id"] for x in want] == [r["id"] for r in rows]
    for k in range(1, len(ops) + 1):
        out = tmp_path / f"k{k}" / "out.jsonl"
        with FullDisk(out.parent, fail_at=k) as disk:
            try:
                retrieve_file(searcher, queries, out, **kw)
                raised = False
            except DiskFullError as e:
                raised = True
                assert str(e).startswith(f"{out}") and "no space left on device" in str(e)
        # only a failed fsync of a folder after the very last rename goes unreported
        assert raised == (k < len(ops)), (k, ops[k - 1], disk.failed)
        parts = out.with_name(out.name + ".parts")
        done = sorted(p.name for p in parts.glob("part-*.jsonl")) if parts.exists() else []
        assert not list(out.parent.rglob(".*.tmp-*"))
        if raised:
            report = retrieve_file(searcher, queries, out, **kw)
            assert report.resumed == 3 * len(done)
            assert report.answered == len(rows) - 3 * len(done)
        assert out.read_text().splitlines() == want
        assert not parts.exists()
    # the command: exit 2 with one line when the second part finds the disk full; the same
    # command again finishes the file
    index_dir = searcher.index.save(tmp_path / "index")
    out = tmp_path / "cli" / "out.jsonl"
    args = ["retrieve", "--index", str(index_dir), "--queries", str(queries), "--out", str(out),
            "--top-k", "3", "--batch-size", "3", "--part-size", "3", "--device", "cpu"]
    k = next(i for i, op in enumerate(ops, 1) if "part-000001" in op)
    with FullDisk(out.parent, fail_at=k):
        result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: {out}.parts/part-000001.jsonl: no space left on "
                                    "device"), result.output
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert out.read_text().splitlines() == want


def parquet_run(searcher: Searcher, tmp_path: Path) -> tuple[Any, list[dict], Path, dict, list]:
    """(pyarrow.parquet, the query rows, their file, retrieve_file's keywords, the rows of an
    undisturbed run's Parquet answers) for the Parquet tests (skips without pyarrow)."""
    pq = pytest.importorskip("pyarrow.parquet")
    rows, queries = query_file(tmp_path, 6)
    kw = {"mode": "hipporag2", "top_k": 5, "batch_size": 4, "part_size": 4,
          "show_progress": False}
    clean = tmp_path / "clean.parquet"
    retrieve_file(searcher, queries, clean, **kw)
    return pq, rows, queries, kw, pq.read_table(clean).to_pylist()


def test_parquet_answers_on_a_real_full_tmpfs_fail_cleanly_and_resume(searcher, tmp_path):
    """pyarrow writes Parquet through its own I/O (FullDisk cannot see it), so on a real
    256 KiB tmpfs with a filler leaving 0, 1, 2 ... pages: each run of retrieve_file to a
    .parquet OUT either finishes or raises DiskFullError naming a file under OUT's folder;
    with the space back the rerun finishes, and OUT holds every row once, as a clean run's.
    The sweep runs until a run finishes, and must have met the full disk at a part. (Whether
    it also meets it at the join depends on how the kernel charges tmpfs pages to files,
    large folios included: the next test puts the join itself on the full disk.)"""
    pq, rows, queries, kw, want = parquet_run(searcher, tmp_path)
    failed_at: list[str] = []
    with small_tmpfs(tmp_path / "mnt", 256) as mnt:
        out = mnt / "out" / "answers.parquet"
        for pages in range(64):
            shutil.rmtree(out.parent, ignore_errors=True)
            out.parent.mkdir()
            filler = fill(mnt, leave=pages * 4096)
            try:
                retrieve_file(searcher, queries, out, **kw)
                finished = True
            except DiskFullError as e:
                finished = False
                assert Path(e.path).is_relative_to(out.parent), e.path
                assert str(e).startswith(e.path) and "no space left" in str(e)
                failed_at.append(Path(e.path).name)
            filler.unlink()
            if not finished:
                retrieve_file(searcher, queries, out, **kw)
            assert pq.read_table(out).to_pylist() == want
            assert not list(out.parent.glob(".*.tmp-*"))
            if finished:
                break
    assert finished, failed_at
    assert any(n.startswith("part-") for n in failed_at), failed_at


def test_the_parquet_join_on_a_real_full_tmpfs_fails_cleanly_and_resumes(searcher, tmp_path,
                                                                           monkeypatch):
    """Every part committed on a real 256 KiB tmpfs (a run stopped just before its join), then
    a filler leaving 0, 1, 2 ... pages: the resumed run writes nothing but the Parquet join,
    so it raises DiskFullError naming OUT (at 0 pages at least) until it finishes; after a
    failure the parts are intact and, with the space back, the rerun finishes; OUT holds
    every row once, as a clean run's."""
    pq, rows, queries, kw, want = parquet_run(searcher, tmp_path)

    class StopBeforeJoin(Exception):
        pass

    def stop(*args, **kwargs):
        raise StopBeforeJoin

    failed_at: list[str] = []
    with small_tmpfs(tmp_path / "mnt", 256) as mnt:
        out = mnt / "out" / "answers.parquet"
        parts = out.with_name(out.name + ".parts")
        for pages in range(64):
            shutil.rmtree(out.parent, ignore_errors=True)
            out.parent.mkdir()
            with monkeypatch.context() as m:
                m.setattr(batch, "_join_parts", stop)
                with pytest.raises(StopBeforeJoin):
                    retrieve_file(searcher, queries, out, **kw)
            committed = sorted(p.name for p in parts.iterdir())
            filler = fill(mnt, leave=pages * 4096)
            try:
                report = retrieve_file(searcher, queries, out, **kw)
                finished = True
                assert report.resumed == len(rows) and report.answered == 0
            except DiskFullError as e:
                finished = False
                assert e.path == str(out), e.path
                assert str(e).startswith(e.path) and "no space left" in str(e)
                failed_at.append(Path(e.path).name)
                assert sorted(p.name for p in parts.iterdir()) == committed
                assert not out.exists()
            filler.unlink()
            if not finished:
                retrieve_file(searcher, queries, out, **kw)
            assert pq.read_table(out).to_pylist() == want
            assert not parts.exists() and not list(out.parent.glob(".*.tmp-*"))
            if finished:
                break
    assert finished and failed_at, failed_at
