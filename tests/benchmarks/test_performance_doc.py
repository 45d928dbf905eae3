"""docs/performance.md and the README's table are what the results lines give (CI runs --check
too), and the generator names every row's results line."""

from __future__ import annotations

import json

from benchmarks import performance_doc as pd


def test_committed_pages_are_current() -> None:
    assert pd.main(["--check"]) == 0, "run python -m benchmarks.performance_doc"


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
