"""PostgreSQL's own: migrations that keep data, several replicas on one database (their caches, their
writes at once, the live view of each), and the server on a ``postgresql://`` URL.

The rest of the store's behaviour is tested on both stores by the ``both_stores`` suites. These run
on the real server of this machine (see ``conftest.py``): each test has its own schema.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from legacy_schemas import POSTGRES as MIGRATIONS

from stepwatch.protocol import Report
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.store import Store, StoreError

psycopg = pytest.importorskip("psycopg")

from stepwatch.server.store.migrations import SCHEMA_VERSION  # noqa: E402
from stepwatch.server.store.postgres import PostgresStore  # noqa: E402

MakeReport = Callable[..., dict[str, Any]]


@pytest.fixture
def backend() -> str:
    return "postgres"


@pytest.fixture
def fresh_url(postgres_schemas: Any) -> str:
    """An empty schema: no tables at all."""
    if postgres_schemas.admin is None:
        pytest.skip(postgres_schemas.problem)
    return str(postgres_schemas.url(postgres_schemas.fresh()))


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """``check()`` once it is true (notifications between processes take milliseconds, not zero)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


# ------------------------------------------------------------------------------------------ migrations


def test_an_empty_database_is_migrated_to_the_current_version(fresh_url: str) -> None:
    store = PostgresStore(fresh_url)
    try:
        job = store.register("ns", "a", token_hash="h", now=1.0)
        assert store.job_by_id(job.id) == job
    finally:
        store.close()
    with psycopg.connect(fresh_url) as conn:
        assert conn.execute("SELECT version FROM stepwatch_schema").fetchall() == [(SCHEMA_VERSION,)]
    again = PostgresStore(fresh_url)  # opening a current database changes nothing
    again.close()


def test_a_database_at_its_own_version_1_is_upgraded_and_keeps_its_data(
    fresh_url: str, report: Callable[..., Report]
) -> None:
    with psycopg.connect(fresh_url) as conn:  # what the first release of this store left behind
        conn.execute(MIGRATIONS[1])
        conn.execute("CREATE TABLE stepwatch_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO stepwatch_schema VALUES (1)")
        conn.execute(
            "INSERT INTO jobs (namespace, name, attempt, token_hash, state, created_at, updated_at, step, "
            "last_metrics) VALUES ('ns', 'old', 1, 'h', 'running', 0, 5, 40, '{\"loss\": \"NaN\"}')"
        )
        conn.execute(
            "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
            "SELECT 1, 'loss', i, i, 1.0 / i, 1.0 / i, 1.0 / i, 1.0 / i, 1, 0 FROM generate_series(1, 40) AS i"
        )
        conn.execute("INSERT INTO events (job_id, t, kind, message) VALUES (1, 0, 'registered', 'attempt 1')")
    store = PostgresStore(fresh_url)
    try:
        with psycopg.connect(fresh_url) as conn:
            assert conn.execute("SELECT version FROM stepwatch_schema").fetchall() == [(SCHEMA_VERSION,)]
            assert conn.execute("SELECT COUNT(*) FROM live_spill").fetchone() == (0,)  # version 2's table
        old = store.job("ns", "old")
        assert old is not None and old.step == 40 and str(old.last_metrics["loss"]) == "nan"
        assert [p.step for p in store.series(old.id, "loss")] == list(range(1, 41))
        assert [e.kind for e in store.events(job_id=old.id)] == ["registered"]
        # and it goes on from there: ids after the old rows, history after the old windows
        new = store.ingest_report(old, report(1, 41, {"loss": 0.01}), 6.0)
        assert new.job.step == 41 and len(store.series(old.id, "loss")) == 41
        assert store.register("ns", "next", token_hash="h", now=7.0).id == 2
    finally:
        store.close()


