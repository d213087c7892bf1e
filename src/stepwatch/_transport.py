"""The seam between the sender and the network.

The sender talks to a :class:`Transport`; production uses :class:`HTTPTransport` (standard library
``http.client``, one keep-alive connection per origin, TLS with an optional CA bundle), tests inject
an in-memory transport from :mod:`stepwatch.testing`. Connection-level failures (refused, reset,
timeout, TLS) become :class:`TransportError`; HTTP error statuses are ordinary responses.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

__all__ = ["HTTPTransport", "Response", "TokenSource", "Transport", "TransportError"]


class TransportError(Exception):
    """The request did not get an HTTP answer (connection refused or reset, timeout, TLS failure)."""


@dataclass(frozen=True)
class Response:
    """An HTTP answer: status, headers with lower-case names, and body."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""


class Transport(Protocol):
    """Sends one request and returns the answer; raises :class:`TransportError` when there is none."""

    def request(self, method: str, url: str, *, headers: Mapping[str, str], body: bytes, timeout: float) -> Response:
        """Send one request."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


class HTTPTransport:
    """HTTP/1.1 with keep-alive, one connection per origin, used by one sender thread at a time."""

    def __init__(self, ca_cert: str | None = None, max_response_bytes: int = 1 << 20) -> None:
        self._ca_cert = ca_cert
        self._ssl: ssl.SSLContext | None = None
        self._max_response = max_response_bytes
        self._connections: dict[tuple[str, str, int], http.client.HTTPConnection] = {}
        self._lock = threading.Lock()

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self._ca_cert)
        return self._ssl

    def _connection(self, scheme: str, host: str, port: int, timeout: float) -> http.client.HTTPConnection:
        key = (scheme, host, port)
        conn = self._connections.get(key)
        if conn is None:
            if scheme == "https":
                conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context())
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
            self._connections[key] = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def request(self, method: str, url: str, *, headers: Mapping[str, str], body: bytes, timeout: float) -> Response:
        """Send one request on a kept-alive connection (reconnecting once if it went stale)."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"unsupported URL {url!r}: use http:// or https://")
        port = parts.port or (443 if scheme == "https" else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        with self._lock:
            for attempt in (0, 1):
                try:
                    conn = self._connection(scheme, parts.hostname, port, timeout)
                except (OSError, ssl.SSLError) as exc:  # e.g. a CA bundle that cannot be read
                    raise TransportError(f"cannot set up TLS for {url}: {exc}") from None
                reused = conn.sock is not None
                try:
                    conn.request(method, target, body=body, headers=dict(headers))
                    raw = conn.getresponse()
                    data = raw.read(self._max_response + 1)
                    if len(data) > self._max_response or raw.will_close:
                        self._drop(scheme, parts.hostname, port)
                    return Response(
                        status=raw.status,
                        headers={k.lower(): v for k, v in raw.getheaders()},
                        body=data[: self._max_response],
                    )
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                    self._drop(scheme, parts.hostname, port)
                    if reused and attempt == 0:
                        continue  # the server closed an idle keep-alive connection: reconnect once
                    raise TransportError(f"{type(exc).__name__}: {exc}") from None
                except (OSError, http.client.HTTPException, ssl.SSLError, ValueError) as exc:
                    # ValueError: a header http.client refuses (a token with a line break in it)
                    self._drop(scheme, parts.hostname, port)
                    raise TransportError(f"{type(exc).__name__}: {exc}") from None
        raise TransportError("unreachable")  # pragma: no cover - the loop returns or raises

    def _drop(self, scheme: str, host: str, port: int) -> None:
        conn = self._connections.pop((scheme, host, port), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close every kept-alive connection."""
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()


class TokenSource:
    """The bearer token: a fixed value, or a file re-read whenever it changes (rotating tokens)."""

    def __init__(self, token: str | None = None, path: str | None = None) -> None:
        self._token = token.strip() if token else None
        self._path = path
        self._stamp: tuple[int, int, int] | None = None
        self._from_file: str | None = None
        self.error: str | None = None
        """Why the token file could not be read, the last time it was tried."""

    def header(self) -> dict[str, str]:
        """``{"Authorization": "Bearer ..."}``, or ``{}`` when there is no token."""
        token = self.get()
        return {"Authorization": f"Bearer {token}"} if token else {}

    def get(self) -> str | None:
        """The current token (the file is stat'ed on every call, read only when it changed)."""
        if self._token is not None or self._path is None:
            return self._token
        try:
            st = os.stat(self._path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                with open(self._path, encoding="utf-8") as fh:
                    self._from_file = fh.read().strip() or None
                self._stamp = stamp
                self.error = None
        except OSError as exc:
            self.error = f"cannot read token file {self._path}: {exc.strerror or exc}"
        return self._from_file

    def set(self, token: str) -> None:
        """Use this token from now on (one the server issued when the job registered itself)."""
        self._token = token.strip() or None

    @property
    def missing(self) -> bool:
        """Whether there is no token at all: neither a value nor a file to read one from."""
        return self._token is None and self._path is None

    def invalidate(self) -> None:
        """Force a re-read of the token file on the next call (after the server refused it)."""
        self._stamp = None
