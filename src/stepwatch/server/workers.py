"""Several server processes on one port and one database: ``stepwatch server --workers N``.

One server process is one event loop, so it ingests what one core allows. With ``--workers N`` a
supervisor binds the port, makes a private directory for the workers' sockets, and forks N workers,
each accepting connections from a listening socket of its own on that port (``SO_REUSEPORT``: the
kernel spreads new connections evenly over them; from one shared socket, the worker that woke first
took a burst of new connections, and a benchmark phase ran with one worker at 0.36 of a core and
the other at 0.89). Each worker is a whole server (:func:`.app.create_app` with a :class:`.WorkerRole`): API,
dashboard, live stream and ingest, on its own connection to the database. What they share:

- **the database.** SQLite serialises their writes; each worker's store reads the others' write log
  before it answers from memory (``SQLiteStore(shared=True)``), so no worker serves a job as it was
  before another worker wrote it, and a worker forgets the health tracker and ETA samples of a job
  another worker wrote (its next report there rebuilds them from the store, as after a restart).
  A reporter keeps its connection, so a job's reports stay with one worker and that costs nothing.
  PostgreSQL replicas do the same through notifications.
- **the live stream.** Every update a worker publishes is relayed to the others (:mod:`.siblings`),
  so a dashboard connected to any worker sees every job.
- **what must happen once** (retention, the Kubernetes runner, the policies' reviews, the silence of
  jobs that no worker tracks) happens in worker 0.

The supervisor forwards SIGINT and SIGTERM to the workers and waits for them; a worker that dies is
started again (one that keeps dying at start stops the server). Workers run in a process group of
their own, so a Ctrl-C at the terminal reaches them once, through the supervisor, and on Linux they
are told to stop when the supervisor itself is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from .siblings import WorkerRole

__all__ = ["listening_sockets", "supervise"]

_log = logging.getLogger("stepwatch.server")

RESTART_PAUSE_S = 1.0
"""Pause before a dead worker is started again."""

FAILED_STARTS = 5
"""A worker that dies within :data:`EARLY_DEATH_S` of its start this many times in a row stops the server."""

EARLY_DEATH_S = 10.0

STOP_GRACE_S = 30.0
"""How long stopping workers get before they are killed."""

Serve = Callable[[WorkerRole, socket.socket], None]
"""Runs one worker until it is told to stop (in the forked process)."""


def listening_sockets(host: str, port: int, count: int, backlog: int = 2048) -> list[socket.socket]:
    """``count`` listening TCP sockets on one port, one per worker (``SO_REUSEPORT``; where the system
    has no such option, one socket that the workers share). ``OSError`` when the port is taken, by
    anything: the port is claimed alone first, so a second stepwatch server cannot join the first."""
    claim = _listening(host, port, backlog, reuse_port=False)
    if count == 1 or not hasattr(socket, "SO_REUSEPORT"):
        return [claim]
    port = claim.getsockname()[1]  # the one the system chose, for port 0
    claim.close()
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(_listening(host, port, backlog, reuse_port=True))
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _listening(host: str, port: int, backlog: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def supervise(count: int, socks: list[socket.socket], serve: Serve, say: Callable[[str], None] | None = None) -> int:
    """Run ``count`` workers on ``socks`` (worker i on socket i, or all on one) until SIGINT or SIGTERM;
    the exit status (0, or 1 when workers kept dying at their start). ``serve`` runs in each forked worker."""
    directory = tempfile.mkdtemp(prefix="stepwatch-workers-")  # mode 0700: only this user talks to them
    supervisor = _Supervisor(count, socks, serve, directory, say)
    previous = {s: signal.signal(s, supervisor.stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return supervisor.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for sock in socks:
            sock.close()
        shutil.rmtree(directory, ignore_errors=True)


class _Supervisor:
    """The workers' parent: starts them, starts again those that die, stops them all on a signal."""

    def __init__(
        self,
        count: int,
        socks: list[socket.socket],
        serve: Serve,
        directory: str,
        say: Callable[[str], None] | None,
    ) -> None:
        self.count, self.socks, self.serve, self.directory = count, socks, serve, directory
        self.say = say or (lambda line: print(f"stepwatch server: {line}", file=sys.stderr, flush=True))
        self.children: dict[int, tuple[int, float]] = {}
        """pid -> (worker index, start time)"""
        self.early_deaths = [0] * count
        self.stopping = False
        self.status = 0

    def start(self, index: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            mine = self.socks[index % len(self.socks)]
            for other in self.socks:  # a worker holds only its own listening socket
                if other is not mine:
                    other.close()
            _worker(WorkerRole(index, self.count, self.directory), mine, self.serve)
        self.children[pid] = (index, time.monotonic())

    def stop(self, signum: int = signal.SIGTERM, frame: FrameType | None = None) -> None:
        """Tell every worker to stop (a signal handler)."""
        if not self.stopping:
            self.say(f"stopping {len(self.children)} workers")
        self.stopping = True
        self.signal_all(signal.SIGTERM)

    def signal_all(self, signum: int) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def run(self) -> int:
        for index in range(self.count):
            self.start(index)
        deadline: float | None = None
        while self.children:
            if self.stopping and deadline is None:
                deadline = time.monotonic() + STOP_GRACE_S
            try:
                pid, code = _wait(deadline)
            except ChildProcessError:
                break
            if pid == 0:  # the grace period is over
                self.signal_all(signal.SIGKILL)
                deadline = time.monotonic() + STOP_GRACE_S
            else:
                self.ended(pid, code)
        return self.status

    def ended(self, pid: int, code: int) -> None:
        index, started = self.children.pop(pid)
        if self.stopping:
            return
        self.say(f"worker {index} (pid {pid}) ended ({_how(code)}); starting it again")
        early = time.monotonic() - started < EARLY_DEATH_S
        self.early_deaths[index] = self.early_deaths[index] + 1 if early else 0
        if self.early_deaths[index] >= FAILED_STARTS:
            self.say(f"worker {index} died {FAILED_STARTS} times at its start; stopping (see its messages above)")
            self.status = 1
            self.stop()
            return
        time.sleep(RESTART_PAUSE_S)
        if not self.stopping:
            self.start(index)


def _wait(deadline: float | None) -> tuple[int, int]:
    """The next worker to end and its wait status; ``(0, 0)`` once ``deadline`` passed first."""
    while True:
        if deadline is None:
            try:
                return os.waitpid(-1, 0)
            except InterruptedError:  # pragma: no cover - retried by Python itself (PEP 475)
                continue
        pid, code = os.waitpid(-1, os.WNOHANG)
        if pid:
            return pid, code
        if time.monotonic() >= deadline:
            return 0, 0
        time.sleep(0.05)


def _how(code: int) -> str:
    if os.WIFSIGNALED(code):
        return f"signal {signal.Signals(os.WTERMSIG(code)).name}"
    return f"exit code {os.waitstatus_to_exitcode(code)}"


def _worker(role: WorkerRole, sock: socket.socket, serve: Serve) -> None:
    """The forked worker's life; never returns."""
    code = 1
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the supervisor only, which tells each worker once
        _die_with_parent()
        serve(role, sock)
        code = 0
    except BaseException:
        _log.exception("worker %d failed", role.index)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when the supervisor dies (a SIGKILL leaves no one to tell the workers)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc: Any = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGTERM, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        _log.debug("a worker cannot follow its supervisor's death: %s", exc)
        return
    if os.getppid() == 1:  # the supervisor died before the call
        os.kill(os.getpid(), signal.SIGTERM)
