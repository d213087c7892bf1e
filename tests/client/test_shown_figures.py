"""The SDK reads the figures the server computed (issue 30 item 2): the loss the tables show (the latest
window's mean), the time each health span covers; nothing is recomputed on this side."""

from __future__ import annotations

import math

from stepwatch.client import Job
from stepwatch.client._job import Columns

VIEW = {
    "namespace": "ns",
    "name": "bert",
    "attempt": 1,
    "state": "running",
    "progress": {"percent": 9.9, "step": 996, "total_steps": 10_000, "steps_per_second": None},
    "metrics": {"loss": 0.5, "eval_loss": "NaN"},
    "metric_means": {"loss": 0.625, "eval_loss": "NaN"},
    "health_history": [
        {"state": "healthy", "from": 20.0, "since": 20.0, "to": 50.0, "start": 10.0, "end": 40.0, "seconds": 30.0},
        {"state": "stalled", "from": 50.0, "since": 40.0, "to": None, "start": 40.0, "end": 90.0, "seconds": 50.0},
    ],
}


def test_the_loss_a_table_shows_is_the_window_mean() -> None:
    job = Job(VIEW)
    assert job.loss == 0.5 and job.loss_mean == 0.625
    assert math.isnan(job.metric_means["eval_loss"])
    older = Job({k: v for k, v in VIEW.items() if k != "metric_means"})  # a server that sends no means
    assert older.metric_means == {} and older.loss_mean == 0.5
    assert job.progress.steps_per_second is None and job.percent == 9.9  # as sent: no rate, the shown percent


def test_a_listed_job_reads_its_means_from_the_columns() -> None:
    columns = Columns(
        {
            "namespace": ["ns"],
            "name": ["bert"],
            "attempt": [1],
            "state": ["running"],
            "metrics": [{"loss": 0.5}],
            "metric_means": [{"loss": 0.625}],
        }
    )
    job = Job._listed(columns, 0, "ns", "bert", "running", 1)
    assert job.loss_mean == 0.625 and job.metric_means == {"loss": 0.625}


def test_each_span_says_the_time_it_covers() -> None:
    spans = Job(VIEW).health_history
    assert spans is not None
    assert [s.covers for s in spans] == [(10.0, 40.0), (40.0, 90.0)]
    assert [(s.start, s.end) for s in spans] == [(20.0, 50.0), (50.0, None)]  # as recorded
    assert sum(b - a for a, b in (s.covers for s in spans if s.covers)) == sum(s.seconds or 0 for s in spans)
