"""Prometheus metrics of one server app, in their own registry (several apps in one process, as
in the tests, never share or collide).

Names (all prefixed `hippo_`; counters end in `_total` on the wire):

    hippo_http_requests_total{route, method, status}      every HTTP request, by route and code
    hippo_http_request_duration_seconds{route, method}    histogram, request in -> response sent
    hippo_retrieve_requests_total{index, mode, transport, status}
                                                          retrieve calls (HTTP or MCP) that got
                                                          to the batcher; status: ok | queue_full
                                                          | shutting_down | cancelled | error
    hippo_queries_total{index, mode, transport, status}  the queries of those calls
    hippo_retrieve_latency_seconds{index, mode, transport}
                                                          histogram, submit -> result (queue wait
                                                          included) of calls answered ok
    hippo_batch_size{index}                               histogram, queries per batched call
    hippo_batch_duration_seconds{index}                   histogram, one batched call's time on
                                                          the worker thread
    hippo_rejected_requests_total{reason}                 refused requests: auth (401),
                                                          body_too_large (413), invalid (422),
                                                          over_budget (413 / MCP tool error:
                                                          serve/budget.py), queue_full (429 /
                                                          MCP tool error), shutting_down (503 /
                                                          MCP tool error)
    hippo_queue_depth{index}                              queries waiting (gauge, at scrape time)
    hippo_in_flight_queries{index}                        queries in the running batch
    hippo_index_version{index}                            committed version being served (absent
                                                          for an index that was never saved)
    hippo_index_passages{index}                           passages in the served version
    hippo_index_memory_bytes{index}                       bytes of its tensors on its device
    hippo_index_versions_in_memory{index}                 versions this process still holds:
                                                          the served one, plus those in-flight
                                                          batches read (more after the writes
                                                          stop: something keeps old versions)
    hippo_remote_encode_{calls,requests,texts,retries,failures}_total{index}
                                                          an index with a server encoder
                                                          ("openai:" model; absent for others
                                                          and until it loads): encoder calls (one
                                                          per batch of queries), HTTP requests
                                                          (tries included), texts, retries,
                                                          calls failed after their retries
    hippo_remote_encode_seconds_total{index}              wall seconds of those calls

Route labels are the app's route paths (a fixed set); any other path is "other", so a scanner
cannot grow the label set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONTENT_TYPE", "EncoderCounters", "IndexGauges", "Metrics", "MetricsMiddleware"]

# The text exposition format, as prometheus_client writes it.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# HTTP statuses that mean "refused"; the others are counted where they arise, so MCP calls are
# counted too and nothing twice: 413 by the body limit (serve/guards.BodyLimit, `on_reject`) and by
# the work budget (serve/service.RetrievalService.admit), 429 and 503 by the service.
_REJECTED = {401: "auth", 422: "invalid"}
REJECT_REASONS = ("auth", "body_too_large", "invalid", "over_budget", "queue_full",
                  "shutting_down")

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class IndexGauges:
    """One served index's gauges, read at scrape time."""

    queue_depth: int
    in_flight: int
    version: int | None
    passages: int
    memory_bytes: int
    versions_in_memory: int = 1


# (field of IndexGauges, metric name, help)
_INDEX_GAUGES = (
    ("queue_depth", "hippo_queue_depth", "Queries waiting, not yet in a batch"),
    ("in_flight", "hippo_in_flight_queries", "Queries in the batch now running"),
    ("version", "hippo_index_version", "Committed index version being served"),
    ("passages", "hippo_index_passages", "Passages in the served index version"),
    ("memory_bytes", "hippo_index_memory_bytes", "Bytes of the index's tensors on its device"),
    ("versions_in_memory", "hippo_index_versions_in_memory",
     "Index versions this process still holds (the served one and those in-flight batches read)"),
)


