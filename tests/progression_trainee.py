"""A training subprocess polled the way OpenShift AI's progression controller polls a TrainJob's pod.

Shared by the report core's tests (``tests/test_progression_lifecycle.py``) and the frameworks' ones
(``tests/integrations/test_progression_frameworks.py``): start a script with the environment of a job that
serves its progression on a free loopback port (``STEPWATCH_METRICS_PORT=127.0.0.1:0``) and writes its
termination message to a file; learn the address from the one line the run says on stderr; poll it every
100 ms with ``stepwatch.testing.poll_progression`` (a GET with the controller's 2 s timeout, 200 only, the
body read with the port of its Go decoding) until the process ends. Standard library only.
"""

from __future__ import annotations

import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from stepwatch.protocol.progression import ProgressionStatus
from stepwatch.testing import poll_progression, read_termination_message

SERVING = re.compile(r"serving OpenShift AI's progression status on http://([\d.]+):(\d+)/metrics")
"""The line a run says when it listens (on stderr when the program did not set up logging)."""


@dataclass
class Trainee:
    """A training subprocess, the address it serves on, and what the controller read from it."""

    process: subprocess.Popen[str]
    address: tuple[str, int]
    termination_log: Path
    stdout: queue.Queue[str]
    polls: list[ProgressionStatus] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)
    """Polls that failed while the process was alive (a refused connection, a body Go refuses)."""

    def poll_once(self) -> ProgressionStatus | None:
        """One poll; ``None`` when nothing answered because the process is gone."""
        try:
            status = poll_progression(self.address)
        except (OSError, ValueError) as exc:  # ProgressionError is a ValueError
            try:  # a process that is exiting closes the connection it had just accepted: not a failure
                self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self.failures.append(exc)
            return None
        self.polls.append(status)
        return status

    def poll_until_exit(self, every: float = 0.1, timeout: float = 180.0) -> int:
        """Poll as the controller does until the process ends; its exit status."""
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self.poll_once()
            time.sleep(every)
        return self.process.wait(timeout=max(deadline - time.monotonic(), 1))

    def termination_message(self) -> ProgressionStatus:
        """The termination message, read as the controller reads the container's."""
        return read_termination_message(self.termination_log)


def environment(workdir: Path, **extra: str) -> dict[str, str]:
    """This environment without stepwatch's or Kubeflow's variables, serving on a free loopback port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_"))}
    env.update(
        STEPWATCH_METRICS_PORT="127.0.0.1:0",
        STEPWATCH_TERMINATION_LOG=str(workdir / "termination-log"),
        STEPWATCH_INTERVAL="0.1",
        STEPWATCH_HANDLE_SIGTERM="1",
    )
    env.update(extra)
    return env


@contextmanager
def trainee(
    command: list[str], workdir: Path, env: Mapping[str, str] | None = None, startup: float = 120.0
) -> Iterator[Trainee]:
    """Start ``command`` and yield it once it serves; killed at the end of the block if still running."""
    env = dict(env) if env is not None else environment(workdir)
    process = subprocess.Popen(command, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stderr is not None
        lines: queue.Queue[str] = queue.Queue()
        out: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_pump, args=(process.stderr, lines), daemon=True).start()
        threading.Thread(target=_pump, args=(process.stdout, out), daemon=True).start()
        seen = []
        deadline = time.monotonic() + startup
        while True:  # the line is said at init (a framework's train begin), after its imports
            try:
                line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError("no progression endpoint was announced:\n" + "".join(seen)) from None
            seen.append(line)
            found = SERVING.search(line)
            if found:
                break
            if line == "":
                raise AssertionError("the process ended without serving:\n" + "".join(seen))
        log = Path(env["STEPWATCH_TERMINATION_LOG"])
        yield Trainee(process, (found.group(1), int(found.group(2))), log, out)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def free_port() -> int:
    """A loopback port nobody listens on (bound, noted, closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listens(port: int) -> bool:
    """Whether something accepts connections on this loopback port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def python(script: Path | str, *args: str) -> list[str]:
    """The command that runs ``script`` with this Python."""
    return [sys.executable, str(script), *args]


def _pump(stream: object, into: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line)
    into.put("")  # the end


@contextmanager
def polled_in_process(every: float = 0.05) -> Iterator[list[ProgressionStatus | Exception]]:
    """Poll, from a thread, the run this process serves (``stepwatch.current()``, once a framework's callback
    has started it) while the block runs; yields what each poll read, parsed as the controller does (or the
    error that made the poll fail: a test asserts there is none)."""
    import stepwatch

    polls: list[ProgressionStatus | Exception] = []
    done = threading.Event()

    def poll() -> None:
        address = None
        while not done.wait(every):
            run = stepwatch.current()
            address = (run.metrics_address if run is not None else None) or address
            if address is not None:
                try:
                    polls.append(poll_progression(address))
                except Exception as exc:
                    polls.append(exc)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield polls
    finally:
        done.set()
        thread.join(10)
