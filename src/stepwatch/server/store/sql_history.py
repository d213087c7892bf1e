"""The history half both SQL stores share: windows read in step order, roll-ups folded, retention.

:class:`SqlHistory` is a part of each store (:class:`~.sqlite.SQLiteStore`,
:class:`~.postgres.PostgresStore`), written once on :class:`~.sql_store.SqlStore`'s plumbing. A long
series is read from its roll-ups (:mod:`.rollups`); a series that ingest has not folded yet is
folded first, in transactions of its own, the job's row locked where rows lock (another process may
fold it at the same time). Retention (:mod:`.retention`) runs in transactions on a ``?`` connection
the same way.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from itertools import islice
from typing import Any

from . import rollups
from .base import Compaction, ProgressSample, SeriesColumns, SeriesPoint
from .retention import run_pass
from .rows import load_float
from .sql_dialect import Connection
from .sql_store import SqlStore

__all__ = ["SqlHistory"]

_SERIES_SQL = (
    "SELECT step, t, last, min, max, mean, count, nonfinite FROM points WHERE job_id = ? AND metric = ? ORDER BY rowid"
)
"""A series' windows in arrival order, the one order ``points`` is indexed in (see :func:`_step_order`)."""


def _step_order(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Windows read in arrival order, in step order: by step, then time, then arrival (``ORDER BY step, t,
    rowid``). Arrival order is step order for a job that only steps forward: checked, not sorted, then."""
    keys = [(r[0], r[1]) for r in rows]
    if all(map(operator.le, keys, islice(keys, 1, None))):
        return rows
    return sorted(rows, key=operator.itemgetter(0, 1))  # stable: arrival order among equal keys


class SqlHistory(SqlStore):
    """History reads, roll-up folds and retention of a SQL store (see the module docstring)."""

    def series_columns(self, job_id: int, metric: str) -> SeriesColumns:
        """Every window of a metric, in step order, as columns (no object per window: fast for long series)."""
        rows = _step_order(self._read(self._sql(_SERIES_SQL), (job_id, metric)))
        if not rows:
            return SeriesColumns([], [], [], [], [], [], [], [])
        steps, times, lasts, mins, maxs, means, counts, nonfinites = (list(c) for c in zip(*rows))
        if self.dialect.nan_as_text:
            lasts = [load_float(v) for v in lasts]
        return SeriesColumns(steps, times, lasts, mins, maxs, means, counts, nonfinites)

    def series(self, job_id: int, metric: str) -> list[SeriesPoint]:
        """Every window of a metric, in step order."""
        rows = _step_order(self._read(self._sql(_SERIES_SQL), (job_id, metric)))
        return [SeriesPoint(r[0], r[1], load_float(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows]

    def history_columns(self, job_id: int, metric: str, max_points: int) -> SeriesColumns:
        """A series for ``max_points``: every window when short, else roll-ups and the windows after them."""
        for _ in range(2):
            try:
                with self._reading() as conn:
                    found = rollups.read_series(conn, job_id, metric, max_points)
            except rollups.NeedsFold:
                self._fold_all(job_id, metric)  # older data, or ingest fell behind: once, then it is kept up
                continue
            if found is not None:
                return found
            break
        return self.series_columns(job_id, metric)

    def _fold_all(self, job_id: int, metric: str) -> None:
        """Fold a whole series, in transactions of 32,768 windows (ingest goes on in between), the job
        locked (another process may fold it)."""
        chunk = 8 * rollups.FOLD_CHUNK
        while True:
            with self._write() as conn:
                self._lock_job(conn, job_id)
                if rollups.fold(self.dialect.qmark(conn), job_id, metric, limit=chunk) < chunk:
                    return

    def rebuild_rollups(self, job_id: int | None = None) -> int:
        """Rebuild the roll-ups of a job or of all (after a VACUUM, or data written by another tool)."""
        with self._write() as conn:
            self._lock_job(conn, job_id)
            folded = rollups.rebuild(self.dialect.qmark(conn), job_id)
        self._unfolded.clear()
        return folded

    def metric_names(self, job_id: int) -> list[str]:
        """The metrics a job has reported, sorted (a skip-scan of the index: one seek per metric)."""
        return [r[0] for r in self._read(self._sql(rollups.METRICS_SQL), (job_id, job_id))]

    def progress_samples(self, job_id: int, since: float | None = None) -> list[ProgressSample]:
        """Rank 0's (arrival time, step), oldest first.

        Read by rank 0's partial index (``reports_rank0_progress``, schema.py): the ``rank = 0`` written
        as the index's own ``WHERE`` is what lets either database use it."""
        rows = self._read(
            self._sql(
                "SELECT received_at, step FROM reports WHERE job_id = ? AND rank = 0 AND step IS NOT NULL "
                "AND newest = TRUE AND received_at >= ? ORDER BY received_at"
            ),
            (job_id, since if since is not None else -math.inf),
        )
        return [ProgressSample(r[0], r[1]) for r in rows]

    # --------------------------------------------------------------------------------- retention

    def compact(
        self, before: float | None, quotas: Mapping[str, int] | None = None, budget: int = 20_000
    ) -> Compaction:
        """One bounded retention pass (see :mod:`.retention`)."""
        return run_pass(self._retention_tx, before, quotas, budget)

    @contextmanager
    def _retention_tx(self, job_id: int | None) -> Iterator[Connection]:
        """A write transaction for retention on a ``?`` connection, the job's row locked where one is named
        (ingest and folds of that job wait; other jobs go on)."""
        with self._write(pipeline=False) as conn:  # each DELETE's row count is read at once
            if job_id is not None:
                self._lock_job(conn, job_id)
            yield self.dialect.qmark(conn)
