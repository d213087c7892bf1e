"""What a job's verdict history costs on SQLite: each report of a job whose history holds N spans, and each
change of its health, tree against tree (``--src``, alternated round by round in one run).

Until schema 12 the spans (up to ``MAX_SPANS`` = 500, ~85 KB) were a JSON list in the job's row. SQLite writes a
row as one record: every report's ``UPDATE`` of its job read the whole record (its overflow pages too) and wrote
it again to the write-ahead log, so a job whose health changed hundreds of times paid for its history at every
report. Since 12 the spans are rows of ``health_spans``, written only when the health changes.

Part ``report``: ``SQLiteStore.ingest_reports`` in a child process of each tree, the reports of
``server_ingest.py`` (rank 0, 5 metric windows), ``--jobs`` jobs in turn, ``--batch`` reports a transaction, for
jobs whose history was grown to N spans by ``set_health`` (health flapping between ``healthy`` and
``straggling`` every 60 s, with a straggler's words); the writing thread's CPU per report.

Part ``change``: ``set_health`` itself, one change of state of such a job (a transaction each): the calling
thread's CPU per change, the history at N spans (at 500, each change also drops the oldest span without waste).

    .venv/bin/python benchmarks/job_row_cost.py --src before=/tmp/base/src --src this=src
    .venv/bin/python benchmarks/job_row_cost.py --src this=src --spans 1,500 --batch 1 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))


def verdict(k: int) -> tuple[str, dict[str, Any]]:
    """The ``k``-th verdict of a job whose health flaps: its state and evidence."""
    if k % 2:
        message = "rank 3 is 1.6x slower than the median rank (step time 0.41 s against 0.26 s) for 2 min"
        return "straggling", {"metric": "step_time", "message": message, "rank": 3}
    message = "loss falls: -0.012 per 10 min (standard error 0.003), level 0.412 at step 12,000"
    return "healthy", {"metric": "loss", "message": message}


def child(args: dict[str, Any]) -> dict[str, float]:
    """One measurement in this process (the tree on ``PYTHONPATH``): µs of thread CPU per report or per change."""
    from server_ingest import report_dict

    from stepwatch.protocol import Report
    from stepwatch.server.store import PendingReport, SQLiteStore

    spans, batch, jobs, reports = args["spans"], args["batch"], args["jobs"], args["reports"]
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "rows.db")
        try:
            registered = [store.register("default", f"row-{i}", token_hash="h", now=1.0) for i in range(jobs)]
            registered = [store.set_state(job, "running", 1.0) for job in registered]
            for k in range(spans):  # the history set_health leaves: one change of state every 60 s
                t = 1_000.0 + 60.0 * k
                state, evidence = verdict(k)
                for job in registered:
                    store.set_health(job.id, state, t, evidence, t)
            latest = {job.id: store.job_by_id(job.id) for job in registered}
            assert all(len(job.health_history) == min(spans, 500) for job in latest.values() if job is not None)
            if args["part"] == "change":
                cpu0 = time.thread_time()
                changes = 0
                for k in range(spans, spans + args["changes"]):
                    t = 1_000.0 + 60.0 * k
                    state, evidence = verdict(k)
                    for job in registered:
                        store.set_health(job.id, state, t, evidence, t)
                        changes += 1
                return {"us": 1e6 * (time.thread_time() - cpu0) / changes}
            rng = random.Random(0)
            bodies = [
                [Report.from_dict(report_dict(f"run-{i}", seq, rng, 1000 + i)) for seq in range(reports)]
                for i in range(jobs)
            ]
            order = [(i, seq) for seq in range(reports) for i in range(jobs)]

            def write(items: list[tuple[int, int]]) -> None:
                pending = [PendingReport(latest[registered[i].id], bodies[i][seq], 100_000.0 + seq) for i, seq in items]
                for result in store.ingest_reports(pending):
                    assert not isinstance(result, Exception), result
                    latest[result.job.id] = result.job

            warm = jobs * 5
            for k in range(0, warm, batch):
                write(order[k : min(k + batch, warm)])
            cpu0 = time.thread_time()
            for k in range(warm, len(order), batch):
                write(order[k : k + batch])
            return {"us": 1e6 * (time.thread_time() - cpu0) / (len(order) - warm)}
        finally:
            store.close()


def run_child(src: Path, args: dict[str, Any]) -> float:
    """:func:`child` in a process of its own, with ``src`` first on its path."""
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{HERE.parent}"}
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", json.dumps(args)], env=env, text=True, capture_output=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"job_row_cost: the child of {src} failed:\n{out.stderr.strip()}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["us"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", action="append", default=[], help="NAME=PATH of a tree's src (repeat; default src)")
    parser.add_argument("--part", choices=("report", "change", "both"), default="both")
    parser.add_argument("--spans", default="1,100,500", help="health history lengths, comma-separated")
    parser.add_argument("--batch", default="1,40", help="part report: reports a transaction, comma-separated")
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--reports", type=int, default=60, help="part report: reports of each job")
    parser.add_argument("--changes", type=int, default=10, help="part change: changes of each job")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(json.loads(opts.child))))
        return 0
    trees = [(s.split("=", 1)[0], Path(s.split("=", 1)[1])) for s in opts.src] or [("src", HERE.parent.parent / "src")]
    spans = [int(s) for s in opts.spans.split(",")]
    cases: list[tuple[str, int, int]] = []
    if opts.part in ("report", "both"):
        cases += [("report", int(b), s) for b in opts.batch.split(",") for s in spans]
    if opts.part in ("change", "both"):
        cases += [("change", 1, s) for s in spans]
    seen: dict[tuple[str, int, int, str], list[float]] = {}
    for r in range(opts.rounds):
        for part, batch, s in cases:
            for name, src in trees if r % 2 == 0 else trees[::-1]:
                args = {"part": part, "spans": s, "batch": batch, "jobs": opts.jobs, "reports": opts.reports}
                args["changes"] = opts.changes
                seen.setdefault((part, batch, s, name), []).append(run_child(src, args))
        print(f"round {r + 1} of {opts.rounds} done", file=sys.stderr)
    names = [name for name, _ in trees]
    print(f"SQLite store, thread CPU µs (min-max of {opts.rounds} rounds, trees alternated)")
    print("| what | history | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for part, batch, s in cases:
        what = f"a report, {batch} a transaction" if part == "report" else "a change of health"
        cells = [f"{min(v):.0f}-{max(v):.0f}" for v in (seen[(part, batch, s, n)] for n in names)]
        print(f"| {what} | {s} spans | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
