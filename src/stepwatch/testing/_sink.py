"""A real HTTP report sink on loopback that records what arrives and misbehaves on request."""

from __future__ import annotations

import errno
import json
import random
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..protocol import (
    LIMITS,
    BodyTooLarge,
    Command,
    ProtocolError,
    Report,
    ReportResponse,
    TrainerStatus,
    decode_body,
    encode_body,
)

__all__ = ["Received", "ReportSink"]

_REPORT_SUFFIX = "/reports"
_KUBEFLOW_PREFIX = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/"


@dataclass(frozen=True)
class Received:
    """One request as it arrived, with the status it was answered."""

    time: float
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    status: int
    client_port: int = 0
    """The client's source port: requests on one kept-alive connection share it."""

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


@dataclass
class _Scripted:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


_PORTS = (20_000, 32_000)
"""Where a sink picks its port: below Linux's default range of ephemeral ports (32768-60999), which the
kernel hands out to outgoing connections."""


class ReportSink:
    """A loopback HTTP server that plays a stepwatch server (or a Kubeflow status endpoint).

    Native reports are validated, stored once per ``(run_id, rank, seq)`` and answered with the
    pending commands; Kubeflow bodies are validated and echoed, as upstream does. Failures:
    :meth:`down`/:meth:`up`, :meth:`fail` (any status, with headers, for the next N requests),
    :attr:`delay` (hang before answering), :attr:`token` (403 without the right bearer token).
    """

    def __init__(
        self, *, token: str | None = None, port: int = 0, tls_cert: str | None = None, tls_key: str | None = None
    ) -> None:
        self.token = token
        self._tls = (tls_cert, tls_key) if tls_cert else None
        self.delay = 0.0
        self.received: list[Received] = []
        self.reports: list[Report] = []
        self.statuses: list[TrainerStatus] = []
        self.duplicates = 0
        self.registrations: list[str] = []
        """``namespace/job`` of every job that registered itself."""
        self.by_job: dict[str, list[Report]] = {}
        """Stored native reports per ``namespace/job``, from the request path."""
        self._port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()  # wait_for predicates may call the accessors, which lock too
        self._changed = threading.Condition(self._lock)
        self._script: deque[_Scripted] = deque()
        self._seen: set[tuple[str, int, int]] = set()
        self._commands: dict[str, Command] = {}
        self._open: set[socket.socket] = set()
        self._stopping = threading.Event()

    # ----------------------------------------------------------------------------------- lifecycle

    def start(self) -> ReportSink:
        """Start listening (on the same port again after :meth:`down`)."""
        self._stopping.clear()
        server = (
            self._bind() if self._port == 0 else ThreadingHTTPServer(("127.0.0.1", self._port), self._handler_class())
        )
        server.daemon_threads = True
        if self._tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self._tls)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="report-sink", daemon=True)
        self._thread.start()
        return self

    def _bind(self) -> ThreadingHTTPServer:
        """A server on a free port below the system's range of ephemeral ports (:data:`_PORTS`).

        The sink listens on the same port again after :meth:`down`; a port the kernel hands out to
        outgoing connections could meanwhile be another connection's local end (seen under parallel
        tests: ``Address already in use`` at :meth:`up`). Ports below that range are never handed out
        so; the kernel's choice is the last resort.
        """
        for port in random.sample(range(*_PORTS), 64):
            try:
                return ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        return ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())

    def stop(self) -> None:
        """Stop listening and cut every open connection (clients then see refused connections)."""
        self._stopping.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            for sock in list(self._open):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open.clear()

    down = stop
    up = start

    def __enter__(self) -> ReportSink:
        return self.start() if self._server is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port (fixed after the first start, so that :meth:`up` comes back on it)."""
        return self._port

    @property
    def url(self) -> str:
        """The base URL of the native API (https when started with a certificate)."""
        scheme = "https" if self._tls else "http"
        return f"{scheme}://127.0.0.1:{self._port}"

    def kubeflow_url(self, namespace: str = "default", trainjob: str = "job") -> str:
        """The full upstream status URL of a TrainJob on this sink."""
        return f"{self.url}{_KUBEFLOW_PREFIX}{namespace}/trainjobs/{trainjob}/status"

    # ------------------------------------------------------------------------------------- control

    def fail(self, status: int, times: int = 1, headers: Mapping[str, str] | None = None, body: bytes = b"") -> None:
        """Answer the next ``times`` requests with ``status`` (and headers such as Retry-After)."""
        with self._lock:
            for _ in range(times):
                self._script.append(_Scripted(status, dict(headers or {}), body))

    def command(self, kind: str, reason: str = "") -> Command:
        """Queue a command: sent with every answer until a report acknowledges it."""
        cmd = Command(id=uuid.uuid4().hex[:16], kind=kind, reason=reason)  # type: ignore[arg-type]
        with self._lock:
            self._commands[cmd.id] = cmd
        return cmd

    @property
    def pending_commands(self) -> list[Command]:
        """Commands not acknowledged yet."""
        with self._lock:
            return list(self._commands.values())

    def wait_for(self, predicate: Callable[[ReportSink], bool], timeout: float = 10.0) -> bool:
        """Wait until ``predicate(sink)`` holds (checked whenever something arrives)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.1))
        return True

    def final(self) -> Report | None:
        """The last report that carries a final state (finished, failed or stopped)."""
        with self._lock:
            finals = [r for r in self.reports if r.state != "running"]
        return finals[-1] if finals else None

    def metric_values(self, name: str, field_name: str = "last") -> list[float]:
        """One aggregate (``last``, ``count``...) of a metric across all stored reports, in order."""
        with self._lock:
            return [getattr(m, field_name) for r in self.reports for m in r.metrics if m.name == name]

    # ------------------------------------------------------------------------------------ handling

    def _handle(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if self.delay:
            self._stopping.wait(self.delay)
        with self._lock:
            scripted = self._script.popleft() if self._script else None
        if scripted is not None:
            return scripted.status, scripted.headers, scripted.body
        if method != "POST":
            return 405, {}, _error(405, "MethodNotAllowed", "only POST is served here")
        parts = path.split("/")
        if len(parts) == 6 and path.startswith("/api/v1/namespaces/") and parts[5] == "jobs":
            return self._register(parts[4], body)
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            return 403, {}, _error(403, "Forbidden", "missing or wrong bearer token")
        try:
            data = decode_body(body)
            if path.startswith(_KUBEFLOW_PREFIX) and path.endswith("/status"):
                status = TrainerStatus.from_body(data)
                with self._changed:
                    self.statuses.append(status)
                    self._changed.notify_all()
                return 200, {}, encode_body(status.to_body())
            if path.startswith("/api/v1/namespaces/") and path.endswith(_REPORT_SUFFIX) and path.count("/") == 7:
                report = Report.from_dict(data)
                parts = path.split("/")  # /api/v1/namespaces/{ns}/jobs/{job}/reports
                return 200, {}, encode_body(self._store(f"{parts[4]}/{parts[6]}", report).to_dict())
        except BodyTooLarge as exc:
            return 413, {}, _error(413, "RequestEntityTooLarge", str(exc))
        except ProtocolError as exc:
            return 422, {}, _error(422, "Invalid", str(exc))
        return 404, {}, _error(404, "NotFound", f"no endpoint at {path}")

    def _register(self, namespace: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """A job registering itself gets the sink's token (or a fresh one when the sink needs none)."""
        try:
            data = decode_body(body)
            name = data["name"]
        except (ProtocolError, KeyError, TypeError):
            return 422, {}, _error(422, "Invalid", "a registration needs a JSON body with a name")
        with self._changed:
            self.registrations.append(f"{namespace}/{name}")
            self._changed.notify_all()
        token = self.token or uuid.uuid4().hex
        return 201, {}, encode_body({"job": {"namespace": namespace, "name": name}, "token": token})

    def _store(self, job: str, report: Report) -> ReportResponse:
        key = (report.run_id, report.identity.rank, report.seq)
        with self._changed:
            for ack in report.acks:
                self._commands.pop(ack, None)
            if key in self._seen:
                self.duplicates += 1
            else:
                self._seen.add(key)
                self.reports.append(report)
                self.by_job.setdefault(job, []).append(report)
            self._changed.notify_all()
            commands = tuple(self._commands.values())[: LIMITS.max_commands]
        return ReportResponse(accepted_seq=report.seq, commands=commands)

    def _record(self, received: Received) -> None:
        with self._changed:
            self.received.append(received)
            self._changed.notify_all()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the real server
            disable_nagle_algorithm = True  # headers and body go out in two writes: no delayed-ACK stall

            def setup(self) -> None:
                super().setup()
                with sink._lock:
                    sink._open.add(self.connection)

            def finish(self) -> None:
                with sink._lock:
                    sink._open.discard(self.connection)
                super().finish()

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(min(length, 4 * LIMITS.max_body_bytes)) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra, payload = sink._handle(self.command, self.path, headers, body)
                if sink._stopping.is_set():
                    self.close_connection = True
                    return
                sink._record(
                    Received(time.time(), self.command, self.path, headers, body, status, self.client_address[1])
                )
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            do_POST = _serve
            do_GET = _serve

            def log_message(self, format: str, *args: Any) -> None:
                return None

        return Handler


def _error(code: int, reason: str, message: str) -> bytes:
    """A Kubernetes-style ``Status`` error body, as upstream answers."""
    return encode_body(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code}
    )
