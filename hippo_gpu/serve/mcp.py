"""Model Context Protocol tools over a `RetrievalService`, on the official `mcp` SDK (2.x).

Tools:
    retrieve(query, top_k=10, mode="hipporag2", index=None, entities=None)
        -> {"index", "version", "mode", "hits": [{"key", "title", "score", "rank", "text"},
        ...]}
    explain(query, top_k=10, mode="hipporag2", index=None, entities=None)
        -> {"index", "explanation": {"query", "seeds", "facts", "hits", "phrases", ...}}: each
        hit's score split into one term per seed and one for the dense prior
        (hippo_gpu.retrieval.explain; the JSON of POST /v1/explain)
    retrieve_ircot(query, max_steps=3, top_k=10, mode="hipporag2", index=None, entities=None)
        -> {"index", "mode", "hits", "thoughts", "steps", "stop", "error"}: IRCoT (serve/ircot.py,
        the HTTP API's "ircot"), only on a server given a thought source (`reasoner`)
    stats() -> {"indexes": [{"name", "version", "passages", "memory_bytes", "device",
                             "precision", "counts": {...}, "batcher": {...}}, ...]}
Resource:
    passage://{key} -> JSON {"key", "title", "text", "indexes": [names holding it]}

A retrieve call goes through `RetrievalService.retrieve`, i.e. the same per-index micro-batcher
as the HTTP API, so MCP and HTTP queries share batches. Arguments are checked against the same
per-query limits as HTTP (the server's `QueryLimits`, serve/config.py, stated in the tool's input
schema) and each call against the same work budget (`CostLimits`, estimated by
serve/budget.request_cost through `RetrievalService.admit`, as HTTP: one query, its entities,
top_k, mode, and retrieve_ircot's max_steps); a bad argument, an unknown index, hipporag1
without entities, a call over the budget or a full queue come back as a tool error (a result
with `isError` and a message), never as a crash of the session.

Transports: stdio (`hippo-gpu mcp --index DIR`, `serve_stdio`) and streamable HTTP mounted on the
HTTP server (`mount_streamable_http`, used by serve/server.py, which applies its bearer token).
This module imports `mcp` at import time: only import it when the `mcp` extra is installed.
"""

# No `from __future__ import annotations`: the tools' signatures carry this server's limits as
# runtime values, which the SDK reads from the annotations to build the input schemas.

import json
from dataclasses import asdict
from typing import Annotated, Any, Literal, NamedTuple

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field
from starlette.types import ASGIApp

from hippo_gpu.config import MODES
from hippo_gpu.errors import BLANK
from hippo_gpu.retrieval.ircot import IRCoTResult, ThoughtSource
from hippo_gpu.retrieval.modes import mode_of
from hippo_gpu.serve.batcher import BatcherClosedError, QueueFullError
from hippo_gpu.serve.budget import OverBudgetError
from hippo_gpu.serve.config import CostLimits, QueryLimits
from hippo_gpu.serve.ircot import answer_ircot, trace
from hippo_gpu.serve.service import Answer, RetrievalService, UnknownIndexError

__all__ = ["MountedMCP", "build_mcp_server", "mount_streamable_http", "serve_stdio"]

_INSTRUCTIONS = (
    "HippoRAG retrieval: `retrieve` ranks the indexed passages for a question (mode hipporag2 "
    "follows a knowledge graph for multi-hop questions; dense is plain embedding similarity; "
    "hybrid fuses both with an entity ranking). `explain` says why each passage ranked where "
    "it did: its score split into one term per seed phrase (with the facts that seeded it and "
    "the phrases its mass came through) and one for the dense prior. Read a whole passage with "
    "the resource passage://{key}. `stats` lists the served indexes."
)

# Hosts a loopback-only server answers when it guards against DNS rebinding (no token).
_LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
_LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


class HitOut(BaseModel):
    key: str = Field(description='passage key: "chunk-" + md5 of the indexed text')
    title: str
    score: float
    rank: int = Field(description="0-based position in the ranking")
    text: str = Field(description="the indexed passage text (title, newline, body)")
    id: str | None = Field(default=None, description="the passage's own id (null: none)")
    metadata: dict[str, Any] | None = Field(default=None,
                                            description="the passage's own metadata (null: none)")


