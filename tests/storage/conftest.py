"""Fixtures of the full-disk tests: the sample, its 20-passage base index, that base with the
change committed as a segment, and a fresh build of the changed corpus, once per session
(read-only: tests write to copies); one torch thread."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hippo_gpu.data import Passage
from hippo_gpu.indexing.index import Index
from hippo_gpu.sample import paths
from hippo_gpu.versions.writer import IndexWriter
from tests.storage.full_disk_checks import REMOVED, build, stage


@pytest.fixture
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def sample() -> dict:
    files = paths()
    corpus = [Passage(p["title"], p["text"])
              for p in json.loads(files["corpus"].read_text(encoding="utf-8"))]
    return {"corpus": corpus, "openie": json.loads(files["openie"].read_text(encoding="utf-8")),
            "openie_path": files["openie"]}


@pytest.fixture(scope="session")
def base(sample: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 20 sample passages, saved with their basis (tests work on copies)."""
    out = tmp_path_factory.mktemp("full_disk_base") / "index"
    build(sample, sample["corpus"][:20], out)
    return out


@pytest.fixture(scope="session")
def committed(base: Path, sample: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`base` with the change committed as a segment (what a compaction folds)."""
    out = tmp_path_factory.mktemp("full_disk_committed") / "index"
    shutil.copytree(base, out)
    with IndexWriter(out, device="cpu", compact_after=None) as w:
        stage(w, sample)
    return out


@pytest.fixture(scope="session")
def reference(sample: dict) -> Index:
    """A fresh build of the corpus after the change, in the writer's order."""
    kept = [p for i, p in enumerate(sample["corpus"][:20]) if i not in REMOVED]
    return build(sample, kept + sample["corpus"][20:])
