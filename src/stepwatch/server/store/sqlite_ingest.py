"""How the SQLite store writes reports: a batch of native ones, and an upstream status.

Everything runs in the store's one write transaction (one writer: statements are plain calls into a
library, cheap, each its own). A batch is one transaction; a failure stays its own: when a report
cannot be stored (its job deleted meanwhile, a disk error) the transaction is rolled back and the
batch written again with each report in a savepoint of its own (savepoints at every report cost two
statements of seven). Windows counted for roll-up folds by the attempt rolled back are only folded
later (a read folds what ingest has not). A native report is stored once, by run, rank and seq (a duplicate
changes nothing and is answered with the pending commands); its rank's newest state is replaced only
by a newer report by the reporter's clock; its windows become points. What the report then changes
in the job's row is decided by :mod:`.job_updates`, the same for both stores.

What the one writer already knows it does not read again (:class:`.TransactionMemo`, forgotten when
another program writes the file): each rank's last ``sent_at`` (whether a report is its rank's newest)
and each job's pending commands (what every answer carries; changed only by a command queued or
acknowledged, both written here).

:class:`SQLiteIngest` is the SQLite store's ingest half; :class:`~.sqlite.SQLiteStore` adds its
connections and transactions.
"""

from __future__ import annotations

import abc
import json
import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager

from ...protocol import Command, TrainerStatus
from .base import Event, IngestResult, Job, MetricLimitError, PendingReport, StoreError
from .cache import MISS, TransactionMemo
from .job_updates import check_metric_names, report_updates, upstream_status
from .rows import store_float
from .sql_store import PENDING_SQL, SqlStore

__all__ = ["SQLiteIngest", "WouldWait"]

