"""The background server that ``stepwatch run`` starts when none answers, and ``stepwatch server stop``.

``stepwatch run`` starts ``stepwatch server`` in a session of its own and, once it answers, writes
``server-PORT.pid`` (its process id and URL, as JSON) in the data directory (``$STEPWATCH_HOME``, else
``$XDG_DATA_HOME/stepwatch``), beside its log. ``stepwatch server stop`` reads those files, ends each
server still running (SIGTERM to its process group, SIGKILL after a while) and removes the file.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Background", "home", "remember", "running", "stop"]

_STOP_WAIT_S = 10.0


def home() -> Path:
    """The data directory, as the server reads it (its database, its log, these pid files)."""
    from ..server.settings import default_data_dir

    return default_data_dir()


@dataclass(frozen=True)
class Background:
    """A server that ``stepwatch run`` started: its process (and group) id, URL and pid file."""

    pid: int
    url: str
    file: Path


def _pid_file(port: int) -> Path:
    return home() / f"server-{port}.pid"


def remember(pid: int, url: str) -> Path:
    """Record a background server (its process leads a group of its own)."""
    from urllib.parse import urlsplit

    path = _pid_file(urlsplit(url).port or 80)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "url": url}) + "\n", encoding="utf-8")
    return path


def running(port: int | None = None) -> list[Background]:
    """The background servers recorded (on ``port``, else on any) whose process is alive; stale files go."""
    found = []
    for path in sorted(home().glob("server-*.pid")) if port is None else [_pid_file(port)]:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            server = Background(int(data["pid"]), str(data["url"]), path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(server.pid):
            found.append(server)
        else:
            path.unlink(missing_ok=True)
    return found


def stop(server: Background) -> bool:
    """End a background server (its process group): SIGTERM, then SIGKILL; ``True`` once it is gone."""
    _signal_group(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_WAIT_S
    while time.monotonic() < deadline and _alive(server.pid):
        time.sleep(0.1)
    if _alive(server.pid):
        _signal_group(server.pid, signal.SIGKILL)
        time.sleep(0.2)
    gone = not _alive(server.pid)
    if gone:
        server.file.unlink(missing_ok=True)
    return gone


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    """The process runs and is a stepwatch one (a zombie, or a process that reused the number, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the number: not ours
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            zombie = stat.read().rsplit(")", 1)[1].split()[0] == "Z"
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return not zombie and b"stepwatch" in cmdline.read()
    except OSError:  # no /proc (macOS): the signal said it is there
        return True