class RetrieveOut(BaseModel):
    index: str = Field(description="the index that answered")
    version: int | None = Field(default=None, description=(
        "the index version that answered (IRCoT: the one every step read; null when a write "
        "committed between its steps, or for an index never saved)"))
    mode: str
    hits: list[HitOut] = Field(description="best first")
    entities: list[str] | None = Field(default=None, description=(
        "hipporag1 and hybrid: the entities linked (the call's, or the capitalised spans of the "
        "question); empty: none, so hipporag1 scored every passage alike; null in other modes"))


class IRCoTOut(RetrieveOut):
    thoughts: list[str] = Field(description="the reasoning steps written, in order")
    steps: int = Field(description="retrievals made: the question's own plus one per thought")
    stop: str = Field(description="why the loop ended (answered, max_steps, thought_failed, ...)")
    error: str | None = Field(description="the failure behind a failed stop, else null")


def build_mcp_server(service: RetrievalService, limits: QueryLimits | None = None, *,
                     reasoner: ThoughtSource | None = None, max_ircot_steps: int = 8,
                     cost: CostLimits | None = None) -> MCPServer:
    """An `MCPServer` whose tools answer through `service` (started by the caller); with a
    `reasoner` also `retrieve_ircot`, its max_steps at most `max_ircot_steps`. Each call must fit
    the work budget `cost` (default: `CostLimits()`)."""
    limits = limits or QueryLimits()
    server: MCPServer = MCPServer(
        "hippo-gpu", instructions=_INSTRUCTIONS, log_level="WARNING",
        warn_on_duplicate_tools=False)  # fmt: skip
    types = _arg_types(limits, service.names, service.default, max_ircot_steps)
    one_query = _OneQuery(service, cost or CostLimits(), reasoner)
    _add_query_tools(server, one_query, types, limits, max_ircot_steps,
                     ircot=reasoner is not None)
    _add_index_tools(server, service)
    return server


# What a tool caller reads for the failures every query tool shares (one mapping for all).
_SHARED_ERRORS = (UnknownIndexError, OverBudgetError, QueueFullError, BatcherClosedError)


def _tool_error(e: Exception) -> ToolError:
    """The tool error of a failure any query tool may meet: an unknown index or a call over
    the budget says why; a full queue asks to retry; a closing server says so."""
    if isinstance(e, QueueFullError):
        return ToolError("server busy: queue full; retry in a second")
    if isinstance(e, BatcherClosedError):
        return ToolError("server shutting down")
    return ToolError(str(e))


_Scalar = str | int | float | bool | None  # a metadata filter's values (indexing/labels.py)


class _ArgTypes(NamedTuple):
    """The query tools' argument types: they carry this server's limits, and the SDK builds
    each tool's input schema from them."""

    query: Any
    top_k: Any
    entities: Any
    index: Any
    mode: Any
    steps: Any
    where: Any


def _arg_types(limits: QueryLimits, names: list[str], default: str,
               max_ircot_steps: int) -> _ArgTypes:
    # blank text (empty included) is refused by _check_arguments, as on every surface
    entity = Annotated[str, Field(max_length=limits.max_entity_chars)]
    return _ArgTypes(
        query=Annotated[str, Field(max_length=limits.max_query_chars,
                                   description="the question")],
        top_k=Annotated[int, Field(ge=1, le=limits.max_top_k, description="passages to return")],
        entities=Annotated[
            list[entity] | None,
            Field(max_length=limits.max_entities_per_query,
                  description="named entities of the question: used by hipporag1 and hybrid "
                              "(absent: the capitalised spans of the question), ignored by dense "
                              "and hipporag2"),
        ],
        index=Annotated[
            str | None,
            Field(max_length=64, description=f"index to search, one of {names} (default: "
                                             f"{default!r})"),
        ],
        mode=Annotated[Literal[MODES], Field(description="retrieval mode")],  # type: ignore[valid-type]
        steps=Annotated[int, Field(ge=1, le=max_ircot_steps, description=(
            "retrievals at most: the question's own, then one per thought"))],
        where=Annotated[
            dict[str, _Scalar | Annotated[list[_Scalar], Field(min_length=1)]] | None,
            Field(min_length=1, description=(
                "a metadata filter: only passages whose own metadata has each field equal to "
                "its value (or to one of a list); applied after the PPR, scores unchanged"))],
    )


