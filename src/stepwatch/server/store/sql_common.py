"""What both SQL stores do with the same statements: a job's row written (state, health, ETA, a report's
state transition), ranks, commands, policies, events, API tokens and the audit log.

:class:`SqlStore` sits between :class:`~.base.Store` and the two backends. Its methods are written
once, with ``?`` placeholders (:meth:`SqlStore._sql` turns them into the driver's own); each backend
supplies how a write transaction is opened (``_write``), how a read runs (``_read``), how a job is
read inside a transaction (``_job_in``: PostgreSQL locks its row) and kept for the cache
(``_remember``), how a job filter reads (``_where``), and how an event is appended (``_insert_event``:
PostgreSQL orders event ids across replicas with a lock). What differs between the backends beyond
that (registration, job reads and lists, history, acknowledged commands, token caches and revocation,
which other processes must hear of) stays in :mod:`.sqlite` and :mod:`.postgres`.
"""

from __future__ import annotations

import abc
import json
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, ClassVar

from ...protocol import Command, GpuReading
from .access import AUDIT_COLUMNS, TOKEN_COLUMNS, ApiToken, AuditEntry, audit_from_row, audit_where, token_from_row
from .base import (
    FINAL_STATES,
    Compaction,
    Event,
    Job,
    JobFilter,
    JobState,
    RankState,
    Store,
    StoreError,
    health_change_is_event,
)
from .health_history import next_history
from .replica_cache import ReplicaCache
from .retention import run_pass
from .rollups import Connection
from .rows import column_value

__all__ = ["SqlStore"]


