"""A replica relays its live updates only while another replica wants them (``live/replicas.py``, its module
docstring): alone, or beside replicas nobody watches, it sends nothing; a stream opened on one switches the
others' relays on before its first event, and is told to resync for what came before; the last stream
leaving switches them off after the grace period; a resume from before a time this replica did not want is
told to resync; a replica whose listening connection is down relays; older replicas are relayed to. Real
PostgreSQL (see ``conftest.py``), each test in its own schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

psycopg = pytest.importorskip("psycopg")

from stepwatch.server.live.broadcaster import Broadcaster  # noqa: E402
from stepwatch.server.live.replicas import ReplicaBridge  # noqa: E402
from stepwatch.server.store.replica_cache import ReplicaCache  # noqa: E402

CHECK_S = 0.2


@pytest.fixture
def backend() -> str:
    return "postgres"


def _replica(database: Any, **kwargs: Any) -> tuple[ReplicaBridge, Broadcaster, list[int]]:
    """A replica's bridge, its broadcaster, and the ``i`` of each update relayed to it, in order."""
    live = Broadcaster(heartbeat=0.5)  # (a stream left open by a failed test ends soon)
    bridge = ReplicaBridge(database.open(), live, check_s=CHECK_S, **kwargs)
    got: list[int] = []
    publish = live.publish

    def recording(kind: str, namespace: str, name: str, data: dict[str, Any], *, relayed: bool = False) -> Any:
        if relayed:
            got.append(int(data["i"]))
        return publish(kind, namespace, name, data, relayed=relayed)

    live.publish = recording  # type: ignore[method-assign]
    return bridge, live, got


