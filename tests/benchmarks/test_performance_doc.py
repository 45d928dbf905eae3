"""docs/performance.md and the README's table are what the results lines give, the generator
names every row's results line, and a quoted line that is stale, dirty or unlabelled is rejected
(CI runs ``python -m benchmarks.performance_doc --check``, which does both on the real history;
here the quote checks run on small git repositories made for each test)."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks import performance_doc as pd

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def test_committed_pages_are_current() -> None:
    # the pages only: whether the quoted lines still measure HEAD's code is --check's (CI)
    lines = pd.read_lines()
    readme = pd.updated_readme(pd.README.read_text(encoding="utf-8"), pd.readme_table(lines))
    assert pd.stale_pages(pd.performance_doc(lines), readme) == [], \
        "run python -m benchmarks.performance_doc"


def test_every_row_names_its_results_line(tmp_path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    base = {"commit": "0123456789abcdef", "dirty": False, "time": "2026-12-05T00:00:00",
            "hardware": {"cpu": "Test CPU"}, "threads": 1, "device": "cpu"}
    lines = [
        {**base, "argv": ["b.py", "--n", "1", "--work", "/tmp/x"], "rows": [{"a": 1.5}, {"a": 2}]},
        {**base, "argv": ["b.py", "--n", "1", "--work", "/tmp/y"], "rows": [{"a": 3.25}]},
        {**base, "argv": ["b.py", "--n", "2"], "dirty": True, "seconds": 0.5, "nested": {"k": 4}},
    ]
    (results / "bench_x.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    doc = pd.performance_doc(pd.read_lines(results))
    table_rows = [ln for ln in doc.splitlines() if ln.startswith("| bench_x")]
    # the two --n 1 lines are one configuration (paths dropped): only its newest (line 2) shows
    assert [r.split(" | ")[0] for r in table_rows] == [
        "| bench_x.jsonl:3 (0123456 dirty)", "| bench_x.jsonl:2 (0123456)"]
    assert "| 3.25 |" in table_rows[1] and "| 1.5 |" not in doc
    assert "| 0.5 | 4 |" in table_rows[0]  # scalars and one nested level, flattened


def test_a_line_that_is_not_json_is_named(tmp_path) -> None:
    (tmp_path / "bench_y.jsonl").write_text('{"a": 1}\n{oops\n')
    try:
        pd.read_lines(tmp_path)
    except ValueError as e:
        assert str(e) == "bench_y.jsonl:2 is not JSON"
    else:
        raise AssertionError("no error")


# ---- every benchmark says what it measures and how its encoder ran ------------------------


def _provenance_calls(path: Path) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "provenance"]


def test_every_results_file_has_a_script_that_declares_what_it_measures() -> None:
    for name in sorted(pd.read_lines()):
        script = pd.script_path(name)
        assert script is not None, f"no benchmark script writes {name}"
        paths = pd.measured_paths(script)
        assert paths, f"benchmarks/{script.name} declares no MEASURES"
        missing = [x for x in paths if not (pd.REPO / x).exists()]
        assert not missing, f"benchmarks/{script.name}: MEASURES names missing {missing}"


def test_every_results_line_written_from_now_on_says_its_encoder_backend() -> None:
    scripts = sorted((pd.REPO / "benchmarks").glob("*.py"))
    calls = {p.name: _provenance_calls(p) for p in scripts if p.name != "provenance.py"}
    assert sum(len(c) for c in calls.values()) >= 25  # the walk found the scripts' calls
    for name, found in calls.items():
        for call in found:
            assert "encoder_backend" in {k.arg for k in call.keywords}, \
                f"{name}:{call.lineno}: provenance(...) without encoder_backend"


# ---- the quote check, on a small repository -----------------------------------------------


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "-c", "commit.gpgsign=false", *args], cwd=root, check=True,
                          capture_output=True, text=True, timeout=30).stdout.strip()


def _commit(root: Path, path: str, text: str) -> str:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)
    _git(root, "add", path)
    _git(root, "commit", "-q", "-m", f"change {path}")
    return _git(root, "rev-parse", "HEAD")


LABELLED = {"dirty": False, "time": "2026-12-05T00:00:00", "hardware": {"cpu": "Test CPU"},
            "threads": 1, "device": "cpu", "encoder_backend": "torch", "argv": ["b.py"]}


def _results(root: Path, name: str, records: list[dict[str, Any]]) -> dict[str, list[pd.Line]]:
    results = root / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    return pd.read_lines(results)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with a benchmark that measures hippo_gpu/ppr (and not hippo_gpu/serve)."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    _commit(root, "hippo_gpu/serve/app.py", "x = 1\n")
    _commit(root, "benchmarks/bench_x.py",
            '"""A benchmark."""\n\nMEASURES = ("hippo_gpu/ppr",)\n')
    _commit(root, "benchmarks/bench_bare.py", '"""Declares nothing."""\n')
    _commit(root, "hippo_gpu/ppr/solver.py", "y = 1\n")
    return root


def _check(root: Path, lines: dict[str, list[pd.Line]], text: str) -> list[str]:
    return pd.check_quotes(lines, {"README.md": text}, pd.History(root), root)


def test_a_current_clean_labelled_quote_passes(repo: Path) -> None:
    lines = _results(repo, "bench_x.jsonl",
                     [{**LABELLED, "commit": _git(repo, "rev-parse", "HEAD")}])
    _commit(repo, "hippo_gpu/serve/app.py", "x = 2\n")  # not measured: still current
    assert _check(repo, lines, "see bench_x.jsonl:1") == []


def test_a_stale_quote_is_rejected(repo: Path) -> None:
    lines = _results(repo, "bench_x.jsonl",
                     [{**LABELLED, "commit": _git(repo, "rev-parse", "HEAD")}])
    _commit(repo, "hippo_gpu/ppr/solver.py", "y = 2\n")
    _commit(repo, "hippo_gpu/ppr/basis.py", "z = 1\n")
    assert _check(repo, lines, "| 1 ms | bench_x.jsonl:1 |") == [
        "bench_x.jsonl:1 (cited at README.md:1): stale: 2 commits to hippo_gpu/ppr since its "
        f"commit {lines['bench_x.jsonl'][0].record['commit'][:7]}"]


def test_a_quote_from_another_history_or_without_measures_is_stale(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    lines = _results(repo, "bench_x.jsonl", [{**LABELLED, "commit": "f" * 40}])
    lines |= _results(repo, "bench_bare.jsonl", [{**LABELLED, "commit": head}])
    assert _check(repo, lines, "bench_x.jsonl:1, bench_bare.jsonl:1, bench_x.jsonl:9") == [
        "bench_x.jsonl:1 (cited at README.md:1): stale: its commit fffffff is not in HEAD's "
        "history",
        "bench_bare.jsonl:1 (cited at README.md:1): stale: benchmarks/bench_bare.py declares "
        "no MEASURES (the paths its figures depend on)",
        "bench_x.jsonl:9 (cited at README.md:1): no such results line"]


def test_a_dirty_quote_is_rejected(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    lines = _results(repo, "bench_x.jsonl", [{**LABELLED, "commit": head, "dirty": True},
                                             {**LABELLED, "commit": head, "dirty": None}])
    assert _check(repo, lines, "bench_x.jsonl:1\nbench_x.jsonl:2") == [
        "bench_x.jsonl:1 (cited at README.md:1): dirty: written from a tree with uncommitted "
        "changes",
        "bench_x.jsonl:2 (cited at README.md:2): dirty: its tree state is unknown"]


def test_an_unlabelled_quote_is_rejected(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD")
    old = {k: v for k, v in LABELLED.items() if k != "encoder_backend"}
    lines = _results(repo, "bench_x.jsonl", [
        {**old, "commit": head},  # written before lines said their encoder backend
        {**LABELLED, "commit": head, "threads": None, "device": ""},
        {**LABELLED, "commit": head, "encoder_backend": None}])  # no text encoded: labelled
    assert _check(repo, lines, "bench_x.jsonl:1 bench_x.jsonl:2 bench_x.jsonl:3") == [
        "bench_x.jsonl:1 (cited at README.md:1): unlabelled: it does not say its encoder "
        "backend",
        "bench_x.jsonl:2 (cited at README.md:1): unlabelled: it does not say its threads, "
        "device"]


def test_the_check_needs_the_history(repo: Path, tmp_path: Path) -> None:
    shallow = tmp_path / "shallow"
    _git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    with pytest.raises(pd.GitHistoryError, match="shallow clone"):
        pd.History(shallow)
    (tmp_path / "plain").mkdir()
    with pytest.raises(pd.GitHistoryError, match="no git history"):
        pd.History(tmp_path / "plain")


def test_the_page_marks_stale_rows_and_its_check_ignores_the_marks(repo: Path) -> None:
    lines = _results(repo, "bench_x.jsonl",
                     [{**LABELLED, "commit": _git(repo, "rev-parse", "HEAD"), "ms": 1.5}])
    fresh = pd.performance_doc(lines, pd.History(repo), repo)
    assert "| bench_x.jsonl:1 (" in fresh and "stale" not in fresh.split("## bench_x")[1]
    assert "measures: `hippo_gpu/ppr`" in fresh
    _commit(repo, "hippo_gpu/ppr/solver.py", "y = 3\n")
    marked = pd.performance_doc(lines, pd.History(repo), repo)
    assert ") · stale: 1 commit | 2026-12-05 |" in marked
    assert pd.STALE_NOTE.sub("", marked) == pd.STALE_NOTE.sub("", fresh)