_POINT_SQL = (
    "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_REPORT_SQL = (
    "INSERT OR IGNORE INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step, newest) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
"""A native report's row (no row changed: a duplicate; a row count is cheaper than ``RETURNING``)."""

_LAST_SENT_SQL = "SELECT last_sent_at FROM ranks WHERE job_id = ? AND rank = ?"

_RANK_SQL = (
    "INSERT INTO ranks (job_id, rank, run_id, last_sent_at, last_seen_at, step, step_time, host, pid, gpus) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, rank) DO UPDATE SET "
    "run_id = excluded.run_id, last_sent_at = excluded.last_sent_at, last_seen_at = excluded.last_seen_at, "
    "step = excluded.step, step_time = excluded.step_time, host = excluded.host, pid = excluded.pid, "
    "gpus = excluded.gpus"
)


class _Failed(Exception):
    """A report of a batch written without savepoints could not be stored (the batch is written again)."""


class WouldWait(Exception):
    """A write that was asked not to wait found the write lock taken (by another thread or program)."""


class SQLiteIngest(SqlStore):
    """The SQLite store's writes of reports (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._memo = TransactionMemo()
        """Ranks' last ``sent_at`` (``("sent", job id, rank)``, ``None``: no report yet) and jobs' pending
        commands (``("commands", job id)``), as the writer's transactions left them."""

    @abc.abstractmethod
    def _write(self, wait: bool = True, *, pipeline: bool = True) -> AbstractContextManager[sqlite3.Connection]:
        """The writer's transaction; ``wait=False``: :class:`WouldWait` rather than waiting for the lock."""

    def ingest_reports(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError]:
        """Store reports in one transaction (each in a savepoint of its own, so one failure stays its own)."""
        return self._ingest_batch(batch, wait=True)

    def ingest_reports_nowait(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError] | None:
        """``ingest_reports`` unless another thread or program holds the write lock (then ``None``)."""
        try:
            return self._ingest_batch(batch, wait=False)
        except WouldWait:
            return None

    def _ingest_batch(self, batch: Sequence[PendingReport], wait: bool) -> list[IngestResult | StoreError]:
        """The batch in one transaction without savepoints (two statements a report fewer); when a report
        cannot be stored, the transaction is rolled back and the batch written again, each report in a
        savepoint of its own (:meth:`_ingest_in_savepoints`)."""
        sink = self._gathering()
        mark = 0 if sink is None else len(sink)
        try:
            with self._write(wait=wait) as conn:
                return [self._write_or_fail(conn, item) for item in batch]
        except _Failed:
            if sink is not None:
                del sink[mark:]  # the events of the transaction rolled back
        return self._ingest_in_savepoints(batch, wait)

    def _write_or_fail(self, conn: sqlite3.Connection, item: PendingReport) -> IngestResult | StoreError:
        try:
            return self._write_report(conn, item)
        except MetricLimitError as exc:  # before anything of it was written
            return exc
        except (sqlite3.Error, KeyError) as exc:
            raise _Failed from exc

    def _ingest_in_savepoints(self, batch: Sequence[PendingReport], wait: bool) -> list[IngestResult | StoreError]:
        results: list[IngestResult | StoreError] = []
        with self._write(wait=wait) as conn:
            for item in batch:
                conn.execute("SAVEPOINT report")
                before = self._remembered.get(item.job.id)
                try:
                    results.append(self._write_report(conn, item))
                except MetricLimitError as exc:  # before anything of it was written
                    results.append(exc)
                except (sqlite3.Error, KeyError) as exc:
                    conn.execute("ROLLBACK TO report")
                    self._memo.forget(("sent", item.job.id, item.report.identity.rank))
                    self._memo.forget(("commands", item.job.id))
                    if before is None:
                        self._remembered.pop(item.job.id, None)
                    else:
                        self._remembered[item.job.id] = before
                    problem = "is not in the database" if isinstance(exc, KeyError) else f"could not be stored: {exc}"
                    results.append(StoreError(f"the report of job {item.job.key} {problem}"))
                conn.execute("RELEASE report")
        return results

    def _write_report(self, conn: sqlite3.Connection, item: PendingReport) -> IngestResult:
        """Store one native report in the open transaction (``KeyError``: the job is not in the database)."""
        job = self._job_in(conn, item.job.id)
        report, now, identity, progress = item.report, item.now, item.report.identity, item.report.progress
        windows = report.metrics
        names = [w.name for w in windows]
        check_metric_names(job, job.last_metrics, names, self.max_metric_names)
        sent_key = ("sent", job.id, identity.rank)
        last_sent = self._memo.get(sent_key)
        if last_sent is MISS:
            row = conn.execute(_LAST_SENT_SQL, (job.id, identity.rank)).fetchone()
            last_sent = None if row is None else row[0]
            self._memo.put(sent_key, last_sent)
        # newest: no report of its rank was sent later (by the reporter's clock)
        newest = last_sent is None or report.sent_at >= last_sent
        inserted = conn.execute(
            _REPORT_SQL, (job.id, report.run_id, identity.rank, report.seq, now, report.sent_at, progress.step, newest)
        ).rowcount
        if not inserted:  # a duplicate
            return IngestResult(job=job, duplicate=True, commands=self._pending(conn, job.id))
        if newest:
            self._memo.put(sent_key, report.sent_at)
            gpus = json.dumps([g.to_dict() for g in report.gpus]) if report.gpus else "[]"
            conn.execute(
                _RANK_SQL,
                (job.id, identity.rank, report.run_id, report.sent_at, now, progress.step, progress.step_time,
                 identity.host, identity.pid, gpus),
            )  # fmt: skip
        if windows:
            job_id = job.id
            self._count_windows(conn, job_id, names)
            conn.executemany(
                _POINT_SQL,
                [
                    (job_id, w.name, w.last_step, now, store_float(w.last), w.min, w.max, w.mean, w.count, w.nonfinite)
                    for w in windows
                ],
            )
        events: tuple[Event, ...] = ()
        if report.acks:
            self._commands_changed(job.id)
            marks = ", ".join("?" for _ in report.acks)
            acked = conn.execute(
                f"UPDATE commands SET acked_at = ? WHERE job_id = ? AND acked_at IS NULL AND id IN ({marks}) "
                "RETURNING id, kind",
                (now, job.id, *report.acks),
            ).fetchall()
            events = tuple(
                self._event(conn, job, now, "command_acked", f"{kind} received by the job", {"id": command_id})
                for command_id, kind in acked
            )
        updates, sample = report_updates(job, item, newest)
        events += self._transition(conn, job, updates, report.state, report.reason, now, rank0=identity.rank == 0)
        fresh = self._update(conn, job, updates)
        return IngestResult(
            job=fresh,
            duplicate=False,
            commands=self._pending(conn, job.id),
            new_points=report.metrics,
            sample=sample,
            events=events,
        )

    def _pending(self, conn: sqlite3.Connection, job_id: int) -> tuple[Command, ...]:
        """A job's pending commands, from memory when no command was queued or acknowledged since last read."""
        known: tuple[Command, ...] = self._memo.get(("commands", job_id))
        if known is MISS:
            rows = conn.execute(PENDING_SQL, (job_id,)).fetchall()
            known = tuple(Command(id=r[0], kind=r[1], reason=r[2]) for r in rows)
            self._memo.put(("commands", job_id), known)
        return known

    def _commands_changed(self, job_id: int) -> None:
        self._memo.forget(("commands", job_id))

    def ingest_status(self, job: Job, status: TrainerStatus, now: float) -> IngestResult:
        """Store an upstream status: progress, ETA and every numeric metric as a one-value window."""
        with self._write() as conn:
            try:
                job = self._job_in(conn, job.id)
            except KeyError:  # deleted (retention, ``stepwatch db``) since the route found it
                raise StoreError(f"job {job.key} is not in the database") from None
            read = upstream_status(job, status, now)
            check_metric_names(job, job.last_metrics, (w.name for w in read.windows), self.max_metric_names)
            # each POST replaces the whole status upstream: every one is kept, none is a duplicate
            conn.execute(
                "INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step) "
                "SELECT ?, 'kubeflow', 0, COALESCE(MAX(seq), -1) + 1, ?, ?, ? FROM reports "
                "WHERE job_id = ? AND run_id = 'kubeflow' AND rank = 0",
                (job.id, now, read.sent_at, read.step, job.id),
            )
            self._count_windows(conn, job.id, [w.name for w in read.windows])
            conn.executemany(
                _POINT_SQL,
                [
                    (job.id, w.name, w.last_step, now, store_float(w.last), w.min, w.max, w.mean, 1, w.nonfinite)
                    for w in read.windows
                ],
            )
            updates = dict(read.updates)
            events = self._transition(conn, job, updates, "running", "", now, rank0=True)
            fresh = self._update(conn, job, updates)
        return IngestResult(job=fresh, duplicate=False, new_points=read.windows, sample=read.sample, events=events)
