"""Live updates: an in-process broadcaster behind ``GET /api/v1/events`` (server-sent events).

Every change (a job's new state or progress, new metric points, events) is published once with a
growing id; each subscriber has a bounded queue (a slow reader loses its oldest updates and is told
so with a ``resync`` message, instead of holding memory); a reconnecting client sends
``Last-Event-ID`` and gets what it missed from a ring of recent updates.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Broadcaster", "Update"]

_log = logging.getLogger("stepwatch.server")


@dataclass(frozen=True)
class Update:
    """One message of the stream: ``kind`` is ``job``, ``points`` or ``event``."""

    id: int
    kind: str
    namespace: str
    name: str
    data: dict[str, Any]

    def sse(self) -> str:
        """The update as a server-sent event."""
        payload = json.dumps({"namespace": self.namespace, "name": self.name, **self.data}, separators=(",", ":"))
        return f"id: {self.id}\nevent: {self.kind}\ndata: {payload}\n\n"


class _Subscriber:
    def __init__(
        self, namespace: str | None, name: str | None, size: int, allowed: frozenset[str] | None = None
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.allowed = allowed
        self.queue: deque[Update] = deque(maxlen=size)
        self.lost = False
        self.ready = asyncio.Event()

    def wants(self, update: Update) -> bool:
        return (
            (self.namespace is None or update.namespace == self.namespace)
            and (self.name is None or update.name == self.name)
            and (self.allowed is None or update.namespace in self.allowed)
        )


class Broadcaster:
    """Publishes updates to every interested subscriber, without ever blocking the publisher."""

    def __init__(
        self, history: int = 2048, queue_size: int = 1024, heartbeat: float = 15.0, first_id: int | None = None
    ) -> None:
        # ids start at the boot time in microseconds (not at 1): a client resuming after a restart with
        # an id of the server's earlier life then holds an id below this life's first, and is told to
        # resync, even when this life has already published more updates than the earlier one had
        self.first_id = time.time_ns() // 1000 if first_id is None else first_id
        self._ids = itertools.count(self.first_id)
        self._recent: deque[Update] = deque(maxlen=history)
        self._subscribers: set[_Subscriber] = set()
        self._queue_size = queue_size
        self.heartbeat = heartbeat
        self.relays: list[Callable[[Update], None]] = []
        """Called with every update published here (not with those relayed from elsewhere): the
        bridge between replicas passes them on (``server.replicas``). A relay must not block."""
        self.watchers: list[Callable[[bool], None]] = []
        """Told when the first stream opens (``True``) and when the last one closes (``False``): the
        relay between the workers of one server sends a worker the others' updates only while it has
        streams (``server.siblings``)."""
        self.complete_from = self.first_id
        """The first id from which the ring of recent updates holds every update (raised by
        :meth:`resumed`): a client resuming from an earlier id is told to resync."""

    def publish(self, kind: str, namespace: str, name: str, data: dict[str, Any], *, relayed: bool = False) -> Update:
        """Send an update to the subscribers that want it (call from the event loop).

        ``relayed``: the update was published by another replica (it is not relayed again).
        """
        update = Update(next(self._ids), kind, namespace, name, data)
        if not relayed:
            for relay in self.relays:
                try:
                    relay(update)
                except Exception:
                    _log.exception("relaying a live update failed")
        self._recent.append(update)
        for sub in self._subscribers:
            if sub.wants(update):
                if len(sub.queue) == sub.queue.maxlen:
                    sub.lost = True
                sub.queue.append(update)
                sub.ready.set()
        return update

    def resumed(self) -> None:
        """Updates from elsewhere come in again after a time without them: the ring missed some."""
        self.complete_from = next(self._ids)  # one id skipped: the updates that were not relayed

    def mark_lost(self) -> None:
        """Tell every open stream to read the state again: updates it should have had were lost."""
        for sub in self._subscribers:
            sub.lost = True
            sub.ready.set()

    @property
    def subscribers(self) -> int:
        """How many streams are open."""
        return len(self._subscribers)

    async def stream(
        self,
        namespace: str | None = None,
        name: str | None = None,
        last_event_id: int | None = None,
        allowed: frozenset[str] | None = None,
    ) -> AsyncIterator[str]:
        """Server-sent events for one client: missed updates first, then live ones, with heartbeats.
        ``allowed``: only updates of these namespaces (what the client may read; ``None``: all)."""
        sub = _Subscriber(namespace, name, self._queue_size, allowed)
        self._subscribers.add(sub)
        if len(self._subscribers) == 1:
            self._tell_watchers(True)
        try:
            yield "retry: 2000\n\n"
            if last_event_id is not None:
                missed = [u for u in self._recent if u.id > last_event_id and sub.wants(u)]
                if last_event_id < self.first_id:  # an id of this server's earlier life
                    yield 'event: resync\ndata: {"reason":"the server restarted; read the state again"}\n\n'
                elif (self._recent and self._recent[0].id > last_event_id + 1) or last_event_id < self.complete_from:
                    yield 'event: resync\ndata: {"reason":"updates were missed; read the state again"}\n\n'
                for update in missed:
                    yield update.sse()
            while True:
                try:
                    await asyncio.wait_for(sub.ready.wait(), timeout=self.heartbeat)
                except asyncio.TimeoutError:
                    yield ": keep-alive\n\n"
                    continue
                sub.ready.clear()
                while sub.queue or sub.lost:
                    if sub.lost:  # said before any update that came after the gap
                        sub.lost = False
                        yield 'event: resync\ndata: {"reason":"this client was too slow; read the state again"}\n\n'
                        continue
                    yield sub.queue.popleft().sse()
        finally:
            self._subscribers.discard(sub)
            if not self._subscribers:
                self._tell_watchers(False)

    def _tell_watchers(self, streaming: bool) -> None:
        for watcher in self.watchers:
            try:
                watcher(streaming)
            except Exception:
                _log.exception("a watcher of the live streams failed")
