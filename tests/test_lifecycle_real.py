"""Issue 19, lifecycle and ETA, with real training loops under ``stepwatch run``.

A real server (``LocalServer``: its own loopback socket, a temporary SQLite file), the real runner in
a subprocess, and ``examples/train_resumable.py`` (a NumPy loop that checkpoints and resumes) as the
job. Every reader is asked how the job ended: the runner's own line, the API, the SDK and the CLI's
``jobs``, ``describe`` and ``watch``: a stop asked for reads ``stopped`` everywhere, a script that
exits early says "ended at X%", and a job resumed from its checkpoint gets a right ETA from its first
seconds, read back from the API.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import mean
from typing import Any

import httpx
import pytest

from stepwatch.cli import main as cli_main
from stepwatch.client import Client
from stepwatch.testing import wait_for
from stepwatch.testing.server import LocalServer

pytest.importorskip("numpy")

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "examples" / "train_resumable.py"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with LocalServer(tmp_path / "sw.db", log_level="critical") as local:
        yield local.url


def _runner(server: str, name: str, tmp_path: Path, *script_args: str, grace: float = 60.0) -> subprocess.Popen[str]:
    """``stepwatch run --name NAME -- python examples/train_resumable.py ...``, started."""
    return subprocess.Popen(
        [sys.executable, "-m", "stepwatch", "run", "--server", server, "--name", name, "--grace", str(grace), "--",
         sys.executable, str(SCRIPT), "--checkpoint", str(tmp_path / f"{name}.json"), *script_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "STEPWATCH_INTERVAL": "0.5", "HOME": str(tmp_path)},
        cwd=tmp_path,
    )  # fmt: skip


def _view(server: str, name: str) -> dict[str, Any]:
    return httpx.get(f"{server}/api/v1/namespaces/default/jobs/{name}", timeout=5).json()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli_main(list(argv))
    out, _ = capsys.readouterr()
    return code, out


def _jobs_row(capsys: pytest.CaptureFixture[str], server: str, name: str) -> str:
    code, out = _cli(capsys, "jobs", "--server", server, "-n", "default")
    assert code == 0
    return next(line for line in out.splitlines() if line.startswith(name + " "))


def _stop(server: str, name: str, reason: str) -> None:
    answer = httpx.post(
        f"{server}/api/v1/namespaces/default/jobs/{name}/commands", json={"kind": "stop", "reason": reason}, timeout=5
    )
    assert answer.status_code == 201, answer.text


@pytest.mark.parametrize("loop", ["obeys the stop", "runs to its end in the grace period"])
def test_a_stop_reads_stopped_in_every_reader(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], loop: str
) -> None:
    obeys = loop == "obeys the stop"
    steps = "100000" if obeys else "600"
    process = _runner(
        server, "plateau", tmp_path, "--steps", steps, "--step-seconds", "0.01", *([] if obeys else ["--ignore-stop"])
    )
    wait_for(
        lambda: ((_view(server, "plateau").get("progress") or {}).get("step") or 0) >= 20, 60, "step 20", every=0.2
    )
    _stop(server, "plateau", "plateau")
    out, err = process.communicate(timeout=90)
    assert process.returncode == 0, err
    view = _view(server, "plateau")
    assert (view["state"], view["reason"]) == ("stopped", "plateau")
    line = err.splitlines()[-1]  # the runner's last word: how the job ended
    assert line.startswith("stepwatch: job default/plateau stopped (plateau"), line  # the runner agrees
    with Client(server) as client:
        job = client.job("plateau")
    assert job.state == "stopped"
    row = _jobs_row(capsys, server, "plateau")
    assert " stopped " in row
    code, watched = _cli(capsys, "watch", "plateau", "--server", server)
    assert code == 2 and watched.startswith("default/plateau stopped: plateau"), watched  # 2: stopped
    code, described = _cli(capsys, "describe", "plateau", "--server", server)
    assert code == 0 and "stopped" in described
    if obeys:  # it stopped short of its total: every reader says so
        assert "stopping at step" in out
        assert job.ended_short is not None and job.ended_short.startswith("ended at ")
        assert job.percent is not None and job.percent < 1
        for text in (row, watched, described, line):
            assert "ended at " in text, text
    else:  # it ran to its end while asked to stop: stopped, at 100 %
        assert view["progress"]["percent"] == 100 and job.ended_short is None


@pytest.mark.parametrize(("code", "state"), [(0, "finished"), (3, "failed")])
def test_an_early_exit_shows_its_real_progress(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], code: int, state: str
) -> None:
    """A script that exits at step 199 of 400 without finish(): 49.75 %, shown 49.7 and "ended at 49.7%"
    (rounded down, as every reader shows it); its exit code still decides finished or failed."""
    process = _runner(
        server, "early", tmp_path, "--steps", "400", "--step-seconds", "0", "--exit-at", "199", "--exit-code", str(code)
    )
    _, err = process.communicate(timeout=90)
    assert process.returncode == code, err
    view = _view(server, "early")
    assert (view["state"], view["progress"]["step"], view["progress"]["percent"]) == (state, 199, 49.7)
    assert f"stepwatch: job default/early {state} (" in err and "ended at 49.7%)" in err
    with Client(server) as client:
        assert client.job("early").ended_short == "ended at 49.7%"
    assert "ended at 49.7%" in _jobs_row(capsys, server, "early")
    watch_code, watched = _cli(capsys, "watch", "early", "--server", server)
    assert watch_code == code // 3 and "ended at 49.7%" in watched  # 0 finished, 1 failed
    _, described = _cli(capsys, "describe", "early", "--server", server)
    assert "ended at 49.7%" in described


@pytest.mark.slow
def test_a_resumed_job_has_a_right_eta_from_its_first_seconds(server: str, tmp_path: Path) -> None:
    """A real resume: the loop checkpoints every 50 steps, is killed, and is started again with the same
    job name (attempt 2). Its first report says step 0, the next the checkpoint's step; the ETA the API
    gives over the first 20 s after that jump is within 20 % of the truth on average, and far better
    than the lifetime average (measured on the same points, the baseline of this run)."""
    total, step_s = 2400, "0.02"
    first = _runner(server, "resume", tmp_path, "--steps", str(total), "--step-seconds", step_s, "--pid-file",
                    str(tmp_path / "pid"))  # fmt: skip
    wait_for(
        lambda: ((_view(server, "resume").get("progress") or {}).get("step") or 0) >= 400, 60, "step 400", every=0.2
    )
    os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)  # killed mid-run: no final report
    first.communicate(timeout=30)
    assert _view(server, "resume")["state"] == "failed"
    checkpoint = tmp_path / "resume.json"
    assert checkpoint.exists()

    second = _runner(server, "resume", tmp_path, "--steps", str(total), "--step-seconds", step_s)
    readings: list[tuple[float, float | None, int]] = []
    resumed_at: float | None = None
    while second.poll() is None:
        view = _view(server, "resume")
        now = time.time()
        if view["attempt"] == 2 and (view["progress"]["step"] or 0) > 0:
            resumed_at = resumed_at or now
            if now - resumed_at <= 20.0:
                readings.append((now, view["eta"]["remaining_seconds"], view["progress"]["step"]))
        time.sleep(0.5)
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    assert "resumed at step" in out
    view = _view(server, "resume")
    assert (view["attempt"], view["state"], view["progress"]["step"]) == (2, "finished", total)
    end, started = view["times"]["finished"], view["times"]["started"]
    ours, lifetime = [], []
    for now, eta, step in readings:
        truth = end - now
        if eta is None or truth <= 0:
            continue
        ours.append(abs(eta - truth) / truth)
        lifetime.append(abs((now - started) / step * (total - step) - truth) / truth)
    print(f"ETA error over the first 20 s after the resume: {mean(ours):.1%} (lifetime average {mean(lifetime):.1%})")
    assert len(ours) >= 0.8 * len(readings) >= 10, readings  # an ETA from the first seconds on
    assert mean(ours) <= 0.20, (mean(ours), readings)
    assert mean(ours) < 0.5 * mean(lifetime), (mean(ours), mean(lifetime))
