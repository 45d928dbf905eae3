"""HTTP query server: validate -> micro-batch -> search. No retrieval logic lives here.

Endpoints (operationId in brackets):
    POST /v1/retrieve [retrieve]  {"queries": [str, ...], "entities": [[str, ...] per query],
                                   "top_k": int, "mode": str, "return_seeds": bool}
        -> {"results": [[{"key", "title", "text", "score", "rank"}, ...] per query],
            "seeds": [[[subject, predicate, object], ...] per query] | null,
            "version": the index version that answered the whole request | null,
            "entities": [[str, ...] per query] (hipporag1 and hybrid only: the entities linked,
                        the caller's or else the question's capitalised spans; [] = none)}
        An optional "index" names the served index to ask (default: the first), an optional
        "ircot": {"max_steps": S} runs IRCoT (serve/ircot.py; needs `create_app(reasoner=)`)
        and adds "ircot": [{"thoughts", "steps", "stop", "error"} per query].
    POST /v1/explain [explain]  the same request as retrieve (without return_seeds), answered
        with each hit's score split into one term per seed and one for the dense prior
        (hippo_gpu.retrieval.explain): {"explanations": [{"query", "seeds", "facts", "hits",
        "phrases", ...} per query]}.
    GET  /v1/stats [stats]    index counts, queue depth, batches, mean batch size, latencies
                              (?index=NAME; default: the first index).
    GET  /v1/indexes [indexes]  {"indexes": [{"name", "version", "passages", "memory_bytes",
                              "device", "precision"}, ...]}, in serving order.
    GET  /metrics [metrics]   Prometheus text format (serve/metrics.py lists the names).
    GET  /healthz [healthz]   liveness: the process answers.
    GET  /readyz [readyz]     readiness: indexes loaded and batchers accepting (else 503).
    GET  /docs, /redoc, /openapi.json   the OpenAPI document and its viewers, offline (their
                              scripts served here: serve/doc_pages.py); GET / leads to /ui.
    GET  /ui                  the explorer page (serve/ui.py; ServerConfig.ui): static files, open
                              like /docs; every request it makes goes to /v1/* with the token.
    /mcp                      the Model Context Protocol (streamable HTTP, serve/mcp.py) when the
                              `mcp` package is installed (ServerConfig.mcp); not in the OpenAPI
                              document, which describes the REST API only.

Several indexes: `create_app({"a": searcher_a, "b": searcher_b}, config)` serves each with its own
micro-batcher (serve/service.py); `create_app(searcher, config)` serves one, named "default".

The contract: the OpenAPI document states exactly what the server enforces, so a schema-valid
request gets 200 (or one of the documented 413 / 429 / 503, which depend on the request's size
and on load) and a schema-invalid one gets 422. Every per-field limit is therefore in the schema,
built from `ServerConfig` (serve/config.py); serve/schema.py builds it and states its rules
(limits, blank text, entities per query).

- 413 is the body-size guard (`ServerConfig.max_body_bytes`, checked before parsing, declared or
  streamed; serve/guards.py). It is sized so that every schema-valid request, serialised with
  every character escaped (12 bytes for a non-BMP character as a surrogate pair), fits.
- 413 is also the work budget (`ServerConfig.cost`, serve/budget.py): the schema bounds each
  factor of a request, not their product, so a retrieve or explain is estimated (queries, their
  characters and entities, top_k, mode, IRCoT steps) after validation and refused before it is
  queued when over `CostLimits.max_request_cost`; the body names both numbers: {"detail",
  "estimate", "limit"}. 413, not 422 (the request fits the schema, and 422 says it does not) nor
  429 (that promises a retry will do; this one never will): like an oversized body, the remedy is
  to send less per request, here fewer queries, a smaller top_k or shorter texts.
- 429 (with Retry-After) means the queue is full (a write route: the write rate,
  `WriteLimits.writes_per_second`); 503 that the server is shutting down; 500 an internal error
  (a bug: short body, logged, no trace, no path).
- A server without a token answers only the Host names of `ServerConfig.allowed_hosts` (loopback
  by default): 421 for another Host, 403 for an Origin on another host (serve/guards.HostGuard,
  against DNS rebinding; not in the document, which describes requests to this server's names).

Authentication: when `ServerConfig.token` is set, /v1/*, /metrics and /mcp need
`Authorization: Bearer <token>` (401 otherwise; serve/guards.py) and the schema declares HTTP
bearer security on exactly those operations; /healthz, /readyz and the docs stay open for probes.
Without a token the schema declares no security at all. The caller (the CLI) owns secrets: the
token arrives in `ServerConfig`, never from the environment here. Error bodies carry a short
message only.

Batching: HTTP and MCP queries go through the same `RetrievalService` (serve/service.py states
the batching rule), one micro-batcher per index.

`create_app` assembles the app in steps, in this order (the order of the routes is the order of
the paths in the OpenAPI document): service and MCP endpoint, middleware, error handlers, probes,
read routes, retrieve, write routes, /mcp.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple

from fastapi import FastAPI, HTTPException, Request
from fastapi import Query as QueryParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from hippo_gpu.retrieval.modes import mode_of
from hippo_gpu.retrieval.searcher import Searcher
from hippo_gpu.serve.batcher import BatcherClosedError, QueueFullError
from hippo_gpu.serve.budget import OverBudgetError
from hippo_gpu.serve.config import ServerConfig
from hippo_gpu.serve.doc_pages import DOCS_PATH, add_doc_routes
from hippo_gpu.serve.explain_schema import ExplainResponse
from hippo_gpu.serve.guards import (
    BearerGuard,
    BodyLimit,
    HostGuard,
    WriteRate,
    bearer_auth,
    rate_limited,
)
from hippo_gpu.serve.holder import SearcherHolder
from hippo_gpu.serve.ircot import answer_ircot, trace
from hippo_gpu.serve.metrics import (
    CONTENT_TYPE,
    EncoderCounters,
    IndexGauges,
    Metrics,
    MetricsMiddleware,
)
from hippo_gpu.serve.responses import (
    API_DESCRIPTION,
    IndexesResponse,
    RetrieveResponse,
    StatsResponse,
    StatusBody,
    explain_responses,
    response_doc,
    retrieve_responses,
    unauthorized_response,
    unknown_index_response,
    write_responses,
)
from hippo_gpu.serve.schema import (
    RetrieveRequest,
    explain_request_model,
    request_model,
    short_issue,
)
from hippo_gpu.serve.service import (
    DEFAULT_INDEX,
    Answer,
    RetrievalService,
    ServedIndex,
    UnknownIndexError,
    answered_version,
    check_index_name,
)
from hippo_gpu.serve.ui import UI_PATH, add_ui_routes
from hippo_gpu.serve.writes import write_router

if TYPE_CHECKING:
    from hippo_gpu.retrieval.ircot import ThoughtSource

__all__ = ["MCP_PATH", "ServerConfig", "create_app"]

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
WRITE_PATH = "/v1/passages"


def create_app(searcher: Searcher | SearcherHolder | Mapping[str, Searcher | SearcherHolder],
               config: ServerConfig | None = None, *,
               reasoner: ThoughtSource | None = None) -> FastAPI:
    """Build the FastAPI app serving `searcher` (its index already loaded, on its device).

    `searcher` is one searcher (served as index "default") or a mapping name -> searcher for
    several indexes (the first is the default; each gets its own micro-batcher). Pass a
    `WritableHolder` (serve/writes.py: a holder with an index directory) and configure a token
    to also serve POST / DELETE /v1/passages for it: its queries then switch to each committed
    version.
    The batchers start with the app's lifespan and, at shutdown, finish every queued and
    in-flight batch before the app stops (uvicorn first waits for open requests).
    `reasoner` (the LLM thought source, hippo_gpu.llm.ircot.IRCoTReasoner) enables "ircot" in
    retrieve requests; without one such a request gets 422.
    """
    config = config or ServerConfig()
    if isinstance(searcher, Mapping):
        named = {check_index_name(str(k)): v for k, v in searcher.items()}
    else:
        named = {DEFAULT_INDEX: searcher}
    metrics = Metrics()
    service = RetrievalService(named, config.batcher, metrics)
    mcp_app = _mcp_app(service, config, reasoner)
    app = FastAPI(
        title="hippo-gpu",
        summary="Batched HippoRAG retrieval with dynamic micro-batching",
        description=API_DESCRIPTION,
        lifespan=_lifespan(service, mcp_app),
        docs_url=None, redoc_url=None,  # served offline by add_doc_routes, below
    )
    writable = config.token is not None and any(
        s.holder.index_dir is not None for s in service.indexes.values())
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes,
                       by_path={WRITE_PATH: config.writes.max_body_bytes} if writable else None,
                       on_reject=metrics.rejected.labels(reason="body_too_large").inc)
    if config.token is None and "*" not in config.allowed_hosts:
        app.add_middleware(HostGuard, hosts=config.allowed_hosts)
    # Added last, so outermost: it sees the body limit's 413s and every auth 401.
    route_paths: set[str] = set()  # filled once every route is added, below
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes=lambda: route_paths)
    app.state.metrics = metrics
    metrics.watch_indexes(lambda: [(name, _gauges(s)) for name, s in service.indexes.items()])
    metrics.watch_remote_encoders(lambda: [
        (name, c) for name, s in service.indexes.items()
        if (c := _encoder_counters(s)) is not None])
    auth = _auth(config.token)
    _add_error_handlers(app)
    _add_probes(app, service)
    _add_read_routes(app, service, config, metrics, auth)
    _add_retrieve(app, service, config, auth, reasoner)
    _add_explain(app, service, config, auth)
    if writable:
        _add_write_routes(app, service, config, auth)
    if config.ui:
        add_ui_routes(app)
    add_doc_routes(app, home=UI_PATH + "/" if config.ui else DOCS_PATH)
    if mcp_app is not None:
        guarded = mcp_app.asgi if config.token is None else BearerGuard(mcp_app.asgi, config.token)
        app.router.routes.append(Route(MCP_PATH, endpoint=guarded))
    route_paths.update(getattr(r, "path", "") for r in app.router.routes)
    return app


class _Auth(NamedTuple):
    """What a protected route declares: its dependencies (the bearer check) and its documented
    401. Both are empty without a token: security is declared (and enforced) only with one."""

    dependencies: list[Any]
    responses: dict[int | str, dict[str, Any]]


def _auth(token: str | None) -> _Auth:
    if token is None:
        return _Auth([], {})
    return _Auth([bearer_auth(token)], {401: unauthorized_response()})


def _lifespan(service: RetrievalService,
              mcp_app: Any) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start the batchers (and the MCP session manager) with the app; at shutdown stop MCP, then
    drain every batcher."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            await service.start()
            stack.push_async_callback(service.close)  # runs last: drains every batcher
            if mcp_app is not None:
                await stack.enter_async_context(mcp_app.session_manager.run())
            for info in (s.describe() for s in service.indexes.values()):
                log.info("serving index %r: %s passages", info["name"], info["passages"])
            yield

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Every error a route may raise, mapped here once: 422 without the input echoed back, HTTP
    errors as {"detail"}, an over-budget request as 413 {"detail", "estimate", "limit"}, a full
    queue as 429 with Retry-After, a closing batcher as 503, an unknown index as 404, 500
    logged, never traced."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # pydantic's default body echoes the input back; keep location, message and type only.
        detail = [short_issue(e) for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(OverBudgetError)
    async def _over_budget(request: Request, exc: OverBudgetError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "estimate": exc.estimate, "limit": exc.limit},
                            status_code=413)

    @app.exception_handler(QueueFullError)
    async def _queue_full(request: Request, exc: QueueFullError) -> JSONResponse:
        return JSONResponse({"detail": "server busy: queue full"}, status_code=429,
                            headers={"Retry-After": "1"})

    @app.exception_handler(BatcherClosedError)
    async def _closing(request: Request, exc: BatcherClosedError) -> JSONResponse:
        return JSONResponse({"detail": "server shutting down"}, status_code=503)

    @app.exception_handler(UnknownIndexError)
    async def _unknown_index(request: Request, exc: UnknownIndexError) -> JSONResponse:
        # The query routes' schemas name the served indexes (422 first); this answers a route
        # that looks a name up itself, as the write routes do (404, the same message).
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = exc.headers
        if exc.status_code == 405:  # Starlette names the first route's methods only
            allowed = {m for r in app.router.routes if getattr(r, "path", None) ==
                       request.url.path for m in getattr(r, "methods", None) or ()}
            headers = {**(headers or {}), "Allow": ", ".join(sorted(allowed))}
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        return JSONResponse({"detail": "internal server error"}, status_code=500)


def _add_probes(app: FastAPI, service: RetrievalService) -> None:
    """GET /healthz and /readyz: open, for probes."""

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
            503: response_doc(StatusBody, "not accepting requests (starting or shutting down)",
                              {"status": "not ready"}),
        },
    )
    async def readyz() -> JSONResponse:
        if service.accepting:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503)


def _add_read_routes(app: FastAPI, service: RetrievalService, config: ServerConfig,
                     metrics: Metrics, auth: _Auth) -> None:
    """GET /v1/stats, /v1/indexes and /metrics, behind the token when there is one."""

    async def stats(index: Any = None) -> dict[str, Any]:
        served = service.get(index)
        return {
            "index": _public_stats(served.holder.current.index.stats()),
            "batcher": dataclasses.asdict(served.batcher.stats()),
            "limits": {
                **dataclasses.asdict(config.batcher),
                "max_queries_per_request": config.max_queries_per_request,
                **dataclasses.asdict(config.limits),
                "max_body_bytes": config.max_body_bytes,
                **dataclasses.asdict(config.cost),
            },
        }

    # The query parameter's enum is this app's index names; FastAPI reads it from the signature.
    index_choice = Literal[tuple(service.names)]  # type: ignore[valid-type]
    stats.__annotations__["index"] = Annotated[
        index_choice | None,
        QueryParam(description=f"the index to describe (default: {service.default!r})"),
    ]
    app.get(
        "/v1/stats",
        operation_id="stats",
        summary="Index counts and serving statistics",
        response_model=StatsResponse,
        responses={**auth.responses, 422: unknown_index_response(service.default)},
        dependencies=auth.dependencies,
    )(stats)

    @app.get(
        "/v1/indexes",
        operation_id="indexes",
        summary="The served indexes: name, version, passages, memory",
        response_model=IndexesResponse,
        responses=auth.responses,
        dependencies=auth.dependencies,
    )
    async def indexes() -> dict[str, Any]:
        return {"indexes": [s.describe() for s in service.indexes.values()]}

    @app.get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus metrics (text exposition format)",
        response_class=Response,
        responses={
            **auth.responses,
            200: {
                "description": "every hippo_* metric; the README lists the names",
                "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
            },
        },
        dependencies=auth.dependencies,
    )
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)


def _add_retrieve(app: FastAPI, service: RetrievalService, config: ServerConfig,
                  auth: _Auth, reasoner: ThoughtSource | None = None) -> None:
    """POST /v1/retrieve: the request model carries this config's limits and index names."""

    async def retrieve(req: RetrieveRequest) -> JSONResponse:
        traces = None
        mode = mode_of(req.mode)  # the schema admits only config.MODES
        steps = req.ircot.max_steps if req.ircot is not None and reasoner is not None else 1
        service.admit(config.cost, req.queries, top_k=req.top_k, mode=mode,
                      entities=req.entities, index=req.index, steps=steps)
        if req.ircot is not None and reasoner is not None:
            answers, results = await answer_ircot(
                service, reasoner, req.queries, top_k=req.top_k, mode=mode,
                max_steps=req.ircot.max_steps, entities=req.entities,
                return_seeds=req.return_seeds, index=req.index, where=req.where)
            traces = [trace(r) for r in results]
        else:
            answers = await service.retrieve(
                req.queries, top_k=req.top_k, mode=mode, entities=req.entities,
                return_seeds=req.return_seeds, index=req.index, transport="http",
                where=req.where)
        errors = _errors(answers)
        body: dict[str, Any] = {"results": [a.hits for a in answers]}
        body["seeds"] = [a.seeds for a in answers] if req.return_seeds else None
        body["version"] = answered_version(answers)
        if mode.reads_entities:
            body["entities"] = [a.entities for a in answers]
        if traces is not None:
            body["ircot"] = traces
        if any(e is not None for e in errors):
            body["errors"] = errors
        # Hits were validated as they were built; skip a second pydantic pass on the event loop.
        return JSONResponse(body)

    # The body model carries this config's limits; FastAPI reads it from the annotation.
    retrieve.__annotations__["req"] = request_model(config, service.names,
                                                    ircot=reasoner is not None)
    app.post(
        "/v1/retrieve",
        operation_id="retrieve",
        summary="Rank passages for a batch of queries",
        response_model=RetrieveResponse,
        responses={**auth.responses, **retrieve_responses(config)},
        dependencies=auth.dependencies,
    )(retrieve)


