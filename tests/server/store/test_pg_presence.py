"""A replica relays its live updates only while another replica is there (``live/replicas.py``, its module
docstring): alone it sends nothing; a replica that starts later hears every update of the others from the
moment its start returns; one that leaves lets the other go back to alone; a replica whose listening
connection is down relays. Real PostgreSQL (see ``conftest.py``), each test in its own schema.
"""

from __future__ import annotations

import asyncio
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
    live = Broadcaster()
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


def test_a_replica_that_starts_later_hears_every_update_from_its_start_on(database: Any) -> None:
    """A is alone (no relay) when B starts. From the moment B's start returns, every update published on
    either reaches the other: A put its relay back before it answered B's hello, and B waited for that
    answer (without the wait, A's first updates after B's start are lost)."""

    async def run() -> None:
        a, a_live, a_got = _replica(database)
        await a.start()
        assert not a.relaying
        hear_hello = a._store.hello_handler
        assert hear_hello is not None

        def slowly(nonce: str) -> None:  # A's listening thread is busy when the hello comes
            time.sleep(0.2)
            hear_hello(nonce)

        a._store.hello_handler = slowly
        b, b_live, b_got = _replica(database)
        await b.start()
        for i in range(5):  # at once, before anything else runs on the loop
            a_live.publish("points", "ns", "a", {"i": i})
            b_live.publish("points", "ns", "b", {"i": 100 + i})
        assert a.relaying and b.relaying
        assert await _until(lambda: len(a_got) == 5 and len(b_got) == 5), (a_got, b_got)
        assert b_got == list(range(5)) and a_got == list(range(100, 105))
        await asyncio.sleep(3 * CHECK_S)  # the checks find each other: both still relay
        assert a.relaying and b.relaying
        await b.aclose()
        await a.aclose()

    asyncio.run(run())


def test_a_replica_that_leaves_lets_the_other_go_back_to_alone(database: Any) -> None:
    """Within the check period (what A heard from B, of this version, does not keep A relaying)."""

    async def run() -> None:
        a, _, a_got = _replica(database)
        b, b_live, _ = _replica(database)
        await a.start()
        await b.start()
        assert a.relaying and b.relaying
        b_live.publish("points", "ns", "b", {"i": 1})
        assert await _until(lambda: a_got == [1])
        await asyncio.sleep(3 * CHECK_S)
        assert a.relaying
        await b.aclose()
        b._store.close()  # its listening connection closes: its lock goes
        assert await _until(lambda: not a.relaying, timeout=5 * CHECK_S + 2), "A still relays alone"
        await a.aclose()

    asyncio.run(run())


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
        others_present = store.others_present

        def slow_alone() -> Any:  # what the check reads was true when read: nobody else
            found = others_present()
            reading.set()
            time.sleep(0.3)
            return found

        store.others_present = slow_alone
        assert await _until(reading.is_set, timeout=CHECK_S + 2)
        a._heard_hello("n1")  # during the check: the relay goes back on, and stays on after it
        assert await _until(lambda: a.relaying)
        await asyncio.sleep(0.4)
        assert a.relaying, "a check undid a hello heard while it ran"
        store.others_present = others_present
        await a.aclose()

    asyncio.run(run())


def test_a_store_without_a_bridge_answers_a_hello_at_once(database: Any) -> None:
    """A store whose server has no bridge yet (it is starting) acks for itself: the starting bridge does not
    wait for the timeout."""

    async def run() -> float:
        database.open()
        a, _, _ = _replica(database)
        a._hello_timeout_s = 30.0
        started = time.monotonic()
        await a.start()
        took = time.monotonic() - started
        assert a.relaying
        await a.aclose()
        return took

    assert asyncio.run(run()) < 5.0


def test_a_live_update_of_an_older_replica_keeps_the_relay_on_for_a_while(database: Any) -> None:
    """A replica of an earlier version holds no lock (a rolling upgrade): what it relays says it is there."""

    async def run() -> None:
        a, _, a_got = _replica(database, older_s=1.0)
        await a.start()
        assert not a.relaying
        old = '{"o":"older","b":[{"k":"points","ns":"ns","n":"x","d":{"i":7}}]}'  # as 4f3b46f's bridge packs it
        database.execute("SELECT pg_notify(?, ?)", (a._store.live_channel, old))
        assert await _until(lambda: a.relaying and a_got == [7])
        await asyncio.sleep(3 * CHECK_S)
        assert a.relaying, "checks found A alone by the lock, beside an older replica"
        assert await _until(lambda: not a.relaying, timeout=1.0 + 5 * CHECK_S + 2)
        await a.aclose()

    asyncio.run(run())


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
