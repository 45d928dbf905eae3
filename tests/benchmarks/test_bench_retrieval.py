"""Smoke test of benchmarks/bench_retrieval.py on the bundled sample index (a few seconds)."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from hippo_gpu.evaluate import evaluate_mode


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("igraph", reason="the upstream-style baseline needs python-igraph")
    return importlib.import_module("benchmarks.bench_retrieval")


def test_paraphrase_is_deterministic_and_variant_major(bench):
    qs = ["Who wrote Hamlet?", "Where is Skerrow?"]
    out = bench.paraphrase(qs, 10)
    assert out == bench.paraphrase(qs, 10)
    assert len(out) == 20 and out[:2] == qs  # variant 0 is the question itself
    assert len(set(out[0::2])) == 10  # ten distinct variants of the first question
    assert out[0::2][5] == "Who wrote Hamlet"  # the "drop the final ?" variant
    with pytest.raises(ValueError):
        bench.paraphrase(qs, 11)


@pytest.mark.slow  # the whole benchmark script on the sample
def test_benchmark_runs_on_sample(bench, sample_index, sample_searcher, tmp_path):
    from hippo_gpu.data import read_questions
    from hippo_gpu.sample import paths, sample_dir

    threadpoolctl = pytest.importorskip("threadpoolctl")
    results = tmp_path / "bench.jsonl"
    args = bench._parse([
        "--threads", "1", "--index-dir", str(tmp_path / "unused"),
        "--data-dir", str(sample_dir()), "--variants", "2", "--batch-sizes", "1",
        "--repeats", "1", "--max-seconds", "0.1", "--min-agreement", "0",
        "--results", str(results), "--allow-dirty",
    ])
    threads = torch.get_num_threads()
    try:  # main() sets torch and BLAS threads for the process: restore them afterwards
        with threadpoolctl.threadpool_limits(limits=None):
            record = bench.main(args, index=sample_index)
    finally:
        torch.set_num_threads(threads)

    lines = results.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["rows"] == record["rows"]
    q0 = record["Q0"]
    assert q0 == 4 and record["Q"] == 8
    # provenance: batch sizes named apart, the query encoder's own batch (not the passage one)
    assert record["provenance"] == 1 and record["threads"] == 1 and record["device"] == "cpu"
    assert record["precision"] == "float32"
    assert record["query_precision"] == sample_index.config.encoder.precision
    assert record["batch_sizes"] == {
        "query_batch": [1, 4],
        "encoder_query_batch_size": sample_index.config.encoder.query_batch_size,
        "encoder_batch_size": sample_index.config.encoder.batch_size,
    }
    assert record["dirty"] in (True, False, None) and "commit" in record
    rows = record["rows"]
    base, base_q1 = rows[:2]
    assert (base["pipeline"], base_q1["pipeline"]) == ("upstream", "upstream-q1")
    assert base["Q"] == base_q1["Q"] == q0
    ours = [r for r in rows if r["pipeline"] == "hippo_gpu"]
    shapes = {(r["mode"], r["Q"], r["query_batch"]) for r in ours}
    assert shapes == {(m, q, b) for m in ("hipporag2", "dense", "hybrid")
                      for q, b in ((4, 1), (4, 4), (8, 8))}
    for r in ours:
        assert r["ms_per_query"] > 0
        assert r["speedup_vs_baseline"] > 0 and r["speedup_vs_baseline_q1"] > 0
        assert r["stage_ms_per_query"]["encode"] > 0
        assert (r["precision"], r["query_precision"]) == ("float32", record["query_precision"])
    # the baseline is a faithful HippoRAG 2: same top-10 as our parity mode on every question
    assert record["agreement"]["top10_set"] == 1.0
    # recall is batch-size independent and equals the evaluation harness's figures
    questions = read_questions(paths()["questions"])
    want = {m: evaluate_mode(sample_searcher, questions, m).recall
            for m in ("hipporag2", "dense", "hybrid")}
    for r in ours:
        assert r["recall"] == {k: want[r["mode"]][k] for k in ("2", "5")}, r
    for b in (base, base_q1):
        assert b["recall"] == {k: want["hipporag2"][k] for k in ("2", "5")}
