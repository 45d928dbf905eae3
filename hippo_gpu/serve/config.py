"""What a server enforces: the per-query limits every transport shares, and the HTTP server's
config that owns them.

`QueryLimits` is the one statement of the per-query limits (characters, entities, top_k): the
HTTP request schema (serve/schema.py) and the MCP tools' input schemas (serve/mcp.py) are both
built from it. `WriteLimits` states those of the write routes (serve/writes.py: passages, keys and
characters per request in their schema; body bytes and writes per second enforced before it).
`CostLimits` states the work one request may ask for (serve/budget.py estimates it; HTTP answers
413 beyond it, MCP a tool error). `ServerConfig` holds them beside what only HTTP has: how many
queries one request may carry, the micro-batcher's limits, the bearer token, the Host names a
server without a token answers, and whether /mcp is served.

`ServeOptions` is how `hippo-gpu serve` starts a server around a `ServerConfig`: the indexes to
open, the address, writes, the LLM, and Ray Serve's replicas (`RayServeOptions`) or none. The
command builds it once from its options and hands it to what starts the server: uvicorn
(cli/serve.py) or Ray Serve (hippo_gpu.distributed.ray_serve).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hippo_gpu.serve.batcher import BatcherConfig
from hippo_gpu.serve.write_limits import WriteLimits

if TYPE_CHECKING:
    from hippo_gpu.retrieval.spec import SearcherSpec

__all__ = ["LOOPBACK_HOSTS", "CostLimits", "QueryLimits", "RayServeOptions", "ServeOptions",
           "ServerConfig", "WriteLimits"]

# The Host names (any port) a server without a token answers by default (serve/guards.HostGuard).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class QueryLimits:
    """Per-query limits every transport enforces (HTTP: in the schema; MCP: in the tool's).

    Attributes:
        max_query_chars: most characters (code points) in one query.
        max_entities_per_query: most entity strings given for one query.
        max_entity_chars: most characters in one entity string.
        max_top_k: largest accepted top_k.
    """

    max_query_chars: int = 2_000
    max_entities_per_query: int = 16
    max_entity_chars: int = 200
    max_top_k: int = 1_000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_positive(f.name, getattr(self, f.name))


@dataclass(frozen=True)
class CostLimits:
    """The work one retrieve or explain request may ask for, every transport alike.

    The schema bounds each factor (queries, characters, entities, top_k, IRCoT steps) but not
    their product: 64 explained queries at top_k 999 are schema-valid and ran past 10 s on
    musique. So a request is estimated before it is queued (serve/budget.request_cost, which
    states the formula and its calibration; one work unit is about a millisecond of the
    calibration machine) and refused at once when the estimate is over `max_request_cost`:
    HTTP 413 naming the estimate and the limit, an MCP tool error.

    Attributes:
        max_request_cost: the most work units one request may ask for. The default admits what
            answered within ~5 s on the calibration machine (a 2-core VM, musique); a faster
            machine can afford more, a larger index less.
    """

    max_request_cost: int = 5_000

    def __post_init__(self) -> None:
        _check_positive("max_request_cost", self.max_request_cost)


@dataclass(frozen=True)
class ServerConfig:
    """Server limits; each per-field one is also in the OpenAPI schema (violations -> 422), the
    work budget (`cost`, a product of fields) is checked after it (413).

    Attributes:
        batcher: micro-batching limits (max_batch, max_wait_ms, max_queue).
        max_queries_per_request: most queries in one request.
        limits: the per-query limits (characters, entities, top_k), shared with /mcp.
        token: bearer token required on /v1/*, /metrics and /mcp (visible ASCII, no spaces);
            None serves without authentication.
        mcp: serve the MCP tools at /mcp: None when the `mcp` package is installed, True always
            (ImportError without it), False never.
        max_ircot_steps: largest `ircot.max_steps` of a retrieve request (a server with an LLM).
        ui: serve the explorer page at /ui (its static files; every request it makes goes to
            /v1/*, behind the token).
        writes: the limits of the write routes (served with a token and a writable index).
        cost: the work budget of one retrieve or explain request (HTTP: 413 beyond it).
        allowed_hosts: the Host names (any port) a server without a token answers, so a web
            page cannot reach it through a DNS name rebound to this machine; ("*",) answers
            any (the CLI's choice when it binds a non-loopback address). A server with a token
            answers any Host: the token is the guard.
    """

    batcher: BatcherConfig = dataclasses.field(default_factory=BatcherConfig)
    max_queries_per_request: int = 64
    limits: QueryLimits = dataclasses.field(default_factory=QueryLimits)
    token: str | None = dataclasses.field(default=None, repr=False)
    mcp: bool | None = None
    max_ircot_steps: int = 8
    ui: bool = True
    writes: WriteLimits = dataclasses.field(default_factory=WriteLimits)
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    cost: CostLimits = dataclasses.field(default_factory=CostLimits)

    def __post_init__(self) -> None:
        _check_positive("max_queries_per_request", self.max_queries_per_request)
        _check_positive("max_ircot_steps", self.max_ircot_steps)
        if self.max_queries_per_request > self.batcher.max_queue:
            # Such a request could never be queued: it would always get 429.
            raise ValueError(
                f"max_queries_per_request ({self.max_queries_per_request}) exceeds max_queue "
                f"({self.batcher.max_queue})"
            )
        if self.token is not None and not (self.token.isascii() and self.token.isprintable()
                                           and self.token and " " not in self.token):
            # A header value is bytes: a token outside visible ASCII would compare as one
            # encoding on /v1/* and another on /mcp. The message never shows the token.
            raise ValueError("token must be None or visible ASCII characters (no spaces)")
        if not self.allowed_hosts:
            raise ValueError("allowed_hosts must name at least one host (or be (\"*\",))")

    @property
    def max_body_bytes(self) -> int:
        """Largest accepted request body: the largest schema-valid request, fully escaped.

        A character costs at most 12 bytes of JSON ("\\ud83d\\ude00", a surrogate pair); each
        string or list gets 64 bytes for quotes, separators and spacing, and the other fields
        4 KiB.
        """
        lim = self.limits
        per_query = 12 * lim.max_query_chars + 64
        per_entity_list = lim.max_entities_per_query * (12 * lim.max_entity_chars + 64) + 64
        return self.max_queries_per_request * (per_query + per_entity_list) + 4_096


@dataclass(frozen=True)
class RayServeOptions:
    """`serve --ray`: the cluster to join and the replicas to run (each opens the one index).

    Attributes:
        address: "local" starts Ray here; "auto" or HOST:PORT joins a cluster.
        replicas: Ray Serve replicas, each holding one loaded index.
        cpus_per_replica, gpus_per_replica: the Ray resources one replica reserves (its torch
            threads: the index spec's, else these CPUs rounded, at least 1).
    """

    address: str
    replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0


@dataclass(frozen=True)
class ServeOptions:
    """How `hippo-gpu serve` starts a server: built once from the command's options, handed to
    what starts it (uvicorn here, or Ray Serve replicas).

    Attributes:
        indexes: name -> how to open that index (device, precisions, threads, warm-up, query
            encoder), in serving order: the first is the default.
        server: what every transport enforces, and the token (ServerConfig).
        host, port: the address to bind (with Ray: Serve's HTTP proxy's).
        log_level: uvicorn's log level.
        writable: serve POST / DELETE /v1/passages on each index (the server needs a token).
        llm: the LLM spec (None: none): writes IRCoT thoughts and, when writable, extracts
            OpenIE for passages posted without triples.
        ircot_prompt: the IRCoT prompt file (None: the dataset's prompt).
        dataset: the dataset whose IRCoT prompt to use (None: the generic one).
        ircot_passages: passages shown to the LLM per thought (None: all top_k).
        ray: serve on Ray Serve replicas; None serves here, under uvicorn.
    """

    indexes: Mapping[str, SearcherSpec]
    server: ServerConfig
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    writable: bool = False
    llm: str | None = None
    ircot_prompt: Path | None = None
    dataset: str | None = None
    ircot_passages: int | None = None
    ray: RayServeOptions | None = None

    def __post_init__(self) -> None:
        if not self.indexes:
            raise ValueError("serve at least one index")


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
