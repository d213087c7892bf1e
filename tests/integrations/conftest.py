"""Fixtures of the framework integration tests: one real stepwatch server per module, and a job on it.

Every integration test trains a tiny real model on CPU and reports to a real ``stepwatch server``
(a subprocess on a free loopback port, with a fresh SQLite file). ``live_job`` registers a fresh job
and sets the environment the report core reads (``STEPWATCH_URL``, ``STEPWATCH_TOKEN``,
``STEPWATCH_JOB``, a 0.1 s interval), exactly as ``stepwatch run`` does for its child.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import pytest

from stepwatch.testing import wait_for

_names = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a real ``stepwatch server`` subprocess, shared by the tests of one module."""
    with serve(tmp_path_factory.mktemp("server") / "stepwatch.db") as url:
        yield url


def _answers(url: str) -> bool:
    try:
        httpx.get(url + "/healthz", timeout=1)
    except httpx.TransportError:
        return False
    return True


@contextmanager
def serve(db: Path, env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run a real ``stepwatch server`` on ``db`` (with ``env`` added: its time knobs) until the block ends."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "stepwatch", "server", "--port", str(port), "--db", str(db), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: process.poll() is not None or _answers(url), 30, "the stepwatch server to answer", every=0.1)
        started = process.poll() is None
    except AssertionError:
        started = False
    if not started:
        process.kill()
        raise RuntimeError(f"stepwatch server did not start: {process.stderr.read()!r}")
    try:
        yield url
    finally:
        process.terminate()
        process.wait(10)


@dataclass
class LiveJob:
    """A registered job on the live server, and readers of what the server made of its reports."""

    url: str
    name: str
    token: str
    namespace: str = "default"

    @property
    def path(self) -> str:
        return f"{self.url}/api/v1/namespaces/{self.namespace}/jobs/{self.name}"

    def get(self) -> dict[str, Any]:
        """The job as the server shows it (progress, state, params, last metrics)."""
        response = httpx.get(self.path, timeout=10)
        response.raise_for_status()
        return dict(response.json())

    def history(self, *metrics: str, max_points: int = 10_000) -> dict[str, list[dict[str, Any]]]:
        """Stored windows per metric (not downsampled below ``max_points``)."""
        params = {"metrics": ",".join(metrics), "max_points": str(max_points)}
        response = httpx.get(self.path + "/history", params=params, timeout=10)
        response.raise_for_status()
        return dict(response.json()["metrics"])

    def command(self, kind: str, reason: str = "test") -> None:
        """Queue ``stop`` or ``checkpoint`` for the job's reporter."""
        response = httpx.post(self.path + "/commands", json={"kind": kind, "reason": reason}, timeout=10)
        response.raise_for_status()

    def wait(self, predicate: Any, timeout: float = 20.0) -> dict[str, Any]:
        """Poll the job until ``predicate(job)`` holds; that view (or the test fails, showing the last one)."""

        def matched() -> dict[str, Any] | None:
            job = self.get()
            return job if predicate(job) else None

        try:
            view: dict[str, Any] = wait_for(matched, timeout, f"job {self.name} to match", every=0.1)
        except AssertionError as exc:
            pytest.fail(f"{exc}; last view: {self.get()}")
        return view


@pytest.fixture
def live_job(live_server: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> LiveJob:
    """A fresh job on the live server, with the report core's environment pointing at it."""
    return register(live_server, monkeypatch, request)


STRICT_STALLS: Final = {"stall_floor_s": 3, "standstill_floor_s": 3}
"""Health knobs of :func:`strict_server`: a step standing 3 s while reports arrive is a stall (30 s by
default), so that a test of a few seconds shows what an evaluation of a minute would."""


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real server whose stall limits are :data:`STRICT_STALLS`, swept every 0.5 s."""
    env = {"STEPWATCH_HEALTH": json.dumps(STRICT_STALLS), "STEPWATCH_HEALTH_SWEEP_S": "0.5"}
    with serve(tmp_path_factory.mktemp("strict") / "stepwatch.db", env) as url:
        yield url


@pytest.fixture
def strict_job(strict_server: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> LiveJob:
    """A fresh job on :func:`strict_server`, with the report core's environment pointing at it."""
    return register(strict_server, monkeypatch, request)


def register(server: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> LiveJob:
    """Register a job named for the test on ``server`` and point the report core's environment at it."""
    name = f"{request.node.name.split('[')[0].replace('_', '-')[:50]}-{next(_names)}".strip("-").lower()
    response = httpx.post(f"{server}/api/v1/namespaces/default/jobs", json={"name": name}, timeout=10)
    response.raise_for_status()
    token = response.json()["token"]
    monkeypatch.setenv("STEPWATCH_URL", server)
    monkeypatch.setenv("STEPWATCH_TOKEN", token)
    monkeypatch.setenv("STEPWATCH_JOB", name)
    monkeypatch.setenv("STEPWATCH_NAMESPACE", "default")
    monkeypatch.setenv("STEPWATCH_INTERVAL", "0.1")
    return LiveJob(url=server, name=name, token=token)


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> Path:
    """Where a test's trainer writes checkpoints (to assert one was written before a stop)."""
    path = tmp_path / "checkpoints"
    path.mkdir()
    return path


@pytest.fixture
def progression_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No stepwatch server: the run serves OpenShift AI's progression on a free loopback port (what rank 0 of a
    TrainJob pod does on 28080) and writes its termination message to the file returned."""
    log = tmp_path / "termination-log"
    monkeypatch.setenv("STEPWATCH_METRICS_PORT", "127.0.0.1:0")
    monkeypatch.setenv("STEPWATCH_TERMINATION_LOG", str(log))
    monkeypatch.setenv("STEPWATCH_INTERVAL", "0.05")
    return log
