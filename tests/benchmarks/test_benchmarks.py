"""The benchmarks' honesty rules: a check that cannot run says SKIP and exits non-zero, and a
results line from a dirty tree is refused unless --allow-dirty (then it is marked dirty)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import REPO  # noqa: E402

BENCH = REPO / "benchmarks"
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


@pytest.fixture(scope="module")
def provenance():
    return importlib.import_module("benchmarks.provenance")


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


@no_cuda
def test_synonym_floor_on_cuda_skips_without_cuda(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_synonym_floor", "--device", "cuda",
         "--phrases", "1000", "--allow-dirty", "--results", str(tmp_path / "r.jsonl")],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "SKIP: " in out.stdout and "CUDA" in out.stdout and "PASS" not in out.stdout
    assert not (tmp_path / "r.jsonl").exists()


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com",
                    "-c", "commit.gpgsign=false", *args], cwd=repo, check=True,
                   capture_output=True, timeout=30)


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    root = tmp_path / "repo"
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "code.py").write_text("x = 1\n")
    (root / "benchmarks" / "results" / "b.jsonl").write_text("")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "init")
    return root


def test_clean_tree_is_recorded_clean(provenance, repo):
    # appending to a results file does not make the next run dirty
    (repo / "benchmarks" / "results" / "b.jsonl").write_text("{}\n")
    (repo / "benchmarks" / "results" / "new.jsonl").write_text("{}\n")
    state = provenance.check_clean(False, repo)
    assert state["dirty"] is False and state["dirty_files"] == 0 and len(state["commit"]) == 40
    record = provenance.provenance("t", threads=1, device="cpu", encoder_backend=None,
                                   git=state, repo=repo,
                                   batch_sizes={"query_batch": [1, 32]})
    provenance.append_result(repo / "benchmarks" / "results" / "t.jsonl", record,
                             allow_dirty=False, repo=repo)
    line = json.loads((repo / "benchmarks" / "results" / "t.jsonl").read_text())
    assert line["dirty"] is False and line["batch_sizes"] == {"query_batch": [1, 32]}
    assert line["commit"] == state["commit"] and "commit_at_write" not in line


def test_dirty_tree_is_refused_without_allow_dirty(provenance, repo):
    (repo / "code.py").write_text("x = 2\n")  # a modified file
    (repo / "new_module.py").write_text("")  # an untracked file counts too: it may be code
    with pytest.raises(provenance.DirtyTreeError, match="2 uncommitted"):
        provenance.check_clean(False, repo)
    out = repo / "benchmarks" / "results" / "r.jsonl"
    record = provenance.provenance("t", threads=1, device="cpu", encoder_backend=None, repo=repo)
    with pytest.raises(provenance.DirtyTreeError, match="--allow-dirty"):
        provenance.append_result(out, record, allow_dirty=False, repo=repo)
    assert not out.exists()
    provenance.append_result(out, record, allow_dirty=True, repo=repo)
    line = json.loads(out.read_text())
    assert line["dirty"] is True and line["dirty_files"] == 2
    assert sorted(line["dirty_paths"]) == ["code.py", "new_module.py"]


def test_dirty_at_start_stays_dirty_when_clean_at_write(provenance, repo):
    (repo / "code.py").write_text("x = 2\n")
    state = provenance.check_clean(True, repo)
    record = provenance.provenance("t", threads=1, device="cpu", encoder_backend=None,
                                   git=state, repo=repo)
    (repo / "code.py").write_text("x = 1\n")  # reverted during the run
    out = repo / "benchmarks" / "results" / "r.jsonl"
    provenance.append_result(out, record, allow_dirty=True, repo=repo)
    assert json.loads(out.read_text())["dirty"] is True


def test_unknown_git_state_is_refused(provenance, tmp_path):
    state = provenance.git_state(tmp_path)  # not a checkout
    assert state == {"commit": None, "dirty": None, "dirty_files": None, "dirty_paths": None}
    with pytest.raises(provenance.DirtyTreeError, match="unknown"):
        provenance.check_clean(False, tmp_path)
    out = tmp_path / "r.jsonl"
    provenance.append_result(out, {"x": 1}, allow_dirty=True, repo=tmp_path)
    assert json.loads(out.read_text())["dirty"] is None  # unknown, never recorded as clean


def test_provenance_fields(provenance, repo):
    record = provenance.provenance(
        "t", threads=2, device="cpu", encoder_backend="onnx", precision=["float32", "bfloat16"],
        query_precision="bfloat16", batch_sizes={"encoder_query_batch_size": 16}, repo=repo,
        optional_versions=("numpy", "no_such_module_xyz"))
    want = {"provenance", "bench", "time", "commit", "dirty", "dirty_files", "dirty_paths",
            "hardware", "threads", "torch_threads", "device", "encoder_backend", "precision",
            "query_precision", "batch_sizes", "versions", "loadavg", "argv"}
    assert set(record) == want
    assert record["precision"] == ["float32", "bfloat16"]
    assert record["query_precision"] == "bfloat16" and record["threads"] == 2
    assert record["encoder_backend"] == "onnx"
    assert record["hardware"]["cpu"] and record["hardware"]["gpu"] is None
    v = record["versions"]
    assert v["torch"] == torch.__version__ and v["no_such_module_xyz"] is None
    assert {"python", "numpy"} <= set(v)
    json.dumps(record)  # serialisable as is


def test_hipporag2_floor_without_an_index_skips(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_hipporag2_floor", "--threads", "1",
         "--index", str(tmp_path / "none"), "--allow-dirty",
         "--results", str(tmp_path / "r.jsonl")],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout.startswith("SKIP: no index at ") and "bench_scale" in out.stdout
    assert not (tmp_path / "r.jsonl").exists()


# modules the scripts import (continual_synthetic: bench_continual --synthetic's procedure;
# soak: the writable server and clients of bench_soak, bench_writable and tests/serve/test_soak;
# upstream_hipporag: the official package's run of bench_official_hipporag2)
LIBRARIES = ("__init__", "common", "provenance", "timing", "continual_synthetic", "soak",
             "upstream_hipporag")
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem not in LIBRARIES)


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_runs_as_a_module(name, tmp_path):
    # `python -m benchmarks.NAME` from anywhere with the checkout on PYTHONPATH: no script edits
    # sys.path, and --help exits before any measurement
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"],
                         capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("usage:")


def test_missing_data_is_a_skip(tmp_path, capsys):
    common = importlib.import_module("benchmarks.common")
    (tmp_path / "musique_train").mkdir()
    (tmp_path / "musique_train" / "questions.json").write_text("[]")
    assert common.musique_dir(root=tmp_path, need=("questions.json",)) == \
        tmp_path / "musique_train"
    with pytest.raises(SystemExit) as e:
        common.musique_dir(root=tmp_path, need=("questions.json", "openie*.json"))
    assert e.value.code == common.SKIP != 0
    assert capsys.readouterr().out.startswith("SKIP: musique_train data not found: no openie")


def test_init_threads_refuses_once_torch_is_loaded(monkeypatch):
    common = importlib.import_module("benchmarks.common")
    for var in common.THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="before"):
        common.init_threads(1)  # torch is imported here: the variables would come too late
    assert not any(var in os.environ for var in common.THREAD_VARS)


def test_summarize_is_the_median_and_linear_quantiles():
    timing = importlib.import_module("benchmarks.timing")
    samples = [0.5, 0.1, 0.4, 0.2, 0.3, 0.9]
    t = timing.summarize(7.0, samples)
    assert (t.first, t.runs) == (7.0, 6)
    assert t.median == pytest.approx(np.median(samples))
    assert (t.p20, t.p80) == pytest.approx(tuple(np.quantile(samples, [0.2, 0.8])))
    calls = []
    t = timing.time_call(lambda: calls.append(1), warmup=2, repeats=3)
    assert len(calls) == 1 + 2 + 3 and t.runs == 3  # first + warm-up + recorded


def test_checksum_bench_records_both_ways_and_skips_an_empty_dir(tmp_path):
    d = tmp_path / "index"
    (d / "v000001").mkdir(parents=True)
    for i in range(3):
        (d / "v000001" / f"f{i}.bin").write_bytes(os.urandom(1 << 16) * (i + 1))
    args = [sys.executable, "-m", "benchmarks.bench_checksums", "--allow-dirty",
            "--results", str(tmp_path / "r.jsonl")]
    out = subprocess.run(args + ["--index", str(d)], capture_output=True, text=True,
                         timeout=120, env=_env(), cwd=REPO)
    assert out.returncode == 0, out.stdout + out.stderr
    row = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[-1])
    assert row["files"] == 3 and row["bytes"] == 6 << 16 and row["sha256_files_s"] >= 0
    empty = subprocess.run(args + ["--index", str(tmp_path / "none")], capture_output=True,
                           text=True, timeout=120, env=_env(), cwd=REPO)
    assert empty.returncode == 2 and empty.stdout.startswith("SKIP: ")
