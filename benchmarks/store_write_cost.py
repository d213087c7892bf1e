"""What a report costs in the SQLite store's write, statement by statement, with the write-ahead log
copied back inside commits (SQLite's default, 1,000 pages) and by the store's thread (as shipped).

The reports are those of ``server_ingest.py`` (5 metric windows each) for 200 jobs, written in
batches of 50 through ``SQLiteStore.ingest_reports`` in this process, as the server's group commit
writes them under load. Each statement of the writer's connection is timed (wall and this thread's
CPU); the two configurations run one after the other on fresh files, twice, alternating.

    .venv/bin/python benchmarks/store_write_cost.py               # 15,000 reports per configuration
    .venv/bin/python benchmarks/store_write_cost.py --reports 3000
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stepwatch.protocol import Report
from stepwatch.server.store import PendingReport, SQLiteStore

_spec = importlib.util.spec_from_file_location("server_ingest", Path(__file__).with_name("server_ingest.py"))
assert _spec is not None and _spec.loader is not None
server_ingest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(server_ingest)

JOBS, BATCH = 200, 50


class TimedConnection:
    """The writer's connection, timing each statement by its first words."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.wall: collections.Counter[str] = collections.Counter()
        self.cpu: collections.Counter[str] = collections.Counter()

    def _timed(self, method: Any, sql: str, *args: Any) -> Any:
        key = " ".join(sql.split()[:3])
        t0, c0 = time.perf_counter(), time.thread_time()
        result = method(sql, *args)
        self.wall[key] += time.perf_counter() - t0
        self.cpu[key] += time.thread_time() - c0
        return result

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed(self._conn.execute, sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed(self._conn.executemany, sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def run(reports: int, in_commits: bool) -> tuple[float, TimedConnection]:
    """Seconds of ``ingest_reports`` per report, and the statements' times."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "cost.db")
        if in_commits:  # SQLite's default: the commit that takes the log past 1,000 pages copies it
            store._checkpointer.close()
            store._writer.execute("PRAGMA wal_autocheckpoint=1000")
        jobs = [store.register("default", f"job-{i}", token_hash=f"h{i}", now=0.0) for i in range(JOBS)]
        rng, seqs, k = random.Random(1), [0] * JOBS, 0

        def batch() -> list[PendingReport]:
            nonlocal k
            out = []
            for _ in range(BATCH):
                j, k = k % JOBS, k + 1
                seqs[j] += 1
                body = server_ingest.report_dict(f"run{j:04d}", seqs[j], rng, 1000 + j)
                out.append(PendingReport(jobs[j], Report.from_dict(body), time.time(), None))
            return out

        for _ in range(20):  # warm-up
            store.ingest_reports(batch())
        timed = TimedConnection(store._writer)
        store._writer = timed  # type: ignore[assignment]
        spent = 0.0
        for _ in range(reports // BATCH):
            items = batch()
            t0 = time.perf_counter()
            store.ingest_reports(items)
            spent += time.perf_counter() - t0
        store._writer = timed._conn
        store.close()
        return spent / (reports // BATCH * BATCH), timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=15_000, help="reports per configuration and round")
    args = parser.parse_args()
    n = args.reports // BATCH * BATCH
    results: dict[str, list[tuple[float, TimedConnection]]] = {"copy in commits (SQLite)": [], "copy by a thread": []}
    for _ in range(2):
        for name, in_commits in (("copy in commits (SQLite)", True), ("copy by a thread", False)):
            results[name].append(run(n, in_commits))
    print(f"SQLiteStore.ingest_reports, {JOBS} jobs, batches of {BATCH}, {n:,} reports per round, 2 rounds")
    print(f"sqlite {sqlite3.sqlite_version}, python {sys.version.split()[0]}\n")
    print(f"{'':34}{'per report (rounds)':>24}{'COMMIT wall':>14}{'COMMIT CPU':>13}{'windows (points)':>18}")
    for name, rounds in results.items():
        per = " / ".join(f"{1e6 * r[0]:.0f}" for r in rounds)
        commit = sum(r[1].wall["COMMIT"] for r in rounds) / (2 * n)
        commit_cpu = sum(r[1].cpu["COMMIT"] for r in rounds) / (2 * n)
        points = sum(r[1].wall["INSERT INTO points"] for r in rounds) / (2 * n)
        print(f"{name:34}{per + ' us':>24}{1e6 * commit:>11.0f} us{1e6 * commit_cpu:>10.0f} us{1e6 * points:>15.0f} us")
    print("\nstatements of the last round copied by a thread, per report (wall):")
    last = results["copy by a thread"][-1][1]
    for key, seconds in last.wall.most_common(8):
        print(f"  {1e6 * seconds / n:7.1f} us  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