class _OneQuery:
    """One tool call's query through the service: its arguments checked, admitted to the work
    budget, answered (by IRCoT with `ircot_steps`); every failure comes back as a ToolError."""

    def __init__(self, service: RetrievalService, budget: CostLimits,
                 reasoner: ThoughtSource | None) -> None:
        self.service, self.budget, self.reasoner = service, budget, reasoner

    async def __call__(self, query: str, top_k: int, mode: str, index: str | None,
                       entities: list[str] | None, *, explain: bool = False,
                       ircot_steps: int | None = None, where: dict[str, Any] | None = None
                       ) -> tuple[str, Answer, IRCoTResult | None]:
        """(index name, answer, IRCoT result when `ircot_steps`)."""
        _check_arguments(query, entities)
        how = mode_of(mode)  # the tool's schema admits only config.MODES
        service = self.service
        ents = None if entities is None else [entities]
        result = None
        try:
            served = service.get(index)
            service.admit(self.budget, [query], top_k=top_k, mode=how, entities=ents,
                          index=served.name, explain=explain, steps=ircot_steps or 1)
            if ircot_steps is None:
                answers = await service.retrieve(
                    [query], top_k=top_k, mode=how, index=served.name, entities=ents,
                    transport="mcp", explain=explain, where=where)
            else:
                assert self.reasoner is not None  # the tool is registered only with one
                answers, results = await answer_ircot(
                    service, self.reasoner, [query], top_k=top_k, mode=how,
                    max_steps=ircot_steps, entities=ents, index=served.name, transport="mcp",
                    where=where)
                result = results[0]
        except _SHARED_ERRORS as e:
            raise _tool_error(e) from e
        if answers[0].error is not None:
            raise ToolError(f"retrieval failed: {answers[0].error}")
        return served.name, answers[0], result


def _add_query_tools(server: MCPServer, one_query: _OneQuery, types: _ArgTypes,
                     limits: QueryLimits, max_ircot_steps: int, *, ircot: bool) -> None:
    """The tools `retrieve` and `explain`, and `retrieve_ircot` when `ircot`."""
    query_text, top_k_type, entities_type, index_type, mode_type, steps_type, where_type = types
    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

    async def retrieve(
        query: query_text,  # type: ignore[valid-type]
        top_k: top_k_type = min(10, limits.max_top_k),  # type: ignore[valid-type]
        mode: mode_type = "hipporag2",  # type: ignore[valid-type]
        index: index_type = None,  # type: ignore[valid-type]
        entities: entities_type = None,  # type: ignore[valid-type]
        where: where_type = None,  # type: ignore[valid-type]
    ) -> RetrieveOut:
        """Rank the indexed passages for one question; best first."""
        name, answer, _ = await one_query(query, top_k, mode, index, entities, where=where)
        return RetrieveOut(index=name, version=answer.version, mode=mode,
                           hits=[HitOut(**h) for h in answer.hits], entities=answer.entities)

    async def explain(
        query: query_text,  # type: ignore[valid-type]
        top_k: top_k_type = min(10, limits.max_top_k),  # type: ignore[valid-type]
        mode: mode_type = "hipporag2",  # type: ignore[valid-type]
        index: index_type = None,  # type: ignore[valid-type]
        entities: entities_type = None,  # type: ignore[valid-type]
        where: where_type = None,  # type: ignore[valid-type]
    ) -> dict[str, Any]:
        """Why each passage ranked where it did: the hits of `retrieve`, each score split into
        one term per seed phrase and one for the dense prior, within a certified bound."""
        name, answer, _ = await one_query(query, top_k, mode, index, entities, explain=True,
                                          where=where)
        return {"index": name, "explanation": answer.explanation}

    async def retrieve_ircot(
        query: query_text,  # type: ignore[valid-type]
        max_steps: steps_type = min(3, max_ircot_steps),  # type: ignore[valid-type]
        top_k: top_k_type = min(10, limits.max_top_k),  # type: ignore[valid-type]
        mode: mode_type = "hipporag2",  # type: ignore[valid-type]
        index: index_type = None,  # type: ignore[valid-type]
        entities: entities_type = None,  # type: ignore[valid-type]
        where: where_type = None,  # type: ignore[valid-type]
    ) -> IRCoTOut:
        """Multi-step retrieval: the question's ranking, then an LLM thought per step, each
        retrieved in turn; every passage found keeps its best score, best first."""
        name, answer, result = await one_query(query, top_k, mode, index, entities,
                                               ircot_steps=max_steps, where=where)
        assert result is not None
        return IRCoTOut(index=name, version=answer.version, mode=mode,
                        hits=[HitOut(**h) for h in answer.hits], **trace(result))

    server.tool(name="retrieve", annotations=read_only, structured_output=True)(retrieve)
    server.tool(name="explain", annotations=read_only)(explain)
    if ircot:  # an LLM writes the thoughts: not read-only in the hint's sense
        server.tool(name="retrieve_ircot", structured_output=True,
                    annotations=ToolAnnotations(read_only_hint=True, open_world_hint=True)
                    )(retrieve_ircot)


