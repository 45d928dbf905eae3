"""A loopback OpenAI-compatible embeddings server for the tests (FastAPI on uvicorn, 127.0.0.1).

It embeds with a real encoder of this package, computed in the server's process: the bundled
MiniLM ("minilm", hippo_gpu's local Encoder) or the weightless HashEncoder ("hash:D"). It runs in
a thread of the test process (`serving`) or, to be killed mid-build, as a subprocess
(`python -m tests.embed.embedding_server --vectors hash:64 --die-after N --log FILE`, which
prints "PORT <n>" and SIGKILLs itself when request N + 1 arrives).

Each POST /v1/embeddings takes the next action of `EmbeddingState.script` (then "ok" when the
script is spent):
    ("ok",)                      the real vectors
    ("status", code, headers)    an error status with a JSON error body and those headers
    ("delay", seconds)           the real vectors, after a delay (to time a client out)
    ("drop",)                    the connection closed without an answer
    ("dim", d)                   vectors cut to their first d components (a wrong dimension)
    ("malformed",)               HTTP 200 with a body that is not JSON
Every request is recorded (inputs, model, action, headers) and so is each one answered with
vectors; the subprocess appends answered requests to --log, one JSON line each, before answering.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tests.loopback import serve_asgi

Embed = Callable[[Sequence[str]], np.ndarray]
_MODEL_THREAD = ThreadPoolExecutor(1, thread_name_prefix="embedding-server-model")


@dataclass
class EmbeddingState:
    """What the server does and what it saw (read by the tests; guarded by `lock`)."""

    embed: Embed
    script: list[tuple[Any, ...]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)  # every request, in order
    answered: list[list[str]] = field(default_factory=list)  # inputs of requests given vectors
    in_flight: int = 0
    max_in_flight: int = 0
    die_after: int | None = None  # subprocess: SIGKILL itself when request die_after + 1 comes
    log: Path | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def texts_answered(self) -> list[str]:
        with self.lock:
            return [t for inputs in self.answered for t in inputs]


def make_app(state: EmbeddingState) -> Callable[..., Any]:
    """The ASGI app. Its outer layer hands the route uvicorn's own `send`, whose transport a
    "drop" action aborts (a connection closed with no answer, as a crashed proxy leaves it)."""
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        with state.lock:
            number = len(state.requests) + 1
            if state.die_after is not None and number > state.die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            action = state.script.pop(0) if state.script else ("ok",)
            state.requests.append({"inputs": inputs, "model": body.get("model"),
                                   "action": action[0],
                                   "authorization": request.headers.get("authorization"),
                                   "arrived": time.monotonic()})
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            return await _answer(state, action, inputs, request)
        finally:
            with state.lock:
                state.in_flight -= 1

    async def outer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope["test.send"] = send
        await app(scope, receive, send)

    return outer


async def _answer(state: EmbeddingState, action: tuple[Any, ...], inputs: list[str],
                  request: Request) -> Response:
    kind = action[0]
    if kind == "status":
        _, code, headers = action
        return JSONResponse({"error": {"message": f"scripted status {code}"}}, code,
                            headers=headers)
    if kind == "drop":
        request.scope["test.send"].__self__.transport.abort()
        return Response(status_code=500)  # never reaches the client
    if kind == "malformed":
        return Response(b'{"data": [{"embedding": [0.1, ', media_type="application/json")
    if kind == "delay":
        await asyncio.sleep(action[1])
    # one thread runs the model (not a new one per request: each would start an OpenMP team)
    started = time.perf_counter()
    vectors = await asyncio.get_running_loop().run_in_executor(_MODEL_THREAD, state.embed,
                                                               inputs)
    seconds = time.perf_counter() - started
    if kind == "dim":
        vectors = vectors[:, :action[1]]
    with state.lock:
        state.answered.append(inputs)
        if state.log is not None:
            with state.log.open("a") as f:
                f.write(json.dumps({"inputs": inputs}) + "\n")
    data = [{"object": "embedding", "index": i, "embedding": v.tolist()}
            for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": "test",
                         "usage": {"prompt_tokens": 0, "total_tokens": 0}},
                        headers={"x-embed-seconds": f"{seconds:.4f}"})


def embedder(vectors: str) -> Embed:
    """The server's vectors: "minilm" (the bundled model, hippo_gpu's local Encoder) or
    "hash:D" (HashEncoder)."""
    import torch

    from hippo_gpu.config import EncoderConfig
    from hippo_gpu.embed import Encoder, HashEncoder, hash_encoder_dim

    dim = hash_encoder_dim(vectors)
    if dim is not None:
        return HashEncoder(dim)
    if vectors != "minilm":
        raise ValueError(f"vectors must be minilm or hash:D, got {vectors!r}")
    encoder = Encoder(EncoderConfig(), torch.device("cpu"))
    lock = threading.Lock()  # one model, called from the server's worker threads

    def embed(texts: Sequence[str]) -> np.ndarray:
        with lock:
            return encoder.encode(texts).numpy()

    return embed


@contextmanager
def serving(state: EmbeddingState) -> Iterator[str]:
    """The server in a thread on 127.0.0.1 at a free port; yields its base URL (…/v1)."""
    with serve_asgi(make_app(state), log_level="critical", lifespan="off",
                    access_log=False) as (url, _):
        yield f"{url}/v1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vectors", default="hash:64")
    ap.add_argument("--die-after", type=int, default=None)
    ap.add_argument("--log", type=Path, default=None)
    args = ap.parse_args()
    state = EmbeddingState(embedder(args.vectors), die_after=args.die_after, log=args.log)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(make_app(state), log_level="critical",
                                           lifespan="off", access_log=False))
    server.run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
