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

**Relaying only while another replica is there.** A replica alone on its database has nobody to relay
to, and relaying is the largest part of what a report costs it (measured: ~0.15-0.2 ms of 0.65-0.77 a
report): its relay is in the broadcaster's ``relays`` only while another replica may be listening. Who is
there: each store's listening connection holds a shared advisory lock, taken just before its ``LISTEN``
and released by PostgreSQL when that connection ends (:meth:`.PostgresStore.others_present` reads the
holders from ``pg_locks``). The rules:

1. a bridge relays from its start, and whenever its listening connection is down (it cannot hear a
   hello then, nor tell who is there);
2. a starting bridge (:meth:`ReplicaBridge.start`, which the app awaits before it serves) reads who is
   there, then sends a *hello* on the jobs channel and waits for an *ack* from each of them (by the
   process id of their listening connection); after a timeout it serves anyway, and says so;
3. a bridge that hears a hello puts its relay back on its event loop, *then* acks;
4. every :data:`CHECK_S`, a bridge that finds no other holder of the lock while its listening connection
   is up takes its relay off, unless something happened meanwhile (an *epoch*, raised on the loop by
   every hello heard and every change of the listening connection, is read before the lock's holders
   and compared after: a hello heard during the check is not undone by it);
5. a listening connection that comes back greets again, as in 2 (the others may have stopped relaying
   while this one was away).

Why no subscriber misses an update it would have had when every replica relayed: let B serve, and A
publish afterwards. B's lock was taken before B's start read who is there. If A's lock was among them,
A heard B's hello (B sent it after reading) and its relay was on when it acked, before B served; or A had
locked but not yet listened (one round trip), then B serves after the timeout, and A relays: its bridge
has not started yet, or its listening connection was down and it greets B when it is back (rules 1, 5).
Once on, A takes it off later only if a check of A finds no other holder, but B's lock
is held (nor is a check that started before the hello applied: the epoch). If A's lock was not among
them, A locked later: A's start read B's lock and greeted B, so A relays from its start on (rule 1) until
a check finds it alone, which B's lock prevents. A replica whose listening connection is down relays
(rule 1); what it cannot hear meanwhile is lost, as it always was, until its new connection's hello is
acked (rule 5). The one window left: a listening connection that the database dropped holds no lock any
more before its process notices (at once when the backend ends: the socket closes), and until then that
process, if alone before, does not relay to a replica that started meanwhile.

