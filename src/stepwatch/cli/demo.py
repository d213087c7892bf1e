"""``stepwatch demo``: the embedded server and four real training runs that show what stepwatch sees.

Four small NumPy classifiers train on generated, imbalanced fraud-like data, each under the local
runner's supervision: one converges (healthy), one diverges to NaN (learning rate far too high:
diverging), one stops improving (not learning; its policy then checkpoints and stops it), one hangs
early (stalled). Each pretends to hold 8 GPUs at 4 USD an hour, so cost, waste and savings show. The
server's health windows are shortened so that all four verdicts and the policy stop show within the
first minute. The demo prints where to look, then a live summary line every few seconds; a run that
fails is said with the last line of its output, and the demo then exits 1.

When the runs have ended (the hanging one is stopped once the others are done) the server keeps
serving the dashboard until Ctrl-C, or until ``--duration`` seconds after the start.

However it ends — the end of ``--duration``, Ctrl-C, ``kill`` (SIGTERM) or a closed terminal (SIGHUP) —
the demo ends everything it started: the runners (each records its job as stopped), their training
processes (the hanging one included) and whatever those started, then the server; then it removes its
temporary directory (``/tmp/stepwatch-demo-*``: logs, checkpoints, the database) unless ``--keep``. Ended
by a signal, it exits with 128 + the signal's number, as a shell reports it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

DEMO_HEALTH = {"warmup_s": 5, "plateau_min_s": 30, "standstill_floor_s": 10, "startup_s": 30, "stall_floor_s": 10}
"""Health windows for runs of a few minutes (real jobs get minutes-long windows; see docs/health.md): the
plateau's learning rate reaches zero after ~230 steps, past a 5 s warm-up, and is confirmed 12 s later;
the hanging run stands still from 10 % of its steps, in a sleep its report core reports (waiting): a hang,
stalled after the default ``hang_floor_s`` (35 s; about 45 s into the demo), as a real job's would be (the
floors here are those of runs that do not say where they stand)."""

HANG_AT = 0.1
"""Where the hanging run hangs (a share of its steps): early enough to be stalled within the first minute."""

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
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="end everything this long after the start (default: serve until Ctrl-C)",
    )
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps per run (default 2000)")
    parser.add_argument("--step-delay", type=float, default=0.05, metavar="SECONDS", help="extra time per step")
    parser.add_argument("--db", default=None, help="SQLite file (default: a fresh one in a temporary directory)")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (logs, checkpoints, the database) at the end; it is removed otherwise",
    )
    parser.set_defaults(run=run)


class _Ended(Exception):
    """A signal that ends the demo (SIGTERM, SIGHUP, SIGINT) arrived; the demo cleans up and exits 128 + it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""What ends the demo as Ctrl-C does: ``kill``, a closed terminal, Ctrl-C."""


def run(args: argparse.Namespace) -> int:
    """Start the server and the runs, show a summary, serve until Ctrl-C or ``--duration``, end everything."""
    try:
        import numpy  # noqa: F401  (the runs train with it)

        from ..client import Client
    except ImportError as exc:
        print(
            f"stepwatch demo needs the server extra ({exc.name} is missing): pip install 'stepwatch[server]'",
            file=sys.stderr,
        )
        return 1
    from .server import port_problem

    problem = port_problem("127.0.0.1", args.port)
    if problem:
        print(f"stepwatch demo: {problem}", file=sys.stderr)
        return 1
    began = time.monotonic()
    started: list[subprocess.Popen[bytes]] = []
    workdir: Path | None = None
    previous = {sig: signal.signal(sig, _raise_ended) for sig in _ENDING_SIGNALS}
    status = 1
    try:
        workdir = Path(tempfile.mkdtemp(prefix="stepwatch-demo-"))
        status = _demo(args, began, workdir, started, Client)
    except _Ended as ended:
        status = 128 + ended.signum
    except KeyboardInterrupt:  # a SIGINT that came before the handler, or through a library that re-raises it
        status = 128 + signal.SIGINT
    finally:
        hurry = _Hurry()
        for sig in _ENDING_SIGNALS:  # cleaning up is bounded; a second signal only makes it quicker
            signal.signal(sig, hurry)
        try:
            _end_all(started, hurry)
            if workdir is not None:
                if args.keep:
                    _say(f"stepwatch demo: kept {workdir}")
                else:
                    shutil.rmtree(workdir, ignore_errors=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return status


def _demo(
    args: argparse.Namespace,
    began: float,
    workdir: Path,
    started: list[subprocess.Popen[bytes]],
    client_class: Any,
) -> int:
    """The demo proper; every process it starts goes into ``started`` first, so the caller can end it."""
    db = args.db or str(workdir / "demo.db")
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "stepwatch", "server", "--port", str(args.port), "--db", db, "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={
            **os.environ,
            "STEPWATCH_HEALTH": os.environ.get("STEPWATCH_HEALTH") or json.dumps(DEMO_HEALTH),
            "STEPWATCH_HEALTH_SWEEP_S": os.environ.get("STEPWATCH_HEALTH_SWEEP_S") or "2",
        },
    )
    started.append(server)
    client = client_class(url)
    try:
        if not _wait_for(client, server):
            print("stepwatch demo: the server did not start", file=sys.stderr)
            return 1
        env = {**os.environ, "STEPWATCH_SERVER": url, "STEPWATCH_INTERVAL": "1"}
        runs: dict[str, _Run] = {}
        for job, scenario in SCENARIOS.items():
            command = [
                sys.executable, "-m", "stepwatch", "run", "--name", job, "--server", url, "--grace", "10",
                "--kill-after", str(_KILL_AFTER_S), *DEMO_GPUS, *POLICIES.get(job, []), "--",
                sys.executable, "-m", "stepwatch.cli.demo_training", "--scenario", scenario,
                "--steps", str(args.steps), "--step-delay", str(args.step_delay), "--hang-at", str(HANG_AT),
                "--checkpoint-dir", str(workdir / job),
            ]  # fmt: skip
            log = workdir / f"{job}.log"
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    command,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            started.append(process)
            runs[job] = _Run(job, process, log)
        _introduce(url, db, workdir, args.duration, args.keep)
        failed = _summarise(client, runs, began, args.duration)
        if failed is None:
            return 1
        _serve(url, began, args.duration)
        return 1 if failed else 0
    finally:
        client.close()


def _raise_ended(signum: int, frame: Any) -> None:
    raise _Ended(signum)


class _Hurry:
    """The signal handler while the demo cleans up: a second Ctrl-C (or SIGTERM) skips the waits."""

    def __init__(self) -> None:
        self.now = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.now = True


_KILL_AFTER_S = 3.0
"""A runner ended by SIGTERM kills its job's process group this long after (the hanging run ignores nothing,
but a real job may)."""

_RUNNERS_WAIT_S = 10.0
"""How long the runners get to end their jobs and record them as stopped, before everything left is killed."""

_SERVER_WAIT_S = 10.0
"""How long the server gets to end after SIGTERM, before SIGKILL."""


def _end_all(started: list[subprocess.Popen[bytes]], hurry: _Hurry) -> None:
    """End every process the demo started and everything they started, the server last (the runners record
    their jobs' ends on it); nothing of the demo's tree is left when this returns."""
    if not started:
        return
    server, runners = started[0], started[1:]
    sessions = {p.pid for p in started}  # each was started in a session of its own
    tree = _descendants(os.getpid())
    sessions |= {sid for pid in tree if (sid := _session_of(pid)) is not None} - {os.getsid(0)}
    for process in runners:  # the runner forwards SIGTERM to its job's group, kills it after --kill-after
        _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + _RUNNERS_WAIT_S
    while not hurry.now and time.monotonic() < deadline and any(p.poll() is None for p in runners):
        time.sleep(0.1)
    for pid in _members(sessions - {server.pid}) | (_descendants(os.getpid()) - _descendants(server.pid)):
        if pid != server.pid:
            _kill(pid, signal.SIGKILL)  # a job or a child of one that outlived its runner
    for process in runners:
        _reap(process)
    if server.poll() is None:
        _signal_group(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + _SERVER_WAIT_S
        while not hurry.now and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.1)
    for pid in _members(sessions) | _descendants(os.getpid()):
        _kill(pid, signal.SIGKILL)
    _reap(server)


def _reap(process: subprocess.Popen[bytes]) -> None:
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state, ppid, pgrp, session...)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _processes() -> dict[int, list[str]]:
    """Every live (not zombie) process's stat fields; empty where there is no ``/proc`` (macOS)."""
    found = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if name.isdigit() and (fields := _stat(int(name))) is not None and fields[0] != "Z":
            found[int(name)] = fields
    return found


def _descendants(root: int) -> set[int]:
    """The processes below ``root`` (its children, theirs...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    for pid, fields in _processes().items():
        children.setdefault(int(fields[1]), []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _members(sessions: set[int]) -> set[int]:
    """The live processes in these sessions (a job's workers re-parented to init are still found here)."""
    return {pid for pid, fields in _processes().items() if int(fields[3]) in sessions}


def _say(line: str) -> None:
    """Print, unless the terminal is gone (SIGHUP): cleaning up must not fail for want of a screen."""
    try:
        print(line, flush=True)
    except OSError:
        pass


def stepwatch_command() -> str:
    """How to type ``stepwatch`` in a new terminal: ``stepwatch`` when that is this one, else its path."""
    here = Path(sys.executable).parent / "stepwatch"
    found = shutil.which("stepwatch")
    if not here.exists() or (found is not None and Path(found).resolve() == here.resolve()):
        return "stepwatch"
    try:
        return str(here.relative_to(Path.cwd()))
    except ValueError:
        return str(here)


def _introduce(url: str, db: str, workdir: Path, duration: float | None, keep: bool) -> None:
    sw = stepwatch_command()
    server = "" if url == DEFAULT_URL else f" --server {url}"
    print(f"stepwatch demo: server at {url} (database {db}); {len(SCENARIOS)} training runs started.")
    print(f"  the dashboard:     {url}/")
    print(f"  watch them:        {sw} jobs --watch{server}")
    print(f"  follow one:        {sw} watch fraud-converges{server}")
    print(f"  stop one:          {sw} stop fraud-converges{server}")
    print(f"  why is it flagged: {sw} describe fraud-diverges{server}")
    print(f"  the API:           {url}/docs")
    if sw != "stepwatch":
        print(f"  (in a new terminal, as printed, or after `source {Path(sw).parent}/activate` as plain `stepwatch`)")
    print("Within a minute: fraud-diverges is diverging, fraud-plateau not learning (its policy then saves a")
    print("checkpoint and stops it), fraud-hangs stalled; fraud-converges stays healthy. Logs: " + str(workdir))
    if not keep:
        print("(removed at the end, with the checkpoints and the database: --keep keeps them)")
    if duration is not None:
        print(f"The demo ends everything it started {duration:g} s after its start (Ctrl-C: sooner).\n", flush=True)
    else:
        print(
            "The dashboard stays up after the runs end; Ctrl-C (or kill) ends the demo and all it started.\n",
            flush=True,
        )


DEFAULT_URL = "http://127.0.0.1:8642"


class _Run:
    """One of the demo's training runs: its runner process and the file its output goes to."""

    def __init__(self, job: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.job = job
        self.process = process
        self.log = log
        self.said = False

    def last_line(self) -> str:
        """The last line of its output (a traceback's last line says why it failed)."""
        try:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no output"
        mine = [line for line in lines if not line.startswith("stepwatch: job ")]  # the runner's own lines
        return (mine or lines or ["no output"])[-1].strip()


def _wait_for(client: Any, server: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline and server.poll() is None:
        try:
            client.ping()
            return True
        except Exception:
            time.sleep(0.2)
    return False


def _remaining(began: float, duration: float | None) -> float | None:
    return None if duration is None else duration - (time.monotonic() - began)


def _summarise(client: Any, runs: dict[str, _Run], began: float, duration: float | None) -> bool | None:
    """A line per job every few seconds until the runs end (the hanging one is stopped once the others are
    done) or time is up. Says each run that fails, with why; returns whether one did (``None``: no server)."""
    failed = False
    asked_hang_stop = False
    while True:
        left = _remaining(began, duration)
        if left is not None and left <= 0:
            break
        time.sleep(min(5.0, left) if left is not None else 5.0)
        try:
            jobs = {j.name: j.raw for j in client.jobs()}
        except Exception as exc:
            print(f"stepwatch demo: the server does not answer ({exc})", file=sys.stderr)
            return None
        print(" | ".join(_line(name, jobs[name]) for name in SCENARIOS if name in jobs), flush=True)
        for run in runs.values():
            state = (jobs.get(run.job) or {}).get("state")
            code = run.process.poll()
            broke = state == "failed" or (code not in (None, 0) and state != "stopped")
            if broke and not run.said:
                run.said = failed = True
                print(f"stepwatch demo: {run.job} failed: {run.last_line()} (log: {run.log})", file=sys.stderr)
        others_done = all(r.process.poll() is not None for n, r in runs.items() if n != "fraud-hangs")
        if others_done and not asked_hang_stop and runs["fraud-hangs"].process.poll() is None:
            asked_hang_stop = True  # it ignores the command: its runner ends it after the grace period
            try:
                client.stop("fraud-hangs", reason="the demo's other runs have ended")
            except Exception:
                runs["fraud-hangs"].process.send_signal(signal.SIGINT)
        if all(r.process.poll() is not None for r in runs.values()):
            break
    return failed


def _line(name: str, job: dict[str, Any]) -> str:
    percent = job["progress"]["percent"]
    loss = (job.get("metric_means") or {}).get("loss", job["metrics"].get("loss"))  # the window's mean, as tables
    loss_text = f"{loss:.4g}" if isinstance(loss, float) else str(loss)
    health = (job.get("health") or {}).get("state", "unknown")
    return f"{name} {job['state']} {health} {percent or 0:.1f}% loss {loss_text}"


def _serve(url: str, began: float, duration: float | None) -> None:
    """The runs have ended: keep the server (and its dashboard) up until Ctrl-C or the end of ``--duration``."""
    left = _remaining(began, duration)
    if left is not None and left <= 0:
        return
    if left is None:
        print(f"stepwatch demo: the runs have ended; the dashboard stays at {url}/ until Ctrl-C", flush=True)
        while True:
            time.sleep(3600)
    print(f"stepwatch demo: the runs have ended; the dashboard stays at {url}/ for {left:.0f} s more", flush=True)
    time.sleep(left)
