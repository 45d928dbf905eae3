"""HTTP query server: validate -> micro-batch -> search. No retrieval logic lives here.

Endpoints (operationId in brackets):
    POST /v1/retrieve [retrieve]  {"queries": [str, ...], "entities": [[str, ...] per query],
                                   "top_k": int, "mode": str, "return_seeds": bool}
        -> {"results": [[{"key", "title", "text", "score", "rank"}, ...] per query],
            "seeds": [[[subject, predicate, object], ...] per query] | null}
        An optional "index" names the served index to ask (default: the first).
    GET  /v1/stats [stats]    index counts, queue depth, batches, mean batch size, latencies
                              (?index=NAME; default: the first index).
    GET  /v1/indexes [indexes]  {"indexes": [{"name", "version", "passages", "memory_bytes",
                              "device", "precision"}, ...]}, in serving order.
    GET  /metrics [metrics]   Prometheus text format (serve/metrics.py lists the names).
    GET  /healthz [healthz]   liveness: the process answers.
    GET  /readyz [readyz]     readiness: indexes loaded and batchers accepting (else 503).
    GET  /docs, /redoc, /openapi.json   the OpenAPI document and its viewers.
    /mcp                      the Model Context Protocol (streamable HTTP, serve/mcp.py) when the
                              `mcp` package is installed (ServerConfig.mcp); not in the OpenAPI
                              document, which describes the REST API only.

Several indexes: `create_app({"a": searcher_a, "b": searcher_b}, config)` serves each with its own
micro-batcher (serve/service.py); `create_app(searcher, config)` serves one, named "default".

The contract: the OpenAPI document states exactly what the server enforces, so a schema-valid
request gets 200 (or one of the documented 413 / 429 / 503, which depend on bytes and load, not on
the request's content) and a schema-invalid one gets 422. Every limit is therefore in the schema,
built from `ServerConfig`: 1..max_queries_per_request queries of 1..max_query_chars characters;
top_k in 1..max_top_k; mode in `config.MODES`; no other fields; types are strict (no "5" for 5).

- Whitespace-only text (a query or an entity) is refused: it asks nothing. "Whitespace" is
  Python's `str.isspace` set, spelled out code point by code point in the schema's `pattern` (see
  NONBLANK), so ECMA-262, Python `re` and Rust `regex` all read the pattern alike, and pydantic
  enforces that same pattern.
- `entities` (optional; null = absent) gives one list of entity strings per query (HippoRAG 1
  query NER, e.g. from hippo_gpu.llm.ner). hybrid fuses their entity ranking, hipporag1 is built
  on them and needs them (without: 422), dense and hipporag2 ignore them. hybrid without
  `entities` uses capitalised spans of each query instead (hippo_gpu.entities); a query whose
  list is empty gets no entity ranking (hybrid uses its dense ranking there, hipporag1 answers it
  with the dense ranking). JSON Schema cannot compare two array lengths, so the schema spells the
  rule out: an `anyOf` with one branch "no entities, mode not hipporag1" and one branch per
  allowed length n ("n queries and n entity lists").
- 413 is the body-size guard (`ServerConfig.max_body_bytes`, checked before parsing, declared or
  streamed). It is sized so that every schema-valid request, serialised with every character
  escaped (12 bytes for a non-BMP character as a surrogate pair), fits.
- 429 (with Retry-After) means the queue is full; 503 that the server is shutting down; 500 an
  internal error (a bug: short body, logged, no trace, no path).

Authentication: when `ServerConfig.token` is set, /v1/*, /metrics and /mcp need
`Authorization: Bearer <token>` (401 otherwise) and the schema declares HTTP bearer security on
exactly those operations; /healthz, /readyz and the docs stay open for probes. Without a token
the schema declares no security at all. The caller (the CLI) owns secrets: the token arrives in
`ServerConfig`, never from the environment here. Error bodies carry a short message only.

Batching: HTTP and MCP queries go through the same `RetrievalService` (serve/service.py states
the batching rule), one micro-batcher per index.
"""

from __future__ import annotations

