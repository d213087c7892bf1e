"""The embedded store: one SQLite file in WAL mode, one writer, many readers.

Writes go through one connection guarded by a lock (SQLite has one writer anyway; serialising them
here turns "database is locked" into waiting); each reading thread has its own connection, and WAL
lets reads proceed while a write is in progress. ``synchronous=NORMAL`` with WAL keeps every
committed transaction across a crash of the server process (SIGKILL included): an acknowledged
report is never lost. The schema carries its version in ``PRAGMA user_version``; migrations only
add, so an upgrade never loses data.

One server process serves the file (several processes scale out on PostgreSQL instead). Other
programs may still write it now and then (``stepwatch db`` commands, ``stepwatch token create --db``,
a hand-made ``sqlite3`` session): at its next write this store sees that the file changed under it
(``PRAGMA data_version``) and forgets everything it kept in memory, and tells its listeners
(:class:`.ReplicaCache`).

How a report is written is in :mod:`.sqlite_ingest`, and what both stores do with the same statements
(commands, policies, events, tokens, the audit log) in :mod:`.sql_common`.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...protocol import Command, Report, TrainerStatus
from . import rollups
from .access import TOKEN_COLUMNS, ApiToken, AuditEntry, token_from_row
from .base import (
    FINAL_STATES,
    ChangeListener,
    IngestResult,
    Job,
    JobFilter,
    MetricLimitError,
    PendingReport,
    ProgressSample,
    SeriesColumns,
    SeriesPoint,
    StoreError,
)
from .replica_cache import ReplicaCache
from .rollups import FANOUT
from .rows import JOB_COLUMNS, job_from_row, load_float
from .sql_common import SqlStore
from .sqlite_checkpoint import FALLBACK_PAGES, WalCheckpointer
from .sqlite_files import prepare_database_path
from .sqlite_ingest import write_report, write_status
from .sqlite_schema import MIGRATIONS, PROGRESS_SQL, SCHEMA_VERSION, SORT_SQL

__all__ = ["SQLiteStore"]


BUSY_TIMEOUT_MS = 10_000
"""How long a write waits for another process's write lock before it fails ("database is locked")."""


class _WouldWait(Exception):
    """A write that was asked not to wait found the write lock taken (by another thread or program)."""


