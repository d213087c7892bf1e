"""Retention: the size of a long job's history before and after compaction, in one run (SQLite).

A job reports every 2 s (one metric window and one progress report each time), for ``--days`` days;
the history is written raw, roll-ups built as ingest builds them, then retention keeps
``--keep-days`` raw and compacts the rest (passes of the server's 20,000 rows). Sizes are the bytes
of the pages the database uses (``page_count - freelist_count``: free pages are reused by new rows),
per table from ``dbstat``. A chart of the whole series (1,000 points) is read before and after: its
extremes, non-finite marks and window count must be the same.

A year is 15.8 million windows. Building that takes long here, so the default is a scaled run: two
lengths (``--days``, and a third of it), each measured, and the year extrapolated from them (sizes
are affine in the length: the kept days are fixed, the rest grows linearly)::

    .venv/bin/python benchmarks/retention.py                 # 24 and 8 days, a year extrapolated
    .venv/bin/python benchmarks/retention.py --days 365      # the full year, measured (long)
    .venv/bin/python benchmarks/retention.py --quick         # a smoke run (seconds)
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stepwatch.server.store import SQLiteStore
from stepwatch.server.store.maintenance import sqlite_stats
from stepwatch.server.store.retention_task import DAY_S, PASS_BUDGET
from stepwatch.server.views.history import downsampled

INTERVAL_S = 2.0
TARGET_MB = 50.0
YEAR_DAYS = 365.0
END = 1.8e9  # the last report's time; the history ends here


def used_bytes(path: Path) -> int:
    """Bytes of the pages the database uses (the file less its free pages; WAL checkpointed)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages, free, size = (
            conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size")
        )
    return int((pages - free) * size)


def value(i: int) -> float:
    """A decaying loss with a spike every 100,000 windows and a NaN every 250,000."""
    if i % 250_000 == 123_457:
        return math.nan
    if i % 100_000 == 54_321:
        return 1e3
    return 1.0 / (1 + i / 10_000) + 0.01 * math.sin(i)


def build(path: Path, days: float) -> tuple[int, int]:
    """The job's history, raw, with roll-ups; (job id, windows)."""
    n = int(days * DAY_S / INTERVAL_S)
    store = SQLiteStore(path)
    try:
        job = store.register("bench", "year", token_hash="h", now=END - n * INTERVAL_S - 1)
        with sqlite3.connect(path) as conn:
            for start in range(0, n, 200_000):
                stop = min(n, start + 200_000)
                t0 = END - n * INTERVAL_S
                points = []
                for i in range(start, stop):
                    v = value(i)
                    cells = (v, v, v, v, 0) if math.isfinite(v) else ("NaN", None, None, None, 1)
                    points.append((job.id, "loss", i + 1, t0 + i * INTERVAL_S, *cells))
                conn.executemany(
                    "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
                    points,
                )
                conn.executemany(
                    "INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step, newest) "
                    "VALUES (?, 'run', 0, ?, ?, ?, ?, 1)",
                    [(job.id, i, t0 + i * INTERVAL_S, t0 + i * INTERVAL_S, i + 1) for i in range(start, stop)],
                )
                conn.commit()
        store.rebuild_rollups(job.id)  # what ingest keeps up as the windows arrive
        return job.id, n
    finally:
        store.close()


def chart(store: SQLiteStore, job_id: int) -> tuple[Any, ...]:
    points = downsampled(store.history_columns(job_id, "loss", 1000), 1000)
    return (
        sum(p["windows"] for p in points),
        max(p["max"] for p in points if p["max"] is not None),
        sum(p["nonfinite"] for p in points),
        sum(1 for p in points if isinstance(p["last"], str)),
        points[-1]["step"],
    )


def measure(days: float, keep_days: float, workdir: Path) -> dict[str, Any]:
    path = workdir / f"retention-{days:g}.db"
    started = time.perf_counter()
    job_id, windows = build(path, days)
    built_s = time.perf_counter() - started
    before = used_bytes(path)
    tables_before = {t.name: t for t in sqlite_stats(str(path)).tables}
    store = SQLiteStore(path)
    try:
        shown = chart(store, job_id)
        passes: list[float] = []
        deleted = 0
        while True:
            t = time.perf_counter()
            done = store.compact(END - keep_days * DAY_S, None, PASS_BUDGET)
            passes.append(time.perf_counter() - t)
            deleted += done.deleted
            if not done.more:
                break
        kept = chart(store, job_id) == shown
    finally:
        store.close()
    after = used_bytes(path)
    tables_after = {t.name: t for t in sqlite_stats(str(path)).tables}
    path.unlink()
    for extra in ("-wal", "-shm"):
        Path(f"{path}{extra}").unlink(missing_ok=True)
    return {
        "days": days,
        "windows": windows,
        "built_s": built_s,
        "before": before,
        "after": after,
        "tables_before": tables_before,
        "tables_after": tables_after,
        "passes": passes,
        "deleted": deleted,
        "kept": kept,
    }


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=24.0, help="length of the longer run (default 24)")
    parser.add_argument("--keep-days", type=float, default=1.0, help="raw windows kept (default 1 day)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 days and a third of it")
    args = parser.parse_args(argv)
    days = 2.0 if args.quick else args.days
    keep = min(args.keep_days, days / 6)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [measure(d, keep, Path(tmp)) for d in (days / 3, days)]
    print(
        f"retention: one job, one metric, a report every {INTERVAL_S:g} s; {keep:g} day(s) kept raw, the rest compacted"
    )
    print()
    print(
        f"{'days':>7} {'windows':>12} {'MB before':>10} {'MB after':>9} {'ratio':>7} {'passes':>7} "
        f"{'max pass ms':>12} {'chart kept':>11}"
    )
    for r in runs:
        print(
            f"{r['days']:>7.1f} {r['windows']:>12,} {mb(r['before']):>10} {mb(r['after']):>9} "
            f"{r['before'] / max(r['after'], 1):>6.0f}x {len(r['passes']):>7} {1000 * max(r['passes']):>12.0f} "
            f"{'yes' if r['kept'] else 'NO':>11}"
        )
    short, long_ = runs
    if long_["days"] >= YEAR_DAYS:
        year_before, year_after, how = long_["before"], long_["after"], "measured"
    else:
        slope = lambda key: (long_[key] - short[key]) / (long_["days"] - short["days"])  # noqa: E731
        year_before = long_["before"] + slope("before") * (YEAR_DAYS - long_["days"])
        year_after = long_["after"] + slope("after") * (YEAR_DAYS - long_["days"])
        how = f"extrapolated from {short['days']:g} and {long_['days']:g} days"
    print()
    print(
        f"{'table':<10} {'rows before':>12} {'MB before':>10} {'rows after':>11} {'MB after':>9}"
        f"   ({long_['days']:g} days)"
    )
    for name, t in sorted(long_["tables_before"].items()):
        a = long_["tables_after"].get(name)
        if t.rows or (a and a.rows):
            print(f"{name:<10} {t.rows:>12,} {mb(t.bytes):>10} {a.rows if a else 0:>11,} {mb(a.bytes if a else 0):>9}")
    print()
    met = year_after / 1e6 < TARGET_MB
    print(
        f"a year ({int(YEAR_DAYS * DAY_S / INTERVAL_S):,} windows), {how}: {mb(year_before)} MB uncompacted, "
        f"{mb(year_after)} MB compacted; target < {TARGET_MB:g} MB: {'met' if met else 'MISSED'}"
    )
    return 0 if all(r["kept"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