class _IndexCollector(Collector):
    """Per-index gauges computed on each scrape from a callback (no state to keep in sync)."""

    def __init__(self, read: Callable[[], Iterable[tuple[str, IndexGauges]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = [(f, GaugeMetricFamily(n, h, labels=["index"])) for f, n, h in _INDEX_GAUGES]
        for name, gauges in self._read():
            for field, family in families:
                value = getattr(gauges, field)
                if value is not None:
                    family.add_metric([name], float(value))
        yield from (family for _, family in families)

    def describe(self) -> list[GaugeMetricFamily]:
        # The registry calls describe() at registration to check names; collect() would read the
        # indexes before they are served.
        return [GaugeMetricFamily(n, h, labels=["index"]) for _, n, h in _INDEX_GAUGES]


@dataclass(frozen=True)
class EncoderCounters:
    """One served index's server-encoder counts, cumulative since its encoder loaded."""

    calls: int
    requests: int
    texts: int
    retries: int
    failures: int
    seconds: float


# (field of EncoderCounters, metric name without _total, help)
_ENCODER_COUNTERS = (
    ("calls", "hippo_remote_encode_calls", "Encoder calls to the embeddings server"),
    ("requests", "hippo_remote_encode_requests",
     "HTTP requests to the embeddings server, retries included"),
    ("texts", "hippo_remote_encode_texts", "Texts embedded by the embeddings server"),
    ("retries", "hippo_remote_encode_retries", "Retried requests to the embeddings server"),
    ("failures", "hippo_remote_encode_failures",
     "Encoder calls to the embeddings server that failed after their retries"),
    ("seconds", "hippo_remote_encode_seconds", "Wall seconds of encoder calls to the server"),
)


class _EncoderCollector(Collector):
    """Server-encoder counters read on each scrape from the encoders' own running counts."""

    def __init__(self, read: Callable[[], Iterable[tuple[str, EncoderCounters]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        families = [(f, CounterMetricFamily(n, h, labels=["index"]))
                    for f, n, h in _ENCODER_COUNTERS]
        for name, counters in self._read():
            for field, family in families:
                family.add_metric([name], float(getattr(counters, field)))
        yield from (family for _, family in families)

    def describe(self) -> list[CounterMetricFamily]:
        return [CounterMetricFamily(n, h, labels=["index"]) for _, n, h in _ENCODER_COUNTERS]


class Metrics:
    """The server's metrics in a registry of their own; `exposition()` is the /metrics body."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter(
            "hippo_http_requests", "HTTP requests by route, method and status code",
            ["route", "method", "status"], registry=r)
        self.http_duration = Histogram(
            "hippo_http_request_duration_seconds", "HTTP request in -> response sent",
            ["route", "method"], registry=r)
        self.retrieve_requests = Counter(
            "hippo_retrieve_requests", "Retrieve calls that reached the batcher",
            ["index", "mode", "transport", "status"], registry=r)
        self.queries = Counter(
            "hippo_queries", "Queries of the retrieve calls that reached the batcher",
            ["index", "mode", "transport", "status"], registry=r)
        self.retrieve_latency = Histogram(
            "hippo_retrieve_latency_seconds", "Retrieve call submit -> result (answered calls)",
            ["index", "mode", "transport"], registry=r)
        self.batch_size = Histogram(
            "hippo_batch_size", "Queries per batched retrieve call", ["index"],
            buckets=_BATCH_BUCKETS, registry=r)
        self.batch_duration = Histogram(
            "hippo_batch_duration_seconds", "Time of one batched retrieve call on the worker",
            ["index"], registry=r)
        self.rejected = Counter(
            "hippo_rejected_requests", "Refused requests by reason", ["reason"], registry=r)
        for reason in REJECT_REASONS:  # present from the start, at 0
            self.rejected.labels(reason=reason)

    def watch_indexes(self, read: Callable[[], Iterable[tuple[str, IndexGauges]]]) -> None:
        """Register the per-index gauges; `read()` yields (index name, gauges) at each scrape."""
        self.registry.register(_IndexCollector(read))

    def watch_remote_encoders(
            self, read: Callable[[], Iterable[tuple[str, EncoderCounters]]]) -> None:
        """Register the server-encoder counters; `read()` yields (index name, counters) for the
        indexes whose server encoder is loaded."""
        self.registry.register(_EncoderCollector(read))

    def observe_batch(self, index: str) -> Callable[[int, float], None]:
        """A batcher `on_batch` callback feeding the batch histograms of `index`."""
        size = self.batch_size.labels(index=index)
        duration = self.batch_duration.labels(index=index)

        def on_batch(queries: int, seconds: float) -> None:
            size.observe(queries)
            duration.observe(seconds)

        return on_batch

    def observe_retrieve(self, *, index: str, mode: str, transport: str, status: str,
                         queries: int, seconds: float | None) -> None:
        """Count one retrieve call of `queries` queries; `seconds` is its latency when answered."""
        labels = {"index": index, "mode": mode, "transport": transport, "status": status}
        self.retrieve_requests.labels(**labels).inc()
        self.queries.labels(**labels).inc(queries)
        if status in ("queue_full", "shutting_down"):
            self.rejected.labels(reason=status).inc()
        if seconds is not None:
            self.retrieve_latency.labels(index=index, mode=mode, transport=transport).observe(
                seconds)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Pure ASGI: count every HTTP request by route, method and status, and time it.

    Outermost, so it also sees what inner layers answer on their own (413 from the body limit,
    401 from an auth guard). `routes()` gives the app's route paths; other paths count as "other".
    """

    def __init__(self, app: ASGIApp, metrics: Metrics,
                 routes: Callable[[], Collection[str]]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # an exception before the response started: the server answers 500
        path = scope.get("path", "")
        route = path if path in self.routes() else "other"
        method = scope.get("method", "GET")

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            self.metrics.http_requests.labels(route=route, method=method, status=str(status)).inc()
            self.metrics.http_duration.labels(route=route, method=method).observe(
                time.perf_counter() - started)
            reason = _REJECTED.get(status)
            if reason is not None:
                self.metrics.rejected.labels(reason=reason).inc()