def _add_explain(app: FastAPI, service: RetrievalService, config: ServerConfig,
                 auth: _Auth) -> None:
    """POST /v1/explain: retrieve's request (and limits) answered by Searcher.explain."""

    async def explain(req: Any) -> JSONResponse:
        mode = mode_of(req.mode)
        service.admit(config.cost, req.queries, top_k=req.top_k, mode=mode,
                      entities=req.entities, index=req.index, explain=True)
        answers = await service.retrieve(
            req.queries, top_k=req.top_k, mode=mode, entities=req.entities,
            index=req.index, transport="http", explain=True, where=req.where)
        errors = _errors(answers)
        body: dict[str, Any] = {"explanations": [a.explanation for a in answers]}
        if any(e is not None for e in errors):
            body["errors"] = errors
        return JSONResponse(body)

    explain.__annotations__["req"] = explain_request_model(config, service.names)
    app.post(
        "/v1/explain",
        operation_id="explain",
        summary="Explain the ranking of a batch of queries: each score split by seed",
        response_model=ExplainResponse,
        responses={**auth.responses, **explain_responses(config)},
        dependencies=auth.dependencies,
    )(explain)


def _errors(answers: list[Answer]) -> list[str | None]:
    """Each answer's error (None: answered). A request of one query whose retrieval failed has
    nothing else to answer: 500 naming the failure."""
    errors = [a.error for a in answers]
    if len(answers) == 1 and errors[0] is not None:
        raise HTTPException(500, f"retrieval failed: {errors[0]}")
    return errors


