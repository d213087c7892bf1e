"""Each attack of issue 21 (items 1, 4, 6, 7, 9, 10) played against a real server on a loopback socket, a
real SQLite file and real webhook receivers; the answer that closes it. The browser side of item 1 and 7
(a page on another localhost port, the dashboard under its CSP) is tests/e2e/test_cross_site.py; item 5
(revocation across PostgreSQL replicas) is tests/server/store/test_postgres.py and benchmarks/revocation_replicas.py.
"""

from __future__ import annotations

import asyncio
import math
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwatch.protocol import Identity, MetricWindow, Progress, Report
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.api.auth import hash_token, mint_token, parse_cidrs
from stepwatch.server.api.guard import GuardRules
from stepwatch.server.notify import Notification, Notifier, NotifyTarget, TargetRefused, TargetRules
from stepwatch.server.store import AuditEntry, SQLiteStore
from stepwatch.testing import WebhookReceiver
from stepwatch.testing.server import LocalServer

Serve = Callable[..., AbstractContextManager[str]]
JOBS = "/api/v1/namespaces/default/jobs"


@pytest.fixture
def local(tmp_path: Path) -> Iterator[tuple[httpx.Client, str]]:
    """A server in the default mode (no auth) with a running job; the client and the job's write token."""
    with LocalServer(tmp_path / "sw.db") as server, httpx.Client(base_url=server.url, timeout=10) as http:
        made = http.post(JOBS, json={"name": "train", "total_steps": 100})
        assert made.status_code == 201, made.text
        yield http, made.json()["token"]


def _report(seq: int, step: int, loss: float = 1.0) -> dict[str, Any]:
    finite = math.isfinite(loss)
    window = MetricWindow(
        name="loss", last=loss, min=loss if finite else None, max=loss if finite else None,
        mean=loss if finite else None, count=1, nonfinite=0 if finite else 1, first_step=step, last_step=step,
    )  # fmt: skip
    return Report(
        run_id="r1", seq=seq, sent_at=time.time(), identity=Identity(rank=0, world_size=1),
        progress=Progress(step=step, total_steps=100), metrics=(window,),
    ).to_dict()  # fmt: skip


# ----------------------------------------------------------------------------- 1. cross-site requests


def test_dns_rebinding_a_foreign_host_name_reads_nothing(local: tuple[httpx.Client, str]) -> None:
    http, _ = local
    port = http.base_url.port
    attacked = http.get(f"{JOBS}/train", headers={"Host": f"attacker.example:{port}"})
    assert attacked.status_code == 403 and "train" not in attacked.text
    assert "STEPWATCH_ALLOWED_HOSTS" in attacked.json()["message"]
    assert http.get("/", headers={"Host": "attacker.example"}).status_code == 403  # nor the page
    for name in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.2", "LOCALHOST"):
        assert http.get(f"{JOBS}/train", headers={"Host": name}).status_code == 200, name


def test_allowed_hosts_let_a_configured_name_in() -> None:
    rules = GuardRules.for_server("none", "127.0.0.1", ["stepwatch.lan", "*.ignored"], [])
    assert rules.host_allowed("stepwatch.lan:8642") and not rules.host_allowed("attacker.example")
    assert GuardRules.for_server("none", "127.0.0.1", ["*"], []).host_allowed("anything")
    # a server bound elsewhere (--insecure) or with tokens checks no Host; tokens checks no Origin either
    assert not GuardRules.for_server("none", "0.0.0.0", [], []).check_host
    assert not GuardRules.for_server("tokens", "127.0.0.1", [], []).check_host
    assert not GuardRules.for_server("tokens", "127.0.0.1", [], []).check_origin
    assert GuardRules.for_server("proxy", "0.0.0.0", [], []).check_origin


