"""`hippo-gpu serve`: load an index once and serve it over HTTP with micro-batching.

The bearer token is read here, from --token-file (its first line) or else the environment
variable named by --token-env, and handed to the server config; library code never reads the
environment, and nothing prints the token. With a token, the OpenAPI schema declares bearer
security on /v1/*; without one it declares none. Loopback is the default host; a server without
a token on a loopback address answers only loopback Host names (DNS rebinding), one bound
elsewhere answers any. Every request limit below is part of the served OpenAPI schema (see
hippo_gpu.serve.schema).

The options are checked and built once into a `ServeOptions` (hippo_gpu.serve.config: the
indexes' SearcherSpecs, the ServerConfig, the address, the LLM, Ray's replicas), which goes to
what starts the server: uvicorn here (`_serve_here`) or Ray Serve
(hippo_gpu.distributed.ray_serve.serve_until_signal).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
from hippo_gpu.serve.config import (
    LOOPBACK_HOSTS,
    CostLimits,
    QueryLimits,
    RayServeOptions,
    ServeOptions,
    ServerConfig,
    WriteLimits,
)

if TYPE_CHECKING:
    from hippo_gpu.retrieval.spec import SearcherSpec
    from hippo_gpu.serve.holder import SearcherHolder

log = logging.getLogger(__name__)

DEFAULT_TOKEN_ENV = "HIPPO_GPU_TOKEN"
_LIMITS = QueryLimits()  # the flags' defaults
_WRITES = WriteLimits()

# The command's options, in the order of its signature, which gives their defaults.
_Index = Annotated[list[str], typer.Option(
    "--index", help="index directory (from `build`), or NAME=DIR; repeat to serve several (the "
                    "first is the default)")]
_Host = Annotated[str, typer.Option(help="bind address; loopback by default")]
_Port = Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0 picks a free one)")]
_Device = Annotated[str, typer.Option(help=f"one of {DEVICE_CHOICES} or e.g. cuda:1")]
_MaxBatch = Annotated[int, typer.Option(min=1, help="most queries per batched retrieve (1: off)")]
_MaxWaitMs = Annotated[float, typer.Option(min=0.0, help="longest wait for a batch to fill")]
_MaxQueue = Annotated[int, typer.Option(min=1, help="most waiting queries; beyond -> 429")]
_MaxQueries = Annotated[int, typer.Option(min=1, help="beyond -> 422 (in the schema)")]
_MaxQueryChars = Annotated[int, typer.Option(min=1, help="longer queries -> 422 (in the schema)")]
_MaxEntities = Annotated[int, typer.Option(
    min=1, help="more entities for one query -> 422 (in the schema)")]
_MaxEntityChars = Annotated[int, typer.Option(
    min=1, help="longer entities -> 422 (in the schema)")]
_MaxTopK = Annotated[int, typer.Option(min=1, help="larger top_k -> 422 (in the schema)")]
_MaxRequestCost = Annotated[int | None, typer.Option(
    min=1, help="work budget of one retrieve or explain request, in estimated units (~ms of the "
                "calibration machine: hippo_gpu/serve/budget.py; queries x (text + top_k x mode "
                "weight) x IRCoT steps); beyond -> 413 (default: CostLimits' 5000, ~5 s on a "
                "2-core VM)")]
_TokenEnv = Annotated[str, typer.Option(
    help="env var holding the bearer token; unset or empty: no auth")]
_TokenFile = Annotated[Path | None, typer.Option(
    help="file whose first line is the bearer token (instead of --token-env)")]
_MaxWritePassages = Annotated[int, typer.Option(
    min=1, help="--writable: most passages per insert; beyond -> 422 (in the schema)")]
_MaxWriteBytes = Annotated[int, typer.Option(
    min=1, help="--writable: largest write body; beyond -> 413")]
_WritesPerSecond = Annotated[float, typer.Option(
    min=0.001, help="--writable: sustained write requests per second; beyond -> 429")]
_Threads = Annotated[int | None, typer.Option(
    min=1, help="torch CPU threads (default: torch's)")]
_Precision = Annotated[str, typer.Option(
    help="embedding/score precision on the device: float32 | float16 | bfloat16")]
_QueryPrecision = Annotated[str | None, typer.Option(
    help="query encoder precision (default: the index's); bfloat16 is faster only on CPUs with "
         "AMX and makes rankings depend on the batch (README)")]
_QueryBackend = Annotated[str, typer.Option(
    help="query encoder: auto (ONNX Runtime when installed and at parity) | torch | onnx")]
_Encoder = Annotated[str | None, typer.Option(help=QUERY_ENCODER_HELP)]
_Writable = Annotated[bool, typer.Option(
    help="serve POST/DELETE /v1/passages (needs a token): writes commit new index versions and "
         "queries switch to each one atomically")]
_Llm = Annotated[str | None, typer.Option(
    help="LLM: writes IRCoT thoughts (requests with \"ircot\") and, with --writable, extracts "
         "OpenIE for passages posted without triples")]
_Warmup = Annotated[bool, typer.Option(help="run one query per mode before accepting requests")]
_Mcp = Annotated[bool | None, typer.Option(
    "--mcp/--no-mcp", help="MCP tools at /mcp (default: when the mcp extra is installed)")]
_Ui = Annotated[bool, typer.Option(
    "--ui/--no-ui", help="the explorer page at /ui (its requests carry the token)")]
_LogLevel = Annotated[str, typer.Option(help="uvicorn log level")]
_Ray = Annotated[str | None, typer.Option(
    "--ray", metavar="ADDRESS|local",
    help="serve on Ray Serve: 'local' starts Ray here, 'auto' or HOST:PORT joins a cluster; each "
         "replica loads the index (on storage every node reads) and runs this server")]
_Replicas = Annotated[int, typer.Option(min=1, help="--ray: replicas, each holding one index")]
_CpusPerReplica = Annotated[float, typer.Option(min=0.0, help="--ray: Ray CPUs per replica")]
_GpusPerReplica = Annotated[float, typer.Option(min=0.0, help="--ray: GPUs per replica")]
_MaxIrcotSteps = Annotated[int, typer.Option(
    min=1, help="largest ircot.max_steps; beyond -> 422")]
_IrcotPrompt = Annotated[Path | None, typer.Option(help=PROMPT_HELP)]
_Dataset = Annotated[str | None, typer.Option(help=DATASET_HELP)]
_IrcotPassages = Annotated[int | None, typer.Option(min=0, help=PASSAGES_HELP)]


def register(app: typer.Typer) -> None:
    """Add the `serve` command to the `hippo-gpu` Typer app."""
    app.command("serve")(serve)


def serve(
    index: _Index,
    host: _Host = "127.0.0.1",
    port: _Port = 8000,
    device: _Device = "auto",
    max_batch: _MaxBatch = 64,
    max_wait_ms: _MaxWaitMs = 5.0,
    max_queue: _MaxQueue = 1024,
    max_queries_per_request: _MaxQueries = 64,
    max_query_chars: _MaxQueryChars = _LIMITS.max_query_chars,
    max_entities_per_query: _MaxEntities = _LIMITS.max_entities_per_query,
    max_entity_chars: _MaxEntityChars = _LIMITS.max_entity_chars,
    max_top_k: _MaxTopK = _LIMITS.max_top_k,
    max_request_cost: _MaxRequestCost = None,
    token_env: _TokenEnv = DEFAULT_TOKEN_ENV,
    token_file: _TokenFile = None,
    max_write_passages: _MaxWritePassages = _WRITES.max_passages_per_request,
    max_write_bytes: _MaxWriteBytes = _WRITES.max_body_bytes,
    writes_per_second: _WritesPerSecond = _WRITES.writes_per_second,
    threads: _Threads = None,
    precision: _Precision = "float32",
    query_precision: _QueryPrecision = None,
    query_backend: _QueryBackend = "auto",
    encoder: _Encoder = None,
    writable: _Writable = False,
    llm: _Llm = None,
    warmup: _Warmup = True,
    mcp: _Mcp = None,
    ui: _Ui = True,
    log_level: _LogLevel = "info",
    ray: _Ray = None,
    replicas: _Replicas = 1,
    cpus_per_replica: _CpusPerReplica = 1.0,
    gpus_per_replica: _GpusPerReplica = 0.0,
    max_ircot_steps: _MaxIrcotSteps = 8,
    ircot_prompt: _IrcotPrompt = None,
    dataset: _Dataset = None,
    ircot_passages: _IrcotPassages = None,
) -> None:
    """Serve POST /v1/retrieve, /v1/explain, /v1/stats, /v1/indexes, /metrics, /mcp, /ui,
    /healthz, /readyz and /docs for one or several indexes."""
    from hippo_gpu.retrieval.options import SearcherOptions
    from hippo_gpu.retrieval.spec import SearcherSpec
    from hippo_gpu.serve.service import parse_index_specs

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
            token=token, mcp=mcp, max_ircot_steps=max_ircot_steps, ui=ui,
            writes=replace(_WRITES, max_passages_per_request=max_write_passages,
                           max_body_bytes=max_write_bytes, writes_per_second=writes_per_second),
            allowed_hosts=LOOPBACK_HOSTS if _is_loopback(host) else ("*",),
            cost=CostLimits() if max_request_cost is None else CostLimits(max_request_cost))
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    _check_access(indexes, config, host=host, token_env=token_env, writable=writable)
    options = ServeOptions(
        _searcher_specs(indexes, functools.partial(
            SearcherSpec, device=device, precision=precision, threads=threads, warm_up=warmup,
            encoder_model=encoder, options=SearcherOptions(query_precision=query_precision,
                                                           query_backend=query_backend))),
        config, host=host, port=port, log_level=log_level, writable=writable, llm=llm,
        ircot_prompt=ircot_prompt, dataset=dataset, ircot_passages=ircot_passages,
        ray=None if ray is None else RayServeOptions(ray, replicas, cpus_per_replica,
                                                     gpus_per_replica))
    if options.ray is not None:
        _serve_on_ray(options)
    else:
        _serve_here(options)


def _check_access(indexes: Mapping[str, Path], config: ServerConfig, *, host: str,
                  token_env: str, writable: bool) -> None:
    """Warn about a server open to the network without a token; refuse writes without one, or
    to one directory under two names."""
    if config.token is None and not _is_loopback(host):
        typer.echo(
            f"warning: serving on {host} without a token; set {token_env} to require one",
            err=True,
        )
    if writable and config.token is None:
        raise typer.BadParameter(f"--writable needs a token: set {token_env} or --token-file")
    if writable and len({p.resolve() for p in indexes.values()}) < len(indexes):
        raise typer.BadParameter("--writable: one directory is given under two names; each "
                                 "index's writes switch only its own name's queries")


def _searcher_specs(indexes: Mapping[str, Path],
                    spec: functools.partial[SearcherSpec]) -> dict[str, SearcherSpec]:
    """One spec per index (`spec` given its directory), each opened into its own searcher (and
    query encoder). Warm-up loads the query encoder and builds the solvers before serving, so
    /readyz means ready and the first client does not pay for it."""
    specs: dict[str, SearcherSpec] = {}
    for name, path in indexes.items():
        try:
            specs[name] = spec(path)
        except ValueError as e:
            raise typer.BadParameter(f"--index {path}: {e}") from e
    return specs


def _serve_here(options: ServeOptions) -> None:
    """Open every index, then serve the app with uvicorn until SIGINT or SIGTERM: uvicorn stops
    accepting, waits for open requests (at most 30 s), then the app's lifespan drains the
    batchers."""
    import uvicorn

    from hippo_gpu.serve.server import create_app

    holders = _open_holders(options)
    reasoner = None
    if options.llm is not None:  # IRCoT thoughts, cached beside the first index
        first = next(iter(options.indexes.values())).index
        reasoner = make_reasoner(options.llm, first.parent / f"{first.name}.llm-cache.sqlite",
                                 dataset=options.dataset, prompt_file=options.ircot_prompt,
                                 max_passages=options.ircot_passages)
    try:
        try:
            app = create_app(holders, options.server, reasoner=reasoner)
        except ImportError as e:  # --mcp without the mcp extra
            raise typer.BadParameter(str(e)) from e
        if options.server.ui:
            typer.echo(f"explorer page: http://{options.host}:{options.port}/ui/", err=True)
        uvicorn.run(app, host=options.host, port=options.port, log_level=options.log_level,
                    timeout_graceful_shutdown=30)
    finally:
        if reasoner is not None:
            reasoner.close()


def _open_holders(options: ServeOptions) -> dict[str, SearcherHolder]:
    """Each index opened and held (writable: with its directory, so writes commit there;
    read-only: following the versions `hippo-gpu insert`, `delete`, `compact` or `index
    --replace` commit, each answer naming its version)."""
    from hippo_gpu.serve.holder import SearcherHolder
    from hippo_gpu.serve.writes import WritableHolder

    holders: dict[str, SearcherHolder] = {}
    for name, spec in options.indexes.items():
        path = spec.index
        typer.echo(f"loading index {name!r} from {path} on {spec.device} ({spec.precision}) ...",
                   err=True)
        try:
            searcher = spec.open()
        except ValueError as e:
            raise typer.BadParameter(f"--index {path}: {e}") from e
        if options.writable:
            holders[name] = WritableHolder(
                searcher, path, device=spec.device, llm=options.llm,
                llm_cache=path.parent / f"{path.name}.llm-cache.sqlite")
        else:  # follows the versions other processes commit (serve/holder.py)
            holders[name] = SearcherHolder(searcher)
            holders[name].follow()
        del searcher  # the holder's alone: a write's switch drops it (this frame lives on)
    return holders


def _serve_on_ray(options: ServeOptions) -> None:
    """`serve --ray`: the same app on Ray Serve replicas (hippo_gpu.distributed.ray_serve),
    each opening the one index (its thought source, if any, without a cache)."""
    assert options.ray is not None
    address = options.ray.address
    reasoning = None if options.llm is None else reasoner_spec(
        options.llm, dataset=options.dataset, prompt_file=options.ircot_prompt,
        max_passages=options.ircot_passages)
    if len(options.indexes) != 1:
        raise typer.BadParameter("--ray serves one index: give a single --index DIR")
    if options.writable:
        raise typer.BadParameter("--writable is not available with --ray: a write would change "
                                 "one replica's index only")
    try:
        from hippo_gpu.distributed.ray_serve import serve_until_signal

        serve_until_signal(options, reasoning, say=lambda line: typer.echo(line, err=True))
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
