"""The HTTP contract as pydantic models: the request schema built from `ServerConfig`, the
response bodies, their examples, and the OpenAPI response entries the routes declare.

Every limit the server enforces is in the request schema (`request_model`), so a schema-valid
request is answered and a schema-invalid one gets 422:

- 1..max_queries_per_request queries of 1..max_query_chars characters; top_k in 1..max_top_k;
  mode in `config.MODES`; no other fields; types are strict (no "5" for 5).
- Whitespace-only text (a query or an entity) is refused: it asks nothing. "Whitespace" is
  Python's `str.isspace` set, spelled out code point by code point in the schema's `pattern` (see
  NONBLANK), so ECMA-262, Python `re` and Rust `regex` all read the pattern alike, and pydantic
  enforces that same pattern.
- `entities` (optional; null = absent) gives one list of entity strings per query (HippoRAG 1
  query NER, e.g. from hippo_gpu.llm.ner). hipporag1 is built on them and hybrid fuses their
  entity ranking; dense and hipporag2 ignore them. Without `entities` both use the LLM-free
  extractor's capitalised spans of each query (hippo_gpu.retrieval.entities), as Python and the
  command line do; the response's `entities` names the ones used. A query whose list is empty
  (given or found) gets no entity ranking: hipporag1 scores every passage 1/P, hybrid fuses its
  other rankings. JSON Schema cannot compare two array lengths, so the schema spells the rule
  out: an `anyOf` with one branch "no entities" and one branch per allowed length n ("n queries
  and n entity lists").
- `ircot` (optional): {"max_steps": S} runs each query through the IRCoT loop
  (hippo_gpu.retrieval.ircot), 1 <= S <= ServerConfig.max_ircot_steps, on a server started with an
  LLM (`--llm`); on one without, the field only accepts null and a value gets a 422 saying so.

What JSON Schema cannot state is the work budget (serve/budget.py): a product of the fields
(queries x their characters x top_k x mode x steps), estimated after validation; a request over
it gets the documented 413 with `OverBudgetBody`.

The model class names are the OpenAPI component names: renaming one changes the document.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

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

from hippo_gpu.config import MODES
from hippo_gpu.data import DataFormatError
from hippo_gpu.errors import BLANK
from hippo_gpu.indexing.labels import check_filter
from hippo_gpu.retrieval.ircot import STOPS
from hippo_gpu.serve.budget import OverBudgetError
from hippo_gpu.serve.config import ServerConfig, WriteLimits
from hippo_gpu.serve.explain_schema import ExplainResponse, SeedFact
from hippo_gpu.serve.service import DEFAULT_INDEX, UnknownIndexError

__all__ = [
    "API_DESCRIPTION",
    "BLANK",
    "NONBLANK",
    "WHITESPACE",
    "ErrorBody",
    "ExplainRequest",
    "ExplainResponse",
    "IRCoT",
    "IRCoTTrace",
    "IndexesResponse",
    "Mode",
    "OverBudgetBody",
    "PassageHit",
    "RetrieveRequest",
    "RetrieveResponse",
    "StatsResponse",
    "StatusBody",
    "ValidationErrorBody",
    "explain_request_model",
    "explain_responses",
    "request_model",
    "response_doc",
    "retrieve_responses",
    "unauthorized_response",
    "unknown_index_response",
]

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


def short_issue(error: Any) -> dict[str, Any]:
    """One pydantic validation error as the 422 body lists it: location, message and type, the
    input never echoed; an empty or whitespace-only text says `BLANK`, not the NONBLANK
    pattern."""
    loc, kind = list(error.get("loc", ())), error.get("type", "")
    ctx = error.get("ctx") or {}
    if (kind == "string_pattern_mismatch" and ctx.get("pattern") == NONBLANK) or \
            (kind == "string_too_short" and ctx.get("min_length") == 1):
        return {"loc": loc, "msg": BLANK, "type": "blank"}
    return {"loc": loc, "msg": error.get("msg", ""), "type": kind}


_QUERY = "Which Stanford University professor works on Alzheimer's?"
_REQUEST_EXAMPLES: list[dict[str, Any]] = [
    {"queries": [_QUERY], "top_k": 5, "mode": "hipporag2"},
    {"queries": [_QUERY, "Alzheimer's research"], "top_k": 3, "mode": "hybrid"},
    {"queries": [_QUERY], "top_k": 5, "mode": "hipporag1"},
    {"queries": [_QUERY], "entities": [["Stanford University", "Alzheimer's"]], "top_k": 5,
     "mode": "hipporag1", "return_seeds": False},  # fmt: skip
]


# The 413 example's estimate: 64 musique questions explained at top_k 999 (mode hipporag2).
_EXAMPLE_COST = 257_336

_EXPLAIN_EXAMPLES: list[dict[str, Any]] = [
    {"queries": [_QUERY], "top_k": 5, "mode": "hipporag2"},
    {"queries": [_QUERY], "top_k": 3, "mode": "hybrid"},
    {"queries": [_QUERY], "entities": [["Stanford University", "Alzheimer's"]], "top_k": 5,
     "mode": "hipporag1"},  # fmt: skip
]


def _max_items(model: type[BaseModel], field: str) -> int | None:
    for m in model.model_fields[field].metadata:
        if hasattr(m, "max_length"):
            return int(m.max_length)
    return None


def _request_schema_extra(schema: dict[str, Any], model: type[Any]) -> None:
    """Add the cross-field rule (one entity list per query) and examples."""
    n_max = _max_items(model, "queries")
    if n_max is None:  # the unconstrained base shape: nothing to spell out
        return
    no_entities = {"title": "without entities", "properties": {"entities": {"type": "null"}}}
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
    examples = _EXPLAIN_EXAMPLES if issubclass(model, ExplainRequest) else _REQUEST_EXAMPLES
    schema["examples"] = [e for e in examples if _accepts(model, e)]


def _accepts(model: type[BaseModel], body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


class IRCoT(BaseModel):
    """IRCoT for every query of a request (bounds: see `request_model`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_steps: int


# a metadata filter (indexing/labels.py): field -> a JSON scalar, or a non-empty list of them
FilterValue = str | int | float | bool | None
Where = Annotated[dict[str, FilterValue | Annotated[list[FilterValue], Field(min_length=1)]],
                  Field(min_length=1)]


class RetrieveRequest(BaseModel):
    """Queries answered with one mode and one top_k (limits: see `request_model`)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_request_schema_extra)

    queries: list[str]
    entities: list[list[str]] | None = None
    top_k: int = 10
    mode: Mode = "hipporag2"
    return_seeds: bool = False
    index: str | None = None
    ircot: IRCoT | None = None
    where: Where | None = None

    @model_validator(mode="after")
    def _entities_fit_queries(self) -> RetrieveRequest:
        _check_entities(self.queries, self.entities, self.mode)
        _check_where(self.where)
        return self


def _check_entities(queries: list[str], entities: list[list[str]] | None, mode: str) -> None:
    """One entity list per query (the rule `anyOf` spells out)."""
    if entities is not None and len(entities) != len(queries):
        raise ValueError(
            f"entities has {len(entities)} lists for {len(queries)} queries: give one list per "
            "query"
        )


class ExplainRequest(BaseModel):
    """Queries whose hits are explained: the fields and limits of RetrieveRequest, without
    return_seeds (an explanation always holds the seeds)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_request_schema_extra)

    queries: list[str]
    entities: list[list[str]] | None = None
    top_k: int = 10
    mode: Mode = "hipporag2"
    index: str | None = None
    where: Where | None = None

    @model_validator(mode="after")
    def _entities_fit_queries(self) -> ExplainRequest:
        _check_entities(self.queries, self.entities, self.mode)
        _check_where(self.where)
        return self


