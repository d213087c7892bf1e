"""The store on real databases: records, idempotency, order, commands, events, listing, non-finite
values, persistence, caches across processes — on SQLite and on PostgreSQL (``both_stores``) — then,
SQLite's own: WAL, a SIGKILLed server, a locked database and storage that cannot be used."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwatch.protocol import Report, TrainerStatus
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.store import IngestResult, JobFilter, PendingReport, SQLiteStore, Store, StoreError
from stepwatch.server.store.migrations import SCHEMA_VERSION
from stepwatch.testing import wait_for

MakeReport = Callable[..., dict[str, Any]]
pytestmark = pytest.mark.both_stores


def test_register_creates_attempts_and_refuses_a_live_name(store: Store) -> None:
    job = store.register(
        "team",
        "a",
        token_hash="h1",
        now=10.0,
        total_steps=100,
        total_epochs=3.0,
        params={"lr": 0.1},
        gpus=2.0,
        gpu_hour_cost=3.5,
        source="runner",
    )
    assert (job.namespace, job.name, job.attempt, job.state) == ("team", "a", 1, "pending")
    assert (job.created_at, job.updated_at, job.started_at, job.finished_at) == (10.0, 10.0, None, None)
    assert (job.total_steps, job.total_epochs, job.params, job.gpus, job.gpu_hour_cost, job.source) == (
        100,
        3.0,
        {"lr": 0.1},
        2.0,
        3.5,
        "runner",
    )
    assert store.token_hash(job.id) == "h1" and store.token_hash(10_000) == ""
    with pytest.raises(KeyError):
        store.register("team", "a", token_hash="h2", now=11.0)
    assert store.register("other", "a", token_hash="h3", now=11.0).attempt == 1
    ended = store.set_state(job, "failed", 12.0, "oom", exit_code=137)
    assert (ended.state, ended.reason, ended.exit_code, ended.finished_at) == ("failed", "oom", 137, 12.0)

    second = store.register("team", "a", token_hash="h2", now=13.0)
    assert second.attempt == 2 and second.id != job.id and store.token_hash(second.id) == "h2"
    assert store.job("team", "a") == second
    assert store.job("team", "a", 1) == ended and store.job_by_id(job.id) == ended
    assert store.job("team", "a", 3) is None and store.job("team", "zz") is None and store.job_by_id(999) is None
    assert [e.kind for e in store.events(job_id=job.id)] == ["registered", "failed"]
    assert store.events(job_id=job.id)[-1].data == {"exit_code": 137}


def test_supersede_ends_the_live_attempt(store: Store) -> None:
    job = store.register("team", "a", token_hash="h1", now=10.0)
    second = store.register("team", "a", token_hash="h2", now=11.0, supersede=True)
    assert second.attempt == 2
    old = store.job("team", "a", 1)
    assert old is not None and (old.state, old.reason, old.finished_at) == ("failed", "superseded by attempt 2", 11.0)
    assert [e.kind for e in store.events(job_id=job.id)] == ["registered", "failed"]


def test_tokens_are_stored_only_as_hashes(store: Store, database: Any) -> None:
    from starlette.testclient import TestClient

    with TestClient(create_app(ServerSettings(allowed_hosts=("testserver",)), store=store)) as client:
        token = client.post("/api/v1/namespaces/default/jobs", json={"name": "secret"}).json()["token"]
    if database.backend == "sqlite":
        assert token.encode() not in database.path.read_bytes()
    [(stored,)] = database.execute("SELECT token_hash FROM jobs")
    assert stored == hashlib.sha256(token.encode()).hexdigest()
    found = database.execute("SELECT COUNT(*) FROM jobs WHERE token_hash = ? OR params LIKE ?", (token, f"%{token}%"))
    assert found == [(0,)]


def test_a_report_is_stored_once(store: Store, report: Callable[..., Report]) -> None:
    job = store.register("ns", "a", token_hash="h", now=10.0)
    first = store.ingest_report(job, report(1, 5, {"loss": 0.5}, total_steps=50), 20.0)
    assert not first.duplicate and [w.name for w in first.new_points] == ["loss"]
    assert (first.job.state, first.job.started_at, first.job.step, first.job.total_steps) == ("running", 20.0, 5, 50)
    assert first.job.last_report_at == 20.0 and first.job.last_metrics == {"loss": 0.5}
    again = store.ingest_report(first.job, report(1, 5, {"loss": 0.5}, total_steps=50), 21.0)
    assert again.duplicate and again.new_points == ()
    assert len(store.series(job.id, "loss")) == 1
    assert [(s.t, s.step) for s in store.progress_samples(job.id)] == [(20.0, 5)]
    assert store.job_by_id(job.id) == first.job  # nothing moved, not even the report time
    assert [e.kind for e in store.events(job_id=job.id)] == ["registered", "running"]


def test_an_older_report_is_history_only(store: Store, report: Callable[..., Report]) -> None:
    job = store.register("ns", "a", token_hash="h", now=10.0)
    job = store.ingest_report(job, report(2, 50, {"loss": 0.2}, sent_at=200.0, total_steps=100), 20.0).job
    late = store.ingest_report(job, report(1, 40, {"loss": 0.3}, sent_at=190.0, total_steps=100), 21.0)
    assert not late.duplicate and late.job.step == 50
    assert [(p.step, p.last) for p in store.series(job.id, "loss")] == [(40, 0.3), (50, 0.2)]
    # a heartbeat of rank 1 never moves rank 0's progress
    beat = store.ingest_report(late.job, report(1, 70, run_id="run-1", rank=1, world_size=2, sent_at=300.0), 22.0)
    assert beat.job.step == 50 and beat.job.world_size == 1
    assert [s.step for s in store.progress_samples(job.id)] == [50]  # the late report is not a progress sample


def test_an_older_report_does_not_change_the_estimate(api: Any, make_report: MakeReport) -> None:
    token = api.register("late", total_steps=100)
    for seq in (1, 2, 3):
        api.clock.advance(10)
        api.report_ok("late", token, make_report(seq, 10 * seq, {"loss": 1.0}, sent_at=100.0 + 10 * seq))
    before = api.job("late")
    api.report_ok("late", token, make_report(4, 25, {"loss": 1.0}, sent_at=125.0))  # sent before seq 3
    after = api.job("late")
    assert after["progress"] == before["progress"]
    assert after["eta"] == before["eta"]


def test_commands_are_pending_until_acknowledged_by_their_own_job(store: Store, report: Callable[..., Report]) -> None:
    job = store.register("ns", "a", token_hash="h", now=10.0)
    other = store.register("ns", "b", token_hash="h", now=10.0)
    stop = store.add_command(job, "stop", "plateau", 11.0)
    checkpoint = store.add_command(job, "checkpoint", "", 12.0)
    foreign = store.add_command(other, "stop", "", 12.0)
    assert store.pending_commands(job.id) == [stop, checkpoint]
    result = store.ingest_report(job, report(1, 1), 13.0)
    assert result.commands == (stop, checkpoint)
    result = store.ingest_report(result.job, report(2, 2, acks=[stop.id, foreign.id, "unknown-id"]), 14.0)
    assert result.commands == (checkpoint,)
    assert store.pending_commands(other.id) == [foreign]  # another job's id does not acknowledge it
    result = store.ingest_report(result.job, report(3, 3, acks=[stop.id, checkpoint.id]), 15.0)
    assert result.commands == () and store.pending_commands(job.id) == []
    kinds = [(e.kind, e.data.get("id"), e.t) for e in store.events(job_id=job.id)]
    assert kinds == [
        ("registered", None, 10.0),
        ("command", stop.id, 11.0),
        ("command", checkpoint.id, 12.0),
        ("running", None, 13.0),
        ("command_acked", stop.id, 14.0),
        ("command_acked", checkpoint.id, 15.0),
    ]
    assert store.events(job_id=job.id)[1].message == "stop requested: plateau"


def test_events_page_by_id_and_filter_by_job_and_namespace(store: Store) -> None:
    a = store.register("team-a", "x", token_hash="h", now=1.0)
    b = store.register("team-b", "y", token_hash="h", now=2.0)
    store.add_command(a, "stop", "", 3.0)
    store.add_command(b, "stop", "", 4.0)
    everything = store.events()
    assert [(e.namespace, e.name, e.kind) for e in everything] == [
        ("team-a", "x", "registered"),
        ("team-b", "y", "registered"),
        ("team-a", "x", "command"),
        ("team-b", "y", "command"),
    ]
    ids = [e.id for e in everything]
    assert ids == sorted(ids)
    assert store.events(after=ids[1], limit=1) == [everything[2]]
    assert store.events(namespace="team-b") == [everything[1], everything[3]]
    assert store.events(job_id=a.id, after=ids[0]) == [everything[2]]
    assert store.events(after=ids[-1]) == []


def test_a_write_gives_the_events_it_appended_as_they_are_read_back(
    store: Store, report: Callable[..., Report]
) -> None:
    """What the live stream sends: the events of one write, with their ids, equal to the stored ones."""
    job = store.register("default", "told", token_hash="h", now=1.0)
    command, commanded = store.with_events(store.add_command, job, "stop", "plateau", 2.0, "user:ann")
    assert isinstance(command.id, str) and [e.kind for e in commanded] == ["command"]
    ingested = store.ingest_report(job, report(1, 5, acks=[command.id]), 3.0)
    assert [e.kind for e in ingested.events] == ["command_acked", "running"]
    again = store.ingest_report(job, report(2, 6), 4.0)
    assert again.events == ()  # most reports append nothing
    (fired, queued), acted = store.with_events(
        store.act, job.id, "plateau", {"t": 5.0, "action": "stop"}, "stopping", (("checkpoint", "first"),), 5.0
    )
    assert [e.kind for e in acted] == ["policy", "command"] and queued[0].id == acted[1].data["id"]
    ended, final = store.with_events(store.set_state, fired, "finished", 6.0, "done", 0)
    assert ended.state == "stopped" and [e.kind for e in final] == ["stopped"]
    _, nothing = store.with_events(store.set_state, ended, "finished", 7.0, "done", 0)
    assert nothing == []
    written = [*commanded, *ingested.events, *acted, *final]
    assert written == [e for e in store.events(job_id=job.id) if e.kind != "registered"]


def test_jobs_filter_sort_and_count(store: Store, report: Callable[..., Report]) -> None:
    made = {}
    for i, (namespace, name, total, step) in enumerate(
        [("a", "one", 100, 90), ("a", "two", 10, 1), ("b", "three", None, None), ("b", "four", 50, 25)]
    ):
        job = store.register(namespace, name, token_hash="h", now=float(i), total_steps=total)
        if step is not None:
            job = store.ingest_report(job, report(1, step), 10.0 + i).job
        made[name] = job

    def names(**where: Any) -> list[str]:
        return [j.name for j in store.jobs(JobFilter(**where))]

    assert names() == ["four", "two", "one", "three"]  # most recently updated first
    assert names(sort="progress", descending=True) == ["one", "four", "two", "three"]  # unknown last
    assert names(sort="progress", descending=False) == ["two", "four", "one", "three"]
    assert names(sort="name", descending=False, limit=2, offset=1) == ["one", "three"]
    assert names(namespace="b", sort="name", descending=False) == ["four", "three"]
    assert names(state=["pending"]) == ["three"]
    assert names(text="o", sort="name", descending=False) == ["four", "one", "two"]
    assert names(min_progress=20, max_progress=60) == ["four"]
    assert store.count_jobs(JobFilter()) == 4 and store.count_jobs(JobFilter(namespace="a", min_progress=50)) == 1


def test_series_are_in_step_order(store: Store, report: Callable[..., Report]) -> None:
    job = store.register("ns", "a", token_hash="h", now=0.0)
    for seq, (step, value) in enumerate([(30, 3.0), (10, 1.0), (20, 2.0), (20, 2.5)], start=1):
        job = store.ingest_report(job, report(seq, step, {"loss": value}, sent_at=float(seq)), 10.0 + seq).job
    assert [(p.step, p.last, p.t) for p in store.series(job.id, "loss")] == [
        (10, 1.0, 12.0),
        (20, 2.0, 13.0),
        (20, 2.5, 14.0),
        (30, 3.0, 11.0),
    ]
    assert store.series(job.id, "missing") == []
    assert store.metric_names(job.id) == ["loss"]


def test_progress_samples_are_rank_0_steps_in_arrival_order(store: Store, report: Callable[..., Report]) -> None:
    job = store.register("ns", "a", token_hash="h", now=0.0)
    job = store.ingest_report(job, report(1, 5, world_size=2), 10.0).job
    job = store.ingest_report(job, report(1, 9, rank=1, world_size=2), 11.0).job
    job = store.ingest_report(job, report(2, None, world_size=2), 12.0).job  # no step: not a sample
    job = store.ingest_report(job, report(3, 8, world_size=2), 13.0).job
    assert [(s.t, s.step) for s in store.progress_samples(job.id)] == [(10.0, 5), (13.0, 8)]
    assert [(s.t, s.step) for s in store.progress_samples(job.id, since=11.0)] == [(13.0, 8)]


def test_non_finite_values_are_stored_as_such(store: Store, database: Any, report: Callable[..., Report]) -> None:
    job = store.register("ns", "a", token_hash="h", now=0.0)
    values = {"nan": [math.nan], "inf": [math.inf], "ninf": [2.0, -math.inf], "fine": [1.5]}
    job = store.ingest_report(job, report(1, 7, values), 1.0).job
    assert math.isnan(job.last_metrics["nan"])
    assert job.last_metrics["inf"] == math.inf and job.last_metrics["ninf"] == -math.inf
    assert job.last_metrics["fine"] == 1.5 and job.nonfinite_total == 3
    (nan,) = store.series(job.id, "nan")
    assert math.isnan(nan.last) and (nan.min, nan.max, nan.mean, nan.count, nan.nonfinite) == (None, None, None, 1, 1)
    assert store.series(job.id, "inf")[0].last == math.inf
    (ninf,) = store.series(job.id, "ninf")
    assert (ninf.last, ninf.min, ninf.max, ninf.count, ninf.nonfinite) == (-math.inf, 2.0, 2.0, 2, 1)
    store.close()
    reopened = database.open()
    assert math.isnan(reopened.series(job.id, "nan")[0].last)
    assert reopened.series(job.id, "inf")[0].last == math.inf
    assert math.isnan(reopened.job("ns", "a").last_metrics["nan"])
    # NaN is a value of its own, not a missing one (SQLite would make it NULL if it were stored as a float)
    assert database.execute("SELECT COUNT(*) FROM points WHERE last IS NULL") == [(0,)]


def test_everything_survives_closing_and_reopening(database: Any, report: Callable[..., Report]) -> None:
    store = database.open()
    job = store.register("ns", "a", token_hash="h", now=1.0, total_steps=10, params={"lr": 0.1})
    for seq in range(1, 4):
        job = store.ingest_report(job, report(seq, seq, {"loss": 1.0 / seq}, total_steps=10), 1.0 + seq).job
    command = store.add_command(job, "checkpoint", "hourly", 5.0)
    store.set_estimate(job.id, 70.0, 0.1, 5.0)
    done = store.register("ns", "b", token_hash="h", now=6.0)
    done = store.set_state(done, "finished", 7.0)
    before = (
        store.job("ns", "a"),
        store.job("ns", "b"),
        store.series(job.id, "loss"),
        store.events(),
        store.progress_samples(job.id),
        store.token_hash(job.id),
    )
    store.close()

    reopened = database.open()
    try:
        after = (
            reopened.job("ns", "a"),
            reopened.job("ns", "b"),
            reopened.series(job.id, "loss"),
            reopened.events(),
            reopened.progress_samples(job.id),
            reopened.token_hash(job.id),
        )
        assert after == before
        assert after[0].eta_seconds == 70.0  # type: ignore[union-attr]
        assert reopened.pending_commands(job.id) == [command]
        with pytest.raises(KeyError):
            reopened.register("ns", "a", token_hash="h", now=8.0)  # still live after a restart
        assert reopened.register("ns", "b", token_hash="h", now=8.0).attempt == 2
    finally:
        reopened.close()
    if database.backend == "sqlite":
        with sqlite3.connect(database.path) as conn:
            assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


def test_the_database_is_in_wal_mode(db_path: Path) -> None:
    store = SQLiteStore(db_path)
    store.register("ns", "a", token_hash="h", now=0.0)
    store.close()
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert Path(f"{db_path}-wal").exists()


# ------------------------------------------------------------------------------------------ crash


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_server(db_path: Path, tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``stepwatch server`` in its own process (a real uvicorn), answering on a free port."""
    port = _free_port()
    log = open(tmp_path / f"server-{port}.log", "wb")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stepwatch",
            "server",
            "--db",
            str(db_path),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    base = f"http://127.0.0.1:{port}"
    with contextlib.suppress(AssertionError):  # not up in 20 s: its log says why
        wait_for(lambda: process.poll() is not None or _healthy(base), 20, "the server to answer")
        if process.poll() is None:
            return process, base
    process.kill()
    raise RuntimeError((tmp_path / f"server-{port}.log").read_text())


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(10)


