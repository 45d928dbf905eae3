"""HTTP query server: validate -> micro-batch -> search. No retrieval logic lives here.

Endpoints (operationId in brackets):
    POST /v1/retrieve [retrieve]  {"queries": [str, ...], "entities": [[str, ...] per query],
                                   "top_k": int, "mode": str, "return_seeds": bool}
        -> {"results": [[{"key", "title", "text", "score", "rank"}, ...] per query],
            "seeds": [[[subject, predicate, object], ...] per query] | null}
    GET  /v1/stats [stats]    index counts, queue depth, batches, mean batch size, latencies.
    GET  /healthz [healthz]   liveness: the process answers.
    GET  /readyz [readyz]     readiness: index loaded and batcher accepting (else 503).
    GET  /docs, /redoc, /openapi.json   the OpenAPI document and its viewers.

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

Authentication: when `ServerConfig.token` is set, /v1/retrieve and /v1/stats need
`Authorization: Bearer <token>` (401 otherwise) and the schema declares HTTP bearer security on
exactly those operations; /healthz, /readyz and the docs stay open for probes. Without a token
the schema declares no security at all. The caller (the CLI) owns secrets: the token arrives in
`ServerConfig`, never from the environment here. Error bodies carry a short message only.

Batching rule: only requests with the same (mode, top_k, return_seeds, with_entities) share a
batch. `Searcher.retrieve` takes entities for every query of a call or for none (none: hybrid's
capitalised-span fallback), so queries with and without entities cannot share a call; each query
then gets exactly the ranking it would get alone. Running a merged batch at the largest top_k and
truncating would also be sound in exact arithmetic, but ties broken differently by a larger `topk`
could reorder equal-score passages and break the promise that a served ranking equals the offline
`retrieve()` for the same arguments; clients normally send one top_k, so the grouping costs little.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math
from collections.abc import Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
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
from hippo_gpu.serve.writes import SearcherHolder, write_router

log = logging.getLogger(__name__)

# The request schema's mode enum: exactly the modes retrieval accepts.
Mode = Literal[MODES]  # type: ignore[valid-type]

# Modes that read `entities`; the others ignore them.
ENTITY_MODES = ("hybrid", "hipporag1")

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
        token: bearer token required on /v1/*; None serves without authentication.
    """

    batcher: BatcherConfig = dataclasses.field(default_factory=BatcherConfig)
    max_queries_per_request: int = 64
    max_query_chars: int = 2_000
    max_entities_per_query: int = 16
    max_entity_chars: int = 200
    max_top_k: int = 1_000
    token: str | None = dataclasses.field(default=None, repr=False)

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


def request_model(config: ServerConfig) -> type[RetrieveRequest]:
    """The `RetrieveRequest` model with `config`'s limits: the schema and the validator in one."""
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


# ---------------------------------------------------------------------------------------------
# retrieval adapter (runs on the batcher's worker thread)


class BatchKey(NamedTuple):
    mode: str
    top_k: int
    return_seeds: bool
    with_entities: bool  # every query of the batch carries its entities, or none does


class Query(NamedTuple):
    """One query as it travels through the batcher."""

    text: str
    entities: list[str] | None  # None: not given, or not read by the mode


class _Answer(NamedTuple):
    hits: list[dict[str, Any]]  # JSON-ready PassageHit dicts
    seeds: list[Any] | None


