"""Helpers of the SDK tests (imported by their conftest and tests): a real stepwatch server that can be
stopped and started again, jobs that really report, a cuttable TCP proxy, and a scripted HTTP server for
the answers a real stepwatch server never gives (other API versions, 401, garbage).

Named ``swtest`` rather than ``conftest`` helpers: ``tests/`` has several conftest modules and no packages.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import stepwatch
from stepwatch.client import Client
from stepwatch.testing import wait_for  # the one polling helper, imported from here by these tests
from stepwatch.testing.server import LocalServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server(LocalServer):
    """A real stepwatch server in a thread; can be stopped and started again on the same port and database.
    Logs only what is critical: the streams a test leaves open are cut at the stop, which is no news."""

    def __init__(self, db: Path, **settings: Any) -> None:
        super().__init__(db, log_level="critical", **settings)


def start_job(url: str, ns: str, name: str, *, interval: float = 0.05, **fields: Any) -> stepwatch.Run:
    """Register a job and report for it, as a training process started by ``stepwatch run`` does."""
    init = {k: fields.pop(k) for k in ("params",) if k in fields}
    with Client(url) as c:
        _, token = c.register(name, ns, **fields)
    return stepwatch.init(job=name, namespace=ns, url=url, token=token, interval=interval, **init)


def step_until(url: str, ns: str, name: str, step: int) -> None:
    """Wait until the server has the job at ``step``."""
    with Client(url) as c:
        wait_for(lambda: c.job(name, ns).progress.step == step)


# ------------------------------------------------------------------------------------ a TCP proxy


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of a server; :meth:`cut` drops every connection through it
    (the server stays up, as when a network path or a load balancer fails mid-stream)."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self.refuse = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                down.close()
                continue
            try:
                up = socket.create_connection(self.target, timeout=5)
            except OSError:
                down.close()
                continue
            up.settimeout(None)
            with self._lock:
                self._conns += [down, up]
            threading.Thread(target=self._pipe, args=(down, up), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, down), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        """Drop every open connection."""
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._listener.close()


# ----------------------------------------------------------------------- a scripted HTTP server


Reply = tuple[int, dict[str, str], bytes]


class Scripted:
    """An HTTP server that answers from a script: ``routes[(method, path)]`` is a list of replies, the last
    one repeated. It stands in for what a real stepwatch server never says (another API version, 401,
    bodies that are not JSON), which the client must still turn into clear errors."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Reply]] = {}
        self.seen: list[tuple[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                path = self.path.split("?")[0]
                owner.seen.append((self.command, path))
                replies = owner.routes.get((self.command, path)) or [(404, {}, b'{"message": "no route"}')]
                status, headers, body = replies.pop(0) if len(replies) > 1 else replies[0]
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def on(self, method: str, path: str, *replies: tuple[int, Any] | Reply) -> None:
        """Script the answers of a route: ``(status, json_body)`` or ``(status, headers, raw_bytes)``."""
        script: list[Reply] = []
        for reply in replies:
            if len(reply) == 2:
                script.append((reply[0], {}, json.dumps(reply[1]).encode()))
            else:
                script.append(reply)  # type: ignore[arg-type]
        self.routes[(method, path)] = script

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@contextmanager
def timed() -> Iterator[list[float]]:
    out: list[float] = []
    t = time.perf_counter()
    yield out
    out.append(time.perf_counter() - t)