A replica of a version before this one holds no lock and answers no hello (it reads hellos and acks as a
change of no job), so during a rolling upgrade a newer replica may be alone by the lock beside older ones.
Its notifications say ``"v": 2``, theirs do not: a bridge that hears an older replica's live update puts
its relay back and stays relaying while it has heard one in the last :data:`OLDER_S` (an older replica
that published nothing meanwhile, after its last update, may miss this one's until it publishes again).

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

CHECK_S = 5.0
"""How often a bridge checks whether it is alone (and takes its relay off if it is)."""

HELLO_TIMEOUT_S = 5.0
"""How long a starting bridge waits for the other replicas' acks before it serves anyway."""

OLDER_S = 60.0
"""How long a bridge relays after it last heard a live update of a replica of an earlier version (which
holds no presence lock)."""

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
        check_s: float = CHECK_S,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        older_s: float = OLDER_S,
    ) -> None:
        self._store = store
        self._live = live
        self._clock = clock
        self.origin = uuid.uuid4().hex[:12]
        self._prefix = f'{{"o":"{self.origin}","v":2,"b":['
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
        self._check_s = check_s
        self._hello_timeout_s = hello_timeout_s
        self._epoch = 0
        """Raised (on the loop) by every hello heard and every change of the listening connection."""
        self._hellos: dict[str, tuple[frozenset[int], set[int], asyncio.Event]] = {}
        """This bridge's hellos waiting for acks: whom they wait for, who acked, set when all did."""
        self._checker: asyncio.Task[None] | None = None
        self._chores: set[asyncio.Task[None]] = set()
        """Acks and greetings in flight."""
        self._older_s = older_s
        self._older_at = -older_s
        """When (``time.monotonic``) this bridge last heard a live update of an older replica."""

    @property
    def relaying(self) -> bool:
        """Whether this replica's local updates go to the others now."""
        return self._outgoing in self._live.relays

    async def start(self) -> None:
        """Start relaying (call from the event loop that serves the app, and await it before serving: it
        returns once every other replica relays to this one, or after a timeout)."""
        self._loop = asyncio.get_running_loop()
        store = self._store
        store.live_handlers.append(self._heard)
        store.ack_handlers.append(self._heard_ack)
        store.listening_handlers.append(self._heard_listening)
        store.hello_handler = self._heard_hello
        self._relay(True)
        self._task = asyncio.create_task(self._send_forever())
        await self._greet()
        self._checker = asyncio.create_task(self._check_forever())

    async def aclose(self, timeout_s: float = 2.0) -> None:
        """Stop relaying; what is still queued is sent, within ``timeout_s``."""
        self._relay(False)
        store = self._store
        for handlers, handler in (
            (store.live_handlers, self._heard),
            (store.ack_handlers, self._heard_ack),
            (store.listening_handlers, self._heard_listening),
        ):
            with contextlib.suppress(ValueError):
                handlers.remove(handler)  # type: ignore[arg-type]
        if store.hello_handler == self._heard_hello:
            store.hello_handler = None  # the store answers hellos itself
        for task in (self._checker, *self._chores):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self._queue:
            with contextlib.suppress(asyncio.TimeoutError, StoreError):
                await asyncio.wait_for(self._send(), timeout_s)

    # ----------------------------------------------------------------------------------- presence

    def _relay(self, on: bool) -> None:
        if on and not self.relaying:
            self._live.relays.append(self._outgoing)
        elif not on:
            with contextlib.suppress(ValueError):
                self._live.relays.remove(self._outgoing)

    def _chore(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    async def _who(self) -> frozenset[int] | None:
        """The other replicas' listening connections, ``None`` when this one's is down or it cannot tell."""
        try:
            return await asyncio.to_thread(self._store.others_present)
        except StoreError as exc:
            _log.warning("cannot tell which replicas are there: %s", exc)
            return None

    def _alone(self, epoch: int) -> None:
        """Found alone with the epoch at ``epoch``: the relay goes off if nothing happened since."""
        if epoch == self._epoch and self._store.listening and time.monotonic() - self._older_at > self._older_s:
            self._relay(False)

    async def _greet(self) -> None:
        """Rule 2 of the module docstring: every replica there relays to this one when this returns, or
        they did not answer in time (said in the log)."""
        epoch = self._epoch
        others = await self._who()
        if others is None:
            return  # relaying; greeted again when the listening connection is back
        if not others:
            self._alone(epoch)
            return
        self._relay(True)
        nonce = uuid.uuid4().hex
        acked: set[int] = set()
        done = asyncio.Event()
        self._hellos[nonce] = (others, acked, done)
        try:
            await asyncio.to_thread(self._store.send_presence, "hello", nonce)
            await asyncio.wait_for(done.wait(), self._hello_timeout_s)
        except (StoreError, asyncio.TimeoutError) as exc:
            _log.warning(
                "%d of %d other replicas did not answer this one's hello (%s); serving anyway, their live "
                "updates may not reach it",
                len(others - acked),
                len(others),
                exc or "no answer in time",
            )
        finally:
            del self._hellos[nonce]

    async def _check_forever(self) -> None:
        """Rule 4: the relay off while alone (on again if another store holds the lock without a hello)."""
        while True:
            await asyncio.sleep(self._check_s)
            epoch = self._epoch
            others = await self._who()
            if others:
                self._relay(True)
            elif others is not None:
                self._alone(epoch)

    def _on_loop(self, callback: Callable[..., None], *args: Any) -> bool:
        loop = self._loop
        if loop is None or loop.is_closed():
            return False
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # closed meanwhile
            return False
        return True

    def _heard_hello(self, nonce: str) -> None:
        """Another replica's hello (in the listening thread)."""
        if not self._on_loop(self._hello, nonce):
            self._store.send_presence("ack", nonce)  # this loop is gone: nothing to relay

    def _hello(self, nonce: str) -> None:
        """Rule 3: the relay on, then the ack."""
        self._epoch += 1
        self._relay(True)
        self._chore(self._ack(nonce))

    async def _ack(self, nonce: str) -> None:
        try:
            await asyncio.to_thread(self._store.send_presence, "ack", nonce)
        except StoreError as exc:
            _log.warning("a replica's hello could not be answered: %s", exc)

    def _heard_ack(self, nonce: str, pid: int) -> None:
        """An ack (in the listening thread): most are for another replica's hello."""
        if nonce in self._hellos:
            self._on_loop(self._acked, nonce, pid)

    def _acked(self, nonce: str, pid: int) -> None:
        waiting = self._hellos.get(nonce)
        if waiting is not None:
            others, acked, done = waiting
            acked.add(pid)
            if others <= acked:
                done.set()

    def _older(self) -> None:
        self._epoch += 1
        self._relay(True)

    def _heard_listening(self, up: bool) -> None:
        """The listening connection came up or went down (in the listening thread)."""
        self._on_loop(self._listening, up)

    def _listening(self, up: bool) -> None:
        """Rules 1 and 5."""
        self._epoch += 1
        self._relay(True)
        if up:
            self._chore(self._greet())

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
        if message.get("v") != 2:  # a replica of an earlier version, which no lock shows
            self._older_at = time.monotonic()
            if not self.relaying:
                self._on_loop(self._older)
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