class SQLiteStore(SqlStore):
    """The embedded default store (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            try:
                prepare_database_path(self.path)
            except OSError as exc:
                raise StoreError(f"cannot create the directory of the database {self.path}: {exc}") from None
        self._write_lock = threading.Lock()
        self._cache = ReplicaCache(origin="sqlite")  # told of no other writer's changes: it forgets all instead
        self._cache.on_listening(True)
        self._api_tokens: dict[str, ApiToken] = {}
        """API tokens by hash, as found (cleared by every revocation)."""
        self._token_generation = 0
        """Raised by every revocation: a lookup that began before one does not cache what it read."""
        self._remembered: dict[int, tuple[Job, str | None, bool]] = {}
        """Jobs written by the open transaction, put in the cache when it commits."""
        self._data_version: int | None = None
        self._unfolded: dict[tuple[int, str], int] = {}
        """Windows stored per series since its last fold into roll-ups (this process only)."""
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._in_use = _InUse()
        """Reads and writes under way: :meth:`close` waits for them (closing a connection another thread
        is reading from crashes the process: a server stopped while a worker thread still read)."""
        self._checkpointer = WalCheckpointer(self._open, pause_writers=lambda: self._write_lock)
        """Copies the write-ahead log into the file, away from the writer (``store.sqlite_checkpoint``);
        started once the database is open and up to date."""
        self._writer = self._connect()
        self._busy_ms = int(self._writer.execute("PRAGMA busy_timeout").fetchone()[0])
        """How long the writer waits for another process's lock (what a write that must not wait restores)."""
        self._migrate()
        self._writer.execute(f"PRAGMA wal_autocheckpoint={FALLBACK_PAGES}")  # copied back by a thread instead
        (self._data_version,) = self._writer.execute("PRAGMA data_version").fetchone()
        if self.path != ":memory:":
            self._checkpointer.start()

    # ------------------------------------------------------------------------------- connections

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = self._open()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the database {self.path}: {exc}") from None
        self._all.append(conn)
        return conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    @contextmanager
    def _write(self, wait: bool = True) -> Iterator[sqlite3.Connection]:
        """The writer's transaction; ``wait=False``: :class:`_WouldWait` rather than waiting for the lock
        of this store (another thread writes) or of the file (another program writes)."""
        if not self._write_lock.acquire(blocking=wait):
            raise _WouldWait
        try:
            self._in_use.enter()
        except StoreError:
            self._write_lock.release()
            raise
        try:
            conn = self._writer
            self._begin(conn, wait)
            epoch = self._cache.epoch
            self._remembered.clear()
            try:
                yield conn
                conn.execute("COMMIT")
                self._cache.written(self._remembered.values(), epoch)
                self._remembered.clear()
            except BaseException as exc:
                self._remembered.clear()
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(exc, sqlite3.Error):  # disk full, I/O error, corruption...
                    raise StoreError(f"the database cannot be written: {exc}") from None
                raise
        finally:
            self._write_lock.release()
            self._in_use.exit()

    def _begin(self, conn: sqlite3.Connection, wait: bool) -> None:
        """Open the write transaction; when another program wrote the file since the last one, forget
        what was kept in memory."""
        try:
            if wait:
                conn.execute("BEGIN IMMEDIATE")
            else:
                conn.execute("PRAGMA busy_timeout=0")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                finally:
                    conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            (version,) = conn.execute("PRAGMA data_version").fetchone()
        except sqlite3.OperationalError as exc:
            if not wait and not conn.in_transaction and "locked" in str(exc):
                raise _WouldWait from None
            raise StoreError(f"the database cannot be written: {exc}") from None
        except sqlite3.Error as exc:
            raise StoreError(f"the database cannot be written: {exc}") from None
        if version != self._data_version:  # another program wrote the file: what we cached may be old
            self._forget_all()
            self._data_version = version

    def _forget_all(self) -> None:
        self._cache.on_listening(True)
        self._token_generation += 1
        self._api_tokens.clear()

    def follow_changes(self, listener: ChangeListener) -> None:
        """Tell ``listener`` when another program wrote this file (``None``: any job may have changed), as
        this store notices it: at its next write."""
        self._cache.listeners.append(listener)

    def _remember(self, job: Job, token_hash: str | None = None, latest: bool = False) -> None:
        """Cache a job written by the open transaction, once it commits (``latest``: just registered)."""
        pending = self._remembered.get(job.id)
        if token_hash is None:
            token_hash = pending[1] if pending is not None else self._cache.token_hash(job.id)
        self._remembered[job.id] = (job, token_hash, latest or (pending is not None and pending[2]))

    def _current(self, conn: sqlite3.Connection, job_id: int) -> tuple[Job, str]:
        """A job as it stands inside the open write transaction, and its token hash."""
        pending = self._remembered.get(job_id)
        if pending is not None:
            job, token_hash, _ = pending
            return job, token_hash if token_hash is not None else self._token_of(conn, job_id)
        cached = self._cache.by_id(job_id)
        if cached is not None:
            return cached, self._token_of(conn, job_id)
        row = conn.execute(f"SELECT {JOB_COLUMNS}, token_hash FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise KeyError(job_id)
        job, token_hash = job_from_row(row[:-1]), str(row[-1])
        self._remember(job, token_hash)
        return job, token_hash

    def _job_in(self, conn: sqlite3.Connection, job_id: int) -> Job:
        """A job as it stands in the open write transaction (``KeyError`` when it is not in the database)."""
        return self._current(conn, job_id)[0]

    def _token_of(self, conn: sqlite3.Connection, job_id: int) -> str:
        cached = self._cache.token_hash(job_id)
        if cached is not None:
            return cached
        row = conn.execute("SELECT token_hash FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return str(row[0]) if row else ""

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._in_use:
                return self._reader().execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"the database cannot be read: {exc}") from None

    def _migrate(self) -> None:
        (version,) = self._writer.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            self.close()
            raise StoreError(
                f"the database {self.path} has schema version {version}, newer than this stepwatch's "
                f"{SCHEMA_VERSION}: upgrade stepwatch (an older one cannot read it)"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            with self._write_lock:
                self._writer.executescript(f"BEGIN; {MIGRATIONS[target]} PRAGMA user_version = {target}; COMMIT;")

    def close(self) -> None:
        """Close every connection, once the reads and writes under way are done (at most 5 s)."""
        self._in_use.close(5.0)
        self._checkpointer.close()
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
        policy: dict[str, Any] | None = None,
        gpu_type: str = "",
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
                old, _ = self._current(conn, row[0])
                self._update(conn, old, {"state": "failed", "finished_at": now, "updated_at": now, "reason": reason})
                self._event(conn, old, now, "failed", reason, {})
            attempt = 1 if row is None else row[1] + 1
            cur = conn.execute(
                "INSERT INTO jobs (namespace, name, attempt, token_hash, state, created_at, updated_at, "
                "total_steps, total_epochs, params, gpus, gpu_hour_cost, source, policy, gpu_type) "
                "VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            )
            job_id = int(cur.lastrowid or 0)
            new = job_from_row(conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone())
            self._event(conn, new, now, "registered", f"attempt {attempt} registered", {"attempt": attempt})
            self._remember(new, token_hash, latest=True)
        return new

    def cached_job(self, namespace: str, name: str) -> Job | None:
        """The latest attempt of a job, when this store wrote it recently (no I/O)."""
        return self._cache.latest(namespace, name)

    def cached_token_hash(self, job_id: int) -> str | None:
        """A job's token hash, when this store wrote the job recently (no I/O)."""
        return self._cache.token_hash(job_id)

    def job(self, namespace: str, name: str, attempt: int | None = None) -> Job | None:
        """The latest attempt of a job, or the given one."""
        if attempt is None:
            cached = self._cache.latest(namespace, name)
            if cached is not None:
                return cached
            epoch = self._cache.epoch
            rows = self._read(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = ? AND name = ? ORDER BY attempt DESC LIMIT 1",
                (namespace, name),
            )
            if not rows:
                return None
            job = job_from_row(rows[0])
            self._cache.offer(job, epoch, latest=True)
            return job
        else:
            rows = self._read(
                f"SELECT {JOB_COLUMNS} FROM jobs WHERE namespace = ? AND name = ? AND attempt = ?",
                (namespace, name, attempt),
            )
        return job_from_row(rows[0]) if rows else None

    def job_by_id(self, job_id: int) -> Job | None:
        """A job by id."""
        cached = self._cache.by_id(job_id)
        if cached is not None:
            return cached
        epoch = self._cache.epoch
        rows = self._read(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        job = job_from_row(rows[0])
        self._cache.offer(job, epoch)
        return job

    def _where(self, where: JobFilter) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        if where.namespace:
            clauses.append("namespace = ?")
            args.append(where.namespace)
        if where.namespaces is not None:
            clauses.append(f"namespace IN ({', '.join('?' for _ in where.namespaces)})" if where.namespaces else "0")
            args.extend(where.namespaces)
        if where.state:
            clauses.append(f"state IN ({', '.join('?' for _ in where.state)})")
            args.extend(where.state)
        if where.health:
            clauses.append(f"health IN ({', '.join('?' for _ in where.health)})")
            args.extend(where.health)
        if where.text:
            clauses.append("(instr(name, ?) > 0 OR instr(namespace, ?) > 0)")
            args.extend([where.text.lower(), where.text.lower()])
        if where.min_progress is not None:
            clauses.append(f"{PROGRESS_SQL} >= ?")
            args.append(where.min_progress)
        if where.max_progress is not None:
            clauses.append(f"{PROGRESS_SQL} <= ?")
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
        nulls_last = "" if column == "updated_at" else f"{column} IS NULL, "  # NOT NULL: its index can serve
        epoch = self._cache.epoch
        ids = [
            r[0]
            for r in self._read(
                f"SELECT id FROM jobs{sql} ORDER BY {nulls_last}{column} {order}, id {order} LIMIT ? OFFSET ?",
                (*args, where.limit, where.offset),
            )
        ]
        found = {i: job for i in ids if (job := self._cache.by_id(i)) is not None}
        missing = [i for i in ids if i not in found]
        for start in range(0, len(missing), 500):  # rows the cache does not hold: read once, then kept
            chunk = missing[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            for row in self._read(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id IN ({marks})", tuple(chunk)):
                job = job_from_row(row)
                self._cache.offer(job, epoch)
                found[job.id] = job
        return [found[i] for i in ids if i in found]

    # ------------------------------------------------------------------------------------ ingest

    def ingest_report(
        self, job: Job, report: Report, now: float, estimate: tuple[float | None, float | None] | None = None
    ) -> IngestResult:
        """Store a report once; move progress only forward in report time; record acks and state.

        ``estimate`` (seconds left, steps per second), computed by the caller for this report, is
        stored in the same transaction when the report is rank 0's newest.
        """
        (result,) = self.ingest_reports([PendingReport(job, report, now, estimate)])
        if isinstance(result, StoreError):
            raise result
        return result

    def ingest_reports(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError]:
        """Store reports in one transaction (each in a savepoint of its own, so one failure stays its own)."""
        return self._ingest_batch(batch, wait=True)

    def ingest_reports_nowait(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError] | None:
        """``ingest_reports`` unless another thread or process holds the write lock (then ``None``)."""
        try:
            return self._ingest_batch(batch, wait=False)
        except _WouldWait:
            return None

    def _ingest_batch(self, batch: Sequence[PendingReport], wait: bool) -> list[IngestResult | StoreError]:
        results: list[IngestResult | StoreError] = []
        with self._write(wait) as conn:
            for item in batch:
                conn.execute("SAVEPOINT report")
                before = self._remembered.get(item.job.id)
                try:
                    results.append(write_report(self, conn, item))
                except MetricLimitError as exc:  # before anything of it was written
                    results.append(exc)
                except (sqlite3.Error, KeyError) as exc:
                    conn.execute("ROLLBACK TO report")
                    if before is None:
                        self._remembered.pop(item.job.id, None)
                    else:
                        self._remembered[item.job.id] = before
                    problem = "is not in the database" if isinstance(exc, KeyError) else f"could not be stored: {exc}"
                    results.append(StoreError(f"the report of job {item.job.key} {problem}"))
                conn.execute("RELEASE report")
        return results

    def ingest_status(self, job: Job, status: TrainerStatus, now: float) -> IngestResult:
        """Store an upstream status: progress, ETA and every numeric metric as a one-value window."""
        with self._write() as conn:
            return write_status(self, conn, job, status, now)

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
        return SeriesColumns(steps, times, [load_float(v) for v in lasts], mins, maxs, means, counts, nonfinites)

    def _count_windows(self, conn: sqlite3.Connection, job_id: int, metrics: list[str]) -> None:
        """Count new windows; a series with :data:`FANOUT` unfolded ones is folded into roll-ups."""
        if len(self._unfolded) > 100_000:
            self._unfolded.clear()  # forgetting counts only delays folds: reads fold what is left
        for metric in metrics:
            key = (job_id, metric)
            n = self._unfolded.get(key, 0) + 1
            if n > FANOUT:  # the window being stored is not folded yet: FANOUT before it are
                rollups.fold(conn, job_id, metric)
                n = 1
            self._unfolded[key] = n

    def history_columns(self, job_id: int, metric: str, max_points: int) -> SeriesColumns:
        """A series for ``max_points``: every window when short, else roll-ups and the windows after them."""
        for _ in range(2):
            try:
                with self._in_use:
                    found = rollups.read_series(self._reader(), job_id, metric, max_points)
            except rollups.NeedsFold:
                self._fold_all(job_id, metric)  # older data, or ingest fell behind: once, then it is kept up
                continue
            except sqlite3.Error as exc:
                raise StoreError(f"the database cannot be read: {exc}") from None
            if found is not None:
                return found
            break
        return self.series_columns(job_id, metric)

    def _fold_all(self, job_id: int, metric: str) -> None:
        """Fold a whole series, in transactions of 32,768 windows (ingest goes on in between)."""
        chunk = 8 * rollups.FOLD_CHUNK
        while True:
            with self._write() as conn:
                if rollups.fold(conn, job_id, metric, limit=chunk) < chunk:
                    return

    def _retention_tx(self, job_id: int | None) -> AbstractContextManager[sqlite3.Connection]:
        return self._write()  # one writer: nothing else to lock

    def rebuild_rollups(self, job_id: int | None = None) -> int:
        """Rebuild the roll-ups of a job or of all (after a VACUUM, or data written by another tool)."""
        with self._write() as conn:
            folded = rollups.rebuild(conn, job_id)
        self._unfolded.clear()
        return folded

    def series(self, job_id: int, metric: str) -> list[SeriesPoint]:
        """Every window of a metric, in step order."""
        rows = self._read(
            "SELECT step, t, last, min, max, mean, count, nonfinite FROM points WHERE job_id = ? AND metric = ? "
            "ORDER BY step, t",
            (job_id, metric),
        )
        return [SeriesPoint(r[0], r[1], load_float(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows]

    def metric_names(self, job_id: int) -> list[str]:
        """The metrics a job has reported, sorted."""
        # a skip-scan of the (job_id, metric) index: one seek per metric, however long the series
        rows = self._read(
            "WITH RECURSIVE names (metric) AS (SELECT MIN(metric) FROM points WHERE job_id = ?1 UNION ALL "
            "SELECT (SELECT MIN(metric) FROM points WHERE job_id = ?1 AND metric > names.metric) FROM names "
            "WHERE names.metric IS NOT NULL) SELECT metric FROM names WHERE metric IS NOT NULL",
            (job_id,),
        )
        return [r[0] for r in rows]

    def progress_samples(self, job_id: int, since: float | None = None) -> list[ProgressSample]:
        """Rank 0's (arrival time, step), oldest first."""
        rows = self._read(
            "SELECT received_at, step FROM reports WHERE job_id = ? AND rank = 0 AND step IS NOT NULL "
            "AND newest = 1 AND received_at >= ? ORDER BY received_at",
            (job_id, since if since is not None else -math.inf),
        )
        return [ProgressSample(r[0], r[1]) for r in rows]

    # ---------------------------------------------------------------------------------- commands

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

    def _insert_event(
        self, conn: sqlite3.Connection, job_id: int, now: float, kind: str, message: str, data: dict[str, Any]
    ) -> int:
        cur = conn.execute(
            "INSERT INTO events (job_id, t, kind, message, data) VALUES (?, ?, ?, ?, ?)",
            (job_id, now, kind, message, json.dumps(data)),
        )
        return int(cur.lastrowid or 0)

    # ------------------------------------------------------------------------ access (tokens, audit)

    def cached_api_token(self, token_hash: str) -> ApiToken | None:
        """A found API token, from memory."""
        return self._api_tokens.get(token_hash)

    def api_token(self, token_hash: str) -> ApiToken | None:
        """The token with this hash; found ones are cached (revocations here clear the cache)."""
        cached = self._api_tokens.get(token_hash)
        if cached is not None:
            return cached
        generation = self._token_generation
        rows = self._read(f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE token_hash = ?", (token_hash,))
        if not rows:
            return None
        token = token_from_row(rows[0])
        if len(self._api_tokens) >= 10_000:
            self._api_tokens.clear()
        if generation == self._token_generation:
            self._api_tokens[token_hash] = token
        return token

    def revoke_token(self, token_id: str, now: float, entry: AuditEntry) -> ApiToken | None:
        """Revoke a token; it is refused from now on."""
        with self._write() as conn:
            row = conn.execute(f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = ?", (token_id,)).fetchone()
            if row is None:
                return None
            token = token_from_row(row)
            if token.revoked_at is None:
                conn.execute(
                    "UPDATE api_tokens SET revoked_at = ?, revoked_by = ? WHERE id = ?", (now, entry.actor, token_id)
                )
                token = replace(token, revoked_at=now, revoked_by=entry.actor)
                self._audit(conn, entry)
                self._token_generation += 1
                self._api_tokens.clear()
        self._token_generation += 1
        self._api_tokens.clear()
        return token

    def record_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append an entry to the audit log."""
        with self._write() as conn:
            return self._audit(conn, entry)


class _InUse:
    """Counts the store's uses under way (a context manager, or :meth:`enter`/:meth:`exit`); after
    :meth:`close`, a new use is a :class:`StoreError`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0
        self._closed = False

    def enter(self) -> None:
        with self._cond:
            if self._closed:
                raise StoreError("the store is closed")
            self._count += 1

    def exit(self) -> None:
        with self._cond:
            self._count -= 1
            if not self._count:
                self._cond.notify_all()

    def __enter__(self) -> None:
        self.enter()

    def __exit__(self, *exc: object) -> None:
        self.exit()

    def close(self, timeout: float) -> None:
        """No new use; wait up to ``timeout`` seconds for those under way."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._count == 0, timeout)