def test_a_cross_site_form_cannot_supersede_a_running_job(local: tuple[httpx.Client, str]) -> None:
    """The issue's attack: a text/plain POST (what a cross-site form sends) marked the running attempt failed."""
    http, token = local
    assert http.post(
        f"{JOBS}/train/reports", json=_report(1, 5), headers={"Authorization": f"Bearer {token}"}
    ).is_success
    forged = http.post(
        JOBS,
        content=b'{"name":"train","supersede":true}',
        headers={"Content-Type": "text/plain", "Origin": "http://localhost:9999"},
    )
    assert forged.status_code == 403, forged.text  # the Origin is checked first
    forged = http.post(JOBS, content=b'{"name":"train","supersede":true}', headers={"Content-Type": "text/plain"})
    assert forged.status_code == 415 and "application/json" in forged.json()["message"]
    form = http.post(f"{JOBS}/train/commands", data={"kind": "stop"})  # application/x-www-form-urlencoded
    assert form.status_code == 415
    nobody = http.post(f"{JOBS}/train/commands")  # a body-less "simple" fetch
    assert nobody.status_code == 415
    cross = http.post(f"{JOBS}/train/commands", json={"kind": "stop"}, headers={"Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403
    null = http.post(f"{JOBS}/train/commands", json={"kind": "stop"}, headers={"Origin": "null"})
    assert null.status_code == 403
    job = http.get(f"{JOBS}/train").json()
    assert job["attempt"] == 1 and job["state"] == "running" and job["pending_commands"] == []
    assert http.post(
        f"{JOBS}/train/reports", json=_report(2, 6), headers={"Authorization": f"Bearer {token}"}
    ).is_success
    # the dashboard's own request: same origin, JSON
    port = http.base_url.port
    own = http.post(
        f"{JOBS}/train/commands", json={"kind": "checkpoint"}, headers={"Origin": f"http://127.0.0.1:{port}"}
    )
    assert own.status_code == 201, own.text


def test_allowed_origins_let_a_configured_page_act(tmp_path: Path) -> None:
    with (
        LocalServer(tmp_path / "sw.db", allowed_origins=("http://tools.lan:3000",)) as server,
        httpx.Client(base_url=server.url, timeout=10) as http,
    ):
        assert http.post(JOBS, json={"name": "a"}, headers={"Origin": "http://tools.lan:3000"}).status_code == 201
        assert http.post(JOBS, json={"name": "b"}, headers={"Origin": "http://tools.lan:3001"}).status_code == 403


def test_the_settings_read_the_allow_lists_from_the_environment() -> None:
    settings = ServerSettings.resolve(
        {},
        {
            "STEPWATCH_ALLOWED_HOSTS": "a.lan, b.lan",
            "STEPWATCH_ALLOWED_ORIGINS": "http://a.lan:3000",
            "STEPWATCH_NOTIFY_ALLOW": "10.0.0.0/8 hooks.lan",
        },
    )
    assert settings.allowed_hosts == ("a.lan", "b.lan") and settings.allowed_origins == ("http://a.lan:3000",)
    assert settings.notify_allow == ("10.0.0.0/8", "hooks.lan")
    with pytest.raises(ValueError, match="STEPWATCH_NOTIFY_ALLOW: not a host name"):
        ServerSettings.resolve({}, {"STEPWATCH_NOTIFY_ALLOW": "http://x/"})


# ------------------------------------------------------------------------------ 7. security headers


def test_every_answer_carries_the_security_headers(local: tuple[httpx.Client, str]) -> None:
    http, token = local
    answers = [
        http.get("/"),
        http.get("/ui/js/main.js"),
        http.get("/docs"),
        http.get(f"{JOBS}/train"),
        http.get(f"{JOBS}/nope"),
        http.post(f"{JOBS}/train/reports", json=_report(1, 1), headers={"Authorization": f"Bearer {token}"}),
        http.get("/", headers={"Host": "attacker.example"}),
    ]
    for answer in answers:
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self';" in csp and "frame-ancestors 'none'" in csp, answer.url
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
    page = http.get("/").text
    assert "<script>" not in page and " style=" not in page and "<style" not in page  # nothing inline to break


# ---------------------------------------------------------------------------- 4. notification targets


def test_a_policy_cannot_aim_the_servers_webhooks_at_loopback_or_private_addresses(tmp_path: Path) -> None:
    with (
        WebhookReceiver() as inside,
        LocalServer(tmp_path / "sw.db", notify_secret="s3cret") as server,
        httpx.Client(base_url=server.url, timeout=10) as http,
    ):
        for target in (
            inside.url("/steal"),
            f"http://localhost:{server.port}/api/v1/jobs",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.1.2.3:9000/hook",
            "http://[::1]:8080/x",
            "http://[::ffff:127.0.0.1]/x",
            "json://192.168.1.10/x",
        ):
            refused = http.put(f"{JOBS}/train/policy", json={"notify": [target]})
            assert refused.status_code == 404  # no job yet; the namespace's layer is checked the same way
            refused = http.put("/api/v1/namespaces/default/policy", json={"notify": [target]})
            assert refused.status_code == 422, (target, refused.text)
            body = refused.json()
            assert body["details"]["field"] == "notify" and "STEPWATCH_NOTIFY_ALLOW" in body["message"], body
            made = http.post(JOBS, json={"name": "t", "policy": {"notify": [target]}})
            assert made.status_code == 422 and made.json()["details"]["field"] == "policy.notify"
        public = http.put("/api/v1/namespaces/default/policy", json={"notify": ["https://93.184.215.14/hook"]})
        assert public.status_code == 200, public.text
        assert http.put("/api/v1/namespaces/default/policy", json={"notify": ["slack://TokenA/TokenB/TokenC"]})
        assert inside.wait_for(1, timeout=0.2) == []


def test_an_admin_allows_an_inside_target_and_it_is_notified(tmp_path: Path) -> None:
    with (
        WebhookReceiver() as inside,
        LocalServer(tmp_path / "sw.db", notify_allow=("127.0.0.1",)) as server,
        httpx.Client(base_url=server.url, timeout=10) as http,
    ):
        policy = {"on": {"diverging": "notify"}, "notify": [inside.url("/team")]}
        made = http.post(JOBS, json={"name": "nan", "policy": policy})
        assert made.status_code == 201, made.text
        diverged = _report(1, 1, math.inf)
        sent = http.post(
            f"{JOBS}/nan/reports", json=diverged, headers={"Authorization": f"Bearer {made.json()['token']}"}
        )
        assert sent.status_code == 200, sent.text
        assert [r.path for r in inside.wait_for(1)] == ["/team"]


def _note() -> Notification:
    return Notification(kind="health", namespace="d", job="j", attempt=1, title="t", message="m", key="k")


def test_at_delivery_a_name_is_resolved_and_a_refused_address_is_not_reached() -> None:
    """DNS rebinding: a name that pointed outside when the policy was saved and points inside now."""

    async def deliver(rules: TargetRules, target: NotifyTarget) -> Notifier:
        notifier = Notifier(rules=rules)
        await notifier.start()
        notifier.notify(_note(), [target])
        await notifier.drain(10)
        await notifier.aclose()
        return notifier

    with WebhookReceiver() as inside:
        rebound = NotifyTarget(inside.url("/x").replace("127.0.0.1", "localhost"))
        refused = asyncio.run(deliver(TargetRules(), rebound))
        assert refused.stats.failed == 1 and inside.wait_for(1, timeout=0.3) == []
        # allowed: sent to the address that was checked, with the name as Host
        allowed = asyncio.run(deliver(TargetRules(("127.0.0.1", "::1")), rebound))
        assert allowed.stats.delivered == 1
        (arrived,) = inside.wait_for(1)
        assert arrived.headers["host"] == f"localhost:{rebound.url.split(':')[2].split('/')[0]}"
        # the admin's own targets are trusted as they are
        trusted = asyncio.run(deliver(TargetRules(trusted=frozenset({rebound.url})), rebound))
        assert trusted.stats.delivered == 1


def test_target_rules_refuse_every_non_public_address_and_pass_unresolvable_names_at_save() -> None:
    rules = TargetRules(("10.0.0.0/8", "hooks.lan"))
    rules.check("http://10.9.9.9/x")  # allowed network
    rules.check("http://hooks.lan/x")  # allowed name, not even resolved
    rules.check("https://no-such-host.invalid/x")  # checked again at each delivery
    for url in (
        "http://127.0.0.1/",
        "http://192.168.0.1/",
        "http://100.64.0.1/",
        "http://[fe80::1]/",
        "http://0.0.0.0/",
    ):
        with pytest.raises(TargetRefused):
            rules.check(url)
    with pytest.raises(TargetRefused, match="does not resolve"):
        asyncio.run(rules.resolve("https://no-such-host.invalid/x"))


# ------------------------------------------------------------- 6. missing and forbidden jobs alike


@pytest.mark.parametrize("auth", ["tokens", "proxy"])
def test_a_caller_without_the_jobs_token_cannot_tell_a_missing_job_from_an_existing_one(
    tmp_path: Path, auth: str
) -> None:
    db = tmp_path / "sw.db"
    store = SQLiteStore(db)
    store.register("default", "exists", token_hash=hash_token("the-jobs-token"), now=1.0)
    store.close()
    extra = {"trusted_proxies": parse_cidrs("10.0.0.0/8")} if auth == "proxy" else {}
    with LocalServer(db, auth=auth, **extra) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        kubeflow = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/{}/status"
        status = {"trainerStatus": {"progressPercentage": 1, "lastUpdatedTime": "2026-01-01T00:00:00Z"}}
        for path, body in (
            (JOBS + "/{}/reports", _report(1, 1)),
            (JOBS + "/{}/state", {"state": "failed"}),
            (kubeflow, status),
            (JOBS + "/{}", None),
            (JOBS + "/{}/commands", {"kind": "stop"}),
        ):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer the-jobs-token"}):
                answers = []
                for name in ("exists", "missing"):
                    url = path.format(name)
                    answer = (
                        http.get(url, headers=headers) if body is None else http.post(url, json=body, headers=headers)
                    )
                    answers.append((answer.status_code, answer.text.replace(name, "NAME")))
                if "the-jobs-token" in headers.get("Authorization", "") and "commands" not in path and body:
                    continue  # the job's own token: it may write its job (and so knows it exists)
                assert answers[0] == answers[1], (path, headers, answers)
                assert answers[0][0] in (401, 403), answers


# ---------------------------------------------------------------------------------- 9. file modes


def test_the_database_and_its_directory_are_the_owners_alone(tmp_path: Path) -> None:
    where = tmp_path / "new" / "data"
    with LocalServer(where / "sw.db") as server, httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.post(JOBS, json={"name": "w"}).status_code == 201
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in where.iterdir() if p.name.startswith("sw.db")}
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert {"sw.db", "sw.db-wal", "sw.db-shm"} <= set(modes), modes
    assert all(modes[name] == 0o600 for name in ("sw.db", "sw.db-wal", "sw.db-shm")), modes
    # a file an earlier version made world-readable is tightened at the next start; an existing folder is left
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    old = shared / "old.db"
    old.touch()
    old.chmod(0o644)
    SQLiteStore(old).close()
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and stat.S_IMODE(shared.stat().st_mode) == 0o755


# --------------------------------------------------------------------- 10. tokens of a no-auth life


def test_a_token_from_a_life_without_auth_does_not_open_the_server_with_auth(tmp_path: Path) -> None:
    db = tmp_path / "sw.db"
    server = LocalServer(db).start()
    with httpx.Client(base_url=server.url, timeout=10) as http:
        made = http.post("/api/v1/tokens", json={"role": "admin", "namespaces": ["*"], "name": "drive-by"})
        assert made.status_code == 409 and "--auth" in made.json()["message"], made.text
        job = http.post(JOBS, json={"name": "running"}).json()
    server.stop()
    # a token an earlier version minted in that life (its creator: "local") is refused after the restart
    store = SQLiteStore(db)
    old, secret = mint_token("admin", ("*",), "drive-by", 2.0, by="local")
    store.create_token(old, hash_token(secret), AuditEntry(2.0, "local", "token_created"))
    store.close()
    with LocalServer(db, auth="tokens") as secured, httpx.Client(base_url=secured.url, timeout=10) as http:
        refused = http.get("/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"})
        assert refused.status_code == 401 and "without authentication" in refused.json()["message"]
        # the job write token of a job that was running goes on writing that job (and only it)
        mine = {"Authorization": f"Bearer {job['token']}"}
        assert http.post(f"{JOBS}/running/reports", json=_report(1, 1), headers=mine).status_code == 200
        assert http.get("/api/v1/jobs", headers=mine).status_code == 401


def test_the_in_process_client_host_is_refused_unless_allowed(tmp_path: Path) -> None:
    """Why the test fixtures allow ``testserver``: the in-process client sends it as its Host."""
    from starlette.testclient import TestClient

    with TestClient(create_app(ServerSettings(db=str(tmp_path / "a.db")))) as client:
        assert client.get("/healthz").status_code == 403
    with TestClient(create_app(ServerSettings(db=str(tmp_path / "b.db"), allowed_hosts=("testserver",)))) as client:
        assert client.get("/healthz").status_code == 200
