"""The HTTP query server replicated on Ray Serve (`hippo-gpu serve --ray ADDRESS --replicas N`).

`serve --ray` hands its `ServeOptions` (hippo_gpu.serve.config: the one index's spec, the
ServerConfig, the address, the replicas as `RayServeOptions`) to `serve_until_signal`, as the
plain command hands them to uvicorn. Each replica is one Ray actor that opens the searcher once
(`SearcherSpec.open()`: the index loaded, the searcher warmed up) and serves the plain server's
FastAPI app, built in the replica by `hippo_gpu.serve.server.create_app(searcher, config)`; its
constructor takes three frozen values, pickled by Ray: the SearcherSpec (what to open), the
ServerConfig (how to serve) and the ReasonerSpec or None (IRCoT's thought source). So every
replica keeps everything the plain server does, unchanged: the request schema and its limits
(422), the body-size guard (413), bearer auth (401), the micro-batcher
(hippo_gpu/serve/batcher.py: batches grouped by hippo_gpu.serve.service.BatchKey, an error
reaching only the request that caused it, 429 when its queue is full) and /healthz,
/readyz, /v1/stats, /openapi.json. Ray Serve's own `@serve.batch`
is not used: it sets one error on every request of a batch and cannot group by mode and top_k.

    client --HTTP--> Ray Serve proxy (host:port) --> replica 1: create_app(searcher_1, config)
                                                 --> replica 2: create_app(searcher_2, config) ...

The app is built late (`serve.ingress()` with `__serve_build_asgi_app__`), after the replica's
constructor has loaded the index, and Ray Serve runs the app's lifespan (which starts and, at
shutdown, drains the batcher) on the replica's event loop.

Per replica, not per deployment: the batcher, its queue limit and /v1/stats (a request reaches
one replica; its counters are that replica's). The proxy spreads requests over the replicas;
`max_ongoing_requests` is set to the batcher's queue plus one batch, so Ray lets every request
the batcher could hold through to it and a full replica answers 429 itself.

Shared storage. Every replica reads the index directory at the same path: on a cluster of several
machines it must be on storage every node mounts there (NFS, a cluster file system). Writes are
not served (`--writable` would change one replica's index only).

IRCoT ("ircot" in a retrieve request): with a `ReasonerSpec` each replica opens its own thought
source (its own LLM client), without a thought cache unless the spec names one: one SQLite file
shared by replicas on several machines over network storage is not safe.

A lost node. Serve's controller replaces a replica whose node died, once the cluster declares
the node dead (about 15 s with Ray's default health checks) and the new replica has loaded the
index; the proxy stops routing to the dead replica as soon as it learns of its death, so with
two replicas or more the others answer meanwhile. A request that was in flight on the lost
replica gets a 500 from Serve's proxy (retrieval is read-only: a client may simply retry). The
replacement needs room on the remaining nodes (cpus_per_replica). Measured by
benchmarks/bench_node_loss.py, checked by tests/distributed/test_ray_multinode.py.

The bearer token travels to the replicas inside the deployment's (pickled) constructor
arguments, never through environment variables, which Ray shows in its dashboard.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

try:
    from ray import serve
except ImportError as e:
    raise ImportError("serve --ray needs Ray Serve: pip install 'hippo-gpu[ray]'") from e

from hippo_gpu.llm.ircot import ReasonerSpec
from hippo_gpu.retrieval.spec import SearcherSpec
from hippo_gpu.serve.config import RayServeOptions, ServeOptions
from hippo_gpu.serve.server import ServerConfig, create_app
from hippo_gpu.storage.directory import read_manifest

__all__ = ["ServeHandle", "deploy", "replica_application", "replica_spec", "serve_until_signal"]

log = logging.getLogger(__name__)

APP_NAME = "hippo-gpu"


@serve.ingress()
class HippoReplica:
    """One replica: the searcher opened once, served by the plain server's app.

    Args:
        spec: what the replica opens (its index path readable on every node; warm it up, as
            the plain server does, so /readyz means ready and the first client does not pay).
        config: the server's limits and token.
        reasoning: the IRCoT thought source each replica opens ("ircot" requests), or None
            (such requests get the plain server's 422).
    """

    def __init__(self, spec: SearcherSpec, config: ServerConfig,
                 reasoning: ReasonerSpec | None = None) -> None:
        t0 = time.perf_counter()
        self.searcher = spec.open()
        self.config = config
        self.reasoner = reasoning.open() if reasoning is not None else None
        log.info("replica loaded %s in %.1f s", spec.index, time.perf_counter() - t0)

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self.searcher, self.config, reasoner=self.reasoner)

    def __del__(self) -> None:  # Serve calls it when it stops the replica
        reasoner = getattr(self, "reasoner", None)
        if reasoner is not None:
            reasoner.close()


def replica_application(spec: SearcherSpec, config: ServerConfig | None = None, *,
                        replicas: int = 1, cpus_per_replica: float = 1.0,
                        gpus_per_replica: float = 0.0,
                        reasoning: ReasonerSpec | None = None) -> Any:
    """The Ray Serve application (`serve.run` it): `replicas` copies of
    HippoReplica(spec, config, reasoning).

    Args:
        spec: what every replica opens.
        config: how every replica serves (default: ServerConfig()).
        replicas: number of replicas (each holds one loaded index).
        cpus_per_replica, gpus_per_replica: Ray resources of one replica.
        reasoning: what every replica opens to answer "ircot" requests (None: 422).
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if cpus_per_replica < 0 or gpus_per_replica < 0:
        raise ValueError("cpus_per_replica and gpus_per_replica must be >= 0")
    config = config or ServerConfig()
    batcher = config.batcher
    deployment = serve.deployment(
        name="HippoReplica",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
        # Every request the replica's batcher could hold (its queue plus the running batch)
        # reaches it, so a full replica answers 429 with Retry-After, as the plain server.
        max_ongoing_requests=batcher.max_queue + batcher.max_batch,
        # As the plain server: open requests get up to 30 s to finish at shutdown.
        graceful_shutdown_timeout_s=30,
    )(HippoReplica)
    return deployment.bind(spec, config, reasoning)


@dataclass
class ServeHandle:
    """A running deployment: its URL, and `stop()` to remove it (and Serve, if we started it)."""

    url: str
    name: str
    started_serve: bool

    def stop(self) -> None:
        serve.delete(self.name)
        if self.started_serve:
            serve.shutdown()


def replica_spec(options: ServeOptions) -> SearcherSpec:
    """What every replica opens: the options' one index at its absolute path (replicas run in
    other working directories), with the spec's threads, else the replica's Ray CPUs rounded
    (at least 1).

    Raises:
        ValueError: the options serve no Ray (`options.ray` is None) or several indexes.
    """
    ray_options = _ray_options(options)
    if len(options.indexes) != 1:
        raise ValueError("Ray Serve replicas serve one index")
    (spec,) = options.indexes.values()
    return replace(spec, index=spec.index.resolve(),
                   threads=spec.threads or max(1, round(ray_options.cpus_per_replica)))


def deploy(options: ServeOptions, reasoning: ReasonerSpec | None = None, *,
           name: str = APP_NAME) -> ServeHandle:
    """Deploy the server of `options` (its `ray` replicas of `replica_spec(options)`, serving
    `options.server`) on the connected Ray cluster and wait until every replica is ready;
    `reasoning` is the thought source each replica opens (None: "ircot" requests get 422).

    Serve's HTTP proxy listens on options.host:options.port when this call starts Serve; when
    Serve already runs on the cluster, its proxy keeps the address it has (ValueError if that
    differs).

    Raises:
        FileNotFoundError: the index directory does not exist here.
        IndexFormatError: it is not a hippo-gpu index.
        ValueError: not one index, or Serve already runs with another proxy address.
        RuntimeError: a replica failed to start (Ray's message says why).
    """
    spec, ray_options = replica_spec(options), _ray_options(options)
    host, port = options.host, options.port
    _check_index(spec.index)
    running = _serve_http_address()
    if running is not None and running != (host, port):
        raise ValueError(f"Ray Serve already runs on this cluster with its proxy on "
                         f"{running[0]}:{running[1]}, not {host}:{port}; use that address or "
                         "another cluster")
    if running is None:
        serve.start(http_options={"host": host, "port": port})
    app = replica_application(spec, options.server, replicas=ray_options.replicas,
                              cpus_per_replica=ray_options.cpus_per_replica,
                              gpus_per_replica=ray_options.gpus_per_replica, reasoning=reasoning)
    try:
        serve.run(app, name=name, route_prefix="/")
    except BaseException:
        if running is None:
            serve.shutdown()
        raise
    return ServeHandle(url=f"http://{host}:{port}", name=name, started_serve=running is None)


def serve_until_signal(options: ServeOptions, reasoning: ReasonerSpec | None = None, *,
                       say: Callable[[str], None] = print) -> None:
    """`hippo-gpu serve --ray ADDRESS`: connect to (or, for "local", start) Ray at
    `options.ray.address`, deploy, serve until SIGINT or SIGTERM, then remove the deployment
    (Ray Serve lets open requests finish) and stop what this call started."""
    from hippo_gpu.distributed.cluster import connect

    spec, ray_options = replica_spec(options), _ray_options(options)
    _check_index(spec.index)
    # A signal during the deployment is honoured once it is up (then removed at once), so an
    # interrupted start never leaves replicas behind.
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    started_ray = False
    try:
        started_ray = connect(ray_options.address)
        handle = deploy(options, reasoning)
        try:
            say(f"serving {spec.index} on {handle.url} with {ray_options.replicas} Ray Serve "
                "replicas; Ctrl-C stops")
            while not stop.wait(0.5):
                pass
        finally:
            handle.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if started_ray:
            import ray

            ray.shutdown()


def _ray_options(options: ServeOptions) -> RayServeOptions:
    if options.ray is None:
        raise ValueError("these ServeOptions serve here, not on Ray (their `ray` is None)")
    return options.ray


def _check_index(index: Path) -> None:
    """Refuse what no replica could load, here and at once, not from every replica's start."""
    if not index.is_dir():
        raise FileNotFoundError(f"{index}: no such index directory")
    if not index.is_absolute():
        raise ValueError(f"{index}: give the index directory as an absolute path (replicas run "
                         "in other working directories)")
    read_manifest(index)  # IndexFormatError naming the path when it is not an index


def _serve_http_address() -> tuple[str, int] | None:
    """(host, port) of the Serve proxy already running on the connected cluster, else None.

    Read from Serve's controller client (`serve.status()` does the same lookup but does not
    report the proxy's address); None when no Serve controller runs.
    """
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    if client is None:
        return None
    http = client.http_config
    return str(http.host), int(http.port)
