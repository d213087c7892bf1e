"""Roll-ups of long series: history reads that touch O(max_points) rows, not every stored window.

Both stores keep them with the same SQL (written in what SQLite and PostgreSQL both understand, with
``?`` placeholders: the PostgreSQL store hands in a connection that takes them). A window's arrival
order is ``points.rowid``: SQLite's own, an identity column of that name in PostgreSQL.

Every stored window of a metric is a row of ``points``. A chart of a long series asks for a thousand
points out of millions of windows; reading them all takes seconds. So the store keeps, per job and
metric, **roll-up levels**: a level-1 row merges :data:`FANOUT` consecutive windows (in arrival
order, which is step order for a job that only steps forward), a level-2 row merges :data:`FANOUT`
level-1 rows, and so on. Rows are merged with the history's own bucket arithmetic
(:func:`~stepwatch.server.analysis.downsample_columns`, which is associative): min of the mins, max
of the maxes, sums of counts, finite-weighted means, and a non-finite ``last`` stays visible.

Folding happens at ingest, once the store's interval of new windows of a series have arrived
(``SqlStore._FOLD_EVERY``, 256: a read of 256 rows and 16 inserts, amortised), at most :data:`FOLD_CHUNK`
windows at a time so a report never waits long; a read folds what ingest has not (data from before this
schema, or written by another tool) and reads the windows after the last fold one by one. Each roll-up
row names the last ``points`` rowid it covers, so a read takes the coarsest level that still has enough
rows, then the finer rows and the raw windows after it.

Where arrival order and step order differ (a late window, a first report from a resumed run), a
read opens the few rows that overlap into their windows. A series whose steps go back and forth
throughout (a step counter reset inside one attempt) cannot be put in step order that way; such
reads fall back to every window. ``VACUUM`` may renumber the rowids of ``points``: after one,
:func:`rebuild` the roll-ups.
"""

from __future__ import annotations

from itertools import pairwise
from operator import le
from typing import Any

from ..analysis import Columns, downsample_columns
from .base import SeriesColumns
from .rows import load_float, store_float
from .sql_dialect import Connection

__all__ = [
    "FANOUT",
    "FOLD_CHUNK",
    "KEEP_LEVEL",
    "LEVELS",
    "METRICS_SQL",
    "NeedsFold",
    "compacted_floor",
    "fold",
    "read_series",
    "rebuild",
]

FANOUT = 16
"""Windows (or rows of the level below) merged into one roll-up row. Each level has 16 times fewer
rows than the one below, so some level has between ``max_points / 2`` and ``8 * max_points`` rows
for any long series; the roll-ups add about 7 % to the rows stored."""

LEVELS = 5
"""Level 1 merges 16 windows, level 5 about a million: a year of 2 s windows (16 million) is 15
level-5 rows."""

FOLD_CHUNK = 4096
"""At most this many windows are folded in one go at ingest."""

KEEP_LEVEL = 2
"""Retention (:mod:`.retention`) never deletes roll-up rows of this level and above; finer ones (and raw
windows) it compacts, so a series' history may start at any level up to this one."""

_COLUMNS = "step, t, last, min, max, mean, count, nonfinite"

METRICS_SQL = (
    "WITH RECURSIVE names (metric) AS (SELECT MIN(metric) FROM points WHERE job_id = ? UNION ALL "
    "SELECT (SELECT MIN(metric) FROM points WHERE job_id = ? AND metric > names.metric) FROM names "
    "WHERE names.metric IS NOT NULL) SELECT metric FROM names WHERE metric IS NOT NULL"
)
"""The metrics a job has raw windows of, sorted (arguments: the job's id, twice): a skip-scan of the
``(job_id, metric)`` index, one seek per metric however long the series."""