class SqlStore(Store):
    """The shared half of the SQLite and PostgreSQL stores (see the module docstring)."""

    _PARAM: ClassVar[str] = "?"
    """The driver's placeholder: ``?`` (sqlite3) or ``%s`` (psycopg)."""
    _cache: ReplicaCache
    """Jobs and token hashes as last read or written, forgotten when another process changes them."""

    def _sql(self, text: str) -> str:
        """A statement written with ``?`` placeholders, in the driver's own."""
        return text if self._PARAM == "?" else text.replace("?", self._PARAM)

    # ------------------------------------------------------------------------- what a backend supplies

    @abc.abstractmethod
    def _write(self) -> AbstractContextManager[Any]:
        """A write transaction; its connection."""

    @abc.abstractmethod
    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read statement."""

    @abc.abstractmethod
    def _job_in(self, conn: Any, job_id: int) -> Job:
        """A job as it stands in the open write transaction (``KeyError`` when it is not in the database)."""

    @abc.abstractmethod
    def _remember(self, job: Job) -> None:
        """Keep a job written by the open transaction, for the cache once it commits."""

    @abc.abstractmethod
    def _where(self, where: JobFilter) -> tuple[str, list[Any]]:
        """A filter as ``" WHERE ..."`` (or nothing) and its arguments, in the driver's placeholders."""

    @abc.abstractmethod
    def _insert_event(self, conn: Any, job_id: int, now: float, kind: str, message: str, data: dict[str, Any]) -> int:
        """Append an event of a job in the open transaction; its id."""

    def _event(self, conn: Any, job: Job, now: float, kind: str, message: str, data: dict[str, Any]) -> Event:
        """Append an event of ``job`` in the open transaction; the event, as :meth:`events` will read it
        back (also gathered for :meth:`with_events`)."""
        event_id = self._insert_event(conn, job.id, now, kind, message, data)
        event = Event(event_id, job.id, job.namespace, job.name, now, kind, message, data)
        sink = self._gathering()
        if sink is not None:
            sink.append(event)
        return event

    @abc.abstractmethod
    def _retention_tx(self, job_id: int | None) -> AbstractContextManager[Connection]:
        """A write transaction on a ``?`` connection, the job's row locked where one is named."""

    # -------------------------------------------------------------------------------------- jobs

    def _existing(self, conn: Any, job_id: int) -> Job:
        try:
            return self._job_in(conn, job_id)
        except KeyError:
            raise StoreError(f"job {job_id} is not in the database") from None

    def _update(self, conn: Any, job: Job, updates: dict[str, Any]) -> Job:
        """Write a job's changed columns (Python values), and remember the job as it now stands."""
        columns = ", ".join(f"{k} = ?" for k in updates)
        values = [column_value(k, v) for k, v in updates.items()]
        conn.execute(self._sql(f"UPDATE jobs SET {columns} WHERE id = ?"), (*values, job.id))
        fresh = replace(job, **updates)
        self._remember(fresh)
        return fresh

    def _transition(
        self, conn: Any, job: Job, updates: dict[str, Any], state: str, reason: str, now: float, rank0: bool
    ) -> tuple[Event, ...]:
        """The state a report moves its job to (into ``updates``), with its event (returned): a final state
        from rank 0, ``running`` from the first report; a job that has ended stays as it ended."""
        if job.state in FINAL_STATES:
            return ()
        if state in FINAL_STATES and rank0:
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
            if state in FINAL_STATES:
                final, reason = self._asked_to_stop(conn, job.id, state, reason)
                if current.state not in FINAL_STATES or exit_code not in (None, 0) or final == "stopped":
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
            updates: dict[str, Any] = {"health": health, "health_since": since, "health_evidence": evidence}
            if history is not current.health_history:
                updates["health_history"] = history
            return self._update(conn, current, updates)

    def set_estimate(self, job_id: int, eta_seconds: float | None, rate: float | None, now: float) -> None:
        """Keep the latest ETA of a job with the job, so that lists need no history."""
        with self._write() as conn:
            try:
                current = self._job_in(conn, job_id)
            except KeyError:
                return
            self._update(conn, current, {"eta_seconds": eta_seconds, "eta_rate": rate, "eta_at": now})

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

    def count_jobs(self, where: JobFilter) -> int:
        """How many jobs match a filter."""
        sql, args = self._where(where)
        return int(self._read(f"SELECT COUNT(*) FROM jobs{sql}", tuple(args))[0][0])

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

    # ---------------------------------------------------------------------------------- commands

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
        conn.execute(
            self._sql("INSERT INTO commands (id, job_id, kind, reason, created_at) VALUES (?, ?, ?, ?, ?)"),
            (command.id, job_id, command.kind, command.reason, created_at),
        )

    def _command_event(self, conn: Any, job: Job, now: float, command: Command, actor: str = "") -> None:
        kind, reason = command.kind, command.reason
        message = f"{kind} requested: {reason}" if reason else f"{kind} requested"
        data = {"id": command.id, "kind": kind, "reason": reason, **({"by": actor} if actor else {})}
        self._event(conn, job, now, "command", message, data)

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

    # --------------------------------------------------------------------------------- retention

    def compact(
        self, before: float | None, quotas: Mapping[str, int] | None = None, budget: int = 20_000
    ) -> Compaction:
        """One bounded retention pass (see :mod:`.retention`)."""
        return run_pass(self._retention_tx, before, quotas, budget)

    # ------------------------------------------------------------------------ access (tokens, audit)

    def create_token(self, token: ApiToken, token_hash: str, entry: AuditEntry) -> None:
        """Store a new API token (its hash) and the audit entry of its creation."""
        row = (
            token_hash, token.id, token.name, token.role, json.dumps(list(token.namespaces)), token.created_at,
            token.created_by, token.expires_at, token.revoked_at, token.revoked_by,
        )  # fmt: skip
        marks = ", ".join("?" for _ in row)
        with self._write() as conn:
            conn.execute(self._sql(f"INSERT INTO api_tokens (token_hash, {TOKEN_COLUMNS}) VALUES ({marks})"), row)
            self._audit(conn, entry)

    def api_tokens(self) -> list[ApiToken]:
        """Every API token, oldest first."""
        return [
            token_from_row(r) for r in self._read(f"SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY created_at, id")
        ]

    def _audit(self, conn: Any, entry: AuditEntry) -> AuditEntry:
        rows = conn.execute(
            self._sql(
                "INSERT INTO audit (t, actor, action, namespace, name, reason, data) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "RETURNING id"
            ),
            (entry.t, entry.actor, entry.action, entry.namespace, entry.name, entry.reason, json.dumps(entry.data)),
        ).fetchall()  # all: SQLite finishes the statement only once its rows are read
        return replace(entry, id=int(rows[0][0]) if rows else 0)

    def audit_log(
        self,
        *,
        namespaces: tuple[str, ...] | None = None,
        name: str | None = None,
        include_global: bool = True,
        after: int = 0,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """Audit entries after an id, oldest first."""
        where, args = audit_where(namespaces, name, include_global, after)
        rows = self._read(
            self._sql(f"SELECT {AUDIT_COLUMNS} FROM audit WHERE {where} ORDER BY id LIMIT ?"), (*args, limit)
        )
        return [audit_from_row(r) for r in rows]
