"""Bodies at the size limit, however the client writes them: answered, or closed without an answer?

A real stepwatch app served by uvicorn with the slow-client protocol (:mod:`stepwatch.server.serving.slow_clients`)
on 127.0.0.1, in this process. A job is registered; then, ``--tries`` times each, its Kubeflow status
endpoint gets a body of exactly 65,536 bytes (the limit, inside upstream's ``1 << 16``) written

- with its headers in one ``sendall`` (as urllib and http.client do for small requests: one packet
  train, so the server often reads head and body in one ``data_received``),
- in several writes (the head, then the body in three parts),
- with ``Transfer-Encoding: chunked``,

and a body of 1.1 MB in one write, which must be a 413. Each try is on a new connection; what counts
is whether an HTTP answer came back (its status), or the connection closed without one.

``--baseline FILE`` runs the same tries, in the same run, against the protocol of another copy of
``slow_clients.py`` (the code before a change: ``git show main:src/stepwatch/server/serving/slow_clients.py >
/tmp/old.py``)::

    .venv/bin/python benchmarks/big_bodies.py --baseline /tmp/old.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import uvicorn  # noqa: E402

from stepwatch.server import ServerSettings, create_app  # noqa: E402

LIMIT = 65_536
WAYS = ("one write", "several writes", "chunked", "1.1 MB, one write")


def protocol_from(path: str | None) -> Any:
    """``protocol_class`` of this tree's slow_clients, or of the copy at ``path``."""
    if path is None:
        from stepwatch.server.serving.slow_clients import protocol_class
    else:
        spec = importlib.util.spec_from_file_location("slow_clients_baseline", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        protocol_class = module.protocol_class
    return protocol_class(10.0)


class Served:
    """The app under uvicorn with ``protocol`` in a daemon thread, on a free loopback port."""

    def __init__(self, db: str, protocol: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(create_app(ServerSettings(db=db)), http=protocol, log_config=None, log_level="critical")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


def exchange(port: int, parts: list[bytes], timeout: float = 10.0) -> int | None:
    """Send ``parts`` (one ``sendall`` each) on a new connection; the answer's status, or None when the
    connection closed (or was reset) without one."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for part in parts:
                sock.sendall(part)
        except OSError:
            pass  # reset while sending: an answer may still be waiting to be read
        answer = b""
        try:
            while b"\r\n" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except OSError:
            pass
    if not answer.startswith(b"HTTP/1.1 "):
        return None
    return int(answer[9:12])


def register(port: int) -> str:
    """A job ``big`` in ``default``; its write token."""
    body = json.dumps({"name": "big"}).encode()
    head = (
        f"POST /api/v1/namespaces/default/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    token: str = json.loads(answer.split(b"\r\n\r\n", 1)[1])["token"]
    return token


def status_body(size: int) -> bytes:
    """A valid Kubeflow status of exactly ``size`` bytes (JSON padded with spaces)."""
    core = json.dumps(
        {
            "trainerStatus": {
                "progressPercentage": 50,
                "estimatedRemainingSeconds": 60,
                "metrics": [{"name": "loss", "value": "0.5"}],
                "lastUpdatedTime": "2026-01-01T00:00:00Z",
            }
        }
    ).encode()
    return core[:-1] + b" " * (size - len(core)) + b"}"


def requests_for(token: str) -> dict[str, Callable[[], list[bytes]]]:
    """Each way of writing, as the parts a client sends."""
    path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/big/status"
    start = f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n"
    body = status_body(LIMIT)
    big = status_body(1_100_000)

    def head(length: int) -> bytes:
        return (start + f"Content-Length: {length}\r\nConnection: close\r\n\r\n").encode()

    def chunked() -> list[bytes]:
        out = [(start + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()]
        for i in range(0, len(body), 20_000):
            piece = body[i : i + 20_000]
            out.append(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        out.append(b"0\r\n\r\n")
        return out

    third = len(body) // 3
    return {
        "one write": lambda: [head(len(body)) + body],
        "several writes": lambda: [head(len(body)), body[:third], body[third : 2 * third], body[2 * third :]],
        "chunked": chunked,
        "1.1 MB, one write": lambda: [head(len(big)) + big],
    }


def run(protocol: Any, tries: int) -> dict[str, dict[str, int]]:
    """Per way of writing: how many tries got each answer (``closed``: none)."""
    with tempfile.TemporaryDirectory() as tmp:
        served = Served(str(Path(tmp) / "sw.db"), protocol)
        try:
            ways = requests_for(register(served.port))
            counts: dict[str, dict[str, int]] = {way: {} for way in WAYS}
            for _ in range(tries):
                for way in WAYS:
                    status = exchange(served.port, ways[way]())
                    key = "closed" if status is None else str(status)
                    counts[way][key] = counts[way].get(key, 0) + 1
            return counts
        finally:
            served.stop()


def main() -> None:
    """Run the tries and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--baseline", help="another slow_clients.py to compare with (the code before a change)")
    args = parser.parse_args()
    runs = {"this tree": run(protocol_from(None), args.tries)}
    if args.baseline:
        runs["baseline"] = run(protocol_from(args.baseline), args.tries)
    print(f"| way ({args.tries} tries each) | " + " | ".join(runs) + " |")
    print("|---" * (len(runs) + 1) + "|")
    for way in WAYS:
        cells = [", ".join(f"{k}: {v}" for k, v in sorted(counts[way].items())) for counts in runs.values()]
        print(f"| {way} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
