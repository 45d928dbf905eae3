"""The explorer page at /ui: why each passage was retrieved, drawn from POST /v1/explain.

Static files shipped in the package (serve/ui/: one HTML page, one script, one style sheet):
plain JavaScript and SVG, no library, no CDN, nothing fetched from outside this server, so the
page works offline. The files hold no data and are open like /docs; the page itself asks
/openapi.json (open) for the modes and limits, then /v1/indexes and /v1/explain with the bearer
token the user types in (or passes as a ``#token=...`` URL fragment, which browsers never send
to a server): it works exactly as far as the token allows, and shows the refusal otherwise.

Every answer carries a Content-Security-Policy that allows scripts, styles and requests from
this origin only (no inline script or style), and the page builds its DOM from text nodes, never
from HTML strings, so nothing a passage or a query contains can run in it.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

__all__ = ["UI_FILES", "UI_PATH", "add_ui_routes"]

UI_PATH = "/ui"
UI_FILES = {
    "index.html": "text/html; charset=utf-8",
    "explorer.js": "text/javascript; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def add_ui_routes(app: FastAPI) -> None:
    """GET /ui (redirects to /ui/), /ui/ (the page) and /ui/<file>, outside the OpenAPI
    document. The files are read once, here."""
    folder = resources.files("hippo_gpu.serve") / "ui"
    bodies = {name: (folder / name).read_bytes() for name in UI_FILES}

    def answer(name: str) -> Response:
        if name not in bodies:
            return Response(b'{"detail":"Not Found"}', status_code=404,
                            media_type="application/json")
        return Response(bodies[name], media_type=UI_FILES[name], headers=_HEADERS)

    @app.get(UI_PATH, include_in_schema=False)
    async def ui_root() -> RedirectResponse:
        return RedirectResponse(UI_PATH + "/")

    @app.get(UI_PATH + "/", include_in_schema=False)
    async def ui_page() -> Response:
        return answer("index.html")

    @app.get(UI_PATH + "/{name}", include_in_schema=False)
    async def ui_file(name: str) -> Response:
        return answer(name)
