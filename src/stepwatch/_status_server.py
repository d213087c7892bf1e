"""A tiny HTTP server in one daemon thread that answers every GET with the same pre-encoded JSON.

What rank 0 serves to OpenShift AI's progression controller (:mod:`stepwatch._progression` publishes
the bytes). It is built for a training process, next to a training loop it must never hurt:

* **One thread, no thread per client.** A ``selectors`` loop over non-blocking sockets: a slow or
  hostile client holds nothing but one of :data:`MAX_CONNECTIONS` slots, and a new connection beyond
  them closes the oldest one, so a flood cannot keep a real poll out.
* **Almost no GIL time per request.** The response is built whole (status line, headers, body) when
  the status changes, in the sender thread; a GET is an accept, a read (at once: the request has
  usually arrived), a look at the request line, one send of those bytes, a read that finds nothing more,
  and a close. Each system call hands the GIL over; while the main thread runs pure Python the
  interpreter hands it back every switch interval (5 ms), so an answer takes tens of milliseconds at
  worst, not the loop's time, and the loop loses only the microseconds the server runs.
* **Bounded.** A request head of at most :data:`MAX_REQUEST_BYTES` (431, or 414 for the request line
  alone), :data:`REQUEST_TIMEOUT` seconds from the connection to the end of the answer, one request
  per connection (``Connection: close``: nothing to keep alive), and when the client sent more than its
  request, a short lingering close that reads and drops it, so that it reads the answer, not a reset.
* **Strict about little.** GET and HEAD on any path answer 200 (Red Hat's server answers any path,
  and the controller asks for ``/metrics``); other methods 405; a request line that is not
  ``METHOD TARGET HTTP/1.x``, or a header line without a colon, 400.

Listening sockets carry ``SO_REUSEADDR`` (a restarted process rebinds at once, past connections in
``TIME_WAIT``; on Linux a port another socket listens on stays refused) and are closed in a child after
``fork()``: a DataLoader worker must not keep the port bound after its parent is gone.
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import socket
import threading
import time
from typing import Final

__all__ = ["MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "REQUEST_TIMEOUT", "StatusServer", "serve"]

_log = logging.getLogger("stepwatch")

MAX_CONNECTIONS: Final = 32
"""Connections held at once; one more closes the oldest."""
MAX_REQUEST_BYTES: Final = 8192
"""The longest request head read (request line and headers)."""
REQUEST_TIMEOUT: Final = 3.0
"""Seconds from a connection to the end of its answer (the controller itself gives up after 2 s)."""
LINGER_TIME: Final = 0.5
LINGER_BYTES: Final = 65536
"""After an answer, at most this long and this much is read and dropped before the socket is closed."""
_DONTWAIT: Final = getattr(socket, "MSG_DONTWAIT", 0)
"""Non-blocking reads and writes on a socket left blocking: one system call (and GIL hand-over) less each."""
_ACCEPT_BURST: Final = 256
_BACKLOG: Final = 1024
"""Connections the kernel holds for accept(): a flood waits there, not in SYN retransmits of a second."""
_RECV: Final = 4096
_TOKEN: Final = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def _response(status: str, body: bytes = b"", *, extra: str = "", head_only: bool = False) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Cache-Control: no-store\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


_BAD_REQUEST: Final = _response("400 Bad Request", b'{"error":"bad request"}')
_NOT_ALLOWED: Final = _response(
    "405 Method Not Allowed", b'{"error":"only GET and HEAD"}', extra="Allow: GET, HEAD\r\n"
)
_URI_TOO_LONG: Final = _response("414 URI Too Long", b'{"error":"request line too long"}')
_TOO_LARGE: Final = _response("431 Request Header Fields Too Large", b'{"error":"request head too large"}')


class _Connection:
    """One client: what it sent so far, what is left to send it, and until when it may take."""

    __slots__ = ("deadline", "dropped", "events", "out", "received", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.received = bytearray()
        self.out: memoryview | None = None
        """The answer still to send; set once the request is read."""
        self.events = 0
        """What the selector watches it for (0: not registered)."""
        self.dropped = 0
        """Bytes read and dropped after the answer (the lingering close)."""


class StatusServer:
    """Serves the bytes given to :meth:`publish` to every GET (and their headers to every HEAD)."""

    def __init__(self, listener: socket.socket, requested: tuple[str, int]) -> None:
        self._listener = listener
        self._requested = requested
        host, port = listener.getsockname()[:2]
        self.address: tuple[str, int] = (str(host), int(port))
        """The address it listens on (the real port when port 0 was asked for)."""
        self._get = _response("200 OK", b"{}")
        self._head = _response("200 OK", b"{}", head_only=True)
        self._connections: dict[socket.socket, _Connection] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closed = False
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------------------- the training side

    def publish(self, body: bytes) -> None:
        """Serve ``body`` from now on (called from the sender thread; two attribute stores, no lock)."""
        self._head = _response("200 OK", body, head_only=True)
        self._get = _response("200 OK", body)

    @property
    def open_connections(self) -> int:
        """Client connections held now."""
        return len(self._connections)

    @property
    def closed(self) -> bool:
        """Whether the server has stopped listening."""
        return self._closed

    def start(self) -> bool:
        """Start the daemon thread; ``False`` when no thread can be started (the socket is then closed)."""
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._loop, name="stepwatch-progression", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            self._thread = None
            self._close_all()
            return False
        return True

    def close(self, timeout: float = 1.0) -> None:
        """Stop listening now (the port is free when this returns) and end the thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if _SERVERS.get(self._requested) is self:
            del _SERVERS[self._requested]

    def after_fork_in_child(self) -> None:
        """In a forked child there is no thread: close every socket, so the child holds no port."""
        self._closed = True
        self._thread = None
        self._close_all()

    # --------------------------------------------------------------------------------- the loop

    def _loop(self) -> None:
        try:
            while not self._closed:
                timeout = None  # idle: asleep until a client comes (or close() writes to the wake socket)
                if self._connections:
                    first = min(c.deadline for c in self._connections.values())
                    timeout = max(first - time.monotonic(), 0.0)
                for key, _ in self._selector.select(timeout):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._drain_wake()
                    else:
                        self._on_ready(key.data)
                self._expire(time.monotonic())
        except Exception as exc:  # the server is gone, training goes on
            if not self._closed:
                _log.warning("stepwatch: the progression server stopped (%r); the status is no longer served", exc)
        finally:
            self._closed = True
            self._close_all()

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BURST):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED):
                    return  # out of descriptors or a client gone: try again at the next event
                raise
            if len(self._connections) >= MAX_CONNECTIONS:
                oldest = min(self._connections.values(), key=lambda c: c.deadline)
                self._drop(oldest)
            if not _DONTWAIT or sock.gettimeout() is not None:  # a default timeout would make recv wait
                sock.setblocking(False)
            connection = _Connection(sock, time.monotonic() + REQUEST_TIMEOUT)
            self._connections[sock] = connection
            # the request has usually arrived by now (a client sends it right after connecting): read it at
            # once, and only wait on the selector for what has not come yet
            self._on_ready(connection)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    def _on_ready(self, connection: _Connection) -> None:
        try:
            if connection.events == selectors.EVENT_WRITE:
                self._write(connection)
            else:
                self._read(connection)
        except OSError:
            self._drop(connection)

    def _watch(self, connection: _Connection, events: int) -> None:
        """Have the selector wake the loop when ``connection`` is ready for ``events``."""
        if connection.events == events:
            return
        if connection.events:
            self._selector.modify(connection.sock, events, connection)
        else:
            self._selector.register(connection.sock, events, connection)
        connection.events = events

    def _read(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(_RECV, _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            self._watch(connection, selectors.EVENT_READ)
            return
        if not data:
            self._drop(connection)
            return
        if connection.out is not None:  # lingering after the answer: drop what comes, within bounds
            connection.dropped += len(data)
            if connection.dropped > LINGER_BYTES:
                self._drop(connection)
            return
        start = max(len(connection.received) - 3, 0)
        connection.received += data
        received = connection.received
        end = received.find(b"\r\n\r\n", start)
        if end < 0:
            end = received.find(b"\n\n", start)
        if end >= 0 and end <= MAX_REQUEST_BYTES:
            self._answer(connection, self._respond(bytes(received[:end])))
        elif len(received) > MAX_REQUEST_BYTES:
            line_ends = received.find(b"\n", 0, MAX_REQUEST_BYTES)
            self._answer(connection, _TOO_LARGE if line_ends >= 0 else _URI_TOO_LONG)
        else:
            self._watch(connection, selectors.EVENT_READ)

    def _respond(self, head: bytes) -> bytes:
        lines = head.split(b"\n")
        parts = lines[0].rstrip(b"\r").split(b" ")
        if len(parts) != 3 or not parts[0] or not _TOKEN.issuperset(parts[0]) or not parts[1]:
            return _BAD_REQUEST
        if parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
            return _BAD_REQUEST
        for line in lines[1:]:
            if b":" not in line:
                return _BAD_REQUEST
        method = parts[0]
        if method == b"GET":
            return self._get
        if method == b"HEAD":
            return self._head
        return _NOT_ALLOWED

    def _answer(self, connection: _Connection, response: bytes) -> None:
        connection.out = memoryview(response)
        connection.received = bytearray()
        self._write(connection)

    def _write(self, connection: _Connection) -> None:
        out = connection.out
        assert out is not None
        try:
            out = out[connection.sock.send(out, _DONTWAIT) :]
        except (BlockingIOError, InterruptedError):
            pass
        connection.out = out
        if len(out):  # the client reads slowly: wait until it can take more (within its deadline)
            self._watch(connection, selectors.EVENT_WRITE)
            return
        # answered. Closing a socket with unread bytes sends a reset, which can make the client lose the
        # answer: with nothing more sent (a plain GET), close now; else read and drop what comes, briefly
        try:
            extra = connection.sock.recv(_RECV, _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            self._drop(connection)
            return
        if not extra:
            self._drop(connection)
            return
        connection.dropped = len(extra)
        connection.deadline = min(connection.deadline, time.monotonic() + LINGER_TIME)
        connection.sock.shutdown(socket.SHUT_WR)
        self._watch(connection, selectors.EVENT_READ)

    def _expire(self, now: float) -> None:
        for connection in [c for c in self._connections.values() if c.deadline <= now]:
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        self._connections.pop(connection.sock, None)
        if connection.events:
            connection.events = 0
            try:
                self._selector.unregister(connection.sock)
            except (KeyError, ValueError, OSError):
                pass
        try:
            connection.sock.close()
        except OSError:
            pass

    def _close_all(self) -> None:
        for connection in list(self._connections.values()):
            try:
                connection.sock.close()
            except OSError:
                pass
        self._connections.clear()
        for sock in (self._listener, self._wake_r, self._wake_w):
            try:
                sock.close()
            except OSError:
                pass
        try:
            self._selector.close()
        except Exception:
            pass


_SERVERS: dict[tuple[str, int], StatusServer] = {}
"""The servers of this process, by the address asked for (a new run on the same address reuses one)."""
_fork_hook = False


def serve(address: tuple[str, int]) -> StatusServer:
    """The server listening on ``address`` in this process, started now if there is none.

    Raises ``OSError`` when the address cannot be bound (the port is taken, the host is not this
    machine's) or no thread can be started.
    """
    global _fork_hook
    server = _SERVERS.get(address)
    if server is not None and not server.closed:
        return server
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        if os.name == "posix":  # elsewhere SO_REUSEADDR would let two sockets share a listening port
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(_BACKLOG)
        listener.setblocking(False)
    except OSError:
        listener.close()
        raise
    server = StatusServer(listener, address)
    if not server.start():
        raise OSError(errno.EAGAIN, "cannot start the progression server's thread")
    _SERVERS[address] = server
    if not _fork_hook and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook = True
    return server


def _after_fork_in_child() -> None:
    for server in list(_SERVERS.values()):
        server.after_fork_in_child()
    _SERVERS.clear()