async def _until(check: Callable[[], Any], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def test_a_replica_alone_does_not_relay(database: Any) -> None:
    """Alone on its database, a replica has no relay and sends nothing on the live channel."""
    heard: list[str] = []

    async def run() -> None:
        bridge, live, _ = _replica(database)
        with psycopg.connect(database.url, autocommit=True) as spy:  # listens without the presence lock
            spy.execute(f'LISTEN "{bridge._store.live_channel}"')
            await bridge.start()
            assert live.relays == [] and not bridge.relaying
            for i in range(20):
                live.publish("points", "ns", "a", {"i": i})
            await asyncio.sleep(0.3)
            heard.extend(n.payload for n in spy.notifies(timeout=0.2))
            assert bridge.sent == 0
            await bridge.aclose()

    asyncio.run(run())
    assert heard == []


_OPEN: list[Watcher] = []


def _run(main: Callable[[], Any]) -> None:
    """``asyncio.run(main())``, every watcher closed at the end, a failed test's included (left to
    ``asyncio.run``'s cancelling, a stream's task did not end)."""

    async def closing() -> None:
        try:
            await main()
        finally:
            while _OPEN:
                await _OPEN.pop().close()

    asyncio.run(closing())


class Watcher:
    """A stream of a replica's broadcaster, read in a task: every event, as text."""

    def __init__(self, live: Broadcaster, last_event_id: int | None = None) -> None:
        self.events: list[str] = []
        self._stream = live.stream(last_event_id=last_event_id)
        self._task = asyncio.ensure_future(self._read())
        _OPEN.append(self)

    async def _read(self) -> None:
        async for text in self._stream:
            self.events.append(text)

    def relayed(self) -> list[int]:
        """The ``i`` of each update of another replica it got (published as ``{"i": ..}``), in order."""
        return [int(json.loads(e.split("data: ", 1)[1])["i"]) for e in self.events if '"i":' in e]

    def kinds(self) -> list[str]:
        return [e.split("\n", 1)[0] for e in self.events]

    async def close(self) -> None:
        with contextlib.suppress(ValueError):
            _OPEN.remove(self)
        while not self._task.done():  # (Python 3.11's wait_for can swallow a cancel that meets its result)
            self._task.cancel()
            await asyncio.wait([self._task], timeout=0.1)
        await self._stream.aclose()


def test_replicas_that_nobody_watches_relay_nothing(database: Any) -> None:
    """Three replicas, no stream open anywhere: none relays, nothing goes on the live channel."""
    heard: list[str] = []

    async def run() -> None:
        replicas = [_replica(database) for _ in range(3)]
        with psycopg.connect(database.url, autocommit=True) as spy:
            spy.execute(f'LISTEN "{replicas[0][0]._store.live_channel}"')
            for bridge, _, _ in replicas:
                await bridge.start()
            await asyncio.sleep(3 * CHECK_S)  # (the start hellos put the relays on until a check)
            assert [bridge.relaying for bridge, _, _ in replicas] == [False, False, False]
            for i in range(20):
                for _, live, _ in replicas:
                    live.publish("points", "ns", "a", {"i": i})
            await asyncio.sleep(0.3)
            heard.extend(n.payload for n in spy.notifies(timeout=0.2))
            assert [bridge.sent for bridge, _, _ in replicas] == [0, 0, 0]
            assert all(got == [] for _, _, got in replicas)
            for bridge, _, _ in replicas:
                await bridge.aclose()

    asyncio.run(run())
    assert heard == []


def test_a_stream_opened_on_b_switches_a_on_before_its_first_event_and_is_told_to_resync(database: Any) -> None:
    """A relays nothing until a stream opens on B. B holds the wants lock, greets, and the stream waits
    before its first event until A acked (A's listening thread is slow here: without the wait, A's first
    updates after the stream began are lost); the stream is then told to resync (what A published before
    A's relay went on is in the database only), and gets every update of A from then on, in order."""

    async def run() -> None:
        a, a_live, _ = _replica(database)
        b, b_live, b_got = _replica(database)
        await a.start()
        await b.start()
        assert await _until(lambda: not a.relaying and not b.relaying, timeout=5 * CHECK_S + 2)
        hear_hello = a._store.hello_handler
        assert hear_hello is not None

        def slowly(nonce: str) -> None:  # A's listening thread is busy when the hello comes
            time.sleep(0.2)
            hear_hello(nonce)

        a._store.hello_handler = slowly
        watcher = Watcher(b_live)
        assert await _until(lambda: watcher.events)  # its first event: after the acks
        for i in range(5):  # at once, before anything else runs on the loop
            a_live.publish("points", "ns", "a", {"i": i})
        assert a.relaying and b.wanting and not b.relaying
        assert await _until(lambda: len(watcher.relayed()) == 5), watcher.events
        assert watcher.relayed() == list(range(5)) and b_got == list(range(5))
        assert watcher.kinds()[:2] == ["retry: 2000", "event: resync"], watcher.kinds()
        await asyncio.sleep(3 * CHECK_S)  # A's checks find B's wants lock: A still relays
        assert a.relaying
        await watcher.close()
        await b.aclose()
        await a.aclose()

    _run(run)


def test_a_lone_replicas_stream_is_not_told_to_resync(database: Any) -> None:
    """Nobody else was there since the replica stopped wanting (or started): nothing was missed, and its
    first stream begins as on SQLite."""

    async def run() -> None:
        a, a_live, _ = _replica(database, grace_s=0.1)
        await a.start()
        for _ in range(2):  # its first stream, and one after a time it did not want
            watcher = Watcher(a_live)
            assert await _until(lambda w=watcher: w.events)  # type: ignore[misc]
            a_live.publish("points", "ns", "a", {"i": 1})
            assert await _until(lambda w=watcher: len(w.events) == 2)  # type: ignore[misc]
            assert watcher.kinds()[1].startswith("id: "), watcher.kinds()
            await watcher.close()
            assert await _until(lambda: not a.wanting)
        await a.aclose()

    _run(run)


def test_the_last_stream_leaving_switches_the_others_off_after_the_grace_period(database: Any) -> None:
    """B's last stream closes: B wants for the grace period (a reload finds it still wanting: no new
    greeting, no resync), then gives its lock back, A's relay goes off at its next check, and B drops what
    it still hears without decoding it."""

    async def run() -> None:
        a, a_live, _ = _replica(database)
        b, b_live, b_got = _replica(database, grace_s=0.5)
        c, c_live, _ = _replica(database)
        for bridge in (a, b, c):
            await bridge.start()
        first = Watcher(b_live)
        assert await _until(lambda: first.events)
        await first.close()
        reload = Watcher(b_live)  # within the grace period
        assert await _until(lambda: reload.events)
        a_live.publish("points", "ns", "a", {"i": 1})
        assert await _until(lambda: reload.relayed() == [1])
        assert reload.kinds() == ["retry: 2000", "id: " + reload.events[1].split("\n")[0][4:]], reload.kinds()
        await reload.close()
        assert b.wanting and a.relaying
        assert await _until(lambda: not b.wanting, timeout=2)
        assert await _until(lambda: not a.relaying and not c.relaying, timeout=5 * CHECK_S + 2)
        sent = a.sent
        for i in range(2, 7):
            a_live.publish("points", "ns", "a", {"i": i})
        await asyncio.sleep(0.3)
        assert a.sent == sent and b_got == [1]
        watcher = Watcher(c_live)  # C wants: A and B relay, B hears A's and drops them undecoded
        assert await _until(lambda: watcher.events)
        assert a.relaying and b.relaying
        for i in range(10, 15):
            a_live.publish("points", "ns", "a", {"i": i})
        assert await _until(lambda: watcher.relayed() == list(range(10, 15))), watcher.events
        assert await _until(lambda: b.ignored >= 1)
        assert b_got == [1]
        await watcher.close()
        for bridge in (a, b, c):
            await bridge.aclose()

    _run(run)


def test_a_resume_from_before_a_time_the_replica_did_not_want_is_told_to_resync(database: Any) -> None:
    """A client read B's stream up to an id, left; B stopped wanting and A published (relayed nowhere). A
    stream opens on B again (B wants from then on), then the client resumes with its old id: it is told to
    resync (without the resync point, B's ring has no gap and the client would never read A's update)."""

    async def run() -> None:
        a, a_live, _ = _replica(database)
        b, b_live, _ = _replica(database, grace_s=0.2)
        await a.start()
        await b.start()
        client = Watcher(b_live)
        assert await _until(lambda: client.events)
        b_live.publish("points", "ns", "b", {"j": 1})
        assert await _until(lambda: any(e.startswith("id: ") for e in client.events))
        last = int(next(e for e in client.events if e.startswith("id: ")).split("\n")[0][4:])
        await client.close()
        assert await _until(lambda: not b.wanting, timeout=2)
        assert await _until(lambda: not a.relaying, timeout=5 * CHECK_S + 2)
        a_live.publish("points", "ns", "a", {"i": 1})  # B never hears it
        other = Watcher(b_live)  # B wants again
        assert await _until(lambda: other.events and b.wanting and a.relaying)
        resumed = Watcher(b_live, last_event_id=last)
        assert await _until(lambda: len(resumed.events) >= 2)
        assert resumed.kinds()[1] == "event: resync", resumed.kinds()
        for watcher in (other, resumed):
            await watcher.close()
        await b.aclose()
        await a.aclose()

    _run(run)


def test_a_replica_that_leaves_lets_the_other_go_back_to_not_relaying(database: Any) -> None:
    """Within the check period: B's wants lock goes with its listening connection."""

    async def run() -> None:
        a, a_live, _ = _replica(database)
        b, b_live, _ = _replica(database)
        await a.start()
        await b.start()
        watcher = Watcher(b_live)
        assert await _until(lambda: watcher.events)
        a_live.publish("points", "ns", "a", {"i": 1})
        assert await _until(lambda: watcher.relayed() == [1])
        await asyncio.sleep(3 * CHECK_S)
        assert a.relaying
        b._store.close()  # its listening connection closes: its locks go
        assert await _until(lambda: not a.relaying, timeout=5 * CHECK_S + 2), "A still relays to nobody"
        await watcher.close()
        await b.aclose()
        await a.aclose()

    _run(run)


def test_a_replica_relays_while_its_listening_connection_is_down(database: Any) -> None:
    """Down, it cannot hear a hello nor tell who is there: it relays, across checks; back, and alone, it
    stops again."""

    async def run() -> None:
        a, _, _ = _replica(database)
        await a.start()
        assert not a.relaying
        store = a._store
        listener = store._listener
        connect = listener._connect

        def refused() -> Any:
            raise psycopg.OperationalError("the network is away (this test)")

        listener._connect = refused
        database.execute("SELECT pg_terminate_backend(?)", (listener.pid,))
        assert await _until(lambda: not store.listening)
        assert await _until(lambda: a.relaying), "a replica that cannot listen does not relay"
        await asyncio.sleep(3 * CHECK_S)
        assert a.relaying
        listener._connect = connect
        assert await _until(lambda: store.listening, timeout=10)
        assert await _until(lambda: not a.relaying, timeout=5 * CHECK_S + 2)
        await a.aclose()

    asyncio.run(run())


def test_a_hello_heard_during_a_check_is_not_undone_by_it(database: Any) -> None:
    """A check that read "alone" before a hello came does not take the relay off after it (the epoch)."""

    async def run() -> None:
        a, _, _ = _replica(database)
        await a.start()
        assert not a.relaying
        store = a._store
        reading = threading.Event()
        others_wanting = store.others_wanting

        def slow_alone() -> Any:  # what the check reads was true when read: nobody else
            found = others_wanting()
            reading.set()
            time.sleep(0.3)
            return found

        store.others_wanting = slow_alone
        assert await _until(reading.is_set, timeout=CHECK_S + 2)
        a._heard_hello("n1")  # during the check: the relay goes back on, and stays on after it
        assert await _until(lambda: a.relaying)
        await asyncio.sleep(0.4)
        assert a.relaying, "a check undid a hello heard while it ran"
        store.others_wanting = others_wanting
        await a.aclose()

    asyncio.run(run())


def test_a_store_without_a_bridge_answers_a_hello_at_once(database: Any) -> None:
    """A store whose server has no bridge yet (it is starting) acks for itself: the greeting of a replica
    whose first stream opens does not wait for the timeout."""

    async def run(took: list[float]) -> None:
        database.open()
        a, a_live, _ = _replica(database)
        a._hello_timeout_s = 30.0
        await a.start()
        started = time.monotonic()
        watcher = Watcher(a_live)
        assert await _until(lambda: watcher.events, timeout=40)
        took.append(time.monotonic() - started)
        await watcher.close()
        await a.aclose()

    took: list[float] = []
    _run(lambda: run(took))
    assert took[0] < 5.0


@pytest.mark.parametrize(
    "old",
    [
        '{"o":"older","b":[{"k":"points","ns":"ns","n":"x","d":{"i":7}}]}',  # as 4f3b46f's bridge packs it
        '{"o":"olderolder12","v":2,"b":[{"k":"points","ns":"ns","n":"x","d":{"i":7}}]}',  # as 3bde7f8's does
    ],
    ids=["before-presence", "before-wants"],
)
def test_a_live_update_of_an_older_replica_keeps_the_relay_on_for_a_while(database: Any, old: str) -> None:
    """A replica of an earlier version never holds the wants lock (a rolling upgrade): what it relays says it
    is there, even to a replica that wants nothing (which does not deliver it: nobody watches)."""

    async def run() -> None:
        a, a_live, a_got = _replica(database, older_s=1.0)
        await a.start()
        assert not a.relaying
        database.execute("SELECT pg_notify(?, ?)", (a._store.live_channel, old))
        assert await _until(lambda: a.relaying)
        await asyncio.sleep(3 * CHECK_S)
        assert a.relaying, "checks found nobody wanting, beside an older replica"
        assert a_got == []
        assert await _until(lambda: not a.relaying, timeout=1.0 + 5 * CHECK_S + 2)
        watcher = Watcher(a_live)
        assert await _until(lambda: watcher.events)
        database.execute("SELECT pg_notify(?, ?)", (a._store.live_channel, old))
        assert await _until(lambda: watcher.relayed() == [7] and a.relaying)
        await watcher.close()
        await a.aclose()

    _run(run)


def test_a_store_before_this_version_reads_a_hello_as_a_change_of_no_job() -> None:
    """A rolling upgrade: the older replicas' cache hears hellos and acks on the jobs channel; they forget
    no job (the cache is this version's, whose reading of changes did not change)."""
    cache = ReplicaCache("old")
    told: list[Any] = []
    cache.listeners.append(told.append)
    cache.on_listening(True)
    told.clear()
    for payload in ('{"o":"abc","hello":"n1"}', '{"o":"abc","ack":"n1","p":123}'):
        assert cache.on_changed(payload)
    assert told == [frozenset(), frozenset()]