def _check_where(where: dict[str, Any] | None) -> None:
    """A metadata filter's shape (indexing/labels.check_filter), as a validation error."""
    if where is not None:
        try:
            check_filter(where)
        except DataFormatError as e:
            raise ValueError(str(e)) from None


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


NO_IRCOT = "ircot needs a server with an LLM for the thoughts: start it with --llm SPEC"


def _ircot_field(max_steps: int | None) -> Any:
    """The `ircot` field: {"max_steps": 1..max_steps} or null; only null without an LLM
    (max_steps None), where a value gets a 422 naming the cause."""
    if max_steps is None:
        def refuse(v: Any) -> Any:
            if v is not None:
                raise ValueError(NO_IRCOT)
            return v

        return (Annotated[None, BeforeValidator(refuse)],
                Field(default=None, description=f"not available: {NO_IRCOT}"))
    options: Any = create_model(
        "IRCoT", __base__=IRCoT, __doc__=IRCoT.__doc__,
        max_steps=(Annotated[int, BeforeValidator(_integral)],
                   Field(ge=1, le=max_steps, description="IRCoT steps per query: its own "
                         "retrieval, then up to max_steps - 1 LLM thoughts, each retrieved")))
    return (options | None, Field(
        default=None, description="run each query through IRCoT (interleaved LLM thoughts and "
        "retrievals); results are then every merged passage (up to top_k x max_steps), and "
        "`ircot` in the response holds each query's thoughts"))