def fold(conn: Connection, job_id: int, metric: str, limit: int | None = FOLD_CHUNK) -> int:
    """Fold complete groups of unfolded windows (then of each level's rows) into roll-ups; windows folded.

    Call inside a write transaction. ``limit`` bounds the windows read (``None``: all of them).
    """
    done = 0
    covered = _covered(conn, job_id, metric, 1)
    while True:
        chunk = FOLD_CHUNK if limit is None else min(FOLD_CHUNK, limit - done)
        if chunk < FANOUT:
            break
        rows = conn.execute(
            f"SELECT rowid, {_COLUMNS} FROM points WHERE job_id = ? AND metric = ? AND rowid > ? "
            "ORDER BY rowid LIMIT ?",
            (job_id, metric, covered, chunk - chunk % FANOUT),
        ).fetchall()
        groups = len(rows) // FANOUT
        if groups:
            complete = rows[: groups * FANOUT]
            steps = [r[1] for r in complete]
            in_order = list(map(le, steps[:-1], steps[1:]))  # each window's step against the next one's
            merged = _merge_groups([r[1:] for r in complete], groups)
            for g, row in enumerate(merged):
                ordered = all(in_order[g * FANOUT : (g + 1) * FANOUT - 1])
                _insert(conn, job_id, metric, 1, complete[(g + 1) * FANOUT - 1][0], row, ordered)
        done += groups * FANOUT
        if groups:
            covered = rows[groups * FANOUT - 1][0]
        if len(rows) < chunk - chunk % FANOUT:
            break
    level = 2
    while done and level <= LEVELS and _fold_level(conn, job_id, metric, level):
        level += 1  # a level is only looked at when the one below it just grew a row
    return done


