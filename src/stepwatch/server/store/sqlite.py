"""The embedded store: one SQLite file in WAL mode, one writer, many readers.

Writes go through one connection guarded by a lock (SQLite has one writer anyway; serialising them
here turns "database is locked" into waiting); each reading thread has its own connection, and WAL
lets reads proceed while a write is in progress. ``synchronous=NORMAL`` with WAL keeps every
committed transaction across a crash of the server process (SIGKILL included): an acknowledged
report is never lost. The schema carries its version in ``PRAGMA user_version``; migrations only
add, so an upgrade never loses data.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...protocol import (
    Command,
    MetricWindow,
    Report,
    TrainerStatus,
    decode_float,
    encode_float,
    parse_rfc3339,
)
from .base import (
    FINAL_STATES,
    Event,
    IngestResult,
    Job,
    JobFilter,
    JobState,
    ProgressSample,
    SeriesColumns,
    SeriesPoint,
    Store,
    StoreError,
)

__all__ = ["SQLiteStore"]

SCHEMA_VERSION = 1

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY,
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        token_hash TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        last_report_at REAL,
        step INTEGER,
        total_steps INTEGER,
        epoch REAL,
        total_epochs REAL,
        samples INTEGER,
        steps_per_second REAL,
        samples_per_second REAL,
        reported_eta REAL,
        reported_progress REAL,
        reason TEXT NOT NULL DEFAULT '',
        exit_code INTEGER,
        source TEXT NOT NULL DEFAULT 'native',
        gpus REAL NOT NULL DEFAULT 0,
        gpu_hour_cost REAL NOT NULL DEFAULT 0,
        world_size INTEGER NOT NULL DEFAULT 1,
        params TEXT NOT NULL DEFAULT '{}',
        last_metrics TEXT NOT NULL DEFAULT '{}',
        nonfinite_total INTEGER NOT NULL DEFAULT 0,
        eta_seconds REAL,
        eta_rate REAL,
        eta_at REAL,
        UNIQUE (namespace, name, attempt)
    );
    CREATE INDEX jobs_by_state ON jobs (state);
    CREATE TABLE reports (
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        run_id TEXT NOT NULL,
        rank INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        received_at REAL NOT NULL,
        sent_at REAL NOT NULL,
        step INTEGER,
        newest INTEGER NOT NULL DEFAULT 1,
        PRIMARY KEY (job_id, run_id, rank, seq)
    ) WITHOUT ROWID;
    CREATE INDEX reports_progress ON reports (job_id, rank, received_at);
    CREATE TABLE ranks (
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        rank INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        last_sent_at REAL NOT NULL,
        last_seen_at REAL NOT NULL,
        step INTEGER,
        step_time REAL,
        host TEXT NOT NULL DEFAULT '',
        pid INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (job_id, rank)
    ) WITHOUT ROWID;
    CREATE TABLE points (
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        metric TEXT NOT NULL,
        step INTEGER NOT NULL,
        t REAL NOT NULL,
        last REAL NOT NULL,
        min REAL,
        max REAL,
        mean REAL,
        count INTEGER NOT NULL,
        nonfinite INTEGER NOT NULL
    );
    CREATE INDEX points_by_metric ON points (job_id, metric, step, t);
    CREATE TABLE commands (
        id TEXT PRIMARY KEY,
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        kind TEXT NOT NULL,
        reason TEXT NOT NULL,
        created_at REAL NOT NULL,
        acked_at REAL
    );
    CREATE INDEX commands_pending ON commands (job_id, acked_at);
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs (id),
        t REAL NOT NULL,
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_by_job ON events (job_id, id);
    """,
}

_JOB_COLUMNS = (
    "id, namespace, name, attempt, state, created_at, updated_at, started_at, finished_at, last_report_at, "
    "step, total_steps, epoch, total_epochs, samples, steps_per_second, samples_per_second, reported_eta, "
    "reported_progress, reason, exit_code, source, gpus, gpu_hour_cost, world_size, params, last_metrics, "
    "nonfinite_total, eta_seconds, eta_rate, eta_at"
)


