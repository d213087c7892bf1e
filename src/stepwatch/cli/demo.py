"""``stepwatch demo``: the embedded server and four real training runs that show what stepwatch sees.

Four small NumPy classifiers train on generated, imbalanced fraud-like data, each under the local
runner's supervision: one converges (healthy), one diverges to NaN (learning rate far too high:
diverging), one stops improving (not learning; its policy then checkpoints and stops it), one hangs
mid-run (stalled). Each pretends to hold 8 GPUs at 4 USD an hour, so cost, waste and savings show. The
server's health windows are shortened to fit runs of a few minutes. The demo prints where to look and a
short live summary until the runs end, ``--duration`` runs out, or Ctrl-C; it then ends everything it
started.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["SCENARIOS", "register", "run"]

SCENARIOS: dict[str, str] = {
    "fraud-converges": "converge",
    "fraud-diverges": "diverge",
    "fraud-plateau": "plateau",
    "fraud-hangs": "hang",
}

POLICIES: dict[str, list[str]] = {
    "fraud-plateau": ["--on", "not_learning=checkpoint_stop"],
}
"""The Friday-night job: its owner opted in, so when it stops learning it saves a checkpoint and stops."""

DEMO_HEALTH = {"warmup_s": 20, "plateau_min_s": 30, "standstill_floor_s": 20, "startup_s": 30, "stall_floor_s": 10}
"""Health windows for runs of a few minutes (real jobs get minutes-long windows; see docs/health.md)."""

DEMO_GPUS = ("--gpus", "8", "--gpu-hour-cost", "4.0")
"""What the demo's runs pretend to hold, so that cost, waste and savings show (8 GPUs at 4 USD an hour)."""


def register(commands: Any) -> None:
    """Add the ``demo`` command."""
    parser = commands.add_parser(
        "demo",
        help="start the server and four real training runs (converging, diverging, plateau, hanging)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=8642, help="server port (default 8642)")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS", help="stop everything after this")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps per run")
    parser.add_argument("--step-delay", type=float, default=0.05, metavar="SECONDS", help="extra time per step")
    parser.add_argument("--db", default=None, help="SQLite file (default: a fresh one in a temporary directory)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Start the server and the runs, show a summary, end everything."""
    try:
        from ..client import Client
    except ImportError as exc:
        print(
            f"stepwatch demo needs the server and client extras ({exc.name} is missing): "
            "pip install 'stepwatch[server]'",
            file=sys.stderr,
        )
        return 1
    from .server import port_problem

    problem = port_problem("127.0.0.1", args.port)
    if problem:
        print(f"stepwatch demo: {problem}", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="stepwatch-demo-"))
    db = args.db or str(workdir / "demo.db")
    url = f"http://127.0.0.1:{args.port}"
    started: list[subprocess.Popen[bytes]] = []
    server = subprocess.Popen(
        [sys.executable, "-m", "stepwatch", "server", "--port", str(args.port), "--db", db, "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        env={
            **os.environ,
            "STEPWATCH_HEALTH": os.environ.get("STEPWATCH_HEALTH") or json.dumps(DEMO_HEALTH),
            "STEPWATCH_HEALTH_SWEEP_S": os.environ.get("STEPWATCH_HEALTH_SWEEP_S") or "2",
        },
    )
    started.append(server)
    client = Client(url)
    try:
        if not _wait_for(client, server):
            print("stepwatch demo: the server did not start", file=sys.stderr)
            return 1
        env = {**os.environ, "STEPWATCH_SERVER": url, "STEPWATCH_INTERVAL": "1"}
        for job, scenario in SCENARIOS.items():
            command = [
                sys.executable, "-m", "stepwatch", "run", "--name", job, "--server", url, "--grace", "10",
                *DEMO_GPUS, *POLICIES.get(job, []), "--",
                sys.executable, "-m", "stepwatch.cli.demo_job", "--scenario", scenario,
                "--steps", str(args.steps), "--step-delay", str(args.step_delay),
                "--checkpoint-dir", str(workdir / job),
            ]  # fmt: skip
            started.append(
                subprocess.Popen(
                    command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
                )
            )
        print(f"stepwatch demo: server at {url} (database {db}); {len(SCENARIOS)} training runs started.")
        print(f"  watch them:        stepwatch jobs --watch --server {url}")
        print(f"  follow one:        stepwatch watch fraud-converges --server {url}")
        print(f"  the dashboard:     {url}/")
        print(f"  stop one:          stepwatch stop fraud-converges --server {url}")
        print(f"  why is it flagged: stepwatch describe fraud-diverges --server {url}")
        print("  fraud-plateau has a policy: when it stops learning, it saves a checkpoint and stops.")
        print(f"  the API:           {url}/docs")
        print("Ctrl-C ends the demo and everything it started.\n", flush=True)
        return _summarise(client, started[1:], args.duration)
    except KeyboardInterrupt:
        return 0
    finally:
        for process in reversed(started):
            _end(process)
        client.close()


def _wait_for(client: Any, server: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline and server.poll() is None:
        try:
            client.ping()
            return True
        except Exception:
            time.sleep(0.2)
    return False


def _summarise(client: Any, runs: list[subprocess.Popen[bytes]], duration: float | None) -> int:
    """A line per job every few seconds, until the runs end (the hanging one never does) or time is up."""
    began = time.monotonic()
    while duration is None or time.monotonic() - began < duration:
        time.sleep(min(5.0, duration or 5.0))
        try:
            jobs = {j.name: j.raw for j in client.jobs()}
        except Exception as exc:
            print(f"stepwatch demo: the server does not answer ({exc})", file=sys.stderr)
            return 1
        parts = []
        for name in SCENARIOS:
            job = jobs.get(name)
            if job is None:
                continue
            percent = job["progress"]["percent"]
            loss = job["metrics"].get("loss")
            loss_text = f"{loss:.4g}" if isinstance(loss, float) else str(loss)
            health = (job.get("health") or {}).get("state", "unknown")
            parts.append(f"{name} {job['state']} {health} {percent or 0:.0f}% loss {loss_text}")
        print(" | ".join(parts), flush=True)
        live = [r for r in runs if r.poll() is None]
        if len(live) <= 1 and all(j.get("state") != "running" for n, j in jobs.items() if n != "fraud-hangs"):
            break
    return 0


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
