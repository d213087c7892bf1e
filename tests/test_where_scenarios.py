"""Issue 29's scenarios end to end: the real training loops of tests/where_trainees through ``stepwatch run``
against a real stepwatch server, and the ``where`` of the reports that server received.

The server does not keep a report's body (its verdicts use ``where``, its store does not), so a small
ASGI middleware in front of the real app records each report body on its way in; everything else is
the real thing: uvicorn on loopback, SQLite, the runner, torchrun with gloo, torch on CPU. Durations
are shortened through the scripts' environment knobs (their README.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwatch.protocol import Report, decode_body

pytest.importorskip("torch")
pytest.importorskip("uvicorn")

from stepwatch.server import ServerSettings, create_app
from stepwatch.testing.server import ServerThread

TRAINEES = Path(__file__).parent / "where_trainees"

pytestmark = pytest.mark.slow


class RecordReports:
    """ASGI middleware: keeps the body of every native report posted to the app, then passes it on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/reports"):
            await self.app(scope, receive, send)
            return
        messages = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)

        async def replay() -> Any:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    def reports(self) -> list[Report]:
        return [Report.from_dict(decode_body(body)) for body in list(self.bodies)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, RecordReports]]:
    recorder = RecordReports(create_app(ServerSettings(db=str(tmp_path / "sw.db"))))
    with ServerThread(recorder, log_level="critical") as httpd:
        yield httpd.url, recorder


def line_of(script: str, text: str) -> int:
    for number, line in enumerate((TRAINEES / script).read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(f"{text!r} not in {script}")


def run_job(url: str, *command: str, knobs: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``stepwatch run`` of a trainee in its folder (so its frames read ``slow_save.py:NN``)."""
    return subprocess.run(
        [sys.executable, "-m", "stepwatch", "run", "--server", url, "--", *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=TRAINEES,
        env={**os.environ, "STEPWATCH_INTERVAL": "0.5", **knobs},
    )


def job(url: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{url}/api/v1/namespaces/default/jobs/{name}", timeout=5).json()
    return found


def readings(reports: list[Report], rank: int = 0) -> list[Report]:
    """The reports of ``rank`` that carry a reading, each reading once (reports come faster than samples)."""
    found: list[Report] = []
    for report in reports:
        if report.where is None or report.identity.rank != rank:
            continue
        if found and found[-1].where == report.where:
            continue
        found.append(report)
    return found


def test_a_long_torch_save_reads_checkpointing_and_the_job_finishes(server: tuple[str, RecordReports]) -> None:
    url, recorder = server
    knobs = {"WHERE_STEPS": "16", "WHERE_STEP_S": "0.3", "WHERE_SAVE_AT": "6", "WHERE_SAVE_S": "12"}
    done = run_job(url, sys.executable, "slow_save.py", knobs=knobs)
    assert done.returncode == 0, done.stderr
    standing = readings(recorder.reports())
    # the stand lasts the save and then the rest of that step (its compute and sleep): the last reading
    # may be taken after the save
    saving = [r.where for r in standing if r.where is not None and r.where.activity == "checkpointing"]
    assert saving, "no report said the rank was saving"
    assert len(saving) >= len(standing) - 1
    where = saving[-1]
    assert where.detail == "torch.save"
    assert str(where.frames[0]).startswith("SlowFile.write (slow_save.py:")
    save = line_of("slow_save.py", "torch.save(model.state_dict(), out)")
    assert f"save_checkpoint (slow_save.py:{save})" in [str(f) for f in where.frames]
    assert saving[0].stood_seconds >= 5.0  # nothing before the 5 s floor (0.3 s steps: 3 x median is less)
    assert job(url, "slow-save")["state"] == "finished"


def test_a_hung_rank_is_named_in_its_own_function_and_rank_0_waits_in_all_reduce(
    server: tuple[str, RecordReports],
) -> None:
    url, recorder = server
    knobs = {"WHERE_STEPS": "14", "WHERE_STEP_S": "0.3", "WHERE_HANG_AT": "6", "WHERE_HANG_S": "14"}
    torchrun = str(Path(sys.executable).parent / "torchrun")
    done = run_job(url, torchrun, "--nproc-per-node", "2", "hung_rank.py", knobs=knobs)
    assert done.returncode == 0, done.stderr
    reports = recorder.reports()
    hung, waiting = readings(reports, rank=1), readings(reports, rank=0)
    assert hung, "rank 1 never said where it stood"
    where = hung[0].where
    assert where is not None and where.activity == "waiting"
    held = line_of("hung_rank.py", "held.acquire(timeout=seconds)")
    assert str(where.frames[0]) == f"wait_for_lock (hung_rank.py:{held})"
    assert where.detail == "held.acquire"
    assert waiting, "rank 0 never said where it stood"
    peer = waiting[0].where
    assert peer is not None
    assert (peer.activity, peer.detail) == ("communicating", "torch.distributed.all_reduce")
    assert str(peer.frames[0]).startswith("main (hung_rank.py:")
    # rank 1 heartbeats every 5 intervals, but said where it stood promptly once it stood
    first = hung[0].where
    assert first is not None and first.stood_seconds < 5.0 + 3 * 0.5 + 1.0
    assert job(url, "hung-rank")["state"] == "finished"


def test_a_dataloader_worker_deadlock_reads_loading_data(server: tuple[str, RecordReports]) -> None:
    url, recorder = server
    knobs = {"WHERE_STEPS": "14", "WHERE_STEP_S": "0.2", "WHERE_DEADLOCK_AT": "5", "WHERE_DEADLOCK_S": "12"}
    done = run_job(url, sys.executable, "loader_deadlock.py", knobs=knobs)
    assert done.returncode == 0, done.stderr
    standing = readings(recorder.reports())
    assert standing, "no report said where the rank stood while the loader was stuck"
    where = standing[0].where
    assert where is not None and where.activity == "loading_data"
    assert where.detail.startswith("torch.utils.data.DataLoader.")
    assert str(where.frames[0]).startswith("main (loader_deadlock.py:")
    assert job(url, "loader-deadlock")["state"] == "finished"


def test_an_evaluation_without_the_hook_reads_evaluating(server: tuple[str, RecordReports]) -> None:
    url, recorder = server
    knobs = {"WHERE_STEPS": "14", "WHERE_STEP_S": "0.3", "WHERE_EVAL_AT": "5", "WHERE_EVAL_S": "12"}
    done = run_job(url, sys.executable, "eval_no_hook.py", knobs=knobs)
    assert done.returncode == 0, done.stderr
    standing = readings(recorder.reports())
    assert standing, "no report said where the rank stood during the evaluation"
    evaluating = [r.where for r in standing if r.where is not None and r.where.activity == "evaluating"]
    assert len(evaluating) >= len(standing) - 1  # the last reading may come after it, in that step's rest
    where = evaluating[-1]
    assert where is not None and where.detail == "evaluate"
    assert any(str(f).startswith("evaluate (eval_no_hook.py:") for f in where.frames)
    assert all(r.progress.phase is None for r in standing)  # nobody announced it
    assert job(url, "eval-no-hook")["state"] == "finished"
