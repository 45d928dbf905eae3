"""hippo_gpu.storage.parts, the resumable-parts protocol of both batch jobs: a run is resumed only
by the same identity, parts are found by number, a dead writer's temporary files are removed, and a
folder of another kind of run (or of nobody) is refused."""

from __future__ import annotations

import json

import pytest

from hippo_gpu.data import DataFormatError
from hippo_gpu.storage.parts import RunParts


def _parts(tmp_path, run_file="run.json"):
    return RunParts.beside(tmp_path / "out.jsonl", run_file=run_file, part="part-{:06d}.jsonl")


def test_start_commit_resume_join(tmp_path):
    parts = _parts(tmp_path)
    identity = {"queries": "q.jsonl", "top_k": 3}
    assert parts.dir == tmp_path / "out.jsonl.parts"
    assert parts.resume(identity) is None
    parts.start(identity, plan=[[0, 10], [10, 20]])
    parts.commit(0, "a\n")
    parts.commit(2, b"c\n")
    (parts.dir / "part-000001.failed.jsonl").write_text("side file, not a part\n")
    (parts.dir / ".part-000001.jsonl.tmp-dead").write_text("half a part")
    assert parts.committed() == {0, 2}
    with pytest.raises(RuntimeError, match=r"parts \[1\]"):
        parts.in_order(3)

    again = _parts(tmp_path)
    assert again.resume(identity) == {"identity": identity, "plan": [[0, 10], [10, 20]]}
    assert not (parts.dir / ".part-000001.jsonl.tmp-dead").exists()
    again.commit(1, lambda tmp: tmp.write_text("b\n"))
    assert [p.read_text() for p in again.in_order(3)] == ["a\n", "b\n", "c\n"]
    again.remove()
    assert not parts.dir.exists()


def test_another_run_is_refused_naming_the_difference(tmp_path):
    parts = _parts(tmp_path)
    parts.start({"mode": "dense", "top_k": 3})
    with pytest.raises(DataFormatError, match="another run .differs in mode, top_k"):
        parts.resume({"mode": "hybrid", "top_k": 5})
    with pytest.raises(DataFormatError, match="another kind of run .run.json"):
        _parts(tmp_path, "ray-run.json").resume({"mode": "dense"})


def test_a_folder_without_run_file_is_refused_unless_empty(tmp_path):
    parts = _parts(tmp_path)
    parts.dir.mkdir()
    (parts.dir / ".run.json.tmp-dead").write_text("{")  # killed before its rename: ignored
    assert parts.resume({"a": 1}) is None
    parts.start({"a": 1})
    assert json.loads((parts.dir / "run.json").read_text()) == {"identity": {"a": 1}}
    assert not (parts.dir / ".run.json.tmp-dead").exists()
    other = RunParts(tmp_path / "stray", run_file="run.json", part="part-{:06d}.jsonl")
    other.dir.mkdir()
    (other.dir / "notes.txt").write_text("someone's file")
    with pytest.raises(DataFormatError, match="holds no run.json"):
        other.resume({"a": 1})

