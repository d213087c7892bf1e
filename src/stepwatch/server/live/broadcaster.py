"""Live updates: an in-process broadcaster behind ``GET /api/v1/events`` (server-sent events).

Every change (a job's new state or progress, new metric points, events) is published once with a
growing id, and written as server-sent-event text once: every subscriber's queue and the ring hold
that same text, never a copy. Each subscriber has a bounded queue (a slow reader loses its oldest
updates and is told so with a ``resync`` message, instead of holding memory); a reconnecting client
sends ``Last-Event-ID`` and gets what it missed from a ring of recent updates, bounded in count and
in bytes. Streams are limited in all and per client (:class:`TooManyStreams`, a 429 at the route).

Its owner hears when the first stream opens and the last one closes (:attr:`Broadcaster.watch_handlers`):
the bridge between replicas asks the others for their updates only while someone here watches
(``live/replicas.py``). Until they relay, new streams wait (:meth:`Broadcaster.hold`); once they do, every
open stream, and every resume from an id published before then, is told to ``resync``
(:meth:`Broadcaster.resync`): what the others published meanwhile is in the database, not in the ring.

When the server stops, every stream ends (:meth:`Broadcaster.end_streams`, called by the serving process as
the stop begins): a stream never ends by itself, and the server would otherwise wait for it, then cut it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from .memory import release_memory_soon

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is in the server extra
    orjson = None  # type: ignore[assignment]

__all__ = ["Broadcaster", "TooManyStreams", "Update", "encode_json"]


def encode_json(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """Compact JSON text of what is published (already JSON-safe: the views write non-finite floats as
    strings), by orjson where it can (~5x the standard encoder: every report publishes two or three);
    the standard encoder for what orjson refuses (an integer beyond 64 bits, an unknown type).
    ``default``: what an object of another type becomes, as in :func:`json.dumps`."""
    if orjson is not None:
        try:
            return orjson.dumps(value, default=default).decode()
        except TypeError:
            pass
    return json.dumps(value, separators=(",", ":"), default=default)


_log = logging.getLogger("stepwatch.server")

_asyncio_timeout = getattr(asyncio, "timeout", None)


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Whether ``event`` is set within ``timeout`` seconds; a cancel of the waiting task always goes through.

    Not ``asyncio.wait_for``: before Python 3.12 it returns the result of an awaitable that completes in the
    turn of the loop in which its task is cancelled, and drops the cancel (a stream cancelled as an update
    woke it went on). ``asyncio.timeout`` (3.11+) has no such window, nor a task per wait; anyio's cancel
    scope, which delivers a cancel until it is taken, stands in for it on 3.10."""
    if event.is_set():
        return True
    if _asyncio_timeout is not None:
        try:
            async with _asyncio_timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        return True
    import anyio  # pragma: no cover - Python 3.10 (anyio comes with Starlette)

    with anyio.move_on_after(timeout):  # pragma: no cover
        await event.wait()
        return True
    return False  # pragma: no cover


@dataclass(frozen=True)
class Update:
    """One message of the stream: ``kind`` is ``job``, ``points`` or ``event``."""

    id: int
    kind: str
    namespace: str
    name: str
    data: dict[str, Any]
    text: str = field(default="", compare=False, repr=False)
    """The update as a server-sent event (written once, by :meth:`Broadcaster.publish`)."""

    def sse(self) -> str:
        """The update as a server-sent event."""
        if self.text:
            return self.text
        payload = encode_json({"namespace": self.namespace, "name": self.name, **self.data})
        return f"id: {self.id}\nevent: {self.kind}\ndata: {payload}\n\n"


@dataclass(frozen=True, slots=True)
class _Sent:
    """What the ring and the queues keep of an update: whom it is for and its text (not its data)."""

    id: int
    namespace: str
    name: str
    text: str

    @property
    def size(self) -> int:
        """The bytes the ring counts for it."""
        return len(self.text)


