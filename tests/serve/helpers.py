"""What the serving tests share: a real uvicorn on loopback, a gate that holds a batch in flight,
the offline reference rankings, and the checks served answers must pass."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from hippo_gpu.retrieval.entities import heuristic_entities
from hippo_gpu.serve.server import ServerConfig, create_app
from tests.loopback import serve_asgi


class Gate:
    """Wraps the real searcher; `rank` (what the service calls) waits until the gate opens (or
    raises, if told to); `to_hits` is the searcher's."""

    def __init__(self, searcher: Any, *, raise_error: Exception | None = None) -> None:
        self._searcher = searcher
        self.index = searcher.index
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.raise_error = raise_error

    def rank(self, queries: list[str], *, top_k: int, mode: str, **kw: Any) -> Any:
        self.entered.set()
        assert self.opened.wait(30), "gate never opened"
        if self.raise_error is not None:
            raise self.raise_error
        return self._searcher.rank(queries, top_k=top_k, mode=mode, **kw)

    def to_hits(self, ranking: Any) -> Any:
        return self._searcher.to_hits(ranking)


@contextmanager
def serving(searcher: Any, config: ServerConfig) -> Iterator[tuple[str, uvicorn.Server]]:
    """uvicorn on 127.0.0.1, a free port, in a thread; yields (base URL, server)."""
    with serve_asgi(create_app(searcher, config), timeout_graceful_shutdown=20) as served:
        yield served


def subset_index(tmp: Path, searcher: Any, n: int) -> Any:
    """The sample's first `n` passages indexed on their own, with a searcher of its own (its own
    query encoder: two indexes' batcher threads never share one)."""
    from hippo_gpu import Searcher, build_index, load_index
    from hippo_gpu.sample import paths

    files = paths()
    corpus = json.loads(Path(files["corpus"]).read_text())[:n]
    openie = json.loads(Path(files["openie"]).read_text())
    build_index(corpus, openie, tmp / "index", device="cpu", encoder=searcher.encoder)
    return Searcher(load_index(tmp / "index", device="cpu"))


def tensor_bytes_reference(index: Any) -> int:
    """Bytes of every tensor attribute of `index` (CSR: its three component arrays)."""
    import torch

    total = 0
    for v in vars(index).values():
        if isinstance(v, torch.Tensor):
            parts = ([v.crow_indices(), v.col_indices(), v.values()] if v.is_sparse_csr
                     else [v])  # fmt: skip
            total += sum(p.numel() * p.element_size() for p in parts)
    return total


def offline_hits(searcher: Any, queries: list[str], top_k: int, mode: str,
             entities: list[list[str]] | None = None) -> list[list[dict]]:
    text_of = dict(zip(searcher.index.passage_keys, searcher.index.passage_texts, strict=True))
    return [
        [
            {"key": h.key, "title": h.title, "text": text_of[h.key], "score": h.score,
             "rank": h.rank}
            for h in hits
        ]
        for hits in searcher.retrieve(queries, top_k=top_k, mode=mode, query_entities=entities)
    ]  # fmt: skip


def assert_same_ranking(served: list[dict], offline: list[dict]) -> None:
    assert [(h["key"], h["title"], h["text"], h["rank"]) for h in served] == [
        (h["key"], h["title"], h["text"], h["rank"]) for h in offline
    ]
    # float32 scores: the query encoder and GEMMs round differently with the batch's shape
    # (padding, blocking), by ~1e-6; the ranking itself must be the same.
    served_scores = [h["score"] for h in served]
    assert served_scores == pytest.approx([h["score"] for h in offline], rel=1e-5, abs=1e-6)


def assert_no_leak(body: str, index_dir: Path) -> None:
    assert "Traceback" not in body
    assert str(index_dir) not in body
    assert 'File "' not in body


def entity_variants(queries: list[str]) -> list[list[list[str]] | None]:
    """Ways to send the entities of `queries`: absent, spelled out, empty, borrowed, wrong case."""
    spans = heuristic_entities(queries)
    borrowed = [spans[(i + 1) % len(spans)] or ["Stanford University"] for i in range(len(spans))]
    return [
        None,  # hipporag1, hybrid: the capitalised spans, found inside Searcher
        spans,  # the same spans, given explicitly
        [[] for _ in queries],  # no entity for any query
        borrowed,  # another query's entities: a different entity ranking
        [[e.lower() for e in ents] + ["alzheimer"] for ents in spans],  # linked by cosine
    ]


ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def serve_cli(index_dir: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`hippo-gpu serve --index DIR ARGS` in a subprocess on a free 127.0.0.1 port, once ready:
    its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           **(env or {})}
    cmd = [sys.executable, "-m", "hippo_gpu.cli", "serve", "--index", str(index_dir),
           "--port", str(port), "--device", "cpu", "--threads", "1", "--no-warmup", "--no-mcp",
           "--no-ui", "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
