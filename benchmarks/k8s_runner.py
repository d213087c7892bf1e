"""The TrainJob runner with 1,000 TrainJobs, against a baseline measured in the same run.

There is no Kubernetes API server on these machines: the runner talks, through the official
``kubernetes`` client over HTTP, to the in-process FAKE API server of the tests (``tests/k8s/fakeapi.py``),
which serves list and watch (with bookmarks) and server-side apply as the API documents them. The
stepwatch side is real: the runner on its own event loop, the store a SQLite file::

    .venv/bin/python benchmarks/k8s_runner.py               # 1,000 TrainJobs, ~40 s
    .venv/bin/python benchmarks/k8s_runner.py --jobs 50 --seconds 2 --baseline-seconds 1   # a smoke run

Figures:

- CPU to reconcile N jobs: ``reconcile()`` for every TrainJob as the runner keeps them (parsed from the
  watch, its stepwatch job read from the store, its progress rendered as trainerStatus and annotation and
  compared with the TrainJob's: the most expensive case; jobs whose newest status is not on the object yet
  are due a write),
  CPU seconds of the calling thread; the baseline is a naive controller's pass, which GETs each TrainJob
  from the API server before it decides (client-side CPU only: the fake's own CPU is not counted);
- a runner pass: the runner's own decision step for every job (decide, queue the writes);
- writes: every job reports (a new status in the store) every ``--report-every`` seconds for
  ``--seconds``; the API writes the runner makes are counted in the fake's request log: the most in
  any 1 s, the mean per second, and the most status writes to one TrainJob in any 5 s. The baseline is
  the same runner unthrottled (no per-job interval, no overall cap), for ``--baseline-seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import logging
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent / "src"))
sys.path.insert(0, str(HERE.parent.parent / "tests" / "k8s"))  # the FAKE API server

from fakeapi import FakeApi  # noqa: E402

from stepwatch.protocol import TrainerStatus  # noqa: E402
from stepwatch.server.live.broadcaster import Broadcaster  # noqa: E402
from stepwatch.server.runners.kubernetes.api import KubeApi, load_api  # noqa: E402
from stepwatch.server.runners.kubernetes.objects import parse_trainjob  # noqa: E402
from stepwatch.server.runners.kubernetes.reconcile import Config, WriteStatus, reconcile  # noqa: E402
from stepwatch.server.runners.kubernetes.runner import RunnerOptions, TrainJobRunner  # noqa: E402
from stepwatch.server.services import Services  # noqa: E402
from stepwatch.server.store import JobFilter, SQLiteStore, Store  # noqa: E402
from stepwatch.server.store.offload import blocking  # noqa: E402

NAMESPACES = ("team-a", "team-b", "team-c", "team-d")


def trainjob(i: int) -> dict[str, Any]:
    """TrainJob ``i``: 1 to 4 nodes of 8 GPUs, in one of four namespaces."""
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": f"job-{i:04d}", "namespace": NAMESPACES[i % len(NAMESPACES)]},
        "spec": {
            "runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"},
            "trainer": {"numNodes": 1 + i % 4, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}},
        },
    }


def status(step: int) -> TrainerStatus:
    body = {
        "trainerStatus": {
            "progressPercentage": min(step // 10, 100),
            "metrics": [
                {"name": "current_step", "value": str(step)},
                {"name": "total_steps", "value": "1000"},
                {"name": "loss", "value": f"{2.0 / (1 + step):.6f}"},
                {"name": "learning_rate", "value": "0.0001"},
            ],
        }
    }
    return TrainerStatus.from_body(body)


@dataclass
class WriteFigures:
    writes: int
    seconds: float
    busiest_second: int
    """The most API writes in any 1 s."""
    busiest_job_5s: int
    """The most status writes to one TrainJob in any 5 s."""

    @property
    def per_second(self) -> float:
        return self.writes / self.seconds


def write_figures(fake: FakeApi, since: float, until: float) -> WriteFigures:
    writes = [(t, path) for t, method, path in fake.timed_calls() if method == "PATCH" and since <= t < until]
    times = [t for t, _ in writes]
    busiest = max((bisect.bisect_left(times, t + 1.0) - i for i, t in enumerate(times)), default=0)
    per_job: dict[str, list[float]] = defaultdict(list)
    for t, path in writes:
        if path.endswith("/status"):
            per_job[path].append(t)
    busiest_job = max(
        (bisect.bisect_left(ts, t + 5.0) - i for ts in per_job.values() for i, t in enumerate(ts)), default=0
    )
    return WriteFigures(len(writes), until - since, busiest, busiest_job)


async def _report_forever(store: Store, every_s: float, stop: asyncio.Event) -> None:
    """Every job reports a new status every ``every_s`` seconds (straight into the store)."""
    step = 0
    while not stop.is_set():
        started = time.monotonic()
        step += 1
        jobs = await blocking(store.jobs, JobFilter(limit=100_000))

        def write_all(jobs: list[Any] = jobs, step: int = step) -> None:
            now = time.time()
            for job in jobs:
                store.ingest_status(job, status(step * 10), now)

        await blocking(write_all)
        left = every_s - (time.monotonic() - started)
        if left > 0:
            try:
                await asyncio.wait_for(stop.wait(), left)
            except asyncio.TimeoutError:
                pass


async def _run_phase(
    api: KubeApi, store: Store, fake: FakeApi, n: int, options: RunnerOptions, seconds: float, every_s: float
) -> tuple[WriteFigures, TrainJobRunner, dict[str, float]]:
    runner = TrainJobRunner(api, Services(store=store, live=Broadcaster()), options)
    started = time.monotonic()
    await runner.start()
    while not runner.ready.is_set() or len(runner.jobs) < n:
        await asyncio.sleep(0.05)
    synced = time.monotonic() - started
    stop = asyncio.Event()
    reporter = asyncio.create_task(_report_forever(store, every_s, stop))
    since = time.monotonic()
    await asyncio.sleep(seconds)
    until = time.monotonic()
    figures = write_figures(fake, since, until)
    stop.set()
    await reporter
    timings = {"sync_s": synced}
    keys = sorted(runner.seen)
    for key in keys:  # every job due a write again: the most expensive pass
        runner.seen[key].last_write_at = None
        runner.seen[key].written = None
    cpu = time.thread_time()
    for key in keys:
        await runner._decide(key)
    timings["pass_cpu_s"] = time.thread_time() - cpu
    await runner.aclose()
    return figures, runner, timings


def reconcile_cpu(runner: TrainJobRunner) -> tuple[float, int]:
    """CPU seconds of ``reconcile()`` for every TrainJob the runner holds (no throttle in the way), and how
    many status writes it asked for."""
    observed = [
        replace(runner._observed(key), last_write_at=None, written=None)
        for key in sorted(runner.seen)
        if runner.seen[key].trainjob is not None
    ]
    cpu = time.thread_time()
    writes = sum(isinstance(a, WriteStatus) for o in observed for a in reconcile(o))
    return time.thread_time() - cpu, writes


def naive_cpu(api: KubeApi, runner: TrainJobRunner) -> float:
    """A naive pass: GET each TrainJob, parse, decide (client-side CPU of this thread)."""
    cpu = time.thread_time()
    for key in sorted(runner.seen):
        obj = api.get_trainjob(*key)
        observed = replace(runner._observed(key), trainjob=parse_trainjob(obj) if obj else None, last_write_at=None)
        reconcile(observed)
    return time.thread_time() - cpu


def measure(
    n: int = 1000, seconds: float = 15.0, baseline_seconds: float = 6.0, every_s: float = 2.0
) -> dict[str, Any]:
    """Both phases on fresh fakes and stores; the figures as a dict (the table's cells)."""
    results: dict[str, Any] = {"jobs": n}
    with tempfile.TemporaryDirectory() as tmp:
        for phase, options, duration in (
            ("throttled", RunnerOptions(config=Config(status_interval_s=5.0), writes_per_s=20.0), seconds),
            (
                "baseline",
                RunnerOptions(config=Config(status_interval_s=1e-6), writes_per_s=1e9, writers=16),
                baseline_seconds,
            ),
        ):
            fake = FakeApi().start()
            for i in range(n):
                fake.create_trainjob(trainjob(i))
            api = load_api(str(fake.kubeconfig(Path(tmp) / f"kubeconfig-{phase}")))
            store = SQLiteStore(Path(tmp) / f"{phase}.db")
            try:
                figures, runner, timings = asyncio.run(
                    _run_phase(api, store, fake, n, replace(options, poll_s=1.0), duration, every_s)
                )
                results[phase] = {"writes": figures, **timings, "stats": dict(runner.stats)}
                if phase == "throttled":
                    results["reconcile_cpu_s"], results["reconcile_writes"] = reconcile_cpu(runner)
                    results["naive_cpu_s"] = naive_cpu(api, runner)
            finally:
                api.api_client.close()
                store.close()
                fake.stop()
    return results


def table(r: dict[str, Any]) -> str:
    t, b = r["throttled"], r["baseline"]
    tw, bw = t["writes"], b["writes"]
    n = r["jobs"]
    rows = [
        ("measure", "stepwatch runner", "baseline", "target"),
        (
            f"CPU to reconcile {n:,} jobs (s)",
            f"{r['reconcile_cpu_s']:.3f}",
            f"{r['naive_cpu_s']:.3f} (GET each, then decide)",
            "< 1",
        ),
        (f"CPU of a runner pass over {n:,} jobs (s)", f"{t['pass_cpu_s']:.3f}", "", ""),
        ("API writes, most in any 1 s", str(tw.busiest_second), f"{bw.busiest_second} (unthrottled)", "<= 20"),
        ("API writes per second, mean", f"{tw.per_second:.1f}", f"{bw.per_second:.1f} (unthrottled)", "<= 20"),
        ("status writes to one job, most in any 5 s", str(tw.busiest_job_5s), str(bw.busiest_job_5s), "<= 1"),
        (f"first list + register {n:,} jobs (s, wall)", f"{t['sync_s']:.2f}", f"{b['sync_s']:.2f}", ""),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=15.0, help="how long the throttled runner is measured")
    parser.add_argument("--baseline-seconds", type=float, default=6.0, help="how long the unthrottled one is")
    parser.add_argument("--report-every", type=float, default=2.0, help="every job reports this often (s)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args(argv)
    logging.getLogger("stepwatch").setLevel(logging.ERROR)  # the runs' own warnings are not the figures
    results = measure(args.jobs, args.seconds, args.baseline_seconds, args.report_every)
    print(
        f"{args.jobs:,} TrainJobs on the FAKE API server (tests/k8s/fakeapi.py), every job reporting every "
        f"{args.report_every:g} s; throttled run {args.seconds:g} s, unthrottled baseline {args.baseline_seconds:g} s"
    )
    print(table(results))
    if args.json:
        print(json.dumps(results, default=lambda o: o.__dict__, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
