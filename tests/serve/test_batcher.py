"""Micro-batcher behaviour: coalescing, limits, error routing, shutdown.

The batched function here is a deterministic function of the query text (no numerics), recording
every call so the tests can see how requests were grouped.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Hashable

import pytest

from hippo_gpu.serve.batcher import (
    BatcherClosedError,
    BatcherConfig,
    BatchOutputError,
    MicroBatcher,
    QueueFullError,
)


class Recorder:
    """`run(queries, key)` -> ["key|query", ...]; records calls; can sleep, block or fail."""

    def __init__(self, sleep_s: float = 0.0, fail_on: str | None = None) -> None:
        self.sleep_s = sleep_s
        self.fail_on = fail_on
        self.calls: list[tuple[list[str], Hashable]] = []
        self.threads: set[int] = set()
        self.gate: threading.Event | None = None  # when set: each call waits for it
        self.entered = threading.Event()
        self.short_output = False

    def __call__(self, queries: list[str], key: Hashable) -> list[str]:
        self.calls.append((list(queries), key))
        self.threads.add(threading.get_ident())
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10), "test gate never opened"
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.fail_on is not None and self.fail_on in queries:
            raise ValueError(f"cannot answer {self.fail_on!r}")
        out = [f"{key}|{q}" for q in queries]
        return out[:-1] if self.short_output else out

    @property
    def sizes(self) -> list[int]:
        return [len(q) for q, _ in self.calls]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _wait_until(pred, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.002)


def test_config_validation():
    with pytest.raises(ValueError):
        BatcherConfig(max_batch=0)
    with pytest.raises(ValueError):
        BatcherConfig(max_wait_ms=-1)
    with pytest.raises(ValueError):
        BatcherConfig(max_wait_ms=float("nan"))
    with pytest.raises(ValueError):
        BatcherConfig(max_queue=0)


def test_concurrent_requests_share_one_call_and_get_their_own_results():
    rec = Recorder()

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=64, max_wait_ms=200)) as b:
            reqs = [[f"q{i}a", f"q{i}b"] if i % 3 == 0 else [f"q{i}"] for i in range(10)]
            outs = await asyncio.gather(*(b.submit(r, "k") for r in reqs))
            return reqs, outs, b.stats()

    reqs, outs, stats = run(main())
    assert len(rec.calls) == 1
    assert rec.calls[0][0] == [q for r in reqs for q in r]  # arrival order kept
    for r, o in zip(reqs, outs, strict=True):
        assert o == [f"k|{q}" for q in r]
    assert stats.batches_served == 1
    assert stats.requests_served == 10
    assert stats.queries_served == 14
    assert stats.mean_batch_size == 14.0
    assert stats.queue_depth == 0


def test_batches_never_exceed_max_batch():
    rec = Recorder()

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=4, max_wait_ms=100)) as b:
            return await asyncio.gather(*(b.submit([f"q{i}"], "k") for i in range(10)))

    outs = run(main())
    assert outs == [[f"k|q{i}"] for i in range(10)]
    assert rec.sizes == [4, 4, 2]
    assert [q for qs, _ in rec.calls for q in qs] == [f"q{i}" for i in range(10)]  # FIFO


def test_request_is_not_split_across_batches_but_oversized_request_is_chunked():
    rec = Recorder()

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=4, max_wait_ms=100)) as b:
            small = b.submit(["a", "b", "c"], "k")
            pair = b.submit(["d", "e"], "k")  # does not fit beside `small`: next batch
            big = b.submit([f"x{i}" for i in range(10)], "k")
            return await asyncio.gather(small, pair, big)

    small, pair, big = run(main())
    assert small == ["k|a", "k|b", "k|c"]
    assert pair == ["k|d", "k|e"]
    assert big == [f"k|x{i}" for i in range(10)]
    assert rec.sizes == [3, 2, 4, 4, 2]


def test_lone_request_waits_max_wait_and_full_batch_does_not():
    async def lone(max_batch: int, max_wait_ms: float) -> float:
        async with MicroBatcher(Recorder(), BatcherConfig(max_batch, max_wait_ms)) as b:
            t0 = time.monotonic()
            await b.submit(["q"], "k")
            return time.monotonic() - t0

    waited = run(lone(max_batch=8, max_wait_ms=150))
    assert 0.15 <= waited < 2.0
    # A batch of one is full at once: batching off adds no wait.
    assert run(lone(max_batch=1, max_wait_ms=5_000)) < 1.0


def test_requests_with_different_keys_are_never_merged():
    rec = Recorder()

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=64, max_wait_ms=100)) as b:
            keys = [("dense", 5), ("hipporag2", 5), ("dense", 10), ("dense", 5)]
            outs = await asyncio.gather(*(b.submit([f"q{i}"], k) for i, k in enumerate(keys)))
            return keys, outs

    keys, outs = run(main())
    assert outs == [[f"{k}|q{i}"] for i, k in enumerate(keys)]
    assert sorted(rec.sizes) == [1, 1, 2]
    merged = [qs for qs, k in rec.calls if k == ("dense", 5)]
    assert ["q0", "q3"] in merged


def test_batched_function_runs_on_worker_thread_and_loop_stays_responsive():
    rec = Recorder(sleep_s=0.3)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        async with MicroBatcher(rec, BatcherConfig(max_batch=8, max_wait_ms=0)) as b:
            t = asyncio.create_task(ticker())
            await b.submit(["q"], "k")
            t.cancel()
        return ticks

    ticks = run(main())
    assert threading.get_ident() not in rec.threads
    assert len(rec.threads) == 1
    assert ticks >= 10  # the loop ran while the batch slept 0.3 s


def test_full_queue_rejects_with_queue_full_error():
    rec = Recorder()
    rec.gate = threading.Event()

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=2, max_wait_ms=0, max_queue=3)) as b:
            first = asyncio.create_task(b.submit(["running"], "k"))
            await _wait_until(rec.entered.is_set)  # the worker holds `first`
            waiting = [asyncio.create_task(b.submit([f"w{i}"], "k")) for i in range(3)]
            await _wait_until(lambda: b.stats().queue_depth == 3)
            with pytest.raises(QueueFullError):
                await b.submit(["overflow"], "k")
            depth = b.stats().queue_depth
            rec.gate.set()
            outs = await asyncio.gather(first, *waiting)
            return depth, outs, b.stats()

    depth, outs, stats = run(main())
    assert depth == 3
    assert outs == [["k|running"], ["k|w0"], ["k|w1"], ["k|w2"]]
    assert stats.requests_rejected == 1
    assert stats.requests_served == 4
    assert all("overflow" not in qs for qs, _ in rec.calls)


def test_error_reaches_only_the_request_that_caused_it():
    rec = Recorder(fail_on="bad")

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=64, max_wait_ms=100)) as b:
            reqs = [["a"], ["b", "bad"], ["c"]]
            return await asyncio.gather(*(b.submit(r, "k") for r in reqs), return_exceptions=True)

    a, bad, c = run(main())
    assert a == ["k|a"]
    assert c == ["k|c"]
    assert isinstance(bad, ValueError) and "bad" in str(bad)
    # One merged call, then each request alone.
    assert rec.sizes == [4, 1, 2, 1]


def test_wrong_output_length_is_an_error_not_a_misrouting():
    rec = Recorder()
    rec.short_output = True

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=64, max_wait_ms=50)) as b:
            return await asyncio.gather(
                b.submit(["a", "b"], "k"), b.submit(["c"], "k"), return_exceptions=True
            )

    outs = run(main())
    assert all(isinstance(o, BatchOutputError) for o in outs)


def test_cancelled_request_is_dropped_before_it_runs():
    rec = Recorder()
    rec.gate = threading.Event()

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=1, max_wait_ms=0)) as b:
            first = asyncio.create_task(b.submit(["first"], "k"))
            await _wait_until(rec.entered.is_set)
            gone = asyncio.create_task(b.submit(["gone"], "k"))
            kept = asyncio.create_task(b.submit(["kept"], "k"))
            await _wait_until(lambda: b.stats().queue_depth == 2)
            gone.cancel()
            rec.gate.set()
            return await asyncio.gather(first, kept), b.stats()

    (first, kept), stats = run(main())
    assert first == ["k|first"] and kept == ["k|kept"]
    assert [qs for qs, _ in rec.calls] == [["first"], ["kept"]]
    assert stats.queue_depth == 0


def test_close_drains_queued_requests_and_refuses_new_ones():
    rec = Recorder()
    rec.gate = threading.Event()

    async def main():
        b = MicroBatcher(rec, BatcherConfig(max_batch=2, max_wait_ms=1_000))
        await b.start()
        tasks = [asyncio.create_task(b.submit([f"q{i}"], "k")) for i in range(5)]
        await _wait_until(rec.entered.is_set)
        closing = asyncio.create_task(b.close())
        await asyncio.sleep(0.05)
        assert not closing.done()  # waits for the in-flight batch
        with pytest.raises(BatcherClosedError):
            await b.submit(["late"], "k")
        rec.gate.set()
        await closing
        assert not b.accepting
        with pytest.raises(BatcherClosedError):
            await b.submit(["later"], "k")
        return [t.result() for t in tasks]  # all done once close() returned

    outs = run(main())
    assert outs == [[f"k|q{i}"] for i in range(5)]
    # Closing skips the max_wait of the last, partial batch.
    assert rec.sizes == [2, 2, 1]


def test_submit_before_start_is_refused():
    async def main():
        with pytest.raises(BatcherClosedError):
            await MicroBatcher(Recorder(), BatcherConfig()).submit(["q"], "k")

    run(main())


def test_latency_quantiles_are_reported():
    rec = Recorder(sleep_s=0.02)

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=1, max_wait_ms=0)) as b:
            await asyncio.gather(*(b.submit([f"q{i}"], "k") for i in range(5)))
            return b.stats()

    stats = run(main())
    lat = stats.latency_ms
    # Requests queue behind each other: the i-th waits about (i + 1) * 20 ms.
    assert 15 <= lat["p50"] <= lat["p95"] <= lat["p99"]
    assert lat["p99"] >= 90
    assert stats.batches_served == 5 and stats.max_batch_size_seen == 1


def test_per_query_payload_travels_with_its_query():
    """A query may carry data (the server's: its entities); merging, chunking and a solo re-run
    after a failed batch all hand each query to the batched function with its own payload."""
    calls: list[list[tuple[str, tuple[str, ...] | None]]] = []

    def run_items(items: list[tuple[str, tuple[str, ...] | None]], key: Hashable) -> list[str]:
        calls.append(list(items))
        if any(text == "bad" for text, _ in items):
            raise ValueError("cannot answer 'bad'")
        return [f"{key}|{text}|{'-' if ents is None else ','.join(ents)}" for text, ents in items]

    async def main():
        async with MicroBatcher(run_items, BatcherConfig(max_batch=3, max_wait_ms=100)) as b:
            reqs = [
                [("a", ("A",)), ("b", None)],
                [("c", ()), ("d", ("D1", "D2")), ("e", ("E",)), ("f", None)],  # > max_batch
                [("bad", ("X",))],
                [("g", ("G",))],
            ]
            outs = await asyncio.gather(*(b.submit(r, "k") for r in reqs), return_exceptions=True)
            return reqs, outs

    reqs, outs = run(main())
    assert outs[0] == ["k|a|A", "k|b|-"]
    assert outs[1] == ["k|c|", "k|d|D1,D2", "k|e|E", "k|f|-"]
    assert isinstance(outs[2], ValueError)
    assert outs[3] == ["k|g|G"]
    # Every call received whole (query, payload) pairs exactly as submitted.
    submitted = {item for r in reqs for item in r}
    assert all(item in submitted for call in calls for item in call)
    assert ("bad", ("X",)) in [item for call in calls if len(call) == 1 for item in call]


def test_a_session_spans_every_chunk_of_a_batch():
    """The session (the server pins one index version with it) is entered once per batch on
    the worker, around all the chunks of an oversized request, and never overlaps another."""
    rec = Recorder()
    events: list[str] = []

    @contextlib.contextmanager
    def session():
        events.append(f"enter {len(rec.calls)}")
        yield
        events.append(f"exit {len(rec.calls)}")

    async def main():
        async with MicroBatcher(rec, BatcherConfig(max_batch=2, max_wait_ms=1),
                                session=session) as b:
            big = await b.submit([f"q{i}" for i in range(5)], "k")
            small = await b.submit(["x"], "k")
        return big, small

    big, small = run(main())
    assert big == [f"k|q{i}" for i in range(5)] and small == ["k|x"]
    assert rec.sizes == [2, 2, 1, 1]
    assert events == ["enter 0", "exit 3", "enter 3", "exit 4"]
