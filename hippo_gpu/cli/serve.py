"""`hippo-gpu serve`: load an index once and serve it over HTTP with micro-batching.

The bearer token is read here, from --token-file (its first line) or else the environment
variable named by --token-env, and handed to the server config; library code never reads the
environment, and nothing prints the token. With a token, the OpenAPI schema declares bearer
security on /v1/*; without one it declares none. Loopback is the default host; a server without
a token on a loopback address answers only loopback Host names (DNS rebinding), one bound
elsewhere answers any. Every request limit below is part of the served OpenAPI schema (see
hippo_gpu.serve.schema).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hippo_gpu.cli.common import QUERY_ENCODER_HELP
from hippo_gpu.cli.reasoning import (
    DATASET_HELP,
    PASSAGES_HELP,
    PROMPT_HELP,
    make_reasoner,
    reasoner_spec,
)
from hippo_gpu.config import DEVICE_CHOICES
from hippo_gpu.serve.batcher import BatcherConfig
from hippo_gpu.serve.config import LOOPBACK_HOSTS, QueryLimits, ServerConfig, WriteLimits

if TYPE_CHECKING:
    from hippo_gpu.llm.ircot import ReasonerSpec
    from hippo_gpu.retrieval.spec import SearcherSpec

log = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "HIPPO_GPU_TOKEN"
_LIMITS = QueryLimits()  # the flags' defaults
_WRITES = WriteLimits()


def register(app: typer.Typer) -> None:
    """Add the `serve` command to the `hippo-gpu` Typer app."""
    app.command("serve")(serve)


def serve(
    index: list[str] = typer.Option(
        ..., "--index", help="index directory (from `build`), or NAME=DIR; repeat to serve "
                             "several (the first is the default)"
    ),
    host: str = typer.Option("127.0.0.1", help="bind address; loopback by default"),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port (0 picks a free one)"),
    device: str = typer.Option("auto", help=f"one of {DEVICE_CHOICES} or e.g. cuda:1"),
    max_batch: int = typer.Option(64, min=1, help="most queries per batched retrieve (1: off)"),
    max_wait_ms: float = typer.Option(5.0, min=0.0, help="longest wait for a batch to fill"),
    max_queue: int = typer.Option(1024, min=1, help="most waiting queries; beyond -> 429"),
    max_queries_per_request: int = typer.Option(64, min=1, help="beyond -> 422 (in the schema)"),
    max_query_chars: int = typer.Option(
        _LIMITS.max_query_chars, min=1, help="longer queries -> 422 (in the schema)"
    ),
    max_entities_per_query: int = typer.Option(
        _LIMITS.max_entities_per_query, min=1,
        help="more entities for one query -> 422 (in the schema)"
    ),
    max_entity_chars: int = typer.Option(
        _LIMITS.max_entity_chars, min=1, help="longer entities -> 422 (in the schema)"
    ),
    max_top_k: int = typer.Option(
        _LIMITS.max_top_k, min=1, help="larger top_k -> 422 (in the schema)"
    ),
    max_request_cost: int | None = typer.Option(
        None, min=1, help="work budget of one retrieve or explain request, in estimated units "
                          "(~ms of the calibration machine: hippo_gpu/serve/budget.py; queries x "
                          "(text + top_k x mode weight) x IRCoT steps); beyond -> 413 (default: "
                          "CostLimits' 5000, ~5 s on a 2-core VM)"),
    token_env: str = typer.Option(
        DEFAULT_TOKEN_ENV, help="env var holding the bearer token; unset or empty: no auth"
    ),
    token_file: Path | None = typer.Option(
        None, help="file whose first line is the bearer token (instead of --token-env)"),
    max_write_passages: int = typer.Option(
        _WRITES.max_passages_per_request, min=1,
        help="--writable: most passages per insert; beyond -> 422 (in the schema)"),
    max_write_bytes: int = typer.Option(
        _WRITES.max_body_bytes, min=1, help="--writable: largest write body; beyond -> 413"),
    writes_per_second: float = typer.Option(
        _WRITES.writes_per_second, min=0.001,
        help="--writable: sustained write requests per second; beyond -> 429"),
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
    encoder: str | None = typer.Option(None, help=QUERY_ENCODER_HELP),
    writable: bool = typer.Option(
        False, help="serve POST/DELETE /v1/passages (needs a token): writes commit new index "
                    "versions and queries switch to each one atomically"
    ),
    llm: str | None = typer.Option(
        None, help="LLM: writes IRCoT thoughts (requests with \"ircot\") and, with --writable, "
                   "extracts OpenIE for passages posted without triples"
    ),
    warmup: bool = typer.Option(True, help="run one query per mode before accepting requests"),
    mcp: bool | None = typer.Option(
        None, "--mcp/--no-mcp", help="MCP tools at /mcp (default: when the mcp extra is installed)"
    ),
    ui: bool = typer.Option(
        True, "--ui/--no-ui", help="the explorer page at /ui (its requests carry the token)"
    ),
    log_level: str = typer.Option("info", help="uvicorn log level"),
    ray: str | None = typer.Option(
        None, "--ray", metavar="ADDRESS|local",
        help="serve on Ray Serve: 'local' starts Ray here, 'auto' or HOST:PORT joins a cluster; "
             "each replica loads the index (on storage every node reads) and runs this server"
    ),
    replicas: int = typer.Option(1, min=1, help="--ray: replicas, each holding one index"),
    cpus_per_replica: float = typer.Option(1.0, min=0.0, help="--ray: Ray CPUs per replica"),
    gpus_per_replica: float = typer.Option(0.0, min=0.0, help="--ray: GPUs per replica"),
    max_ircot_steps: int = typer.Option(8, min=1, help="largest ircot.max_steps; beyond -> 422"),
    ircot_prompt: Path | None = typer.Option(None, help=PROMPT_HELP),
    dataset: str | None = typer.Option(None, help=DATASET_HELP),
    ircot_passages: int | None = typer.Option(None, min=0, help=PASSAGES_HELP),
) -> None:
    """Serve POST /v1/retrieve, /v1/explain, /v1/stats, /v1/indexes, /metrics, /mcp, /ui,
    /healthz, /readyz and /docs for one or several indexes."""
    import uvicorn

    from hippo_gpu.retrieval.spec import SearcherSpec
    from hippo_gpu.serve.config import CostLimits
    from hippo_gpu.serve.server import create_app
    from hippo_gpu.serve.service import parse_index_specs
    from hippo_gpu.serve.writes import SearcherHolder

    try:
        indexes = parse_index_specs(index)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    token = _read_token(token_file) if token_file is not None else \
        os.environ.get(token_env) or None
    try:
        config = ServerConfig(
            batcher=BatcherConfig(max_batch, max_wait_ms, max_queue),
            max_queries_per_request=max_queries_per_request,
            limits=QueryLimits(max_query_chars=max_query_chars,
                               max_entities_per_query=max_entities_per_query,
                               max_entity_chars=max_entity_chars, max_top_k=max_top_k),
            token=token,
            mcp=mcp,
            max_ircot_steps=max_ircot_steps,
            ui=ui,
            writes=replace(_WRITES, max_passages_per_request=max_write_passages,
                           max_body_bytes=max_write_bytes,
                           writes_per_second=writes_per_second),
            allowed_hosts=LOOPBACK_HOSTS if _is_loopback(host) else ("*",),
            cost=CostLimits() if max_request_cost is None else CostLimits(max_request_cost),
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    if token is None and not _is_loopback(host):
        typer.echo(
            f"warning: serving on {host} without a token; set {token_env} to require one",
            err=True,
        )
    if writable and token is None:
        raise typer.BadParameter(f"--writable needs a token: set {token_env} or --token-file")
    if writable and len({p.resolve() for p in indexes.values()}) < len(indexes):
        raise typer.BadParameter("--writable: one directory is given under two names; each "
                                 "index's writes switch only its own name's queries")
    # One spec per index, each opened into its own searcher (and query encoder). Warm-up loads
    # the query encoder and builds the solvers before serving, so /readyz means ready and the
    # first client does not pay for it.
    specs: dict[str, SearcherSpec] = {}
    for name, path in indexes.items():
        try:
            specs[name] = SearcherSpec(path, device=device, precision=precision,
                                       query_precision=query_precision,
                                       query_backend=query_backend, threads=threads,
                                       warm_up=warmup, encoder_model=encoder)
        except ValueError as e:
            raise typer.BadParameter(f"--index {path}: {e}") from e
    if ray is not None:
        reasoning = None if llm is None else reasoner_spec(
            llm, dataset=dataset, prompt_file=ircot_prompt, max_passages=ircot_passages)
        _serve_on_ray(ray, specs, config, writable=writable, host=host, port=port,
                      replicas=replicas, cpus=cpus_per_replica, gpus=gpus_per_replica,
                      reasoning=reasoning)
        return
    holders: dict[str, SearcherHolder] = {}
    for name, spec in specs.items():
        path = spec.index
        typer.echo(f"loading index {name!r} from {path} on {device} ({precision}) ...", err=True)
        try:
            searcher = spec.open()
        except ValueError as e:
            raise typer.BadParameter(f"--index {path}: {e}") from e
        holders[name] = SearcherHolder(
            searcher, path if writable else None, device=device, llm=llm,
            llm_cache=path.parent / f"{path.name}.llm-cache.sqlite")
        del searcher  # the holder's alone: a write's switch drops it (this frame lives on)
    reasoner = None
    if llm is not None:  # IRCoT thoughts, cached beside the first index
        first = next(iter(indexes.values()))
        reasoner = make_reasoner(llm, first.parent / f"{first.name}.llm-cache.sqlite",
                                 dataset=dataset, prompt_file=ircot_prompt,
                                 max_passages=ircot_passages)
    try:
        app = create_app(holders, config, reasoner=reasoner)
    except ImportError as e:  # --mcp without the mcp extra
        raise typer.BadParameter(str(e)) from e
    if ui:
        typer.echo(f"explorer page: http://{host}:{port}/ui/", err=True)
    # uvicorn stops accepting on SIGINT/SIGTERM, waits for open requests (at most 30 s), then the
    # app's lifespan drains the batcher.
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=30)
    finally:
        if reasoner is not None:
            reasoner.close()


def _serve_on_ray(address: str, specs: Mapping[str, SearcherSpec], config: ServerConfig, *,
                  writable: bool, host: str, port: int, replicas: int, cpus: float,
                  gpus: float, reasoning: ReasonerSpec | None) -> None:
    """`serve --ray`: the same app on Ray Serve replicas (hippo_gpu.distributed.ray_serve),
    each opening the one index's spec (an absolute path; threads: the replica's Ray CPUs,
    rounded, at least 1, unless --threads is given)."""
    if len(specs) != 1:
        raise typer.BadParameter("--ray serves one index: give a single --index DIR")
    if writable:
        raise typer.BadParameter("--writable is not available with --ray: a write would change "
                                 "one replica's index only")
    (spec,) = specs.values()
    spec = replace(spec, index=spec.index.resolve(),
                   threads=spec.threads or max(1, round(cpus)))
    try:
        from hippo_gpu.distributed.ray_serve import serve_until_signal

        serve_until_signal(address, spec, config, host=host, port=port, replicas=replicas,
                           cpus_per_replica=cpus, gpus_per_replica=gpus, reasoning=reasoning,
                           say=lambda line: typer.echo(line, err=True))
    except (ImportError, ValueError, FileNotFoundError, ConnectionError) as e:
        raise typer.BadParameter(f"--ray {address}: {e}") from e


def _read_token(path: Path) -> str:
    """The first line of `path`, stripped. Errors name the file, never its contents."""
    try:
        first = path.read_bytes().decode("utf-8").partition("\n")[0].strip()
    except OSError as e:
        raise typer.BadParameter(f"--token-file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise typer.BadParameter(f"--token-file {path}: not UTF-8 text") from None
    if not first:
        raise typer.BadParameter(f"--token-file {path}: the first line is blank")
    return first


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
