"""The SQL both stores share: every read and write that differs only in dialect, written once.

:class:`SqlStore` sits between :class:`~.base.Store` and the two backends. Its statements are written
with ``?`` placeholders in the SQL both databases understand; what still differs (the placeholder, a
function name, how a list is passed, the row-locking clause, how NaN is stored) is the backend's
:class:`~.sql_dialect.Dialect` (why a hand-made one and not SQLAlchemy: see :mod:`.sql_dialect`).
Here: registration, job reads and lists, a job's row written (state, health, ETA, a report's state
transition), ranks, commands, policies and events. Two more parts are written once on it: history
reads, roll-up folds and retention (:mod:`.sql_history`), API tokens and the audit log
(:mod:`.sql_access`). A store is its backend's connections and transactions and its hand-tuned ingest
(:mod:`.sqlite_ingest`, :mod:`.postgres_ingest`) with these parts::

    SQLiteStore(SQLiteIngest, SqlHistory, SqlAccess)       PostgresStore(PostgresIngest, SqlHistory, SqlAccess)

Each backend supplies its connections and transactions (``_write``, ``_read``, ``_reading``) and the
locks its other processes need (``_lock``: PostgreSQL's advisory locks; SQLite's write transaction
holds the whole file).

**The cache.** Jobs written or read are kept in memory (:class:`.ReplicaCache`), and a job's row is
written from the job as the open transaction last left it (``_remembered``, put in the cache once
the transaction commits): a report need not read its job back. Where the database locks rows
(PostgreSQL: another replica may write the job), a job is read, locked, inside each transaction that
changes it; where a write transaction holds the whole database (SQLite), the cached job is what the
database holds.
"""

from __future__ import annotations

import abc
import json
import uuid
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, ClassVar

from ...protocol import ENDED_STATES, Command, GpuReading, Report
from . import rollups
from .access import AuditEntry
from .base import (
    ChangeListener,
    Event,
    IngestResult,
    Job,
    JobFilter,
    JobState,
    PendingReport,
    RankState,
    Store,
    StoreError,
    health_change_is_event,
)
from .health_history import next_history, write_spans
from .replica_cache import ReplicaCache
from .rows import column_values, job_columns, job_from_row
from .sql_dialect import Connection, Dialect

__all__ = ["PENDING_SQL", "SqlStore"]

PENDING_SQL = "SELECT id, kind, reason FROM commands WHERE job_id = ? AND acked_at IS NULL ORDER BY created_at LIMIT 16"
"""A job's commands not acknowledged yet, oldest first (what a report's answer carries)."""


