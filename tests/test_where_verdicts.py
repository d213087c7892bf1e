"""Issue 29's verdicts on real training loops: the scripts of tests/where_trainees through ``stepwatch run``
against a real stepwatch server on loopback with its default stall rules, read back from its API.

- a 75 s ``torch.save`` into a slow file in a loop of 0.5 s steps is never ``stalled`` and ends finished;
- a 2-process torchrun (gloo) job whose rank 1 blocks in ``wait_for_lock`` is stalled within 45 s of it,
  rank 1 and the function named, rank 0 waiting for it in ``all_reduce``;
- a DataLoader worker deadlock is stalled and named as data loading;
- an evaluation of 60 s without the eval hook is no stall.

They need the report core's sampler (``stepwatch._where``) and an ingest that hands ``Report.where`` to
health; each test is skipped, saying which, while one of them is missing.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")

from stepwatch.server.ingest import service
from stepwatch.testing.server import LocalServer

TRAINEES = Path(__file__).parent / "where_trainees"

pytestmark = pytest.mark.slow  # real loops of 1-2 min each


def _missing(script: str) -> str:
    if not (TRAINEES / script).exists():
        return f"tests/where_trainees/{script} is not there yet (H1's scenario scripts)"
    if importlib.util.find_spec("stepwatch._where") is None:
        return "the report core cannot sample its stack yet (stepwatch._where)"
    if "where=" not in inspect.getsource(service):
        return "the ingest service does not hand Report.where to health yet (server/ingest/service.py)"
    return ""


def _needs(script: str) -> None:
    why = _missing(script)
    if why:
        pytest.skip(why)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """A real server on loopback with the default stall rules, sweeping every second."""
    with LocalServer(tmp_path / "sw.db", health_sweep_s=1.0) as running:
        yield running.url


class Job:
    """``stepwatch run`` of a trainee in its folder (its frames read ``hung_rank.py:NN``), in its own
    process group; the times its ``WHERE_MARK`` lines came."""

    def __init__(self, url: str, name: str, *command: str, knobs: dict[str, str]) -> None:
        self.url, self.name = url, name
        self.marks: dict[str, float] = {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepwatch", "run", "--server", url, "--name", name, "--grace", "5", "--", *command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=TRAINEES,
            env={**os.environ, "STEPWATCH_INTERVAL": "1", **knobs},
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("WHERE_MARK"):
                self.marks.setdefault(line.split()[1], time.monotonic())

    def view(self) -> dict[str, Any]:
        """The job's view, or {} before it exists. A read that times out is tried again: what these tests
        judge is the verdicts, and CI once saw one read of a 2-core machine under the whole suite's load
        take over 5 s (every reading the server gave is still checked)."""
        url = f"{self.url}/api/v1/namespaces/default/jobs/{self.name}"
        for attempt in range(3):
            try:
                response = httpx.get(url, timeout=20)
            except httpx.TimeoutException:
                if attempt == 2:
                    raise
                continue
            return response.json() if response.status_code == 200 else {}
        raise AssertionError("unreachable")

    def health(self) -> dict[str, Any]:
        found: dict[str, Any] = self.view().get("health") or {}
        return found

    def end(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def wait_mark(self, what: str, timeout: float = 90.0) -> float:
        deadline = time.monotonic() + timeout
        while what not in self.marks:
            assert time.monotonic() < deadline, f"no WHERE_MARK {what}: {''.join(self.lines[-20:])}"
            assert self.proc.poll() is None or what in self.marks, "".join(self.lines[-20:])
            time.sleep(0.1)
        return self.marks[what]

    def wait_stalled(self, timeout: float) -> tuple[dict[str, Any], float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            health = self.health()
            if health.get("state") == "stalled":
                return health, time.monotonic()
            time.sleep(0.25)
        raise AssertionError(f"{self.name} never stalled: {self.health()}")

    def states_until_end(self, timeout: float) -> set[str]:
        """Every health the job showed until its process ended."""
        seen = set()
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, "".join(self.lines[-20:])
            seen.add(self.health().get("state", ""))
            time.sleep(0.25)
        time.sleep(1.0)  # the last report's verdict
        seen.add(self.health().get("state", ""))
        return seen


def _evidence(health: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = health.get("evidence") or {}
    return found


def test_a_75_s_torch_save_in_half_second_steps_is_never_stalled_and_ends_finished(server: str) -> None:
    _needs("slow_save.py")
    job = Job(server, "slow-save", sys.executable, "slow_save.py", knobs={"WHERE_SAVE_S": "75"})
    try:
        seen = job.states_until_end(240)
    finally:
        job.end()
    assert "save" in job.marks
    assert "stalled" not in seen
    final = job.view()
    assert final["state"] == "finished"
    assert final["health"]["state"] != "stalled"
    assert _evidence(final["health"])["message"].startswith("finished at step ")


def test_a_hung_torchrun_rank_is_stalled_within_45_s_with_rank_1_and_its_function_named(server: str) -> None:
    _needs("hung_rank.py")
    torchrun = str(Path(sys.executable).parent / "torchrun")
    job = Job(server, "hung-rank", torchrun, "--nproc-per-node", "2", "hung_rank.py", knobs={"WHERE_HANG_S": "0"})
    try:
        hung = job.wait_mark("hang")
        health, flagged = job.wait_stalled(70)
    finally:
        job.end()
    assert flagged - hung <= 45 + 2  # polled every 0.25 s; the reading itself is on the server's clock
    ev = _evidence(health)
    assert ev["rank"] == 1, ev
    message = ev["message"]
    assert message.startswith("rank 1 has stood "), message
    assert "wait_for_lock (hung_rank.py:" in message, message
    assert "rank 0 waits for it in torch.distributed.all_reduce" in message, message


def test_a_dataloader_worker_deadlock_is_named_as_data_loading(server: str) -> None:
    _needs("loader_deadlock.py")
    job = Job(server, "loader-deadlock", sys.executable, "loader_deadlock.py", knobs={"WHERE_DEADLOCK_S": "0"})
    try:
        health, _ = job.wait_stalled(120)
    finally:
        job.end()
    ev = _evidence(health)
    assert ev.get("activity") == "loading_data", ev
    assert "loading data" in ev["message"], ev["message"]


def test_an_evaluation_without_the_eval_hook_is_not_stalled(server: str) -> None:
    _needs("eval_no_hook.py")
    job = Job(server, "eval-no-hook", sys.executable, "eval_no_hook.py", knobs={"WHERE_EVAL_S": "60"})
    try:
        seen = job.states_until_end(240)
    finally:
        job.end()
    assert "eval" in job.marks
    assert "stalled" not in seen
    assert job.view()["state"] == "finished"
