"""How the SQLite store writes reports: a native report's rows, and an upstream status.

Both run in the store's open write transaction (one writer: statements are cheap, each is its own
call). A native report is stored once, by run, rank and seq (a duplicate changes nothing and is
answered with the pending commands); its rank's newest state is replaced only by a newer report by
the reporter's clock; its windows become points. What the report then changes in the job's row is
decided by :mod:`.job_updates`, the same for both stores.
"""

from __future__ import annotations

import json
import sqlite3
from typing import TYPE_CHECKING

from ...protocol import TrainerStatus
from .base import Event, IngestResult, Job, PendingReport, StoreError
from .job_updates import check_metric_names, report_updates, upstream_status
from .rows import store_float

if TYPE_CHECKING:
    from .sqlite import SQLiteStore

__all__ = ["write_report", "write_status"]

_POINT_SQL = (
    "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_RANK_SQL = (
    "INSERT INTO ranks (job_id, rank, run_id, last_sent_at, last_seen_at, step, step_time, host, pid, gpus) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, rank) DO UPDATE SET "
    "run_id = excluded.run_id, last_sent_at = excluded.last_sent_at, last_seen_at = excluded.last_seen_at, "
    "step = excluded.step, step_time = excluded.step_time, host = excluded.host, pid = excluded.pid, "
    "gpus = excluded.gpus"
)


def write_report(store: SQLiteStore, conn: sqlite3.Connection, item: PendingReport) -> IngestResult:
    """Store one native report in the open transaction (``KeyError``: the job is not in the database)."""
    job, _ = store._current(conn, item.job.id)
    report, now, identity, progress = item.report, item.now, item.report.identity, item.report.progress
    check_metric_names(job, job.last_metrics, (w.name for w in report.metrics), store.max_metric_names)
    previous = conn.execute(
        "SELECT last_sent_at FROM ranks WHERE job_id = ? AND rank = ?", (job.id, identity.rank)
    ).fetchone()
    newest = previous is None or report.sent_at >= previous[0]
    inserted = conn.execute(
        "INSERT OR IGNORE INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step, newest) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (job.id, report.run_id, identity.rank, report.seq, now, report.sent_at, progress.step, newest),
    ).rowcount
    if not inserted:
        return IngestResult(job=job, duplicate=True, commands=tuple(store._pending(conn, job.id)))
    if newest:
        gpus = json.dumps([g.to_dict() for g in report.gpus])
        conn.execute(
            _RANK_SQL,
            (job.id, identity.rank, report.run_id, report.sent_at, now, progress.step, progress.step_time,
             identity.host, identity.pid, gpus),
        )  # fmt: skip
    if report.metrics:
        store._count_windows(conn, job.id, [w.name for w in report.metrics])
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
            store._event(conn, job, now, "command_acked", f"{kind} received by the job", {"id": command_id})
            for command_id, kind in acked
        )
    updates, sample = report_updates(job, item, newest)
    events += store._transition(conn, job, updates, report.state, report.reason, now, rank0=identity.rank == 0)
    fresh = store._update(conn, job, updates)
    return IngestResult(
        job=fresh,
        duplicate=False,
        commands=tuple(store._pending(conn, job.id)),
        new_points=report.metrics,
        sample=sample,
        events=events,
    )


def write_status(
    store: SQLiteStore, conn: sqlite3.Connection, job: Job, status: TrainerStatus, now: float
) -> IngestResult:
    """Store an upstream status in the open transaction: progress, ETA and numeric metrics as windows."""
    try:
        job, _ = store._current(conn, job.id)
    except KeyError:  # deleted (retention, ``stepwatch db``) since the route found it
        raise StoreError(f"job {job.key} is not in the database") from None
    read = upstream_status(job, status, now)
    check_metric_names(job, job.last_metrics, (w.name for w in read.windows), store.max_metric_names)
    # each POST replaces the whole status upstream: every one is kept, none is a duplicate
    conn.execute(
        "INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step) "
        "SELECT ?, 'kubeflow', 0, COALESCE(MAX(seq), -1) + 1, ?, ?, ? FROM reports "
        "WHERE job_id = ? AND run_id = 'kubeflow' AND rank = 0",
        (job.id, now, read.sent_at, read.step, job.id),
    )
    store._count_windows(conn, job.id, [w.name for w in read.windows])
    conn.executemany(
        _POINT_SQL,
        [
            (job.id, w.name, w.last_step, now, store_float(w.last), w.min, w.max, w.mean, 1, w.nonfinite)
            for w in read.windows
        ],
    )
    updates = dict(read.updates)
    events = store._transition(conn, job, updates, "running", "", now, rank0=True)
    fresh = store._update(conn, job, updates)
    return IngestResult(job=fresh, duplicate=False, new_points=read.windows, sample=read.sample, events=events)