class _Deferred:
    """An update that nobody read when it was published, kept in the ring only: its text is written when a
    resume reads it (``build`` gives its data then, the same as at publishing: it reads immutable things);
    until then the ring counts ``size`` bytes for it, what it holds in memory."""

    __slots__ = ("_build", "_text", "id", "kind", "name", "namespace", "size")

    def __init__(self, uid: int, kind: str, namespace: str, name: str, build: Callable[[], dict[str, Any]], size: int):
        self.id, self.kind, self.namespace, self.name, self.size = uid, kind, namespace, name, size
        self._build: Callable[[], dict[str, Any]] | None = build
        self._text = ""

    @property
    def text(self) -> str:
        """The update as a server-sent event, written at the first read."""
        if self._build is not None:
            payload = encode_json({"namespace": self.namespace, "name": self.name, **self._build()})
            self._text = f"id: {self.id}\nevent: {self.kind}\ndata: {payload}\n\n"
            self._build = None  # what it held (a job) goes
        return self._text


class TooManyStreams(Exception):
    """A live stream over a limit (in all, or of one client): answered 429 with ``Retry-After``."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class _Subscriber:
    def __init__(
        self,
        namespace: str | None,
        name: str | None,
        size: int,
        allowed: frozenset[str] | None = None,
        client: str | None = None,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.allowed = allowed
        self.client = client
        self.queue: deque[_Sent] = deque(maxlen=size)
        self.lost = False
        self.resync = ""
        """A ``resync`` event to send before anything else (:meth:`Broadcaster.resync`), or empty."""
        self.ready = asyncio.Event()

    def wants(self, update: Update | _Sent | _Deferred) -> bool:
        return self.wants_key(update.namespace, update.name)

    def wants_key(self, namespace: str, name: str) -> bool:
        """Whether the updates of job ``namespace/name`` are for this subscriber."""
        return (
            (self.namespace is None or namespace == self.namespace)
            and (self.name is None or name == self.name)
            and (self.allowed is None or namespace in self.allowed)
        )


class Broadcaster:
    """Publishes updates to every interested subscriber, without ever blocking the publisher."""

    def __init__(
        self,
        history: int = 2048,
        queue_size: int = 1024,
        heartbeat: float = 15.0,
        first_id: int | None = None,
        *,
        ring_bytes: int = 8 * 1024 * 1024,
        max_streams: int = 512,
        max_per_client: int = 32,
    ) -> None:
        # ids start at the boot time in microseconds (not at 1): a client resuming after a restart with
        # an id of the server's earlier life then holds an id below this life's first, and is told to
        # resync, even when this life has already published more updates than the earlier one had
        self.first_id = time.time_ns() // 1000 if first_id is None else first_id
        self._ids = itertools.count(self.first_id)
        self._recent: deque[_Sent | _Deferred] = deque(maxlen=history)
        self._recent_bytes = 0
        self.ring_bytes = ring_bytes
        """The most the ring's texts hold in all (the oldest go first)."""
        self.max_streams = max_streams
        self.max_per_client = max_per_client
        self._per_client: dict[str, int] = {}
        self._subscribers: set[_Subscriber] = set()
        self._queue_size = queue_size
        self._peak = 0
        self.heartbeat = heartbeat
        self.relays: list[Callable[[Update], None]] = []
        """Called with every update published here (not with those relayed from elsewhere): the
        bridge between replicas passes them on (``server.replicas``). A relay must not block."""
        self.watch_handlers: list[Callable[[bool], None]] = []
        """Called with ``True`` when a stream opens while none was open (from :meth:`stream`, on the event
        loop: a handler may :meth:`hold` the new stream), with ``False`` when the last one closes (wherever
        it closes: a stream dropped unread is counted off by its finalizer, which may run in any thread).
        A handler must not block."""
        self.hold_s = 10.0
        """How long a held stream waits at most before its first event (:meth:`hold`)."""
        self._held: asyncio.Event | None = None
        self._resync_below = self.first_id
        """A resume from an id below this one gets a ``resync`` (:meth:`resync`)."""
        self._ended = False
        """The server stops: streams end (:meth:`end_streams`)."""

    def publish(self, kind: str, namespace: str, name: str, data: dict[str, Any], *, relayed: bool = False) -> Update:
        """Send an update to the subscribers that want it (call from the event loop).

        ``relayed``: the update was published by another replica (it is not relayed again).
        """
        uid = next(self._ids)
        payload = encode_json({"namespace": namespace, "name": name, **data})
        text = f"id: {uid}\nevent: {kind}\ndata: {payload}\n\n"
        update = Update(uid, kind, namespace, name, data, text)
        if not relayed:
            for relay in self.relays:
                try:
                    relay(update)
                except Exception:
                    _log.exception("relaying a live update failed")
        sent = _Sent(uid, namespace, name, text)
        self._remember(sent)
        for sub in self._subscribers:
            if sub.wants(sent):
                if len(sub.queue) == sub.queue.maxlen:
                    sub.lost = True
                sub.queue.append(sent)
                sub.ready.set()
        return update

    def publish_deferred(
        self, kind: str, namespace: str, name: str, build: Callable[[], dict[str, Any]], size: int
    ) -> None:
        """:meth:`publish` ``build()``, built only when it is read: at once when a subscriber wants it or a
        relay passes it on, else only if a resume reads it from the ring (most updates of a server
        without readers are never read). ``build`` must give the same data whenever it is called;
        ``size``: the bytes the ring counts for it meanwhile (about what ``build`` holds)."""
        if self.relays or any(sub.wants_key(namespace, name) for sub in self._subscribers):
            self.publish(kind, namespace, name, build())
        else:
            self._remember(_Deferred(next(self._ids), kind, namespace, name, build, size))

    def _remember(self, sent: _Sent | _Deferred) -> None:
        """Keep an update in the ring, the oldest leaving first when it is full in count or in bytes."""
        recent = self._recent
        if len(recent) == recent.maxlen:
            self._recent_bytes -= recent[0].size
        recent.append(sent)
        self._recent_bytes += sent.size
        while self._recent_bytes > self.ring_bytes and len(recent) > 1:
            self._recent_bytes -= recent.popleft().size

    @property
    def ring_size(self) -> tuple[int, int]:
        """The ring of recent updates: how many, and their bytes of text."""
        return len(self._recent), self._recent_bytes

    @property
    def subscribers(self) -> int:
        """How many streams are open."""
        return len(self._subscribers)

    def stream(
        self,
        namespace: str | None = None,
        name: str | None = None,
        last_event_id: int | None = None,
        allowed: frozenset[str] | None = None,
        client: str | None = None,
    ) -> AsyncGenerator[str, None]:
        """Server-sent events for one client: missed updates first, then live ones, with heartbeats.
        ``allowed``: only updates of these namespaces (what the client may read; ``None``: all).
        ``client``: who opens it (a token, a user, an address), for the limit per client.

        The stream is counted from this call (:class:`TooManyStreams` when over a limit) until it
        ends, or is dropped without ever being read."""
        if len(self._subscribers) >= self.max_streams:
            raise TooManyStreams(f"the server has {self.max_streams} live streams open, its limit", 30)
        if client is not None and self._per_client.get(client, 0) >= self.max_per_client:
            raise TooManyStreams(
                f"this client has {self.max_per_client} live streams open, the limit per client; close one", 10
            )
        sub = _Subscriber(namespace, name, self._queue_size, allowed, client)
        self._subscribers.add(sub)
        if client is not None:
            self._per_client[client] = self._per_client.get(client, 0) + 1
        self._peak = max(self._peak, len(self._subscribers))
        if len(self._subscribers) == 1:
            self._watched(True)
        stream = self._serve(sub, last_event_id)
        weakref.finalize(stream, self._close, sub)  # never read (the client left at once): counted off all the same
        return stream

    def _close(self, sub: _Subscriber) -> None:
        if sub not in self._subscribers:
            return
        self._subscribers.discard(sub)
        if sub.client is not None:
            left = self._per_client.pop(sub.client) - 1
            if left:
                self._per_client[sub.client] = left
        sub.queue.clear()
        if not self._subscribers:
            self._watched(False)
        if self._peak >= 64 and len(self._subscribers) <= self._peak // 4:
            # most of many streams went, with their connections' buffers: give that memory back to the system
            self._peak = len(self._subscribers)
            release_memory_soon()

    def _watched(self, watched: bool) -> None:
        for handler in list(self.watch_handlers):
            try:
                handler(watched)
            except Exception:
                _log.exception("a live stream's watcher failed")

    def hold(self) -> None:
        """Streams opened from now on, and those opened but not yet begun, wait before their first event
        until :meth:`release` (:attr:`hold_s` at most): the bridge between replicas holds them while it asks
        the others to relay (call from the event loop)."""
        if self._held is None:
            self._held = asyncio.Event()

    def release(self) -> None:
        """The held streams go on (see :meth:`hold`)."""
        held, self._held = self._held, None
        if held is not None:
            held.set()

    def resync(self, reason: str) -> None:
        """Updates of other replicas may be missing from what was published here until now: every open
        stream sends a ``resync`` (with ``reason``) before anything else, and so does every stream that
        resumes from an id published before now (call from the event loop)."""
        uid = next(self._ids)
        self._ids = itertools.count(uid)  # (no id used up: the next update gets it)
        self._resync_below = uid
        text = f"event: resync\ndata: {encode_json({'reason': reason})}\n\n"
        for sub in self._subscribers:
            sub.resync = text
            # what it holds was published before now: the client reads the state again after the resync,
            # which holds all of it (an update is stored before it is published); what comes later is kept
            sub.queue.clear()
            sub.ready.set()

    def end_streams(self) -> None:
        """The server stops: every open stream sends what it holds and ends, a held one at once, and a stream
        opened from now on ends after what it missed (call from the event loop). Clients reconnect, with
        ``Last-Event-ID``, to whichever server answers next, as after a restart."""
        self._ended = True
        self.release()
        for sub in self._subscribers:
            sub.ready.set()

    async def _serve(self, sub: _Subscriber, last_event_id: int | None) -> AsyncGenerator[str, None]:
        try:
            held = self._held
            if held is not None:
                await _wait(held, self.hold_s)
            yield "retry: 2000\n\n"
            if last_event_id is not None:
                missed = [u for u in self._recent if u.id > last_event_id and sub.wants(u)]
                if last_event_id < self.first_id:  # an id of this server's earlier life
                    sub.resync = ""
                    yield 'event: resync\ndata: {"reason":"the server restarted; read the state again"}\n\n'
                elif self._recent and self._recent[0].id > last_event_id + 1:
                    sub.resync = ""
                    yield 'event: resync\ndata: {"reason":"updates were missed; read the state again"}\n\n'
                elif last_event_id < self._resync_below:  # the ring lacks the other replicas' updates of then
                    sub.resync = ""
                    yield (
                        'event: resync\ndata: {"reason":"this replica did not hear the others then; '
                        'read the state again"}\n\n'
                    )
                for sent in missed:
                    yield sent.text
            while True:
                if not self._ended:  # (ended: what it holds goes out, then the stream ends)
                    if not await _wait(sub.ready, self.heartbeat):
                        yield ": keep-alive\n\n"
                        continue
                    sub.ready.clear()
                while sub.queue or sub.lost or sub.resync:
                    if sub.resync:  # said before any update that came after it
                        text, sub.resync, sub.lost = sub.resync, "", False
                        yield text
                        continue
                    if sub.lost:  # said before any update that came after the gap
                        sub.lost = False
                        yield 'event: resync\ndata: {"reason":"this client was too slow; read the state again"}\n\n'
                        continue
                    yield sub.queue.popleft().text
                if self._ended:
                    return
        finally:
            self._close(sub)