def test_a_database_at_its_own_version_2_gains_tokens_and_audit_and_keeps_its_data(fresh_url: str) -> None:
    from stepwatch.server.store import AuditEntry

    with psycopg.connect(fresh_url) as conn:  # what the release before access control left behind
        conn.execute(MIGRATIONS[1])
        conn.execute(MIGRATIONS[2])
        conn.execute("CREATE TABLE stepwatch_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO stepwatch_schema VALUES (2)")
        conn.execute(
            "INSERT INTO jobs (namespace, name, attempt, token_hash, state, created_at, updated_at, step) "
            "VALUES ('ns', 'old', 1, 'h', 'running', 0, 5, 40)"
        )
        conn.execute("INSERT INTO events (job_id, t, kind, message) VALUES (1, 0, 'registered', 'attempt 1')")
        conn.execute('INSERT INTO namespace_policies VALUES (\'ns\', \'{"on": {"stalled": "notify"}}\', 1)')
    store = PostgresStore(fresh_url)
    try:
        old = store.job("ns", "old")
        assert old is not None and old.step == 40 and store.token_hash(old.id) == "h"
        assert [e.kind for e in store.events(job_id=old.id)] == ["registered"]
        assert store.namespace_policies() == {"ns": {"on": {"stalled": "notify"}}}
        store.add_command(old, "stop", "done", 6.0, "user:ann")
        store.record_audit(AuditEntry(7.0, "admin", "token_created"))
        assert [(e.actor, e.action) for e in store.audit_log()] == [("user:ann", "stop"), ("admin", "token_created")]
        assert store.api_tokens() == []
    finally:
        store.close()
    with psycopg.connect(fresh_url) as conn:
        assert conn.execute("SELECT version FROM stepwatch_schema").fetchall() == [(SCHEMA_VERSION,)]


def test_a_revocation_on_one_replica_is_seen_at_once_by_another(database: Any) -> None:
    from stepwatch.server.api.auth import mint_token
    from stepwatch.server.api.request import hash_token
    from stepwatch.server.store import AuditEntry

    a, b = database.open(), database.open()
    token, secret = mint_token("viewer", ("a",), "t", 100.0)
    a.create_token(token, hash_token(secret), AuditEntry(100.0, "test", "token_created"))
    digest = hash_token(secret)
    assert b.api_token(digest) is not None
    assert b.cached_api_token(digest) is None  # never from memory: every request reads the database
    a.revoke_token(token.id, 200.0, AuditEntry(200.0, "admin", "token_revoked"))
    # no waiting for a notification: the very next read on b, right after a's commit, is revoked
    assert b.api_token(digest).revoked_at == 200.0  # type: ignore[union-attr]


def test_a_database_newer_than_the_server_is_refused(fresh_url: str) -> None:
    PostgresStore(fresh_url).close()
    with psycopg.connect(fresh_url) as conn:
        conn.execute("UPDATE stepwatch_schema SET version = version + 1")
    with pytest.raises(StoreError, match="newer than this server"):
        PostgresStore(fresh_url)


def test_an_unreachable_server_is_a_store_error_without_the_password() -> None:
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"cannot open the database postgresql://sw@127\.0\.0\.1:1/db") as caught:
        PostgresStore("postgresql://sw:hunter2@127.0.0.1:1/db", connect_timeout_s=2)
    assert "hunter2" not in str(caught.value) and time.monotonic() - started < 10


def test_a_url_opens_the_postgresql_store_and_the_cli_shows_it_without_its_password() -> None:
    settings = ServerSettings(database_url="postgresql://sw:hunter2@db.example:5433/stepwatch")
    assert settings.postgres_url() == "postgresql://sw:hunter2@db.example:5433/stepwatch"
    assert settings.database_shown() == "postgresql://sw:***@db.example:5433/stepwatch"
    assert ServerSettings(database_url="sqlite:///x.db").postgres_url() is None


# ------------------------------------------------------------------------------------------ replicas


