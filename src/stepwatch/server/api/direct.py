"""Routes served without Starlette's middleware, router and ``Request``: the report endpoint, which every
rank of every job calls every 2 s.

Before a route's function runs, Starlette spends about 5 µs a request in its two error middlewares (one
builds a ``Request``), its router's loop and the route's exception wrapper (another ``Request``); the
``Request``, its header object, its body generator and the ``Response`` object about 4 more. A
**direct** endpoint is a plain ASGI app (:func:`direct`): it reads the headers it needs from the scope
(:func:`first_headers`), its body from ``receive`` and sends its JSON answer itself (:func:`send_json`).

It stays one of the app's routes (``Route(path, endpoint, methods=...)``: OpenAPI lists it, another method
gets Starlette's 405), and Starlette serves it as any route when :class:`DirectRoutes` leaves a request
to it. The guard (:mod:`.guard`) asks :meth:`DirectRoutes.find` first: a request whose path and method
match one of the direct routes that lead the app's list (so that Starlette's router, which takes the first
route matching both, would choose that one too) is served at once, its errors answered by the app's own
exception handlers as Starlette's middlewares call them (:meth:`DirectRoutes.serve`):
``tests/server/api/test_direct_routes.py`` sends the same requests both ways and compares the answers.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from starlette._utils import is_async_callable
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from .responses import render_json

__all__ = ["DirectEndpoint", "DirectRoutes", "direct", "first_headers", "send_json"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiFunction = Callable[[Scope, Receive, Send], Awaitable[None]]
Handler = Callable[[Request, Exception], Any]


class DirectEndpoint:
    """An endpoint that is a plain ASGI app (Starlette calls a route's function with a ``Request``, and an
    object such as this one as an ASGI app)."""

    def __init__(self, func: AsgiFunction) -> None:
        self.func = func
        self.__name__ = func.__name__
        self.__doc__ = func.__doc__

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.func(scope, receive, send)


def direct(func: AsgiFunction) -> DirectEndpoint:
    """``func(scope, receive, send)`` as a route's endpoint that :class:`DirectRoutes` may serve directly."""
    return DirectEndpoint(func)


def first_headers(scope: Scope, names: frozenset[bytes]) -> dict[bytes, bytes]:
    """The first value of each header of ``names`` (lowercase) the request carries, as Starlette's
    ``request.headers.get`` reads them."""
    found: dict[bytes, bytes] = {}
    for key, value in scope["headers"]:
        if key in names and key not in found:
            found[key] = value
    return found


async def send_json(send: Send, content: Any, status: int = 200) -> None:
    """Answer ``content`` as a :class:`~.responses.FastJSONResponse` does: the same body, headers and messages."""
    body = render_json(content)
    headers = [(b"content-length", str(len(body)).encode("latin-1")), (b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_Leading = tuple[re.Pattern[str], frozenset[str] | None, Mapping[str, Convertor[Any]], Route, AsgiFunction]
_Known = tuple[frozenset[str] | None, tuple[Route, AsgiFunction, dict[str, Any]]] | None
_KNOWN_PATHS = 4096


class DirectRoutes:
    """The direct routes of an app (those of its routes, from the first, whose endpoints are direct) and its
    exception handlers, to serve them as Starlette would, without it."""

    def __init__(self, routes: Sequence[BaseRoute], handlers: Mapping[Any, Handler], *, debug: bool = False) -> None:
        self._handlers: dict[type[Exception], Handler] = {}
        self._status_handlers: dict[int, Handler] = {}
        crash = None
        for key, value in handlers.items():  # as Starlette's build_middleware_stack splits them
            if key in (500, Exception):
                crash = value
            elif isinstance(key, int):
                self._status_handlers[key] = value
            else:
                self._handlers[key] = value
        self._crash = crash
        self._routes: list[_Leading] = []
        self._known: dict[str, _Known] = {}
        """What each path seen matched (:meth:`find`)."""
        if crash is None or HTTPException not in self._handlers or debug:
            return  # Starlette's own 500 page or HTTP errors, or its debug traceback: left to Starlette
        for route in routes:
            if not (isinstance(route, Route) and isinstance(route.endpoint, DirectEndpoint)):
                break
            methods = frozenset(route.methods) if route.methods is not None else None
            self._routes.append((route.path_regex, methods, route.param_convertors, route, route.endpoint.func))

    def find(self, scope: Scope) -> tuple[Route, AsgiFunction, dict[str, Any]] | None:
        """The direct route that Starlette's router would choose for this request, with its path parameters;
        ``None`` for every other request (a path under a ``root_path``, a method the route does not take).

        What a path matches is remembered (a bounded dict): each rank posts to the same path every 2 s,
        and matching it cost more than the dict (1.8 us a request)."""
        if not self._routes or scope.get("root_path") or scope["type"] != "http":
            return None
        path = scope["path"]
        try:
            known = self._known[path]
        except KeyError:
            known = self._match(path)
            if len(self._known) >= _KNOWN_PATHS:  # bounded: forgetting only costs a match
                self._known.clear()
            self._known[path] = known
        if known is None:
            return None
        methods, found = known
        if methods is not None and scope["method"] not in methods:
            return None  # Starlette looks on (another route, or its 405)
        return found

    def _match(self, path: str) -> _Known:
        """The first direct route whose path matches, its methods, and the path's parameters (``None``: none)."""
        for regex, methods, convertors, route, func in self._routes:
            match = regex.match(path)
            if match is None:
                continue
            params = {key: convertors[key].convert(value) for key, value in match.groupdict().items()}
            return methods, (route, func, params)
        return None

    async def serve(
        self,
        found: tuple[Route, AsgiFunction, dict[str, Any]],
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        on_start: Callable[[Message], None] | None = None,
    ) -> None:
        """Serve a request :meth:`find` found; an exception is answered as Starlette's exception middleware (the
        handler of its class) or its server-error middleware (the app's 500 handler, and raised on) would.
        ``on_start`` sees every response's start before it is sent (the guard adds its headers there)."""
        route, func, params = found
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {**scope.get("path_params", {}), **params}
        started = False

        async def sender(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if on_start is not None:
                    on_start(message)
            await send(message)

        try:
            await func(scope, receive, sender)
        except Exception as exc:
            await self._answer(exc, started, scope, receive, sender)

    async def _answer(self, exc: Exception, started: bool, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self._handler(exc)
        if handler is not None and not started:
            response = await _call(handler, Request(scope, receive, send), exc)
            if response is not None:
                await response(scope, receive, send)
            exc.__traceback__ = None  # as Starlette: a reused exception would gather tracebacks
            return
        if handler is not None:
            try:
                raise RuntimeError("Caught handled exception, but response already started.") from exc
            except RuntimeError as error:
                exc = error
        assert self._crash is not None  # no direct route without it
        response = await _call(self._crash, Request(scope), exc)
        if not started:
            await response(scope, receive, send)
        raise exc

    def _handler(self, exc: Exception) -> Handler | None:
        if isinstance(exc, HTTPException) and exc.status_code in self._status_handlers:
            return self._status_handlers[exc.status_code]
        for cls in type(exc).__mro__:
            if cls in self._handlers:
                return self._handlers[cls]
        return None


async def _call(handler: Handler, request: Request, exc: Exception) -> Any:
    if is_async_callable(handler):
        return await handler(request, exc)
    return await run_in_threadpool(handler, request, exc)