def _add_index_tools(server: MCPServer, service: RetrievalService) -> None:
    """The tool `stats` and the resource passage://{key}."""

    async def stats() -> dict[str, Any]:
        """The served indexes: counts, version, memory and batching statistics."""
        out = []
        for served in service.indexes.values():
            info = served.describe()
            info["counts"] = {k: v for k, v in served.holder.current.index.stats().items()
                              if isinstance(v, (int, float, bool))}  # fmt: skip
            info["batcher"] = asdict(served.batcher.stats())
            out.append(info)
        return {"indexes": out}

    async def passage(key: str) -> str:
        found = service.passage(key)
        if found is None:
            raise ResourceNotFoundError(f"no served index holds passage {key[:80]!r}")
        return json.dumps(found, ensure_ascii=False)

    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)
    server.tool(name="stats", annotations=read_only)(stats)
    server.resource("passage://{key}", name="passage", mime_type="application/json",
                    description="one indexed passage by key: title, text and the indexes that "
                                "hold it")(passage)  # fmt: skip


def _check_arguments(query: str, entities: list[str] | None) -> None:
    """What the input schema cannot say: blank text (the message every surface gives)."""
    if not query.strip():
        raise ToolError(f"query {BLANK}")
    if entities is not None and any(not e.strip() for e in entities):
        raise ToolError(f"an entity {BLANK}")


class MountedMCP(NamedTuple):
    """The streamable-HTTP endpoint: run `session_manager.run()` in the host app's lifespan and
    route requests to `asgi`."""

    session_manager: StreamableHTTPSessionManager
    asgi: ASGIApp


def mount_streamable_http(service: RetrievalService, limits: QueryLimits, path: str, *,
                          dns_rebinding_guard: bool, reasoner: ThoughtSource | None = None,
                          max_ircot_steps: int = 8, cost: CostLimits | None = None) -> MountedMCP:
    """The MCP tools over streamable HTTP at `path`, for another ASGI app to route to.

    Stateless with JSON responses: every POST carries a whole exchange, so nothing is kept per
    client and any replica can answer. With `dns_rebinding_guard` (a server without a token) only
    loopback Host and Origin headers are accepted, so a web page cannot reach a local server
    through a rebound DNS name; with a token the token is the guard.
    """
    server = build_mcp_server(service, limits, reasoner=reasoner,
                              max_ircot_steps=max_ircot_steps, cost=cost)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=dns_rebinding_guard,
        allowed_hosts=_LOOPBACK_HOSTS, allowed_origins=_LOOPBACK_ORIGINS)  # fmt: skip
    server.streamable_http_app(streamable_http_path=path, stateless_http=True, json_response=True,
                               transport_security=security)  # fmt: skip
    manager = server.session_manager
    return MountedMCP(manager, StreamableHTTPASGIApp(manager))


async def serve_stdio(service: RetrievalService, limits: QueryLimits | None = None, *,
                      reasoner: ThoughtSource | None = None, max_ircot_steps: int = 8,
                      cost: CostLimits | None = None) -> None:
    """Answer MCP over stdin/stdout until the client closes it; starts and drains `service`."""
    server = build_mcp_server(service, limits, reasoner=reasoner,
                              max_ircot_steps=max_ircot_steps, cost=cost)
    async with service:
        await server.run_stdio_async()
