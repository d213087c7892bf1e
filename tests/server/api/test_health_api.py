"""Health through the API: judged at ingest, swept for stalls, kept in the job view, events and filters.

The analysis itself is tested on curves in ``test_health.py``; these tests drive a real app (in-process,
a real SQLite file, a fake clock) with reports and check what users see.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from stepwatch.server import ServerSettings, create_app
from stepwatch.server.ingest import health_monitor as server_health
from stepwatch.server.store import Store
from stepwatch.server.store.offload import blocking

pytestmark = pytest.mark.both_stores

MakeReport = Callable[..., dict[str, Any]]


def _sweep(api: Any) -> int:
    """One health sweep on the app's own event loop (what the server does every few seconds)."""
    svc = api.client.app.state.services
    changed: int = api.client.portal.call(
        server_health.sweep_once, svc.health, svc.store, svc.live, blocking, api.clock.now
    )
    return changed


def _health_events(api: Any, name: str) -> list[dict[str, Any]]:
    return [e for e in api.events(name) if e["kind"] == "health"]


def _report_every(api: Any, name: str, token: str, make_report: MakeReport, losses: list[float], seq: int = 1) -> int:
    """Report one loss per 2 s, one step per report; the next sequence number."""
    for i, loss in enumerate(losses):
        api.clock.advance(2)
        api.report_ok(name, token, make_report(seq + i, seq + i, {"loss": loss}))
    return seq + len(losses)


def test_a_nan_loss_makes_the_job_diverging_at_once_with_its_evidence(api: Any, make_report: MakeReport) -> None:
    token = api.register("nan")
    api.clock.advance(1)
    api.report_ok("nan", token, make_report(1, 10, {"loss": 0.9}))
    assert api.job("nan")["health"]["state"] == "healthy"
    assert _health_events(api, "nan") == []  # the first verdict "healthy" is not news
    assert api.job("nan")["cost"]["wasted"] is None  # no GPUs, no price: unknown, not free
    api.clock.advance(2)
    api.report_ok("nan", token, make_report(2, 20, {"loss": [0.8, math.nan]}))
    health = api.job("nan")["health"]
    assert health["state"] == "diverging"
    assert health["since"] == api.clock.now
    assert health["evidence"]["metric"] == "loss" and health["evidence"]["message"]
    (event,) = _health_events(api, "nan")
    assert event["data"]["health"] == "diverging"
    assert [j["name"] for j in api.jobs(health="diverging")["items"]] == ["nan"]
    assert api.jobs(health="healthy")["items"] == []


def test_a_silent_job_is_stalled_by_the_sweep_and_recovers_when_it_reports(api: Any, make_report: MakeReport) -> None:
    token = api.register("quiet")
    seq = _report_every(api, "quiet", token, make_report, [1.0 - 0.001 * i for i in range(30)])
    assert api.job("quiet")["health"]["state"] == "healthy"
    api.clock.advance(15)
    assert _sweep(api) == 0  # a short silence (a retry, a blip) is no stall
    api.clock.advance(30)
    assert _sweep(api) == 1
    health = api.job("quiet")["health"]
    assert health["state"] == "stalled"
    assert health["evidence"]["message"]
    assert _sweep(api) == 0  # a change is recorded once
    _report_every(api, "quiet", token, make_report, [0.9], seq=seq)
    assert api.job("quiet")["health"]["state"] == "healthy"
    assert [e["data"]["health"] for e in _health_events(api, "quiet")] == ["stalled", "healthy"]


def test_a_finished_job_is_not_swept_into_a_stall(api: Any, make_report: MakeReport) -> None:
    token = api.register("done")
    seq = _report_every(api, "done", token, make_report, [1.0, 0.9, 0.8])
    api.clock.advance(2)
    api.report_ok("done", token, make_report(seq, seq, {"loss": 0.7}, state="finished"))
    api.clock.advance(3600)
    assert _sweep(api) == 0
    assert api.job("done")["health"]["state"] == "healthy"
    assert len(api.client.app.state.services.health) == 0  # its tracker is gone


