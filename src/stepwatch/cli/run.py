"""``stepwatch run -- COMMAND``: make any command a tracked job, supervised by the local runner.

The runner registers the job (starting a background server when none answers locally, and saying
so), gives the command the environment the report core reads (and, on its ``PYTHONPATH``, the
auto-instrumentation hook that gives framework trainers stepwatch's callback), starts it in its own process group
(``torchrun`` and its workers included), passes its output through unchanged, forwards Ctrl-C and
SIGTERM (a job still there ``--kill-after`` seconds after a SIGTERM is killed: the runner never waits
without limit), enforces ``stepwatch stop`` (the job gets a grace period to checkpoint and stop by itself,
then its group is terminated, then killed), and records how it ended: finished, failed or stopped. Its
own exit code is the command's.

A failed job's reason says why it failed, not only its exit code: the exception the job's report core
sent with its ``failed`` state (under ``torchrun``, the first rank's, named: "RuntimeError: CUDA out of
memory ... (rank 0)"), else the exception line (or the last line) the command wrote on stderr — which the
runner passes through unchanged, on a pseudo-terminal when its own stderr is one, keeping only its last
lines (see :mod:`._crash`).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..protocol import LIMITS, sanitize_name
from . import _background as background
from ._crash import Witness
from ._format import add_token_flag
from .policy import add_policy_flags, policy_from_args

__all__ = ["job_name_for", "register", "run"]

_POLL_S = 1.0


def register(commands: Any) -> None:
    """Add the ``run`` command."""
    parser = commands.add_parser(
        "run",
        help="run a command as a tracked job: stepwatch run -- python train.py",
        description=(
            "Run COMMAND as a stepwatch job. Its progress appears in `stepwatch jobs` when it reports (any script "
            "using stepwatch.init/step, or a framework integration); the runner records its start and end either way."
        ),
    )
    parser.add_argument("--name", help="job name (default: the script's name, as a Kubernetes name)")
    parser.add_argument("-n", "--namespace", default=os.environ.get("STEPWATCH_NAMESPACE", "default"))
    parser.add_argument("--gpus", type=float, default=0.0, help="GPUs the job holds (for cost)")
    parser.add_argument(
        "--gpu-hour-cost",
        type=float,
        default=0.0,
        metavar="USD",
        help="price of one GPU hour (default: the server's price for the namespace and GPU type)",
    )
    parser.add_argument("--gpu-type", metavar="TYPE", help="the kind of GPU (a100, h100...), for its default price")
    parser.add_argument("--server", help="stepwatch server URL (default: STEPWATCH_SERVER, else the local one)")
    add_token_flag(parser)
    parser.add_argument(
        "--grace",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="time to checkpoint and stop after `stepwatch stop`",
    )
    parser.add_argument(
        "--kill-after",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="after a SIGTERM (to the runner, or at the end of --grace), kill the job's process group if it is "
        "still there this long after",
    )
    add_policy_flags(parser, dry_run_flag="--policy-dry-run")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    parser.set_defaults(run=run)


def job_name_for(command: list[str]) -> str:
    """A job name from a command: the first Python script in it, else the program (``train.py`` → ``train``)."""
    for part in command:
        if part.endswith(".py"):
            return sanitize_name(Path(part).stem)
    for i, part in enumerate(command):
        if part == "-m" and i + 1 < len(command):
            return sanitize_name(command[i + 1].rsplit(".", 1)[-1])
    return sanitize_name(Path(command[0]).name) if command else "job"


def run(args: argparse.Namespace) -> int:
    """Register, start, supervise, record."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("stepwatch run: give the command after --, e.g. stepwatch run -- python train.py", file=sys.stderr)
        return 2
    try:
        from ..client import Client, ServerUnreachable, server_url
        from ..client import StepwatchError as ClientError
    except ImportError as exc:
        print(
            f"stepwatch run needs the client ({exc.name} is missing): pip install 'stepwatch[client]'", file=sys.stderr
        )
        return 1
    url = server_url(args.server)
    client = Client(url, getattr(args, "token", None))
    answer = _answer(client)
    if answer is not None and not isinstance(answer, ServerUnreachable):  # something answers, not stepwatch
        print(f"stepwatch run: {answer}", file=sys.stderr)
        return 1
    if answer is not None and not _start_background_server(url, client):
        return 1
    name = sanitize_name(args.name) if args.name else job_name_for(command)
    namespace = sanitize_name(args.namespace, fallback="default")
    try:
        job, token = client.register(
            name,
            namespace,
            source="runner",
            gpus=args.gpus,
            gpu_hour_cost=args.gpu_hour_cost,
            **({"gpu_type": args.gpu_type} if args.gpu_type else {}),
            **({"policy": policy} if (policy := policy_from_args(args)) else {}),
        )
    except ClientError as exc:
        print(f"stepwatch run: cannot register {namespace}/{name}: {exc}", file=sys.stderr)
        return 1
    if args.budget is not None and job.cost.rate_per_hour is None:
        print(
            f"stepwatch run: the cost of {namespace}/{name} is unknown, so --budget {args.budget:g} can never be "
            "reached: give --gpus N (and --gpu-hour-cost USD where the server has no price for it)",
            file=sys.stderr,
        )
    env = {
        **os.environ,
        "STEPWATCH_URL": url,
        "STEPWATCH_TOKEN": token,
        "STEPWATCH_JOB": name,
        "STEPWATCH_NAMESPACE": namespace,
    }
    env.pop("STEPWATCH_TOKEN_FILE", None)
    _add_autoinstrumentation(env)
    print(f"stepwatch: job {namespace}/{name} (attempt {job.attempt}) at {url}", file=sys.stderr, flush=True)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started in the background (nohup, `&` without job control): the command would inherit Ctrl-C
        # ignored, and the interrupt this runner forwards (stop, Ctrl-C) would never reach it
        signal.signal(signal.SIGINT, signal.default_int_handler)
    witness = Witness()
    stderr = witness.child_stderr()
    try:
        process = subprocess.Popen(command, env=env, start_new_session=True, stderr=stderr)
    except OSError as exc:
        os.close(stderr)
        print(f"stepwatch run: cannot start {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        _record(client, name, namespace, token, "failed", None, f"could not start: {exc.strerror or exc}")
        return 127
    witness.started(stderr)
    supervisor = _Supervisor(
        process, client, name, namespace, token, args.grace, kill_after=args.kill_after, witness=witness
    )
    return supervisor.supervise()


_SITE_DIR = Path(__file__).resolve().parent.parent / "integrations" / "_site"
"""Holds the ``sitecustomize.py`` that activates the auto-instrumentation hook in the child."""


def _add_autoinstrumentation(env: dict[str, str]) -> None:
    """Put the hook's ``sitecustomize`` first on the child's ``PYTHONPATH``, unless opted out.

    Every Python process of the job (``torchrun``'s workers included) then gives framework trainers
    stepwatch's callback when they are imported; the ``sitecustomize`` it shadows still runs.
    """
    if env.get("STEPWATCH_AUTOINSTRUMENT", "").strip().lower() in ("0", "false", "no", "off"):
        return
    if not (_SITE_DIR / "sitecustomize.py").is_file():
        return
    site = str(_SITE_DIR)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    env["PYTHONPATH"] = os.pathsep.join([site, *paths])


class _Supervisor:
    """Waits for the process group, forwards signals, enforces stop requests, records the outcome."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        client: Any,
        name: str,
        namespace: str,
        token: str,
        grace: float,
        *,
        kill_after: float = 10.0,
        witness: Witness | None = None,
    ):
        self.process = process
        self.witness = witness
        """Keeps the last of the command's stderr (``None``: its stderr is not ours to read)."""
        self.reported_failures: list[str] = []
        """The reasons the job's ranks sent with a ``failed`` state, first first (seen among its events)."""
        self.client = client
        self.name = name
        self.namespace = namespace
        self.token = token
        self.grace = grace
        self.stop_reason: str | None = None
        self.stop_deadline: float | None = None
        self.terminated_at: float | None = None
        self.interrupts = 0
        self.kill_after = kill_after
        """Seconds from a SIGTERM to the job's group until its SIGKILL."""
        self.server_warned = False
        self.last_event = 0

    def supervise(self) -> int:
        previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        _record(self.client, self.name, self.namespace, self.token, "running", None, "started by stepwatch run")
        try:
            while True:
                try:
                    code = self.process.wait(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    self._check_commands()
                    self._enforce()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.witness is not None:
                self.witness.finish()
        state, reason = self._outcome(code)
        if state == "failed" and code > 0:  # what the job said as it failed (its exception) beats an exit code
            reason = self._crash_reason() or reason
        recorded = _record(self.client, self.name, self.namespace, self.token, state, code, reason)
        if recorded is not None:  # what every reader shows: a stop asked for that the job outran is stopped
            state, reason = recorded.state, recorded.reason
        short = recorded.ended_short if recorded is not None else None
        details = ", ".join(part for part in (reason, short) if part)
        print(
            f"stepwatch: job {self.namespace}/{self.name} {state}" + (f" ({details})" if details else ""),
            file=sys.stderr,
        )
        return code if code >= 0 else 128 - code

    def _outcome(self, code: int) -> tuple[str, str]:
        if self.stop_reason is not None:
            return "stopped", self.stop_reason
        if self.interrupts:
            return "stopped", "terminated (SIGTERM)" if self.terminated_at is not None else "interrupted (Ctrl-C)"
        if code == 0:
            return "finished", ""
        if code < 0:
            return "failed", f"killed by {signal.Signals(-code).name}"
        return "failed", f"exit code {code}"

    def _crash_reason(self) -> str:
        """Why the job failed, in one line: the first exception its ranks reported (named by rank when the
        stderr shows which), else what its stderr said last; empty when neither says anything."""
        try:
            self._read_events()
        except Exception:  # the server is gone: the stderr still says why
            pass
        witness = self.witness
        if self.reported_failures:
            reason = self.reported_failures[0]
            rank = witness.rank_of(reason) if witness is not None else None
            if rank is not None:
                reason = f"{reason} (rank {rank})"
        else:
            reason = witness.reason() if witness is not None else ""
        limit = LIMITS.max_reason_length
        return reason if len(reason) <= limit else reason[: limit - 1] + "…"

    def _read_events(self) -> list[Any]:
        """The job's events since the last read (the pending ones, noting any failure a rank reported)."""
        events = self.client.events(self.name, self.namespace, after=self.last_event, limit=1000)
        for event in events:
            self.last_event = max(self.last_event, event.id or 0)
            if event.kind == "failed" and event.message and not event.data.get("exit_code"):
                self.reported_failures.append(event.message)
        return list(events)

    def _forward(self, signum: int, frame: Any) -> None:
        self.interrupts += 1
        sig = signum if self.interrupts < 3 else signal.SIGKILL  # a third Ctrl-C kills the group
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass
        if signum == signal.SIGTERM and self.terminated_at is None:  # the kill-after clock starts
            self.terminated_at = time.monotonic()

    def _check_commands(self) -> None:
        """Look for a stop request among the job's new events (acknowledged by the job or not)."""
        if self.stop_reason is not None:
            return
        try:
            events = self._read_events()
        except Exception as exc:  # the server may be gone: the job goes on
            if not self.server_warned:
                self.server_warned = True
                print(f"stepwatch: the server does not answer ({exc}); the job goes on", file=sys.stderr)
            return
        for event in events:
            data = event.data
            if event.kind == "command" and data.get("kind") == "stop":
                self.stop_reason = data.get("reason") or "stop requested"
                self.stop_deadline = time.monotonic() + self.grace
                print(
                    f"stepwatch: stop requested ({self.stop_reason}); the job has {self.grace:g} s to checkpoint "
                    "and stop",
                    file=sys.stderr,
                    flush=True,
                )
                return

    def _enforce(self) -> None:
        now = time.monotonic()
        if self.stop_deadline is not None and now >= self.stop_deadline and self.terminated_at is None:
            print("stepwatch: grace period over; terminating the job", file=sys.stderr, flush=True)
            self.terminated_at = now
            _killpg(self.process.pid, signal.SIGTERM)
        elif self.terminated_at is not None and now >= self.terminated_at + self.kill_after:
            print(
                f"stepwatch: the job is still there {self.kill_after:g} s after SIGTERM; killing its process group",
                file=sys.stderr,
                flush=True,
            )
            self.terminated_at = now  # again after as long, should SIGKILL not be the end of it
            _killpg(self.process.pid, signal.SIGKILL)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _record(client: Any, name: str, namespace: str, token: str, state: str, code: int | None, reason: str) -> Any:
    """Record how the job ended; the job as the server now has it (``None`` when it could not)."""
    try:
        return client.set_state(name, state, token, namespace, exit_code=code, reason=reason)
    except Exception as exc:
        print(f"stepwatch: could not record that the job {state} ({exc})", file=sys.stderr)
        return None


def _reachable(client: Any) -> bool:
    return _answer(client) is None


def _answer(client: Any) -> Exception | None:
    """``None`` when a stepwatch server answers; else why not (``ServerUnreachable``: nobody answers)."""
    try:
        client.ping()
    except Exception as exc:
        return exc
    return None


def _start_background_server(url: str, client: Any) -> bool:
    """Start ``stepwatch server`` in the background when the URL is a local one that nothing answers."""
    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.scheme != "http":
        print(f"stepwatch run: no stepwatch server answers at {url}", file=sys.stderr)
        return False
    port = parts.port or 80
    try:
        log_dir = background.home()
    except ImportError as exc:
        print(
            f"stepwatch run: no stepwatch server answers at {url}, and this install cannot start one ({exc.name} "
            "is missing): pip install 'stepwatch[server]', or give --server URL",
            file=sys.stderr,
        )
        return False
    log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # beside the database: this user's only
    log = log_dir / "server.log"
    with open(log, "ab") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "stepwatch", "server", "--host", parts.hostname, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline and server.poll() is None:
        if _reachable(client):
            background.remember(server.pid, url)
            print(
                f"stepwatch: started a background server at {url} (log: {log}); it keeps running until "
                "`stepwatch server stop`",
                file=sys.stderr,
            )
            return True
        time.sleep(0.2)
    if server.poll() is None:
        server.terminate()
    print(f"stepwatch run: could not start a server at {url}; see {log}", file=sys.stderr)
    return False
