"""The ASGI application factory: ``create_app(settings)`` or ``create_app(store=...)`` for tests."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse

from . import health, replicas, retention
from .errors import ApiError, error_response, handle_api_error
from .guard import Guard
from .health import HealthMonitor
from .live import Broadcaster
from .notify import Notifier, parse_targets
from .policies.alerts import DEFAULT_NOTIFY_ON, check_targets, notify_hook
from .prometheus import registry_for
from .routes import access, costs, ingest, jobs, meta, policies, web
from .runners.kubernetes.wiring import start_kubernetes
from .services import Services, blocking
from .settings import ServerSettings
from .siblings import SiblingRelay, WorkerRole
from .store import SQLiteStore, Store, StoreError

__all__ = ["create_app", "open_store"]

_log = logging.getLogger("stepwatch.server")


def open_store(settings: ServerSettings, shared: bool = False) -> Store:
    """The store the settings name: PostgreSQL for a ``postgresql://`` URL, else the SQLite file
    (``shared``: other workers of this server write it too)."""
    url = settings.postgres_url()
    if url is None:
        return SQLiteStore(settings.database_path(), shared=shared)
    try:
        from .store.postgres import PostgresStore
    except ImportError as exc:
        raise StoreError(
            f"PostgreSQL needs its extra ({exc.name} is missing): pip install 'stepwatch[postgres]'"
        ) from None
    return PostgresStore(url)


async def _cancel(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel background tasks and wait for their end."""
    for task in tasks:
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _limited(store: Store, settings: ServerSettings) -> Store:
    """The store, holding the limits the settings give it."""
    store.max_metric_names = settings.max_metric_names
    return store


def create_app(
    settings: ServerSettings | None = None,
    *,
    store: Store | None = None,
    clock: Callable[[], float] = time.time,
    worker: WorkerRole | None = None,
) -> Starlette:
    """A stepwatch server application. The store is opened here and closed at shutdown.

    ``worker``: this application is one of several processes of one server (``--workers``); only the
    primary does what must be done once, and live updates are relayed to the others.
    ``ValueError`` when the access settings are unsafe (auth none on a non-loopback address)."""
    settings = settings or ServerSettings()
    problem = settings.auth_problem()
    if problem is not None:
        raise ValueError(problem)
    owned = store is None
    primary = worker is None or worker.primary
    the_store = _limited(
        store if store is not None else open_store(settings, shared=worker is not None and worker.count > 1), settings
    )
    services = Services(
        store=the_store,
        live=Broadcaster(
            ring_bytes=settings.live_ring_bytes,
            max_streams=settings.live_streams,
            max_per_client=settings.live_streams_per_client,
        ),
        clock=clock,
        prices=settings.price_list(),
        health=HealthMonitor(settings.health_params()),
        auth=settings.authenticator(),
    )
    notifier = Notifier(parse_targets(settings.notify, settings.notify_secret), rules=settings.target_rules())
    server_policy = settings.policy
    if notifier.targets and not server_policy.on:
        server_policy = replace(server_policy, on=dict(DEFAULT_NOTIFY_ON))
    book = services.policies.book
    book.server = server_policy.with_origin("server")
    book.check_targets = functools.partial(check_targets, secret=settings.notify_secret, rules=notifier.rules)
    services.policies.notify = notify_hook(notifier, settings.notify_secret, settings.public_url)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        book.load(await blocking(the_store.namespace_policies))
        bridge = replicas.bridge_for(the_store, services.live, clock)
        if bridge is not None:
            await bridge.start()
        relay = await SiblingRelay.start_for(services.live, worker)  # the other workers of this server
        await notifier.start()
        kubernetes = await start_kubernetes(app, settings, services) if primary else None
        sweeper = asyncio.create_task(
            health.sweep_forever(
                services.health,
                the_store,
                services.live,
                blocking,
                clock,
                settings.health_sweep_s,
                services.policies.review if primary else None,
                silence=primary,
            )
        )
        retainer = retention.start(the_store, blocking, clock, settings) if primary else None
        try:
            yield
        finally:
            await _cancel(sweeper, retainer)
            await notifier.aclose(timeout_s=5)
            if kubernetes is not None:
                await kubernetes()
            for link in (bridge, relay):
                if link is not None:
                    await link.aclose()
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
        routes=[
            *ingest.routes,
            *jobs.routes,
            *policies.routes,
            *costs.routes,
            *access.routes,
            *meta.routes,
            *web.routes,
        ],
        exception_handlers={ApiError: handle_api_error, HTTPException: http_error, Exception: crash},
        lifespan=lifespan,
        middleware=[Middleware(Guard, rules=settings.guard_rules())],
    )
    app.state.services = services
    app.state.notifier = notifier
    app.state.prometheus = registry_for(the_store, clock, services.stats, notifier)
    app.state.settings = settings
    app.state.worker = worker
    return app
