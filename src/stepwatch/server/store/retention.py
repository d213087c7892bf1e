"""Retention: old raw windows compacted into the roll-ups that already keep their min, max and last.

Both stores run the same SQL (``?`` placeholders, as in :mod:`.rollups`). Every window is folded
into level-1 roll-up rows at ingest (16 windows each), and those into level 2 (256 windows), and so
on; each row keeps the min, max, last, count, non-finite count and finite mean of what it merges.
So a raw window that a level-1 row covers can go without a chart losing anything it shows, and a
level-1 row that a level-2 row covers likewise:

- **age**: windows whose level-1 row ended before ``before`` are deleted; in a long series (at
  least :data:`LONG_SERIES` level-2 rows) so are the level-1 rows whose level-2 row ended before
  then, down to :data:`.rollups.KEEP_LEVEL` (one row per 256 windows, 8.5 minutes of a job reporting every 2 s);
- **quota**: a namespace with more raw windows than its quota has its oldest jobs' raw windows
  compacted into level 1 (16 windows a row), whatever their age.

A compacted range is read at the resolution it was compacted to: every min, max, count and count of
non-finite values stays, but two NaN or infinite ``last`` values within one row (256 windows at
level 2) show as one mark: the later.

The newest window of a series always stays raw (the metric stays listed, its last value exact), and
nothing newer than the level-1 roll-ups (the windows ingest has not folded yet) is touched. Progress
reports (``reports``, one row per report and rank) older than ``before`` are deleted too: only the
recent rate feeds the ETA. Work is bounded per call (``budget`` rows deleted), so a pass never holds
the writer for long; call again while :attr:`Compaction.more` is true.

A compacted series is read from its roll-ups only (:func:`.rollups.read_series` sees where the raw
windows or level-1 rows begin). The full-resolution readers (``series``, the health analysis) see
the raw windows that are left: retention is for history older than any live analysis looks at.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

from .base import Compaction
from .rollups import KEEP_LEVEL, METRICS_SQL, fold
from .sql_dialect import Connection

__all__ = ["LONG_SERIES", "Transaction", "compact_reports", "compact_series", "run_pass", "series_of"]

LONG_SERIES = 1000
"""Level-1 rows are compacted only in series with this many level-2 rows (256,000 windows, six days
of a job reporting every 2 s): a shorter one keeps them, so its chart keeps its resolution."""


def series_of(conn: Connection, job_id: int) -> list[str]:
    """The metrics of a job with raw windows."""
    return [r[0] for r in conn.execute(METRICS_SQL, (job_id, job_id))]


def _bound(conn: Connection, job_id: int, metric: str, level: int, before: float | None) -> int:
    """The last rowid covered by a level's rows that ended before ``before`` (all of them: ``None``); 0: none."""
    if before is None:
        row = conn.execute(
            "SELECT MAX(last_rowid) FROM rollups WHERE job_id = ? AND metric = ? AND level = ?", (job_id, metric, level)
        ).fetchone()
    else:
        # from the newest row back to the first that ended before: only the rows of the kept days are read
        row = conn.execute(
            "SELECT last_rowid FROM rollups WHERE job_id = ? AND metric = ? AND level = ? AND t < ? "
            "ORDER BY last_rowid DESC LIMIT 1",
            (job_id, metric, level, before),
        ).fetchone()
    return int(row[0] or 0) if row is not None else 0  # no row (ended before ``before``): nothing covered


def compact_series(
    conn: Connection, job_id: int, metric: str, before: float | None, budget: int, level_one: bool = True
) -> tuple[int, int]:
    """Delete one series' raw windows and level-1 rows that coarser roll-ups keep; (windows, rows) deleted.

    ``before``: only what a roll-up row ended before (a time); ``None``: everything covered. At most
    ``budget`` rows are deleted. ``level_one``: level-1 rows too (else only raw windows). Call in a
    write transaction.
    """
    fold(conn, job_id, metric, limit=max(budget, 1024))  # windows from before roll-ups, or ingest's tail
    newest = conn.execute("SELECT MAX(rowid) FROM points WHERE job_id = ? AND metric = ?", (job_id, metric)).fetchone()
    if newest is None or newest[0] is None:
        return 0, 0
    upto = min(_bound(conn, job_id, metric, 1, before), int(newest[0]) - 1)  # the newest window stays raw
    windows = 0
    if upto > 0 and budget > 0:
        windows = _delete(
            conn,
            "DELETE FROM points WHERE job_id = ? AND metric = ? AND rowid IN (SELECT rowid FROM points "
            "WHERE job_id = ? AND metric = ? AND rowid <= ? ORDER BY rowid LIMIT ?)",
            (job_id, metric, job_id, metric, upto, budget),
        )
    rows = 0
    if level_one and budget - windows > 0 and _long(conn, job_id, metric):
        # level-1 rows go only where the raw windows are gone already (a read starts at the finest intact level)
        first_raw = conn.execute(
            "SELECT MIN(rowid) FROM points WHERE job_id = ? AND metric = ?", (job_id, metric)
        ).fetchone()[0]
        upto1 = _bound(conn, job_id, metric, KEEP_LEVEL, before)
        if first_raw is not None:
            upto1 = min(upto1, int(first_raw) - 1)
        if upto1 > 0:
            rows = _delete(
                conn,
                "DELETE FROM rollups WHERE job_id = ? AND metric = ? AND level = 1 AND last_rowid IN "
                "(SELECT last_rowid FROM rollups WHERE job_id = ? AND metric = ? AND level = 1 AND last_rowid <= ? "
                "ORDER BY last_rowid LIMIT ?)",
                (job_id, metric, job_id, metric, upto1, budget - windows),
            )
    return windows, rows


