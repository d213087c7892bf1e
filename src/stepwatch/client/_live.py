"""The live stream without I/O: server-sent events decoded into typed updates, resumed after a drop.

:class:`WatchSession` is what both clients' ``watch()`` run: it says which request opens the stream
(with ``Last-Event-ID`` after the first connection), turns each server-sent event into an
:class:`Update`, and decides how long to wait before reconnecting. Guarantees, per server:

- **no duplicates**: an update is handed out once, even when the server replays after a reconnection;
- **no silent gap**: the server replays what the client missed from its ring of recent updates, and
  says ``resync`` when it cannot (the ring moved on, or this client read too slowly); a server that
  restarted (its ids start again) is noticed too. Each becomes a :class:`Resync`: read the state again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ._core import Request
from ._errors import InvalidResponse, ServerUnreachable, StepwatchError
from ._job import Job
from ._models import Event, MetricPoint
from ._parse import as_dict, opt_float, opt_int, sub

__all__ = [
    "EventUpdate",
    "JobUpdate",
    "PointsUpdate",
    "Resync",
    "SSEDecoder",
    "ServerSent",
    "Update",
    "WatchSession",
]


@dataclass(frozen=True)
class ServerSent:
    """One server-sent event as it came: its type, data and id (``heartbeat`` for a comment line)."""

    kind: str
    data: str = ""
    id: str | None = None


class SSEDecoder:
    """Lines of a ``text/event-stream`` in, :class:`ServerSent` events out (the HTML standard's rules)."""

    def __init__(self) -> None:
        self._kind = ""
        self._data: list[str] = []
        self._id: str | None = None

    def line(self, line: str) -> ServerSent | None:
        """Feed one line (without its end); an event when the line ended one."""
        if not line:
            if not self._data:
                self._kind, self._id = "", None
                return None
            event = ServerSent(self._kind or "message", "\n".join(self._data), self._id)
            self._kind, self._data, self._id = "", [], None
            return event
        if line.startswith(":"):
            return ServerSent("heartbeat")
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._kind = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


@dataclass(frozen=True)
class Update:
    """One live update of a job: ``id`` is the server's event id (``None`` for a :class:`Resync`)."""

    id: int | None
    namespace: str
    name: str


@dataclass(frozen=True)
class JobUpdate(Update):
    """The job changed (progress, state, health, cost): ``job`` is its whole view as of now."""

    job: Job = field(compare=False, default=None)  # type: ignore[assignment]


@dataclass(frozen=True)
class PointsUpdate(Update):
    """New metric points: ``points["loss"]`` is the window just stored, as the job's history reads it back
    (``t``, ``last``, ``min``, ``max``...); ``t`` is when the windows were stored."""

    attempt: int = 1
    t: float | None = None
    points: Mapping[str, MetricPoint] = field(default_factory=dict)


@dataclass(frozen=True)
class EventUpdate(Update):
    """Something happened: a command, a health change, a policy action, the job ended."""

    event: Event = field(default=None)  # type: ignore[assignment]

    @property
    def kind(self) -> str:
        """The event's kind (``command``, ``health``, ``policy``, ``finished``...)."""
        return self.event.kind


@dataclass(frozen=True)
class Resync(Update):
    """Updates may have been missed (the server said so, or restarted): read the state again."""

    reason: str = ""


def parse_update(sent: ServerSent) -> Update | None:
    """The typed update of a server-sent event (``None`` for kinds this client does not know)."""
    if sent.kind == "heartbeat":
        return None
    try:
        data = json.loads(sent.data) if sent.data else {}
    except ValueError:
        raise InvalidResponse(f"the live stream sent an event whose data is not JSON: {sent.data[:80]!r}") from None
    obj = as_dict(data, f"live {sent.kind} event")
    if sent.kind == "resync":
        return Resync(None, str(obj.get("namespace") or ""), str(obj.get("name") or ""), str(obj.get("reason") or ""))
    update_id = _event_id(sent.id)
    namespace, name = str(obj.get("namespace", "")), str(obj.get("name", ""))
    if sent.kind == "job":
        return JobUpdate(update_id, namespace, name, Job(obj.get("job"), "live job event.job"))
    if sent.kind == "points":
        where = "live points event"
        found = sub(obj, "points", where).items()
        points = {metric: MetricPoint.from_dict(p, f"{where}.points.{metric}") for metric, p in found}
        return PointsUpdate(
            update_id, namespace, name, opt_int(obj, "attempt", where) or 1, opt_float(obj, "t", where), points
        )
    if sent.kind == "event":
        return EventUpdate(update_id, namespace, name, Event.from_dict(obj, "live event"))
    return None


def _event_id(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidResponse(f"the live stream sent an event id that is not an integer: {raw[:40]!r}") from None


class WatchSession:
    """One ``watch()``: the request to (re)open the stream, updates in order and once, backoff between tries.

    ``last_event_id`` resumes where an earlier watch stopped (``Update.id``). ``deadline`` (a
    ``time.monotonic()`` value) ends the watch quietly; ``reconnect=False`` raises
    :class:`ServerUnreachable` at the first drop instead of coming back.
    """

    read_timeout = 45.0
    """Seconds of silence after which the connection is given up (the server sends a comment every 15 s)."""
    first_delay = 0.25
    max_delay = 10.0

    def __init__(
        self,
        name: str | None = None,
        namespace: str | None = None,
        *,
        last_event_id: int | None = None,
        reconnect: bool = True,
        deadline: float | None = None,
        announce: bool = False,
    ) -> None:
        self.name = name
        self.announce = announce
        self.namespace = namespace
        self.last_id = last_event_id
        self.reconnect = reconnect
        self.deadline = deadline
        self.connections = 0
        self._delay = self.first_delay
        self._decoder = SSEDecoder()

    def request(self) -> Request:
        """The request that opens the stream now."""
        params = {k: v for k, v in (("job", self.name), ("namespace", self.namespace)) if v}
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = str(self.last_id)
        return Request("GET", "/api/v1/events", params=params, headers=headers, timeout=self.read_timeout_now())

    def read_timeout_now(self) -> float:
        """How long a read may wait: the silence limit, or less when the deadline is nearer."""
        left = self.time_left()
        return self.read_timeout if left is None else max(min(self.read_timeout, left), 0.01)

    def time_left(self) -> float | None:
        """Seconds to the deadline (``None``: none)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        left = self.time_left()
        return left is not None and left <= 0

    def opened(self) -> list[Update]:
        """The stream answered 200: a new connection (a partial event of the last one is dropped).

        With ``announce`` (what ``wait()`` uses) each connection is a :class:`Resync`: the caller reads
        the state once the stream is open, so nothing that happens from then on can be missed.
        """
        self.connections += 1
        self._decoder = SSEDecoder()
        if self.announce:
            return [Resync(None, self.namespace or "", self.name or "", "connected")]
        return []

    def line(self, line: str) -> list[Update]:
        """One line of the stream: the updates it completes, in order, each once."""
        sent = self._decoder.line(line)
        if sent is None:
            return []
        self._delay = self.first_delay  # the server speaks: the next drop starts the backoff over
        update = parse_update(sent)
        if update is None:
            return []
        if update.id is None:
            return [update]
        if self.last_id is not None and update.id <= self.last_id:
            # a server never sends an id at or below Last-Event-ID (nor twice): its ids started again, so it restarted
            self.last_id = update.id
            return [Resync(None, update.namespace, update.name, "the server restarted; read the state again"), update]
        self.last_id = update.id
        return [update]

    def dropped(self, error: StepwatchError) -> float:
        """The connection ended or failed: seconds to wait before reconnecting (or ``error`` raised)."""
        if not self.reconnect or isinstance(error, InvalidResponse):
            raise error
        if not isinstance(error, ServerUnreachable) and getattr(error, "status", 0) not in (429, 502, 503, 504):
            raise error  # 4xx: asking again will not help
        delay = self._delay
        self._delay = min(self._delay * 2, self.max_delay)
        left = self.time_left()
        return delay if left is None else max(min(delay, left), 0.0)
