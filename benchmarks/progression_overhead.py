"""What serving OpenShift AI's progression status costs a training loop: steps/s with the endpoint off and on.

A training loop of pure Python (the worst case for a server thread in the same process: the loop
always wants the GIL) runs ``run.step(loss=...)`` after each step's work, with no stepwatch server, in
three configurations:

* **off**: ``STEPWATCH_METRICS_PORT=off``: no sender thread, no server (the run is a no-op);
* **on**: rank 0 serves the status on a loopback port, nobody polls (the sender thread collects every
  0.5 s, four times the default rate, and publishes the status);
* **on, polled**: the same, polled every 100 ms by this process, as Red Hat's controller polls (every
  30 s by default, 5 s at the most): a GET, 2 s timeout, the body read with the port of its Go decoding.

Method: each configuration runs in a fresh interpreter; the runs alternate (off, on, polled, then
polled, on, off, ...) so that whatever drifts on a shared machine hits all three alike; the first round
is a discarded warm-up. A run times ``--seconds`` of steps after a short warm-up. The figure is the
median steps/s over the rounds, the spread the interquartile range, the cost the relative difference to
**off** in the same rounds. The poll latency is what the poller saw (its own share of a 2-core machine
included). Every figure is measured here, in this run::

    .venv/bin/python benchmarks/progression_overhead.py                     # 7 rounds, 0.2 and 2 ms steps
    .venv/bin/python benchmarks/progression_overhead.py --quick              # 2 rounds of 0.5 s (smoke run)
    .venv/bin/python benchmarks/progression_overhead.py --json figures.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

CONFIGS = ("off", "on", "on, polled")
POLL_EVERY = 0.1

CHILD = """
import json, os, sys, time
import stepwatch

work_us, seconds = float(sys.argv[1]), float(sys.argv[2])


def calibrate():
    n = 1000
    while True:
        t = time.perf_counter()
        x = 0
        for i in range(n):
            x += i * i % 7
        took = time.perf_counter() - t
        if took > 0.05:
            return max(1, int(n * work_us * 1e-6 / took))
        n *= 2


n = calibrate()
run = stepwatch.init(job="bench", total_steps=10**9, interval=0.5)
print("ADDRESS", json.dumps(run.metrics_address), flush=True)


def loop(duration):
    steps = 0
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        for _ in range(20):
            x = 0
            for i in range(n):
                x += i * i % 7
            run.step(loss=1.0 / (steps + 1))
            steps += 1
    return steps


loop(0.5)  # warm-up
print("START", flush=True)
t = time.perf_counter()
steps = loop(seconds)
took = time.perf_counter() - t
print("RESULT", json.dumps({"steps_per_s": steps / took}), flush=True)
run.finish()
"""


def run_once(config: str, work_us: float, seconds: float) -> dict[str, Any]:
    """One run of the loop in a fresh interpreter; steps/s, and the poll times when polled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_"))}
    env["STEPWATCH_METRICS_PORT"] = "off" if config == "off" else "127.0.0.1:0"
    env["STEPWATCH_TERMINATION_LOG"] = "off"
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(work_us), str(seconds)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    address: tuple[str, int] | None = None
    polls: list[float] = []
    errors = 0
    stop = threading.Event()
    poller: threading.Thread | None = None
    result: dict[str, Any] = {}
    for line in process.stdout:
        kind, _, rest = line.strip().partition(" ")
        if kind == "ADDRESS":
            found = json.loads(rest)
            address = (found[0], found[1]) if found else None
        elif kind == "START" and config == "on, polled":
            assert address is not None

            def poll(where: tuple[str, int] = address) -> None:
                nonlocal errors
                from stepwatch.testing import poll_progression

                while not stop.wait(POLL_EVERY):
                    began = time.perf_counter()
                    try:
                        poll_progression(where)
                    except Exception:
                        if not stop.is_set():  # not the loop's end racing this poll
                            errors += 1
                        continue
                    polls.append(time.perf_counter() - began)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
        elif kind == "RESULT":
            stop.set()
            result = json.loads(rest)
    stop.set()
    if poller is not None:
        poller.join(5)
    process.wait(60)
    result.update(polls=polls, poll_errors=errors)
    return result


def measure(work_us: float, rounds: int, seconds: float) -> dict[str, Any]:
    """Rounds of the three configurations, alternating their order; the first round is a warm-up."""
    figures: dict[str, list[float]] = {c: [] for c in CONFIGS}
    polls: list[float] = []
    errors = 0
    for r in range(rounds + 1):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        for config in order:
            result = run_once(config, work_us, seconds)
            if r == 0:
                continue
            figures[config].append(result["steps_per_s"])
            polls += result["polls"]
            errors += result["poll_errors"]
    out: dict[str, Any] = {"work_us": work_us, "configs": {}}
    base = figures["off"]
    for config in CONFIGS:
        values = figures[config]
        costs = [1 - v / b for v, b in zip(values, base)]
        q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
        out["configs"][config] = {
            "steps_per_s": statistics.median(values),
            "iqr": q[2] - q[0],
            "cost": statistics.median(costs),
            "runs": values,
        }
    ordered = sorted(polls)
    out["polls"] = {
        "count": len(polls),
        "errors": errors,
        "p50_ms": 1000 * statistics.median(ordered) if ordered else None,
        "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))] if ordered else None,
        "max_ms": 1000 * ordered[-1] if ordered else None,
    }
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'step work':<11} {'endpoint':<12} {'steps/s':>9} {'spread':>8} {'vs off':>8}   "
        f"{'polls':>6} {'poll p50':>9} {'poll p99':>9} {'poll max':>9}"
    ]
    for result in results:
        for i, config in enumerate(CONFIGS):
            c = result["configs"][config]
            work = f"{result['work_us'] / 1000:g} ms" if i == 0 else ""
            cost = "" if config == "off" else f"{-100 * c['cost']:+.2f} %"
            poll = ""
            if config == "on, polled":
                p = result["polls"]
                poll = f"{p['count']:>6} {p['p50_ms']:>6.2f} ms {p['p99_ms']:>6.2f} ms {p['max_ms']:>6.1f} ms"
            lines.append(
                f"{work:<11} {config:<12} {c['steps_per_s']:>9,.0f} {c['iqr']:>8,.0f} {cost:>8}   {poll}".rstrip()
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds of each run")
    parser.add_argument("--work-us", default="200,2000", help="microseconds of pure Python per step, comma-separated")
    parser.add_argument("--quick", action="store_true", help="2 rounds (one measured) of 0.5 s: a smoke run")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    rounds, seconds = (2, 0.5) if args.quick else (args.rounds, args.seconds)
    started = time.time()
    results = [measure(float(w), rounds, seconds) for w in args.work_us.split(",")]
    print(
        f"OpenShift AI progression endpoint: training-loop steps/s, {rounds} rounds of {seconds:g} s per "
        f"configuration (median, interquartile spread), polled every {POLL_EVERY * 1000:.0f} ms"
    )
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(table(results))
    failed = sum(r["polls"]["errors"] for r in results)
    print(f"poll errors: {failed}; {time.time() - started:.0f} s in all")
    if args.json:
        args.json.write_text(json.dumps({"results": results}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