def test_a_plateau_is_not_learning_and_a_restarted_server_remembers_it(
    api: Any, make_report: MakeReport, store: Store, database: Any
) -> None:
    token = api.register("flat", gpus=2, gpu_hour_cost=3.0)
    learning = [2.0 * math.exp(-i / 60) + 0.5 for i in range(300)]  # 10 minutes of learning
    flat = [0.5 + 0.002 * math.sin(i) for i in range(600)]  # then 20 minutes flat
    seq = _report_every(api, "flat", token, make_report, learning + flat)
    health = api.job("flat")["health"]
    assert health["state"] == "not_learning"
    evidence = health["evidence"]
    assert evidence["metric"] == "loss"
    assert {"window", "threshold"} <= set(evidence)
    assert health["since"] < api.clock.now - 300  # since the last real improvement, not since the alarm
    events = _health_events(api, "flat")
    assert [e["data"]["health"] for e in events] == ["not_learning"]
    cost = api.job("flat")["cost"]
    assert cost["wasted_since"] == health["since"]
    assert cost["wasted"] == pytest.approx((api.clock.now - health["since"]) / 3600 * 6.0)
    assert 0 < cost["wasted"] < cost["spent"]

    # a new server on the same database: the first report rebuilds the tracker from stored history
    with TestClient(
        create_app(ServerSettings(allowed_hosts=("testserver",)), store=database.open(), clock=api.clock),
        raise_server_exceptions=False,
    ) as again:
        api.clock.advance(2)
        sent = again.post(
            f"{api.job_path('flat')}/reports",
            json=make_report(seq, seq, {"loss": 0.5}),
            headers={"Authorization": f"Bearer {token}"},
        )
        assert sent.status_code == 200, sent.text
        assert again.get(api.job_path("flat")).json()["health"]["state"] == "not_learning"
    assert len(_health_events(api, "flat")) == 1  # no second alarm for the same plateau


