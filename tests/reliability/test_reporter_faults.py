"""Fault injection on the reporter side: a real misbehaving HTTP server in front of the report core.

The server (below) plays a stepwatch server that can be slow, go away and come back, reset
connections, or answer garbage: non-JSON, an HTML 502, a truncated body, the wrong content type, JSON of
the wrong shape, 500s, 429 with Retry-After. Against each, a real ``stepwatch.init`` run logs steps:

- the training loop never raises and ``step()`` never blocks (slowest call bounded);
- ``finish()`` returns within its flush timeout even when the server hangs;
- memory stays bounded through a long outage;
- once the server is healthy again the data arrives: the windows the server accepted (each report
  stored once by ``(run_id, rank, seq)``, as the real server does) add up to exactly the values logged
  (count, min, max, last).
"""

from __future__ import annotations

import gc
import math
import socket
import threading
import time
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import stepwatch
from stepwatch.protocol import MetricWindow, ProtocolError, Report, ReportResponse, decode_body, encode_body

pytestmark = pytest.mark.reliability

STEP_BOUND_S = 0.25
"""Slowest ``step()`` allowed (generous: CI machines are shared; a blocked call would take seconds)."""


class Flaky:
    """A loopback HTTP server whose answers follow ``mode``; it records every report it accepted."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.accepted: dict[tuple[str, int, int], Report] = {}
        self.requests = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._port = 0
        self._open: set[socket.socket] = set()
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", self._port), self._handler())
        server.daemon_threads = True
        self._port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(self) -> None:
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

    def accept(self, body: bytes) -> bytes:
        """Store the report (once per run, rank and seq) and return the real answer."""
        report = Report.from_dict(decode_body(body))
        with self._lock:
            self.accepted.setdefault((report.run_id, report.identity.rank, report.seq), report)
        return encode_body(ReportResponse(report.seq).to_dict())

    def windows(self, name: str) -> list[MetricWindow]:
        with self._lock:
            return [w for _, r in sorted(self.accepted.items()) for w in r.metrics if w.name == name]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        flaky = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with flaky._lock:
                    flaky._open.add(self.connection)

            def finish(self) -> None:
                with flaky._lock:
                    flaky._open.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def answer(self, status: int, body: bytes, ctype: str = "application/json", **headers: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k.replace("_", "-"), v)
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                flaky.requests += 1
                mode = flaky.mode
                if not self.path.endswith("/reports"):  # registration: hand out a token
                    self.answer(201, encode_body({"job": {}, "token": "t" * 40}))
                    return
                if mode == "ok":
                    self.answer(200, flaky.accept(body))
                elif mode == "slow":  # longer than the request timeout, then a real answer
                    flaky.release.wait(1.5)
                    self.answer(200, flaky.accept(body))
                elif mode == "hang":
                    flaky.release.wait(30)
                    self.close_connection = True
                elif mode == "reset":
                    self.close_connection = True
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                elif mode == "html502":
                    self.answer(502, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")
                elif mode == "500":
                    self.answer(500, b'{"kind":"Status","code":500,"message":"boom"}')
                elif mode == "429":
                    self.answer(429, b'{"message":"slow down"}', Retry_After="1")
                elif mode == "garbage200":  # the report arrived; the answer is unreadable
                    flaky.accept(body)
                    self.answer(200, b"\x00\xff<<not json", "application/octet-stream")
                elif mode == "wrongshape200":
                    flaky.accept(body)
                    self.answer(200, b'[1, "two", {"commands": 3}]', "text/plain")
                elif mode == "truncated":  # stored, then the answer promises more than it sends and hangs up
                    flaky.accept(body)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "500")
                    self.end_headers()
                    self.wfile.write(b'{"accepted_seq": ')
                    self.close_connection = True
                else:
                    raise AssertionError(mode)

        return Handler


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> Iterator[Flaky]:
    monkeypatch.setenv("STEPWATCH_REQUEST_TIMEOUT", "0.5")
    server = Flaky()
    server.start()
    yield server
    server.release.set()
    server.stop()


class Loop:
    """A training loop that logs a known series and times every ``step()``."""

    def __init__(self, run: stepwatch.Run) -> None:
        self.run = run
        self.values: list[float] = []
        self.slowest = 0.0

    def steps(self, n: int, pause: float = 0.0) -> None:
        for _ in range(n):
            i = len(self.values)
            value = math.nan if i % 97 == 13 else math.sin(i) * 10 + i / 100
            self.values.append(value)
            t0 = time.perf_counter()
            self.run.step(loss=value)
            self.slowest = max(self.slowest, time.perf_counter() - t0)
            if pause:
                time.sleep(pause)

    def for_seconds(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.steps(20, pause=0.001)


def assert_arrived(server: Flaky, values: list[float]) -> None:
    """The accepted windows add up to exactly the values logged."""
    windows = server.windows("loss")
    assert windows, "nothing arrived"
    count = sum(w.count for w in windows)
    assert count == len(values), (count, len(values))
    finite = [v for v in values if math.isfinite(v)]
    assert sum(w.nonfinite for w in windows) == len(values) - len(finite)
    assert min(w.min for w in windows if w.min is not None) == min(finite)
    assert max(w.max for w in windows if w.max is not None) == max(finite)
    last = windows[-1].last
    assert last == values[-1] or (math.isnan(last) and math.isnan(values[-1]))
    steps = sorted((w.first_step, w.last_step) for w in windows)
    assert steps[0][0] == 1 and steps[-1][1] == len(values)


FAULTS = ["slow", "reset", "html502", "500", "429", "garbage200", "wrongshape200", "truncated", "refused"]


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_then_recovery_loses_nothing(flaky: Flaky, fault: str) -> None:
    run = stepwatch.init(job="faulty", url=flaky.url, token="t" * 40, interval=0.05, flush_timeout=10)
    loop = Loop(run)
    loop.for_seconds(0.3)  # healthy: the job appears
    if fault == "refused":
        flaky.stop()  # connection refused
    else:
        flaky.mode = fault
    loop.for_seconds(1.2)
    if fault == "refused":
        flaky.start()  # back on the same port
    flaky.mode = "ok"
    flaky.release.set()
    loop.for_seconds(0.3)
    assert run.finish() is True
    assert loop.slowest < STEP_BOUND_S, f"step() blocked for {loop.slowest:.3f} s"
    assert_arrived(flaky, loop.values)


def test_flapping_server_loses_nothing(flaky: Flaky) -> None:
    """Down, up, down, up...: every cycle some requests are refused, the data still all arrives."""
    run = stepwatch.init(job="flapping", url=flaky.url, token="t" * 40, interval=0.05, flush_timeout=15)
    loop = Loop(run)
    for _ in range(3):
        loop.for_seconds(0.4)
        flaky.stop()
        loop.for_seconds(0.4)
        flaky.start()
    loop.for_seconds(0.3)
    assert run.finish() is True
    assert loop.slowest < STEP_BOUND_S
    assert_arrived(flaky, loop.values)


def test_finish_is_bounded_when_the_server_hangs(flaky: Flaky) -> None:
    run = stepwatch.init(job="hung", url=flaky.url, token="t" * 40, interval=0.05, flush_timeout=1.0)
    loop = Loop(run)
    loop.for_seconds(0.2)
    flaky.mode = "hang"
    loop.for_seconds(0.5)
    t0 = time.monotonic()
    delivered = run.finish()
    took = time.monotonic() - t0
    assert delivered is False
    # finish() waits its flush timeout and 0.5 s at most: twice that on a busy machine, never the hang itself
    assert took < 2 * (1.0 + 0.5), f"finish() took {took:.2f} s with a 1 s flush timeout"
    assert loop.slowest < STEP_BOUND_S


def test_memory_is_bounded_through_a_long_outage(flaky: Flaky) -> None:
    """Many steps of many metrics while nothing can be sent: older windows merge, nothing piles up."""
    flaky.stop()
    run = stepwatch.init(job="outage", url=flaky.url, token="t" * 40, interval=0.02, flush_timeout=0.5)
    names = [f"metric/{i}" for i in range(32)]

    def burst(n: int) -> None:
        for i in range(n):
            run.step(**{name: float(i) for name in names})
        time.sleep(0.1)  # let the sender close and merge windows

    burst(2_000)  # warm: every metric's series and the pending report exist
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(10):
            burst(2_000)
        gc.collect()
        time.sleep(0.2)
        after, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    run.finish()
    # 20,000 steps x 32 metrics went through; what stays is a few windows per metric
    assert after - before < 1 << 20, f"grew by {(after - before) / 1024:.0f} KiB"
    assert peak - before < 16 << 20


def test_a_garbage_answer_is_never_raised_into_the_loop(flaky: Flaky) -> None:
    """Every kind of garbage in turn, fast: the loop goes on, and nothing escapes as an exception."""
    run = stepwatch.init(job="garbage", url=flaky.url, token="t" * 40, interval=0.02, flush_timeout=5)
    loop = Loop(run)
    for mode in ("garbage200", "wrongshape200", "truncated", "html502", "reset", "ok"):
        flaky.mode = mode
        loop.for_seconds(0.15)
    assert run.finish() is True
    assert_arrived(flaky, loop.values)
    try:
        Report.from_dict(decode_body(b"\x00\xff<<not json"))
    except ProtocolError:
        pass
