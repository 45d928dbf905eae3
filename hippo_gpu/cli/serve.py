"""`hippo-gpu serve`: load an index once and serve it over HTTP with micro-batching.

The bearer token is read here, from the environment variable named by --token-env, and handed to
the server config; library code never reads the environment. With a token, the OpenAPI schema
declares bearer security on /v1/*; without one it declares none. Loopback is the default host.
Every request limit below is part of the served OpenAPI schema (see hippo_gpu.serve.server).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path

import typer

from hippo_gpu.device import DEVICE_CHOICES
from hippo_gpu.serve.batcher import BatcherConfig

log = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "HIPPO_GPU_TOKEN"


def register(app: typer.Typer) -> None:
    """Add the `serve` command to the `hippo-gpu` Typer app."""
    app.command("serve")(serve)


def serve(
    index: Path = typer.Option(
        ..., "--index", exists=True, file_okay=False, help="index directory (from `build`)"
    ),
    host: str = typer.Option("127.0.0.1", help="bind address; loopback by default"),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port (0 picks a free one)"),
    device: str = typer.Option("auto", help=f"one of {DEVICE_CHOICES} or e.g. cuda:1"),
    max_batch: int = typer.Option(64, min=1, help="most queries per batched retrieve (1: off)"),
    max_wait_ms: float = typer.Option(5.0, min=0.0, help="longest wait for a batch to fill"),
    max_queue: int = typer.Option(1024, min=1, help="most waiting queries; beyond -> 429"),
    max_queries_per_request: int = typer.Option(64, min=1, help="beyond -> 422 (in the schema)"),
    max_query_chars: int = typer.Option(2000, min=1, help="longer queries -> 422 (in the schema)"),
    max_entities_per_query: int = typer.Option(
        16, min=1, help="more entities for one query -> 422 (in the schema)"
    ),
    max_entity_chars: int = typer.Option(200, min=1, help="longer entities -> 422 (in the schema)"),
    max_top_k: int = typer.Option(1000, min=1, help="larger top_k -> 422 (in the schema)"),
    token_env: str = typer.Option(
        DEFAULT_TOKEN_ENV, help="env var holding the bearer token; unset or empty: no auth"
    ),
    threads: int | None = typer.Option(None, min=1, help="torch CPU threads (default: torch's)"),
    precision: str = typer.Option(
        "float32", help="embedding/score precision on the device: float32 | float16 | bfloat16"
    ),
    query_precision: str | None = typer.Option(
        None, help="query encoder precision (default: the index's); bfloat16 is faster only on "
                   "CPUs with AMX and makes rankings depend on the batch (README)"
    ),
    query_backend: str = typer.Option(
        "auto", help="query encoder: auto (ONNX Runtime when installed and at parity) | torch | "
                     "onnx"
    ),
    writable: bool = typer.Option(
        False, help="serve POST/DELETE /v1/passages (needs a token): writes commit new index "
                    "versions and queries switch to each one atomically"
    ),
    llm: str | None = typer.Option(
        None, help="with --writable: extract OpenIE for passages posted without triples"
    ),
    warmup: bool = typer.Option(True, help="run one query per mode before accepting requests"),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    """Serve POST /v1/retrieve, /healthz, /readyz, /v1/stats and /docs for one index."""
    import uvicorn

    from hippo_gpu.device import set_threads
    from hippo_gpu.index import load_index
    from hippo_gpu.search import Searcher
    from hippo_gpu.serve.server import ServerConfig, create_app
    from hippo_gpu.serve.writes import SearcherHolder

    token = os.environ.get(token_env) or None
    try:
        config = ServerConfig(
            batcher=BatcherConfig(max_batch, max_wait_ms, max_queue),
            max_queries_per_request=max_queries_per_request,
            max_query_chars=max_query_chars,
            max_entities_per_query=max_entities_per_query,
            max_entity_chars=max_entity_chars,
            max_top_k=max_top_k,
            token=token,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if token is None and not _is_loopback(host):
        typer.echo(
            f"warning: serving on {host} without a token; set {token_env} to require one",
            err=True,
        )
    if writable and token is None:
        raise typer.BadParameter(f"--writable needs a token: set {token_env}")
    set_threads(threads)
    typer.echo(f"loading index from {index} on {device} ({precision}) ...", err=True)
    try:
        searcher = Searcher(load_index(index, device=device, precision=precision),
                            query_precision=query_precision, query_backend=query_backend)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if warmup:
        # Load the query encoder and build the solvers now, so /readyz means ready and the first
        # client does not pay for it.
        searcher.warm_up(("dense", "hipporag2"))
    holder = SearcherHolder(searcher, index if writable else None, device=device, llm=llm,
                            llm_cache=index.parent / f"{index.name}.llm-cache.sqlite")
    app = create_app(holder, config)
    # uvicorn stops accepting on SIGINT/SIGTERM, waits for open requests (at most 30 s), then the
    # app's lifespan drains the batcher.
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
