"""A real stepwatch server for tests: uvicorn in a thread, on a loopback socket of its own.

Needs the server extra (``pip install 'stepwatch[server]'``); :mod:`stepwatch.testing` itself does not
import this module, so the report core's tests need no uvicorn::

    from stepwatch.testing.server import LocalServer, ServerThread

    with LocalServer(tmp_path / "sw.db") as server:      # create_app(ServerSettings(db=...)), served
        run = stepwatch.init(job="t", url=server.url)
        ...
    server.start()                                       # again: the same URL and database

    with ServerThread(app) as served:                    # any ASGI app
        httpx.get(served.url + "/healthz")

The socket is bound before uvicorn starts (port 0 picks a free one, with no window for another
process to take it), with ``TCP_NODELAY`` in effect: asyncio sets it only on sockets created with
``IPPROTO_TCP``, and without it Nagle's algorithm and delayed ACKs add about 40 ms to each response.
A server stopped and started again on the same port (``port=server.port``) serves the same URL, as a
restarted ``stepwatch server`` does.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from types import TracebackType
from typing import Any

try:
    import uvicorn
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError("stepwatch.testing.server needs the server extra: pip install 'stepwatch[server]'") from exc

from ..server.serving import Server

__all__ = ["LocalServer", "ServerThread"]


class ServerThread:
    """An ASGI app (a stepwatch server from ``create_app``) served by uvicorn in a daemon thread on 127.0.0.1.

    ``port``: 0 for a free one, or a port to bind again (with ``SO_REUSEADDR``: the previous server's
    connections may linger in ``TIME_WAIT``). ``send_buffer`` caps the kernel send buffer of every
    connection (accepted sockets inherit it), so that a client that does not read blocks the server's
    writes early. ``ssl_certfile``/``ssl_keyfile`` serve HTTPS. ``force_exit`` cuts open connections
    (live streams) at :meth:`stop` instead of waiting ``graceful_s`` for them. ``log_level`` is
    uvicorn's; its logging configuration is left to the test runner (``log_config=None``: a
    ``dictConfig`` would close handlers that pytest holds).
    """

    def __init__(
        self,
        app: Any,
        *,
        port: int = 0,
        send_buffer: int | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        force_exit: bool = False,
        graceful_s: int = 1,
        log_level: str = "warning",
    ) -> None:
        self.app = app
        self.port = port
        self._send_buffer = send_buffer
        if (ssl_certfile is None) != (ssl_keyfile is None):
            raise ValueError("TLS needs both ssl_certfile and ssl_keyfile")
        self._tls: dict[str, str] = {}
        if ssl_certfile is not None and ssl_keyfile is not None:
            self._tls = {"ssl_certfile": ssl_certfile, "ssl_keyfile": ssl_keyfile}
        self._force_exit = force_exit
        self._graceful_s = graceful_s
        self._log_level = log_level
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._exit_code: int | str | None = None

    @property
    def url(self) -> str:
        """The base URL (``http://127.0.0.1:PORT``, ``https://`` with TLS)."""
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the server has started and not been stopped."""
        return self._server is not None and self._server.started and not self._server.should_exit

    def start(self, timeout: float = 15.0) -> ServerThread:
        """Bind, serve, and return once uvicorn accepts connections (``RuntimeError`` if it does not)."""
        if self._thread is not None:
            raise RuntimeError("this server is running: stop() it first")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            # always: Linux lets a restart bind the port again only if the connections of the previous
            # server (in TIME_WAIT) had SO_REUSEADDR too, and they inherit it from this socket
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self._send_buffer is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
            sock.bind(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_config=None,
            log_level=self._log_level,
            timeout_graceful_shutdown=self._graceful_s,
            **self._tls,  # type: ignore[arg-type]  # (str values; uvicorn's keywords are typed one by one)
        )
        server = Server(config)  # (its live streams end when it stops, as `stepwatch server`'s do)
        self._exit_code = None
        thread = threading.Thread(target=self._serve, args=(server, sock), name="uvicorn", daemon=True)
        thread.start()
        self._server, self._thread, self._sock = server, thread, sock
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                why = f"it exited with {self._exit_code}" if self._exit_code is not None else f"within {timeout} s"
                raise RuntimeError(f"uvicorn did not start on 127.0.0.1:{self.port}: {why} (see its log)")
            time.sleep(0.005)
        return self

    def _serve(self, server: Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits when the app's startup fails: the starter reports it
            self._exit_code = exc.code

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and close the socket (nothing when not running); ``RuntimeError`` if uvicorn hangs."""
        server, thread, sock = self._server, self._thread, self._sock
        self._server = self._thread = self._sock = None
        if server is None or thread is None or sock is None:
            return
        server.should_exit = True
        server.force_exit = self._force_exit
        thread.join(timeout)
        sock.close()
        if thread.is_alive():
            raise RuntimeError(f"uvicorn did not stop within {timeout} s")

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class LocalServer:
    """A stepwatch server on a SQLite file, as ``stepwatch server --db PATH`` runs it, in a thread.

    ``settings`` are :class:`~stepwatch.server.ServerSettings` fields (``auth="tokens"``,
    ``health_sweep_s=1.0``...). :meth:`stop` and :meth:`start` again serve the same URL and the same
    database with a new app, as a restarted server does: what a client or a reporter does across the
    restart is what it would do across a real one. The other keywords are :class:`ServerThread`'s.
    """

    def __init__(
        self,
        db: str | os.PathLike[str],
        *,
        log_level: str = "warning",
        force_exit: bool = False,
        **settings: Any,
    ) -> None:
        self.db = db
        self.settings = settings
        self.port = 0
        self._log_level = log_level
        self._force_exit = force_exit
        self._server: ServerThread | None = None

    @property
    def url(self) -> str:
        """The base URL (the same across restarts)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> LocalServer:
        """Build the app on the database and serve it (on the port of the previous start, if any)."""
        from stepwatch.server import ServerSettings, create_app

        app = create_app(ServerSettings(db=os.fspath(self.db), **self.settings))
        server = ServerThread(app, port=self.port, log_level=self._log_level, force_exit=self._force_exit)
        self._server = server.start(timeout)
        self.port = server.port
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (nothing when not running); the database stays."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(timeout)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
