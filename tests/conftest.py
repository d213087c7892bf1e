"""Shared fixtures: a clean stepwatch state and environment for every test, and a loopback sink."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import stepwatch
from stepwatch import _run
from stepwatch.testing import ReportSink

_PREFIXES = ("STEPWATCH_", "KUBEFLOW_TRAINER_SERVER_")
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


@pytest.fixture(autouse=True)
def clean_stepwatch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No stepwatch or rank variable leaks in from the machine, and no run outlives its test."""
    for name in list(os.environ):
        if name.startswith(_PREFIXES) or name in _RANK_VARS:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STEPWATCH_HANDLE_SIGTERM", "0")  # pytest's own process keeps its signals
    yield
    for run in list(_run._ACTIVE):
        run.finish()
    stepwatch.finish()


@pytest.fixture
def sink() -> Iterator[ReportSink]:
    """A real report sink on 127.0.0.1, stopped after the test."""
    with ReportSink() as server:
        yield server
