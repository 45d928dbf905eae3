"""GET /, /docs and /redoc: the server's front door and its API viewers, offline.

FastAPI's own /docs and /redoc pages load Swagger UI and ReDoc from a CDN, so on a machine
without internet they are blank. Here both pages load their scripts, style sheet and icon from
this server (GET /docs/assets/NAME), taken from the files the `fastapi-offline` package ships
(Swagger UI 5, which reads OpenAPI 3.1, and ReDoc's standalone bundle); nothing else of that
package is used. The files are read on first request and kept. ReDoc's Google Fonts link is
left out, so neither page asks anything of another host.

GET / redirects to the explorer page (/ui/) when it is served, else to /docs.
"""

from __future__ import annotations

import functools
from importlib import resources

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response

__all__ = ["ASSETS", "DOCS_PATH", "add_doc_routes"]

DOCS_PATH, REDOC_PATH = "/docs", "/redoc"
ASSETS_PATH = DOCS_PATH + "/assets"
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}


MISSING = (b"the API viewers' files come with the fastapi-offline package: "
           b"pip install 'hippo-gpu[serve]' (the contract itself is at /openapi.json)")


@functools.cache
def _asset(name: str) -> bytes:
    return (resources.files("fastapi_offline") / "static" / name).read_bytes()


def add_doc_routes(app: FastAPI, *, home: str) -> None:
    """/, /docs, /redoc and /docs/assets/NAME, outside the OpenAPI document; `app` must be made
    with ``docs_url=None, redoc_url=None``. `home` is where GET / leads."""
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/", include_in_schema=False)
    async def front_door() -> RedirectResponse:
        return RedirectResponse(home)

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png")

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url, title=f"{app.title} - ReDoc",
            redoc_js_url=f"{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_PATH}/favicon.png", with_google_fonts=False)

    @app.get(ASSETS_PATH + "/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in ASSETS:
            return Response(b'{"detail":"Not Found"}', status_code=404,
                            media_type="application/json")
        try:
            body = _asset(name)
        except ModuleNotFoundError:  # a lean install: the viewers' files are not there
            return Response(MISSING, status_code=503, media_type="text/plain; charset=utf-8")
        return Response(body, media_type=ASSETS[name],
                        headers={"Cache-Control": "max-age=86400",
                                 "X-Content-Type-Options": "nosniff"})
