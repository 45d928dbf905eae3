"""The HTTP contract's request side as pydantic models: the request schema built from
`ServerConfig` (the response bodies and their OpenAPI entries are responses.py).

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
from hippo_gpu.serve.config import ServerConfig
from hippo_gpu.serve.service import DEFAULT_INDEX, UnknownIndexError

__all__ = [
    "BLANK",
    "NONBLANK",
    "NO_IRCOT",
    "WHITESPACE",
    "ExplainRequest",
    "IRCoT",
    "Mode",
    "RetrieveRequest",
    "explain_request_model",
    "request_model",
    "short_issue",
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
