"""Request guards that answer before a route runs: the body-size limit (413) and the bearer token
(401), for the FastAPI routes and for the mounted /mcp endpoint alike.

- `BodyLimit` is pure ASGI, so a chunked body is cut off as it streams, not only a declared
  Content-Length. Its limit is `ServerConfig.max_body_bytes`, sized so every schema-valid request,
  serialised with every character escaped, fits.
- `bearer_auth` is the FastAPI dependency of the /v1/* and /metrics routes (its `HTTPBearer`
  scheme is what puts bearer security in the OpenAPI document); `BearerGuard` is the same check as
  ASGI middleware, for /mcp, which is routed outside FastAPI's dependencies. Both read
  `Authorization: Bearer <token>` with the scheme in any case and compare in constant time.

Error bodies carry a short message only.
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Depends, HTTPException
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BearerGuard", "BodyLimit", "bearer_auth"]

_BAD_TOKEN = "missing or invalid bearer token"


class BodyLimit:
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


class BearerGuard:
    """Pure ASGI: answer 401 unless `Authorization: Bearer <token>`, read as `bearer_auth` reads
    it (scheme in any case, constant-time compare), for a route outside FastAPI's dependencies."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                given = credentials if scheme.lower() == b"bearer" else b""
        if scope["type"] == "http" and not (
                given and hmac.compare_digest(given, self.expected)):  # fmt: skip
            response = JSONResponse({"detail": _BAD_TOKEN},
                                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def bearer_auth(token: str) -> Any:
    """A dependency that requires `Authorization: Bearer <token>` (constant-time compare)."""
    scheme = HTTPBearer(auto_error=False, description="the server's token")
    expected = token.encode()

    async def check(
        creds: HTTPAuthorizationCredentials | None = Depends(scheme),
    ) -> None:
        given = b"" if creds is None else creds.credentials.encode()
        if creds is None or not hmac.compare_digest(given, expected):
            raise HTTPException(401, _BAD_TOKEN, {"WWW-Authenticate": "Bearer"})

    return Depends(check)

