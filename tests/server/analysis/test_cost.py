"""Cost: GPUs x the price of a GPU hour; spent, projected at the ETA, wasted; totals."""

from __future__ import annotations

import pytest

from stepwatch.server.analysis.cost import Cost, job_cost, totals

HOUR = 3600.0


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # 8 GPUs at 4 USD: 32 USD an hour; two hours in, one to go
        ({"started_at": 0.0, "finished_at": None, "now": 2 * HOUR, "remaining_seconds": HOUR}, (32.0, 64.0, 96.0)),
        # ETA unknown: no projection while it runs
        ({"started_at": 0.0, "finished_at": None, "now": HOUR, "remaining_seconds": None}, (32.0, 32.0, None)),
        # ended after 90 minutes: projected is what was spent, the clock no longer counts
        ({"started_at": 0.0, "finished_at": 1.5 * HOUR, "now": 9 * HOUR, "remaining_seconds": 0.0}, (32.0, 48.0, 48.0)),
        # registered, not started: nothing spent yet
        ({"started_at": None, "finished_at": None, "now": HOUR, "remaining_seconds": None}, (32.0, 0.0, None)),
        # a clock that went back does not make money negative
        ({"started_at": 100.0, "finished_at": None, "now": 50.0, "remaining_seconds": 0.0}, (32.0, 0.0, 0.0)),
    ],
)
def test_spent_and_projected(kwargs: dict[str, float | None], expected: tuple[float | None, ...]) -> None:
    cost = job_cost(gpus=8, gpu_hour_cost=4.0, **kwargs)  # type: ignore[arg-type]
    assert (cost.rate_per_hour, cost.spent, cost.projected) == pytest.approx(expected)


def test_a_job_without_gpus_or_price_costs_unknown_not_nothing() -> None:
    for gpus, price in ((0, 4.0), (8, 0.0)):
        cost = job_cost(gpus=gpus, gpu_hour_cost=price, started_at=0.0, finished_at=None, now=HOUR, remaining_seconds=1)
        assert cost == Cost(None, None, None, None)
        assert cost.to_dict()["spent"] is None


def test_wasted_counts_from_when_the_job_stopped_doing_useful_work() -> None:
    common = {"gpus": 2, "gpu_hour_cost": 10.0, "started_at": 0.0, "remaining_seconds": None}
    # stopped learning one hour in; three hours in now: two hours wasted at 20 USD
    assert job_cost(**common, finished_at=None, now=3 * HOUR, wasted_since=HOUR).wasted == pytest.approx(40.0)
    # ... and it ended at 2.5 hours: the waste ends with it
    assert job_cost(**common, finished_at=2.5 * HOUR, now=9 * HOUR, wasted_since=HOUR).wasted == pytest.approx(30.0)
    assert job_cost(**common, finished_at=None, now=HOUR, healthy=True).wasted == 0.0
    assert job_cost(**common, finished_at=None, now=HOUR).wasted is None  # health unknown: nothing said


def test_totals_sum_what_is_known() -> None:
    a = job_cost(gpus=8, gpu_hour_cost=4.0, started_at=0.0, finished_at=None, now=HOUR, remaining_seconds=HOUR)
    b = job_cost(gpus=1, gpu_hour_cost=2.0, started_at=0.0, finished_at=None, now=HOUR, remaining_seconds=None)
    free = job_cost(gpus=0, gpu_hour_cost=0.0, started_at=0.0, finished_at=None, now=HOUR, remaining_seconds=None)
    t = totals([a, b, free])
    assert (t.jobs, t.priced) == (3, 2)
    assert (t.rate_per_hour, t.spent, t.projected, t.wasted) == pytest.approx((34.0, 34.0, 66.0, 0.0))
