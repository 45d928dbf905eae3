"""benchmarks/bench_official_hipporag2.py without the official package: its arguments, its SKIPs,
how it names the package it finds, and the pieces it swaps in (fast, no network)."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from benchmarks import upstream_hipporag as uh
from benchmarks.common import SKIP


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.bench_official_hipporag2")


def _fake_package(root, version: str | None = "2.0.0a4", body: str = "x = 1\n"):
    (root / "hipporag").mkdir(parents=True)
    (root / "hipporag" / "HippoRAG.py").write_text(body)
    (root / "hipporag" / "__init__.py").write_text("")
    if version:
        info = root / f"hipporag-{version}.dist-info"
        info.mkdir()
        info.joinpath("METADATA").write_text(f"Name: hipporag\nVersion: {version}\n")
    return root


def _fake_data(folder):
    folder.mkdir()
    for name in ("corpus.json", "questions.json", "openie_test.json"):
        (folder / name).write_text("[]")
    return folder


def test_defaults_and_the_upstream_option(bench) -> None:
    args = bench._parse([])
    assert (args.upstream, args.threads, args.top_k, args.work_dir) == (None, 1, 200, None)
    args = bench._parse(["--upstream", "/somewhere", "--upstream-source", "x@1", "--repeats",
                         "2", "--allow-dirty"])
    assert (args.upstream, args.upstream_source, args.repeats, args.allow_dirty) == \
        ("/somewhere", "x@1", 2, True)


@pytest.mark.parametrize("upstream", [None, "missing"])
def test_skips_without_the_package(bench, tmp_path, capsys, upstream) -> None:
    data = _fake_data(tmp_path / "musique_train")
    argv = ["--data-dir", str(data), "--allow-dirty", "--results", str(tmp_path / "r.jsonl")]
    if upstream:
        argv += ["--upstream", str(tmp_path / upstream)]
    with pytest.raises(SystemExit) as exit_:
        bench.main(bench._parse(argv))
    assert exit_.value.code == SKIP
    out = capsys.readouterr().out
    assert out.startswith("SKIP: ") and ("--upstream" in out or "hipporag/HippoRAG.py" in out)
    assert not (tmp_path / "r.jsonl").exists() and "hipporag" not in sys.modules


def test_skips_without_the_data(bench, tmp_path, capsys) -> None:
    package = _fake_package(tmp_path / "pkg")
    argv = ["--data-dir", str(tmp_path / "nothing"), "--upstream", str(package),
            "--allow-dirty"]
    with pytest.raises(SystemExit) as exit_:
        bench.main(bench._parse(argv))
    assert exit_.value.code == SKIP and "musique_train data not found" in capsys.readouterr().out


def test_locate_names_the_code_not_the_path(tmp_path) -> None:
    a = uh.locate(_fake_package(tmp_path / "a"))
    b = uh.locate(_fake_package(tmp_path / "b" / "deeper"))
    assert a.source == "hipporag 2.0.0a4 from PyPI" and a.version == "2.0.0a4"
    assert a.content_id == b.content_id and a.files == 2
    changed = uh.locate(_fake_package(tmp_path / "c", body="x = 2\n"))
    assert changed.content_id != a.content_id
    assert "root" not in a.describe() and str(tmp_path) not in str(a.describe())
    tree = tmp_path / "tree"
    _fake_package(tree / "src", version=None)
    (tree / "setup.py").write_text('setup(\n    version="2.0.0-alpha.4",\n)\n')
    found = uh.locate(tree, source="OSU-NLP-Group/HippoRAG@c617143")
    assert found.root == tree / "src" and found.version == "2.0.0-alpha.4"
    assert found.source == "OSU-NLP-Group/HippoRAG@c617143"
    with pytest.raises(uh.UpstreamNotFound):
        uh.locate(tmp_path / "none")


def test_keep_all_filter_and_no_llm() -> None:
    facts = [("a", "r", "b"), ("c", "r", "d"), ("e", "r", "f")]
    assert uh.KeepAllFilter()("q", facts, [7, 3, 9], 2) == ([7, 3], facts[:2],
                                                              {"confidence": None})
    with pytest.raises(RuntimeError, match="stubbed"):
        uh.NoLLM().infer([])


def test_stub_modules_import_and_refuse_use() -> None:
    finder = uh._StubFinder(["not_a_real_module_xyz"])
    sys.meta_path.insert(0, finder)
    try:
        from not_a_real_module_xyz.sub import Thing  # type: ignore[import-not-found]
    finally:
        sys.meta_path.remove(finder)
        for name in [n for n in sys.modules if n.startswith("not_a_real_module_xyz")]:
            del sys.modules[name]
    with pytest.raises(RuntimeError, match="is a stub"):
        Thing()
    assert uh.missing_roots(["numpy", "not_a_real_module_xyz"]) == ["not_a_real_module_xyz"]


def test_agreement_counts_ties_apart(bench) -> None:
    keys = [f"p{i}" for i in range(12)]
    scores = np.array([1.0, 0.9, 0.8, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05])
    official = [(keys, scores)] * 3
    tie_swap = keys[:2] + [keys[3], keys[2]] + keys[4:10]
    real = keys[:9] + [keys[11]]
    out = bench.agreement([keys, tie_swap, real], official)
    assert (out["same_order"], out["same_set"], out["differ_beyond_ties"]) == (1, 2, 1)
    assert [d["beyond_ties"] for d in out["disagreements"]] == [[], [9]]


def test_readme_quotes_the_official_line_and_names_the_reimplementation() -> None:
    from benchmarks import performance_doc as pd

    base = {"commit": "0123456789abcdef", "dirty": False, "time": "2026-12-06T00:00:00",
            "threads": 1, "device": "cpu", "encoder_backend": "torch"}
    official = {**base, "rows": [
        {"label": "official HippoRAG 2 (hipporag 2.0.0a4 from PyPI, LLM filter stubbed off), "
                  "one question per retrieve(), 1 thread", "pipeline": "official",
         "query_batch": 1, "ms_per_query": 80.0, "recall": {"2": 44.25, "5": 67.75}},
        {"label": "hippo_gpu hipporag2 (Searcher.rank, batch 1), 1 thread",
         "pipeline": "hippo_gpu", "query_batch": 1, "ms_per_query": 30.0,
         "recall": {"2": 43.75, "5": 67.25}}]}
    retrieval = {**base, "rows": [
        {"pipeline": "upstream", "mode": "hipporag2", "query_batch": 1, "ms_per_query": 37.5,
         "recall": {"2": 43.75, "5": 67.25}},
        {"pipeline": "hippo_gpu", "mode": "hipporag2", "query_batch": 1, "ms_per_query": 29.0,
         "recall": {"2": 43.75, "5": 67.25}},
        {"pipeline": "hippo_gpu", "mode": "dense", "batch": 100, "ms_per_query": 7.0,
         "recall": {"2": 47.17, "5": 62.17}}]}
    lines = {"bench_official_hipporag2.jsonl": [
                 pd.Line("bench_official_hipporag2.jsonl", 1, official)],
             "bench_retrieval.jsonl": [pd.Line("bench_retrieval.jsonl", 1, retrieval)]}
    rows = [r for r in pd.readme_table(lines).splitlines() if r.startswith("| musique")]
    assert [r.split(" | ")[0] for r in rows] == [
        "| musique_train (1,890 passages): official HippoRAG 2 (hipporag 2.0.0a4 from PyPI, LLM "
        "filter stubbed off), one question per retrieve(), 1 thread",
        "| musique_train (1,890 passages): hippo_gpu hipporag2 (Searcher.rank, batch 1), 1 thread",
        "| musique_train (1,890 passages): upstream's algorithm re-implemented here (per query)",
        "| musique_train (1,890 passages): hippo_gpu dense, batch 100"]
    assert all("official HippoRAG 2 code" not in r for r in rows)
