"""The HTTP contract's response side: the response bodies as pydantic models, their examples,
and the OpenAPI response entries the routes declare (the request side is schema.py). The model
class names are the OpenAPI component names: renaming one changes the document.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from hippo_gpu.errors import BLANK
from hippo_gpu.retrieval.ircot import STOPS
from hippo_gpu.serve.budget import OverBudgetError
from hippo_gpu.serve.config import ServerConfig, WriteLimits
from hippo_gpu.serve.explain_schema import SeedFact

__all__ = [
    "API_DESCRIPTION",
    "ErrorBody",
    "IRCoTTrace",
    "IndexesResponse",
    "OverBudgetBody",
    "PassageHit",
    "RetrieveResponse",
    "StatsResponse",
    "StatusBody",
    "ValidationErrorBody",
    "explain_responses",
    "response_doc",
    "retrieve_responses",
    "unauthorized_response",
    "unknown_index_response",
    "write_responses",
]

# The 413 example's estimate: 64 musique questions explained at top_k 999 (mode hipporag2).
_EXAMPLE_COST = 257_336


class PassageHit(BaseModel):
    key: str = Field(description='passage key: "chunk-" + md5 of the indexed text')
    title: str
    text: str = Field(description="the indexed passage text (HippoRAG: title, newline, body)")
    score: float
    rank: int = Field(ge=0, description="0-based position in the ranking")
    id: str | None = Field(default=None, description="the passage's own id (its corpus item's "
                           '"id"); absent when it has none')
    metadata: dict[str, Any] | None = Field(
        default=None, description="the passage's own metadata (its corpus item's "
        '"metadata"); absent when it has none')


class IRCoTTrace(BaseModel):
    thoughts: list[str] = Field(description="the LLM's thoughts, in order")
    steps: int = Field(ge=1, description="the query's own retrieval and one per thought")
    stop: Literal[STOPS] = Field(  # type: ignore[valid-type]
        description="why the loop ended: a thought gave the answer, the steps ran out, a "
                    "thought or a retrieval failed (the query keeps what it had)")
    error: str | None = Field(default=None, description="the failure behind a failed stop")


class RetrieveResponse(BaseModel):
    results: list[list[PassageHit]] = Field(description="per query, in request order, the ranking")
    seeds: list[list[SeedFact]] | None = Field(
        default=None,
        description="per query, the seed facts of its PPR (empty for dense answers and "
        "hipporag1); null unless return_seeds",
    )
    entities: list[list[str]] | None = Field(
        default=None,
        description="hipporag1 and hybrid: per query, the entities its entity ranking linked: "
        "the request's, or without them the capitalised spans of the query (the LLM-free "
        "extractor). An empty list: none, so hipporag1 scored every passage 1/P and hybrid "
        "fused no entity ranking. Absent in the other modes")
    version: int | None = Field(
        default=None,
        description="the index version that answered every query of this request (one batch "
        "reads one version: a write committed meanwhile switches later requests only); a "
        "request sent after a write's 200 names that write's version or a later one. An IRCoT "
        "request names it when every step read that version, else null (a write committed "
        "between its steps). Null for an index never saved")
    ircot: list[IRCoTTrace] | None = Field(
        default=None, description="per query, its IRCoT thoughts; null unless ircot")
    errors: list[str | None] | None = Field(
        default=None,
        description="present only when some query of a batch failed: per query, null when "
        "answered, else why it was not (its ranking is then empty; the others are answered). "
        "A request of one query that fails gets a 500 naming the cause instead",
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
    max_request_cost: int = Field(description="the work budget of one retrieve or explain "
                                  "request, in estimated units (beyond: 413)")


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


class OverBudgetBody(ErrorBody):
    estimate: int = Field(description="the request's estimated work, in units (about a "
                          "millisecond of the machine the budget was calibrated on)")
    limit: int = Field(description="the most work one request may ask for on this server")


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(description='where: e.g. ["body", "queries", 0]')
    msg: str
    type: str


class ValidationErrorBody(BaseModel):
    detail: list[ValidationIssue]


def response_doc(model: Any, description: str, example: Any,
                 headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """One entry of a route's `responses`: `model`'s schema (a pydantic model, or a union of
    them), a description, an example body."""
    out: dict[str, Any] = {
        "model": model,
        "description": description,
        "content": {"application/json": {"example": example}},
    }
    if headers:
        out["headers"] = headers
    return out


def unauthorized_response() -> dict[str, Any]:
    """The 401 of a route behind the bearer token (serve/guards.py answers it)."""
    return response_doc(
        ErrorBody, "missing or invalid bearer token",
        {"detail": "missing or invalid bearer token"},
        {"WWW-Authenticate": {"description": "Bearer", "required": True,
                              "schema": {"type": "string"}}},
    )  # fmt: skip


API_DESCRIPTION = (
    "HippoRAG retrieval over one or more named indexes. The schema states every per-field limit "
    "the server enforces: a request that fits it gets 200 (or 413 / 429 / 503: body bytes or "
    "estimated work over the budget, load, shutdown) and one that does not gets 422. Bearer "
    "security is declared, and enforced, only when the server has a token; /healthz and /readyz "
    "are always open. /mcp (not described here) serves "
    "the same retrieval to Model Context Protocol clients (streamable HTTP), behind the same token."
)


def retrieve_responses(config: ServerConfig) -> dict[int | str, dict[str, Any]]:
    """POST /v1/retrieve's documented answers (200, and every error status it can give)."""
    max_body_bytes, budget = config.max_body_bytes, config.cost.max_request_cost
    hit = {"key": "chunk-4f1c0d5e9b2a7c3d8e6f1a2b3c4d5e6f", "title": "Thomas C. Südhof",
           "text": "Thomas C. Südhof\nThomas Christian Südhof is a professor at Stanford ...",
           "score": 0.0123, "rank": 0}  # fmt: skip
    return {
        200: {
            "description": "per query, in request order, up to top_k passages, best first",
            "content": {"application/json": {"example": {"results": [[hit]], "seeds": None}}},
        },
        400: response_doc(ErrorBody, "the body could not be read (e.g. not UTF-8)",
                          {"detail": "There was an error parsing the body"}),
        413: response_doc(
            ErrorBody | OverBudgetBody,
            f"request body over {max_body_bytes} bytes (no schema-valid request, even with "
            "every character escaped, is that large), or the request's estimated work over "
            f"the budget of {budget} units (OverBudgetBody: queries, their characters and "
            "entities, top_k, mode and IRCoT steps; send less per request)",
            {"detail": str(OverBudgetError(_EXAMPLE_COST, budget)), "estimate": _EXAMPLE_COST,
             "limit": budget},
        ),
        422: response_doc(
            ValidationErrorBody,
            "the request does not fit the schema: e.g. an empty or whitespace-only query, too "
            "many queries or characters, top_k out of range, an unknown mode or field, or "
            "entities not one list per query",
            {"detail": [{"loc": ["body", "queries", 0], "type": "blank", "msg": BLANK}]},
        ),  # fmt: skip
        429: response_doc(
            ErrorBody, "the queue is full; retry after the given seconds",
            {"detail": "server busy: queue full"},
            {"Retry-After": {"description": "seconds", "required": True,
                             "schema": {"type": "integer"}}},
        ),  # fmt: skip
        500: response_doc(ErrorBody, "internal error", {"detail": "internal server error"}),
        503: response_doc(ErrorBody, "shutting down", {"detail": "server shutting down"}),
    }