def test_a_failing_analysis_costs_the_report_nothing(
    api: Any, make_report: MakeReport, monkeypatch: Any, caplog: Any
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("analysis bug")

    monkeypatch.setattr(server_health.HealthTracker, "observe_progress", broken)
    token = api.register("fragile")
    for seq in (1, 2, 3):
        api.clock.advance(2)
        api.report_ok("fragile", token, make_report(seq, seq * 10, {"loss": 1.0 / seq}))
    job = api.job("fragile")
    assert job["progress"]["step"] == 30 and len(api.history("fragile")["loss"]) == 3
    assert [r.message for r in caplog.records].count(
        "health analysis of default/fragile failed; its reports are stored all the same"
    ) == 1  # logged once per job, not once per report


def test_a_stall_says_whether_the_gpus_are_idle(api: Any, make_report: MakeReport) -> None:
    """GPU readings (what the report core reads through NVML) are kept per rank and are evidence for a stall."""
    token = api.register("gpu")
    busy = [{"index": 0, "utilization": 97.0, "memory_used": 30 << 30, "memory_total": 80 << 30}]
    idle = [{"index": 0, "utilization": 0.0, "memory_used": 30 << 30, "memory_total": 80 << 30}]
    for seq in range(1, 31):
        api.clock.advance(2)
        body = make_report(seq, seq, {"loss": 1.0 - seq / 100})
        body["gpus"] = busy if seq < 25 else idle
        api.report_ok("gpu", token, body)
    assert api.job("gpu")["ranks"][0]["gpus"] == idle
    api.clock.advance(60)
    assert _sweep(api) == 1
    evidence = api.job("gpu")["health"]["evidence"]
    assert evidence["gpus_idle"] is True and evidence["gpu_utilization"] == {"0": 0.0}
    assert evidence["message"].endswith("its GPUs are idle (0% utilisation)")


@pytest.mark.parametrize(
    ("gpus", "field"),
    [
        ([{"index": 0, "utilization": 101}], "gpus[0].utilization"),
        ([{"index": 0, "utilization": "NaN"}], "gpus[0].utilization"),
        ([{"utilization": 5}], "gpus[0].index"),
        ([{"index": 0, "memory_used": -1}], "gpus[0].memory_used"),
        ([{"index": i} for i in range(65)], "gpus"),
        ({"index": 0}, "gpus"),
    ],
)
def test_bad_gpu_readings_are_refused(api: Any, make_report: MakeReport, gpus: Any, field: str) -> None:
    token = api.register("bad-gpu")
    body = make_report(1, 1, {"loss": 1.0})
    body["gpus"] = gpus
    answer = api.report("bad-gpu", token, body)
    assert answer.status_code == 422 and answer.json()["details"]["field"] == field
    assert api.job("bad-gpu")["state"] == "pending"  # nothing of the refused report was stored


def test_a_job_without_a_loss_is_never_called_diverging_or_not_learning(api: Any, make_report: MakeReport) -> None:
    """No primary metric: health stays unknown however its other metrics behave (no alarm without data)."""
    token = api.register("noloss")
    for seq in range(1, 400):
        api.clock.advance(2)
        value = math.nan if seq % 50 == 0 else 0.5  # NaN now and then, and flat: a plateau of nothing known
        api.report_ok("noloss", token, make_report(seq, seq, {"accuracy": value}))
    assert api.job("noloss")["health"]["state"] == "unknown"
    assert _health_events(api, "noloss") == []


def test_after_a_restart_a_silent_job_is_stalled_without_replaying_its_history(
    api: Any, make_report: MakeReport, database: Any
) -> None:
    token = api.register("quiet-restart")
    _report_every(api, "quiet-restart", token, make_report, [1.0, 0.9, 0.8])
    with TestClient(
        create_app(ServerSettings(allowed_hosts=("testserver",)), store=database.open(), clock=api.clock),
        raise_server_exceptions=False,
    ) as again:
        svc = again.app.state.services

        def sweep() -> int:
            changed: int = again.portal.call(
                server_health.sweep_once, svc.health, svc.store, svc.live, blocking, api.clock.now
            )  # type: ignore[union-attr]
            return changed

        api.clock.advance(60)
        assert sweep() == 0 and len(svc.health) == 0  # silent a minute: not yet, and nothing replayed
        api.clock.advance(70)
        assert sweep() == 1
        health = again.get(api.job_path("quiet-restart")).json()["health"]
        assert health["state"] == "stalled" and health["evidence"]["message"].startswith("no report for 13")


def test_an_evaluation_the_reports_announce_is_no_stall_and_a_hang_after_it_is(
    api: Any, make_report: MakeReport
) -> None:
    """A 60 s evaluation (step standing, ``progress.phase: eval``) through the real ingest path is not
    stalled, the first one included; a hang right after it (phase training, step standing) is, within 45 s."""
    token = api.register("evals")
    seq = _report_every(api, "evals", token, make_report, [1.0 - 0.001 * i for i in range(30)])
    step = seq - 1
    for n in range(30):  # 60 s of evaluation, swept as the server does
        api.clock.advance(2)
        body = make_report(seq, step, {})
        body["progress"].update(phase="eval", phase_seconds=2.0 * (n + 1))
        api.report_ok("evals", token, body)
        seq += 1
        _sweep(api)
        assert api.job("evals")["health"]["state"] == "healthy"
    seq = _report_every(api, "evals", token, make_report, [0.9] * 5, seq=seq)
    assert [e["data"]["health"] for e in _health_events(api, "evals")] == []
    stuck = seq - 1
    for _ in range(25):  # training again, the step stands: a hang
        api.clock.advance(2)
        api.report_ok("evals", token, make_report(seq, stuck, {}))
        seq += 1
        _sweep(api)
    health = api.job("evals")["health"]
    assert health["state"] == "stalled" and health["evidence"]["metric"] == "step"


@pytest.mark.parametrize(
    ("progress", "field"),
    [({"phase": "testing"}, "progress.phase"), ({"phase": "eval", "phase_seconds": -1}, "progress.phase_seconds")],
)
def test_a_bad_phase_is_refused(api: Any, make_report: MakeReport, progress: dict[str, Any], field: str) -> None:
    token = api.register("bad-phase")
    body = make_report(1, 1, {"loss": 1.0})
    body["progress"].update(progress)
    answer = api.report("bad-phase", token, body)
    assert answer.status_code == 422 and answer.json()["details"]["field"] == field


def test_a_stalls_evidence_follows_the_job_and_an_ended_jobs_health_is_a_final_judgement(
    api: Any, make_report: MakeReport
) -> None:
    """Issue 30: a job stalled for minutes does not keep saying how it stood when it was first flagged;
    its evidence is rewritten (no new event), and at its end its health reads as a judgement of its end."""
    token = api.register("follow")
    seq = _report_every(api, "follow", token, make_report, [1.0 - 0.001 * i for i in range(30)])
    api.clock.advance(45)
    assert _sweep(api) == 1
    first = api.job("follow")["health"]["evidence"]["message"]
    assert first.startswith("no report from rank 0 for 45 s")
    api.clock.advance(10)
    assert _sweep(api) == 0  # rewritten at most every 30 s
    api.clock.advance(60)
    assert _sweep(api) == 1
    later = api.job("follow")["health"]
    assert later["state"] == "stalled"
    assert later["evidence"]["message"].startswith("no report from rank 0 for 115 s")
    assert [e["data"]["health"] for e in _health_events(api, "follow")] == ["stalled"]  # one event, not two
    _report_every(api, "follow", token, make_report, [0.9], seq=seq)
    api.clock.advance(2)
    api.report_ok("follow", token, make_report(seq + 1, seq + 1, {"loss": 0.85}, state="finished"))
    ended = api.job("follow")["health"]
    assert ended["state"] == "healthy"
    assert ended["evidence"]["message"].startswith(f"finished at step {seq + 1}, healthy to its end: ")
    assert "too few windows" not in ended["evidence"]["message"]
