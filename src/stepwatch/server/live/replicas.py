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

**Relaying only while another replica wants it.** Relaying is the largest part of what a report costs a
replica (measured: ~0.15-0.2 ms of 0.65-0.77 a report), and hearing and republishing the others' updates
most of what each added replica costs; a relay is needed only while some *other* replica has someone
watching its live stream. So a replica *wants* live updates while it has at least one open stream, and for
:data:`GRACE_S` after the last one closed (a page reload does not start a handshake each time); its relay
is in the broadcaster's ``relays`` only while some other replica may want. Two shared advisory locks say
who is there, both held by the store's listening connection and released by PostgreSQL when that
connection ends (:meth:`.PostgresStore.others_present` and :meth:`.PostgresStore.others_wanting` read
the holders from ``pg_locks``): the *presence* lock, taken just before its ``LISTEN``, and the *wants*
lock, taken (on that connection, in its thread: :meth:`.PostgresStore.want_live`) while the replica
wants, and again by each new listening connection while it does. The rules:

1. a bridge relays from its start, and whenever its listening connection is down (it cannot hear a
   hello then, nor tell who wants); at its start it says *hello* before it publishes anything (the others
   then know that somebody was there; this one wants nothing yet, so they do not relay for it, and it
   does not wait for their acks);
2. a bridge that starts to want (its first stream opens; or its listening connection comes back while
   it wants) holds the wants lock *first*, then reads who is present, sends a *hello* on the jobs channel
   and waits for an *ack* from each of them (by the process id of their listening connection); after a
   timeout it goes on anyway, and says so. Streams opened meanwhile wait before their first event
   (:meth:`.Broadcaster.hold`); when it is done, every open stream gets a ``resync``, and so does every
   later resume from an id published before then (:meth:`.Broadcaster.resync`), unless no other replica
   can have published unheard since this one last stopped wanting (or started): its reads of who is
   present, made on the listening connection when it stopped wanting and when it greets, found nobody,
   and it heard no hello nor live update of another replica meanwhile, and its listening connection
   stayed up (a lone replica's streams begin as on SQLite);
3. a bridge that hears a hello puts its relay back on its event loop, *then* acks;
4. at its start and every :data:`CHECK_S`, a bridge that finds no other holder of the wants lock while its
   listening connection is up takes its relay off, unless something happened meanwhile (an *epoch*,
   raised on the loop by every hello heard and every change of the listening connection, is read before
   the lock's holders and compared after: a hello heard during the check is not undone by it); one that
   finds a holder puts it on;
5. a bridge that does not want gives the wants lock back (:data:`GRACE_S` after its last stream closed),
   and drops the live notifications it hears without decoding them (this version's, recognised by their
   first bytes, as its own are).

Why no subscriber silently misses an update it would have had if every replica relayed all the time:
let a stream be open on B, and A publish an update at a moment t. (a) If B's last greeting (rule 2)
completed before t and B wanted ever since: B's wants lock was taken before that greeting read who is
present. If A's presence lock was among them, A heard the hello (sent after the read) and its relay was
on when it acked, before the greeting completed; or A had locked but not yet listened (one round trip),
and the greeting timed out while A's relay was on from its start (rule 1) or its listening connection was
down and it relayed meanwhile. Once on, A takes it off only if a check of A finds no other holder of the
wants lock, but B's is held (nor is a check that started before the hello applied: the epoch). If A's
presence lock was not among them, A locked later and its first check, at its start, finds B's wants lock
(rules 1 and 4). So A's relay is on at t, and B, which wants, decodes and publishes it. (b) Otherwise t
falls before that greeting completed, or while B did not want: the stream, open then, was open when
the greeting completed and got a ``resync`` (rule 2: all streams open then, those it held included, get
one), or the stream opened later, resuming from an id published before that completion, and got one
too. A ``resync`` makes the client read the state again, which holds A's update: a report is stored
before it is published. The ``resync`` is left out only when B found nobody present at its reads since
it last stopped wanting, and heard nobody: then A was not present at the first read, so A started later
and said hello before it published (rule 1); a read on the listening connection hands over the
notifications committed before it, so A's hello was heard before the greeting's read returned, or A's
presence lock was taken after that read, hence after B's wants lock, and A's first check, at its start,
found the lock and put its relay on (rule 4). A replica whose listening connection is down hears nothing
meanwhile, as it always did; its wants lock goes with that connection, and the new one greets again
(rule 2), so that, unlike before, its streams are told to read the state again. The one window left is the
listening connection that the database dropped: it holds no lock any more before its process notices
(at once when the backend ends: the socket closes), and until then that process, if nobody else wanted,
does not relay to a replica that started to want meanwhile.

A replica of an earlier version either holds no lock and answers no hello (before the presence
protocol), or holds the presence lock, answers hellos and relays while any other replica is present, but
never holds the wants lock (before the wants lock). Either reads hellos and acks as a change of no job.
Both are told apart by their notifications: this version's say ``"v": 3`` (:data:`VERSION`), theirs ``2``
or nothing. A bridge that hears an older replica's live update puts its relay back and stays relaying
while it has heard one in the last :data:`OLDER_S` (an older replica that published nothing meanwhile,
after its last update, may miss this one's until it publishes again); the older replicas relay to this
one whenever it listens.

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
"""How often a bridge checks whether another replica wants its live updates (and takes its relay off if
none does)."""

GRACE_S = 30.0
"""How long a replica goes on wanting the others' live updates after its last stream closed: a page that
reloads, or a client that reconnects, finds it still wanting (no handshake, no ``resync``)."""

VERSION = 3
"""What this version's live notifications say in ``"v"`` (see the module docstring: 2, or nothing, is an
older replica)."""

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
        grace_s: float = GRACE_S,
    ) -> None:
        self._store = store
        self._live = live
        self._clock = clock
        self.origin = uuid.uuid4().hex[:12]
        self._prefix = f'{{"o":"{self.origin}","v":{VERSION},"b":['
        """How this replica's notifications begin (``_packed`` writes them so)."""
        self._own = f'{{"o":"{self.origin}",'
        """How every notification of this replica begins, a spill's included (its store writes those so)."""
        self._this_version = f'","v":{VERSION},'
        """What follows the origin in every notification of a replica of this version, a spill's included
        (origins are 12 characters: :data:`_AFTER_ORIGIN`)."""
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
        self._grace_s = grace_s
        self._grace: asyncio.TimerHandle | None = None
        """Set while the last stream has closed and the grace period runs."""
        self._wanting = False
        """Whether this replica wants the others' live updates (set on the loop, read in the listening
        thread: a notification heard while it is false is dropped)."""
        self._greeted = False
        """Whether the others relay to this replica since its last greeting (rule 2), while it wants."""
        self._connections = 0
        """Raised (on the loop) by every change of the listening connection."""
        self._presence_wake = asyncio.Event()
        self._presence: asyncio.Task[None] | None = None
        self._seen = True
        """Whether another replica may have published, unheard, since this one last stopped wanting (set
        by what the listening thread hears, and by reads of who is present): a greeting that completes
        then resyncs the streams (rule 2). Until the first such read: it may."""
        self.ignored = 0
        """Live notifications of other replicas dropped undecoded while this one did not want them."""

    @property
    def relaying(self) -> bool:
        """Whether this replica's local updates go to the others now."""
        return self._outgoing in self._live.relays

    @property
    def wanting(self) -> bool:
        """Whether this replica wants the others' live updates (someone watches here, or did a moment ago)."""
        return self._wanting

    async def start(self) -> None:
        """Start relaying (call from the event loop that serves the app, and await it before serving: it
        returns once it knows whether another replica wants its updates)."""
        self._loop = asyncio.get_running_loop()
        store = self._store
        store.live_handlers.append(self._heard)
        store.ack_handlers.append(self._heard_ack)
        store.listening_handlers.append(self._heard_listening)
        store.hello_handler = self._heard_hello
        self._live.watch_handlers.append(self._watch)
        self._relay(True)
        self._task = asyncio.create_task(self._send_forever())
        await self._settle()  # who is present (rule 2's resync needs to know whether anybody was)
        try:  # rule 1: the others hear that this one is there before it publishes anything
            await asyncio.to_thread(self._store.send_presence, "hello", _STARTING + uuid.uuid4().hex)
        except StoreError as exc:
            _log.warning("cannot tell the other replicas that this one started: %s", exc)
        await self._check()
        self._presence = asyncio.create_task(self._presence_forever())
        self._checker = asyncio.create_task(self._check_forever())
        if self._live.subscribers:
            self._watched()

    async def aclose(self, timeout_s: float = 2.0) -> None:
        """Stop relaying; what is still queued is sent, within ``timeout_s``."""
        self._relay(False)
        store = self._store
        with contextlib.suppress(ValueError):
            self._live.watch_handlers.remove(self._watch)
        if self._grace is not None:
            self._grace.cancel()
        self._live.release()
        for handlers, handler in (
            (store.live_handlers, self._heard),
            (store.ack_handlers, self._heard_ack),
            (store.listening_handlers, self._heard_listening),
        ):
            with contextlib.suppress(ValueError):
                handlers.remove(handler)  # type: ignore[arg-type]
        if store.hello_handler == self._heard_hello:
            store.hello_handler = None  # the store answers hellos itself
        for task in (self._checker, self._presence, *self._chores):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._wanting:
            self._wanting = False
            await asyncio.to_thread(store.want_live, False, 2.0)
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

    async def _who(self, read: Callable[[], frozenset[int] | None]) -> frozenset[int] | None:
        """Other replicas' listening connections as ``read`` finds them, ``None`` when this one's is down or
        it cannot tell."""
        try:
            return await asyncio.to_thread(read)
        except StoreError as exc:
            _log.warning("cannot tell which replicas are there: %s", exc)
            return None

    def _alone(self, epoch: int) -> None:
        """Found nobody else wanting with the epoch at ``epoch``: the relay goes off if nothing happened since."""
        if epoch == self._epoch and self._store.listening and time.monotonic() - self._older_at > self._older_s:
            self._relay(False)

    async def _check(self) -> None:
        """Rule 4: the relay on while another replica wants, off while none does."""
        epoch = self._epoch
        others = await self._who(self._store.others_wanting)
        if others:
            self._relay(True)
        elif others is not None:
            self._alone(epoch)

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(self._check_s)
            await self._check()

    # ------------------------------------------------------------------------------------ wanting

    def _watch(self, watched: bool) -> None:
        """The broadcaster's first stream opened (on the loop, within ``stream()``), or its last closed
        (anywhere)."""
        if watched:
            self._watched()
        else:
            self._on_loop(self._unwatched)

    def _watched(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        if self._wanting and self._greeted:
            return  # (within the grace period: nothing to ask)
        self._wanting = True
        self._live.hold()  # until the greeting is done (released by _presence_forever)
        self._presence_wake.set()

    def _unwatched(self) -> None:
        if self._live.subscribers or self._grace is not None or not self._wanting:
            return
        loop = self._loop
        if loop is not None:
            self._grace = loop.call_later(self._grace_s, self._unwant)

    def _unwant(self) -> None:
        """Rule 5, after the grace period."""
        self._grace = None
        if self._live.subscribers:
            return
        self._wanting = False
        self._greeted = False
        self._presence_wake.set()

    async def _presence_forever(self) -> None:
        """Holds or gives back the wants lock as :attr:`wanting` says, and greets (rule 2), one at a time."""
        while True:
            await self._presence_wake.wait()
            self._presence_wake.clear()
            try:
                await self._settle()
            except StoreError as exc:
                _log.warning("cannot tell the other replicas whether this one wants live updates: %s", exc)
            finally:
                self._live.release()  # held streams go on (they get a resync when a greeting completes)

    async def _settle(self) -> None:
        connections = self._connections
        wanting = self._wanting
        if not wanting:
            self._seen = False  # (what is heard from now on, and who the read below finds, set it again)
        others = await asyncio.to_thread(self._store.want_live, wanting)
        if others is None:  # down (greeted when it is back), or the listening thread did not answer in time
            self._seen = True
            if self._store.listening:
                self._retry_soon()
            return
        if others:
            self._seen = True
        if not wanting or self._greeted:
            return
        if await self._greet(others) and self._wanting and connections == self._connections:
            self._greeted = True
            if self._seen:
                self._live.resync("updates of other replicas may have been missed until now; read the state again")

    def _retry_soon(self) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_later(1.0, self._presence_wake.set)

    async def _greet(self, others: frozenset[int]) -> bool:
        """Rule 2, once the wants lock is held and ``others`` read: whether every replica there relays to
        this one when this returns, or they did not answer in time (said in the log)."""
        if not others:
            return True
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
        return True

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
        self._seen = True
        if nonce.startswith(_STARTING):
            return  # a replica that starts: it wants nothing yet (older ones relay, and it does not wait)
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
        """Rules 1 and 2: down, it relays; back, it greets again if it wants (the others may have stopped
        relaying to it meanwhile: its wants lock went with the connection)."""
        self._epoch += 1
        self._connections += 1
        self._greeted = False
        self._seen = True  # (what it did not hear meanwhile)
        self._relay(True)
        if up and self._wanting:
            self._presence_wake.set()

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
                await asyncio.to_thread(self._store.send_live, self._packed(batch), self._clock(), self.origin, VERSION)
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
        self._seen = True
        if not self._wanting and payload.startswith(self._this_version, _AFTER_ORIGIN):
            self.ignored += 1  # nobody watches here: not decoded
            return
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
        if not isinstance(message.get("v"), int) or message["v"] < VERSION:  # an earlier version: see the docstring
            self._older_at = time.monotonic()
            if not self.relaying:
                self._on_loop(self._older)
        if not self._wanting:
            return
        updates = message.get("b", [message])  # (an older replica: one update each)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, updates)

    def _deliver(self, updates: list[dict[str, Any]]) -> None:
        for message in updates:
            self.received += 1
            self._live.publish(message["k"], message["ns"], message["n"], message["d"], relayed=True)


_STARTING = "start-"
"""How the nonce of the hello a bridge says at its start begins (rule 1): nobody relays for it, nobody
waits for its acks."""

_AFTER_ORIGIN = len('{"o":"') + 12
"""Where a notification's origin ends (``uuid4().hex[:12]``)."""


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
