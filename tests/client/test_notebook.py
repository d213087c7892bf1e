"""The notebook helper against a real server: one output, updated in place until the job ends.

The display is a recorder with IPython's ``display(obj, display_id=True)`` contract (show, then update
the same handle): a Jupyter kernel cannot run here, and the helper only ever calls that contract.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from swtest import start_job, step_until

from stepwatch.client import Client, Job, JobList
from stepwatch.client.notebook import live


class Recorder:
    def __init__(self) -> None:
        self.shown: list[Any] = []
        self.updates: list[Any] = []

    def __call__(self, obj: Any) -> Recorder:
        self.shown.append(obj)
        return self

    def update(self, obj: Any) -> None:
        self.updates.append(obj)


def test_one_job_updates_in_place_until_it_ends(server: str, ns: str, client: Client) -> None:
    run = start_job(server, ns, "nb", total_steps=20)
    run.step(loss=1.0)
    step_until(server, ns, "nb", 1)

    def train() -> None:
        for _ in range(19):
            run.step(loss=0.5)
            time.sleep(0.03)
        run.finish()

    threading.Timer(0.2, train).start()
    shown = Recorder()
    job = live(client, "nb", ns, display=shown, refresh=0.1, timeout=30)
    assert isinstance(job, Job) and job.state == "finished"
    assert len(shown.shown) == 1, "one output, updated in place"
    assert 2 <= len(shown.updates) < 60
    first, last = shown.shown[0], shown.updates[-1]
    assert "stepwatch-job" in first._repr_html_() and "5.0%" in first._repr_html_()
    assert "100.0%" in last._repr_html_() and "finished" in repr(last)


def test_every_job_for_a_while(server: str, ns: str, client: Client) -> None:
    run = start_job(server, ns, "table")
    run.step(loss=1.0)
    shown = Recorder()
    threading.Timer(0.3, lambda: run.step(loss=0.25)).start()
    jobs = live(client, namespace=ns, display=shown, refresh=0.05, timeout=1.5)
    assert isinstance(jobs, JobList) and [j.name for j in jobs] == ["table"]
    assert len(shown.shown) == 1 and shown.updates
    assert "stepwatch-jobs" in shown.updates[-1]._repr_html_()
    run.finish()


def test_without_ipython_it_prints_lines(
    server: str, ns: str, client: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    client.register("quiet", ns)
    job = live(client, "quiet", ns, timeout=0.3)
    assert isinstance(job, Job)
    assert f"{ns}/quiet pending" in capsys.readouterr().out
