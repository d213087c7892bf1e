"""Slow and idle clients against a real ``stepwatch server`` (a subprocess on 127.0.0.1): a client that
trickles its headers or its body, or connects and sends nothing, is cut off after a bounded time, and
plain clients are served meanwhile. The bounds are the server's settings, shortened here through the
environment (STEPWATCH_HEAD_TIMEOUT_S, STEPWATCH_BODY_TIMEOUT_S) so that the tests take seconds."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from stepwatch.testing import wait_for

pytest.importorskip("uvicorn")

HEAD_S = 1.5
BODY_S = 2.0
SLACK_S = 1.5
"""How late after its bound a cut may come on a busy machine (the bound is a timer; the cut is immediate)."""


class Server:
    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("slow")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "STEPWATCH_HEAD_TIMEOUT_S": str(HEAD_S), "STEPWATCH_BODY_TIMEOUT_S": str(BODY_S)}
    log = tmp / "server.log"
    with open(log, "wb") as out:
        command = [sys.executable, "-m", "stepwatch", "server", "--port", str(port), "--db", str(tmp / "sw.db")]
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    the_server = Server(port)
    try:
        wait_for(lambda: process.poll() is not None or _answers(the_server.url), 30, "the server to answer")
        assert process.poll() is None, log.read_text()
        yield the_server
    finally:
        process.terminate()
        process.wait(10)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def closed(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (what it sent before is read and dropped)."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if not sock.recv(65536):
                return True
        except ConnectionError:
            return True
    return False


def trickle(sock: socket.socket, data: bytes, every_s: float, limit_s: float) -> float | None:
    """Send ``data`` a byte every ``every_s``; the seconds until the server cut the connection, or None."""
    started = time.monotonic()
    for i in range(len(data)):
        if closed(sock):
            return time.monotonic() - started
        try:
            sock.sendall(data[i : i + 1])
        except OSError:  # reset by the server
            return time.monotonic() - started
        if time.monotonic() - started > limit_s:
            return None
        time.sleep(every_s)
    return None


def served_quickly(url: str, rounds: int = 5) -> float:
    """The slowest of a few plain requests, each on a new connection: under ``HEAD_S`` when slow clients do not
    hold the server up (a server they held would answer once they are cut, after ``HEAD_S``)."""
    slowest = 0.0
    for _ in range(rounds):
        started = time.monotonic()
        assert httpx.get(f"{url}/api/v1/jobs", timeout=5).status_code == 200
        slowest = max(slowest, time.monotonic() - started)
    return slowest


def test_headers_sent_a_byte_at_a_time_are_cut_off_and_others_are_served(server: Server) -> None:
    head = b"GET /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 10_000
    sock = server.connect()
    cut: list[float | None] = []
    slowloris = threading.Thread(target=lambda: cut.append(trickle(sock, head, 0.05, HEAD_S + 10)))
    slowloris.start()
    assert served_quickly(server.url) < HEAD_S
    slowloris.join(30)
    sock.close()
    assert cut[0] is not None and cut[0] < HEAD_S + SLACK_S, cut


def test_a_connection_that_sends_nothing_is_closed(server: Server) -> None:
    sock = server.connect()
    started = time.monotonic()
    assert sock.recv(1) == b""  # blocks until the server closes it
    assert time.monotonic() - started < HEAD_S + SLACK_S
    sock.close()


def answer_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it ends the connection (a reset after the answer ends it too)."""
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionError:
        pass
    return answer


def test_headers_over_64_kib_are_a_431_and_the_connection_ends(server: Server) -> None:
    sock = server.connect()
    head = b"GET /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Big: a\r\n" * 200_000
    started = time.monotonic()
    with contextlib.suppress(OSError):  # the server may stop reading (and reset) before all 2 MB went
        sock.sendall(head)
    answer = answer_of(sock)
    assert time.monotonic() - started < HEAD_S  # not the head timeout: at once
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert error["kind"] == "Status" and error["code"] == 431 and "over 65536 bytes" in error["message"]
    assert served_quickly(server.url) < HEAD_S


@pytest.fixture(scope="module")
def status_token(server: Server) -> str:
    """The write token of a job ``limits``, for its Kubeflow status endpoint."""
    created = httpx.post(f"{server.url}/api/v1/namespaces/default/jobs", json={"name": "limits"}, timeout=10)
    assert created.status_code == 201, created.text
    token: str = created.json()["token"]
    return token


def padded_status(size: int) -> bytes:
    """A Kubeflow status body of exactly ``size`` bytes (spaces before its closing brace)."""
    status = {"trainerStatus": {"progressPercentage": 7, "lastUpdatedTime": "2026-01-01T00:00:00Z"}}
    text = json.dumps(status).encode()
    return text[:-1] + b" " * (size - len(text)) + b"}"


def post_status(server: Server, token: str, parts: list[bytes]) -> bytes:
    """Send a status request as ``parts`` (one ``sendall`` each) on a new connection; the whole answer."""
    sock = server.connect()
    with contextlib.suppress(OSError):
        for part in parts:
            sock.sendall(part)
    answer = answer_of(sock)
    sock.close()
    return answer


