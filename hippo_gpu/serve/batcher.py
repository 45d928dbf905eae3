"""Dynamic micro-batching: concurrent requests share one batched call on a worker thread.

A request is a list of queries plus a hashable batch key (the server's key is (mode, top_k,
return_seeds, with_entities)). A query is whatever the batched function takes per query: the
server's is a query text together with its entities, so each query's per-query data travels with it
through merging, chunking and solo re-runs. The batcher holds requests in a bounded FIFO and runs
them as batches:

- a batch holds requests with one key only, taken in arrival order, at most `max_batch` queries;
- the oldest waiting request waits at most `max_wait_ms` for others to join it; a full batch
  runs at once;
- one batch runs at a time, on one worker thread, so the event loop keeps accepting requests
  while the batch runs; requests arriving meanwhile form the next batch, which is why batches grow
  with load (the oldest request has already waited out its `max_wait_ms` when the worker frees);
- a request with more than `max_batch` queries runs alone, split into `max_batch` chunks;
- each caller gets the slice of the batch output that belongs to its queries. If a batch with
  several requests raises, each request is re-run alone, so an error reaches only the request that
  caused it (this is sound because results are per query and do not depend on the batch);
- `close()` refuses new requests and runs everything already queued before it returns;
- `session()`, when given, is entered on the worker around each batch's calls (all its chunks),
  so the batched function can pin what the batch reads (the server: one index version).

The batched function is the only thing that runs on the worker; it never touches the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from hippo_gpu.errors import HippoGpuError

log = logging.getLogger(__name__)

T = TypeVar("T")  # one query, as the batched function takes it
R = TypeVar("R")  # one query's result
K = TypeVar("K", bound=Hashable)  # a batch key: only queries of equal keys share a batch

# Latency quantiles are taken over the most recent requests only, so memory stays bounded.
_LATENCY_WINDOW = 10_000


class BatcherError(HippoGpuError, RuntimeError):
    """Base class of the errors the batcher raises to callers."""


class QueueFullError(BatcherError):
    """The queue already holds `max_queue` waiting queries; retry later (HTTP 429)."""


class BatcherClosedError(BatcherError):
    """The batcher is not running (not started yet, or shutting down) (HTTP 503)."""


class BatchOutputError(BatcherError):
    """The batched function returned a number of results different from its number of queries."""


@dataclass(frozen=True)
class BatcherConfig:
    """Micro-batching limits.

    Attributes:
        max_batch: most queries in one call of the batched function (1 turns batching off).
        max_wait_ms: longest the oldest waiting request waits for others to join its batch.
        max_queue: most queries waiting to run (the running batch excluded); more -> QueueFullError.
    """

    max_batch: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 1024

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if not (self.max_wait_ms >= 0 and math.isfinite(self.max_wait_ms)):
            raise ValueError(f"max_wait_ms must be finite and >= 0, got {self.max_wait_ms}")
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {self.max_queue}")


@dataclass(frozen=True)
class BatcherStats:
    """A snapshot of the batcher's counters (all counts since start)."""

    running: bool
    queue_depth: int  # queries waiting, not yet in a batch
    in_flight: int  # queries in the batch now running
    requests_served: int
    requests_failed: int
    requests_rejected: int  # refused with QueueFullError
    batches_served: int  # calls of the batched function that returned
    queries_served: int
    mean_batch_size: float  # queries per batch, 0.0 before the first batch
    max_batch_size_seen: int
    latency_ms: dict[str, float]  # p50/p95/p99/mean of submit -> result, last 10,000 requests


@dataclass(eq=False)
class _Request(Generic[T, K, R]):
    queries: list[T]
    key: K
    future: asyncio.Future[list[R]]
    enqueued: float = field(default_factory=time.monotonic)


