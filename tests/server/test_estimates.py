"""When the server recomputes a job's ETA: often enough to be right, rarely enough to be cheap."""

from __future__ import annotations

import dataclasses

import pytest

from stepwatch.server.estimates import ESTIMATE_EVERY_S, YOUNG_S, estimate_due
from stepwatch.server.store import Job

NOW = 10_000.0
OLD = dataclasses.replace(
    Job(id=1, namespace="ns", name="j", attempt=1, state="running", created_at=0.0, updated_at=NOW),
    started_at=NOW - 3600,
    step=500,
    total_steps=1000,
    eta_seconds=100.0,
    eta_rate=5.0,
    eta_at=NOW - 2,
)


@pytest.mark.parametrize(
    ("changes", "step", "due"),
    [
        ({}, 510, False),  # known, fresh: counted down by the views
        ({"eta_at": NOW - ESTIMATE_EVERY_S}, 510, True),  # stale
        ({"eta_at": None}, 510, True),  # never estimated
        ({"state": "pending"}, 510, True),  # first report
        ({"started_at": NOW - YOUNG_S / 2}, 510, True),  # young job: every report
        ({"eta_rate": None}, 510, True),  # incomplete and the step moved
        ({"eta_rate": None}, 500, False),  # incomplete but stalled: heartbeats do not pay for it
        ({"eta_seconds": None}, 510, True),  # total known, ETA not yet
        ({"eta_seconds": None, "total_steps": None}, 510, False),  # no total: no ETA to wait for
    ],
)
def test_estimate_due(changes: dict[str, object], step: int, due: bool) -> None:
    assert estimate_due(dataclasses.replace(OLD, **changes), NOW, step) is due