def test_a_replica_sees_what_another_wrote_through_its_cache(database: Any, report: Callable[..., Report]) -> None:
    a, b = database.open(), database.open()
    job = a.register("ns", "a", token_hash="h1", now=1.0)
    # b reads it, and caches it (once a's notification of the registration has come: a read before it may be old)
    assert eventually(lambda: b.job("ns", "a") == job and b.cached_job("ns", "a") == job)
    moved = a.ingest_report(job, report(1, 7, {"loss": 0.5}), 2.0).job
    assert eventually(lambda: b.job("ns", "a") == moved), "b still serves the job as it was"
    assert b.job_by_id(job.id) == moved
    a.set_state(moved, "finished", 3.0)
    second = a.register("ns", "a", token_hash="h2", now=4.0)  # a new attempt: the name's latest moves
    assert eventually(lambda: getattr(b.job("ns", "a"), "id", None) == second.id)
    assert b.token_hash(second.id) == "h2"
    # b's own write, then a's: b never caches its older view over a's newer one
    b.set_estimate(second.id, 10.0, 1.0, 5.0)
    a.set_health(second.id, "stalled", 5.0, {"message": "no progress"}, 6.0)
    assert eventually(lambda: (j := b.job_by_id(second.id)) is not None and j.health == "stalled")
    assert b.job_by_id(second.id).eta_seconds == 10.0  # type: ignore[union-attr]


def test_a_replica_whose_listening_connection_drops_stops_trusting_its_cache(database: Any) -> None:
    a, b = database.open(), database.open()
    job = a.register("ns", "a", token_hash="h", now=1.0)
    assert eventually(lambda: b.job("ns", "a") == job and b.cached_job("ns", "a") is not None)
    with psycopg.connect(database.url, autocommit=True) as admin:  # the network drops the listeners
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN%%' "
            "AND pid <> pg_backend_pid() AND datname = current_database() AND %s = ANY(current_schemas(false))",
            (database.url.split("search_path%3D")[1].split("%20")[0],),
        )
    assert eventually(lambda: b.cached_job("ns", "a") is None), "a cache that may be stale is still served"
    a.set_health(job.id, "stalled", 2.0, {}, 2.0)  # written while b may not hear of it
    assert eventually(lambda: (j := b.job("ns", "a")) is not None and j.health == "stalled")
    # listening again: what it reads is cached again
    assert eventually(lambda: b.job("ns", "a") is not None and b.cached_job("ns", "a") is not None)


def test_two_replicas_writing_the_same_jobs_at_once_lose_nothing(database: Any, report: Callable[..., Report]) -> None:
    from stepwatch.server.store import PendingReport

    replicas: list[Store] = [database.open(), database.open()]
    jobs = [replicas[0].register("ns", f"j{i}", token_hash="h", now=0.0) for i in range(4)]
    errors: list[BaseException] = []

    def ingest(which: int) -> None:
        store = replicas[which]
        try:
            for seq in range(1, 61):
                # each replica writes every job, in opposite orders: row locks taken in id order never deadlock
                order = jobs if which == 0 else list(reversed(jobs))
                batch = [
                    PendingReport(job, report(seq, seq, {"loss": 1.0 / seq}, rank=which, world_size=2), seq)
                    for job in order
                ]
                for result in store.ingest_reports(batch):
                    assert not isinstance(result, StoreError), result
                store.add_command(jobs[seq % 4], "checkpoint", f"{which}-{seq}", float(seq))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ingest, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    for job in jobs:
        assert len(replicas[0].series(job.id, "loss")) == 120  # 60 from each replica
        stored = replicas[1].job_by_id(job.id)
        assert stored is not None and stored.state == "running" and stored.step == 60
    events = replicas[0].events(limit=10_000)
    assert [e.id for e in events] == list(range(1, len(events) + 1))  # no gap: ids committed in order
    assert sum(e.kind == "command" for e in events) == 120


