"""Request guards that answer before a route runs: the Host/Origin check of a server without a
token (421 / 403), the body-size limit (413), the bearer token (401) and the write rate (429), for
the FastAPI routes and for the mounted /mcp endpoint alike.

- `HostGuard` (a server without a token): only the configured Host names (loopback by default,
  any port) and Origins on those names are answered, so a web page whose DNS name is rebound to
  127.0.0.1 cannot read the index through the visitor's browser.
- `BodyLimit` is pure ASGI, so a chunked body is cut off as it streams, not only a declared
  Content-Length. Its limit is `ServerConfig.max_body_bytes`, sized so every schema-valid request,
  serialised with every character escaped, fits; the write routes have their own
  (`WriteLimits.max_body_bytes`).
- `bearer_auth` is the FastAPI dependency of the /v1/* and /metrics routes (its `HTTPBearer`
  scheme is what puts bearer security in the OpenAPI document); `BearerGuard` is the same check as
  ASGI middleware, for /mcp, which is routed outside FastAPI's dependencies. Both read
  `Authorization: Bearer <token>` with the scheme in any case and compare in constant time
  (`hmac.compare_digest`: the time does not depend on how much of a guess is right).
- `WriteRate` is a token bucket over all write requests; `rate_limited` applies it after the
  bearer check, so clients without the token cannot use up the writers' budget.

Error bodies carry a short message only, never the token or a header's value.
"""

from __future__ import annotations

import hmac
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BearerGuard", "BodyLimit", "HostGuard", "WriteRate", "bearer_auth", "rate_limited"]

_BAD_TOKEN = "missing or invalid bearer token"


class HostGuard:
    """Answer 421 unless the Host header names one of `hosts` (any port), and 403 when an Origin
    header names another host: a server without a token, against DNS rebinding."""

    def __init__(self, app: ASGIApp, hosts: Sequence[str]) -> None:
        self.app = app
        self.hosts = frozenset(h.lower() for h in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        host = _hostname(headers.get(b"host", b"").decode("latin-1"))
        origin = headers.get(b"origin")
        if host not in self.hosts:
            status, detail = 421, "this server answers only its own host names"
        elif origin is not None and _hostname(
                urlsplit(origin.decode("latin-1")).netloc) not in self.hosts:
            status, detail = 403, "cross-origin requests are refused"
        else:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http":
            await JSONResponse({"detail": detail}, status_code=status)(scope, receive, send)
        else:
            await send({"type": "websocket.close", "code": 1008})


def _hostname(netloc: str) -> str:
    """"Host:port" -> "host" (lower case; "[::1]:8000" -> "[::1]"); "" when it has none."""
    netloc = netloc.strip().lower().rpartition("@")[2]
    if netloc.startswith("["):
        return netloc.partition("]")[0] + "]"
    return netloc.partition(":")[0]


class BodyLimit:
    """Answer 413 to a request body over `max_bytes` (or the limit `by_path` gives its path),
    declared or streamed; `on_reject()` is called once for each such request (the metrics)."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 by_path: Mapping[str, int] | None = None,
                 on_reject: Callable[[], None] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.by_path = dict(by_path or {})
        self.on_reject = on_reject or (lambda: None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.by_path.get(scope.get("path", ""), self.max_bytes)
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > limit:
                    await self._too_large(limit, scope, receive, send)
                    return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    # FastAPI re-raises HTTPException from body parsing; the handler answers 413.
                    self.on_reject()
                    raise HTTPException(413, _too_large_message(limit))
            return message

        await self.app(scope, limited_receive, send)

    async def _too_large(self, limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        self.on_reject()
        response = JSONResponse({"detail": _too_large_message(limit)}, status_code=413)
        await response(scope, receive, send)


def _too_large_message(limit: int) -> str:
    return f"request body too large: limit {limit} bytes"


class BearerGuard:
    """Pure ASGI: answer 401 unless `Authorization: Bearer <token>`, read as `bearer_auth` reads
    it (scheme in any case, constant-time compare), for a route outside FastAPI's dependencies."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _authorized(scope, self.expected):
            response = JSONResponse({"detail": _BAD_TOKEN},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def bearer_auth(token: str) -> Any:
    """A dependency that requires `Authorization: Bearer <token>` (constant-time compare). The
    `HTTPBearer` scheme declares the security in the OpenAPI document; the header is read as
    `BearerGuard` reads it, from the raw bytes, so both guards decide alike."""
    scheme = HTTPBearer(auto_error=False, description="the server's token")
    expected = token.encode()

    async def check(
        request: Request, _: HTTPAuthorizationCredentials | None = Depends(scheme),
    ) -> None:
        if not _authorized(request.scope, expected):
            raise HTTPException(401, _BAD_TOKEN, {"WWW-Authenticate": "Bearer"})

    return Depends(check)


def _authorized(scope: Scope, expected: bytes) -> bool:
    """Whether the request's last Authorization header is `Bearer` (any case), one or more
    spaces (RFC 6750) and `expected`, compared in constant time."""
    given = b""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, credentials = value.partition(b" ")
            given = credentials.lstrip(b" ") if scheme.lower() == b"bearer" else b""
    return bool(given) and hmac.compare_digest(given, expected)


class WriteRate:
    """A token bucket: `burst` requests at once, refilled at `per_second`; thread-safe."""

    def __init__(self, per_second: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Admit one request (0.0) or return the seconds until one would be admitted."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_second)
            self._at = now
            if self._tokens >= 1:
                self._tokens -= 1
                return 0.0
            return (1 - self._tokens) / self.per_second


def rate_limited(auth: Any, rate: WriteRate) -> Any:
    """A dependency: `auth` (the bearer check) first, then one of `rate`'s tokens (else 429
    with Retry-After, in whole seconds)."""

    async def check(_: None = auth) -> None:
        wait = rate.take()
        if wait > 0:
            raise HTTPException(429, f"too many writes: at most {rate.per_second:g} per second "
                                     f"(bursts of {rate.burst})",
                                {"Retry-After": str(max(1, math.ceil(wait)))})

    return Depends(check)
