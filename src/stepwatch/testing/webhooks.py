"""A webhook receiver on 127.0.0.1 for tests of notifications: it records every POST and answers from a script.

::

    from stepwatch.testing import WebhookReceiver, WebhookReply

    with WebhookReceiver() as hooks:
        hooks.script.append(WebhookReply(status=500))   # the first delivery fails, the retry gets 200
        ...  # point STEPWATCH_NOTIFY at hooks.url()
        (first, second) = hooks.wait_for(2)
        assert second.json()["kind"] == "action"
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["WebhookReceived", "WebhookReceiver", "WebhookReply"]


@dataclass
class WebhookReceived:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WebhookReply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None  # answer only once this is set (or after 10 s)
    delay_s: float = 0.0


class WebhookReceiver:
    """A receiver on 127.0.0.1: answers each POST with the next scripted :class:`WebhookReply` (200 when none)."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[WebhookReceived] = []
        self.script: deque[WebhookReply] = deque()
        self.default = WebhookReply()
        self._arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._arrived:
                    receiver.requests.append(
                        WebhookReceived(
                            self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic()
                        )
                    )
                    reply = receiver.script.popleft() if receiver.script else receiver.default
                    receiver._arrived.notify_all()
                if reply.hold is not None:
                    reply.hold.wait(10)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_for(self, count: int, timeout: float = 5.0) -> list[WebhookReceived]:
        with self._arrived:
            self._arrived.wait_for(lambda: len(self.requests) >= count, timeout)
            return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
