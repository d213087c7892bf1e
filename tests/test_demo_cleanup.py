"""``stepwatch demo`` ends everything it started, however it is ended (issue 30 item 6).

The real demo runs in a session of its own, as in a terminal: its server, four runners and their
training processes (NumPy, the hanging one included). Once every training process is up the test
sends the signal a person would — SIGINT (Ctrl-C), SIGTERM (``kill``), SIGHUP (the terminal closed) —
to the demo's process group, then looks in ``/proc``: no process the demo started (by PID and start
time, so a reused number is not mistaken for one), none in the demo's session or in the sessions of
those it started, and no ``stepwatch-demo-*`` directory left in the temporary directory.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("numpy")
pytest.importorskip("httpx")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="walks /proc (Linux)"),
]

START_TIMEOUT_S = 90.0
END_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` fields after the name: [state, ppid, pgrp, session, ...]; index 19 is the start time."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _live() -> dict[int, list[str]]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(int(name))) is not None and fields[0] != "Z":
            found[int(name)] = fields
    return found


def _tree(root: int) -> dict[int, str]:
    """Every process below ``root``: PID -> start time (to tell it from a later process given the same PID)."""
    processes = _live()
    children: dict[int, list[int]] = {}
    for pid, fields in processes.items():
        children.setdefault(int(fields[1]), []).append(pid)
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in found and pid in processes:
            found[pid] = processes[pid][19]
            todo.extend(children.get(pid, []))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_trainer(cmdline: str) -> bool:
    """A demo training process itself (``python -m stepwatch.cli.demo_training``), not its runner, whose
    command line names it too (``python -m stepwatch run ... -- python -m stepwatch.cli.demo_training``)."""
    return cmdline.split(" ")[1:3] == ["-m", "stepwatch.cli.demo_training"]


def _still_there(snapshot: dict[int, str], sessions: set[int]) -> list[str]:
    left = []
    for pid, fields in _live().items():
        if snapshot.get(pid) == fields[19] or int(fields[3]) in sessions:
            left.append(f"{pid} {_cmdline(pid)[:160]}")
    return left


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_demo_leaves_nothing_behind(tmp_path: Path, sig: signal.Signals) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_TRAINER_SERVER_"))}
    env.update(TMPDIR=str(temp), STEPWATCH_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    out = tmp_path / "demo.out"
    with open(out, "wb") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-m", "stepwatch", "demo", "--port", str(_free_port()), "--steps", "3000"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # as in a terminal: its own session, Ctrl-C and SIGHUP go to its group
        )
    snapshot: dict[int, str] = {}
    sessions: set[int] = {demo.pid}
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        trainers: set[int] = set()  # every training process seen: the plateau's may be stopped by its policy early
        while time.monotonic() < deadline and demo.poll() is None and len(trainers) < 4:
            trainers |= {p for p in _tree(demo.pid) if _is_trainer(_cmdline(p))}
            time.sleep(0.5)
        assert len(trainers) == 4, f"the demo did not start its 4 runs: {out.read_text(errors='replace')[-2000:]}"
        time.sleep(2.0)  # the runs report; the hanging one is on its way to hang
        workdirs = list(temp.glob("stepwatch-demo-*"))
        assert len(workdirs) == 1, workdirs
        assert re.search(r"Logs: \S*stepwatch-demo-", out.read_text(errors="replace"))
        snapshot = _tree(demo.pid)
        sessions = {demo.pid} | {os.getsid(p) for p in snapshot if _stat(p) is not None}
        assert len(snapshot) >= 5, snapshot  # the server, the runners, their training processes

        os.killpg(demo.pid, sig)
        code = demo.wait(timeout=END_TIMEOUT_S)

        assert code == 128 + sig, out.read_text(errors="replace")[-2000:]
        left = _still_there(snapshot, sessions)
        assert not left, f"still running after the demo ended by {sig.name}: {left}"
        assert not list(temp.glob("stepwatch-demo-*")), "the demo's temporary directory is left"
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        for line in _still_there(snapshot, sessions):  # a failed run must not leak into the next one
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except OSError:
                pass
