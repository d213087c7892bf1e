"""The dashboard on a server with authentication on, in a real browser: it asks for an API token, sends
it on every fetch and (through its cookie) on the live stream, shows only the token's namespaces, and
asks again once the token is revoked. Without authentication it asks nothing (the other browser tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwatch.server.api.auth import mint_token
from stepwatch.server.api.request import hash_token
from stepwatch.server.store import AuditEntry, SQLiteStore


def wait_js(page: Any, expression: str, timeout: float = 10_000) -> Any:
    return page.wait_for_function(f"() => {{ {expression} }}", timeout=timeout).json_value()


@pytest.fixture
def secured(tmp_path: Path, start_server: Any) -> tuple[Any, str]:
    db = tmp_path / "sw.db"
    store = SQLiteStore(db)  # the first admin token, as `stepwatch token create --db` writes it
    token, admin = mint_token("admin", ("*",), "root", 1.0)
    store.create_token(token, hash_token(admin), AuditEntry(1.0, "test", "token_created"))
    store.close()
    return start_server(db, auth="tokens"), admin


def test_the_dashboard_asks_for_a_token_shows_its_namespaces_live_and_asks_again_when_revoked(
    page: Any, secured: tuple[Any, str], fleet_at: Any, shot: Any
) -> None:
    server, admin = secured
    fleet = fleet_at(server.url)
    fleet.http.headers["Authorization"] = f"Bearer {admin}"
    fleet.register("mine", "team-a", total_steps=100)
    fleet.register("theirs", "team-b", total_steps=100)
    fleet.report("mine", 10, {"loss": 1.0}, "team-a", total_steps=100)
    name = '<img src=x onerror="window.__xss=1;alert(1)">'  # a token's name is shown: as text
    made = fleet.http.post("/api/v1/tokens", json={"role": "viewer", "namespaces": ["team-a"], "name": name})
    viewer, token_id = made.json()["secret"], made.json()["token"]["id"]

    page.goto(server.url + "/")
    page.wait_for_selector("#login[open]")
    assert page.locator("a.job-link").count() == 0
    shot("login")
    page.fill("#login-token", "swt_wrong")
    page.click("#login-ok")
    wait_js(page, "return document.querySelector('#login-error').textContent.includes('not valid');")
    page.fill("#login-token", viewer)
    page.click("#login-ok")
    page.wait_for_selector("a.job-link")
    assert page.locator("a.job-link").all_inner_texts() == ["mine"]  # team-b is not shown
    assert page.locator("#who").inner_text() == f"token:{token_id} ({name})"
    assert page.evaluate("window.__xss") is None
    wait_js(page, "return document.querySelector('#live').textContent.includes('live');")

    # the live stream works with the token (EventSource sends the cookie), and stays within team-a
    fleet.report("mine", 40, {"loss": 0.5}, "team-a", total_steps=100)
    fleet.report("theirs", 40, {"loss": 0.5}, "team-b", total_steps=100)
    row = "document.querySelector('tr[data-key=\"team-a/mine\"]')"
    wait_js(page, f"const r = {row}; return r && r.innerText.includes('40 / 100');")
    assert page.evaluate("window.stepwatch.state.jobs.has('team-b/theirs')") is False
    assert page.evaluate("sessionStorage.getItem('stepwatch.token')") == viewer
    shot("signed-in")

    # revoked: the open stream ends at its next message and the page asks for a token again
    assert fleet.http.delete(f"/api/v1/tokens/{token_id}").status_code == 200
    fleet.report("mine", 50, {"loss": 0.4}, "team-a", total_steps=100)
    page.wait_for_selector("#login[open]")
    assert httpx.get(f"{server.url}/api/v1/jobs", headers={"Authorization": f"Bearer {viewer}"}).status_code == 401