def _fold_level(conn: Connection, job_id: int, metric: str, level: int) -> bool:
    """Fold complete groups of a level's rows into the level above; whether a row was added."""
    covered = _covered(conn, job_id, metric, level)
    rows = conn.execute(
        f"SELECT last_rowid, first_step, windows, ordered, {_COLUMNS} FROM rollups "
        "WHERE job_id = ? AND metric = ? AND level = ? AND last_rowid > ? ORDER BY last_rowid",
        (job_id, metric, level - 1, covered),
    ).fetchall()
    for g in range(len(rows) // FANOUT):
        group = rows[g * FANOUT : (g + 1) * FANOUT]
        merged = _merge([r[4:] for r in group], [r[1] for r in group], [r[2] for r in group])
        ordered = all(r[3] for r in group) and all(b[1] >= a[4] for a, b in pairwise(group))
        _insert(conn, job_id, metric, level, group[-1][0], merged, ordered)
    return len(rows) >= FANOUT


def _covered(conn: Connection, job_id: int, metric: str, level: int) -> int:
    """The last ``points`` rowid that a level's rows cover (0: none)."""
    row = conn.execute(
        "SELECT MAX(last_rowid) FROM rollups WHERE job_id = ? AND metric = ? AND level = ?", (job_id, metric, level)
    ).fetchone()
    return int(row[0] or 0)


def _merge(rows: list[Any], first_steps: list[int] | None, windows: list[int] | None) -> tuple[Any, ...]:
    """One bucket from rows of ``step, t, last, min, max, mean, count, nonfinite`` (windows or buckets)."""
    steps, times, lasts, mins, maxs, means, counts, nonfinites = (list(c) for c in zip(*rows))
    c = downsample_columns(
        steps,
        times,
        [load_float(v) for v in lasts],
        mins,
        maxs,
        means,
        counts,
        nonfinites,
        1,
        first_steps=first_steps,
        windows=windows,
    )
    return _bucket(c, 0)


def _merge_groups(windows: list[Any], groups: int) -> list[tuple[Any, ...]]:
    """Level-1 rows from ``groups * FANOUT`` raw windows (``step, t, last, min, max, mean, count, nonfinite``):
    each run of :data:`FANOUT` merged as :func:`_merge` merges it, in one call of the bucket arithmetic (single
    windows in ``groups`` equal buckets: the same buckets), not one call a group."""
    steps, times, lasts, mins, maxs, means, counts, nonfinites = (list(c) for c in zip(*windows))
    c = downsample_columns(steps, times, [load_float(v) for v in lasts], mins, maxs, means, counts, nonfinites, groups)
    return [_bucket(c, k) for k in range(groups)]


def _bucket(c: Columns, k: int) -> tuple[Any, ...]:
    """Bucket ``k`` of merged columns as a roll-up row's cells, from ``first_step`` to ``windows``."""
    return (
        c.first_steps[k],
        c.steps[k],
        c.times[k],
        store_float(c.lasts[k]),
        c.mins[k],
        c.maxs[k],
        c.means[k],
        c.counts[k],
        c.nonfinites[k],
        c.windows[k],
    )


def _insert(
    conn: Connection,
    job_id: int,
    metric: str,
    level: int,
    last_rowid: int,
    row: tuple[Any, ...],
    ordered: bool,
) -> None:
    """One roll-up row; ``ordered``: the steps of the windows it merges never go back, in arrival order."""
    conn.execute(
        "INSERT INTO rollups (job_id, metric, level, last_rowid, first_step, step, t, last, min, max, "
        "mean, count, nonfinite, windows, ordered) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (job_id, metric, level, last_rowid) DO UPDATE SET first_step = excluded.first_step, "
        "step = excluded.step, t = excluded.t, last = excluded.last, min = excluded.min, max = excluded.max, "
        "mean = excluded.mean, count = excluded.count, nonfinite = excluded.nonfinite, "
        "windows = excluded.windows, ordered = excluded.ordered",
        (job_id, metric, level, last_rowid, *row, ordered),
    )


def rebuild(conn: Connection, job_id: int | None = None) -> int:
    """Drop and rebuild the roll-ups of a job (or of every job); windows folded. In a write transaction."""
    if job_id is None:
        series = conn.execute("SELECT DISTINCT job_id, metric FROM points").fetchall()
    else:
        series = [
            (job_id, m) for (m,) in conn.execute("SELECT DISTINCT metric FROM points WHERE job_id = ?", (job_id,))
        ]
    # a compacted series' roll-ups are its only copy of what was compacted: they are kept as they are
    series = [(j, m) for j, m in series if not compacted_floor(conn, j, m)]
    kept = {(j, m) for j, m in series}
    for j, m in conn.execute(
        "SELECT DISTINCT job_id, metric FROM rollups" + (" WHERE job_id = ?" if job_id is not None else ""),
        () if job_id is None else (job_id,),
    ).fetchall():
        if (j, m) in kept or not compacted_floor(conn, j, m):
            conn.execute("DELETE FROM rollups WHERE job_id = ? AND metric = ?", (j, m))
    return sum(fold(conn, j, m, limit=None) for j, m in series)


def compacted_floor(conn: Connection, job_id: int, metric: str) -> int:
    """The finest level a series' history still starts at: 0 (raw windows, not compacted), 1 or 2.

    A compacted level's first remaining entry lies after the first row of the level above it, which
    it never does while the level is whole.
    """
    firsts = dict(
        conn.execute(
            "SELECT level, MIN(last_rowid) FROM rollups WHERE job_id = ? AND metric = ? AND level <= ? GROUP BY level",
            (job_id, metric, KEEP_LEVEL),
        ).fetchall()
    )
    if not firsts:
        return 0
    raw = conn.execute("SELECT MIN(rowid) FROM points WHERE job_id = ? AND metric = ?", (job_id, metric)).fetchone()
    firsts[0] = raw[0] if raw else None
    for level in range(KEEP_LEVEL):
        mine = firsts.get(level)
        above = [v for lv, v in firsts.items() if lv > level and v is not None]
        if mine is not None and (not above or mine <= min(above)):
            return level
    return KEEP_LEVEL


class NeedsFold(Exception):
    """The series has more unfolded windows than a read should touch: fold them first."""


def read_series(conn: Connection, job_id: int, metric: str, max_points: int) -> SeriesColumns | None:
    """A long series for ``max_points`` as roll-up rows, then the finer rows and raw windows after them.

    ``None`` when every window should be read instead: the series is short (at most
    ``FANOUT // 2 * max_points`` windows, a read of a few ms), or its steps go back and forth so
    much that the roll-ups cannot be put in step order. Raises :class:`NeedsFold` when more windows
    than that are not folded yet. The level read is the coarsest with at least ``max_points // 2``
    rows: so at most about ``FANOUT // 2 * max_points`` rows are read, whatever the length.

    Roll-ups merge windows in arrival order; charts want step order. Where the two differ (a window
    that arrived late, a step counter that went back), the rows involved are opened into their finer
    rows or windows until the entries are in step order without overlapping, within
    :data:`FOLD_CHUNK` opened windows.
    """
    short = FANOUT // 2 * max_points
    counts = dict(
        conn.execute(
            "SELECT level, COUNT(*) FROM rollups WHERE job_id = ? AND metric = ? GROUP BY level", (job_id, metric)
        ).fetchall()
    )
    floor = compacted_floor(conn, job_id, metric) if counts else 0
    if not floor and counts.get(1, 0) * FANOUT <= short:
        windows = conn.execute(
            "SELECT COUNT(*) FROM (SELECT 1 FROM points WHERE job_id = ? AND metric = ? LIMIT ?) AS w",
            (job_id, metric, short + FOLD_CHUNK + 1),
        ).fetchone()[0]
        if windows <= short:
            return None
        if windows > short + FOLD_CHUNK:
            raise NeedsFold
    level = max((lv for lv, n in counts.items() if n >= max_points // 2), default=1)
    level = max(level, floor)  # a compacted series starts at its finest intact level
    entries: list[_Entry] = []
    covered = 0
    for lv in range(level, 0, -1):
        rows = _rows(conn, job_id, metric, lv, covered, None)
        entries.extend(rows)
        if rows:
            covered = rows[-1][_HI]
    raw = _windows(conn, job_id, metric, covered, None, FOLD_CHUNK + 1)
    if len(raw) > FOLD_CHUNK:
        raise NeedsFold
    entries.extend(raw)
    in_order = _in_step_order(conn, job_id, metric, entries) if not floor else _sorted(entries)
    if in_order is None:
        return None
    steps, first_steps, times, lasts, mins, maxs, means, totals, nonfinites, windows_ = (
        list(c) for c in list(zip(*in_order))[:10]
    )
    return SeriesColumns(
        steps, times, [load_float(v) for v in lasts], mins, maxs, means, totals, nonfinites, first_steps, windows_
    )


_Entry = tuple[Any, ...]
"""A row or a window: step, first_step, t, last, min, max, mean, count, nonfinite, windows, then its
level (0: a window), whether its steps were in order, and the rowids it covers: (lo, hi]."""
_LEVEL, _ORDERED, _LO, _HI = 10, 11, 12, 13
_MAX_ROWID = 2**63 - 1


def _rows(conn: Connection, job_id: int, metric: str, level: int, lo: int, hi: int | None) -> list[_Entry]:
    """A level's rows covering rowids in (lo, hi], as entries (built by the database, not row by row in Python)."""
    found: list[_Entry] = conn.execute(
        "SELECT step, first_step, t, last, min, max, mean, count, nonfinite, windows, level, ordered, "
        "LAG(last_rowid, 1, ?) OVER (ORDER BY last_rowid), last_rowid FROM rollups WHERE job_id = ? AND metric = ? "
        "AND level = ? AND last_rowid > ? AND last_rowid <= ? ORDER BY last_rowid",
        (lo, job_id, metric, level, lo, _MAX_ROWID if hi is None else hi),
    ).fetchall()
    return found


def _windows(
    conn: Connection, job_id: int, metric: str, lo: int, hi: int | None, limit: int = _MAX_ROWID
) -> list[_Entry]:
    """The raw windows with rowids in (lo, hi], as entries."""
    found: list[_Entry] = conn.execute(
        "SELECT step, step, t, last, min, max, mean, count, nonfinite, 1, 0, 1, rowid - 1, rowid FROM points "
        "WHERE job_id = ? AND metric = ? AND rowid > ? AND rowid <= ? ORDER BY rowid LIMIT ?",
        (job_id, metric, lo, _MAX_ROWID if hi is None else hi, limit),
    ).fetchall()
    return found


def _sorted(entries: list[_Entry]) -> list[_Entry]:
    """A compacted series' entries in step order as they stand: what they merged cannot be opened any more."""
    if all(b[1] >= a[0] for a, b in pairwise(entries)):
        return entries
    return sorted(entries, key=lambda e: (e[1], e[0], e[2]))


def _in_step_order(conn: Connection, job_id: int, metric: str, entries: list[_Entry]) -> list[_Entry] | None:
    """The entries in step order, opening the roll-ups that stand in the way; ``None`` beyond the budget."""
    opened = 0
    while True:
        if all(e[_ORDERED] for e in entries) and all(b[1] >= a[0] for a, b in pairwise(entries)):
            return entries
        entries.sort(key=lambda e: (e[1], e[0], e[2]))
        blocking = {i for i, e in enumerate(entries) if not e[_ORDERED] and e[_LEVEL]}
        for i in range(1, len(entries)):
            if entries[i][1] < entries[i - 1][0]:  # they overlap: open whichever of the two is a roll-up
                blocking.update(j for j in (i - 1, i) if entries[j][_LEVEL])
        if not blocking:
            return None if any(b[1] < a[0] for a, b in pairwise(entries)) else entries
        opened += sum(entries[i][9] for i in blocking)
        if opened > FOLD_CHUNK:
            return None
        finer: list[_Entry] = []
        for i in sorted(blocking):
            e = entries[i]
            if e[_LEVEL] == 1:
                finer.extend(_windows(conn, job_id, metric, e[_LO], e[_HI]))
            else:
                finer.extend(_rows(conn, job_id, metric, e[_LEVEL] - 1, e[_LO], e[_HI]))
        entries = [e for i, e in enumerate(entries) if i not in blocking] + finer
