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


# ------------------------------------------------------------------- the figures a person reads (views/figures)

from stepwatch.server.views.figures import health_timeline, progress_percent  # noqa: E402
from stepwatch.server.views.serialisers import health_history_view  # noqa: E402


@pytest.mark.parametrize(
    ("step", "total", "state", "shown"),
    [
        (996, 10_000, "running", 9.9),  # 9.96: rounded down, never up to 10.0
        (9_999, 10_000, "running", 99.9),
        (10_000, 10_000, "running", 99.9),  # at its total but not done: 100 only when finished
        (10_000, 10_000, "finished", 100.0),
        (10_000, 10_000, "stopped", 100.0),  # asked to stop, it ran to its total in its grace period
        (199, 400, "failed", 49.7),  # ended short: its real progress, by the same rule
        (3, 10, "running", 30.0),  # no float a hair under a tenth
        (7, 25, "running", 28.0),
    ],
)
def test_percent_is_one_decimal_rounded_down(step: int, total: int, state: str, shown: float) -> None:
    job = dataclasses.replace(RUNNING, step=step, total_steps=total, state=state)
    assert progress_percent(job) == shown == job_view(job, 200.0)["progress"]["percent"]


def test_a_stalled_or_ended_job_has_no_live_rate_and_an_ended_one_no_hourly_cost() -> None:
    stalled = dataclasses.replace(PRICED, health="stalled", health_since=140.0, samples_per_second=9.0)
    view = job_view(stalled, 200.0)
    assert view["progress"]["steps_per_second"] is None and view["progress"]["samples_per_second"] is None
    assert view["cost"]["rate_per_hour"] == 32.0  # it still burns its GPUs
    ended = dataclasses.replace(PRICED, state="stopped", finished_at=300.0)
    view = job_view(ended, 500.0)
    assert view["progress"]["steps_per_second"] is None and view["cost"]["rate_per_hour"] is None
    assert view["cost"]["spent"] == pytest.approx((300 - 110) / 3600 * 32)
    assert job_view(PRICED, 200.0)["progress"]["steps_per_second"] == 2.0


def test_health_spans_add_up_to_the_elapsed_time_and_their_waste_to_the_cost() -> None:
    """Issue 30: "a health history of 30 s + 23 s for a job 44 s old", "$0.50 wasted beside $0.46". A plateau
    counted from the last real improvement cuts the healthy span before it short; a stall whose ``since``
    reaches back over two spans cuts both; a time without a verdict is an ``unknown`` span."""
    history = [
        {"state": "healthy", "from": 130.0, "since": 130.0, "to": 200.0, "message": ""},
        {"state": "straggling", "from": 200.0, "since": 200.0, "to": 220.0, "message": ""},
        {"state": "stalled", "from": 240.0, "since": 190.0, "to": 260.0, "message": "hung"},  # reaches back
        {"state": "healthy", "from": 260.0, "since": 260.0, "to": 280.0, "message": ""},
        {"state": "not_learning", "from": 300.0, "since": 290.0, "to": None, "message": "flat"},
    ]
    job = dataclasses.replace(PRICED, health="not_learning", health_since=290.0, health_history=history)
    timeline = [(s["state"], a, b) for s, a, b in health_timeline(job, 350.0)]
    assert timeline == [
        ("healthy", 110.0, 190.0),  # from the job's start: its first windows judged those steps
        ("straggling", 190.0, 190.0),  # wholly covered by the stall that reached back
        ("stalled", 190.0, 260.0),
        ("healthy", 260.0, 280.0),
        ("unknown", 280.0, 290.0),  # no verdict stood here
        ("not_learning", 290.0, 350.0),
    ]
    view = job_view(job, 350.0)
    spans = view["health_history"]
    assert sum(s["seconds"] for s in spans) == view["times"]["elapsed_seconds"] == 240.0
    assert sum(s["wasted"] for s in spans) == view["cost"]["wasted"] == pytest.approx((70 + 60) / 3600 * 32)
    assert health_history_view(job, 350.0) == spans
    # ended: the open span ends at the end, and the sums still agree
    ended = dataclasses.replace(job, state="stopped", finished_at=320.0)
    spans = job_view(ended, 900.0)["health_history"]
    assert spans[-1]["end"] == 320.0 and sum(s["seconds"] for s in spans) == 210.0
    assert sum(s["wasted"] for s in spans) == job_view(ended, 900.0)["cost"]["wasted"]
