"""An in-memory transport: the sender's requests are recorded and answered by a script."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .._transport import Response, TransportError

__all__ = ["MemoryTransport"]


@dataclass(frozen=True)
class Request:
    """One request the sender made."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes


class MemoryTransport:
    """Records requests; answers each with the next scripted answer, else ``default``.

    An answer is a :class:`~stepwatch._transport.Response`, an exception instance (raised, e.g. a
    ``TransportError`` for "connection refused"), or a callable taking the request.
    """

    def __init__(self, default: Response | None = None) -> None:
        self.requests: list[Request] = []
        self.default = default or Response(200, {}, b"")
        self._script: deque[Response | BaseException | Callable[[Request], Response]] = deque()
        self._lock = threading.Lock()
        self.closed = False

    def script(self, *answers: Response | BaseException | Callable[[Request], Response]) -> None:
        """Queue answers for the next requests, in order."""
        with self._lock:
            self._script.extend(answers)

    def refuse(self, times: int = 1) -> None:
        """The next ``times`` requests fail as if the connection were refused."""
        self.script(*[TransportError("connection refused (scripted)") for _ in range(times)])

    def request(self, method: str, url: str, *, headers: Mapping[str, str], body: bytes, timeout: float) -> Response:
        """Record the request and give the next answer."""
        request = Request(method, url, dict(headers), body)
        with self._lock:
            self.requests.append(request)
            answer = self._script.popleft() if self._script else self.default
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(request)
        return answer

    def close(self) -> None:
        """Nothing to release."""
        self.closed = True