class SseReader:
    """One live stream read in a thread: every event, parsed."""

    def __init__(self, base: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._open = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(base,), daemon=True)
        self._thread.start()
        assert self._open.wait(5), "the stream did not open"

    def _run(self, base: str) -> None:
        try:
            with httpx.Client(base_url=base, timeout=10) as http, http.stream("GET", "/api/v1/events") as response:
                kind = ""
                for line in response.iter_lines():
                    if self._stop.is_set():
                        return
                    if line.startswith("retry:"):
                        self._open.set()
                    elif line.startswith("event:"):
                        kind = line.partition(":")[2].strip()
                    elif line.startswith("data:"):
                        self.events.append((kind, json.loads(line.partition(":")[2])))
        except httpx.HTTPError:
            pass  # the server stopped at the end of the test

    def close(self) -> None:
        self._stop.set()


def test_a_report_ingested_by_one_replica_is_live_on_another(
    database: Any, clock: Any, make_report: MakeReport, serve: Callable[..., Any]
) -> None:
    app_a = create_app(store=database.open(), clock=clock)
    app_b = create_app(store=database.open(), clock=clock)
    with serve(app_a) as base_a, serve(app_b) as base_b:
        stream = SseReader(base_b)
        try:
            with httpx.Client(base_url=base_a, timeout=10) as http:
                made = http.post("/api/v1/namespaces/team/jobs", json={"name": "shared", "total_steps": 100})
                token = made.json()["token"]
                metrics = {"loss": 0.25} | {f"eval/metric_{i:03d}": float(i) for i in range(250)}  # > 8 kB
                sent = http.post(
                    "/api/v1/namespaces/team/jobs/shared/reports",
                    json=make_report(1, 42, metrics, total_steps=100),
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert sent.status_code == 200, sent.text

            def seen(kind: str) -> list[dict[str, Any]]:
                return [data for k, data in stream.events if k == kind and data.get("name") == "shared"]

            assert eventually(lambda: any(d["job"]["progress"]["step"] == 42 for d in seen("job"))), stream.events
            assert eventually(lambda: seen("points")), stream.events
            points = seen("points")[0]["points"]
            assert points["loss"]["last"] == 0.25 and len(points) == 251  # the large one came through the table
            assert eventually(lambda: any(d.get("kind") == "running" for d in seen("event"))), stream.events
            # and B serves the job as A wrote it
            job = httpx.get(f"{base_b}/api/v1/namespaces/team/jobs/shared").json()
            assert job["progress"]["step"] == 42
        finally:
            stream.close()


@pytest.mark.slow
def test_the_server_runs_on_a_postgresql_url(database: Any, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "stepwatch", "server", "--database-url", database.url, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        assert eventually(lambda: _answers(f"{base}/healthz"), timeout=20), log.read_text()
        made = httpx.post(f"{base}/api/v1/namespaces/default/jobs", json={"name": "pg"})
        assert made.status_code == 201
        assert database.open().job("default", "pg") is not None
    finally:
        process.terminate()
        process.wait(10)
    assert "(database postgresql://root@127.0.0.1" in log.read_text()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_live_updates_reach_the_other_replicas_in_the_order_sent(database: Any) -> None:
    """A batch of live updates, small ones and ones over a notification's 8,000 bytes (through the spill
    table) mixed, is heard by another replica in the order it was sent, each once."""
    sender, listener = database.open(), database.open()
    heard: list[str] = []
    done = threading.Event()

    def hear(payload: str) -> None:
        heard.append(payload)
        if len(heard) == 40:
            done.set()

    listener.live_handlers.append(hear)
    payloads = [json.dumps({"o": "a", "n": i, "pad": "x" * (9000 if i % 7 == 3 else 10)}) for i in range(40)]
    sender.send_live(payloads[:25], time.time(), origin="a")
    sender.send_live(payloads[25:], time.time(), origin="a")
    assert done.wait(10), f"heard {len(heard)} of 40"
    read = [json.loads(p) for p in heard]
    spilled = [m for m in read if "spill" in m]
    assert len(spilled) == len([i for i in range(40) if i % 7 == 3])
    restored = [json.loads(sender.read_spill(m["spill"])) if "spill" in m else m for m in read]
    assert [m["n"] for m in restored] == list(range(40))


def test_a_batch_is_written_as_sqlite_writes_it_one_report_after_another(
    database: Any, report: Callable[..., Report], tmp_path: Path
) -> None:
    """A batch goes to PostgreSQL in as few statements as its ranks allow (a rank's reports in later ones
    than its report before): the answers, the series and the jobs are those of SQLite, which writes a batch
    report after report."""
    from stepwatch.server.store import IngestResult, PendingReport, SQLiteStore

    def write(store: Store) -> tuple[list[tuple[bool, int | None]], list[tuple[int, str]], list[Any]]:
        a, b = (store.register("ns", name, token_hash="h", now=1.0) for name in ("a", "b"))
        batch = [
            PendingReport(a, report(1, 10, {"loss": 1.0, "acc": 0.1}), 2.0),
            PendingReport(b, report(1, 10, {"loss": 2.0}, rank=1, world_size=2), 2.0),
            PendingReport(a, report(3, 30, {"loss": 0.8}), 3.0),  # the same rank: a later statement
            PendingReport(b, report(1, 11, {"loss": 2.1}), 3.0),  # rank 0 of b, beside b's rank 1
            PendingReport(a, report(2, 20, {"loss": 0.9}), 4.0),  # older than seq 3: history only
            PendingReport(a, report(3, 30, {"loss": 0.8}), 5.0),  # a retry: a duplicate
        ]
        results = store.ingest_reports(batch)
        assert all(isinstance(r, IngestResult) for r in results), results
        answers = [(r.duplicate, r.job.step) for r in results if isinstance(r, IngestResult)]
        series = [(p.step, name) for job in (a, b) for name in ("loss", "acc") for p in store.series(job.id, name)]
        jobs = [store.job_by_id(job.id) for job in (a, b)]
        return answers, series, [(j.step, j.state, dict(j.last_metrics)) for j in jobs if j]

    assert write(database.open()) == write(SQLiteStore(tmp_path / "sqlite.db"))


def test_a_replicas_live_updates_share_notifications_in_order(database: Any) -> None:
    """The bridge packs a batch of updates into as few notifications as fit (an update over the limit alone,
    through the spill table); another replica's bridge delivers each once, in the order published."""
    import asyncio

    from stepwatch.server.live.broadcaster import Broadcaster
    from stepwatch.server.live.replicas import ReplicaBridge

    async def run() -> list[int]:
        sender_store, receiver_store = database.open(), database.open()
        sender = ReplicaBridge(sender_store, Broadcaster())
        receiver_live = Broadcaster()
        receiver = ReplicaBridge(receiver_store, receiver_live)
        got: list[int] = []
        await sender.start()
        await receiver.start()
        watching = receiver_live.stream()  # the receiver relays to nobody, and hears nobody, unless watched
        await watching.__anext__()  # (begins once the sender relays)
        original = receiver_live.publish

        def publish(kind: str, namespace: str, name: str, data: dict[str, Any], *, relayed: bool = False) -> Any:
            got.append(int(data["i"]))
            return original(kind, namespace, name, data, relayed=relayed)

        receiver_live.publish = publish  # type: ignore[method-assign]
        packed = sender._packed([json.dumps({"i": i, "pad": "x" * 300}) for i in range(60)])
        assert 1 < len(packed) < 10 and all(len(p.encode()) <= sender_store.notify_limit for p in packed)
        for i in range(60):
            sender._live.publish("points", "ns", "a", {"i": i, "pad": "x" * (9000 if i == 17 else 300)})
        deadline = time.monotonic() + 10
        while len(got) < 60 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await watching.aclose()
        await sender.aclose()
        await receiver.aclose()
        return got

    assert asyncio.run(run()) == list(range(60))
