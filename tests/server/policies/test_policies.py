"""Policies: parsing and layering (tables), decisions (pure, tables), and actions through the API."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from stepwatch.server.analysis.cost import Cost
from stepwatch.server.ingest import health_monitor as server_health
from stepwatch.server.policies import Policy, PolicyError, decide, parse_policy, rearmed
from stepwatch.server.store import Job
from stepwatch.server.store.offload import blocking

pytestmark = pytest.mark.both_stores

MakeReport = Callable[..., dict[str, Any]]
NOW = 1_800_000_000.0


# ------------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "policy"),
        ({"when": {}}, "when"),
        ({"on": []}, "on"),
        ({"on": {"bored": "stop"}}, "on.bored"),
        ({"on": {"stalled": "explode"}}, "on.stalled"),
        ({"on": {"finished": "stop"}}, "on.finished"),
        ({"on": {"late": "checkpoint_stop"}}, "on.late"),
        ({"budget": -1}, "budget"),
        ({"budget": 0}, "budget"),
        ({"budget": math.inf}, "budget"),
        ({"budget": True}, "budget"),
        ({"budget": "100"}, "budget"),
        ({"deadline": "tomorrow"}, "deadline"),
        ({"deadline": "2026-12-07T09:00:00"}, "deadline"),
        ({"deadline": -5}, "deadline"),
        ({"dry_run": "yes"}, "dry_run"),
        ({"metric": ""}, "metric"),
        ({"metric": "a\nb"}, "metric"),
        ({"mode": "lower"}, "mode"),
        ({"notify": "https://x"}, "notify"),
        ({"notify": ["https://x"] * 9}, "notify"),
    ],
)
def test_a_bad_policy_names_its_field(body: Any, field: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(body)
    assert caught.value.field == field
    assert caught.value.message


def test_a_policy_reads_back_as_it_was_said() -> None:
    said = {
        "on": {"not_learning": "checkpoint_stop", "diverging": "stop", "finished": "notify"},
        "budget": 250,
        "deadline": "2027-01-15T08:00:00Z",
        "dry_run": True,
        "metric": "eval/loss",
        "mode": "min",
        "notify": ["https://hooks.example.com/a"],
    }
    policy = parse_policy(said)
    assert policy.deadline == datetime(2027, 1, 15, 8, tzinfo=timezone.utc).timestamp()
    out = policy.to_dict()
    assert out["on"] == {"not_learning": "checkpoint_stop", "diverging": "stop", "finished": "notify"}
    assert (out["budget"], out["dry_run"], out["metric"], out["notify"]) == (250.0, True, "eval/loss", said["notify"])
    assert parse_policy(out) == policy


def test_layers_lay_over_each_other_key_by_key() -> None:
    server = parse_policy({"on": {"diverging": "notify", "stalled": "notify"}, "notify": ["https://a"]})
    namespace = parse_policy({"on": {"diverging": "stop"}, "budget": 100, "notify": ["https://b"]})
    job = parse_policy({"on": {"stalled": "none", "not_learning": "checkpoint_stop"}, "budget": 50})
    effective = job.over(namespace.over(server.with_origin("server"), "namespace"), "job")
    assert effective.on == {"diverging": "stop", "stalled": "none", "not_learning": "checkpoint_stop"}
    assert effective.origin == {"diverging": "namespace", "stalled": "job", "not_learning": "job"}
    assert effective.budget == 50 and effective.notify == ("https://a", "https://b")


# ------------------------------------------------------------------------------------ decisions


def _job(**fields: Any) -> Job:
    base = Job(id=1, namespace="ns", name="j", attempt=1, state="running", created_at=NOW - 7200, updated_at=NOW)
    return replace(base, started_at=NOW - 7200, **fields)


PRICED = Cost(rate_per_hour=10.0, spent=20.0, projected=30.0, wasted=5.0)
UNPRICED = Cost(None, None, None, None)


@pytest.mark.parametrize(
    ("policy", "job", "cost", "remaining", "expected"),
    [
        # health triggers act with their action, stops save the rest at the cost rate
        (
            {"on": {"not_learning": "checkpoint_stop"}},
            {"health": "not_learning"},
            PRICED,
            3600,
            [("not_learning", "checkpoint_stop", 10.0)],
        ),
        ({"on": {"diverging": "stop"}}, {"health": "diverging"}, PRICED, None, [("diverging", "stop", None)]),
        ({"on": {"stalled": "notify"}}, {"health": "stalled"}, UNPRICED, None, [("stalled", "notify", None)]),
        ({"on": {"stalled": "notify"}}, {"health": "healthy"}, PRICED, None, []),
        ({"on": {"stalled": "none"}}, {"health": "stalled"}, PRICED, None, []),
        # acted once: the trigger is in policy_fired
        (
            {"on": {"stalled": "stop"}},
            {"health": "stalled", "policy_fired": {"stalled": {"action": "stop"}}},
            PRICED,
            None,
            [],
        ),
        # a job being stopped is not stopped twice: later triggers only notify
        (
            {"on": {"diverging": "stop", "over_budget": "checkpoint_stop"}, "budget": 15},
            {"health": "diverging"},
            PRICED,
            None,
            [("diverging", "stop", None), ("over_budget", "notify", None)],
        ),
        ({"on": {"over_budget": "stop"}, "budget": 25}, {}, PRICED, None, []),
        ({"on": {"over_budget": "stop"}, "budget": 20}, {}, PRICED, None, [("over_budget", "stop", None)]),
        ({"on": {"over_budget": "stop"}, "budget": 20}, {}, UNPRICED, None, []),
        # deadlines: past it, or an ETA past it
        (
            {"on": {"past_deadline": "checkpoint_stop"}, "deadline": NOW - 1},
            {},
            PRICED,
            600,
            [("past_deadline", "checkpoint_stop", 10 / 6)],
        ),
        ({"on": {"late": "notify"}, "deadline": NOW + 600}, {}, PRICED, 601, [("late", "notify", None)]),
        ({"on": {"late": "notify"}, "deadline": NOW + 600}, {}, PRICED, 599, []),
        ({"on": {"late": "notify"}, "deadline": NOW + 600}, {}, PRICED, None, []),
        # ended jobs: notified, never stopped
        (
            {"on": {"finished": "notify", "failed": "notify"}},
            {"state": "finished"},
            PRICED,
            None,
            [("finished", "notify", None)],
        ),
        (
            {"on": {"diverging": "stop"}, "deadline": NOW - 5},
            {"state": "failed", "health": "diverging"},
            PRICED,
            None,
            [],
        ),
        (
            {"on": {"over_budget": "stop"}, "budget": 1},
            {"state": "stopped"},
            PRICED,
            None,
            [("over_budget", "notify", None)],
        ),
    ],
)
def test_decisions(
    policy: dict[str, Any], job: dict[str, Any], cost: Cost, remaining: float | None, expected: list[tuple[Any, ...]]
) -> None:
    decisions = decide(parse_policy(policy), _job(**job), cost, remaining, NOW)
    assert [(d.trigger, d.action, d.saved) for d in decisions] == [pytest.approx(e) for e in expected]


def test_a_dry_run_queues_nothing_and_says_what_it_would_do() -> None:
    policy = parse_policy({"on": {"not_learning": "checkpoint_stop"}, "dry_run": True}).with_origin("namespace")
    (decision,) = decide(policy, _job(health="not_learning"), PRICED, 60, NOW)
    assert decision.commands == ()
    assert decision.message.startswith("dry run: would checkpoint, then stop (by the namespace policy)")
    assert decision.fired(NOW)["dry_run"] is True
    live = replace(decision, dry_run=False)
    assert [kind for kind, _ in live.commands] == ["checkpoint", "stop"]


def test_a_healthy_job_rearms_its_health_triggers_only() -> None:
    fired = {"stalled": {}, "over_budget": {}, "not_learning": {}}
    assert rearmed(_job(health="healthy", policy_fired=fired)) == ("stalled", "not_learning")
    assert rearmed(_job(health="stalled", policy_fired=fired)) == ()


# ------------------------------------------------------------------------------------ the API


def _events(api: Any, name: str, kind: str, namespace: str = "default") -> list[dict[str, Any]]:
    return [e for e in api.events(name, namespace) if e["kind"] == kind]


def test_a_diverging_job_with_a_policy_is_told_to_checkpoint_then_stop(api: Any, make_report: MakeReport) -> None:
    policy = {"on": {"diverging": "checkpoint_stop"}}
    token = api.register("blowup", gpus=4, gpu_hour_cost=2.5, total_steps=1000, policy=policy)
    for seq in range(1, 8):
        api.clock.advance(2)
        answer = api.report_ok("blowup", token, make_report(seq, seq * 10, {"loss": 1.0 / seq}, total_steps=1000))
        assert answer["commands"] == []
    api.clock.advance(2)
    answer = api.report_ok("blowup", token, make_report(8, 80, {"loss": math.nan}, total_steps=1000))
    assert [c["kind"] for c in answer["commands"]] == ["checkpoint", "stop"]
    assert all(c["reason"].startswith("policy: ") for c in answer["commands"])
    (event,) = _events(api, "blowup", "policy")
    assert event["message"].startswith("checkpoint, then stop (by the job policy): ")
    assert event["data"]["trigger"] == "diverging" and event["data"]["dry_run"] is False
    job = api.job("blowup")
    assert job["policy"]["fired"]["diverging"]["action"] == "checkpoint_stop"
    assert job["policy"]["set_by"] == {"diverging": "job"}
    assert job["cost"]["saved"] == pytest.approx(event["data"]["saved"]) and job["cost"]["saved"] > 0
    # the next reports do not act again
    api.clock.advance(2)
    again = api.report_ok("blowup", token, make_report(9, 90, {"loss": math.nan}, total_steps=1000))
    assert [c["kind"] for c in again["commands"]] == ["checkpoint", "stop"]  # still pending, not queued twice
    assert len(_events(api, "blowup", "policy")) == 1


def test_a_namespace_dry_run_records_what_would_have_happened(api: Any, make_report: MakeReport) -> None:
    put = api.client.put(
        "/api/v1/namespaces/team/policy", json={"on": {"diverging": "stop", "finished": "notify"}, "dry_run": True}
    )
    assert put.status_code == 200, put.text
    assert put.json()["effective"] == {"on": {"diverging": "stop", "finished": "notify"}, "dry_run": True}
    token = api.register("trial", namespace="team")
    api.clock.advance(2)
    answer = api.report_ok("trial", token, make_report(1, 10, {"loss": [0.5, math.inf]}), namespace="team")
    assert answer["commands"] == []
    (event,) = _events(api, "trial", "policy", "team")
    assert event["message"].startswith("dry run: would stop (by the namespace policy)")
    api.clock.advance(2)
    api.report_ok("trial", token, make_report(2, 20, {"loss": 0.4}, state="finished"), namespace="team")
    assert [e["data"]["trigger"] for e in _events(api, "trial", "policy", "team")] == ["diverging", "finished"]
    assert api.job("trial", namespace="team")["cost"]["saved"] is None  # a dry run saves nothing
    cleared = api.client.put("/api/v1/namespaces/team/policy", json={})
    assert cleared.json()["policy"] == {} and api.client.get("/api/v1/namespaces/team/policy").json()["policy"] == {}


def test_a_job_policy_set_later_acts_at_once_and_bad_ones_are_refused(api: Any, make_report: MakeReport) -> None:
    token = api.register("late", gpus=1, gpu_hour_cost=36.0)
    api.clock.advance(1)
    api.report_ok("late", token, make_report(1, 10, {"loss": 1.0}))
    api.clock.advance(1800)
    api.report_ok("late", token, make_report(2, 20, {"loss": 0.9}))
    path = f"{api.job_path('late')}/policy"
    bad = api.client.put(path, json={"on": {"over_budget": "stop"}, "budget": "ten"})
    assert bad.status_code == 422 and bad.json()["details"]["field"] == "budget"
    assert api.client.put(path, json={"on": {"over_budget": "notify"}, "budget": 10}).status_code == 200
    (event,) = _events(api, "late", "policy")
    assert event["data"]["trigger"] == "over_budget"
    assert "spent 18.00 of a budget of 10.00" in event["message"]
    (change,) = _events(api, "late", "policy_set")  # set and acted: both on the timeline
    assert change["message"] == "policy set: over_budget notify"
    assert api.client.get(path).json()["job"] == {"on": {"over_budget": "notify"}, "budget": 10.0}
    bad_register = api.client.post(
        "/api/v1/namespaces/default/jobs", json={"name": "x", "policy": {"on": {"x": "stop"}}}
    )
    assert bad_register.status_code == 422
    assert bad_register.json()["details"]["field"] == "policy.on.x"


def test_the_sweep_applies_policies_to_jobs_that_went_quiet(api: Any, make_report: MakeReport) -> None:
    token = api.register("hang", policy={"on": {"stalled": "checkpoint_stop"}})
    for seq in range(1, 31):
        api.clock.advance(2)
        api.report_ok("hang", token, make_report(seq, seq, {"loss": 1.0 - seq / 100}))
    api.clock.advance(120)
    svc = api.client.app.state.services
    api.client.portal.call(
        server_health.sweep_once, svc.health, svc.store, svc.live, blocking, api.clock.now, svc.policies.review
    )
    assert api.job("hang")["health"]["state"] == "stalled"
    assert [c["kind"] for c in api.client.get(f"{api.job_path('hang')}/commands").json()["items"]] == [
        "checkpoint",
        "stop",
    ]
    # the runner sees the stop among the job's events (that is how `stepwatch run` enforces it)
    assert [e["data"]["kind"] for e in _events(api, "hang", "command")] == ["checkpoint", "stop"]


def test_a_policy_can_name_the_metric_health_follows(api: Any, make_report: MakeReport) -> None:
    token = api.register("acc", policy={"metric": "eval_auc", "mode": "max", "on": {"diverging": "notify"}})
    api.clock.advance(2)
    api.report_ok("acc", token, make_report(1, 10, {"loss": math.nan, "eval_auc": 0.7}))
    assert api.job("acc")["health"]["state"] == "healthy"  # the NaN is in a metric health does not follow
    api.clock.advance(2)
    api.report_ok("acc", token, make_report(2, 20, {"loss": 0.5, "eval_auc": math.nan}))
    health = api.job("acc")["health"]
    assert health["state"] == "diverging" and health["evidence"]["metric"] == "eval_auc"


def test_the_server_layer_comes_from_the_settings() -> None:
    from stepwatch.server import ServerSettings

    settings = ServerSettings.resolve({}, {"STEPWATCH_POLICY": '{"on": {"diverging": "notify"}}'})
    assert settings.policy == Policy(on={"diverging": "notify"})
    with pytest.raises(ValueError, match=r"STEPWATCH_POLICY: on\.diverging"):
        ServerSettings.resolve({}, {"STEPWATCH_POLICY": '{"on": {"diverging": "panic"}}'})


# ------------------------------------------------------------------------------------ notifications


def test_policy_actions_are_notified_to_signed_webhooks(database: Any, clock: Any, make_report: MakeReport) -> None:
    """A real receiver on 127.0.0.1: the server's target and the job's own policy target each get one signed
    message per decision; a dry run notifies nobody; a bad target is refused when the policy is set."""
    from starlette.testclient import TestClient

    from stepwatch.server import ServerSettings, create_app
    from stepwatch.server.notify import verify_signature
    from stepwatch.testing import WebhookReceiver

    with WebhookReceiver() as hooks:
        settings = ServerSettings(
            notify=hooks.url("/server"),
            notify_secret="s3cret",
            public_url="https://sw.example.com",
            allowed_hosts=("testserver",),
            notify_allow=("127.0.0.1",),
        )
        store = database.open()
        app = create_app(settings, store=store, clock=clock)
        with TestClient(app, raise_server_exceptions=False) as client:
            # with targets and no server policy, the server's layer notifies the bad news
            assert client.get("/api/v1/namespaces/default/policy").json()["server"]["on"]["diverging"] == "notify"
            policy = {"on": {"diverging": "checkpoint_stop"}, "notify": [hooks.url("/team")]}
            made = client.post("/api/v1/namespaces/default/jobs", json={"name": "nan", "policy": policy})
            assert made.status_code == 201, made.text
            token = made.json()["token"]
            clock.advance(2)
            sent = client.post(
                "/api/v1/namespaces/default/jobs/nan/reports",
                json=make_report(1, 10, {"loss": math.nan}),
                headers={"Authorization": f"Bearer {token}"},
            )
            assert sent.status_code == 200
            arrived = hooks.wait_for(2)
            assert sorted(r.path for r in arrived) == ["/server", "/team"]
            for request in arrived:
                assert verify_signature("s3cret", request.headers["x-stepwatch-signature"], request.body)
                body = request.json()
                assert body["kind"] == "action" and body["job"] == "nan"
                assert body["data"]["trigger"] == "diverging" and body["data"]["action"] == "checkpoint_stop"
                assert body["data"]["url"] == "https://sw.example.com/#/jobs/default/nan"
            bad = client.put("/api/v1/namespaces/default/jobs/nan/policy", json={"notify": ["nosuchscheme://x"]})
            assert bad.status_code == 422 and bad.json()["details"]["field"] == "notify"
            # a dry run records, and notifies nobody
            client.put("/api/v1/namespaces/quiet/policy", json={"dry_run": True, "on": {"diverging": "stop"}})
            made = client.post("/api/v1/namespaces/quiet/jobs", json={"name": "q"})
            clock.advance(2)
            client.post(
                "/api/v1/namespaces/quiet/jobs/q/reports",
                json=make_report(1, 10, {"loss": math.inf}),
                headers={"Authorization": f"Bearer {made.json()['token']}"},
            )
            assert len(hooks.wait_for(3, timeout=1.0)) == 2
            scraped = client.get("/metrics").text
            delivered = re.findall(
                r'stepwatch_notifications_total\{result="delivered",target="([^"]+)"\} (\S+)', scraped
            )
            assert len(delivered) == 2 and all(float(n) == 1.0 for _, n in delivered)
            assert "s3cret" not in scraped
        store.close()
