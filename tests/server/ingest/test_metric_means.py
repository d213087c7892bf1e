"""A job's per-metric window means (``Job.metric_means``): the mean of each metric's latest window,
stored with the job on both stores, kept by the cache, and read back after the store is opened again."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from stepwatch.server.store import Store

MakeReport = Callable[..., dict[str, Any]]

pytestmark = pytest.mark.both_stores


def _job(store: Store, name: str) -> Any:
    job = store.job("default", name)
    assert job is not None
    return job


def test_the_means_follow_each_metrics_latest_window(api: Any, store: Store, make_report: MakeReport) -> None:
    token = api.register("means")
    api.report_ok("means", token, make_report(0, 10, {"loss": [4.0, 2.0], "lr": 0.1}))
    job = _job(store, "means")
    assert job.metric_means == {"loss": 3.0, "lr": 0.1}
    assert job.last_metrics == {"loss": 2.0, "lr": 0.1}
    # a later window replaces its metric's mean; a metric this report lacks keeps its own
    api.report_ok("means", token, make_report(1, 20, {"loss": [1.0, 0.5, 0.0]}))
    job = _job(store, "means")
    assert job.metric_means == {"loss": 0.5, "lr": 0.1} and job.last_metrics == {"loss": 0.0, "lr": 0.1}
    # a window with no finite value has no mean: the job shows its last (divergence stays visible)
    api.report_ok("means", token, make_report(2, 30, {"loss": [math.nan, math.inf]}))
    assert _job(store, "means").metric_means["loss"] == math.inf
    api.report_ok("means", token, make_report(3, 40, {"loss": [math.inf, math.nan]}))
    assert math.isnan(_job(store, "means").metric_means["loss"])


def test_a_late_report_adds_its_names_but_not_its_means(api: Any, store: Store, make_report: MakeReport) -> None:
    token = api.register("late")
    api.report_ok("late", token, make_report(5, 50, {"loss": [1.0, 3.0]}, sent_at=2_000_000_000.0))
    api.report_ok("late", token, make_report(4, 40, {"loss": [9.0], "acc": [0.2, 0.4]}, sent_at=1_999_999_999.0))
    job = _job(store, "late")
    assert job.metric_means == {"loss": 2.0, "acc": pytest.approx(0.3)}
    assert set(job.metric_means) == set(job.last_metrics)


def test_the_means_are_stored_with_the_job(api: Any, store: Store, make_report: MakeReport) -> None:
    token = api.register("kept")
    api.report_ok("kept", token, make_report(0, 10, {"loss": [2.0, 4.0]}))
    assert _job(store, "kept").metric_means == {"loss": 3.0}  # the cache's
    assert store.job("default", "kept", attempt=1).metric_means == {"loss": 3.0}  # type: ignore[union-attr]  # the row's
    view = api.client.get(api.job_path("kept")).json()
    assert view["metric_means"] == {"loss": 3.0} and view["metrics"] == {"loss": 4.0}


def test_an_upstream_status_gives_each_numeric_metric_as_its_own_mean(api: Any, store: Store) -> None:
    token = api.register("upstream")
    body = {
        "trainerStatus": {
            "progressPercentage": 10,
            "metrics": [{"name": "loss", "value": "0.25"}, {"name": "note", "value": "warm"}],
            "lastUpdatedTime": "2027-01-15T08:00:00Z",
        }
    }
    assert api.kubeflow("upstream", token, body).status_code == 200
    assert _job(store, "upstream").metric_means == {"loss": 0.25}
