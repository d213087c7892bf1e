"""How the SQLite store writes reports: a batch of native ones, and an upstream status.

Everything runs in the store's one write transaction (one writer: statements are plain calls into a
library, cheap, each its own). A batch is one transaction, each report in a savepoint of its own so
that a failure stays its own. A native report is stored once, by run, rank and seq (a duplicate
changes nothing and is answered with the pending commands); its rank's newest state is replaced only
by a newer report by the reporter's clock; its windows become points. What the report then changes
in the job's row is decided by :mod:`.job_updates`, the same for both stores.

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
    "VALUES (?, ?, ?, ?, ?, ?, ?, "
    "COALESCE((SELECT ? >= last_sent_at FROM ranks WHERE job_id = ? AND rank = ?), 1)) RETURNING newest"
)
"""A native report's row; ``newest`` when no report of its rank was sent later (by the reporter's clock)."""

_RANK_SQL = (
    "INSERT INTO ranks (job_id, rank, run_id, last_sent_at, last_seen_at, step, step_time, host, pid, gpus) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, rank) DO UPDATE SET "
    "run_id = excluded.run_id, last_sent_at = excluded.last_sent_at, last_seen_at = excluded.last_seen_at, "
    "step = excluded.step, step_time = excluded.step_time, host = excluded.host, pid = excluded.pid, "
    "gpus = excluded.gpus"
)


class WouldWait(Exception):
    """A write that was asked not to wait found the write lock taken (by another thread or program)."""


class SQLiteIngest(SqlStore):
    """The SQLite store's writes of reports (see the module docstring)."""

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
        check_metric_names(job, job.last_metrics, (w.name for w in report.metrics), self.max_metric_names)
        # one statement stores the report and says whether it is its rank's newest (no row: a duplicate)
        inserted = conn.execute(
            _REPORT_SQL,
            (job.id, report.run_id, identity.rank, report.seq, now, report.sent_at, progress.step,
             report.sent_at, job.id, identity.rank),
        ).fetchone()  # fmt: skip
        if inserted is None:
            return IngestResult(job=job, duplicate=True, commands=tuple(self._pending(conn, job.id)))
        newest = bool(inserted[0])
        if newest:
            gpus = json.dumps([g.to_dict() for g in report.gpus]) if report.gpus else "[]"
            conn.execute(
                _RANK_SQL,
                (job.id, identity.rank, report.run_id, report.sent_at, now, progress.step, progress.step_time,
                 identity.host, identity.pid, gpus),
            )  # fmt: skip
        if report.metrics:
            self._count_windows(conn, job.id, [w.name for w in report.metrics])
            conn.executemany(
                _POINT_SQL,
                [
                    (job.id, w.name, w.last_step, now, store_float(w.last), w.min, w.max, w.mean, w.count, w.nonfinite)
                    for w in report.metrics
                ],
            )
        events: tuple[Event, ...] = ()
        if report.acks:
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
            commands=tuple(self._pending(conn, job.id)),
            new_points=report.metrics,
            sample=sample,
            events=events,
        )

    def _pending(self, conn: sqlite3.Connection, job_id: int) -> list[Command]:
        return [Command(id=r[0], kind=r[1], reason=r[2]) for r in conn.execute(PENDING_SQL, (job_id,)).fetchall()]

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
