"""The report core end to end: three real training runs report to a loopback sink, shown live.

    python examples/demo.py

A healthy run, one that does not learn (learning rate 0) and one that diverges (learning rate 5)
train tiny models on the CPU; each reports through ``stepwatch`` to a report sink on 127.0.0.1,
and this script prints, every second, what has arrived: progress, step of total, ETA at the
recent rate, the last loss and the count of non-finite values. (The stepwatch server, with its
dashboard and health analysis, replaces the sink in the next milestone.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from stepwatch.protocol import Report
from stepwatch.testing import ReportSink

JOBS = {"healthy": ["--lr", "0.01"], "not-learning": ["--lr", "0"], "diverging": ["--lr", "5"]}
STEPS = 3000


def row(job: str, reports: list[Report]) -> str:
    if not reports:
        return f"{job:<14} waiting for the first report"
    p = reports[-1].progress
    percent = 100 * (p.step or 0) / p.total_steps if p.total_steps else 0.0
    bar = "#" * int(percent / 5)
    eta = "-"
    if p.steps_per_second and p.total_steps and p.step is not None:
        eta = f"{max(p.total_steps - p.step, 0) / p.steps_per_second:5.0f}s"
    loss_windows = [m for r in reports for m in r.metrics if m.name == "loss"]
    loss = loss_windows[-1].last if loss_windows else float("nan")
    nonfinite = sum(m.nonfinite for m in loss_windows)
    return (
        f"{job:<14} [{bar:<20}] {percent:5.1f}%  step {p.step:>5}/{p.total_steps}  ETA {eta:>6}  "
        f"loss {loss:10.4g}  non-finite {nonfinite:>4}  {reports[-1].state}"
    )


def main() -> int:
    script = Path(__file__).with_name("train_tiny.py")
    with ReportSink() as sink:
        env = {**os.environ, "STEPWATCH_URL": sink.url, "STEPWATCH_INTERVAL": "0.5"}
        procs = {
            job: subprocess.Popen(
                [sys.executable, str(script), "--steps", str(STEPS), *extra],
                env={**env, "STEPWATCH_JOB": job},
                stdout=subprocess.DEVNULL,
            )
            for job, extra in JOBS.items()
        }
        print(f"report sink listening on {sink.url}; {len(procs)} training runs started\n")
        while True:
            time.sleep(1.0)
            for job in JOBS:
                print(row(job, list(sink.by_job.get(f"default/{job}", []))))
            print()
            if all(p.poll() is not None for p in procs.values()):
                break
        print(f"done: {len(sink.reports)} reports received, {sink.duplicates} duplicates dropped")
        return 0 if all(p.returncode == 0 for p in procs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
