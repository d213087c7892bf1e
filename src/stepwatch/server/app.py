"""The ASGI application factory: ``create_app(settings)`` or ``create_app(store=...)`` for tests."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from .errors import ApiError, error_response, handle_api_error
from .live import Broadcaster
from .routes import ingest, jobs, meta
from .routes.common import Services
from .settings import ServerSettings
from .store import SQLiteStore, Store

__all__ = ["create_app"]

_log = logging.getLogger("stepwatch.server")


def create_app(
    settings: ServerSettings | None = None,
    *,
    store: Store | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """A stepwatch server application. The store is opened here and closed at shutdown."""
    settings = settings or ServerSettings()
    owned = store is None
    the_store = store if store is not None else SQLiteStore(settings.database_path())
    services = Services(store=the_store, live=Broadcaster(), clock=clock)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if owned:
            the_store.close()

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        message = {
            404: f"no route for {request.method} {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message, headers=dict(exc.headers or {}))

    async def crash(request: Request, exc: Exception) -> JSONResponse:
        _log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal error ({type(exc).__name__}); the server logged it")

    app = Starlette(
        routes=[*ingest.routes, *jobs.routes, *meta.routes],
        exception_handlers={ApiError: handle_api_error, HTTPException: http_error, Exception: crash},
        lifespan=lifespan,
    )
    app.state.services = services
    app.state.settings = settings
    return app