import dataclasses
import hmac
import importlib.util
import logging
import math
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi import Query as QueryParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    create_model,
    model_validator,
)
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hippo_gpu.config import MODES
from hippo_gpu.search import Searcher
from hippo_gpu.serve.batcher import BatcherClosedError, BatcherConfig, QueueFullError
from hippo_gpu.serve.metrics import CONTENT_TYPE, IndexGauges, Metrics, MetricsMiddleware
from hippo_gpu.serve.service import (
    DEFAULT_INDEX,
    ENTITY_MODES,
    BatchKey,
    QueryLimits,
    RetrievalService,
    UnknownIndexError,
    check_index_name,
)
from hippo_gpu.serve.service import Query as Query  # re-exported: a query in the batcher
from hippo_gpu.serve.writes import SearcherHolder, write_router

log = logging.getLogger(__name__)

# The request schema's mode enum: exactly the modes retrieval accepts.
Mode = Literal[MODES]  # type: ignore[valid-type]

# Every code point with str.isspace() (tests check this list against all of Unicode).
WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# "Contains a character that is not whitespace", with every code point written as \\uXXXX so the
# pattern means the same in every regex dialect (JSON Schema patterns are searched, unanchored).
NONBLANK = "[^" + "".join(f"\\u{ord(c):04x}" for c in WHITESPACE) + "]"