class _SearcherAdapter:
    """Runs one batch through `Searcher.retrieve` and turns hits into JSON-ready dicts.

    Each batch takes the holder's current searcher once, at its start, and uses only it: a
    write that commits meanwhile switches later batches, never this one (no mixed versions).
    """

    def __init__(self, holder: SearcherHolder) -> None:
        self._holder = holder

    def __call__(self, queries: list[Query], key: Hashable) -> list[_Answer]:
        if not isinstance(key, BatchKey):
            raise TypeError(f"batch key must be a BatchKey, got {type(key).__name__}")
        searcher = self._holder.current  # one version for the whole batch
        passage_texts = searcher.index.passage_texts
        texts = [q.text for q in queries]
        entities: list[list[str]] | None = None
        if key.with_entities:
            entities = [q.entities for q in queries if q.entities is not None]
            if len(entities) != len(queries):
                raise TypeError("a batch keyed with_entities holds a query without entities")
        seeds: Sequence[list[Any] | None]
        if key.return_seeds:
            hits, raw = searcher.retrieve(texts, top_k=key.top_k, mode=key.mode,
                                          query_entities=entities, return_seeds=True)
            seeds = [[_jsonable(s) for s in per_query] for per_query in raw]
        else:
            hits = searcher.retrieve(texts, top_k=key.top_k, mode=key.mode,
                                     query_entities=entities)
            seeds = [None] * len(queries)
        if len(hits) != len(queries):
            raise BatchOutputError(f"retrieve returned {len(hits)} rankings for {len(queries)}")
        return [
            _Answer([_hit(h, passage_texts) for h in per_query], s)
            for per_query, s in zip(hits, seeds, strict=True)
        ]


def _hit(h: Hit, passage_texts: Sequence[str]) -> dict[str, Any]:
    return {
        "key": h.key,
        "title": h.title,
        "text": passage_texts[h.row],
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


_API_DESCRIPTION = (
    "HippoRAG retrieval over one index. The schema states every limit the server enforces: a "
    "request that fits it gets 200 (or 413 / 429 / 503: body bytes, load, shutdown) and one that "
    "does not gets 422. Bearer security is declared, and enforced, only when the server has a "
    "token; /healthz and /readyz are always open."
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


def create_app(searcher: Searcher | SearcherHolder,
               config: ServerConfig | None = None) -> FastAPI:
    """Build the FastAPI app serving `searcher` (its index already loaded, on its device).

    Pass a `SearcherHolder` with an index directory (and configure a token) to also serve
    POST / DELETE /v1/passages (serve/writes.py): queries then switch to each committed version.
    The batcher starts with the app's lifespan and, at shutdown, finishes every queued and
    in-flight batch before the app stops (uvicorn first waits for open requests).
    """
    config = config or ServerConfig()
    holder = searcher if isinstance(searcher, SearcherHolder) else SearcherHolder(searcher)
    adapter = _SearcherAdapter(holder)
    batcher: MicroBatcher[Query, _Answer] = MicroBatcher(adapter, config.batcher)
    index_stats = _public_stats(holder.current.index.stats())
    request_cls = request_model(config)

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
        description=_API_DESCRIPTION,
        lifespan=lifespan,
    )
    app.add_middleware(_BodyLimit, max_bytes=config.max_body_bytes)
    app.state.batcher = batcher
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
        summary="Readiness: index loaded and batcher accepting",
        response_model=StatusBody,
        responses={
            200: {"content": {"application/json": {"example": {"status": "ready"}}}},
            503: _response(StatusBody, "not accepting requests (starting or shutting down)",
                           {"status": "not ready"}),
        },
    )
    async def readyz() -> JSONResponse:
        if batcher.accepting:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503)

    @app.get(
        "/v1/stats",
        operation_id="stats",
        summary="Index counts and serving statistics",
        response_model=StatsResponse,
        responses=auth_responses,
        dependencies=protected,
    )
    async def stats() -> dict[str, Any]:
        current = holder.current.index
        return {
            "index": _public_stats(current.stats()),
            "batcher": dataclasses.asdict(batcher.stats()),
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

    async def retrieve(req: RetrieveRequest) -> JSONResponse:
        with_entities = req.entities is not None and req.mode in ENTITY_MODES
        entities = req.entities if with_entities and req.entities is not None else None
        queries = [
            Query(q, None if entities is None else entities[i]) for i, q in enumerate(req.queries)
        ]
        key = BatchKey(req.mode, req.top_k, req.return_seeds, with_entities)
        try:
            answers = await batcher.submit(queries, key)
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
    if holder.index_dir is not None and config.token is not None:
        app.include_router(write_router(holder, protected[0], auth_responses))
    return app


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