def _long(conn: Connection, job_id: int, metric: str) -> bool:
    """Whether a series has :data:`LONG_SERIES` level-2 rows: enough for any chart without level 1."""
    row = conn.execute(
        "SELECT COUNT(*) FROM (SELECT 1 FROM rollups WHERE job_id = ? AND metric = ? AND level = ? LIMIT ?) AS r",
        (job_id, metric, KEEP_LEVEL, LONG_SERIES),
    ).fetchone()
    return int(row[0]) >= LONG_SERIES


def compact_reports(conn: Connection, job_id: int, before: float, budget: int) -> int:
    """Delete a job's progress reports received before ``before`` (at most ``budget``); how many.

    Every rank's reports are read by the key's prefix (job_id): a heartbeat pays no index by arrival time
    (schema 11), so a pass reads the job's reports until ``budget`` are found, as it read the index of every
    rank's reports before."""
    return _delete(
        conn,
        "DELETE FROM reports WHERE job_id = ? AND (run_id, rank, seq) IN (SELECT run_id, rank, seq FROM reports "
        "WHERE job_id = ? AND received_at < ? LIMIT ?)",
        (job_id, job_id, before, budget),
    )


def _delete(conn: Connection, sql: str, parameters: tuple[object, ...]) -> int:
    cursor = conn.execute(sql, parameters)
    return max(0, int(getattr(cursor, "rowcount", 0) or 0))


Transaction = Callable[[int | None], AbstractContextManager[Connection]]
"""Opens a write transaction (the job's row locked, where one is named) on a ``?`` connection."""


def run_pass(tx: Transaction, before: float | None, quotas: Mapping[str, int] | None, budget: int) -> Compaction:
    """One bounded retention pass: by age (``before``), then by namespace quota (``"*"``: any namespace).

    Each job is compacted in a transaction of its own, so ingest waits at most one job's share.
    """
    result = Compaction()
    left = budget
    if before is not None:
        with tx(None) as conn:
            jobs = [int(r[0]) for r in conn.execute("SELECT id FROM jobs WHERE created_at < ? ORDER BY id", (before,))]
        for job_id in jobs:
            if left <= 0:
                result.more = True
                return result
            with tx(job_id) as conn:
                left -= _compact_job(conn, job_id, before, left, result)
                if left > 0:
                    n = compact_reports(conn, job_id, before, left)
                    result.reports += n
                    left -= n
        if left <= 0:
            result.more = True
            return result
    if quotas:
        with tx(None) as conn:
            counts = conn.execute(
                "SELECT jobs.namespace, COUNT(*) FROM points JOIN jobs ON jobs.id = points.job_id "
                "GROUP BY jobs.namespace"
            ).fetchall()
        for namespace, stored in counts:
            quota = quotas.get(namespace, quotas.get("*"))
            if quota is None or stored <= quota:
                continue
            result.namespaces_over_quota.append(namespace)
            excess = stored - quota
            with tx(None) as conn:
                found = conn.execute("SELECT id FROM jobs WHERE namespace = ? ORDER BY created_at, id", (namespace,))
                jobs = [int(r[0]) for r in found]
            for job_id in jobs:  # oldest jobs first
                if left <= 0 or excess <= 0:
                    break
                with tx(job_id) as conn:
                    done = _compact_job(conn, job_id, None, min(left, excess), result, level_one=False)
                left -= done
                excess -= done
            if left <= 0:
                result.more = True
                return result
    return result


def _compact_job(
    conn: Connection, job_id: int, before: float | None, budget: int, result: Compaction, level_one: bool = True
) -> int:
    """Compact every series of a job within ``budget`` rows; rows deleted."""
    done = 0
    for metric in series_of(conn, job_id):
        if done >= budget:
            break
        windows, rows = compact_series(conn, job_id, metric, before, budget - done, level_one)
        result.windows += windows
        result.rollups += rows
        result.series += bool(windows or rows)
        done += windows + rows
    return done
