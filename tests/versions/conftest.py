"""Fixtures of the writer tests: one cached encoder and the sample's 20-passage base index for
the whole session (read-only: tests write to copies), and one thread per pool."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hippo_gpu import build_index
from hippo_gpu.config import EncoderConfig
from hippo_gpu.data import Passage, read_questions
from hippo_gpu.embed import Encoder
from hippo_gpu.sample import paths
from tests.helpers import threads
from tests.versions.index_checks import build


@pytest.fixture
def one_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """The sample's indexes are tiny and this machine's 2 cores are shared: there, thread pools
    only add contention (the sample's queries ran ~100x slower with 2 threads at load 7). The
    musique test keeps the default."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    with threads(1):
        yield


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("writer_cache")


@pytest.fixture(scope="session")
def enc(cache_dir: Path) -> Encoder:
    """One encoder for every build, writer and searcher here; its cache makes vectors per text
    identical whichever side asks."""
    with threads(1):
        encoder = Encoder(EncoderConfig(), torch.device("cpu"), cache_dir=cache_dir)
        files = paths()
        build_index(files["corpus"], files["openie"], encoder=encoder, device="cpu")  # cache
    return encoder


@pytest.fixture(scope="session")
def sample() -> dict:
    files = paths()
    corpus = [Passage(p["title"], p["text"])
              for p in json.loads(files["corpus"].read_text(encoding="utf-8"))]
    openie = json.loads(files["openie"].read_text(encoding="utf-8"))
    questions = [q.question for q in read_questions(files["questions"])]
    return {"corpus": corpus, "openie": openie, "openie_path": files["openie"],
            "questions": questions}


@pytest.fixture(scope="session")
def base_dir(enc: Encoder, sample: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 20 sample passages, saved (tests work on copies)."""
    out = tmp_path_factory.mktemp("writer_base") / "index"
    build(enc, sample, sample["corpus"][:20], out)
    return out
