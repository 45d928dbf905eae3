"""HTTP query server: validate -> micro-batch -> search. No retrieval logic lives here.

Endpoints:
    POST /v1/retrieve  {"queries": [str, ...], "top_k": int, "mode": str, "return_seeds": bool}
                       -> {"results": [[{"key", "title", "text", "score", "rank"}, ...] per query],
                           "seeds": [[fact, ...] per query] | null}
    GET  /healthz      liveness: the process answers.
    GET  /readyz       readiness: the index is loaded and the batcher accepts requests (else 503).
    GET  /v1/stats     index counts, queue depth, batches, mean batch size, latency quantiles.
    GET  /docs         OpenAPI documentation.

Batching rule: only requests with the same (mode, top_k, return_seeds) share a batch. Running a
merged batch at the largest top_k and truncating would also be sound in exact arithmetic, but ties
broken differently by a larger `topk` could then reorder equal-score passages and break the promise
that a served ranking equals the offline `retrieve()` for the same arguments; clients normally send
one top_k, so the grouping costs little.

Limits and safety: the request schema is validated by pydantic (422); more queries per request or
characters per query than configured gives 413, as does a body larger than those limits allow; a
full queue gives 429 with Retry-After; shutting down gives 503. When `ServerConfig.token` is set,
/v1/* needs `Authorization: Bearer <token>` (401 otherwise); /healthz, /readyz and /docs stay open
for probes. Error bodies carry a short message only: no stack trace, no file path.

The caller (the CLI) owns secrets: the token arrives in `ServerConfig`, never from the environment
here.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math
from collections.abc import Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hippo_gpu.config import MODES
from hippo_gpu.search import Hit, Searcher
from hippo_gpu.serve.batcher import (
    BatcherClosedError,
    BatcherConfig,
    BatchOutputError,
    MicroBatcher,
    QueueFullError,
)

log = logging.getLogger(__name__)

# The request schema's mode enum: exactly the modes retrieval accepts.
Mode = Literal[MODES]  # type: ignore[valid-type]


@dataclass(frozen=True)
class ServerConfig:
    """Server limits.

    Attributes:
        batcher: micro-batching limits (max_batch, max_wait_ms, max_queue).
        max_queries_per_request: more queries in one request -> 413.
        max_query_chars: a longer query -> 413.
        max_top_k: largest accepted top_k (larger -> 422).
        token: bearer token required on /v1/*; None serves without authentication.
    """

    batcher: BatcherConfig = dataclasses.field(default_factory=BatcherConfig)
    max_queries_per_request: int = 64
    max_query_chars: int = 2_000
    max_top_k: int = 1_000
    token: str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.max_queries_per_request < 1:
            raise ValueError(
                f"max_queries_per_request must be >= 1: {self.max_queries_per_request}"
            )
        if self.max_queries_per_request > self.batcher.max_queue:
            # Such a request could never be queued: it would always get 429.
            raise ValueError(
                f"max_queries_per_request ({self.max_queries_per_request}) exceeds max_queue "
                f"({self.batcher.max_queue})"
            )
        if self.max_query_chars < 1:
            raise ValueError(f"max_query_chars must be >= 1, got {self.max_query_chars}")
        if self.max_top_k < 1:
            raise ValueError(f"max_top_k must be >= 1, got {self.max_top_k}")
        if self.token is not None and not self.token.strip():
            raise ValueError("token must be None or a non-blank string")

    @property
    def max_body_bytes(self) -> int:
        """Largest accepted request body: every query at its limit, each char JSON-escaped."""
        # "\uXXXX" is 6 bytes per char, the worst JSON escape; 64 bytes of quoting per query and
        # 4 KiB for the other fields.
        return self.max_queries_per_request * (6 * self.max_query_chars + 64) + 4_096


# ---------------------------------------------------------------------------------------------
# schema


class RetrieveRequest(BaseModel):
    """A batch of queries answered with one mode and one top_k."""

    model_config = ConfigDict(extra="forbid")

    queries: list[str] = Field(min_length=1, description="query strings, each non-empty")
    top_k: int = Field(default=10, ge=1, description="passages returned per query")
    mode: Mode = Field(default="hipporag2", description="retrieval mode")
    return_seeds: bool = Field(
        default=False, description="also return the seed facts of each query"
    )


class PassageHit(BaseModel):
    key: str = Field(description='passage key: "chunk-" + md5 of the indexed text')
    title: str
    text: str = Field(description="the indexed passage text (HippoRAG: title, newline, body)")
    score: float
    rank: int = Field(description="0-based position in the ranking")


class RetrieveResponse(BaseModel):
    results: list[list[PassageHit]] = Field(description="per query, the ranked passages")
    seeds: list[list[Any]] | None = Field(
        default=None, description="per query, the seed facts used (when requested and available)"
    )


class ErrorBody(BaseModel):
    detail: str | list[dict[str, Any]]


# ---------------------------------------------------------------------------------------------
# retrieval adapter (runs on the batcher's worker thread)


class BatchKey(NamedTuple):
    mode: str
    top_k: int
    return_seeds: bool


class _Answer(NamedTuple):
    hits: list[dict[str, Any]]  # JSON-ready PassageHit dicts
    seeds: list[Any] | None


class _SearcherAdapter:
    """Runs one batch through `Searcher.retrieve` and turns hits into JSON-ready dicts."""

    def __init__(self, searcher: Searcher) -> None:
        self._searcher = searcher
        self._texts = searcher.index.passage_texts

    def __call__(self, queries: list[str], key: Hashable) -> list[_Answer]:
        if not isinstance(key, BatchKey):
            raise TypeError(f"batch key must be a BatchKey, got {type(key).__name__}")
        seeds: Sequence[list[Any] | None]
        if key.return_seeds:
            hits, raw = self._searcher.retrieve(queries, top_k=key.top_k, mode=key.mode,
                                                return_seeds=True)
            seeds = [[_jsonable(s) for s in per_query] for per_query in raw]
        else:
            hits = self._searcher.retrieve(queries, top_k=key.top_k, mode=key.mode)
            seeds = [None] * len(queries)
        if len(hits) != len(queries):
            raise BatchOutputError(f"retrieve returned {len(hits)} rankings for {len(queries)}")
        return [
            _Answer([self._hit(h) for h in per_query], s)
            for per_query, s in zip(hits, seeds, strict=True)
        ]

    def _hit(self, h: Hit) -> dict[str, Any]:
        return {
            "key": h.key,
            "title": h.title,
            "text": self._texts[h.row],
            "score": float(h.score),
            "rank": int(h.rank),
        }


def _jsonable(x: Any) -> Any:
    """A seed fact as JSON: dataclasses and mappings to objects, sequences to lists."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, bool)) or x is None:
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if hasattr(x, "item"):  # numpy / torch scalar
        return _jsonable(x.item())
    return str(x)


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


def create_app(searcher: Searcher, config: ServerConfig | None = None) -> FastAPI:
    """Build the FastAPI app serving `searcher` (its index already loaded, on its device).

    The batcher starts with the app's lifespan and, at shutdown, finishes every queued and
    in-flight batch before the app stops (uvicorn first waits for open requests).
    """
    config = config or ServerConfig()
    adapter = _SearcherAdapter(searcher)
    batcher: MicroBatcher[_Answer] = MicroBatcher(adapter, config.batcher)
    index_stats = _public_stats(searcher.index.stats())

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        await batcher.start()
        log.info("serving %s passages", index_stats.get("passages", "?"))
        try:
            yield
        finally:
            await batcher.close()

    app = FastAPI(
        title="hippo-gpu",
        summary="Batched HippoRAG retrieval with dynamic micro-batching",
        lifespan=lifespan,
        responses={
            401: {"model": ErrorBody},
            413: {"model": ErrorBody},
            422: {"model": ErrorBody},
            429: {"model": ErrorBody},
            503: {"model": ErrorBody},
        },
    )
    app.add_middleware(_BodyLimit, max_bytes=config.max_body_bytes)
    app.state.batcher = batcher
    auth = _bearer_auth(config.token)

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

    @app.get("/healthz", summary="Liveness")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Readiness: index loaded and batcher accepting")
    async def readyz() -> JSONResponse:
        if batcher.accepting:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503)

    @app.get("/v1/stats", summary="Index counts and serving statistics", dependencies=[auth])
    async def stats() -> dict[str, Any]:
        return {
            "index": index_stats,
            "batcher": dataclasses.asdict(batcher.stats()),
            "limits": {
                "max_batch": config.batcher.max_batch,
                "max_wait_ms": config.batcher.max_wait_ms,
                "max_queue": config.batcher.max_queue,
                "max_queries_per_request": config.max_queries_per_request,
                "max_query_chars": config.max_query_chars,
                "max_top_k": config.max_top_k,
            },
        }

    @app.post(
        "/v1/retrieve",
        response_model=RetrieveResponse,
        summary="Rank passages for a batch of queries",
        dependencies=[auth],
    )
    async def retrieve(req: RetrieveRequest) -> JSONResponse:
        _check_limits(req, config)
        key = BatchKey(req.mode, req.top_k, req.return_seeds)
        try:
            answers = await batcher.submit(req.queries, key)
        except QueueFullError as e:
            raise HTTPException(429, "server busy: queue full", {"Retry-After": "1"}) from e
        except BatcherClosedError as e:
            raise HTTPException(503, "server shutting down") from e
        except ValueError as e:
            # The index rejects these queries for this mode (e.g. hipporag1 without entities).
            # Its messages describe the request, never the files.
            raise HTTPException(422, f"mode {req.mode!r} cannot answer: {e}") from e
        body: dict[str, Any] = {"results": [a.hits for a in answers]}
        body["seeds"] = [a.seeds for a in answers] if req.return_seeds else None
        # Hits were validated as they were built; skip a second pydantic pass on the event loop.
        return JSONResponse(body)

    return app


def _check_limits(req: RetrieveRequest, config: ServerConfig) -> None:
    if len(req.queries) > config.max_queries_per_request:
        raise HTTPException(
            413,
            f"too many queries: {len(req.queries)}, limit {config.max_queries_per_request}"
            " per request",
        )
    for i, q in enumerate(req.queries):
        if len(q) > config.max_query_chars:
            raise HTTPException(
                413, f"query {i} has {len(q)} characters, limit {config.max_query_chars}"
            )
        if not q.strip():
            raise HTTPException(422, f"query {i} is empty")
    if req.top_k > config.max_top_k:
        raise HTTPException(422, f"top_k {req.top_k} exceeds the limit {config.max_top_k}")


def _bearer_auth(token: str | None) -> Any:
    """A dependency that requires `Authorization: Bearer <token>` when a token is configured."""
    scheme = HTTPBearer(auto_error=False, description="required when the server has a token")
    expected = None if token is None else token.encode()

    async def check(
        creds: HTTPAuthorizationCredentials | None = Depends(scheme),
    ) -> None:
        if expected is None:
            return
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
        if isinstance(v, (bool, int, float)):
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
    "BatchKey",
    "Mode",
    "PassageHit",
    "RetrieveRequest",
    "RetrieveResponse",
    "ServerConfig",
    "create_app",
]