def _add_write_routes(app: FastAPI, service: RetrievalService, config: ServerConfig,
                      auth: _Auth) -> None:
    """POST / DELETE /v1/passages (serve/writes.py), behind the token and the write rate: only
    with a token and a writable index."""
    limits = config.writes
    holders = {n: s.holder for n, s in service.indexes.items()}
    guard = rate_limited(auth.dependencies[0], WriteRate(limits.writes_per_second,
                                                         limits.write_burst))
    responses = {**auth.responses, **write_responses(limits)}
    app.include_router(write_router(holders, guard, responses, limits))


def _mcp_app(service: RetrievalService, config: ServerConfig,
             reasoner: ThoughtSource | None) -> Any:
    """The MCP streamable-HTTP endpoint over `service`, or None (config.mcp, or no `mcp`)."""
    if config.mcp is False or (config.mcp is None and importlib.util.find_spec("mcp") is None):
        return None
    try:
        from hippo_gpu.serve.mcp import mount_streamable_http
    except ImportError as e:
        raise ImportError("ServerConfig(mcp=True) needs the `mcp` package: pip install "
                          "'hippo-gpu[mcp]'") from e
    return mount_streamable_http(service, config.limits, MCP_PATH,
                                 dns_rebinding_guard=config.token is None, reasoner=reasoner,
                                 max_ircot_steps=config.max_ircot_steps, cost=config.cost)


def _gauges(served: ServedIndex) -> IndexGauges:
    stats = served.batcher.stats()
    info = served.describe()
    return IndexGauges(queue_depth=stats.queue_depth, in_flight=stats.in_flight,
                       version=info["version"], passages=info["passages"],
                       memory_bytes=info["memory_bytes"],
                       versions_in_memory=served.holder.versions_in_memory)


def _encoder_counters(served: ServedIndex) -> EncoderCounters | None:
    """The counts of the index's server encoder, None for a local one or one not loaded."""
    # getattr: a stand-in searcher (a test's wrapper) may have no encoder to report
    encoder = getattr(served.holder.current, "loaded_encoder", None)
    if encoder is None or encoder.remote is None:
        return None
    snap = encoder.remote.stats.snapshot()
    return EncoderCounters(calls=int(snap["calls"]), requests=int(snap["requests"]),
                           texts=int(snap["texts"]), retries=int(snap["retries"]),
                           failures=int(snap["failures"]), seconds=snap["seconds"])


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
