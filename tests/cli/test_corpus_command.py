"""A corpus from a folder of text files (hippo_gpu/folder_corpus.py, `hippo-gpu corpus`): which
files are read and in what order, chunks within max_chars that keep every word, titles that make
unique passage keys, and the refusals that name their input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hippo_gpu.cli import app
from hippo_gpu.data import read_corpus
from hippo_gpu.folder_corpus import folder_corpus

runner = CliRunner()

SECTION = ("The tidal clock of Skerrow was built in 1821 by Edwin Pell, a watchmaker who had "
           "studied at Castellan College. It measured the tides of the harbour for a century. ")


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (root / "a.md").write_text("# Skerrow\n\n" + SECTION * 3 + "\n\n## Pell\n\n" + SECTION * 2,
                               encoding="utf-8")
    (root / "sub" / "b.txt").write_text("\ufeffThe Lumen Museum opened in 1902.\n",
                                        encoding="utf-8")
    (root / "empty.txt").write_text("  \n\n", encoding="utf-8")
    (root / ".hidden" / "c.txt").write_text("left out", encoding="utf-8")
    (root / "notes.pdf").write_bytes(b"%PDF-1.4")
    return root


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def test_a_folder_becomes_passages_within_max_chars(tmp_path: Path) -> None:
    made = folder_corpus(_folder(tmp_path), max_chars=200)
    assert made.files == 3 and made.empty == ["empty.txt"]
    titles = [p["title"] for p in made.passages]
    n = len(titles) - 1
    assert n > 2 and titles == [f"a.md ({i}/{n})" for i in range(1, n + 1)] + ["sub/b.txt"]
    assert all(0 < len(p["text"]) <= 200 for p in made.passages)
    # no overlap: the chunks of a.md, in order, are its words, each once
    a_md = (tmp_path / "docs" / "a.md").read_text(encoding="utf-8")
    assert [w for p in made.passages[:-1] for w in _words(p["text"])] == _words(a_md)
    assert made.passages[0]["text"].startswith("# Skerrow")
    assert made.passages[-1]["text"] == "The Lumen Museum opened in 1902."  # BOM and \n gone
    one = folder_corpus(tmp_path / "docs", max_chars=10_000)
    assert [p["title"] for p in one.passages] == ["a.md", "sub/b.txt"]
    assert [(p["id"], p["metadata"]) for p in one.passages] == [
        ("a.md#1", {"path": "a.md", "chunk": 1, "chunks": 1}),
        ("sub/b.txt#1", {"path": "sub/b.txt", "chunk": 1, "chunks": 1})]
    assert [p["id"] for p in made.passages] == [f"a.md#{i}" for i in range(1, n + 1)] + \
        ["sub/b.txt#1"]
    overlapping = folder_corpus(tmp_path / "docs", max_chars=200, overlap=60)
    assert len(_words(" ".join(p["text"] for p in overlapping.passages))) > len(_words(
        " ".join(p["text"] for p in made.passages)))


def test_refusals_name_their_input(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    (root / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.txt: not UTF-8 text \(byte 3\)"):
        folder_corpus(root)
    with pytest.raises(ValueError, match=r"a\.md: not a folder"):
        folder_corpus(root / "a.md")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "x.pdf").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"bare: no \.txt, \.md, \.markdown file"):
        folder_corpus(tmp_path / "bare")
    with pytest.raises(ValueError, match="overlap must be"):
        folder_corpus(root, max_chars=100, overlap=100)


def test_corpus_command_writes_a_corpus_the_other_commands_read(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    out = tmp_path / "corpus.json"
    res = runner.invoke(app, ["corpus", str(root), "--out", str(out), "--max-chars", "200"])
    assert res.exit_code == 0, res.output
    assert "3 file(s) -> " in res.output and "skipped 1 empty: empty.txt" in res.output
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written == folder_corpus(root, max_chars=200).passages
    passages = read_corpus(out)
    assert len({p.key for p in passages}) == len(written)
    # an existing --out is kept unless --replace
    again = runner.invoke(app, ["corpus", str(root), "--out", str(out), "--max-chars", "100"])
    assert again.exit_code == 2 and "already exists; pass --replace" in again.output
    assert json.loads(out.read_text(encoding="utf-8")) == written
    replaced = runner.invoke(app, ["corpus", str(root), "--out", str(out), "--max-chars", "100",
                                   "--replace"])
    assert replaced.exit_code == 0 and len(json.loads(out.read_text())) > len(written)
    # a folder given where a corpus file is expected: the hint names this command
    for args in (["index", "--corpus", str(root), "--openie", str(out), "--out",
                  str(tmp_path / "idx")],
                 ["extract", "--corpus", str(root), "--llm", "local:smollm2", "--out",
                  str(tmp_path / "oie.json")]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        assert f"hippo-gpu corpus {root} --out corpus.json" in " ".join(res.output.split())
        assert not (tmp_path / "idx").exists() and not (tmp_path / "oie.json").exists()
