"""The PostgreSQL store: the same records and semantics as the SQLite one, for several replicas.

``PostgresStore("postgresql://user@host/db")`` opens a small pool of connections (``psycopg_pool``)
and migrates the schema (:mod:`.postgres_schema`). Reads take a pooled connection in autocommit
mode; writes run one transaction at a time per process (as in SQLite: batches make that cheap) and
may run in several processes at once, so every write locks what it changes in the database:

- a job's row (``FOR NO KEY UPDATE``) before the job is read and written; a batch of reports locks
  the rows of all its jobs at once, in id order, so two replicas never deadlock over them;
- a registration takes an advisory lock on the job's name (two replicas cannot both create attempt 2);
- every transaction that adds events first takes an advisory lock, held to its commit, so event ids
  commit in order: a reader paging with ``after=id`` never skips one that commits late.

A report's writes (the report row, its rank, its windows) are one statement; the job's row is
written once per batch. Non-finite floats are PostgreSQL's own (NaN stays NaN, never NULL).

**The cache.** Like the SQLite store, this one keeps recent jobs in memory (:class:`.JobCache`). Other
replicas write the same rows, so each write transaction also notifies (``pg_notify``, delivered at
commit) which jobs and names it changed; every store listens (:mod:`.postgres_notify`) and forgets
them. A job read or written is cached only if no notification about it arrived in between, and
nothing is served from the cache while the listening connection is down.

What both stores do with the same statements (commands, policies, events, tokens, the audit log) is
written once in :mod:`.sql_common`; what a report changes in its job's row, once in :mod:`.job_updates`.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from typing import Any

import psycopg
from psycopg import conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from ...protocol import Command, Report, TrainerStatus
from . import rollups
from .access import TOKEN_COLUMNS, ApiToken, AuditEntry, token_from_row
from .base import (
    FINAL_STATES,
    ChangeListener,
    IngestResult,
    Job,
    JobFilter,
    PendingReport,
    ProgressSample,
    SeriesColumns,
    SeriesPoint,
    StoreError,
)
from .postgres_ingest import ReportFailed, write_reports, write_status
from .postgres_notify import Listener
from .postgres_schema import MIGRATIONS, SCHEMA_VERSION, SORT_SQL, channel, lock_key
from .replica_cache import ReplicaCache, changes_payload
from .rollups import FANOUT
from .rows import JOB_COLUMNS, job_from_row, load_float
from .sql_common import SqlStore

__all__ = ["PostgresStore", "redacted"]

FOLD_EVERY = 16 * FANOUT
"""Windows of a series stored between two folds into roll-ups. SQLite folds every 16 (a fold is a
few calls into a library); here each read of a fold is a round trip to the server, so a fold waits
for 256 windows (16 level-1 rows, written without waiting). A history read then opens at most that
many raw windows more, well within what it reads anyway."""

_NOTIFY_LIMIT = 7000
"""Bytes of a notification's payload this store sends at most (PostgreSQL's limit is 8,000)."""


def redacted(url: str) -> str:
    """A connection URL without its password, to show in messages."""
    try:
        parts = conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "the PostgreSQL database"
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host', '')}{port}/{parts.get('dbname', '')}"


class _Qmark:
    """A connection that takes ``?`` placeholders: the roll-ups' SQL is the SQLite store's too."""

    _translated: dict[str, str] = {}

    def __init__(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        self.conn = conn

    def execute(self, sql: str, parameters: Any = (), /) -> psycopg.Cursor[tuple[Any, ...]]:
        query = self._translated.get(sql)
        if query is None:
            query = self._translated[sql] = sql.replace("?", "%s")
        return self.conn.execute(query, parameters)


class PostgresStore(SqlStore):
    """The store of a PostgreSQL database, shareable by several server processes (see the module docstring)."""

    _PARAM = "%s"

    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout_s: float = 10.0) -> None:
        self.url = url
        self.where = redacted(url)
        self._connect_timeout = max(1, int(connect_timeout_s))
        try:
            with self._connect() as conn:
                row = conn.execute("SELECT current_schema()").fetchone()
                if row is None or row[0] is None:
                    raise StoreError(f"the database {self.where} has no schema to use (see its search_path)")
                self.schema = str(row[0])
                self._migrate(conn)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the database {self.where}: {_first_line(exc)}") from None
        self._events_key = lock_key(self.schema, "events")
        self._jobs_channel = channel(self.schema, "jobs")
        self.live_channel = channel(self.schema, "live")
        self._origin = uuid.uuid4().hex[:12]
        self._pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]] = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "connect_timeout": self._connect_timeout},
            timeout=30.0,
            open=False,
            name=f"stepwatch-{self._origin}",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except PoolTimeout as exc:
            raise StoreError(f"cannot open the database {self.where}: {exc}") from None
        self._write_lock = threading.Lock()
        self._remembered: dict[int, tuple[Job, str | None, bool]] = {}
        """Jobs written by the open transaction, put in the cache when it commits."""
        self._renamed: set[tuple[str, str]] = set()
        """Names whose latest attempt the open transaction changed (registrations)."""
        self._events_locked = False
        self._unfolded: dict[tuple[int, str], int] = {}
        self._cache = ReplicaCache(self._origin)
        self.live_handlers: list[Callable[[str], None]] = []
        """Callbacks of the live channel (the replica bridge's), called in the listening thread."""
        self._listener = Listener(
            self._connect,
            {
                self._jobs_channel: self._on_changed,
                self.live_channel: self._on_live,
            },
            self._on_listening,
        )
        self._listener.start(connect_timeout_s)

    # ------------------------------------------------------------------------------- connections

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(self.url, autocommit=True, connect_timeout=self._connect_timeout)

    def _migrate(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Bring the schema to :data:`SCHEMA_VERSION`, one transaction, under a lock (replicas start together)."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.schema, "migrate"),))
            conn.execute("CREATE TABLE IF NOT EXISTS stepwatch_schema (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM stepwatch_schema").fetchone()
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the database {self.where} has schema version {version}, newer than this server's "
                    f"{SCHEMA_VERSION}: upgrade stepwatch"
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                conn.execute(MIGRATIONS[target])
            if row is None:
                conn.execute("INSERT INTO stepwatch_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
            elif version < SCHEMA_VERSION:
                conn.execute("UPDATE stepwatch_schema SET version = %s", (SCHEMA_VERSION,))

    def _read(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        for attempt in range(2):
            try:
                with self._pool.connection() as conn:
                    return conn.execute(sql, args).fetchall()
            except psycopg.OperationalError as exc:  # a connection the server closed: once more, on a new one
                if attempt:
                    raise StoreError(f"the database cannot be read: {_first_line(exc)}") from None
            except (psycopg.Error, PoolTimeout) as exc:
                raise StoreError(f"the database cannot be read: {_first_line(exc)}") from None
        raise AssertionError("unreachable")

    @contextmanager
    def _reader(self) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(f"the database cannot be read: {_first_line(exc)}") from None

    @contextmanager
    def _write(self, pipeline: bool = True) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        """A write transaction, in pipeline mode: statements are sent without waiting for their answer
        until one is read, so ``BEGIN``, the writes, the notification and ``COMMIT`` share round trips."""
        with self._write_lock:
            epoch = self._cache.epoch
            self._remembered.clear()
            self._renamed.clear()
            self._events_locked = False
            try:
                with (
                    self._pool.connection() as conn,
                    conn.pipeline() if pipeline else nullcontext(),
                    conn.transaction(),
                ):
                    yield conn
                    self._announce(conn)
                self._cache.written(self._remembered.values(), epoch)
            except (psycopg.Error, PoolTimeout) as exc:
                raise StoreError(f"the database cannot be written: {_first_line(exc)}") from None
            finally:
                self._remembered.clear()
                self._renamed.clear()

    def _announce(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Tell the other replicas which jobs this transaction changed (delivered when it commits)."""
        if not self._remembered and not self._renamed:
            return
        payload = changes_payload(self._origin, self._remembered, self._renamed, _NOTIFY_LIMIT)
        conn.execute("SELECT pg_notify(%s, %s)", (self._jobs_channel, payload))

    def _remember(self, job: Job, token_hash: str | None = None, latest: bool = False) -> None:
        """Cache a job written by the open transaction, once it commits (``latest``: just registered)."""
        pending = self._remembered.get(job.id)
        if token_hash is None and pending is not None:
            token_hash = pending[1]
        self._remembered[job.id] = (job, token_hash, latest or (pending is not None and pending[2]))

    def _current(self, conn: psycopg.Connection[tuple[Any, ...]], job_id: int) -> Job:
        """A job as it stands in the open write transaction, its row locked until the commit."""
        pending = self._remembered.get(job_id)
        if pending is not None:
            return pending[0]
        row = conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s FOR NO KEY UPDATE", (job_id,)).fetchone()
        if row is None:
            raise KeyError(job_id)
        job = job_from_row(row)
        self._remember(job)
        return job

    def _job_in(self, conn: psycopg.Connection[tuple[Any, ...]], job_id: int) -> Job:
        """A job as it stands in the open write transaction, its row locked (``KeyError``: not in the database)."""
        return self._current(conn, job_id)

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._listener.close()
        self._pool.close()

    # ------------------------------------------------------------------------------------ caching

    def _on_changed(self, payload: str) -> None:
        self._cache.on_changed(payload)

    def follow_changes(self, listener: ChangeListener) -> None:
        """Tell ``listener`` which jobs the other replicas change (as their notifications are heard)."""
        self._cache.listeners.append(listener)

    def _on_listening(self, listening: bool) -> None:
        self._cache.on_listening(listening)

    def _on_live(self, payload: str) -> None:
        for handler in list(self.live_handlers):
            handler(payload)

    def cached_job(self, namespace: str, name: str) -> Job | None:
        """The latest attempt of a job, when cached and the cache is trusted (no I/O)."""
        return self._cache.latest(namespace, name)

    def cached_token_hash(self, job_id: int) -> str | None:
        """A job's token hash, when cached (it never changes: no I/O)."""
        return self._cache.token_hash(job_id)

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
        policy: dict[str, Any] | None = None,
        gpu_type: str = "",
    ) -> Job:
        """Create a job, or its next attempt; ``KeyError`` while the latest attempt is still live."""
        with self._write() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.schema, f"job:{namespace}/{name}"),))
            row = conn.execute(
                "SELECT id, attempt, state FROM jobs WHERE namespace = %s AND name = %s ORDER BY attempt DESC LIMIT 1",
                (namespace, name),
            ).fetchone()
            if row is not None and row[2] not in FINAL_STATES:
                if not supersede:
                    raise KeyError(f"{namespace}/{name}")
                reason = f"superseded by attempt {row[1] + 1}"
                old = self._current(conn, row[0])
                self._update(conn, old, {"state": "failed", "finished_at": now, "updated_at": now, "reason": reason})
                self._event(conn, old, now, "failed", reason, {})
            attempt = 1 if row is None else row[1] + 1
            created = conn.execute(
                "INSERT INTO jobs (namespace, name, attempt, token_hash, state, created_at, updated_at, "
                "total_steps, total_epochs, params, gpus, gpu_hour_cost, source, policy, gpu_type) "
                f"VALUES (%s, %s, %s, %s, 'pending', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING {JOB_COLUMNS}",
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
                    json.dumps(policy or {}),
                    gpu_type,
                ),
            ).fetchone()
            assert created is not None
            new = job_from_row(created)
            self._event(conn, new, now, "registered", f"attempt {attempt} registered", {"attempt": attempt})
            self._remember(new, token_hash, latest=True)
            self._renamed.add((namespace, name))
        return new

    def job(self, namespace: str, name: str, attempt: int | None = None) -> Job | None:
        """The latest attempt of a job, or the given one."""
        if attempt is not None:
            rows = self._read(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = %s AND name = %s AND attempt = %s",
                (namespace, name, attempt),
            )
            return job_from_row(rows[0]) if rows else None
        cached = self.cached_job(namespace, name)
        if cached is not None:
            return cached
        epoch = self._cache.epoch
        rows = self._read(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = %s AND name = %s ORDER BY attempt DESC LIMIT 1",
            (namespace, name),
        )
        if not rows:
            return None
        job = job_from_row(rows[0])
        self._cache.offer(job, epoch, latest=True)
        return job

    def job_by_id(self, job_id: int) -> Job | None:
        """A job by id."""
        cached = self._cache.by_id(job_id)
        if cached is not None:
            return cached
        epoch = self._cache.epoch
        rows = self._read(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s", (job_id,))
        if not rows:
            return None
        job = job_from_row(rows[0])
        self._cache.offer(job, epoch)
        return job

    def _where(self, where: JobFilter) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if where.namespace:
            clauses.append("namespace = %s")
            args.append(where.namespace)
        if where.namespaces is not None:
            clauses.append("namespace = ANY(%s)")
            args.append(list(where.namespaces))
        if where.state:
            clauses.append("state = ANY(%s)")
            args.append(list(where.state))
        if where.health:
            clauses.append("health = ANY(%s)")
            args.append(list(where.health))
        if where.text:
            clauses.append("(strpos(name, %s) > 0 OR strpos(namespace, %s) > 0)")
            args.extend([where.text.lower(), where.text.lower()])
        if where.min_progress is not None:
            clauses.append(f"{SORT_SQL['progress']} >= %s")
            args.append(where.min_progress)
        if where.max_progress is not None:
            clauses.append(f"{SORT_SQL['progress']} <= %s")
            args.append(where.max_progress)
        if not where.all_attempts:
            clauses.append(
                "NOT EXISTS (SELECT 1 FROM jobs AS newer WHERE newer.namespace = jobs.namespace "
                "AND newer.name = jobs.name AND newer.attempt > jobs.attempt)"
            )
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", args

    def jobs(self, where: JobFilter) -> list[Job]:
        """Jobs matching a filter, most recently updated first."""
        sql, args = self._where(where)
        order = "DESC" if where.descending else "ASC"
        column = SORT_SQL.get(where.sort, "updated_at")
        nulls_last = "" if column == "updated_at" else f"{column} IS NULL, "
        epoch = self._cache.epoch
        ids = [
            r[0]
            for r in self._read(
                f"SELECT id FROM jobs{sql} ORDER BY {nulls_last}{column} {order}, id {order} LIMIT %s OFFSET %s",
                (*args, where.limit, where.offset),
            )
        ]
        found = {i: job for i in ids if (job := self._cache.by_id(i)) is not None}
        missing = [i for i in ids if i not in found]
        if missing:  # rows the cache does not hold: read once, then kept
            for row in self._read(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ANY(%s)", (missing,)):
                job = job_from_row(row)
                self._cache.offer(job, epoch)
                found[job.id] = job
        return [found[i] for i in ids if i in found]

    # ------------------------------------------------------------------------------------ ingest

    def ingest_report(
        self, job: Job, report: Report, now: float, estimate: tuple[float | None, float | None] | None = None
    ) -> IngestResult:
        """Store a report once; move progress only forward in report time; record acks and state."""
        (result,) = self.ingest_reports([PendingReport(job, report, now, estimate)])
        if isinstance(result, StoreError):
            raise result
        return result

    def ingest_reports(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError]:
        """Store reports in one transaction, in few round trips; a report that fails fails alone
        (see :mod:`.postgres_ingest`)."""
        try:
            with self._write() as conn:
                return write_reports(self, conn, batch, isolate=False)
        except ReportFailed:
            with self._write(pipeline=False) as conn:  # savepoints, one report at a time
                return write_reports(self, conn, batch, isolate=True)

    def ingest_status(self, job: Job, status: TrainerStatus, now: float) -> IngestResult:
        """Store an upstream status: progress, ETA and every numeric metric as a one-value window."""
        with self._write() as conn:
            return write_status(self, conn, job, status, now)

    # ----------------------------------------------------------------------------------- history

    def series_columns(self, job_id: int, metric: str) -> SeriesColumns:
        """Every window of a metric, in step order, as columns."""
        rows = self._read(
            "SELECT step, t, last, min, max, mean, count, nonfinite FROM points WHERE job_id = %s AND metric = %s "
            "ORDER BY step, t, rowid",
            (job_id, metric),
        )
        if not rows:
            return SeriesColumns([], [], [], [], [], [], [], [])
        steps, times, lasts, mins, maxs, means, counts, nonfinites = (list(c) for c in zip(*rows))
        return SeriesColumns(steps, times, lasts, mins, maxs, means, counts, nonfinites)

    def series(self, job_id: int, metric: str) -> list[SeriesPoint]:
        """Every window of a metric, in step order."""
        rows = self._read(
            "SELECT step, t, last, min, max, mean, count, nonfinite FROM points WHERE job_id = %s AND metric = %s "
            "ORDER BY step, t, rowid",
            (job_id, metric),
        )
        return [SeriesPoint(r[0], r[1], load_float(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows]

    def _count_windows(self, conn: psycopg.Connection[tuple[Any, ...]], job_id: int, metrics: list[str]) -> None:
        """Count new windows; a series with :data:`FOLD_EVERY` unfolded ones is folded into roll-ups."""
        if len(self._unfolded) > 100_000:
            self._unfolded.clear()  # forgetting counts only delays folds: reads fold what is left
        for metric in metrics:
            key = (job_id, metric)
            n = self._unfolded.get(key, 0) + 1
            if n > FOLD_EVERY:
                rollups.fold(_Qmark(conn), job_id, metric)
                n = 1
            self._unfolded[key] = n

    def history_columns(self, job_id: int, metric: str, max_points: int) -> SeriesColumns:
        """A series for ``max_points``: every window when short, else roll-ups and the windows after them."""
        for _ in range(2):
            try:
                with self._reader() as conn:
                    found = rollups.read_series(_Qmark(conn), job_id, metric, max_points)
            except rollups.NeedsFold:
                self._fold_all(job_id, metric)  # older data, or ingest fell behind: once, then it is kept up
                continue
            if found is not None:
                return found
            break
        return self.series_columns(job_id, metric)

    def _fold_all(self, job_id: int, metric: str) -> None:
        """Fold a whole series, in transactions of 32,768 windows, the job locked (another replica may fold it)."""
        chunk = 8 * rollups.FOLD_CHUNK
        while True:
            with self._write() as conn:
                conn.execute("SELECT 1 FROM jobs WHERE id = %s FOR NO KEY UPDATE", (job_id,))
                if rollups.fold(_Qmark(conn), job_id, metric, limit=chunk) < chunk:
                    return

    @contextmanager
    def _retention_tx(self, job_id: int | None) -> Iterator[_Qmark]:
        with self._write(pipeline=False) as conn:  # each DELETE's row count is read at once
            if job_id is not None:  # ingest and folds of this job wait; other jobs go on
                conn.execute("SELECT 1 FROM jobs WHERE id = %s FOR NO KEY UPDATE", (job_id,))
            yield _Qmark(conn)

    def rebuild_rollups(self, job_id: int | None = None) -> int:
        """Rebuild the roll-ups of a job or of all (data written by another tool)."""
        with self._write() as conn:
            if job_id is None:
                conn.execute("SELECT 1 FROM jobs ORDER BY id FOR NO KEY UPDATE")
            else:
                conn.execute("SELECT 1 FROM jobs WHERE id = %s FOR NO KEY UPDATE", (job_id,))
            folded = rollups.rebuild(_Qmark(conn), job_id)
        self._unfolded.clear()
        return folded

    def metric_names(self, job_id: int) -> list[str]:
        """The metrics a job has reported, sorted (a skip-scan of the index: one seek per metric)."""
        rows = self._read(
            "WITH RECURSIVE names (metric) AS (SELECT MIN(metric) FROM points WHERE job_id = %(job)s UNION ALL "
            "SELECT (SELECT MIN(metric) FROM points WHERE job_id = %(job)s AND metric > names.metric) FROM names "
            "WHERE names.metric IS NOT NULL) SELECT metric FROM names WHERE metric IS NOT NULL",
            {"job": job_id},
        )
        return [r[0] for r in rows]

    def progress_samples(self, job_id: int, since: float | None = None) -> list[ProgressSample]:
        """Rank 0's (arrival time, step), oldest first."""
        rows = self._read(
            "SELECT received_at, step FROM reports WHERE job_id = %s AND rank = 0 AND step IS NOT NULL "
            "AND newest AND received_at >= %s ORDER BY received_at",
            (job_id, since if since is not None else -math.inf),
        )
        return [ProgressSample(r[0], r[1]) for r in rows]

    # ---------------------------------------------------------------------------------- commands

    def pending_commands(self, job_id: int) -> list[Command]:
        """Commands not acknowledged yet, oldest first."""
        rows = self._read(
            "SELECT id, kind, reason FROM commands WHERE job_id = %s AND acked_at IS NULL ORDER BY created_at LIMIT 16",
            (job_id,),
        )
        return [Command(id=r[0], kind=r[1], reason=r[2]) for r in rows]

    # ------------------------------------------------------------------------------------ events

    def _insert_event(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        job_id: int,
        now: float,
        kind: str,
        message: str,
        data: dict[str, Any],
    ) -> int:
        if not self._events_locked:  # held to the commit: event ids commit in the order they are taken
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._events_key,))
            self._events_locked = True
        # reading the id back waits for the pipeline's answer: a round trip, on the rare writes with an event
        row = conn.execute(
            "INSERT INTO events (job_id, t, kind, message, data) VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (job_id, now, kind, message, json.dumps(data)),
        ).fetchone()
        assert row is not None
        return int(row[0])

    # ---------------------------------------------------------------------------------- replicas

    def send_live(self, payloads: Sequence[str], now: float, origin: str = "") -> None:
        """Notify the other replicas of live updates (JSON texts), in order; large ones go through a table
        (the notification names the row, and ``origin``, so that the sender need not read it)."""
        if not payloads:
            return
        try:
            with self._pool.connection() as conn, conn.transaction():
                for payload in payloads:
                    sent = payload
                    if len(payload.encode()) > _NOTIFY_LIMIT:
                        row = conn.execute(
                            "INSERT INTO live_spill (t, payload) VALUES (%s, %s) RETURNING id", (now, payload)
                        ).fetchone()
                        assert row is not None
                        sent = json.dumps({"o": origin, "spill": row[0]})
                    conn.execute("SELECT pg_notify(%s, %s)", (self.live_channel, sent))
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(f"the database cannot be written: {_first_line(exc)}") from None

    def read_spill(self, spill_id: int) -> str | None:
        """A live update too large for a notification, by id."""
        rows = self._read("SELECT payload FROM live_spill WHERE id = %s", (spill_id,))
        return str(rows[0][0]) if rows else None

    def prune_spill(self, before: float) -> None:
        """Delete the large live updates sent before a time (every replica has read them by then)."""
        try:
            with self._pool.connection() as conn:
                conn.execute("DELETE FROM live_spill WHERE t < %s", (before,))
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(f"the database cannot be written: {_first_line(exc)}") from None

    # ------------------------------------------------------------------------ access (tokens, audit)

    def cached_api_token(self, token_hash: str) -> ApiToken | None:
        """Never from memory: another replica may have revoked it a moment ago (see :meth:`api_token`)."""
        return None

    def api_token(self, token_hash: str) -> ApiToken | None:
        """The token with this hash, read from the database at every request: a revocation answered by any
        replica is refused by every other from then on. (A notification to clear a cache arrives some
        milliseconds after the commit: 5 of 80 rounds were accepted after the revoke answered.) The
        lookup is one indexed read, about 0.2 ms on a local database."""
        rows = self._read(f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE token_hash = %s", (token_hash,))
        return token_from_row(rows[0]) if rows else None

    def revoke_token(self, token_id: str, now: float, entry: AuditEntry) -> ApiToken | None:
        """Revoke a token; every replica refuses it from the commit on (each reads tokens from the database)."""
        with self._write(pipeline=False) as conn:
            row = conn.execute(
                f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = %s FOR UPDATE", (token_id,)
            ).fetchone()
            if row is None:
                return None
            token = token_from_row(row)
            if token.revoked_at is None:
                conn.execute(
                    "UPDATE api_tokens SET revoked_at = %s, revoked_by = %s WHERE id = %s", (now, entry.actor, token_id)
                )
                token = replace(token, revoked_at=now, revoked_by=entry.actor)
                self._audit(conn, entry)
        return token

    def record_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append an entry to the audit log."""
        with self._write(pipeline=False) as conn:
            return self._audit(conn, entry)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
