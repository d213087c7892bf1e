"""Slow clients: uvicorn's HTTP protocol with a bound on how long, and how much, a request's head may take.

uvicorn bounds only the wait between two requests of a kept-alive connection (``timeout_keep_alive``); a
client that connects and sends nothing, or trickles its headers a byte at a time (slow loris), holds its
connection for good, and headers sent fast have no size limit with httptools. Here a request's line and
headers must arrive within ``head_timeout_s`` of the connection (or of the request's first byte), else
the connection is closed; a head over :data:`MAX_HEAD_BYTES` is answered 431 (a Kubernetes ``Status``, as
every error of the server) and its connection ended as below. Only the head counts: the bytes of a body that
arrive in the same read as the end of the headers (a client writing both at once, as urllib does) are
the body's, fed to the parser as such.

A response sent before its request's body was all read (a 413 from the ``Content-Length``, a 404 of a
job that does not exist) ends the connection without waiting for the rest of that body at the client's
pace, and without losing the answer: the server's side is shut for writing (the client reads the answer,
then the end of the stream) while what the client still sends is read and dropped for at most
:data:`LINGER_S` (:data:`LINGER_IDLE_S` of silence ends it sooner); only then is the connection closed.
Closing at once would make the kernel answer the unread bytes with a reset, which can discard the
response before the client reads it. The body itself is bounded in time where the app reads it
(``read_json``, ``body_timeout_s``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from ..api.errors import error_body

if TYPE_CHECKING:  # the mixin's base, for mypy; at run time it is mixed in by protocol_class
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _ProtocolBase
else:
    _ProtocolBase = object

__all__ = ["LINGER_IDLE_S", "LINGER_S", "MAX_HEAD_BYTES", "protocol_class"]

_log = logging.getLogger("stepwatch.server")

MAX_HEAD_BYTES = 64 * 1024
"""Largest request line and headers together (h11's default bound is 16 KiB; httptools has none)."""
LINGER_S = 1.0
"""After an answer sent before its body was read, the longest the rest of that body is read and dropped."""
LINGER_IDLE_S = 0.25
"""... and the longest pause of the client in it before the connection is closed."""


def _head_too_large() -> bytes:
    """The raw 431 answer to a head over the limit (no request was parsed: no app sees it)."""
    body = json.dumps(error_body(431, f"the request line and headers are over {MAX_HEAD_BYTES} bytes (64 KiB)"))
    return (
        "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n{body}"
    ).encode()


class _BoundedHead(_ProtocolBase):
    """The bounds above, mixed into uvicorn's httptools protocol by :func:`protocol_class` (a mixin, as httptools
    is optional: the module imports without it).

    A head's bound is kept by one timer per connection, armed lazily: a request notes when its head began
    (``_head_since``) and its end clears it; the timer, once armed, is not moved at every request but, when
    it fires, cuts the connection if a head has stood its whole bound, re-arms itself for the end of the
    bound of a head that began later, or rests until the next head. A head is cut when its bound ends, as
    with a timer per request, and a kept-alive connection sending a report every 2 s makes no timer a
    request (a timer set and cancelled each request cost several microseconds of the loop's time)."""

    _head_timer: asyncio.TimerHandle | None = None
    _head_since: float | None = None
    """When the request head now awaited began (``None``: none is awaited)."""
    _head_bytes = 0
    _linger_timer: asyncio.TimerHandle | None = None
    _linger_until = 0.0
    _head_timeout_s = 0.0  # set per server by protocol_class

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._linger_timer is not None:
            self._linger_more()  # the rest of a body nobody reads: dropped
            return
        if self._head_since is not None:
            # feed no more than the head may still take: if the headers end inside it, the parser
            # says so (on_headers_complete) and what follows is the body, not counted
            room = MAX_HEAD_BYTES - self._head_bytes
            if len(data) > room:
                head, data = data[:room], data[room:]
            else:
                head, data = data, b""
            self._head_bytes += len(head)
            super().data_received(head)
            if not data or self.transport.is_closing():
                return
            if self._head_since is not None:
                self._refuse_head()
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._await_head()

    def on_headers_complete(self) -> None:
        self._head_since = None
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        if self.cycle is not None and self.cycle.more_body and not self.transport.is_closing():
            self._linger()  # the rest of the body would be read, and thrown away, at the client's pace
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._linger_timer = None
        self._head_since = None
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_since is None and self._linger_timer is None:
            self._head_bytes = 0
            self._head_since = self.loop.time()
            if self._head_timer is None:
                self._head_timer = self.loop.call_at(self._head_since + self._head_timeout_s, self._head_due)

    def _head_due(self) -> None:
        """The head timer fired: cut a head that has stood its bound, wait for the end of a later one's."""
        self._head_timer = None
        if self._head_since is None:
            return  # no head awaited: armed again by the next one
        due = self._head_since + self._head_timeout_s
        if self.loop.time() >= due:
            self._cut(f"its request headers did not arrive within {self._head_timeout_s:g} s")
        else:
            self._head_timer = self.loop.call_at(due, self._head_due)

    def _refuse_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_since = None
        _log.info("answered 431 to %s: its request headers are over 64 KiB", self.client)
        self.transport.write(_head_too_large())
        self._linger()

    def _linger(self) -> None:
        """Shut the writing side (the answer, then EOF, reach the client) and drop what still comes."""
        if not self.transport.can_write_eof():  # TLS: no half-close; the answer is flushed by close()
            self.transport.close()
            return
        self.transport.write_eof()
        self.flow.resume_reading()
        self._linger_until = self.loop.time() + LINGER_S
        self._linger_more()

    def _linger_more(self) -> None:
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        at = min(self.loop.time() + LINGER_IDLE_S, self._linger_until)
        self._linger_timer = self.loop.call_at(at, self._cut, "")

    def _cut(self, why: str) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        self._head_timer = None
        self._linger_timer = None
        self._head_since = None
        if not self.transport.is_closing():
            if why:
                _log.info("closed the connection of %s: %s", self.client, why)
            self.transport.close()


def protocol_class(head_timeout_s: float) -> Any:
    """uvicorn's httptools protocol with the bounds above, for ``uvicorn.run(http=...)``; ``"auto"``
    (uvicorn's own choice, with a warning) when httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        _log.warning("httptools is not installed: slow clients are not cut off (pip install 'uvicorn[standard]')")
        return "auto"

    class BoundedHeadProtocol(_BoundedHead, HttpToolsProtocol):
        _head_timeout_s = head_timeout_s

    return BoundedHeadProtocol
