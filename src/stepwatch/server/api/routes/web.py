"""The web dashboard: its page at ``/``, its own static files under ``/ui/``, and the charting library.

No Node build step and no CDN (clusters often have no internet): the dashboard is plain ES modules
and CSS in ``server/web/``, and its charts are drawn by plotly.js as shipped inside the ``plotly``
Python package (a dependency of the ``server`` extra), served from the installed package. That file
is about 4.8 MB; it is compressed once, on its first request, and loaded by the page only when a
chart is first shown, so the job list never waits for it.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ...store.offload import blocking

__all__ = ["WEB_DIR", "charting_library_path", "routes"]

WEB_DIR = Path(__file__).resolve().parents[2] / "web"
"""The dashboard's own files (``index.html``, ``app.css``, ``js/*.js``)."""

_MISSING_LIBRARY = "window.STEPWATCH_NO_CHARTS = \"charts need the plotly package: pip install 'stepwatch[server]'\";\n"


def charting_library_path() -> Path | None:
    """``plotly.min.js`` inside the installed plotly package, without importing plotly (slow, heavy)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / "package_data" / "plotly.min.js"
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class _Asset:
    body: bytes
    gzipped: bytes
    etag: str


@functools.cache
def _charting_library() -> _Asset | None:
    path = charting_library_path()
    if path is None:
        return None
    body = path.read_bytes()
    return _Asset(body, gzip.compress(body, compresslevel=6, mtime=0), f'"{hashlib.sha1(body).hexdigest()[:20]}"')


_warming: set[asyncio.Future[_Asset | None]] = set()


async def index(request: Request) -> Response:
    """``GET /``: the dashboard page (views are chosen in the URL's fragment: ``#/admin``, ``#/compare``)."""
    if _charting_library.cache_info().currsize == 0 and not _warming:
        # compress the charting library now, in a worker thread, so that it is ready when the page asks
        warm = asyncio.ensure_future(blocking(_charting_library))
        _warming.add(warm)
        warm.add_done_callback(_warming.discard)
    return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})


async def charting_library(request: Request) -> Response:
    """``GET /ui/vendor/plotly.min.js``: plotly.js from the installed plotly package, gzipped when accepted."""
    asset = await blocking(_charting_library)
    if asset is None:
        return Response(_MISSING_LIBRARY, media_type="text/javascript", headers={"Cache-Control": "no-cache"})
    headers = {"ETag": asset.etag, "Cache-Control": "public, max-age=86400", "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(asset.gzipped, media_type="text/javascript", headers={**headers, "Content-Encoding": "gzip"})
    return Response(asset.body, media_type="text/javascript", headers=headers)


routes = [
    Route("/", index, methods=["GET"]),
    Mount(
        "/ui",
        routes=[
            Route("/vendor/plotly.min.js", charting_library, methods=["GET"]),
            Mount("/", app=StaticFiles(directory=str(WEB_DIR)), name="files"),
        ],
        name="ui",
    ),
]
