"""Live updates across replicas: what one server process publishes, every other one publishes too.

Several server processes on one PostgreSQL database each serve their own live stream (a
:class:`~.broadcaster.Broadcaster` per process). A report ingested by one replica must reach the dashboards
connected to the others, so the bridge sends every update published locally as a notification on
the database's live channel (``pg_notify``; an update larger than a notification's 8,000 bytes goes
through a table and the notification names its row), and publishes what the other replicas sent to
its own subscribers. The job views, points and events it carries are the sender's, as they were
published there.

Sending never blocks the publisher: updates wait in a bounded queue (the oldest go first when the
database is away) and are sent in batches, one transaction each, by a task of the event loop through
a worker thread; a batch waits :data:`LINGER_S` after its first update, so that the reports of those
milliseconds share it. A batch's updates share notifications: as many as fit in one (``{"o": origin, "b":
[update, ...]}``), so a report's two or three updates cost every other replica one notification to
hear, decode and hand over, not one each. Receiving happens in the store's listening thread, handed
over to the event loop one notification at a time; a replica's own notifications come back to it too,
and are recognised by their first bytes, without decoding them.

Each replica numbers its stream itself: a client that reconnects to another replica with a
``Last-Event-ID`` gets a ``resync`` at worst, and reads the state again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..store import Store, StoreError

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is in the server extra
    orjson = None  # type: ignore[assignment]
from .broadcaster import Broadcaster, Update, encode_json

if TYPE_CHECKING:
    from ..store.postgres import PostgresStore

__all__ = ["ReplicaBridge", "bridge_for"]

_log = logging.getLogger("stepwatch.server")

LINGER_S = 0.01
"""How long a first update waits for others to go with it: sending is a transaction (a pooled connection,
a worker thread, a commit), which cost more than the rest of a report when each report's updates went
alone (measured: 0.2 ms of server CPU a report with one replica)."""

SPILL_KEEP_S = 300.0
"""How long a large update stays in the database for the other replicas to read."""


class ReplicaBridge:
    """Relays live updates between this process and the other replicas on the same database."""

    def __init__(
        self,
        store: PostgresStore,
        live: Broadcaster,
        clock: Callable[[], float] = time.time,
        max_queue: int = 10_000,
        linger_s: float = LINGER_S,
    ) -> None:
        self._store = store
        self._live = live
        self._clock = clock
        self.origin = uuid.uuid4().hex[:12]
        self._prefix = f'{{"o":"{self.origin}","b":['
        """How this replica's notifications begin (``_packed`` writes them so)."""
        self._own = f'{{"o":"{self.origin}",'
        """How every notification of this replica begins, a spill's included (its store writes those so)."""
        self._linger_s = linger_s
        self._queue: deque[str] = deque(maxlen=max_queue)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sent = 0
        self.received = 0
        self.dropped = 0
        self._failing_since: float | None = None

    async def start(self) -> None:
        """Start relaying (call from the event loop that serves the app)."""
        self._loop = asyncio.get_running_loop()
        self._store.live_handlers.append(self._heard)
        self._live.relays.append(self._outgoing)
        self._task = asyncio.create_task(self._send_forever())

    async def aclose(self, timeout_s: float = 2.0) -> None:
        """Stop relaying; what is still queued is sent, within ``timeout_s``."""
        with contextlib.suppress(ValueError):
            self._live.relays.remove(self._outgoing)
        with contextlib.suppress(ValueError):
            self._store.live_handlers.remove(self._heard)
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self._queue:
            with contextlib.suppress(asyncio.TimeoutError, StoreError):
                await asyncio.wait_for(self._send(), timeout_s)

    # ------------------------------------------------------------------------------------ sending

    def _outgoing(self, update: Update) -> None:
        """A local update (on the event loop): queued for the other replicas."""
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        message = {"k": update.kind, "ns": update.namespace, "n": update.name, "d": update.data}
        self._queue.append(encode_json(message, default=str))
        self._wake.set()

    async def _send_forever(self) -> None:
        pruned = 0.0
        while True:
            await self._wake.wait()
            await asyncio.sleep(self._linger_s)  # the updates of the next few ms go in the same transaction
            self._wake.clear()
            try:
                await self._send()
                self._failing_since = None
            except StoreError as exc:
                now = self._clock()
                if self._failing_since is None:
                    self._failing_since = now
                    _log.warning("live updates cannot reach the other replicas: %s", exc)
                await asyncio.sleep(1.0)
                self._wake.set()  # try again what is still queued
                continue
            if self._clock() - pruned > 60:
                pruned = self._clock()
                with contextlib.suppress(StoreError):
                    await asyncio.to_thread(self._store.prune_spill, pruned - SPILL_KEEP_S)

    async def _send(self) -> None:
        while self._queue:
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), 500))]
            try:
                await asyncio.to_thread(self._store.send_live, self._packed(batch), self._clock(), self.origin)
            except StoreError:
                self._queue.extendleft(reversed(batch))  # kept in order, for the next try
                raise
            self.sent += len(batch)

    def _packed(self, batch: list[str]) -> list[str]:
        """Updates (JSON texts) in notifications of at most the store's limit, in order; one that is over
        the limit alone is a notification of its own, which the store sends through its table."""
        limit = self._store.notify_limit - len(self._prefix) - 2
        packed: list[str] = []
        part: list[str] = []
        size = 0
        for text in batch:
            n = len(text.encode()) + 1
            if part and size + n > limit:
                packed.append(self._prefix + ",".join(part) + "]}")
                part, size = [], 0
            part.append(text)
            size += n
        if part:
            packed.append(self._prefix + ",".join(part) + "]}")
        return packed

    # ---------------------------------------------------------------------------------- receiving

    def _heard(self, payload: str) -> None:
        """A notification on the live channel (in the store's listening thread)."""
        if payload.startswith(self._own):
            return  # this replica's own, published here already
        message = _decoded(payload)
        if message.get("o") == self.origin:
            return
        if "spill" in message:
            try:
                text = self._store.read_spill(int(message["spill"]))
            except StoreError as exc:
                _log.warning("a large live update from another replica could not be read: %s", exc)
                return
            if text is None:
                return
            message = _decoded(text)
        updates = message.get("b", [message])  # (an older replica: one update each)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, updates)

    def _deliver(self, updates: list[dict[str, Any]]) -> None:
        for message in updates:
            self.received += 1
            self._live.publish(message["k"], message["ns"], message["n"], message["d"], relayed=True)


def _decoded(text: str) -> Any:
    """A notification's JSON, by orjson where it can (~3x the standard parser: every other replica's
    updates pass here); what orjson refuses (integers beyond 64 bits, bare NaN from the standard encoder
    that :func:`.encode_json` falls back to) by the standard parser."""
    if orjson is not None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def bridge_for(store: Store, live: Broadcaster, clock: Callable[[], float] = time.time) -> ReplicaBridge | None:
    """The bridge a store's replicas need (PostgreSQL), or ``None`` (SQLite: one process)."""
    if not hasattr(store, "send_live"):  # not imported here: psycopg is an extra
        return None
    return ReplicaBridge(cast("PostgresStore", store), live, clock)
