"""The two stores side by side, in one run: ingest reports/s and history read ms, SQLite and PostgreSQL.

Each store is called in this process, as the server calls it from its worker threads (no HTTP: the
server's own costs are the same for both and ``benchmarks/server_ingest.py`` measures them)::

    .venv/bin/python benchmarks/store_backends.py
    .venv/bin/python benchmarks/store_backends.py --database-url postgresql://root@127.0.0.1/test --windows 1000000
    .venv/bin/python benchmarks/store_backends.py --quick        # small sizes, a smoke run (seconds)

SQLite is a fresh file in a temporary directory. PostgreSQL is a fresh schema of the database at
``--database-url``, dropped at the end; it runs twice: as configured (``synchronous_commit=on``:
every commit waits for the disk, as a production server should), and with ``synchronous_commit=off``
(a commit does not wait for the flush: SQLite's ``synchronous=NORMAL`` in WAL mode does not either).

Figures:

- ingest, batch of B: 200 jobs, each report with 5 metric windows, written ``B`` at a time through
  ``ingest_reports`` (what the server's group commit does under load: B = 1 when reports trickle in,
  larger when they arrive faster than one commit);
- history: a job with ``--windows`` windows of one metric (written raw, then roll-ups rebuilt, as
  the server would have built them at ingest), read as the history route reads it
  (``history_columns`` then downsampling to 1,000 points); median of 5 reads;
- list: ``jobs(limit=200)`` of the 200 jobs (cache warm), median of 20.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent / "src"))

from stepwatch.protocol import Identity, MetricWindow, Progress, Report  # noqa: E402
from stepwatch.server.store import JobFilter, PendingReport, SQLiteStore, Store  # noqa: E402
from stepwatch.server.views.history import downsampled  # noqa: E402

RawWriter = Callable[[int, list[tuple[Any, ...]]], None]
"""Writes rows of ``points`` straight into the database (not through the store)."""


def report(seq: int, metrics: int = 5) -> Report:
    windows = tuple(
        MetricWindow(
            name=f"metric_{k}",
            last=1.0 / seq,
            min=0.5 / seq,
            max=2.0 / seq,
            mean=1.0 / seq,
            count=10,
            nonfinite=0,
            first_step=seq * 10 - 9,
            last_step=seq * 10,
        )
        for k in range(metrics)
    )
    return Report(
        run_id="bench",
        seq=seq,
        sent_at=1_800_000_000.0 + seq,
        identity=Identity(rank=0, world_size=1, host="node", pid=1),
        progress=Progress(step=seq * 10, total_steps=1_000_000),
        metrics=windows,
        params=None,
        acks=(),
        state="running",
        reason="",
    )


def ingest_rate(store: Store, jobs: int, reports: int, batch: int) -> float:
    """Reports/s through ``ingest_reports`` in batches of ``batch`` (jobs interleaved, as they arrive)."""
    made = [store.register("bench", f"b{batch}-{i}", token_hash="h", now=1.0) for i in range(jobs)]
    items = [PendingReport(made[n % jobs], report(n // jobs + 1), 1_800_000_000.0 + n * 0.001) for n in range(reports)]
    started = time.perf_counter()
    for start in range(0, len(items), batch):
        store.ingest_reports(items[start : start + batch])
    return reports / (time.perf_counter() - started)


def history_ms(store: Store, write_raw: RawWriter, windows: int) -> float:
    """Median ms of a history read of ``windows`` windows to 1,000 points (roll-ups built first)."""
    job = store.register("bench", "history", token_hash="h", now=1.0)
    rng = random.Random(7)
    rows = []
    for i in range(windows):
        v = 1.0 / (1 + i / 1000) + rng.gauss(0, 0.01)
        rows.append((job.id, "loss", i + 1, 1000.0 + 2 * i, v, v, v, v, 1, 0))
    rows[windows // 2] = (job.id, "loss", windows // 2 + 1, 1000.0 + windows, math.nan, None, None, None, 1, 1)
    for start in range(0, windows, 100_000):
        write_raw(job.id, rows[start : start + 100_000])
    store.rebuild_rollups(job.id)  # type: ignore[attr-defined]
    times = []
    for _ in range(5):
        started = time.perf_counter()
        points = downsampled(store.history_columns(job.id, "loss", 1000), 1000)
        times.append(time.perf_counter() - started)
        assert 500 <= len(points) <= 1000 and sum(p["nonfinite"] for p in points) == 1
    return 1000 * statistics.median(times)


def list_ms(store: Store) -> float:
    store.jobs(JobFilter(limit=200))
    times = []
    for _ in range(20):
        started = time.perf_counter()
        store.jobs(JobFilter(limit=200))
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


@contextmanager
def sqlite_backend() -> Iterator[tuple[Store, RawWriter]]:
    import sqlite3

    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "bench.db")

        def write_raw(job_id: int, rows: list[tuple[Any, ...]]) -> None:
            with sqlite3.connect(store.path) as conn:
                conn.executemany(
                    "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(*r[:4], "NaN" if math.isnan(r[4]) else r[4], *r[5:]) for r in rows],
                )

        try:
            yield store, write_raw
        finally:
            store.close()


@contextmanager
def postgres_backend(url: str, synchronous: bool) -> Iterator[tuple[Store, RawWriter]]:
    import psycopg

    from stepwatch.server.store.postgres import PostgresStore

    schema = f"sw_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in url else "?"
    options = f"-csearch_path%3D{schema}" + ("" if synchronous else "%20-csynchronous_commit%3Doff")
    schema_url = f"{url}{sep}options={options}"
    store = PostgresStore(schema_url)

    def write_raw(job_id: int, rows: list[tuple[Any, ...]]) -> None:
        with (
            psycopg.connect(schema_url) as conn,
            conn.cursor() as cur,
            cur.copy(
                "COPY points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) FROM STDIN"
            ) as copy,
        ):
            for row in rows:
                copy.write_row(row)

    try:
        yield store, write_raw
    finally:
        store.close()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://root@127.0.0.1/test", help="the PostgreSQL server")
    parser.add_argument("--windows", type=int, default=1_000_000, help="windows of the history read")
    parser.add_argument("--reports", type=int, default=4000, help="reports per ingest figure")
    parser.add_argument("--batches", default="1,16,256", help="batch sizes of the ingest figures")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.windows, args.reports, args.batches = 20_000, 400, "1,64"
    batches = [int(b) for b in args.batches.split(",")]
    backends: list[tuple[str, Callable[[], Any]]] = [("SQLite (WAL, synchronous=NORMAL)", sqlite_backend)]
    backends.append(("PostgreSQL (synchronous_commit=on)", lambda: postgres_backend(args.database_url, True)))
    backends.append(("PostgreSQL (synchronous_commit=off)", lambda: postgres_backend(args.database_url, False)))
    rows: list[list[str]] = []
    for label, open_backend in backends:
        print(f"== {label}", file=sys.stderr, flush=True)
        try:
            with open_backend() as (store, write_raw):
                figures = []
                for batch in batches:
                    reports = min(args.reports, 400) if batch == 1 else args.reports
                    figures.append(f"{ingest_rate(store, 200, reports, batch):,.0f}")
                figures.append(f"{history_ms(store, write_raw, args.windows):.1f}")
                figures.append(f"{list_ms(store):.1f}")
        except Exception as exc:  # no PostgreSQL here: say so, keep SQLite's figures
            print(f"   skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
            figures = ["-"] * (len(batches) + 2)
        rows.append([label, *figures])
    header = [
        "store",
        *(f"ingest B={b} (reports/s)" for b in batches),
        f"history {args.windows:,} windows (ms)",
        "list 200 jobs (ms)",
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