def status_head(token: str, framing: str) -> bytes:
    return (
        "POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/limits/status HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n{framing}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()


def chunked(body: bytes, size: int) -> list[bytes]:
    pieces = [
        f"{len(body[i : i + size]):x}\r\n".encode() + body[i : i + size] + b"\r\n" for i in range(0, len(body), size)
    ]
    return [*pieces, b"0\r\n\r\n"]


@pytest.mark.parametrize("way", ["one write", "head then three writes", "chunked"])
def test_a_body_of_64_kib_is_answered_however_it_is_written(server: Server, status_token: str, way: str) -> None:
    """Issue 18: the head guard counted body bytes read with the head, and closed such a connection
    unanswered (urllib writes head and body at once). Five tries each: it was lost most of the time."""
    body = padded_status(65_536)
    length = status_head(status_token, f"Content-Length: {len(body)}")
    third = len(body) // 3
    parts = {
        "one write": [length + body],
        "head then three writes": [length, body[:third], body[third : 2 * third], body[2 * third :]],
        "chunked": [status_head(status_token, "Transfer-Encoding: chunked"), *chunked(body, 20_000)],
    }[way]
    for _ in range(5):
        answer = post_status(server, status_token, parts)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["trainerStatus"]["progressPercentage"] == 7


@pytest.mark.parametrize("way", ["declared", "chunked"])
def test_a_body_over_64_kib_is_a_413_status_not_a_reset(server: Server, status_token: str, way: str) -> None:
    """1.1 MB in one write: the 413 is sent before the body is read; the rest is read and dropped
    (not left unread, which would reset the connection and lose the answer)."""
    body = padded_status(1_100_000)
    if way == "declared":
        parts = [status_head(status_token, f"Content-Length: {len(body)}") + body]
    else:
        parts = [b"".join([status_head(status_token, "Transfer-Encoding: chunked"), *chunked(body, 60_000)])]
    for _ in range(5):
        answer = post_status(server, status_token, parts)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
        error = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert error["kind"] == "Status" and error["code"] == 413 and error["reason"] == "RequestEntityTooLarge"


def test_a_body_sent_a_byte_at_a_time_is_a_408_and_the_connection_is_closed(server: Server) -> None:
    """The body's bound is on the whole body, not on the pause between two bytes: a client that sends a byte
    every 50 ms, for five times the bound, is cut while it is still sending (a bound on pauses, which each
    byte would start again, never would cut it), and not before the bound. No time is measured but that
    lower bound (a timer never fires early)."""
    every_s = 0.05
    body = json.dumps({"name": "slow-body"}).encode().ljust(int(5 * BODY_S / every_s))  # 10 s of bytes
    sock = server.connect()
    started = time.monotonic()  # before the server can have read the head: its bound cannot be over sooner
    sock.sendall(
        b"POST /api/v1/namespaces/default/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body) + 1}\r\n\r\n".encode()  # one byte more than ever comes
    )
    answer = b""
    sent = 0
    while sent < len(body) and not select.select([sock], [], [], 0)[0]:
        try:
            sock.sendall(body[sent : sent + 1])
        except OSError:  # cut
            break
        sent += 1
        time.sleep(every_s)
    elapsed = time.monotonic() - started
    sock.settimeout(10)
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            answer += chunk
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert sent < len(body), "the client sent its whole trickle: the server did not cut it while it was sending"
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert error["kind"] == "Status" and error["code"] == 408 and "did not arrive within 2 s" in error["message"]
    assert elapsed >= BODY_S, elapsed
    assert httpx.get(f"{server.url}/api/v1/namespaces/default/jobs/slow-body").status_code == 404


def test_a_body_nobody_reads_does_not_hold_the_connection(server: Server) -> None:
    """A route that answers without reading the body (here: no such job) closes the connection, rather
    than keep it alive while the client trickles a body of a terabyte."""
    sock = server.connect()
    sock.sendall(
        b"POST /api/v1/namespaces/default/jobs/none/reports HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Length: 1000000000000\r\n\r\n{"
    )
    cut = trickle(sock, b"a" * 1000, 0.05, HEAD_S + BODY_S + 10)
    sock.close()
    assert cut is not None and cut < BODY_S / 2, cut  # at once, not when the body's bound is over


def test_many_idle_and_slow_connections_do_not_exhaust_it(server: Server) -> None:
    idle = [server.connect() for _ in range(400)]
    slow = [server.connect() for _ in range(40)]
    for sock in slow:
        sock.sendall(b"GET /api/v1/jobs HTTP/1.1\r\n")
    try:
        assert served_quickly(server.url, rounds=10) < HEAD_S
        with httpx.Client(base_url=server.url, timeout=5) as client:  # a kept-alive client too
            for _ in range(10):
                assert client.get("/api/v1/jobs").status_code == 200
        wait_for(lambda: all(closed(s) for s in idle + slow), HEAD_S + SLACK_S + 2, "every idle and slow one cut")
        assert served_quickly(server.url) < HEAD_S
    finally:
        for sock in idle + slow:
            sock.close()