def write_responses(limits: WriteLimits) -> dict[int | str, dict[str, Any]]:
    """The write routes' documented 400, 413 and 429 (serve/writes.py documents the others)."""
    return {
        400: response_doc(ErrorBody, "the body could not be read (e.g. not UTF-8)",
                          {"detail": "There was an error parsing the body"}),
        413: response_doc(ErrorBody, f"request body over {limits.max_body_bytes} bytes",
                          {"detail": f"request body too large: limit {limits.max_body_bytes} "
                                     "bytes"}),
        429: response_doc(
            ErrorBody, f"more than {limits.writes_per_second:g} write requests per second "
                       f"(bursts of {limits.write_burst}); retry after the given seconds",
            {"detail": "too many writes"},
            {"Retry-After": {"description": "seconds", "required": True,
                             "schema": {"type": "integer"}}}),
    }


def explain_responses(config: ServerConfig) -> dict[int | str, dict[str, Any]]:
    """POST /v1/explain's documented answers: retrieve's errors, its own 200."""
    out = retrieve_responses(config)
    out[200] = {"description": "per query, in request order, its hits and each hit's score "
                               "split into one term per seed and one for the dense prior"}
    return out


def unknown_index_response(default: str) -> dict[str, Any]:
    """The 422 of a query parameter `index` that names no served index."""
    return response_doc(
        ValidationErrorBody, "not a served index name",
        {"detail": [{"loc": ["query", "index"], "type": "literal_error",
                     "msg": f"Input should be {default!r}"}]})  # fmt: skip