class SQLiteStore(Store):
    """The embedded default store (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the directory of the database {self.path}: {exc}") from None
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._writer = self._connect()
        self._migrate()

    # ------------------------------------------------------------------------------- connections

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA busy_timeout=10000")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the database {self.path}: {exc}") from None
        self._all.append(conn)
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._write_lock:
            conn = self._writer
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"the database cannot be written: {exc}") from None
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(exc, sqlite3.Error):  # disk full, I/O error, corruption...
                    raise StoreError(f"the database cannot be written: {exc}") from None
                raise

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._reader().execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"the database cannot be read: {exc}") from None

    def _migrate(self) -> None:
        (version,) = self._writer.execute("PRAGMA user_version").fetchone()
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._write_lock:
                self._writer.executescript(f"BEGIN; {_MIGRATIONS[target]} PRAGMA user_version = {target}; COMMIT;")

    def close(self) -> None:
        """Close every connection."""
        for conn in self._all:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._all.clear()

    # -------------------------------------------------------------------------------------- jobs

    def register(
        self,
        namespace: str,
        name: str,
        *,
        token_hash: str,
        now: float,
        total_steps: int | None = None,
        total_epochs: float | None = None,
        params: dict[str, Any] | None = None,
        gpus: float = 0.0,
        gpu_hour_cost: float = 0.0,
        source: str = "native",
        supersede: bool = False,
    ) -> Job:
        """Create a job, or its next attempt; ``KeyError`` while the latest attempt is still live.

        With ``supersede`` a live latest attempt is marked failed instead (a job restarted by hand
        after a crash that never reported its end).
        """
        with self._write() as conn:
            row = conn.execute(
                "SELECT id, attempt, state FROM jobs WHERE namespace = ? AND name = ? ORDER BY attempt DESC LIMIT 1",
                (namespace, name),
            ).fetchone()
            if row is not None and row[2] not in FINAL_STATES:
                if not supersede:
                    raise KeyError(f"{namespace}/{name}")
                reason = f"superseded by attempt {row[1] + 1}"
                self._update(conn, row[0], {"state": "failed", "finished_at": now, "updated_at": now, "reason": reason})
                self._event(conn, row[0], now, "failed", reason, {})
            attempt = 1 if row is None else row[1] + 1
            cur = conn.execute(
                "INSERT INTO jobs (namespace, name, attempt, token_hash, state, created_at, updated_at, "
                "total_steps, total_epochs, params, gpus, gpu_hour_cost, source) "
                "VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    namespace,
                    name,
                    attempt,
                    token_hash,
                    now,
                    now,
                    total_steps,
                    total_epochs,
                    json.dumps(params or {}),
                    gpus,
                    gpu_hour_cost,
                    source,
                ),
            )
            job_id = int(cur.lastrowid or 0)
            self._event(conn, job_id, now, "registered", f"attempt {attempt} registered", {"attempt": attempt})
        job = self.job_by_id(job_id)
        assert job is not None
        return job

    def job(self, namespace: str, name: str, attempt: int | None = None) -> Job | None:
        """The latest attempt of a job, or the given one."""
        if attempt is None:
            rows = self._read(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE namespace = ? AND name = ? ORDER BY attempt DESC LIMIT 1",
                (namespace, name),
            )
        else:
            rows = self._read(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE namespace = ? AND name = ? AND attempt = ?",
                (namespace, name, attempt),
            )
        return _job(rows[0]) if rows else None

    def job_by_id(self, job_id: int) -> Job | None:
        """A job by id."""
        rows = self._read(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,))
        return _job(rows[0]) if rows else None

    def token_hash(self, job_id: int) -> str:
        """The stored hash of a job's write token."""
        rows = self._read("SELECT token_hash FROM jobs WHERE id = ?", (job_id,))
        return str(rows[0][0]) if rows else ""

    def _where(self, where: JobFilter) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if where.namespace:
            clauses.append("namespace = ?")
            args.append(where.namespace)
        if where.state:
            clauses.append(f"state IN ({', '.join('?' for _ in where.state)})")
            args.extend(where.state)
        if where.text:
            clauses.append("(instr(name, ?) > 0 OR instr(namespace, ?) > 0)")
            args.extend([where.text.lower(), where.text.lower()])
        if where.min_progress is not None:
            clauses.append(f"{_PROGRESS_SQL} >= ?")
            args.append(where.min_progress)
        if where.max_progress is not None:
            clauses.append(f"{_PROGRESS_SQL} <= ?")
            args.append(where.max_progress)
        if not where.all_attempts:
            clauses.append(
                "attempt = (SELECT MAX(attempt) FROM jobs AS newer WHERE newer.namespace = jobs.namespace "
                "AND newer.name = jobs.name)"
            )
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def jobs(self, where: JobFilter) -> list[Job]:
        """Jobs matching a filter, most recently updated first."""
        sql, args = self._where(where)
        order = "DESC" if where.descending else "ASC"
        column = _SORT_SQL.get(where.sort, "updated_at")
        rows = self._read(
            f"SELECT {_JOB_COLUMNS} FROM jobs{sql} ORDER BY {column} IS NULL, {column} {order}, id {order} "
            "LIMIT ? OFFSET ?",
            (*args, where.limit, where.offset),
        )
        return [_job(r) for r in rows]

    def count_jobs(self, where: JobFilter) -> int:
        """How many jobs match a filter."""
        sql, args = self._where(where)
        return int(self._read(f"SELECT COUNT(*) FROM jobs{sql}", tuple(args))[0][0])

    # ------------------------------------------------------------------------------------ ingest

    def ingest_report(
        self, job: Job, report: Report, now: float, estimate: tuple[float | None, float | None] | None = None
    ) -> IngestResult:
        """Store a report once; move progress only forward in report time; record acks and state.

        ``estimate`` (seconds left, steps per second), computed by the caller for this report, is
        stored in the same transaction when the report is rank 0's newest.
        """
        identity = report.identity
        with self._write() as conn:
            previous = conn.execute(
                "SELECT last_sent_at FROM ranks WHERE job_id = ? AND rank = ?", (job.id, identity.rank)
            ).fetchone()
            newest = previous is None or report.sent_at >= previous[0]
            inserted = conn.execute(
                "INSERT OR IGNORE INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step, newest) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (job.id, report.run_id, identity.rank, report.seq, now, report.sent_at, report.progress.step, newest),
            ).rowcount
            if not inserted:
                pending = self._pending(conn, job.id)
                return IngestResult(job=job, duplicate=True, commands=tuple(pending))
            progress = report.progress
            if newest:
                conn.execute(
                    "INSERT INTO ranks (job_id, rank, run_id, last_sent_at, last_seen_at, step, step_time, host, pid) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, rank) DO UPDATE SET "
                    "run_id = excluded.run_id, last_sent_at = excluded.last_sent_at, "
                    "last_seen_at = excluded.last_seen_at, step = excluded.step, step_time = excluded.step_time, "
                    "host = excluded.host, pid = excluded.pid",
                    (
                        job.id,
                        identity.rank,
                        report.run_id,
                        report.sent_at,
                        now,
                        progress.step,
                        progress.step_time,
                        identity.host,
                        identity.pid,
                    ),
                )
            for window in report.metrics:
                conn.execute(
                    "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        job.id,
                        window.name,
                        window.last_step,
                        now,
                        _store_float(window.last),
                        window.min,
                        window.max,
                        window.mean,
                        window.count,
                        window.nonfinite,
                    ),
                )
            if report.acks:
                marks = ", ".join("?" for _ in report.acks)
                acked = conn.execute(
                    f"UPDATE commands SET acked_at = ? WHERE job_id = ? AND acked_at IS NULL AND id IN ({marks}) "
                    "RETURNING id, kind",
                    (now, job.id, *report.acks),
                ).fetchall()
                for command_id, kind in acked:
                    self._event(conn, job.id, now, "command_acked", f"{kind} received by the job", {"id": command_id})
            updates: dict[str, Any] = {"updated_at": now, "last_report_at": now}
            if identity.rank == 0 and newest:
                updates.update(
                    step=progress.step,
                    epoch=progress.epoch,
                    samples=progress.samples,
                    steps_per_second=progress.steps_per_second,
                    samples_per_second=progress.samples_per_second,
                    world_size=identity.world_size,
                )
                if progress.total_steps is not None:
                    updates["total_steps"] = progress.total_steps
                if progress.total_epochs is not None:
                    updates["total_epochs"] = progress.total_epochs
                if progress.eta_seconds is not None:
                    updates["reported_eta"] = progress.eta_seconds
                if estimate is not None:
                    updates.update(eta_seconds=estimate[0], eta_rate=estimate[1], eta_at=now)
            if report.params is not None:
                updates["params"] = json.dumps(dict(report.params))
            if report.metrics and newest:  # a late report is history, not the latest values
                last = dict(job.last_metrics)
                for window in report.metrics:
                    last[window.name] = window.last
                updates["last_metrics"] = json.dumps({k: encode_float(v) for k, v in last.items()})
            if report.metrics:
                updates["nonfinite_total"] = job.nonfinite_total + sum(w.nonfinite for w in report.metrics)
            self._transition(conn, job, updates, report.state, report.reason, now, rank0=identity.rank == 0)
            self._update(conn, job.id, updates)
            pending = self._pending(conn, job.id)
        fresh = self.job_by_id(job.id)
        assert fresh is not None
        return IngestResult(job=fresh, duplicate=False, commands=tuple(pending), new_points=report.metrics)

    def ingest_status(self, job: Job, status: TrainerStatus, now: float) -> IngestResult:
        """Store an upstream status: progress, ETA and every numeric metric as a one-value window."""
        values: dict[str, float] = {}
        for metric in status.metrics:
            try:
                values[metric.name] = float(metric.value)
            except ValueError:
                continue  # upstream allows any string; only numbers become history
        sent_at = now
        if status.last_updated_time is not None:
            sent_at = parse_rfc3339(status.last_updated_time)
        step = values.pop("current_step", None)
        total = values.pop("total_steps", None)
        epoch = values.pop("current_epoch", None)
        total_epochs = values.pop("total_epochs", None)
        step_int = int(step) if step is not None and math.isfinite(step) and step >= 0 else job.step
        with self._write() as conn:
            # each POST replaces the whole status upstream: every one is kept, none is a duplicate
            conn.execute(
                "INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step) "
                "SELECT ?, 'kubeflow', 0, COALESCE(MAX(seq), -1) + 1, ?, ?, ? FROM reports "
                "WHERE job_id = ? AND run_id = 'kubeflow' AND rank = 0",
                (job.id, now, sent_at, step_int, job.id),
            )
            windows = []
            for name, value in values.items():
                finite = math.isfinite(value)
                windows.append(
                    MetricWindow(
                        name=name,
                        last=value,
                        min=value if finite else None,
                        max=value if finite else None,
                        mean=value if finite else None,
                        count=1,
                        nonfinite=0 if finite else 1,
                        first_step=step_int or 0,
                        last_step=step_int or 0,
                    )
                )
            for w in windows:
                conn.execute(
                    "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (job.id, w.name, w.last_step, now, _store_float(w.last), w.min, w.max, w.mean, 1, w.nonfinite),
                )
            last = dict(job.last_metrics)
            last.update(values)
            updates: dict[str, Any] = {
                "updated_at": now,
                "last_report_at": now,
                "step": step_int,
                "reported_progress": status.progress_percentage,
                "reported_eta": status.estimated_remaining_seconds,
                "last_metrics": json.dumps({k: encode_float(v) for k, v in last.items()}),
                "nonfinite_total": job.nonfinite_total + sum(w.nonfinite for w in windows),
                "source": "kubeflow",
            }
            if total is not None and math.isfinite(total) and total >= 1:
                updates["total_steps"] = int(total)
            if epoch is not None and math.isfinite(epoch):
                updates["epoch"] = epoch
            if total_epochs is not None and math.isfinite(total_epochs) and total_epochs > 0:
                updates["total_epochs"] = total_epochs
            self._transition(conn, job, updates, "running", "", now, rank0=True)
            self._update(conn, job.id, updates)
        fresh = self.job_by_id(job.id)
        assert fresh is not None
        return IngestResult(job=fresh, duplicate=False, new_points=tuple(windows))

    def _transition(
        self,
        conn: sqlite3.Connection,
        job: Job,
        updates: dict[str, Any],
        state: str,
        reason: str,
        now: float,
        rank0: bool,
    ) -> None:
        if job.state in FINAL_STATES:
            return
        if state in FINAL_STATES and rank0:
            updates.update(state=state, finished_at=now, reason=reason)
            self._event(conn, job.id, now, state, reason or f"the job reported {state}", {})
        elif job.state == "pending":
            updates.update(state="running", started_at=now)
            self._event(conn, job.id, now, "running", "first report received", {})

    def set_state(self, job: Job, state: JobState, now: float, reason: str = "", exit_code: int | None = None) -> Job:
        """Record a final state (the runner knows how the process ended), or running."""
        with self._write() as conn:
            current = conn.execute("SELECT state FROM jobs WHERE id = ?", (job.id,)).fetchone()
            updates: dict[str, Any] = {"updated_at": now, "exit_code": exit_code}
            if state in FINAL_STATES:
                if (current and current[0] not in FINAL_STATES) or exit_code not in (None, 0):
                    updates.update(state=state, finished_at=now, reason=reason)
                    self._event(conn, job.id, now, state, reason or state, {"exit_code": exit_code})
            elif current and current[0] == "pending":
                updates.update(state=state, started_at=now)
                self._event(conn, job.id, now, state, reason or "started", {})
            self._update(conn, job.id, updates)
        fresh = self.job_by_id(job.id)
        assert fresh is not None
        return fresh

    def set_estimate(self, job_id: int, eta_seconds: float | None, rate: float | None, now: float) -> None:
        """Keep the latest ETA of a job with the job, so that lists need no history."""
        with self._write() as conn:
            self._update(conn, job_id, {"eta_seconds": eta_seconds, "eta_rate": rate, "eta_at": now})

    def _update(self, conn: sqlite3.Connection, job_id: int, updates: dict[str, Any]) -> None:
        columns = ", ".join(f"{k} = ?" for k in updates)
        conn.execute(f"UPDATE jobs SET {columns} WHERE id = ?", (*updates.values(), job_id))

    # ----------------------------------------------------------------------------------- history

    def series_columns(self, job_id: int, metric: str) -> SeriesColumns:
        """Every window of a metric, in step order, as columns (no object per window: fast for long series)."""
        rows = self._read(
            "SELECT step, t, last, min, max, mean, count, nonfinite FROM points WHERE job_id = ? AND metric = ? "
            "ORDER BY step, t",
            (job_id, metric),
        )
        if not rows:
            return SeriesColumns([], [], [], [], [], [], [], [])
        steps, times, lasts, mins, maxs, means, counts, nonfinites = (list(c) for c in zip(*rows))
        return SeriesColumns(steps, times, [_load_float(v) for v in lasts], mins, maxs, means, counts, nonfinites)

    def series(self, job_id: int, metric: str) -> list[SeriesPoint]:
        """Every window of a metric, in step order."""
        rows = self._read(
            "SELECT step, t, last, min, max, mean, count, nonfinite FROM points WHERE job_id = ? AND metric = ? "
            "ORDER BY step, t",
            (job_id, metric),
        )
        return [SeriesPoint(r[0], r[1], _load_float(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows]

    def metric_names(self, job_id: int) -> list[str]:
        """The metrics a job has reported, sorted."""
        return [r[0] for r in self._read("SELECT DISTINCT metric FROM points WHERE job_id = ? ORDER BY 1", (job_id,))]

    def progress_samples(self, job_id: int, since: float | None = None) -> list[ProgressSample]:
        """Rank 0's (arrival time, step), oldest first."""
        rows = self._read(
            "SELECT received_at, step FROM reports WHERE job_id = ? AND rank = 0 AND step IS NOT NULL "
            "AND newest = 1 AND received_at >= ? ORDER BY received_at",
            (job_id, since if since is not None else -math.inf),
        )
        return [ProgressSample(r[0], r[1]) for r in rows]

    # ---------------------------------------------------------------------------------- commands

    def add_command(self, job: Job, kind: str, reason: str, now: float) -> Command:
        """Queue a command; the reporter receives it with its next answer."""
        command = Command(id=uuid.uuid4().hex[:16], kind=kind, reason=reason)  # type: ignore[arg-type]
        with self._write() as conn:
            conn.execute(
                "INSERT INTO commands (id, job_id, kind, reason, created_at) VALUES (?, ?, ?, ?, ?)",
                (command.id, job.id, kind, reason, now),
            )
            message = f"{kind} requested: {reason}" if reason else f"{kind} requested"
            self._event(conn, job.id, now, "command", message, {"id": command.id, "kind": kind, "reason": reason})
        return command

    def _pending(self, conn: sqlite3.Connection, job_id: int) -> list[Command]:
        rows = conn.execute(
            "SELECT id, kind, reason FROM commands WHERE job_id = ? AND acked_at IS NULL ORDER BY created_at LIMIT 16",
            (job_id,),
        ).fetchall()
        return [Command(id=r[0], kind=r[1], reason=r[2]) for r in rows]

    def pending_commands(self, job_id: int) -> list[Command]:
        """Commands not acknowledged yet, oldest first."""
        with self._write_lock:
            return self._pending(self._writer, job_id)

    # ------------------------------------------------------------------------------------ events

    def _event(
        self, conn: sqlite3.Connection, job_id: int, now: float, kind: str, message: str, data: dict[str, Any]
    ) -> None:
        conn.execute(
            "INSERT INTO events (job_id, t, kind, message, data) VALUES (?, ?, ?, ?, ?)",
            (job_id, now, kind, message, json.dumps(data)),
        )

    def events(
        self, *, job_id: int | None = None, namespace: str | None = None, after: int = 0, limit: int = 100
    ) -> list[Event]:
        """Events after an id, oldest first."""
        clauses = ["events.id > ?"]
        args: list[Any] = [after]
        if job_id is not None:
            clauses.append("events.job_id = ?")
            args.append(job_id)
        if namespace is not None:
            clauses.append("jobs.namespace = ?")
            args.append(namespace)
        rows = self._read(
            "SELECT events.id, events.job_id, jobs.namespace, jobs.name, events.t, events.kind, events.message, "
            f"events.data FROM events JOIN jobs ON jobs.id = events.job_id WHERE {' AND '.join(clauses)} "
            "ORDER BY events.id LIMIT ?",
            (*args, limit),
        )
        return [Event(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7])) for r in rows]


