"""Job views: the kept compact views of lists are the views built from scratch, at any time."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from stepwatch.server.api.responses import FastJSONResponse
from stepwatch.server.store import Job
from stepwatch.server.views.serialisers import CompactViews, job_view

BASE = Job(id=1, namespace="ns", name="j", attempt=1, state="pending", created_at=100.0, updated_at=100.0)
RUNNING = dataclasses.replace(
    BASE,
    state="running",
    started_at=110.0,
    last_report_at=150.0,
    step=500,
    total_steps=1000,
    eta_seconds=300.0,
    eta_rate=2.0,
    eta_at=150.0,
    last_metrics={"loss": 0.5, "grad_norm": math.inf},
    params={"lr": 0.1},
)
FINISHED = dataclasses.replace(RUNNING, state="finished", finished_at=400.0, step=1000)
FAILED = dataclasses.replace(RUNNING, state="failed", finished_at=200.0, reason="exit 1", exit_code=1)
PRICED = dataclasses.replace(RUNNING, gpus=8, gpu_hour_cost=4.0)


@pytest.mark.parametrize(
    "job", [BASE, RUNNING, FINISHED, FAILED, PRICED], ids=["pending", "running", "finished", "failed", "priced"]
)
def test_a_kept_view_is_the_view_built_now(job: Job) -> None:
    views = CompactViews()
    for now in (150.0, 151.5, 380.0, 500.0):  # kept at the first, counted at the others
        assert views.view(job, now) == job_view(job, now, compact=True)
    changed = dataclasses.replace(job, updated_at=600.0, last_metrics={"loss": 0.25})
    assert views.view(changed, 601.0) == job_view(changed, 601.0, compact=True)  # a new version: rebuilt


def test_views_are_bounded() -> None:
    views = CompactViews(capacity=10)
    for i in range(25):
        views.view(dataclasses.replace(RUNNING, id=i), 200.0)
    assert len(views._views) <= 10


def test_the_fast_encoder_writes_the_same_document() -> None:
    content = {"items": [job_view(RUNNING, 200.0), job_view(FINISHED, 500.0)], "total": 2, "big": 2**70, "s": "é"}
    body = FastJSONResponse(content).body
    assert json.loads(body) == json.loads(json.dumps(content))  # ints beyond 64 bits take the slow path


def test_a_priced_job_shows_what_it_costs_now() -> None:
    view = CompactViews().view(PRICED, 110.0 + 3600.0)
    assert view["cost"]["currency"] == "USD" and view["cost"]["rate_per_hour"] == 32.0
    assert view["cost"]["spent"] == pytest.approx(32.0)
    assert view["cost"]["projected"] == pytest.approx(32.0)  # the ETA (300 s at 150 s) has run out
    assert job_view(RUNNING, 200.0)["cost"]["spent"] is None  # no GPUs given: unknown, not free


def test_a_stalled_job_shows_no_countdown_but_a_posted_eta_as_posted() -> None:
    """A hung job's last estimate counting down (seen in `stepwatch top`: a stalled job at '1m42s') would be
    a guess dressed as fact: no ETA while stalled; it comes back when the job does. What a Kubeflow client
    posted is the job's own word and is shown as posted."""
    stalled = dataclasses.replace(RUNNING, health="stalled", health_since=160.0)
    assert job_view(RUNNING, 200.0)["eta"]["remaining_seconds"] == pytest.approx(250.0)
    assert job_view(stalled, 200.0)["eta"]["remaining_seconds"] is None
    assert job_view(stalled, 200.0)["eta"]["source"] is None
    posted = dataclasses.replace(
        stalled, trainer_status={"estimatedRemainingSeconds": 600, "lastUpdatedTime": "2026-12-06T02:00:00Z"}
    )
    eta = job_view(posted, 200.0)["eta"]
    assert eta["source"] == "reported" and eta["remaining_seconds"] == pytest.approx(550.0)