class SqlStore(Store):
    """The core both SQL stores share: jobs, a job's row, commands, policies, events (see the module
    docstring)."""

    dialect: ClassVar[Dialect]
    """What differs in this backend's SQL."""
    _FOLD_EVERY: ClassVar[int] = 16 * rollups.FANOUT
    """Windows of a series stored between two folds into roll-ups (see :meth:`_count_windows`): 256, 16
    level-1 rows a fold. A fold reads its windows back (~3 us a window on SQLite, wherever the fold
    falls) and pays a fixed part besides (finding where the roll-ups end, the level above): folding
    every 16 windows cost the SQLite store 44-54 us a report of 5 windows, every 256 14-25 us. A
    history read then reads up to 255 raw windows after the roll-ups (at most ~1 ms more on SQLite,
    a read of 100 points of 100,000 windows 2.9 -> 3.8 ms at worst), well within what it reads anyway."""

    def __init__(self) -> None:
        self.origin = uuid.uuid4().hex[:12]
        """This store's name in what it tells the other processes (its own news are not news to it)."""
        self._cache = ReplicaCache(self.origin)
        """Jobs and token hashes as last read or written, forgotten when another process changes them."""
        self._remembered: dict[int, tuple[Job, str | None, bool]] = {}
        """Jobs written by the open transaction (job, token hash, just registered), cached at its commit."""
        self._unfolded: dict[tuple[int, str], int] = {}
        """Windows stored per series since its last fold into roll-ups (this process only)."""
        self._update_sql: dict[tuple[str, ...], str] = {}
        """The ``UPDATE`` of a job's row by the columns it writes, in their order (:meth:`_update`)."""

    @property
    def _job_columns(self) -> str:
        """What a job is read as (:func:`.rows.job_columns`, its spans included) in this store's dialect."""
        return job_columns(self.dialect)

    def _sql(self, text: str) -> str:
        """A statement written with ``?`` placeholders, in the driver's own."""
        return self.dialect.sql(text)

    # ------------------------------------------------------------------------- what a backend supplies

    @abc.abstractmethod
    def _write(self, *, pipeline: bool = True) -> AbstractContextManager[Any]:
        """A write transaction; its connection (the driver's placeholders). ``pipeline=False``: each
        statement's answer is read as it is sent (a row count), where the driver may batch them."""

    @abc.abstractmethod
    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read statement (the driver's placeholders)."""

    @abc.abstractmethod
    def _reading(self) -> AbstractContextManager[Connection]:
        """A connection for several reads, with ``?`` placeholders; its errors become :class:`StoreError`."""

    def _lock(self, conn: Any, purpose: str) -> None:
        """Hold a lock named ``purpose`` until the open write transaction ends, against the other processes
        writing the database (nothing to do where a write transaction holds the whole database)."""

    # ------------------------------------------------------------------------------- the cache

    def follow_changes(self, listener: ChangeListener) -> None:
        """Tell ``listener`` which jobs the other processes writing this database change (PostgreSQL: as
        their notifications are heard; SQLite: ``None``, any job, when its next write finds that another
        program wrote the file)."""
        self._cache.listeners.append(listener)

    def cached_job(self, namespace: str, name: str) -> Job | None:
        """The latest attempt of a job, when cached and the cache is trusted (no I/O)."""
        return self._cache.latest(namespace, name)

    def cached_token_hash(self, job_id: int) -> str | None:
        """A job's token hash, when cached (it never changes: no I/O)."""
        return self._cache.token_hash(job_id)

    def _remember(self, job: Job, token_hash: str | None = None, latest: bool = False) -> None:
        """Cache a job written by the open transaction, once it commits (``latest``: just registered)."""
        pending = self._remembered.get(job.id)
        if token_hash is None and pending is not None:
            token_hash = pending[1]
        self._remembered[job.id] = (job, token_hash, latest or (pending is not None and pending[2]))

    # -------------------------------------------------------------------------------------- jobs

    def _job_in(self, conn: Any, job_id: int) -> Job:
        """A job as it stands in the open write transaction, its row locked where the database locks rows
        (``KeyError`` when it is not in the database)."""
        pending = self._remembered.get(job_id)
        if pending is not None:
            return pending[0]
        if not self.dialect.lock_row:  # the transaction holds the whole database: the cache is the truth
            cached = self._cache.by_id(job_id)
            if cached is not None:
                return cached
        row = conn.execute(
            self._sql(f"SELECT {self._job_columns}, token_hash FROM jobs WHERE id = ?{self.dialect.lock_row}"),
            (job_id,),
        ).fetchone()
        if row is None:
            raise KeyError(job_id)
        job = job_from_row(row[:-1])
        self._remember(job, str(row[-1]))
        return job

    def _lock_job(self, conn: Any, job_id: int | None) -> None:
        """Lock a job's row (``None``: every job's, in id order) until the transaction ends, where rows lock."""
        if self.dialect.lock_row:
            where = "" if job_id is None else " WHERE id = ?"
            conn.execute(
                self._sql(f"SELECT 1 FROM jobs{where} ORDER BY id{self.dialect.lock_row}"),
                () if job_id is None else (job_id,),
            )

    def _existing(self, conn: Any, job_id: int) -> Job:
        try:
            return self._job_in(conn, job_id)
        except KeyError:
            raise StoreError(f"job {job_id} is not in the database") from None

    def _update(self, conn: Any, job: Job, updates: dict[str, Any]) -> Job:
        """Write a job's changed columns (Python values), and remember the job as it now stands; no
        columns (a heartbeat that leaves the row as it is, ``job_updates.HEARTBEAT_LAG_S``): no statement."""
        if not updates:
            return job
        names = tuple(updates)
        sql = self._update_sql.get(names)
        if sql is None:  # a report's update names the same columns each time: its statement is made once
            if len(self._update_sql) >= 256:
                self._update_sql.clear()
            sql = self._update_sql[names] = self._sql(
                f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in names)} WHERE id = ?"
            )
        conn.execute(sql, (*column_values(updates), job.id))
        fresh = job.changed(**updates)
        self._remember(fresh)
        return fresh

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
            self._lock(conn, f"job:{namespace}/{name}")  # two processes cannot both create attempt 2
            row = conn.execute(
                self._sql(
                    "SELECT id, attempt, state FROM jobs WHERE namespace = ? AND name = ? ORDER BY attempt DESC LIMIT 1"
                ),
                (namespace, name),
            ).fetchone()
            if row is not None and row[2] not in ENDED_STATES:
                if not supersede:
                    raise KeyError(f"{namespace}/{name}")
                reason = f"superseded by attempt {row[1] + 1}"
                old = self._job_in(conn, row[0])
                self._update(conn, old, {"state": "failed", "finished_at": now, "updated_at": now, "reason": reason})
                self._event(conn, old, now, "failed", reason, {})
            attempt = 1 if row is None else row[1] + 1
            values = (
                namespace, name, attempt, token_hash, now, now, total_steps, total_epochs, json.dumps(params or {}),
                gpus, gpu_hour_cost, source, json.dumps(policy or {}), gpu_type,
            )  # fmt: skip
            created = conn.execute(
                self._sql(
                    "INSERT INTO jobs (namespace, name, attempt, token_hash, state, created_at, updated_at, "
                    "total_steps, total_epochs, params, gpus, gpu_hour_cost, source, policy, gpu_type) "
                    f"VALUES (?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING {self._job_columns}"
                ),
                values,
            ).fetchall()  # all: SQLite finishes the statement only once its rows are read
            new = job_from_row(created[0])
            self._event(conn, new, now, "registered", f"attempt {attempt} registered", {"attempt": attempt})
            self._remember(new, token_hash, latest=True)
        return new

    def job(self, namespace: str, name: str, attempt: int | None = None) -> Job | None:
        """The latest attempt of a job, or the given one."""
        if attempt is not None:
            rows = self._read(
                self._sql(f"SELECT {self._job_columns} FROM jobs WHERE namespace = ? AND name = ? AND attempt = ?"),
                (namespace, name, attempt),
            )
            return job_from_row(rows[0]) if rows else None
        cached = self.cached_job(namespace, name)
        if cached is not None:
            return cached
        epoch = self._cache.epoch
        rows = self._read(
            self._sql(
                f"SELECT {self._job_columns} FROM jobs WHERE namespace = ? AND name = ? ORDER BY attempt DESC LIMIT 1"
            ),
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
        rows = self._read(self._sql(f"SELECT {self._job_columns} FROM jobs WHERE id = ?"), (job_id,))
        if not rows:
            return None
        job = job_from_row(rows[0])
        self._cache.offer(job, epoch)
        return job

    def token_hash(self, job_id: int) -> str:
        """The stored hash of a job's write token."""
        cached = self._cache.token_hash(job_id)
        if cached is not None:
            return cached
        rows = self._read(self._sql("SELECT token_hash FROM jobs WHERE id = ?"), (job_id,))
        if not rows:
            return ""
        self._cache.offer_token_hash(job_id, str(rows[0][0]))
        return str(rows[0][0])

    def _where(self, where: JobFilter) -> tuple[str, list[Any]]:
        """A filter as ``" WHERE ..."`` (or nothing) with ``?`` placeholders, and its arguments."""
        clauses: list[str] = []
        args: list[Any] = []

        def among(column: str, values: Any) -> None:
            clause, values = self.dialect.in_list(column, values)
            clauses.append(clause)
            args.extend(values)

        if where.namespace:
            clauses.append("namespace = ?")
            args.append(where.namespace)
        if where.namespaces is not None:
            among("namespace", where.namespaces)
        if where.state:
            among("state", where.state)
        if where.health:
            among("health", where.health)
        if where.text:
            clauses.append(f"({self.dialect.contains('name')} OR {self.dialect.contains('namespace')})")
            args.extend([where.text.lower(), where.text.lower()])
        if where.min_progress is not None:
            clauses.append(f"{self.dialect.progress} >= ?")
            args.append(where.min_progress)
        if where.max_progress is not None:
            clauses.append(f"{self.dialect.progress} <= ?")
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
        column = self.dialect.sort_keys.get(where.sort, "updated_at")
        nulls_last = "" if column == "updated_at" else f"{column} IS NULL, "  # NOT NULL: its index can serve
        epoch = self._cache.epoch
        ordered = f"SELECT id FROM jobs{sql} ORDER BY {nulls_last}{column} {order}, id {order} LIMIT ? OFFSET ?"
        ids = [r[0] for r in self._read(self._sql(ordered), (*args, where.limit, where.offset))]
        found = {i: job for i in ids if (job := self._cache.by_id(i)) is not None}
        missing = [i for i in ids if i not in found]
        for start in range(0, len(missing), 500):  # rows the cache does not hold: read once, then kept
            clause, chunk = self.dialect.in_list("id", missing[start : start + 500])
            for row in self._read(self._sql(f"SELECT {self._job_columns} FROM jobs WHERE {clause}"), tuple(chunk)):
                job = job_from_row(row)
                self._cache.offer(job, epoch)
                found[job.id] = job
        return [found[i] for i in ids if i in found]

    def count_jobs(self, where: JobFilter) -> int:
        """How many jobs match a filter."""
        sql, args = self._where(where)
        return int(self._read(self._sql(f"SELECT COUNT(*) FROM jobs{sql}"), tuple(args))[0][0])

    def ranks(self, job_id: int) -> list[RankState]:
        """The newest report of every rank of a job, by rank."""
        rows = self._read(
            self._sql(
                "SELECT rank, run_id, last_seen_at, step, step_time, host, pid, gpus FROM ranks WHERE job_id = ? "
                "ORDER BY rank"
            ),
            (job_id,),
        )
        return [
            RankState(
                rank, run_id, seen, step, step_time, host, pid, tuple(GpuReading.from_dict(g) for g in json.loads(gpus))
            )
            for rank, run_id, seen, step, step_time, host, pid, gpus in rows
        ]

    # ----------------------------------------------------------------------------- a job's row

    def _transition(
        self, conn: Any, job: Job, updates: dict[str, Any], state: str, reason: str, now: float, rank0: bool
    ) -> tuple[Event, ...]:
        """The state a report moves its job to (into ``updates``), with its event (returned): a final state
        from rank 0, ``running`` from the first report; a job that has ended stays as it ended."""
        if job.state in ENDED_STATES:
            return ()
        if state in ENDED_STATES and rank0:
            state, reason = self._asked_to_stop(conn, job.id, state, reason)
            updates.update(state=state, finished_at=now, reason=reason)
            return (self._event(conn, job, now, state, reason or f"the job reported {state}", {}),)
        if job.state == "pending":
            updates.update(state="running", started_at=now)
            return (self._event(conn, job, now, "running", "first report received", {}),)
        return ()

    def _asked_to_stop(self, conn: Any, job_id: int, state: str, reason: str) -> tuple[str, str]:
        """A job asked to stop that ends ``finished`` ends ``stopped``, with the stop's reason.

        Whether the loop obeyed ``should_stop`` or ran to its end during the grace period, the stop was
        asked for: every path that ends the job (the report core, an integration, the runner) then
        records the same state. A job that failed stays failed.
        """
        if state != "finished":
            return state, reason
        rows = conn.execute(
            self._sql(
                "SELECT reason FROM commands WHERE job_id = ? AND kind = 'stop' ORDER BY created_at DESC LIMIT 1"
            ),
            (job_id,),
        ).fetchall()
        if not rows:
            return state, reason
        return "stopped", str(rows[0][0]) or reason or "stop requested"

    def set_state(self, job: Job, state: JobState, now: float, reason: str = "", exit_code: int | None = None) -> Job:
        """Record a final state (the runner knows how the process ended), or running.

        A final state replaces one a report recorded when the process failed (a non-zero exit code) or
        was stopped (the runner knows a stop was asked, or forwarded Ctrl-C); a job asked to stop ends
        ``stopped`` (see :meth:`_asked_to_stop`).
        """
        with self._write() as conn:
            try:
                current = self._job_in(conn, job.id)
            except KeyError:
                raise StoreError(f"job {job.key} is not in the database") from None
            updates: dict[str, Any] = {"updated_at": now, "exit_code": exit_code}
            if state in ENDED_STATES:
                final, reason = self._asked_to_stop(conn, job.id, state, reason)
                if current.state not in ENDED_STATES or exit_code not in (None, 0) or final == "stopped":
                    if current.state != final or current.reason != reason:
                        self._event(conn, current, now, final, reason or final, {"exit_code": exit_code})
                    updates.update(state=final, finished_at=now, reason=reason)
            elif current.state == "pending":
                updates.update(state=state, started_at=now)
                self._event(conn, current, now, state, reason or "started", {})
            return self._update(conn, current, updates)

    def set_health(self, job_id: int, health: str, since: float | None, evidence: dict[str, Any], now: float) -> Job:
        """Record a job's health; a change is an event ``health`` with the evidence."""
        with self._write() as conn:
            current = self._existing(conn, job_id)
            if health_change_is_event(current.health, health):
                message = str(evidence.get("message") or f"health is now {health}")
                self._event(conn, current, now, "health", message, {"health": health, "evidence": evidence})
            history = next_history(
                current.health_history,
                (current.health, current.health_since, current.health_evidence),
                (health, since, evidence),
                now,
            )
            if history is not current.health_history:  # its spans' rows, not the job's (health_history.py)
                write_spans(self.dialect.qmark(conn), job_id, current.health_history, history)
                current = current.changed(health_history=history)
            return self._update(conn, current, {"health": health, "health_since": since, "health_evidence": evidence})

    def set_estimate(self, job_id: int, eta_seconds: float | None, rate: float | None, now: float) -> None:
        """Keep the latest ETA of a job with the job, so that lists need no history."""
        with self._write() as conn:
            try:
                current = self._job_in(conn, job_id)
            except KeyError:
                return
            self._update(conn, current, {"eta_seconds": eta_seconds, "eta_rate": rate, "eta_at": now})

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

    def _count_windows(self, conn: Any, job_id: int, metrics: list[str]) -> None:
        """Count new windows; a series with :attr:`_FOLD_EVERY` unfolded ones is folded into roll-ups."""
        if len(self._unfolded) > 100_000:
            self._unfolded.clear()  # forgetting counts only delays folds: reads fold what is left
        for metric in metrics:
            key = (job_id, metric)
            n = self._unfolded.get(key, 0) + 1
            if n > self._FOLD_EVERY:  # the window being stored is not folded yet: those before it are
                rollups.fold(self.dialect.qmark(conn), job_id, metric)
                n = 1
            self._unfolded[key] = n

    # ---------------------------------------------------------------------------------- commands

    def pending_commands(self, job_id: int) -> list[Command]:
        """Commands not acknowledged yet, oldest first."""
        return [Command(id=r[0], kind=r[1], reason=r[2]) for r in self._read(self._sql(PENDING_SQL), (job_id,))]

    def add_command(self, job: Job, kind: str, reason: str, now: float, actor: str = "") -> Command:
        """Queue a command; the reporter receives it with its next answer."""
        command = Command(id=uuid.uuid4().hex[:16], kind=kind, reason=reason)  # type: ignore[arg-type]
        with self._write() as conn:
            self._insert_command(conn, job.id, command, now)
            self._command_event(conn, job, now, command, actor)
            if actor:
                self._audit(conn, AuditEntry(now, actor, kind, job.namespace, job.name, reason, {"id": command.id}))
        return command

    def _insert_command(self, conn: Any, job_id: int, command: Command, created_at: float) -> None:
        self._commands_changed(job_id)
        conn.execute(
            self._sql("INSERT INTO commands (id, job_id, kind, reason, created_at) VALUES (?, ?, ?, ?, ?)"),
            (command.id, job_id, command.kind, command.reason, created_at),
        )

    def _command_event(self, conn: Any, job: Job, now: float, command: Command, actor: str = "") -> None:
        kind, reason = command.kind, command.reason
        message = f"{kind} requested: {reason}" if reason else f"{kind} requested"
        data = {"id": command.id, "kind": kind, "reason": reason, **({"by": actor} if actor else {})}
        self._event(conn, job, now, "command", message, data)

    def _commands_changed(self, job_id: int) -> None:
        """The open transaction queues or acknowledges a job's commands (for a store that remembers them)."""

    # ---------------------------------------------------------------------------------- policies

    def set_policy(self, job_id: int, policy: dict[str, Any], now: float, message: str, actor: str = "") -> Job:
        """Replace a job's own policy (an event ``policy_set``)."""
        with self._write() as conn:
            current = self._existing(conn, job_id)
            self._event(
                conn, current, now, "policy_set", message, {"policy": policy, **({"by": actor} if actor else {})}
            )
            if actor:
                entry = AuditEntry(
                    now, actor, "policy_set", current.namespace, current.name, message, {"policy": policy}
                )
                self._audit(conn, entry)
            return self._update(conn, current, {"policy": policy})

    def act(
        self,
        job_id: int,
        trigger: str,
        fired: dict[str, Any],
        message: str,
        commands: tuple[tuple[str, str], ...],
        now: float,
    ) -> tuple[Job, list[Command]]:
        """Record a policy's action on a trigger with its commands, in one transaction."""
        queued = [Command(id=uuid.uuid4().hex[:16], kind=kind, reason=reason) for kind, reason in commands]  # type: ignore[arg-type]
        with self._write() as conn:
            current = self._existing(conn, job_id)
            self._event(conn, current, now, "policy", message, {"trigger": trigger, **fired})
            for i, command in enumerate(queued):
                self._insert_command(conn, job_id, command, now + i * 1e-6)  # kept in order
                self._command_event(conn, current, now, command)
            job = self._update(conn, current, {"policy_fired": {**current.policy_fired, trigger: fired}})
        return job, queued

    def rearm(self, job_id: int, triggers: tuple[str, ...], now: float) -> Job:
        """Forget the policy's actions on these triggers."""
        with self._write() as conn:
            current = self._existing(conn, job_id)
            kept = {k: v for k, v in current.policy_fired.items() if k not in triggers}
            if len(kept) == len(current.policy_fired):
                return current
            return self._update(conn, current, {"policy_fired": kept})

    def namespace_policies(self) -> dict[str, dict[str, Any]]:
        """Every namespace's policy."""
        rows = self._read("SELECT namespace, policy FROM namespace_policies ORDER BY namespace")
        return {namespace: json.loads(policy) for namespace, policy in rows}

    def set_namespace_policy(self, namespace: str, policy: dict[str, Any] | None, now: float, actor: str = "") -> None:
        """Replace or remove a namespace's policy."""
        with self._write() as conn:
            if actor:
                self._audit(conn, AuditEntry(now, actor, "namespace_policy_set", namespace, "", "", {"policy": policy}))
            if policy is None:
                conn.execute(self._sql("DELETE FROM namespace_policies WHERE namespace = ?"), (namespace,))
            else:
                conn.execute(
                    self._sql(
                        "INSERT INTO namespace_policies (namespace, policy, updated_at) VALUES (?, ?, ?) "
                        "ON CONFLICT (namespace) DO UPDATE SET policy = excluded.policy, "
                        "updated_at = excluded.updated_at"
                    ),
                    (namespace, json.dumps(policy), now),
                )

    # ------------------------------------------------------------------------------------ events

    def _event(self, conn: Any, job: Job, now: float, kind: str, message: str, data: dict[str, Any]) -> Event:
        """Append an event of ``job`` in the open transaction; the event, as :meth:`events` will read it
        back (also gathered for :meth:`with_events`)."""
        self._lock(conn, "events")  # held to the commit: event ids commit in the order they are taken
        # the id read back waits for PostgreSQL's pipeline to answer: a round trip, on the rare writes with events
        rows = conn.execute(
            self._sql("INSERT INTO events (job_id, t, kind, message, data) VALUES (?, ?, ?, ?, ?) RETURNING id"),
            (job.id, now, kind, message, json.dumps(data)),
        ).fetchall()  # all: SQLite finishes the statement only once its rows are read
        event = Event(int(rows[0][0]), job.id, job.namespace, job.name, now, kind, message, data)
        sink = self._gathering()
        if sink is not None:
            sink.append(event)
        return event

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
            self._sql(
                "SELECT events.id, events.job_id, jobs.namespace, jobs.name, events.t, events.kind, events.message, "
                f"events.data FROM events JOIN jobs ON jobs.id = events.job_id WHERE {' AND '.join(clauses)} "
                "ORDER BY events.id LIMIT ?"
            ),
            (*args, limit),
        )
        return [Event(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7])) for r in rows]

    # --------------------------------------------------------------------------------------- audit

    def _audit(self, conn: Any, entry: AuditEntry) -> AuditEntry:
        rows = conn.execute(
            self._sql(
                "INSERT INTO audit (t, actor, action, namespace, name, reason, data) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "RETURNING id"
            ),
            (entry.t, entry.actor, entry.action, entry.namespace, entry.name, entry.reason, json.dumps(entry.data)),
        ).fetchall()  # all: SQLite finishes the statement only once its rows are read
        return replace(entry, id=int(rows[0][0]) if rows else 0)
