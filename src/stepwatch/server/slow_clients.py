"""Slow clients: uvicorn's HTTP protocol with a bound on how long, and how much, a request's head may take.

uvicorn bounds only the wait between two requests of a kept-alive connection (``timeout_keep_alive``); a
client that connects and sends nothing, or trickles its headers a byte at a time (slow loris), holds its
connection for good, and headers sent fast have no size limit with httptools. Here a request's line and
headers must arrive within ``head_timeout_s`` of the connection (or of the request's first byte), in at
most :data:`MAX_HEAD_BYTES`; else the connection is closed. A response sent before its request's body was
all read closes the connection too, so that the rest of that body is never awaited at the client's pace.
The body itself is bounded in time where the app reads it (``read_json``, ``body_timeout_s``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["MAX_HEAD_BYTES", "protocol_class"]

_log = logging.getLogger("stepwatch.server")

MAX_HEAD_BYTES = 64 * 1024
"""Largest request line and headers together (h11's default bound is 16 KiB; httptools has none)."""


def protocol_class(head_timeout_s: float) -> Any:
    """uvicorn's httptools protocol with the bounds above, for ``uvicorn.run(http=...)``; ``"auto"``
    (uvicorn's own choice, with a warning) when httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        _log.warning("httptools is not installed: slow clients are not cut off (pip install 'uvicorn[standard]')")
        return "auto"

    class BoundedHeadProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._await_head()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is not None:
                self._head_bytes += len(data)
                if self._head_bytes > MAX_HEAD_BYTES:
                    self._cut("its request headers are over 64 KiB")
                    return
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._await_head()

        def on_headers_complete(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            if self.cycle is not None and self.cycle.more_body and not self.transport.is_closing():
                self.transport.close()  # the rest of the body would be read, and thrown away, at the client's pace
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

        def _await_head(self) -> None:
            if self._head_timer is None:
                self._head_bytes = 0
                self._head_timer = self.loop.call_later(
                    head_timeout_s, self._cut, f"its request headers did not arrive within {head_timeout_s:g} s"
                )

        def _cut(self, why: str) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                _log.info("closed the connection of %s: %s", self.client, why)
                self.transport.close()

    return BoundedHeadProtocol
