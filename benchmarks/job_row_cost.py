"""What the width of a job's row costs each report on SQLite: the store's writer for jobs whose health history
holds N spans, and the job's ``UPDATE`` alone against a table of only the columns a report writes.

Every native report rewrites its job's row (``UPDATE jobs SET updated_at = ?, ..., last_metrics = ?,
metric_means = ? WHERE id = ?``). SQLite writes a row as one record: an ``UPDATE`` reads the whole record (its
overflow pages too, once it is over ~4 KB) and writes it again, and when the record's size changed (the text of
``last_metrics`` and ``metric_means`` changes length with the values) every page of it is written again, to the
write-ahead log. The columns a report never writes (``health_history``, up to ``MAX_SPANS`` = 500 spans,
``health_evidence``, ``params``, ``policy``, ``policy_fired``, ``trainer_status``...) are paid for all the same.

Part 1 (``--part store``): ``SQLiteStore.ingest_reports`` in this process, the reports of ``server_ingest.py``
(rank 0, 5 metric windows), ``--jobs`` jobs in turn, ``--batch`` reports a transaction, for jobs whose history
was grown to N spans through ``health_history.next_history`` (health flapping between two states, the words of
a straggler's evidence); the writing thread's CPU per report, min-max over ``--rounds`` rounds, the span
counts alternating within a round.

Part 2 (``--part update``): the job's ``UPDATE`` alone, on a copy of the jobs table (``wide``) against a table of
the columns a report writes plus the keys (``narrow``: what moving the others to a row of their own would leave),
the same two indexes, ``--batch`` updates a transaction, the ``last_metrics`` text changing length as it does;
thread CPU per update and write-ahead-log bytes per update (checkpoints off).

    .venv/bin/python benchmarks/job_row_cost.py                     # both parts, ~1 min
    .venv/bin/python benchmarks/job_row_cost.py --part store --spans 1,100,500 --batch 1,40
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_ingest import report_dict

from stepwatch.protocol import Report
from stepwatch.server.store import PendingReport, SQLiteStore
from stepwatch.server.store.health_history import next_history

HOT_COLUMNS = (
    "id, namespace, name, attempt, state, updated_at, last_report_at, step, epoch, samples, steps_per_second, "
    "samples_per_second, world_size, total_steps, last_metrics, metric_means, nonfinite_total, eta_seconds, "
    "eta_rate, eta_at, health, health_since"
)
"""The narrow table of part 2: the keys, and what a report (and its health's state) writes."""

UPDATE_SQL = (
    "UPDATE jobs SET updated_at = ?, last_report_at = ?, step = ?, epoch = ?, samples = ?, steps_per_second = ?, "
    "samples_per_second = ?, world_size = ?, total_steps = ?, last_metrics = ?, metric_means = ?, nonfinite_total = ? "
    "WHERE id = ?"
)
"""A rank-0 report's update, the columns it names (``sql_store._update``'s statement for them)."""


def grown_history(spans: int) -> list[dict[str, Any]]:
    """A health history of ``spans`` spans, as ``set_health`` grows it: the health flapping between
    ``healthy`` and ``straggling``, each change 60 s after the one before."""
    history: list[dict[str, Any]] = []
    old: tuple[str, float | None, dict[str, Any]] = ("unknown", None, {})
    for k in range(spans):
        t = 1_000.0 + 60.0 * k
        state = "straggling" if k % 2 else "healthy"
        message = (
            "rank 3 is 1.6x slower than the median rank (step time 0.41 s against 0.26 s) for 2 min"
            if k % 2
            else "loss falls: -0.012 per 10 min (standard error 0.003), level 0.412 at step 12,000"
        )
        new = (state, t, {"metric": "loss", "since": t, "message": message})
        history = next_history(history, old, new, t)
        old = new
    return history


def store_round(spans: int, batch: int, jobs: int, reports: int) -> float:
    """The writing thread's CPU per report (us) of ``reports`` reports of each of ``jobs`` jobs whose history
    holds ``spans`` spans, ``batch`` reports a transaction, on a fresh file."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "rows.db")
        try:
            registered = [store.register("default", f"row-{i}", token_hash="h", now=1.0) for i in range(jobs)]
            history = grown_history(spans)
            with store._write() as conn:  # the history set_health would have left, written at once
                registered = [store._update(conn, job, {"health_history": history}) for job in registered]
            rng = random.Random(0)
            bodies = [
                [Report.from_dict(report_dict(f"run-{i}", seq, rng, 1000 + i)) for seq in range(reports)]
                for i in range(jobs)
            ]
            latest = {job.id: job for job in registered}
            order = [(i, seq) for seq in range(reports) for i in range(jobs)]

            def write(items: list[tuple[int, int]]) -> None:
                pending = [PendingReport(latest[registered[i].id], bodies[i][seq], 2.0 + seq) for i, seq in items]
                for result in store.ingest_reports(pending):
                    assert not isinstance(result, Exception), result
                    latest[result.job.id] = result.job

            warm = jobs * 5
            for k in range(0, warm, batch):
                write(order[k : min(k + batch, warm)])
            cpu0 = time.thread_time()
            for k in range(warm, len(order), batch):
                write(order[k : k + batch])
            return 1e6 * (time.thread_time() - cpu0) / (len(order) - warm)
        finally:
            store.close()


def table_copy(path: Path, source: Path, narrow: bool, spans: int) -> sqlite3.Connection:
    """A file holding the jobs table of ``source`` (every column, or :data:`HOT_COLUMNS`), each job's history
    ``spans`` spans long, with the store's two indexes of jobs; checkpoints off, to count the log's bytes."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("ATTACH ? AS src", (str(source),))
    (ddl,) = conn.execute("SELECT sql FROM src.sqlite_master WHERE name = 'jobs'").fetchone()
    conn.execute(ddl.replace("CREATE TABLE jobs", "CREATE TABLE full_jobs", 1))
    conn.execute("INSERT INTO full_jobs SELECT * FROM src.jobs")
    conn.execute("UPDATE full_jobs SET health_history = ?", (json.dumps(grown_history(spans)),))
    if narrow:
        conn.execute(f"CREATE TABLE jobs AS SELECT {HOT_COLUMNS} FROM full_jobs")
        conn.execute("CREATE UNIQUE INDEX jobs_id ON jobs (id)")
        conn.execute("DROP TABLE full_jobs")
    else:
        conn.execute("ALTER TABLE full_jobs RENAME TO jobs")
    conn.execute("DETACH src")
    conn.execute("CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state)")
    conn.execute("CREATE INDEX IF NOT EXISTS jobs_by_updated ON jobs (updated_at)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return conn


def update_round(source: Path, tmp: Path, narrow: bool, spans: int, batch: int, n: int) -> tuple[float, float]:
    """Thread CPU (us) and write-ahead-log bytes per update of ``n`` rank-0 updates, ``batch`` a transaction."""
    path = tmp / ("narrow.db" if narrow else "wide.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    conn = table_copy(path, source, narrow, spans)
    try:
        ids = [row[0] for row in conn.execute("SELECT id FROM jobs")]
        values, means = conn.execute("SELECT last_metrics, metric_means FROM jobs LIMIT 1").fetchone()
        wal0 = os.path.getsize(f"{path}-wal")
        cpu0 = time.thread_time()
        for k in range(0, n, batch):
            conn.execute("BEGIN")
            for i in range(k, k + batch):
                # the text of a report's latest values changes length with them: a record of another size
                text = values + " " * (i % 3)
                row = (1e9 + i, 1e9 + i, i, None, 32 * i, 10.0, 320.0, 1, 100_000, text, means, 0, ids[i % len(ids)])
                conn.execute(UPDATE_SQL, row)
            conn.execute("COMMIT")
        cpu = time.thread_time() - cpu0
        return 1e6 * cpu / n, (os.path.getsize(f"{path}-wal") - wal0) / n
    finally:
        conn.close()


def source_jobs(tmp: Path, jobs: int) -> Path:
    """A store's file with ``jobs`` jobs that had a few reports each (their rows as the store writes them)."""
    path = tmp / "source.db"
    store = SQLiteStore(path)
    try:
        rng = random.Random(1)
        for i in range(jobs):
            job = store.register("default", f"src-{i}", token_hash="h" * 64, now=1.0, params={"lr": 3e-4, "bs": 32})
            for seq in range(3):
                store.ingest_report(job, Report.from_dict(report_dict(f"run-{i}", seq, rng, 1000 + i)), 2.0 + seq)
    finally:
        store.close()
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("store", "update", "both"), default="both")
    parser.add_argument("--spans", default="1,20,100,500", help="health history lengths, comma-separated")
    parser.add_argument("--batch", default="1,40", help="reports (updates) a transaction, comma-separated")
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--reports", type=int, default=60, help="part 1: reports of each job")
    parser.add_argument("--updates", type=int, default=4000, help="part 2: updates per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    spans = [int(s) for s in opts.spans.split(",")]
    batches = [int(b) for b in opts.batch.split(",")]
    if opts.part in ("store", "both"):
        print(f"1. SQLiteStore.ingest_reports, {opts.jobs} jobs x {opts.reports} reports, writer thread CPU us/report")
        for batch in batches:
            seen: dict[int, list[float]] = {s: [] for s in spans}
            for _ in range(opts.rounds):
                for s in spans:
                    seen[s].append(store_round(s, batch, opts.jobs, opts.reports))
            for s in spans:
                print(f"   batch {batch:3d}, history of {s:3d} spans: {min(seen[s]):7.1f}-{max(seen[s]):7.1f}")
    if opts.part in ("update", "both"):
        print("2. the job's UPDATE alone: wide (the jobs table) / narrow (the columns a report writes), us and WAL B")
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            source = source_jobs(tmp, opts.jobs)
            for batch in batches:
                for s in spans:
                    got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
                    for _ in range(opts.rounds):
                        for narrow in (False, True):
                            got[narrow].append(update_round(source, tmp, narrow, s, batch, opts.updates))
                    cells = [
                        f"{min(c for c, _ in got[k]):6.1f}-{max(c for c, _ in got[k]):6.1f} us, "
                        f"{sum(w for _, w in got[k]) / len(got[k]):8,.0f} B"
                        for k in (False, True)
                    ]
                    print(f"   batch {batch:3d}, history of {s:3d} spans: wide {cells[0]}; narrow {cells[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
