"""The column form of job lists (``?form=columns``): the compact views of the item form, one array per field,
counted to the time of each answer; its parameter checks and its place in the OpenAPI document."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from stepwatch.server.store import Job
from stepwatch.server.views.serialisers import LIST_COLUMNS, CompactViews, job_view

BASE = Job(id=1, namespace="ns", name="j", attempt=1, state="pending", created_at=100.0, updated_at=100.0)
RUNNING = dataclasses.replace(
    BASE,
    id=2,
    state="running",
    started_at=110.0,
    last_report_at=150.0,
    step=500,
    total_steps=1000,
    eta_seconds=300.0,
    eta_rate=2.0,
    eta_at=150.0,
    last_metrics={"loss": math.nan, "grad_norm": math.inf, "lr": -math.inf, "acc": 0.5},
    health="diverging",
    health_since=140.0,
    health_evidence={"message": "loss is NaN", "observed": "NaN"},
)
PRICED = dataclasses.replace(RUNNING, id=3, gpus=8, gpu_hour_cost=4.0, health="healthy", health_evidence={})
STALLED = dataclasses.replace(PRICED, id=4, health="stalled", health_since=150.0)
FINISHED = dataclasses.replace(PRICED, id=5, state="finished", finished_at=400.0, step=1000)
FAILED = dataclasses.replace(RUNNING, id=6, state="failed", finished_at=200.0, reason="exit 1", exit_code=1)
PENDING_PRICED = dataclasses.replace(BASE, id=7, gpus=1, gpu_hour_cost=2.0)
JOBS = [BASE, RUNNING, PRICED, STALLED, FINISHED, FAILED, PENDING_PRICED]


def _flat(view: dict[str, Any]) -> dict[str, Any]:
    """A compact view as the columns name its values."""
    out: dict[str, Any] = {}
    for key, value in view.items():
        if isinstance(value, dict) and key not in ("metrics", "metric_means"):
            for sub, inner in value.items():
                if (key, sub) == ("health", "evidence"):
                    out["health.evidence"] = inner
                else:
                    out[f"{key}.{sub}"] = inner
        else:
            out[key] = value
    return out


def test_the_columns_are_the_compact_views_fields_in_order() -> None:
    for job in JOBS:
        assert tuple(_flat(job_view(job, 200.0, compact=True))) == LIST_COLUMNS


def test_columns_are_the_views_at_every_time() -> None:
    views = CompactViews()
    for now in (150.0, 151.5, 380.0, 7200.0):  # kept at the first, counted at the others
        columns = views.columns(JOBS, now)
        assert list(columns) == list(LIST_COLUMNS)
        for i, job in enumerate(JOBS):
            expected = _flat(job_view(job, now, compact=True))
            got = {name: columns[name][i] for name in LIST_COLUMNS}
            assert repr(got) == repr(expected), job.id  # repr: NaN equals NaN, 1 differs from 1.0
            assert _flat(views.view(job, now)) == got  # and the kept item form agrees


def test_a_new_version_of_a_job_has_new_columns() -> None:
    views = CompactViews()
    views.columns([PRICED], 200.0)
    changed = dataclasses.replace(PRICED, step=900, last_metrics={"loss": 0.25})
    columns = views.columns([changed], 201.0)
    assert list(columns["progress.step"]) == [900] and list(columns["metrics"]) == [{"loss": 0.25}]


def test_no_jobs_no_values() -> None:
    assert CompactViews().columns([], 1.0) == {name: [] for name in LIST_COLUMNS}


def test_the_api_answers_columns_of_the_same_views(api: Any, make_report: Any) -> None:
    for name, gpus in (("a", 0), ("b", 2), ("c", 1)):
        token = api.register(name, total_steps=100, gpus=gpus, gpu_hour_cost=3.0 if gpus else 0)
        api.report_ok(name, token, make_report(1, 10, {"loss": math.nan if name == "b" else 0.5}, total_steps=100))
    api.register("q", namespace="other")
    api.clock.advance(30)
    for params in ({}, {"sort": "name", "limit": 2, "offset": 1}, {"state": "running"}):
        for path in ("/api/v1/jobs", "/api/v1/namespaces/default/jobs"):
            items = api.jobs(path, **params)
            answer = api.jobs(path, form="columns", **params)
            assert answer["total"] == items["total"] and set(answer) == {"columns", "total"}
            columns = answer["columns"]
            assert list(columns) == list(LIST_COLUMNS)
            assert [{n: columns[n][i] for n in columns} for i in range(len(items["items"]))] == [
                _flat(v) for v in items["items"]
            ]
            assert all(len(c) == len(items["items"]) for c in columns.values())
        api.clock.advance(600)
    b = api.jobs(form="columns", text="b")["columns"]
    assert b["metrics"] == [{"loss": "NaN"}] and b["cost.spent"][0] > 0


@pytest.mark.parametrize(
    ("params", "says"),
    [({"form": "rows"}, "form must be items or columns"), ({"form": "columns", "full": "1"}, "full views")],
)
def test_a_bad_form_is_a_400(api: Any, params: dict[str, str], says: str) -> None:
    response = api.client.get("/api/v1/jobs", params=params)
    assert response.status_code == 400 and says in response.json()["message"]
    assert response.json()["details"]["field"] == "form"


def test_openapi_describes_the_column_form(api: Any) -> None:
    document = api.client.get("/openapi.json").json()
    for path in ("/api/v1/jobs", "/api/v1/namespaces/{namespace}/jobs"):
        get = document["paths"][path]["get"]
        form = next(p for p in get["parameters"] if p["name"] == "form")
        assert form["schema"]["enum"] == ["items", "columns"]
        forms = get["responses"]["200"]["content"]["application/json"]["schema"]["oneOf"]
        assert {f["$ref"].rsplit("/", 1)[1] for f in forms} == {"JobList", "JobColumns"}
    schema = document["components"]["schemas"]["JobColumns"]
    assert schema["properties"]["columns"]["required"] == list(LIST_COLUMNS)