_PROGRESS_SQL = (
    "(CASE WHEN state = 'finished' THEN 100.0 WHEN total_steps > 0 AND step IS NOT NULL "
    "THEN MIN(100.0, 100.0 * step / total_steps) WHEN total_epochs > 0 AND epoch IS NOT NULL "
    "THEN MIN(100.0, 100.0 * epoch / total_epochs) ELSE reported_progress END)"
)
_SORT_SQL = {
    "name": "name",
    "namespace": "namespace",
    "state": "state",
    "progress": _PROGRESS_SQL,
    "step": "step",
    "created": "created_at",
    "updated": "updated_at",
    "eta": "(CASE WHEN state IN ('finished', 'failed', 'stopped') THEN NULL ELSE eta_at + eta_seconds END)",
}


def _store_float(value: float) -> float | str:
    """SQLite turns NaN into NULL: store it as the text 'NaN' (infinities are REAL)."""
    return "NaN" if math.isnan(value) else value


def _load_float(value: Any) -> float:
    return math.nan if value is None or value == "NaN" else float(value)


def _job(row: tuple[Any, ...]) -> Job:
    (
        job_id,
        namespace,
        name,
        attempt,
        state,
        created_at,
        updated_at,
        started_at,
        finished_at,
        last_report_at,
        step,
        total_steps,
        epoch,
        total_epochs,
        samples,
        steps_per_second,
        samples_per_second,
        reported_eta,
        reported_progress,
        reason,
        exit_code,
        source,
        gpus,
        gpu_hour_cost,
        world_size,
        params,
        last_metrics,
        nonfinite_total,
        eta_seconds,
        eta_rate,
        eta_at,
    ) = row
    return Job(
        id=job_id,
        namespace=namespace,
        name=name,
        attempt=attempt,
        state=state,
        created_at=created_at,
        updated_at=updated_at,
        started_at=started_at,
        finished_at=finished_at,
        last_report_at=last_report_at,
        step=step,
        total_steps=total_steps,
        epoch=epoch,
        total_epochs=total_epochs,
        samples=samples,
        steps_per_second=steps_per_second,
        samples_per_second=samples_per_second,
        reported_eta=reported_eta,
        reported_progress=reported_progress,
        reason=reason,
        exit_code=exit_code,
        source=source,
        gpus=gpus,
        gpu_hour_cost=gpu_hour_cost,
        world_size=world_size,
        params=json.loads(params),
        last_metrics={k: decode_float(v, k) for k, v in json.loads(last_metrics).items()},
        nonfinite_total=nonfinite_total,
        eta_seconds=eta_seconds,
        eta_rate=eta_rate,
        eta_at=eta_at,
    )
