"""A writer killed at each commit step (storage.directory.COMMIT_STEPS), and a compaction killed
at each step of its base write, in child processes (tests/versions/writer_fault_child.py, as
under SIGKILL): the directory loads, every checksum valid, as the old or the new version, and the
next writer or `hippo-gpu compact` clears the leftovers and completes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hippo_gpu import build_index, load_index
from hippo_gpu.cli import app
from hippo_gpu.storage.directory import COMMIT_STEPS, MANIFEST
from hippo_gpu.storage.locks import WRITER_LOCK
from hippo_gpu.versions.writer import IndexWriter
from tests.versions.index_checks import (
    assert_same_index,
    content_stats,
    copy_index,
    docs_for,
    leftovers,
)

pytestmark = pytest.mark.usefixtures("one_thread")

CHILD = Path(__file__).with_name("writer_fault_child.py")

runner = CliRunner()


# How texts are embedded is no part of these claims: the weightless hash encoder spares the
# child process the import of sentence-transformers and a model load (~5 s on 2 cores).
ENCODER = "hash:64"


@pytest.fixture(scope="module")
def killed(sample, tmp_path_factory) -> dict:
    """Copies of the sample's first 20 passages (hash:64) in which a writer inserting passages
    20-22 was killed at each commit step ("commit") or at each step of the compaction after its
    commit ("compaction"), all by one child process (its imports paid once; each killed writer
    is still a process of its own), with the old index and the new corpus's fresh build."""
    tmp = tmp_path_factory.mktemp("killed")
    added = sample["corpus"][20:23]
    base_dir = tmp / "base"
    old = build_index(sample["corpus"][:20], sample["openie"], base_dir, encoder=ENCODER,
                      device="cpu")
    new = build_index(sample["corpus"][:23], sample["openie"], None, encoder=ENCODER,
                      device="cpu")
    dirs = {kind: {step: copy_index(base_dir, tmp / kind / step) for step in COMMIT_STEPS}
            for kind in ("commit", "compaction")}
    spec = tmp / "jobs.json"
    spec.write_text(json.dumps({
        "jobs": [{"index_dir": str(d), "step": s, "compact": kind == "compaction",
                  "name": f"{kind}/{s}"} for kind in dirs for s, d in dirs[kind].items()],
        "warm_model": False, "corpus": [{"title": p.title, "text": p.text} for p in added],
        "openie": docs_for(sample, added), "cache_dir": str(tmp / "cache")}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    res = subprocess.run([sys.executable, str(CHILD), "kill", str(spec)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    status = json.loads(res.stdout.strip().splitlines()[-1])
    return {"added": added, "old": old, "new": new, "dirs": dirs, "status": status,
            "stderr": res.stderr[-3000:]}


def test_killed_writer_leaves_old_or_new_and_the_next_writer_completes(sample, killed):
    added, old, new = killed["added"], killed["old"], killed["new"]
    dirs = killed["dirs"]["commit"]
    status = {s: killed["status"][f"commit/{s}"] for s in COMMIT_STEPS}
    assert status == {s: 137 for s in COMMIT_STEPS}, killed["stderr"]

    committed = COMMIT_STEPS.index("collect_garbage")  # the manifest was replaced before it
    for i, step in enumerate(COMMIT_STEPS):
        index_dir = dirs[step]
        got = load_index(index_dir, device="cpu")  # verifies every checksum
        expect = new if i >= committed else old
        other = old if i >= committed else new
        assert got.passage_keys == expect.passage_keys != other.passage_keys, step
        assert content_stats(got) == content_stats(expect), step
        assert got.version == (2 if i >= committed else 1), step
        left = leftovers(index_dir)
        # a segment commit replaces no version, so past the manifest switch nothing is left
        assert bool(left) == (i < committed), f"{step}: {left}"
        if i % 2 == 0:  # half are cleaned by `hippo-gpu compact`, half by the next writer
            out = runner.invoke(app, ["compact", str(index_dir)])
            assert out.exit_code == 0, out.output
            assert leftovers(index_dir) == [], step
        with IndexWriter(index_dir, device="cpu") as w:  # its encoder: the index's hash:64
            assert leftovers(index_dir) == [], step
            assert w.insert(added, docs_for(sample, added)) == (0 if i >= committed else 3)
        after = load_index(index_dir, device="cpu")
        assert_same_index(after, new)
        assert leftovers(index_dir) == [], step
        assert not (index_dir / WRITER_LOCK).read_text().strip()  # released


def test_killed_compaction_leaves_the_same_content_and_the_next_writer_completes(killed):
    """A compaction killed at every step of its base write leaves the chain (before the
    manifest switch) or the new base (after): the same passages and content either way, every
    checksum valid; the next writer clears the leftovers and a `hippo-gpu compact` finishes."""
    new, dirs = killed["new"], killed["dirs"]["compaction"]
    status = {s: killed["status"][f"compaction/{s}"] for s in COMMIT_STEPS}
    assert status == {s: 137 for s in COMMIT_STEPS}, killed["stderr"]
    switched = COMMIT_STEPS.index("collect_garbage")
    for i, step in enumerate(COMMIT_STEPS):
        index_dir = dirs[step]
        manifest = json.loads((index_dir / MANIFEST).read_text())
        assert (manifest["segments"] == []) == (i >= switched), step
        got = load_index(index_dir, device="cpu")  # verifies every checksum
        assert_same_index(got, new)
        # the chain's version gets a basis updated by this reader; the new base its own
        assert got.basis is not None and (got.basis.updates == 0) == (i >= switched), step
        out = runner.invoke(app, ["compact", str(index_dir)])
        assert out.exit_code == 0, out.output
        assert leftovers(index_dir) == [], step
        done = load_index(index_dir, device="cpu")
        assert done.basis is not None and json.loads(
            (index_dir / MANIFEST).read_text())["segments"] == []
        assert_same_index(done, new)
