"""stepwatch's pytest plugin: the helpers of :mod:`stepwatch.testing` as fixtures.

pytest loads it by itself wherever stepwatch is installed (the ``pytest11`` entry point ``stepwatch``;
``-p no:stepwatch`` turns it off). Every fixture is named ``stepwatch_*``, none is autouse, and this module
imports nothing but pytest at load time: a suite that uses none of them pays for none of them, and
``stepwatch_server`` alone needs the server extra (``pip install 'stepwatch[server]'``).

==========================  ===================================================================================
``stepwatch_clean``         no ``STEPWATCH_*``/``KUBEFLOW_TRAINER_SERVER_*``, rank or TrainJob variable from the
                            machine, no run left active after the test, SIGTERM left to pytest
``stepwatch_sink``          a started :class:`~stepwatch.testing.ReportSink` (a report endpoint on 127.0.0.1)
``stepwatch_transport``     a :class:`~stepwatch.testing.MemoryTransport` (``stepwatch.init(transport=...)``)
``stepwatch_clock``         a :class:`~stepwatch.testing.FakeClock` (``create_app(clock=...)``)
``stepwatch_webhooks``      a started :class:`~stepwatch.testing.WebhookReceiver` (notification webhooks)
``stepwatch_server``        a started :class:`~stepwatch.testing.server.LocalServer` on a SQLite file in the
                            test's ``tmp_path``: the real server, uvicorn in a thread (needs the server extra)
==========================  ===================================================================================
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from . import FakeClock, MemoryTransport, ReportSink, WebhookReceiver
    from .server import LocalServer

_PREFIXES = ("STEPWATCH_", "KUBEFLOW_TRAINER_SERVER_")
_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


@pytest.fixture
def stepwatch_clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The report core as in a fresh process: no stepwatch or rank variable from the machine (a developer's
    ``STEPWATCH_URL`` would send the test's reports to a real server), none of a Kubeflow TrainJob's pod
    either (rank 0 would serve OpenShift AI's progression on port 28080), SIGTERM left to pytest, and every
    run the test started finished after it (a run left open keeps its sender thread retrying)."""
    from stepwatch import _run, finish
    from stepwatch._trainjob import TRAINJOB_VARIABLES

    for name in list(os.environ):
        if name.startswith(_PREFIXES) or name in _RANK_VARIABLES or name in TRAINJOB_VARIABLES:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STEPWATCH_HANDLE_SIGTERM", "0")
    yield
    for run in list(_run._ACTIVE):
        run.finish()
    finish()


@pytest.fixture
def stepwatch_sink() -> Iterator[ReportSink]:
    """A :class:`~stepwatch.testing.ReportSink` listening on 127.0.0.1 (``.url``), stopped after the test."""
    from . import ReportSink

    with ReportSink() as sink:
        yield sink


@pytest.fixture
def stepwatch_transport() -> MemoryTransport:
    """A :class:`~stepwatch.testing.MemoryTransport`: requests recorded, answers scripted, no socket."""
    from . import MemoryTransport

    return MemoryTransport()


@pytest.fixture
def stepwatch_clock() -> FakeClock:
    """A :class:`~stepwatch.testing.FakeClock` at its default start; ``.advance(seconds)`` moves it."""
    from . import FakeClock

    return FakeClock()


@pytest.fixture
def stepwatch_webhooks() -> Iterator[WebhookReceiver]:
    """A :class:`~stepwatch.testing.WebhookReceiver` on 127.0.0.1 (``.url()``), closed after the test."""
    from . import WebhookReceiver

    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def stepwatch_server(tmp_path: Path) -> Iterator[LocalServer]:
    """A real stepwatch server (``.url``) on ``tmp_path / "stepwatch.db"``, stopped after the test.

    It needs the server extra; without it the test fails with the ``pip install`` line to run."""
    from .server import LocalServer

    with LocalServer(tmp_path / "stepwatch.db") as server:
        yield server
