"""What a PostgreSQL replica spends to hear and tell the others: live notifications sent through a
connection of their own in one statement, and a listening thread that reads the notifications that come
together in one wake-up. Real PostgreSQL (see ``conftest.py``), each test in its own schema.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from stepwatch.server.store import StoreError

psycopg = pytest.importorskip("psycopg")

from stepwatch.server.store.postgres_notify import Listener  # noqa: E402


@pytest.fixture
def backend() -> str:
    return "postgres"


def _heard(store: Any) -> tuple[list[str], threading.Event, int]:
    """What a store's live handler hears, an event set when ``want`` payloads came (third: want)."""
    heard: list[str] = []
    done = threading.Event()
    want = 6

    def hear(payload: str) -> None:
        heard.append(payload)
        if len(heard) >= want:
            done.set()

    store.live_handlers.append(hear)
    return heard, done, want


def test_live_notifications_go_in_one_statement_on_a_connection_of_their_own(database: Any) -> None:
    """Each call of ``send_live`` is one statement (its own transaction, ``synchronous_commit`` off for that
    connection's session only); through a pooled connection it was a transaction of its own with a
    ``SET LOCAL`` (two statements, besides ``BEGIN`` and ``COMMIT``)."""
    sender, listener = database.open(), database.open()
    heard, done, _ = _heard(listener)
    sender.send_live(['{"o":"a","n":0}', '{"o":"a","n":1}'], time.time(), origin="a")
    counted = {"statements": 0}
    execute = psycopg.Connection.execute

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted["statements"] += 1
        return execute(self, *args, **kwargs)

    psycopg.Connection.execute = counting  # type: ignore[method-assign]
    try:
        sender.send_live(['{"o":"a","n":2}', '{"o":"a","n":3}'], time.time(), origin="a")
    finally:
        psycopg.Connection.execute = execute  # type: ignore[method-assign]
    assert counted["statements"] == 1
    assert sender._live_conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
    default = database.execute("SHOW synchronous_commit")[0]
    with sender._pool.connection() as pooled:  # the writes of reports wait for the disk as the database says
        assert pooled.execute("SHOW synchronous_commit").fetchone() == default
    sender.send_live(['{"o":"a","n":4}', '{"o":"a","n":5}'], time.time(), origin="a")
    assert done.wait(10), heard
    assert [int(p.split('"n":')[1].rstrip("}")) for p in heard] == list(range(6))


def test_live_notifications_go_on_after_their_connection_is_dropped(database: Any) -> None:
    """A dropped connection fails one call (a store error: the bridge sends that batch again) and the
    next call opens a new one."""
    sender, listener = database.open(), database.open()
    heard, done, want = _heard(listener)
    sender.send_live(['{"o":"a","n":0}'], time.time(), origin="a")
    pid = sender._live_conn.info.backend_pid
    database.execute("SELECT pg_terminate_backend(?)", (pid,))
    time.sleep(0.2)
    try:
        sender.send_live(['{"o":"a","n":1}'], time.time(), origin="a")
    except StoreError:
        sender.send_live(['{"o":"a","n":1}'], time.time(), origin="a")  # as the bridge does, a second later
    for n in range(2, want):
        sender.send_live([f'{{"o":"a","n":{n}}}'], time.time(), origin="a")
    assert sender._live_conn.info.backend_pid != pid
    assert done.wait(10), heard
    assert [int(p.split('"n":')[1].rstrip("}")) for p in heard] == list(range(want))


def test_notifications_that_come_together_are_read_in_one_wake_up(database: Any) -> None:
    """The listening thread rests a moment after what it read (``linger_s``): notifications sent one
    after the other within it are read together, in order, each handed over once; closing does not wait
    for the rest to end."""
    database.open()  # the schema
    got: list[str] = []
    done = threading.Event()

    def hear(payload: str) -> None:
        got.append(payload)
        if len(got) == 20:
            done.set()

    listener = Listener(
        lambda: psycopg.connect(database.url, autocommit=True), {"pg_test_linger": hear}, lambda _: None, linger_s=0.5
    )
    assert listener.start()
    try:
        with psycopg.connect(database.url, autocommit=True) as conn:
            for i in range(20):  # 20 transactions, each its notification
                conn.execute("SELECT pg_notify('pg_test_linger', %s)", (str(i),))
                time.sleep(0.005)
        assert done.wait(10)
        assert got == [str(i) for i in range(20)]
        assert listener.wakeups <= 3, listener.wakeups  # one a notification without resting
    finally:
        started = time.monotonic()
        listener.close()
        assert time.monotonic() - started < 0.4
