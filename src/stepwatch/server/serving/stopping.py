"""A stop that does not wait for the live streams: uvicorn's server, told to end them when it stops.

A live stream (``GET /api/v1/events``) never ends by itself, and uvicorn runs the app's lifespan shutdown
only after every connection has closed, so the app never heard that a stop had begun: uvicorn waited its
``timeout_graceful_shutdown`` (5 s) for the open streams, then cancelled them and logged ``ERROR: Cancel 1
running task(s), timeout graceful shutdown exceeded``; the clients read a cut chunked body. :class:`Server`
ends every open stream (:meth:`.Broadcaster.end_streams`) as soon as the stop begins, before uvicorn closes
its connections: each stream sends what it still holds and ends as a response does, the clients reconnect
(with ``Last-Event-ID``) to whichever server answers next, and the stop takes a few tenths of a second.
``timeout_graceful_shutdown`` stays the bound for what still does not end (a client that reads nothing
holds its stream's last write).

The hook is :meth:`uvicorn.Server.shutdown`, not the signal handler (``handle_exit``, which sse-starlette
patches): every stop goes through it, by SIGTERM, Ctrl-C, or ``should_exit`` set by a program (a test's
server in a thread), and it runs on the event loop, where the broadcaster lives, so nothing has to cross
threads.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from ..live.broadcaster import Broadcaster

__all__ = ["Server", "serve", "stop_hooks"]

_log = logging.getLogger("stepwatch.server")


def stop_hooks(app: Any) -> list[Callable[[], None]]:
    """What must hear at once that a server of ``app`` stops: a stepwatch app's live streams; nothing for
    another ASGI app."""
    services = getattr(getattr(app, "state", None), "services", None)
    live = getattr(services, "live", None)
    return [live.end_streams] if isinstance(live, Broadcaster) else []


class Server(uvicorn.Server):
    """uvicorn's server that calls ``on_stop`` (default: :func:`stop_hooks` of the config's app) on the event
    loop when a stop begins, before it closes the connections and waits for them."""

    def __init__(self, config: uvicorn.Config, on_stop: Sequence[Callable[[], None]] | None = None) -> None:
        super().__init__(config)
        self.on_stop = list(stop_hooks(config.app) if on_stop is None else on_stop)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """End what would hold the stop (calls ``on_stop``), then uvicorn's shutdown."""
        # the streams see it only at their next turn of the loop, after the listening sockets are
        # closed below (no await comes first): a client that reconnects at once finds this server gone
        for hook in self.on_stop:
            try:
                hook()
            except Exception:  # the stop goes on: timeout_graceful_shutdown still bounds it
                _log.exception("ending the live streams at a stop failed")
        await super().shutdown(sockets)


def serve(app: Any, **options: Any) -> bool:
    """Serve ``app`` with uvicorn (``options``: :class:`uvicorn.Config`'s) until a stop, as ``uvicorn.run``
    does with one process, but with :class:`Server`; ``False`` when it did not start (a failed startup)."""
    server = Server(uvicorn.Config(app, **options))
    try:
        server.run()
    except KeyboardInterrupt:  # a second Ctrl-C during the stop (uvicorn.run swallows it too)
        pass
    return server.started
