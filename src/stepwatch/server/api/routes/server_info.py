"""What the server says about itself: its version, the API description and its interactive docs, the health
probe and the Prometheus metrics."""

from __future__ import annotations

import functools
import os
from importlib import metadata
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ....protocol import API_VERSION
from ...store.offload import blocking
from ..openapi import openapi_document
from ..request import require, services

__all__ = ["routes", "server_version"]


@functools.cache
def server_version() -> str:
    """The installed version of stepwatch (the server does not import the report core for it)."""
    try:
        return metadata.version("stepwatch")
    except metadata.PackageNotFoundError:
        return "unknown"


async def prometheus_metrics(request: Request) -> Response:
    """``GET /metrics``: every live job's progress, ETA, health and cost, in Prometheus' text format.
    With authentication on, it needs the viewer role over every namespace (a scrape token:
    ``stepwatch token create --role viewer --all-namespaces --name prometheus``)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    await require(request, "viewer")
    body = await blocking(generate_latest, request.app.state.prometheus)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def openapi(request: Request) -> JSONResponse:
    """``GET /openapi.json``."""
    return JSONResponse(openapi_document(server_version()))


def _swagger_assets() -> Path | None:
    try:
        import swagger_ui_bundle  # type: ignore[import-untyped]
    except ImportError:
        return None
    return Path(str(swagger_ui_bundle.swagger_ui_path))


async def docs(request: Request) -> Response:
    """``GET /docs``: Swagger UI from the bundled assets (no CDN: clusters often have no internet)."""
    if _swagger_assets() is None:
        return HTMLResponse(
            "<p>Interactive docs need the swagger-ui-bundle package (pip install 'stepwatch[server]'); "
            'the API description is at <a href="/openapi.json">/openapi.json</a>.</p>'
        )
    page = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>stepwatch API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css"></head>
<body><div id="ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/init.js"></script>
</body></html>"""
    return HTMLResponse(page)


async def docs_init(request: Request) -> Response:
    """``GET /docs/init.js``: starts Swagger UI (a file, not an inline script: the page's CSP allows none)."""
    return Response(_DOCS_INIT, media_type="text/javascript")


_DOCS_INIT = 'window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#ui"});\n'


async def healthz(request: Request) -> JSONResponse:
    """``GET /healthz``: the server answers and its store can be read."""
    svc = services(request)
    return JSONResponse(
        {
            "status": "ok",
            "version": server_version(),
            "api_version": API_VERSION,
            "stats": svc.stats,
            "subscribers": svc.live.subscribers,
            # which process answered: stats and subscribers are this replica's (PostgreSQL replicas)
            "process": {"pid": os.getpid()},
        }
    )


async def version(request: Request) -> JSONResponse:
    """``GET /api/v1/version``: what this server speaks."""
    return JSONResponse({"version": server_version(), "api_version": API_VERSION})


def _routes() -> list[Route | Mount]:
    found: list[Route | Mount] = [
        Route("/api/v1/version", version, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/docs", docs, methods=["GET"]),
        Route("/docs/init.js", docs_init, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", prometheus_metrics, methods=["GET"]),
    ]
    assets = _swagger_assets()
    if assets is not None:
        found.append(Mount("/docs/assets", app=StaticFiles(directory=str(assets)), name="swagger"))
    return found


routes = _routes()
