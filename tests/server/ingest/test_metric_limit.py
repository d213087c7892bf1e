"""The limit on distinct metric names per job, written as the attack of issue 21 (item 2): one job's
write token sends 256 new names a report; the server must stop its growth with a clear 422, keep
what it accepted, go on taking the job's reports of the names it has, and serve everyone else as before.
Both stores (real SQLite file, real PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.applications import Starlette

from stepwatch.server.app import create_app
from stepwatch.server.settings import ServerSettings
from stepwatch.server.store import Store

pytestmark = pytest.mark.both_stores

LIMIT = 600


@pytest.fixture
def app(store: Store, clock: Any) -> Starlette:
    """The ``api`` fixture's server, with the limit lowered (the default is 1,024)."""
    return create_app(ServerSettings(max_metric_names=LIMIT, allowed_hosts=("testserver",)), store=store, clock=clock)


def _names(report: int, count: int = 256) -> dict[str, float]:
    return {f"attack/r{report:04d}/m{i:03d}": float(i) for i in range(count)}


def _send(api: Any, name: str, token: str, body: dict[str, Any]) -> int:
    """A report's status, a second and a half later (a refused one holds the job's next back for 1 s)."""
    code: int = api.report(name, token, body).status_code
    api.clock.advance(1.5)
    return code


def test_new_names_beyond_the_limit_are_refused_with_422_and_nothing_accepted_is_lost(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    token = api.register("attacked")
    answers = []
    for seq in range(4):
        answers.append(api.report("attacked", token, make_report(seq, seq, _names(seq))))
        api.clock.advance(1.5)
    assert [a.status_code for a in answers] == [200, 200, 422, 422]  # 256, 512, then 768 > 600
    body = answers[2].json()
    assert body["code"] == 422 and body["details"] == {"field": "metrics"}
    assert "512 distinct metric names" in body["message"] and f"limit is {LIMIT}" in body["message"]
    assert "STEPWATCH_MAX_METRIC_NAMES" in body["message"]
    view = api.job("attacked")
    assert len(view["metric_names"]) == 512 and len(view["metrics"]) == 512
    assert view["progress"]["step"] == 1  # the refused reports moved nothing
    # the job goes on with the names it has, and may add new ones up to the limit exactly
    known = dict(list(_names(0).items())[:3])
    assert _send(api, "attacked", token, make_report(10, 10, known)) == 200
    fill = _names(11, LIMIT - 512)
    assert _send(api, "attacked", token, make_report(11, 11, {**known, **fill})) == 200
    assert _send(api, "attacked", token, make_report(12, 12, {"one/more": 1.0})) == 422
    view = api.job("attacked")
    assert len(view["metric_names"]) == LIMIT and view["progress"]["step"] == 11
    assert api.history("attacked", metrics="attack/r0000/m000")["attack/r0000/m000"][-1]["last"] == 0.0
    assert api.client.get("/healthz").json()["stats"]["over_limit"] == 3


def test_late_reports_count_their_names_too(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    """A report older than the newest (by the reporter's clock) is history only; its new names must
    still count, or sending reports back in time would bypass the limit."""
    token = api.register("late")
    assert _send(api, "late", token, make_report(100, 100, {"loss": 1.0}, sent_at=10_000.0)) == 200
    codes = [_send(api, "late", token, make_report(seq, seq, _names(seq), sent_at=1_000.0 + seq)) for seq in range(4)]
    assert codes == [200, 200, 422, 422]
    view = api.job("late")
    assert len(view["metric_names"]) == 513
    assert view["metrics"]["loss"] == 1.0 and view["progress"]["step"] == 100  # the newest stays the latest


def test_kubeflow_status_over_the_limit_is_a_422_status(api: Any) -> None:
    token = api.register("kf")

    def status(report: int) -> dict[str, Any]:
        metrics = [{"name": n, "value": str(v)} for n, v in _names(report).items()]
        at = "2026-01-01T00:00:00Z"
        return {"trainerStatus": {"progressPercentage": 5, "metrics": metrics, "lastUpdatedTime": at}}

    codes = [api.kubeflow("kf", token, status(i)).status_code for i in range(3)]
    assert codes == [200, 200, 422]
    refused = api.kubeflow("kf", token, status(3)).json()
    assert refused["kind"] == "Status" and refused["code"] == 422 and "limit is 600" in refused["message"]
    assert len(api.job("kf")["metric_names"]) == 512


def test_another_job_is_not_limited_by_the_attacker(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    attacker, other = api.register("attacker"), api.register("other")
    for seq in range(3):
        api.report("attacker", attacker, make_report(seq, seq, _names(seq)))
    assert api.report("other", other, make_report(0, 0, _names(0))).status_code == 200  # no clock moved
    assert api.report("other", other, make_report(1, 1, {"loss": 0.5})).status_code == 200
    assert len(api.job("other")["metric_names"]) == 257


def test_a_flood_of_refused_reports_is_held_back_with_429_before_its_bodies_are_read(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    token = api.register("flood")
    for seq in range(3):
        _send(api, "flood", token, make_report(seq, seq, _names(seq)))  # the third is refused
    assert api.report("flood", token, make_report(3, 3, _names(3))).status_code == 422
    held = api.report("flood", token, make_report(4, 4, {"attack/r0000/m000": 1.0}))
    assert held.status_code == 429 and held.headers["retry-after"] == "1"
    assert "limit on metric names" in held.json()["message"]
    api.clock.advance(1.1)  # the report core retries after Retry-After: then the job is read again
    assert api.report("flood", token, make_report(4, 4, {"attack/r0000/m000": 1.0})).status_code == 200
