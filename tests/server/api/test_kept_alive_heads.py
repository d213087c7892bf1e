"""The bound on a request's head (``server/serving/slow_clients.py``) on kept-alive connections, where its
timer is armed lazily (one per connection, not one per request): a connection that keeps sending requests
for many times the bound is never cut, and a later request whose head trickles is cut when its own bound
ends, not sooner and not much later. uvicorn with the bounded protocol, in a thread, on a loopback socket.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("httptools")

from stepwatch.server.serving import protocol_class  # noqa: E402

HEAD_S = 0.6
SLACK_S = 1.0
"""How late after its bound a cut may come on a busy machine."""


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_config=None, log_level="warning", http=protocol_class(HEAD_S), lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)
    sock.close()


REQUEST = b"POST /r HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}"


def exchange(sock: socket.socket) -> bytes:
    sock.sendall(REQUEST)
    answer = b""
    while not answer.endswith(b"ok"):
        chunk = sock.recv(4096)
        assert chunk, "the server closed a connection that was sending whole requests"
        answer += chunk
    return answer


def test_a_connection_sending_requests_for_many_bounds_is_never_cut(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        served = 0
        while time.monotonic() - started < 4 * HEAD_S:
            assert exchange(sock).startswith(b"HTTP/1.1 200")
            served += 1
            time.sleep(HEAD_S / 7)  # requests at uneven times against the timer's own
        assert served >= 10


@pytest.mark.parametrize("served_first", [1, 5])
def test_a_later_head_that_trickles_is_cut_when_its_own_bound_ends(port: int, served_first: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(served_first):
            exchange(sock)
            time.sleep(HEAD_S / 3)  # the timer armed by an earlier head is due before this head's bound
        began = time.monotonic()
        sock.sendall(b"POST /r HTTP/1.1\r\n")
        cut_at = None
        for _ in range(int((HEAD_S + SLACK_S + 2) / 0.05)):
            try:
                sock.sendall(b"X")  # one byte of a header every 50 ms: the head never ends
                if sock.recv(1, socket.MSG_DONTWAIT) == b"":
                    cut_at = time.monotonic()
                    break
            except BlockingIOError:
                pass
            except OSError:
                cut_at = time.monotonic()
                break
            time.sleep(0.05)
        assert cut_at is not None, "a trickling head was never cut"
        assert HEAD_S - 0.05 <= cut_at - began <= HEAD_S + SLACK_S, cut_at - began
