"""The ASGI application factory: ``create_app(settings)`` or ``create_app(store=...)`` for tests.

Its steps: open the store, make the services the routes share, wire the notifier to the policies, and
start (at the application's start) what runs beside the routes: the health sweep, retention, the
Kubernetes runner, the live stream's link to other replicas."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from .api.direct import DirectRoutes
from .api.errors import ApiError, error_response, handle_api_error, handle_store_error
from .api.guard import Guard, GuardRules
from .api.prometheus import registry_for
from .api.routes import access, costs, events, ingest, jobs, policies, server_info, web
from .ingest import health_monitor
from .ingest.health_monitor import HealthMonitor
from .live import replicas
from .live.broadcaster import Broadcaster
from .notify import Notifier, parse_targets
from .policies.alerts import DEFAULT_NOTIFY_ON, check_targets, notify_hook
from .runners.kubernetes.wiring import start_kubernetes
from .services import Services
from .settings import ServerSettings
from .store import SQLiteStore, Store, StoreError, retention_task
from .store.offload import blocking

__all__ = ["create_app", "open_store"]

_log = logging.getLogger("stepwatch.server")


def open_store(settings: ServerSettings) -> Store:
    """The store the settings name: PostgreSQL for a ``postgresql://`` URL, else the SQLite file."""
    url = settings.postgres_url()
    if url is None:
        return SQLiteStore(settings.database_path())
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
) -> Starlette:
    """A stepwatch server application. The store is opened here and closed at shutdown.

    ``ValueError`` when the access settings are unsafe (auth none on a non-loopback address)."""
    settings = settings or ServerSettings()
    problem = settings.auth_problem()
    if problem is not None:
        raise ValueError(problem)
    the_store = _limited(store if store is not None else open_store(settings), settings)
    services = _services(settings, the_store, clock)
    notifier = _notifier(settings, services)
    app = _GuardedApp(
        settings.guard_rules(),
        routes=[
            *ingest.routes,
            *jobs.routes,
            *policies.routes,
            *costs.routes,
            *access.routes,
            *events.routes,
            *server_info.routes,
            *web.routes,
        ],
        exception_handlers={
            ApiError: handle_api_error,
            StoreError: handle_store_error,
            HTTPException: _http_error,
            Exception: _crash,
        },
        lifespan=_lifespan(settings, services, notifier, owned=store is None),
    )
    app.state.services = services
    app.state.auth = settings.authenticator()
    app.state.notifier = notifier
    app.state.prometheus = registry_for(the_store, clock, services.stats, notifier, services.writer)
    app.state.settings = settings
    return app


class _GuardedApp(Starlette):
    """A Starlette application with the :class:`Guard` outside everything, Starlette's error middleware
    included: a 500 (written by that middleware, which Starlette puts outside any middleware given to it)
    carries the security headers as every other answer does. The guard serves the direct routes (the
    report endpoint, :mod:`.api.direct`) itself, without Starlette's middleware and router."""

    def __init__(self, rules: GuardRules, **options: Any) -> None:
        self.guard_rules = rules
        super().__init__(**options)

    def build_middleware_stack(self) -> ASGIApp:
        direct = DirectRoutes(self.routes, self.exception_handlers, debug=self.debug)
        return Guard(super().build_middleware_stack(), rules=self.guard_rules, direct=direct)


def _services(settings: ServerSettings, store: Store, clock: Callable[[], float]) -> Services:
    """What every route uses: the store, the live stream, the clock, prices, health and access."""
    return Services(
        store=store,
        live=Broadcaster(
            ring_bytes=settings.live_ring_bytes,
            max_streams=settings.live_streams,
            max_per_client=settings.live_streams_per_client,
        ),
        clock=clock,
        prices=settings.price_list(),
        health=HealthMonitor(settings.health_params()),
        write_linger_s=settings.write_linger_ms / 1000,
    )


def _notifier(settings: ServerSettings, services: Services) -> Notifier:
    """The notifier of the settings' targets, wired to the policies: the server's layer (which notifies the
    bad news when targets are set and it says nothing itself), target checks and the notify hook."""
    notifier = Notifier(parse_targets(settings.notify, settings.notify_secret), rules=settings.target_rules())
    server_policy = settings.policy
    if notifier.targets and not server_policy.on:
        server_policy = replace(server_policy, on=dict(DEFAULT_NOTIFY_ON))
    book = services.policies.book
    book.server = server_policy.with_origin("server")
    book.check_targets = functools.partial(check_targets, secret=settings.notify_secret, rules=notifier.rules)
    services.policies.notify = notify_hook(notifier, settings.notify_secret, settings.public_url)
    return notifier


@dataclass
class _Background:
    """What runs beside the routes while the application lives; stopped in the reverse order of its start."""

    notifier: Notifier
    sweeper: asyncio.Task[None]
    retainer: asyncio.Task[None] | None = None
    kubernetes: Callable[[], Awaitable[None]] | None = None
    bridge: replicas.ReplicaBridge | None = None
    """The live stream's link to the other replicas (PostgreSQL)."""

    async def stop(self) -> None:
        await _cancel(self.sweeper, self.retainer)
        await self.notifier.aclose(timeout_s=5)
        if self.kubernetes is not None:
            await self.kubernetes()
        if self.bridge is not None:
            await self.bridge.aclose()


async def _start(app: Starlette, settings: ServerSettings, services: Services, notifier: Notifier) -> _Background:
    """Start what runs beside the routes."""
    store, clock = services.store, services.clock
    services.policies.book.load(await blocking(store.namespace_policies))
    bridge = replicas.bridge_for(store, services.live, clock)
    if bridge is not None:
        await bridge.start()
    await notifier.start()
    kubernetes = await start_kubernetes(app, settings, services)
    sweeper = asyncio.create_task(
        health_monitor.sweep_forever(
            services.health,
            store,
            services.live,
            blocking,
            clock,
            settings.health_sweep_s,
            services.policies.review,
        )
    )
    retainer = retention_task.start(
        store, blocking, clock, settings.retention_sweep_s, settings.retention_days, settings.quota_points
    )
    return _Background(notifier, sweeper, retainer, kubernetes, bridge)


def _lifespan(
    settings: ServerSettings, services: Services, notifier: Notifier, owned: bool
) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """The application's lifespan: the background work, and the store closed at the end when it is ours."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        background = await _start(app, settings, services, notifier)
        try:
            yield
        finally:
            await background.stop()
            if owned:
                services.store.close()

    return lifespan


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own errors (no route, method not allowed) in the one error shape."""
    assert isinstance(exc, HTTPException)
    message = {
        404: f"no route for {request.method} {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(exc.status_code, str(exc.detail))
    return error_response(exc.status_code, message, headers=dict(exc.headers or {}))


async def _crash(request: Request, exc: Exception) -> JSONResponse:
    """Anything unexpected: logged, and a 500 in the one error shape."""
    _log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(500, f"internal error ({type(exc).__name__}); the server logged it")