def request_model(config: ServerConfig, indexes: Sequence[str] = (DEFAULT_INDEX,),
                  *, ircot: bool = False) -> type[RetrieveRequest]:
    """The `RetrieveRequest` model with `config`'s limits and the served `indexes`' names: the
    schema and the validator in one. `ircot`: the server has an LLM for IRCoT thoughts."""
    model: type[RetrieveRequest] = _batch_model(config, indexes, RetrieveRequest, ircot=ircot)
    return model


def explain_request_model(config: ServerConfig,
                          indexes: Sequence[str] = (DEFAULT_INDEX,)) -> type[ExplainRequest]:
    """The `ExplainRequest` model: the limits of `request_model` (the same builder)."""
    model: type[ExplainRequest] = _batch_model(config, indexes, ExplainRequest)
    return model


def _batch_model(config: ServerConfig, indexes: Sequence[str], base: type[Any], *,
                 ircot: bool = False) -> Any:
    """`base` (RetrieveRequest or ExplainRequest) with `config`'s limits and `indexes`
    (`ircot`: a retrieve request may ask for IRCoT)."""
    limits = config.limits
    text: Any = Annotated[
        str, StringConstraints(min_length=1, max_length=limits.max_query_chars, pattern=NONBLANK)
    ]
    entity: Any = Annotated[
        str, StringConstraints(min_length=1, max_length=limits.max_entity_chars, pattern=NONBLANK)
    ]
    per_query: Any = Annotated[list[entity], Field(max_length=limits.max_entities_per_query)]
    seeds: dict[str, Any] = {}
    if base is RetrieveRequest:
        seeds["return_seeds"] = (
            bool,
            Field(default=False, description="also return the seed facts of each query"),
        )
        seeds["ircot"] = _ircot_field(config.max_ircot_steps if ircot else None)
    what = "answered" if base is RetrieveRequest else "whose hits are explained"
    return create_model(
        base.__name__,
        __base__=base,
        __doc__=(
            f"Queries {what} with one mode and one top_k. `entities`, when given, has one list "
            "per query; hipporag1 and hybrid use it (else the capitalised spans of each query: "
            "the response's `entities` names those used), dense and hipporag2 ignore it."
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
                    "used by hipporag1 and hybrid (absent: the capitalised spans of each query), "
                    "ignored by dense and hipporag2"
                ),
            ),
        ),
        top_k=(
            Annotated[int, BeforeValidator(_integral)],
            Field(default=min(10, limits.max_top_k), ge=1, le=limits.max_top_k,
                  description="passages returned per query"),  # fmt: skip
        ),
        mode=(Mode, Field(default="hipporag2", description="retrieval mode")),
        **seeds,
        index=_index_field(indexes),
        where=(Where | None, Field(
            default=None, examples=[{"year": 2020, "source": ["news", "wiki"]}],
            description="a metadata filter: only passages whose own metadata has each field "
            "equal to its value (or to one of a list) are returned. Applied after the PPR: "
            "every score is the unfiltered one, and a query gets fewer than top_k hits when "
            "fewer passages match")),
    )


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