@dataclass(frozen=True)
class ServerConfig:
    """Server limits; each one is also in the OpenAPI schema (violations -> 422).

    Attributes:
        batcher: micro-batching limits (max_batch, max_wait_ms, max_queue).
        max_queries_per_request: most queries in one request.
        max_query_chars: most characters (code points) in one query.
        max_entities_per_query: most entity strings given for one query.
        max_entity_chars: most characters in one entity string.
        max_top_k: largest accepted top_k.
        token: bearer token required on /v1/*, /metrics and /mcp; None serves without
            authentication.
        mcp: serve the MCP tools at /mcp: None when the `mcp` package is installed, True always
            (ImportError without it), False never.
    """

    batcher: BatcherConfig = dataclasses.field(default_factory=BatcherConfig)
    max_queries_per_request: int = 64
    max_query_chars: int = 2_000
    max_entities_per_query: int = 16
    max_entity_chars: int = 200
    max_top_k: int = 1_000
    token: str | None = dataclasses.field(default=None, repr=False)
    mcp: bool | None = None

    def __post_init__(self) -> None:
        for name in ("max_queries_per_request", "max_query_chars", "max_entities_per_query",
                     "max_entity_chars", "max_top_k"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queries_per_request > self.batcher.max_queue:
            # Such a request could never be queued: it would always get 429.
            raise ValueError(
                f"max_queries_per_request ({self.max_queries_per_request}) exceeds max_queue "
                f"({self.batcher.max_queue})"
            )
        if self.token is not None and not self.token.strip():
            raise ValueError("token must be None or a non-blank string")

    @property
    def query_limits(self) -> QueryLimits:
        return QueryLimits(max_query_chars=self.max_query_chars,
                           max_entities_per_query=self.max_entities_per_query,
                           max_entity_chars=self.max_entity_chars, max_top_k=self.max_top_k)

    @property
    def max_body_bytes(self) -> int:
        """Largest accepted request body: the largest schema-valid request, fully escaped.

        A character costs at most 12 bytes of JSON ("\\ud83d\\ude00", a surrogate pair); each
        string or list gets 64 bytes for quotes, separators and spacing, and the other fields
        4 KiB.
        """
        per_query = 12 * self.max_query_chars + 64
        per_entity_list = self.max_entities_per_query * (12 * self.max_entity_chars + 64) + 64
        return self.max_queries_per_request * (per_query + per_entity_list) + 4_096


# ---------------------------------------------------------------------------------------------
# schema

_HIPPORAG1_NEEDS_ENTITIES = (
    "mode 'hipporag1' needs entities: one list of entity strings per query (an empty list "
    "answers that query with the dense ranking)"
)

_QUERY = "Which Stanford University professor works on Alzheimer's?"
_REQUEST_EXAMPLES: list[dict[str, Any]] = [
    {"queries": [_QUERY], "top_k": 5, "mode": "hipporag2"},
    {"queries": [_QUERY, "Alzheimer's research"], "top_k": 3, "mode": "hybrid"},
    {"queries": [_QUERY], "entities": [["Stanford University", "Alzheimer's"]], "top_k": 5,
     "mode": "hipporag1", "return_seeds": False},  # fmt: skip
]


def _max_items(model: type[BaseModel], field: str) -> int | None:
    for m in model.model_fields[field].metadata:
        if hasattr(m, "max_length"):
            return int(m.max_length)
    return None


def _request_schema_extra(schema: dict[str, Any], model: type[Any]) -> None:
    """Add the cross-field rules (entities vs queries, hipporag1 vs entities) and examples."""
    n_max = _max_items(model, "queries")
    if n_max is None:  # the unconstrained base shape: nothing to spell out
        return
    no_entities = {
        "title": "without entities",
        "properties": {
            "entities": {"type": "null"},
            "mode": {"enum": [m for m in MODES if m != "hipporag1"]},
        },
    }
    with_entities = [
        {
            "title": f"{n} queries with entities",
            "required": ["entities"],
            "properties": {
                "queries": {"minItems": n, "maxItems": n},
                "entities": {"type": "array", "minItems": n, "maxItems": n},
            },
        }
        for n in range(1, n_max + 1)
    ]
    schema["anyOf"] = [no_entities, *with_entities]
    schema["examples"] = [e for e in _REQUEST_EXAMPLES if _accepts(model, e)]


def _accepts(model: type[BaseModel], body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


class RetrieveRequest(BaseModel):
    """Queries answered with one mode and one top_k (limits: see `request_model`)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_request_schema_extra)

    queries: list[str]
    entities: list[list[str]] | None = None
    top_k: int = 10
    mode: Mode = "hipporag2"
    return_seeds: bool = False
    index: str | None = None

    @model_validator(mode="after")
    def _entities_fit_queries(self) -> RetrieveRequest:
        if self.entities is not None and len(self.entities) != len(self.queries):
            raise ValueError(
                f"entities has {len(self.entities)} lists for {len(self.queries)} queries: give "
                "one list per query"
            )
        if self.mode == "hipporag1" and self.entities is None:
            raise ValueError(_HIPPORAG1_NEEDS_ENTITIES)
        return self


def _integral(v: Any) -> Any:
    """JSON Schema counts 21.0 as an integer; strict pydantic would not."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _index_field(names: Sequence[str]) -> Any:
    """The `index` field: one of `names` or null; an unknown name gets an error naming it."""
    served = tuple(names)

    def known(v: Any) -> Any:
        if isinstance(v, str) and v not in served:
            raise ValueError(str(UnknownIndexError(v, served)))
        return v

    return (
        Annotated[Literal[served] | None, BeforeValidator(known)],  # type: ignore[valid-type]
        Field(default=None, description=f"the index to search (default: {served[0]!r})"),
    )


def request_model(config: ServerConfig,
                  indexes: Sequence[str] = (DEFAULT_INDEX,)) -> type[RetrieveRequest]:
    """The `RetrieveRequest` model with `config`'s limits and the served `indexes`' names: the
    schema and the validator in one."""
    text: Any = Annotated[
        str, StringConstraints(min_length=1, max_length=config.max_query_chars, pattern=NONBLANK)
    ]
    entity: Any = Annotated[
        str, StringConstraints(min_length=1, max_length=config.max_entity_chars, pattern=NONBLANK)
    ]
    per_query: Any = Annotated[list[entity], Field(max_length=config.max_entities_per_query)]
    model: type[RetrieveRequest] = create_model(
        "RetrieveRequest",
        __base__=RetrieveRequest,
        __doc__=(
            "Queries answered with one mode and one top_k. `entities`, when given, has one list "
            "per query; hipporag1 needs it, hybrid uses it (else capitalised spans of the query), "
            "dense and hipporag2 ignore it."
        ),
        queries=(
            list[text],
            Field(
                min_length=1,
                max_length=config.max_queries_per_request,
                description="query strings; each has a character that is not whitespace",
            ),
        ),
        entities=(
            list[per_query] | None,
            Field(
                default=None,
                max_length=config.max_queries_per_request,
                description=(
                    "per query, its named entities (same length as queries; an empty list: none); "
                    "required by hipporag1, used by hybrid, ignored by dense and hipporag2"
                ),
            ),
        ),
        top_k=(
            Annotated[int, BeforeValidator(_integral)],
            Field(default=min(10, config.max_top_k), ge=1, le=config.max_top_k,
                  description="passages returned per query"),  # fmt: skip
        ),
        mode=(Mode, Field(default="hipporag2", description="retrieval mode")),
        return_seeds=(
            bool,
            Field(default=False, description="also return the seed facts of each query"),
        ),
        index=_index_field(indexes),
    )
    return model


class PassageHit(BaseModel):
    key: str = Field(description='passage key: "chunk-" + md5 of the indexed text')
    title: str
    text: str = Field(description="the indexed passage text (HippoRAG: title, newline, body)")
    score: float
    rank: int = Field(ge=0, description="0-based position in the ranking")


SeedFact = tuple[str, str, str]  # (subject, predicate, object)


class RetrieveResponse(BaseModel):
    results: list[list[PassageHit]] = Field(description="per query, in request order, the ranking")
    seeds: list[list[SeedFact]] | None = Field(
        default=None,
        description="per query, the seed facts of its PPR (empty for dense answers and "
        "hipporag1); null unless return_seeds",
    )


class LatencyMs(BaseModel):
    p50: float
    p95: float
    p99: float
    mean: float


class BatcherStatsBody(BaseModel):
    running: bool
    queue_depth: int = Field(description="queries waiting, not yet in a batch")
    in_flight: int = Field(description="queries in the batch now running")
    requests_served: int
    requests_failed: int
    requests_rejected: int = Field(description="refused with 429")
    batches_served: int
    queries_served: int
    mean_batch_size: float
    max_batch_size_seen: int
    latency_ms: LatencyMs = Field(description="submit -> result, over the last 10,000 requests")


class Limits(BaseModel):
    max_batch: int
    max_wait_ms: float
    max_queue: int
    max_queries_per_request: int
    max_query_chars: int
    max_entities_per_query: int
    max_entity_chars: int
    max_top_k: int
    max_body_bytes: int


class StatsResponse(BaseModel):
    index: dict[str, int | float | bool | str] = Field(description="index counts and names")
    batcher: BatcherStatsBody
    limits: Limits


class IndexInfo(BaseModel):
    name: str
    version: int | None = Field(description="committed version served (null: never saved)")
    passages: int = Field(ge=0)
    memory_bytes: int = Field(
        ge=0, description="bytes of the index's tensors (graph, embeddings) on its device")
    device: str
    precision: str


class IndexesResponse(BaseModel):
    indexes: list[IndexInfo] = Field(description="the served indexes; the first is the default")


class StatusBody(BaseModel):
    status: Literal["ok", "ready", "not ready"]


class ErrorBody(BaseModel):
    detail: str = Field(description="a short message (no trace, no path)")


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description='where: e.g. ["body", "queries", 0]')
    msg: str
    type: str


class ValidationErrorBody(BaseModel):
    detail: list[ValidationIssue]


def _response(model: type[BaseModel], description: str, example: Any,
              headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": model,
        "description": description,
        "content": {"application/json": {"example": example}},
    }
    if headers:
        out["headers"] = headers
    return out


def _unauthorized() -> dict[str, Any]:
    return _response(
        ErrorBody, "missing or invalid bearer token",
        {"detail": "missing or invalid bearer token"},
        {"WWW-Authenticate": {"description": "Bearer", "required": True,
                              "schema": {"type": "string"}}},
    )  # fmt: skip


_API_DESCRIPTION = (
    "HippoRAG retrieval over one or more named indexes. The schema states every limit the server "
    "enforces: a request that fits it gets 200 (or 413 / 429 / 503: body bytes, load, shutdown) "
    "and one that does not gets 422. Bearer security is declared, and enforced, only when the "
    "server has a token; /healthz and /readyz are always open. /mcp (not described here) serves "
    "the same retrieval to Model Context Protocol clients (streamable HTTP), behind the same token."
)


# ---------------------------------------------------------------------------------------------
# body size limit (pure ASGI, so a chunked body is cut off too)


class _BodyLimit:
    """Answer 413 to a request body over `max_bytes`, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > self.max_bytes:
                    await self._too_large(scope, receive, send)
                    return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # FastAPI re-raises HTTPException from body parsing; the handler answers 413.
                    raise HTTPException(413, self._message())
            return message

        await self.app(scope, limited_receive, send)

    def _message(self) -> str:
        return f"request body too large: limit {self.max_bytes} bytes"

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse({"detail": self._message()}, status_code=413)
        await response(scope, receive, send)


# ---------------------------------------------------------------------------------------------
# app


def create_app(searcher: Searcher | SearcherHolder | Mapping[str, Searcher | SearcherHolder],
               config: ServerConfig | None = None) -> FastAPI:
    """Build the FastAPI app serving `searcher` (its index already loaded, on its device).

    `searcher` is one searcher (served as index "default") or a mapping name -> searcher for
    several indexes (the first is the default; each gets its own micro-batcher). Pass a
    `SearcherHolder` with an index directory (and configure a token) to also serve POST / DELETE
    /v1/passages (serve/writes.py) for it: its queries then switch to each committed version.
    The batchers start with the app's lifespan and, at shutdown, finish every queued and
    in-flight batch before the app stops (uvicorn first waits for open requests).
    """
    config = config or ServerConfig()
    if isinstance(searcher, Mapping):
        named = {check_index_name(str(k)): v for k, v in searcher.items()}
    else:
        named = {DEFAULT_INDEX: searcher}
    metrics = Metrics()
    service = RetrievalService(named, config.batcher, metrics)
    request_cls = request_model(config, service.names)
    index_choice = Literal[tuple(service.names)]  # type: ignore[valid-type]
    mcp_app = _mcp_app(service, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        async with AsyncExitStack() as stack:
            await service.start()
            stack.push_async_callback(service.close)  # runs last: drains every batcher
            if mcp_app is not None:
                await stack.enter_async_context(mcp_app.session_manager.run())
            for info in (s.describe() for s in service.indexes.values()):
                log.info("serving index %r: %s passages", info["name"], info["passages"])
            yield

    app = FastAPI(
        title="hippo-gpu",
        summary="Batched HippoRAG retrieval with dynamic micro-batching",
        description=_API_DESCRIPTION,
        lifespan=lifespan,
    )
    app.add_middleware(_BodyLimit, max_bytes=config.max_body_bytes)
    # Added last, so outermost: it sees the body limit's 413s and every auth 401.
    route_paths: set[str] = set()  # filled once every route is added, below
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes=lambda: route_paths)
    app.state.service = service
    app.state.batcher = service.indexes[service.default].batcher  # the default index's
    app.state.metrics = metrics
    metrics.watch_indexes(lambda: [(name, _gauges(s)) for name, s in service.indexes.items()])
    # Security is declared (and enforced) only when there is a token: no token, no auth claims.
    protected: list[Any] = [] if config.token is None else [_bearer_auth(config.token)]
    auth_responses: dict[int | str, dict[str, Any]] = (
        {} if config.token is None else {401: _unauthorized()}
    )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # pydantic's default body echoes the input back; keep location, message and type only.
        detail = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal server error"}, status_code=500)

    @app.get("/healthz", operation_id="healthz", summary="Liveness", response_model=StatusBody,
             responses={200: {"content": {"application/json": {"example": {"status": "ok"}}}}})
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        operation_id="readyz",
        summary="Readiness: indexes loaded and batchers accepting",
        response_model=StatusBody,
        responses={
            200: {"content": {"application/json": {"example": {"status": "ready"}}}},
            503: _response(StatusBody, "not accepting requests (starting or shutting down)",
                           {"status": "not ready"}),
        },
    )
    async def readyz() -> JSONResponse:
        if service.accepting:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503)

    async def stats(index: Any = None) -> dict[str, Any]:
        served = service.get(index)
        return {
            "index": _public_stats(served.holder.current.index.stats()),
            "batcher": dataclasses.asdict(served.batcher.stats()),
            "limits": {
                "max_batch": config.batcher.max_batch,
                "max_wait_ms": config.batcher.max_wait_ms,
                "max_queue": config.batcher.max_queue,
                "max_queries_per_request": config.max_queries_per_request,
                "max_query_chars": config.max_query_chars,
                "max_entities_per_query": config.max_entities_per_query,
                "max_entity_chars": config.max_entity_chars,
                "max_top_k": config.max_top_k,
                "max_body_bytes": config.max_body_bytes,
            },
        }

    # The query parameter's enum is this app's index names; FastAPI reads it from the signature.
    stats.__annotations__["index"] = Annotated[
        index_choice | None,
        QueryParam(description=f"the index to describe (default: {service.default!r})"),
    ]
    app.get(
        "/v1/stats",
        operation_id="stats",
        summary="Index counts and serving statistics",
        response_model=StatsResponse,
        responses={**auth_responses, 422: _response(
            ValidationErrorBody, "not a served index name",
            {"detail": [{"loc": ["query", "index"], "type": "literal_error",
                         "msg": f"Input should be {service.default!r}"}]})},
        dependencies=protected,
    )(stats)

    @app.get(
        "/v1/indexes",
        operation_id="indexes",
        summary="The served indexes: name, version, passages, memory",
        response_model=IndexesResponse,
        responses=auth_responses,
        dependencies=protected,
    )
    async def indexes() -> dict[str, Any]:
        return {"indexes": [s.describe() for s in service.indexes.values()]}

    @app.get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus metrics (text exposition format)",
        response_class=Response,
        responses={
            **auth_responses,
            200: {
                "description": "every hippo_* metric; the README lists the names",
                "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
            },
        },
        dependencies=protected,
    )
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    async def retrieve(req: RetrieveRequest) -> JSONResponse:
        try:
            answers = await service.retrieve(
                req.queries, top_k=req.top_k, mode=req.mode, entities=req.entities,
                return_seeds=req.return_seeds, index=req.index, transport="http")
        except QueueFullError as e:
            raise HTTPException(429, "server busy: queue full", {"Retry-After": "1"}) from e
        except BatcherClosedError as e:
            raise HTTPException(503, "server shutting down") from e
        body: dict[str, Any] = {"results": [a.hits for a in answers]}
        body["seeds"] = [a.seeds for a in answers] if req.return_seeds else None
        # Hits were validated as they were built; skip a second pydantic pass on the event loop.
        return JSONResponse(body)

    # The body model carries this config's limits; FastAPI reads it from the annotation.
    retrieve.__annotations__["req"] = request_cls
    app.post(
        "/v1/retrieve",
        operation_id="retrieve",
        summary="Rank passages for a batch of queries",
        response_model=RetrieveResponse,
        responses={**auth_responses, **_retrieve_responses(config)},
        dependencies=protected,
    )(retrieve)
    writable = {n: s.holder for n, s in service.indexes.items() if s.holder.index_dir is not None}
    if writable and config.token is not None:
        holders = {n: s.holder for n, s in service.indexes.items()}
        app.include_router(write_router(holders, protected[0], auth_responses))
    if mcp_app is not None:
        guarded = mcp_app.asgi if config.token is None else _BearerGuard(mcp_app.asgi, config.token)
        app.router.routes.append(Route(MCP_PATH, endpoint=guarded))
    route_paths.update(getattr(r, "path", "") for r in app.router.routes)
    return app


MCP_PATH = "/mcp"


def _mcp_app(service: RetrievalService, config: ServerConfig) -> Any:
    """The MCP streamable-HTTP endpoint over `service`, or None (config.mcp, or no `mcp`)."""
    if config.mcp is False or (config.mcp is None and importlib.util.find_spec("mcp") is None):
        return None
    try:
        from hippo_gpu.serve.mcp import mount_streamable_http
    except ImportError as e:
        raise ImportError("ServerConfig(mcp=True) needs the `mcp` package: pip install "
                          "'hippo-gpu[mcp]'") from e
    return mount_streamable_http(service, config.query_limits, MCP_PATH,
                                 dns_rebinding_guard=config.token is None)


def _gauges(served: Any) -> IndexGauges:
    stats = served.batcher.stats()
    info = served.describe()
    return IndexGauges(queue_depth=stats.queue_depth, in_flight=stats.in_flight,
                       version=info["version"], passages=info["passages"],
                       memory_bytes=info["memory_bytes"])


class _BearerGuard:
    """Pure ASGI: answer 401 unless `Authorization: Bearer <token>`, read as `_bearer_auth` reads
    it (scheme in any case, constant-time compare), for a route outside FastAPI's dependencies."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                given = credentials if scheme.lower() == b"bearer" else b""
        if scope["type"] == "http" and not (
                given and hmac.compare_digest(given, self.expected)):  # fmt: skip
            response = JSONResponse({"detail": "missing or invalid bearer token"},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _retrieve_responses(config: ServerConfig) -> dict[int | str, dict[str, Any]]:
    hit = {"key": "chunk-4f1c0d5e9b2a7c3d8e6f1a2b3c4d5e6f", "title": "Thomas C. Südhof",
           "text": "Thomas C. Südhof\nThomas Christian Südhof is a professor at Stanford ...",
           "score": 0.0123, "rank": 0}  # fmt: skip
    return {
        200: {
            "description": "per query, in request order, up to top_k passages, best first",
            "content": {"application/json": {"example": {"results": [[hit]], "seeds": None}}},
        },
        400: _response(ErrorBody, "the body could not be read (e.g. not UTF-8)",
                       {"detail": "There was an error parsing the body"}),
        413: _response(
            ErrorBody,
            f"request body over {config.max_body_bytes} bytes (no schema-valid request, even "
            "with every character escaped, is that large)",
            {"detail": f"request body too large: limit {config.max_body_bytes} bytes"},
        ),
        422: _response(
            ValidationErrorBody,
            "the request does not fit the schema: e.g. an empty or whitespace-only query, too "
            "many queries or characters, top_k out of range, an unknown mode or field, entities "
            "not one list per query, or mode hipporag1 without entities",
            {"detail": [{"loc": ["body"], "type": "value_error",
                         "msg": f"Value error, {_HIPPORAG1_NEEDS_ENTITIES}"}]},
        ),  # fmt: skip
        429: _response(
            ErrorBody, "the queue is full; retry after the given seconds",
            {"detail": "server busy: queue full"},
            {"Retry-After": {"description": "seconds", "required": True,
                             "schema": {"type": "integer"}}},
        ),  # fmt: skip
        500: _response(ErrorBody, "internal error", {"detail": "internal server error"}),
        503: _response(ErrorBody, "shutting down", {"detail": "server shutting down"}),
    }


def _bearer_auth(token: str) -> Any:
    """A dependency that requires `Authorization: Bearer <token>` (constant-time compare)."""
    scheme = HTTPBearer(auto_error=False, description="the server's token")
    expected = token.encode()

    async def check(
        creds: HTTPAuthorizationCredentials | None = Depends(scheme),
    ) -> None:
        given = b"" if creds is None else creds.credentials.encode()
        if creds is None or not hmac.compare_digest(given, expected):
            raise HTTPException(
                401, "missing or invalid bearer token", {"WWW-Authenticate": "Bearer"}
            )

    return Depends(check)


def _public_stats(stats: Mapping[str, Any]) -> dict[str, Any]:
    """Index stats safe to publish: numbers, booleans and short names, never a file path."""
    out: dict[str, Any] = {}
    for k, v in stats.items():
        if isinstance(v, bool) or (isinstance(v, (int, float)) and math.isfinite(v)):
            out[str(k)] = v
        elif isinstance(v, str) and len(v) <= 200 and not _looks_like_path(str(k), v):
            out[str(k)] = v  # e.g. an encoder name such as "org/model"
    return out


def _looks_like_path(name: str, value: str) -> bool:
    lowered = name.lower()
    return (
        any(w in lowered for w in ("path", "dir", "file"))
        or value.startswith(("/", "~", "."))
        or "\\" in value
        or value.count("/") > 1
    )


__all__ = [
    "ENTITY_MODES",
    "NONBLANK",
    "WHITESPACE",
    "BatchKey",
    "Mode",
    "PassageHit",
    "Query",
    "RetrieveRequest",
    "RetrieveResponse",
    "ServerConfig",
    "StatsResponse",
    "create_app",
    "request_model",
]
