"""OpenAIBackend retries through the openai SDK, against a scripted local HTTP server.

The server (127.0.0.1, an ephemeral port) answers each chat-completions request with the next
scripted action: "ok", an HTTP status (optionally with headers such as Retry-After), or a delay.
It records when each request arrived, the SDK's `x-stainless-retry-count` header (which shows
that the SDK, not our code, made the retry) and how many requests were in flight at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

pytest.importorskip("openai")

from hippo_gpu.llm.backends.base import ChatRequest  # noqa: E402
from hippo_gpu.llm.backends.openai import OpenAIBackend  # noqa: E402
from tests.llm.fake_llm_server import LoopbackServer, send_json  # noqa: E402


class ScriptedServer(LoopbackServer):
    """script: list of (status, headers, delay_s) consumed one per request; then 200 "ok"."""

    def __init__(self) -> None:
        self.script: list[tuple[int, dict[str, str], float]] = []
        self.arrivals: list[float] = []
        self.retry_counts: list[str | None] = []
        self.in_flight = 0
        self.max_in_flight = 0
        super().__init__()

    def post(self, handler: BaseHTTPRequestHandler) -> None:
        handler.rfile.read(int(handler.headers["Content-Length"]))
        with self.lock:
            self.arrivals.append(time.monotonic())
            self.retry_counts.append(handler.headers.get("x-stainless-retry-count"))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            status, headers, delay = self.script.pop(0) if self.script else (200, {}, 0)
        time.sleep(delay)
        if status == 200:
            body: dict[str, Any] = {
                "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        else:
            body = {"error": {"message": f"status {status}", "type": "x"}}
        # out of flight before the answer leaves: once the client has it, it may send its next
        # request, which a later decrement would count beside this one
        with self.lock:
            self.in_flight -= 1
        send_json(handler, status, body, headers)

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    s = ScriptedServer()
    yield s
    s.close()


def ask(backend: OpenAIBackend, n: int = 1) -> list[Any]:
    requests = [ChatRequest(messages=({"role": "user", "content": f"q{i}"},), max_tokens=4)
                for i in range(n)]
    return backend.generate(requests)


def fast(url: str, **kw: Any) -> OpenAIBackend:
    """Backoff of 10-20 ms, so any long gap between tries comes from the server's Retry-After."""
    kw = {"timeout": 5.0, "max_retries": 2, "backoff": 0.02, "max_backoff": 0.02, "seed": 0,
          **kw}
    return OpenAIBackend("m", url, **kw)


@pytest.mark.parametrize(("header", "value", "wait_s"),
                         [("Retry-After", "1", 1.0), ("retry-after-ms", "600", 0.6)])
def test_429_retry_after_is_honoured(server: ScriptedServer, header: str, value: str,
                                     wait_s: float) -> None:
    server.script = [(429, {header: value}, 0.0)]
    [done] = ask(fast(server.url))
    assert done.error is None and done.text == "ok"
    assert len(server.arrivals) == 2
    assert server.retry_counts == ["0", "1"]  # the SDK made the retry
    [gap] = server.gaps()
    assert wait_s - 0.05 <= gap < wait_s + 1.5  # the server's delay, not the 20 ms backoff


def test_429_with_retry_after_past_the_sdk_cap_fails_fast(server: ScriptedServer) -> None:
    """A server asking for more than the SDK's cap on Retry-After never makes us sleep that
    long: openai 3.x does not retry such a 429 at all (1.x retried after its own backoff)."""
    import openai

    server.script = [(429, {"Retry-After": "3600"}, 0.0)] * 3
    t0 = time.monotonic()
    [done] = ask(fast(server.url))
    assert time.monotonic() - t0 < 10
    assert done.error == "http_429"
    if int(openai.__version__.split(".")[0]) >= 3:
        assert len(server.arrivals) == 1
    else:
        assert len(server.arrivals) in (1, 3)


@pytest.mark.parametrize("max_retries", [0, 3])
def test_500_is_retried_up_to_max_retries(server: ScriptedServer, max_retries: int) -> None:
    server.script = [(500, {}, 0.0)] * 10
    [done] = ask(fast(server.url, max_retries=max_retries))
    assert done.error == "http_500" and done.text is None
    assert len(server.arrivals) == max_retries + 1
    assert server.retry_counts == [str(i) for i in range(max_retries + 1)]
    assert all(gap < 0.5 for gap in server.gaps())  # our 20 ms backoff, not the SDK's 0.5 s+


def test_500_then_success_with_the_sdk_backoff(server: ScriptedServer) -> None:
    """Without `backoff` the SDK's own schedule applies: 0.5 s x (0.75..1) before retry 1."""
    server.script = [(500, {}, 0.0)]
    [done] = ask(OpenAIBackend("m", server.url, timeout=5.0, max_retries=1))
    assert done.error is None and len(server.arrivals) == 2
    [gap] = server.gaps()
    assert 0.35 <= gap < 2.0


def test_client_errors_are_not_retried(server: ScriptedServer) -> None:
    server.script = [(404, {}, 0.0), (400, {}, 0.0)]
    done = ask(fast(server.url, concurrency=1), n=2)
    assert sorted(d.error for d in done) == ["http_400", "http_404"]
    assert len(server.arrivals) == 2


def test_timeouts_are_retried_then_reported(server: ScriptedServer) -> None:
    server.script = [(200, {}, 1.0), (200, {}, 1.0)]
    [done] = ask(fast(server.url, timeout=0.3, max_retries=1))
    assert done.error == "timeout"
    assert len(server.arrivals) == 2


def test_concurrency_bounds_requests_in_flight(server: ScriptedServer) -> None:
    server.script = [(429, {"retry-after-ms": "50"}, 0.05)] * 4 + [(200, {}, 0.1)] * 8
    done = ask(fast(server.url, concurrency=2, max_retries=3), n=8)
    assert all(d.error is None for d in done)
    assert len(server.arrivals) == 12
    assert server.max_in_flight == 2  # retries and sleeps happen inside the semaphore


class _DyingTransport:
    """A client whose transport fails the way httpcore's anyio backend does when the server
    closes the socket while the connection is opened (seen in CI on a dying fault server)."""

    def __init__(self, message: str) -> None:
        self.chat = self
        self.completions = self
        self.message = message

    async def create(self, **kw: Any) -> Any:
        raise AttributeError(self.message)


def test_a_connection_closed_while_opening_is_a_connection_failure() -> None:
    import asyncio

    b = OpenAIBackend("m", "http://127.0.0.1:9/v1", timeout=1.0, max_retries=0)
    request = ChatRequest(messages=({"role": "user", "content": "hi"},), max_tokens=4)
    dying = _DyingTransport("'NoneType' object has no attribute 'getpeername'")
    done = asyncio.run(b._request(dying, request))
    assert done.text is None and done.error == "connection"
    with pytest.raises(AttributeError, match="something else"):  # our own bugs still surface
        asyncio.run(b._request(_DyingTransport("something else"), request))
