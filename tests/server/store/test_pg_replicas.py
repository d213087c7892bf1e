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


def test_a_wake_up_reads_every_notification_that_came_not_only_one_buffer(database: Any) -> None:
    """Many large notifications at once (more than the driver reads in one go): one wake-up hands them all
    over, however long the thread then rests; reading one buffer a wake-up, a busy database's notifications
    queued up faster than they were read (measured: half of 3 replicas' live updates not heard in time)."""
    database.open()  # the schema
    got: list[str] = []
    done = threading.Event()

    def hear(payload: str) -> None:
        got.append(payload)
        if len(got) == 200:
            done.set()

    listener = Listener(
        lambda: psycopg.connect(database.url, autocommit=True), {"pg_test_drain": hear}, lambda _: None, linger_s=1.0
    )
    assert listener.start()
    try:
        with psycopg.connect(database.url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_notify('pg_test_drain', n::text || repeat('x', 6900)) FROM generate_series(0, 199) AS n"
            )
        assert done.wait(8), f"heard {len(got)} of 200 in {listener.wakeups} wake-ups"
        assert [int(p.rstrip("x")) for p in got] == list(range(200))
        assert listener.wakeups <= 4, listener.wakeups
    finally:
        listener.close()


# ------------------------------------------------------------------- the jobs a batch wrote, not decoded


def _decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the job rows the PostgreSQL batch writer decodes (one entry a row)."""
    from stepwatch.server.store import postgres_ingest

    decoded: list[int] = []
    original = postgres_ingest.job_from_row

    def counting(row: tuple[Any, ...]) -> Any:
        decoded.append(1)
        return original(row)

    monkeypatch.setattr(postgres_ingest, "job_from_row", counting)
    return decoded


def test_a_batch_takes_the_job_it_wrote_last_and_decodes_a_row_another_write_changed(
    database: Any, make_report: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job row still as this store's last batch wrote it (its version, ``xmin``, unchanged) is not decoded
    again; a row another replica wrote since, or another write of this store, is, and what that write
    changed is seen."""
    from stepwatch.protocol import Report
    from stepwatch.server.store import IngestResult, PendingReport

    a, b = database.open(), database.open()
    job = a.register("ns", "memo", token_hash="h", now=1.0)

    def ingest(seq: int, now: float) -> Any:
        body = make_report(seq, seq * 10, {"loss": 1.0 / seq, "acc": float("nan")}, params={f"p{seq}": seq})
        (result,) = a.ingest_reports([PendingReport(job, Report.from_dict(body), now)])
        assert isinstance(result, IngestResult), result
        return result.job

    ingest(1, 2.0)
    decoded = _decodes(monkeypatch)
    second = ingest(2, 3.0)
    assert decoded == []  # the row is as the first batch wrote it
    assert repr(second) == repr(database.open().job_by_id(job.id))  # what a fresh read decodes
    b.set_health(job.id, "stalled", 3.5, {"message": "no progress"}, 3.5)  # another replica writes the row
    third = ingest(3, 4.0)
    assert decoded == [1] and third.health == "stalled" and third.step == 30
    ingest(4, 5.0)
    assert decoded == [1]
    a.set_estimate(job.id, 10.0, 1.0, 5.5)  # this store, but not a batch: decoded again
    fifth = ingest(5, 6.0)
    assert decoded == [1, 1] and fifth.eta_seconds is not None
    assert repr(fifth) == repr(database.open().job_by_id(job.id))


def test_batches_taking_the_jobs_they_wrote_leave_the_jobs_a_fresh_read_gives(database: Any, make_report: Any) -> None:
    """Random batches (several ranks, late and duplicate reports, non-finite values, growing params) of
    jobs that only one store writes: each batch's jobs are those a fresh store reads from the database."""
    import random

    from stepwatch.protocol import Report
    from stepwatch.server.store import IngestResult, PendingReport

    rng = random.Random(31)
    store = database.open()
    jobs = [store.register("ns", f"j{i}", token_hash="h", now=1.0) for i in range(4)]
    seqs = {(j.id, r): 0 for j in jobs for r in (0, 1)}
    for n in range(25):
        batch = []
        for job in rng.sample(jobs, rng.randint(1, 4)):
            rank = rng.choice((0, 0, 1))
            seq = seqs[(job.id, rank)] = seqs[(job.id, rank)] + rng.choice((1, 1, 1, 0, -1))  # 0: a retry
            value = rng.choice((rng.random(), float("nan"), float("inf")))
            body = make_report(
                max(seq, 0),
                max(seq, 0) * 5,
                {"loss": value, f"m{rng.randint(0, 5)}": rng.random()},
                rank=rank,
                world_size=2,
                params={f"p{rng.randint(0, 3)}": n} if rng.random() < 0.3 else None,
            )
            batch.append(PendingReport(job, Report.from_dict(body), 2.0 + n))
        results = store.ingest_reports(batch)
        assert all(isinstance(r, IngestResult) for r in results), results
        fresh = database.open()
        for job in jobs:
            assert repr(store.job_by_id(job.id)) == repr(fresh.job_by_id(job.id))
        fresh.close()
