"""`hippo-gpu query` answers one question as the searcher does; `retrieve --queries -` reads its
rows from stdin; a `retrieve` refused by its input checks leaves no OUT.parts, so the rerun on
the fixed file starts clean (hippo_gpu/cli/retrieve.py, hippo_gpu/retrieval/batch.py)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from hippo_gpu.cli import app
from hippo_gpu.sample import paths

runner = CliRunner()


def _question() -> str:
    return json.loads(paths()["questions"].read_text())[0]["question"]


def test_query_answers_one_question_on_the_sample(sample_index_dir: Path,
                                                  sample_searcher) -> None:
    q = _question()
    want = sample_searcher.to_hits(sample_searcher.rank([q], top_k=3, mode="hipporag2"))[0]
    res = runner.invoke(app, ["query", str(sample_index_dir), q, "--top-k", "3", "--json",
                              "--device", "cpu"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["version"] == 1 and got["mode"] == "hipporag2" and got["question"] == q
    assert [h["key"] for h in got["hits"]] == [h.key for h in want]
    assert [h["rank"] for h in got["hits"]] == [0, 1, 2]
    table = runner.invoke(app, ["query", str(sample_index_dir), q, "--top-k", "3",
                                "--mode", "dense", "--device", "cpu"])
    assert table.exit_code == 0, table.output
    dense = sample_searcher.to_hits(sample_searcher.rank([q], top_k=1, mode="dense"))[0][0]
    assert "(version 1), dense" in table.output and dense.title in table.output


def test_query_explain_splits_the_same_hits(sample_index_dir: Path, sample_searcher) -> None:
    q = _question()
    want = sample_searcher.to_hits(sample_searcher.rank([q], top_k=2, mode="hipporag2"))[0]
    res = runner.invoke(app, ["query", str(sample_index_dir), q, "--top-k", "2", "--explain",
                              "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    hits = json.loads(res.stdout)["explanation"]["hits"]
    assert [h["key"] for h in hits] == [h.key for h in want]
    for h in hits:  # the terms sum to the value, within the certified bound
        assert abs(h["total"] - h["value"]) <= h["bound"] + 1e-9
    shown = runner.invoke(app, ["query", str(sample_index_dir), q, "--top-k", "2",
                                "--explain", "--device", "cpu"])
    assert shown.exit_code == 0 and "seeds:" in shown.output and "dense" in shown.output


def test_query_errors_are_one_line(sample_index_dir: Path, tmp_path: Path) -> None:
    for args, says in ([str(tmp_path), "q"], "is not a hippo-gpu index"), \
            ([str(sample_index_dir), "q", "--mode", "nope"], "unknown mode"), \
            ([str(sample_index_dir), "  "], "the question is blank"):
        res = runner.invoke(app, ["query", *args])
        assert res.exit_code == 2 and says in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output


def _retrieve(index: Path, queries: str, out: Path, **kw: str) -> Result:
    return runner.invoke(app, ["retrieve", "--index", str(index), "--queries", queries, "--out",
                               str(out), "--mode", "dense", "--top-k", "3", "--device", "cpu"],
                         **kw)


def _rows() -> str:
    questions = json.loads(paths()["questions"].read_text())
    return "".join(json.dumps({"id": i, "query": q["question"]}) + "\n"
                   for i, q in enumerate(questions))


def test_retrieve_reads_queries_from_stdin(sample_index_dir: Path, tmp_path: Path) -> None:
    """The same answers as from a file, in OUT; nothing else is left beside it."""
    (tmp_path / "q.jsonl").write_text(_rows())
    res = _retrieve(sample_index_dir, str(tmp_path / "q.jsonl"), tmp_path / "file.jsonl")
    assert res.exit_code == 0, res.output
    out = tmp_path / "piped" / "answers.jsonl"
    res = _retrieve(sample_index_dir, "-", out, input=_rows())
    assert res.exit_code == 0, res.output
    assert out.read_text() == (tmp_path / "file.jsonl").read_text()
    assert sorted(p.name for p in out.parent.iterdir()) == ["answers.jsonl"]


def test_a_refused_retrieve_leaves_no_parts(sample_index_dir: Path, tmp_path: Path) -> None:
    """A malformed row in the middle: refused naming it, nothing created; the rerun on the fixed
    file (another size and mtime: another run's identity) answers every row."""
    rows = _rows().splitlines(keepends=True)
    queries = tmp_path / "q.jsonl"
    queries.write_text("".join(rows[:2]) + '{"id": 9}\n' + "".join(rows[2:]))
    out = tmp_path / "answers.jsonl"
    res = _retrieve(sample_index_dir, str(queries), out)
    assert res.exit_code == 2, res.output
    assert "q.jsonl:3" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl"]  # no OUT.parts, no OUT
    queries.write_text("".join(rows))
    res = _retrieve(sample_index_dir, str(queries), out)
    assert res.exit_code == 0, res.output
    assert len(out.read_text().splitlines()) == len(rows)
    res = _retrieve(sample_index_dir, "-", tmp_path / "piped.jsonl", input='{"id": 1}\n')
    assert res.exit_code == 2, res.output
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".piped", "piped"))]