class MicroBatcher(Generic[T, K, R]):
    """Coalesces concurrent `submit` calls into batched calls of `run(queries, key)`.

    `run(queries, key)` must return one result per query, in order, and each query's result must
    not depend on the other queries in the batch. It runs on a single worker thread. A query (`T`)
    is opaque to the batcher: it is handed to `run` exactly as submitted.

    Use from one asyncio event loop: `await start()`, then `await submit(...)` from any number of
    tasks, then `await close()`. It is also an async context manager.

    `on_batch(queries, seconds)`, when given, is called on the event loop after every call of
    `run` that returned (seconds: its time on the worker), e.g. to feed a batch-size histogram.
    `session()`, when given, returns a context manager entered on the worker around the calls of
    `run` for one batch (every chunk of it), e.g. to answer the whole batch from one snapshot.
    """

    def __init__(
        self,
        run: Callable[[list[T], K], Sequence[R]],
        config: BatcherConfig,
        on_batch: Callable[[int, float], None] | None = None,
        session: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self._run = run
        self._session = session
        self.config = config
        # Called on the event loop after each batch that returned: (queries, seconds on the worker).
        self._on_batch = on_batch
        self._pending: deque[_Request[T, K, R]] = deque()
        self._queued = 0  # queries in self._pending (cancelled requests included until dropped)
        self._in_flight = 0
        self._current: list[_Request[T, K, R]] = []  # the batch on the worker now
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closing = False
        self._requests_served = 0
        self._requests_failed = 0
        self._requests_rejected = 0
        self._batches_served = 0
        self._queries_served = 0
        self._max_batch_seen = 0
        self._latencies_s: deque[float] = deque(maxlen=_LATENCY_WINDOW)

    # lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the batching loop on the running event loop and the worker thread."""
        if self._task is not None:
            raise BatcherError("the batcher was already started")
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hippo-batch")
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="hippo-batcher")

    async def close(self) -> None:
        """Refuse new requests, run every queued request, then stop the worker thread."""
        if self._task is None or self._closing:
            return
        self._closing = True
        assert self._wakeup is not None  # set in start()
        self._wakeup.set()
        try:
            await self._task
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)

    async def __aenter__(self) -> MicroBatcher[T, K, R]:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def accepting(self) -> bool:
        """True while `submit` accepts requests (started, not closing, loop alive)."""
        return self._task is not None and not self._closing and not self._task.done()

    # requests ----------------------------------------------------------------------------------

    async def submit(self, queries: Sequence[T], key: K) -> list[R]:
        """Queue `queries` under `key` and wait for their results (one per query, in order).

        Raises:
            QueueFullError: accepting the queries would put more than `max_queue` in the queue.
            BatcherClosedError: the batcher is not started or is shutting down.
            BatchOutputError: the batched function returned the wrong number of results.
            Exception: whatever the batched function raised for these queries.
        """
        if not self.accepting:
            raise BatcherClosedError("the batcher is not accepting requests")
        if not queries:
            return []
        n = len(queries)
        if self._queued + n > self.config.max_queue:
            self._requests_rejected += 1
            raise QueueFullError(
                f"queue full: {self._queued} queries waiting, limit {self.config.max_queue}"
            )
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(list(queries), key, future))
        self._queued += n
        assert self._wakeup is not None  # accepting implies started
        self._wakeup.set()
        # A cancelled caller (client went away) cancels `future`; the loop then drops the request.
        return await future

    def stats(self) -> BatcherStats:
        """Counters and latency quantiles; cheap enough to call per HTTP request."""
        lat = sorted(self._latencies_s)
        latency_ms = {
            "p50": _quantile(lat, 0.50) * 1e3,
            "p95": _quantile(lat, 0.95) * 1e3,
            "p99": _quantile(lat, 0.99) * 1e3,
            "mean": (sum(lat) / len(lat) * 1e3) if lat else 0.0,
        }
        return BatcherStats(
            running=self.accepting,
            queue_depth=self._queued,
            in_flight=self._in_flight,
            requests_served=self._requests_served,
            requests_failed=self._requests_failed,
            requests_rejected=self._requests_rejected,
            batches_served=self._batches_served,
            queries_served=self._queries_served,
            mean_batch_size=(
                self._queries_served / self._batches_served if self._batches_served else 0.0
            ),
            max_batch_size_seen=self._max_batch_seen,
            latency_ms=latency_ms,
        )

    # the loop ----------------------------------------------------------------------------------

    async def _loop(self) -> None:
        try:
            await self._serve()
        except BaseException as e:
            # A bug in the loop or a cancelled event loop: no caller may wait forever.
            self._closing = True
            for r in [*self._current, *self._pending]:
                if not r.future.done():
                    r.future.set_exception(BatcherClosedError("the batcher stopped"))
            self._pending.clear()
            self._queued = 0
            if not isinstance(e, asyncio.CancelledError):
                log.error("the batching loop stopped: %r", e)
            raise

    async def _serve(self) -> None:
        assert self._wakeup is not None
        max_wait_s = self.config.max_wait_ms / 1e3
        while True:
            self._drop_cancelled()
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            head = self._pending[0]
            deadline = head.enqueued + max_wait_s
            # Wait for company until the batch is full, the head's deadline passes, or shutdown.
            while not self._closing and self._fill(head.key) < self.config.max_batch:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            batch = self._take(head.key)
            if batch:
                await self._execute(batch)

    def _drop_cancelled(self) -> None:
        while self._pending and self._pending[0].future.done():
            self._queued -= len(self._pending.popleft().queries)

    def _fill(self, key: K) -> int:
        """Queries waiting under `key` (cancelled requests excluded)."""
        return sum(len(r.queries) for r in self._pending if r.key == key and not r.future.done())

    def _take(self, key: K) -> list[_Request[T, K, R]]:
        """Remove and return the oldest requests under `key` that fit in one batch.

        Requests are taken in arrival order and the first one that does not fit stops the scan, so
        requests with one key are served first-in first-out. A single request larger than
        `max_batch` is taken alone.
        """
        batch: list[_Request[T, K, R]] = []
        size = 0
        keep: deque[_Request[T, K, R]] = deque()
        full = False
        for r in self._pending:
            if r.future.done():  # cancelled while waiting
                self._queued -= len(r.queries)
            elif full or r.key != key:
                keep.append(r)
            elif not batch or size + len(r.queries) <= self.config.max_batch:
                batch.append(r)
                size += len(r.queries)
                full = size >= self.config.max_batch
            else:
                keep.append(r)
                full = True
        self._pending = keep
        self._queued -= size
        return batch

    async def _execute(self, batch: list[_Request[T, K, R]]) -> None:
        loop = asyncio.get_running_loop()
        key = batch[0].key
        queries = [q for r in batch for q in r.queries]
        self._in_flight = len(queries)
        self._current = batch
        try:
            started = time.monotonic()
            try:
                results = await loop.run_in_executor(self._executor, self._call, queries, key)
            except Exception as e:  # routed to the callers below, never swallowed
                if len(batch) == 1:
                    self._fail(batch[0], e)
                    return
                log.info("a batch of %d requests failed (%r); re-running each alone", len(batch), e)
                for r in batch:
                    await self._execute_alone(r)
                return
            self._deliver(batch, results, time.monotonic() - started)
        finally:
            self._in_flight = 0
            self._current = []

    async def _execute_alone(self, r: _Request[T, K, R]) -> None:
        if r.future.done():
            return
        loop = asyncio.get_running_loop()
        self._in_flight = len(r.queries)
        started = time.monotonic()
        try:
            results = await loop.run_in_executor(self._executor, self._call, r.queries, r.key)
        except Exception as e:  # routed to the caller
            self._fail(r, e)
            return
        self._deliver([r], results, time.monotonic() - started)

    def _call(self, queries: list[T], key: K) -> list[R]:
        """Worker thread: run `queries` in chunks of at most `max_batch`; check the output size."""
        step = self.config.max_batch
        out: list[R] = []
        with self._session() if self._session is not None else contextlib.nullcontext():
            for i in range(0, len(queries), step):
                chunk = queries[i : i + step]
                res = list(self._run(chunk, key))
                if len(res) != len(chunk):
                    raise BatchOutputError(
                        f"batched call returned {len(res)} results for {len(chunk)} queries"
                    )
                out.extend(res)
        return out

    def _deliver(self, batch: list[_Request[T, K, R]], results: list[R], seconds: float) -> None:
        now = time.monotonic()
        self._batches_served += 1
        self._queries_served += len(results)
        self._max_batch_seen = max(self._max_batch_seen, len(results))
        if self._on_batch is not None:
            try:
                self._on_batch(len(results), seconds)
            except Exception:  # an observer's bug must not cost callers their results
                log.exception("the on_batch observer failed")
        start = 0
        for r in batch:
            stop = start + len(r.queries)
            if not r.future.done():
                r.future.set_result(results[start:stop])
                self._requests_served += 1
                self._latencies_s.append(now - r.enqueued)
            start = stop

    def _fail(self, r: _Request[T, K, R], e: Exception) -> None:
        self._requests_failed += 1
        if not r.future.done():
            r.future.set_exception(e)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]
