"""`hippo-gpu insert` and `hippo-gpu delete`: the index they leave equals a fresh build, the
report counts the change, a repeated insert is a no-op, and an unknown key changes nothing.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hippo_gpu import load_index
from hippo_gpu.cli import app
from tests.versions.index_checks import (
    assert_same_index,
    build,
    copy_index,
    manifest_version,
    snapshot,
)

pytestmark = pytest.mark.usefixtures("one_thread")

runner = CliRunner()


def _count(output: str, row: str) -> int:
    line = next(ln for ln in output.splitlines() if row in ln)
    return int(line.replace("│", " ").split()[-1])


def test_cli_insert_and_delete(enc, sample, base_dir, cache_dir, tmp_path):
    index_dir = copy_index(base_dir, tmp_path / "index")
    added = sample["corpus"][20:24]
    corpus_file = tmp_path / "new.json"
    corpus_file.write_text(json.dumps([{"title": p.title, "text": p.text} for p in added]))
    res = runner.invoke(app, ["insert", str(index_dir), "--corpus", str(corpus_file),
                              "--openie", str(sample["openie_path"]), "--device", "cpu",
                              "--cache-dir", str(cache_dir)])
    assert res.exit_code == 0, res.output
    assert _count(res.output, "passages_added") == 4
    assert _count(res.output, "passages_removed") == 0
    assert_same_index(load_index(index_dir, device="cpu"),
                      build(enc, sample, sample["corpus"][:24]))

    res = runner.invoke(app, ["insert", str(index_dir), "--corpus", str(corpus_file),
                              "--openie", str(sample["openie_path"]), "--device", "cpu",
                              "--cache-dir", str(cache_dir)])
    assert res.exit_code == 0 and "all 4 passage(s) are present" in res.output
    assert manifest_version(index_dir) == 2

    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("\n".join(p.key for p in sample["corpus"][:2]) + "\n")
    res = runner.invoke(app, ["delete", str(index_dir), "--keys", str(keys_file)])
    assert res.exit_code == 0, res.output
    assert _count(res.output, "passages_removed") == 2
    assert _count(res.output, "passages_added") == 0
    assert_same_index(load_index(index_dir, device="cpu"),
                      build(enc, sample, sample["corpus"][2:24]))

    before = snapshot(index_dir)
    keys_file.write_text(sample["corpus"][5].key + "\nchunk-0000unknown\n")
    res = runner.invoke(app, ["delete", str(index_dir), "--keys", str(keys_file)])
    assert res.exit_code == 2 and "chunk-0000unknown" in res.output
    assert snapshot(index_dir) == before