@pytest.mark.slow
def test_no_acknowledged_report_is_lost_when_the_server_is_killed(
    tmp_path: Path, db_path: Path, make_report: MakeReport, processes: list[subprocess.Popen[bytes]]
) -> None:
    server, base = _start_server(db_path, tmp_path)
    processes.append(server)
    token = httpx.post(f"{base}/api/v1/namespaces/default/jobs", json={"name": "crash"}).json()["token"]
    acked: list[int] = []
    stop = threading.Event()

    def post_reports() -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=5) as http:
            seq = 0
            while not stop.is_set():
                seq += 1
                try:
                    response = http.post(
                        "/api/v1/namespaces/default/jobs/crash/reports",
                        json=make_report(seq, seq, {"loss": 1.0 / seq}, sent_at=float(seq)),
                    )
                except httpx.TransportError:
                    return
                if response.status_code == 200:
                    acked.append(seq)

    poster = threading.Thread(target=post_reports)
    poster.start()
    wait_for(lambda: len(acked) >= 150, 30, "150 acknowledged reports")
    os.kill(server.pid, signal.SIGKILL)  # mid-stream: the poster is still sending
    server.wait(10)
    poster.join(10)
    stop.set()
    assert len(acked) >= 150 and acked == list(range(1, len(acked) + 1))

    restarted, base = _start_server(db_path, tmp_path)
    processes.append(restarted)
    with httpx.Client(base_url=base, timeout=5) as http:
        history = http.get("/api/v1/namespaces/default/jobs/crash/history", params={"max_points": 10000}).json()
        stored = {p["step"] for p in history["metrics"]["loss"]}
        assert set(acked) <= stored, f"acknowledged but lost: {sorted(set(acked) - stored)[:10]}"
        assert len(stored) <= len(acked) + 1  # at most the one in flight when the server died
        job = http.get("/api/v1/namespaces/default/jobs/crash").json()
        assert job["state"] == "running" and job["progress"]["step"] >= acked[-1]
        # the restarted server goes on from there
        response = http.post(
            "/api/v1/namespaces/default/jobs/crash/reports",
            json=make_report(10_000, 10_000, {"loss": 0.0}, sent_at=1e6),
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 200


# ------------------------------------------------------------------------------------------ storage trouble


@contextlib.contextmanager
def lets_go_after(other_process: sqlite3.Connection, seconds: float) -> Iterator[None]:
    """Another process's lock, let go after ``seconds`` unless the block ended before. A write in the block
    that waited that long for the lock would then succeed: its refusal shows that it did not wait, with no
    time measured (a slow machine only makes the block end later, well within ``seconds``)."""
    timer = threading.Timer(seconds, other_process.execute, ["ROLLBACK"])
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()


class ImpatientStore(SQLiteStore):
    """The real store with a 0.2 s busy timeout instead of its 10 s, so that a test of a lock takes 0.2 s."""

    def _connect(self) -> sqlite3.Connection:
        conn = super()._connect()
        conn.execute("PRAGMA busy_timeout=200")
        return conn


class FillableStore(SQLiteStore):
    """The real store whose file can be made 'full' (SQLite's max_page_count), as a full disk would be."""

    connections: list[sqlite3.Connection]

    def _connect(self) -> sqlite3.Connection:
        conn = super()._connect()
        if not hasattr(self, "connections"):
            self.connections = []
        self.connections.append(conn)
        return conn

    def fill(self, full: bool = True) -> None:
        for conn in self.connections:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count={pages if full else 1_000_000_000}")


def test_a_locked_database_answers_503_and_reads_go_on(db_path: Path, clock: Any, make_report: MakeReport) -> None:
    from starlette.testclient import TestClient

    store = ImpatientStore(db_path)
    with TestClient(
        create_app(ServerSettings(allowed_hosts=("testserver",)), store=store, clock=clock),
        raise_server_exceptions=False,
    ) as client:
        token = client.post("/api/v1/namespaces/default/jobs", json={"name": "locked"}).json()["token"]
        auth = {"Authorization": f"Bearer {token}"}
        path = "/api/v1/namespaces/default/jobs/locked"
        assert client.post(f"{path}/reports", json=make_report(1, 1, {"loss": 1.0}), headers=auth).status_code == 200

        blocker = sqlite3.connect(db_path, isolation_level=None, timeout=0, check_same_thread=False)
        blocker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock longer than the store waits
        try:
            with lets_go_after(blocker, 5.0):  # a report that waited 5 s for the lock would then be written
                response = client.post(f"{path}/reports", json=make_report(2, 2, {"loss": 0.5}), headers=auth)
            assert response.status_code == 503
            assert response.json() == {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": 503,
                "reason": "ServiceUnavailable",
                "message": "storage unavailable: the database cannot be written: database is locked",
            }
            assert response.headers["retry-after"] == "5"
            assert client.post("/api/v1/namespaces/default/jobs", json={"name": "other"}).status_code == 503
            assert client.post(f"{path}/commands", json={"kind": "stop"}).status_code == 503
            # reads go on while the lock is held (WAL)
            assert client.get(path).json()["progress"]["step"] == 1
            assert client.get("/api/v1/jobs").json()["total"] == 1
        finally:
            if blocker.in_transaction:
                blocker.execute("ROLLBACK")
            blocker.close()
        retried = client.post(f"{path}/reports", json=make_report(2, 2, {"loss": 0.5}), headers=auth)
        assert retried.status_code == 200
        assert client.get(path).json()["progress"]["step"] == 2
    store.close()


def test_a_write_that_must_not_wait_is_refused_while_another_holds_the_lock(
    db_path: Path, make_report: MakeReport
) -> None:
    store = SQLiteStore(db_path)  # its own busy timeout (seconds): what a write that waits would wait
    job = store.register("default", "nowait", token_hash="h", now=1.0)
    busy = int(store._writer.execute("PRAGMA busy_timeout").fetchone()[0])
    assert busy >= 1000

    def pending(seq: int) -> list[PendingReport]:
        return [PendingReport(job, Report.from_dict(make_report(seq, seq, {"loss": 1.0 / seq})), 10.0 + seq)]

    written = store.ingest_reports_nowait(pending(1))
    assert written is not None and isinstance(written[0], IngestResult) and not written[0].duplicate

    other_process = sqlite3.connect(db_path, isolation_level=None, timeout=0, check_same_thread=False)
    other_process.execute("BEGIN IMMEDIATE")  # another process writes the file
    try:
        # at once, not after the busy timeout: a write that waited would see the lock go halfway through
        # its wait, and be written
        with lets_go_after(other_process, busy / 1000 / 2):
            assert store.ingest_reports_nowait(pending(2)) is None
    finally:
        if other_process.in_transaction:
            other_process.execute("ROLLBACK")
        other_process.close()
    assert int(store._writer.execute("PRAGMA busy_timeout").fetchone()[0]) == busy  # the wait is back for others

    store._write_lock.acquire()  # another thread of this server writes (a registration, a retention pass)
    try:
        assert store.ingest_reports_nowait(pending(2)) is None
    finally:
        store._write_lock.release()

    again = store.ingest_reports_nowait(pending(2))
    assert again is not None and isinstance(again[0], IngestResult)
    assert [p.step for p in store.series(job.id, "loss")] == [1, 2]  # nothing written twice, nothing lost
    store.close()


def test_a_full_disk_answers_503(db_path: Path, clock: Any, make_report: MakeReport) -> None:
    from starlette.testclient import TestClient

    store = FillableStore(db_path)
    try:
        with TestClient(
            create_app(ServerSettings(allowed_hosts=("testserver",)), store=store, clock=clock),
            raise_server_exceptions=False,
        ) as client:
            token = client.post("/api/v1/namespaces/default/jobs", json={"name": "full"}).json()["token"]
            auth = {"Authorization": f"Bearer {token}"}
            store.fill()
            for seq in range(1, 400):
                body = make_report(seq, seq, {f"metric-{i}": float(i) for i in range(40)})
                response = client.post("/api/v1/namespaces/default/jobs/full/reports", json=body, headers=auth)
                if response.status_code != 200:
                    break
            assert response.status_code == 503, response.text
            assert "storage unavailable" in response.json()["message"]
            store.fill(False)
            ok = client.post("/api/v1/namespaces/default/jobs/full/reports", json=make_report(seq, seq), headers=auth)
            assert ok.status_code == 200
    finally:
        store.close()


def test_a_database_path_that_is_a_directory_fails_at_startup_naming_it(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=f"cannot open the database {tmp_path}: unable to open database file"):
        create_app(ServerSettings(db=str(tmp_path)))


def test_a_file_that_is_not_a_database_fails_at_startup_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are not the pages you are looking for" * 100)
    with pytest.raises(StoreError, match=f"cannot open the database {path}: file is not a database"):
        create_app(ServerSettings(db=str(path)))


def test_a_database_under_a_file_fails_at_startup_with_a_store_error(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    path = tmp_path / "plain" / "sw.db"
    with pytest.raises(StoreError, match=str(path)):
        create_app(ServerSettings(db=str(path)))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_a_read_only_directory_fails_at_startup_naming_the_database(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(StoreError, match=str(locked / "sw.db")):
            create_app(ServerSettings(db=str(locked / "sw.db")))
    finally:
        locked.chmod(0o700)


def test_a_batch_of_reports_of_one_job_builds_on_each_other(
    store: Store, database: Any, report: Callable[..., Report]
) -> None:
    job = store.register("ns", "a", token_hash="h", now=10.0)
    batch = [
        PendingReport(job, report(1, 5, {"loss": 0.5, "acc": math.nan}, total_steps=50), 20.0),
        PendingReport(job, report(2, 9, {"loss": 0.4}), 21.0),  # the same stale `job`: the store knows better
        PendingReport(job, report(2, 9, {"loss": 0.4}), 21.5),  # a retry in the same batch
    ]
    first, second, retry = store.ingest_reports(batch)
    assert isinstance(first, IngestResult) and isinstance(second, IngestResult) and isinstance(retry, IngestResult)
    assert not first.duplicate and not second.duplicate and retry.duplicate
    assert second.job.step == 9 and second.job.total_steps == 50 and second.job.nonfinite_total == 1
    assert second.job.last_metrics["loss"] == 0.4 and math.isnan(second.job.last_metrics["acc"])
    assert second.sample is not None and (second.sample.t, second.sample.step) == (21.0, 9)
    # what the batch answered is what the database holds, read back by a store with no cache
    stored = database.open().job_by_id(job.id)
    assert stored is not None
    nan_safe = {"last_metrics": {k: repr(v) for k, v in stored.last_metrics.items()}}
    answered = {"last_metrics": {k: repr(v) for k, v in second.job.last_metrics.items()}}
    assert dataclasses.replace(stored, **nan_safe) == dataclasses.replace(second.job, **answered)


def test_a_failing_report_in_a_batch_fails_alone(store: Store, report: Callable[..., Report]) -> None:
    job = store.register("ns", "a", token_hash="h", now=10.0)
    ghost = dataclasses.replace(job, id=10_000, name="ghost")
    (ok, missing, ok_again), events = store.with_events(
        store.ingest_reports,
        [
            PendingReport(job, report(1, 1, {"loss": 1.0}), 20.0),
            PendingReport(ghost, report(1, 1, {"loss": 1.0}), 20.0),
            PendingReport(job, report(2, 2, {"loss": 0.9}), 21.0),
        ],
    )
    assert isinstance(ok, IngestResult) and isinstance(missing, StoreError) and "ns/ghost" in str(missing)
    assert isinstance(ok_again, IngestResult) and ok_again.job.step == 2
    assert [p.step for p in store.series(job.id, "loss")] == [1, 2]
    # the events it gathered are those stored (SQLite writes the batch again after a failure: once each)
    assert events == store.events(job_id=job.id)[1:] and [e.kind for e in events] == ["running"]


def test_an_upstream_status_of_a_job_not_in_the_database_is_a_store_error(store: Store) -> None:
    """Deleted (retention, ``stepwatch db``) between the route's lookup and the write: a StoreError
    (a 503 for the route) on both stores, never a KeyError (a 500); nothing is written."""
    job = store.register("ns", "a", token_hash="h", now=10.0)
    ghost = dataclasses.replace(job, id=10_000, name="ghost")
    status = TrainerStatus.from_body(
        {"trainerStatus": {"progressPercentage": 5, "metrics": [{"name": "loss", "value": "1.5"}]}}
    )
    with pytest.raises(StoreError, match="ns/ghost is not in the database"):
        store.ingest_status(ghost, status, 20.0)
    assert store.series(10_000, "loss") == [] and store.job("ns", "a") == job


def test_an_upstream_status_is_kept_as_posted_replaced_whole_and_read_back_after_a_reopen(
    store: Store, database: Any, report: Callable[..., Report]
) -> None:
    """Upstream replaces the whole trainerStatus at each POST: the job keeps the last one as its client sent
    it (strings as sent), its progress and ETA as posted or none; a native report ends it."""
    job = store.register("ns", "a", token_hash="h", now=10.0)
    first = {
        "trainerStatus": {
            "progressPercentage": 68,
            "estimatedRemainingSeconds": 60,
            "lastUpdatedTime": "2026-03-01T12:00:00.5+01:00",
            "metrics": [{"name": "current_step", "value": "136"}, {"name": "phase", "value": "warmup"}],
        }
    }
    job = store.ingest_status(job, TrainerStatus.from_body(first), 20.0).job
    assert job.trainer_status == first["trainerStatus"]
    assert (job.step, job.reported_progress, job.reported_eta) == (136, 68, 60)
    final = {
        "trainerStatus": {
            "progressPercentage": 100,
            "estimatedRemainingSeconds": 0,
            "lastUpdatedTime": "2026-03-01T12:00:05Z",
        }
    }
    job = store.ingest_status(job, TrainerStatus.from_body(final), 25.0).job
    assert job.trainer_status == final["trainerStatus"]  # replaced whole: no metrics now
    assert (job.step, job.reported_progress, job.reported_eta) == (136, 100, 0)  # the last step known
    bare = {"trainerStatus": {"lastUpdatedTime": "2026-03-01T12:00:06Z"}}
    job = store.ingest_status(job, TrainerStatus.from_body(bare), 26.0).job
    assert (job.reported_progress, job.reported_eta) == (None, None)
    other = database.open()
    assert other.job("ns", "a") == job  # the column round-trips
    other.close()
    job = store.ingest_report(job, report(1, 140, {"loss": 1.0}), 27.0).job
    assert (job.trainer_status, job.reported_progress, job.step) == (None, None, 140)


def test_the_job_cache_follows_writes_and_another_process(
    store: Store, database: Any, report: Callable[..., Report]
) -> None:
    job = store.register("ns", "a", token_hash="h1", now=10.0)
    assert store.cached_job("ns", "a") == job and store.cached_token_hash(job.id) == "h1"
    job = store.ingest_report(job, report(1, 3, {"loss": 1.0}), 11.0).job
    assert store.cached_job("ns", "a") == job == store.job("ns", "a")
    # another process (here: another store on the same database) finishes it and starts attempt 2
    other = database.open()
    other.set_state(job, "finished", 12.0)
    second = other.register("ns", "a", token_hash="h2", now=13.0)
    other.close()
    # SQLite: the next write of this store sees the file changed and forgets what it cached;
    # PostgreSQL: the other store's notification makes it forget (within milliseconds)
    store.set_estimate(job.id, None, None, 14.0)
    wait_for(lambda: getattr(store.job("ns", "a"), "id", None) == second.id, 10, "the second attempt to be read")
    assert store.cached_job("ns", "a") is None or store.cached_job("ns", "a") == store.job("ns", "a")
    latest = store.job("ns", "a")
    assert latest is not None and latest.id == second.id and store.token_hash(second.id) == "h2"
    assert store.job_by_id(job.id) is not None and store.job_by_id(job.id).state == "finished"  # type: ignore[union-attr]


def test_params_of_later_reports_add_to_the_first(store: Store, report: Callable[..., Report]) -> None:
    job = store.register("ns", "p", token_hash="h", now=0.0, params={"lr": 0.1})
    job = store.ingest_report(job, report(1, 1, params={"batch": 32}), 1.0).job
    job = store.ingest_report(job, report(2, 2, params={"lr": 0.2}), 2.0).job
    assert job.params == {"lr": 0.2, "batch": 32}
    assert store.job_by_id(job.id).params == {"lr": 0.2, "batch": 32}  # type: ignore[union-attr]


def test_a_stop_asked_for_ends_stopped_on_every_path(store: Store, report: Callable[..., Report]) -> None:
    """Issue 19: a job asked to stop that then says ``finished`` (its report, or the runner) ends
    ``stopped`` with the stop's reason; a failure stays failed; the runner's ``stopped`` replaces a
    report's ``finished``."""
    reported = store.register("ns", "reported", token_hash="h1", now=1.0, total_steps=100)
    reported = store.ingest_report(reported, report(1, 10), 2.0).job
    store.add_command(reported, "stop", "plateau", 3.0)
    ended = store.ingest_report(reported, report(2, 12, state="finished"), 4.0).job
    assert (ended.state, ended.reason) == ("stopped", "plateau")
    ended = store.set_state(ended, "finished", 5.0, "", exit_code=0)  # the runner, which did not see the stop
    assert (ended.state, ended.reason) == ("stopped", "plateau")
    assert [e.kind for e in store.events(job_id=ended.id)].count("stopped") == 1

    runner = store.register("ns", "runner", token_hash="h2", now=1.0)
    runner = store.ingest_report(runner, report(1, 10), 2.0).job
    store.add_command(runner, "stop", "budget", 3.0)
    assert store.set_state(runner, "finished", 4.0, "", exit_code=0).state == "stopped"

    failing = store.register("ns", "failing", token_hash="h3", now=1.0)
    failing = store.ingest_report(failing, report(1, 10), 2.0).job
    store.add_command(failing, "stop", "budget", 3.0)
    assert store.set_state(failing, "failed", 4.0, "exit code 1", exit_code=1).state == "failed"

    interrupted = store.register("ns", "interrupted", token_hash="h4", now=1.0)
    interrupted = store.ingest_report(interrupted, report(1, 10), 2.0).job
    interrupted = store.ingest_report(interrupted, report(2, 11, state="finished"), 3.0).job
    assert interrupted.state == "finished"  # no stop asked: the report's word stands...
    assert store.set_state(interrupted, "stopped", 4.0, "interrupted (Ctrl-C)", exit_code=0).state == "stopped"

    plain = store.register("ns", "plain", token_hash="h5", now=1.0)
    plain = store.ingest_report(plain, report(1, 10, state="finished"), 2.0).job
    assert store.set_state(plain, "finished", 3.0, "", exit_code=0).state == "finished"  # ...and nothing else


def test_closing_waits_for_a_read_under_way_in_another_thread(tmp_path: Path) -> None:
    """A server stopped while a worker thread still reads (uvicorn cancels the request, not its thread)
    closed that thread's connection under it: the process crashed in SQLite (seen in the browser tests'
    teardown). Now close() waits for the read, and a read after it is a StoreError, not a crash."""
    store = SQLiteStore(str(tmp_path / "sw.db"))
    started, results = threading.Event(), []
    slow = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) SELECT count(*) FROM n"

    def read() -> None:
        started.set()
        results.append(store._read(slow))

    reader = threading.Thread(target=read)
    reader.start()
    started.wait(5)
    time.sleep(0.05)  # the read is under way in SQLite
    store.close()
    reader.join(30)
    assert results == [[(3000000,)]]  # it ended with its answer, before its connection was closed
    with pytest.raises(StoreError, match="closed"):
        store._read("SELECT 1")
