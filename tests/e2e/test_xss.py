"""Every string a user or a job supplies, carrying markup, in the dashboard (headless Chromium): the list, the
side panel (charts, health evidence, ranks, events, pending commands, hyperparameters, policy), the admin
view and compare. No script runs (``window.__xss`` stays unset, no alert: the ``page`` fixture fails on
one) and no element is injected. test_dashboard.py covers metric names, params and a command's reason in
the panel and compare; test_dashboard_auth.py a token's name. Then the same strings, and terminal control
sequences, in the CLI (describe, jobs), `stepwatch top`'s job screen and the notebook HTML."""

from __future__ import annotations

import math
import time
from typing import Any

import httpx
import pytest

from stepwatch.protocol import Identity, MetricWindow, Progress, Report

IMG = '<img src=x onerror="window.__xss=1;alert(1)">'
SVG = '"><svg onload="window.__xss=2">'
SCRIPT = "</script><script>window.__xss=3</script>"
LINK = "javascript:window.__xss=4"
PLOTLY = '<a href="javascript:window.__xss=5">x</a><b>bold</b>'
"""Plotly renders a few tags (links among them) in titles and hover labels: the dashboard escapes them."""
INJECTED = "[onerror], [onload], [onmouseover], img, iframe, object, embed, a[href^='javascript']"


def wait_js(page: Any, expression: str, timeout: float = 10_000) -> Any:
    return page.wait_for_function(f"() => {{ {expression} }}", timeout=timeout).json_value()


def report(token: str, client: httpx.Client, seq: int, step: int, metrics: dict[str, float], **fields: Any) -> None:
    windows = tuple(
        MetricWindow(
            name=name,
            last=value,
            min=value if math.isfinite(value) else None,
            max=value if math.isfinite(value) else None,
            mean=value if math.isfinite(value) else None,
            count=1,
            nonfinite=0 if math.isfinite(value) else 1,
            first_step=step,
            last_step=step,
        )
        for name, value in metrics.items()
    )
    body = Report(
        run_id="run-xss",
        seq=seq,
        sent_at=time.time(),
        identity=Identity(rank=fields.pop("rank", 0), world_size=2, host=SVG, pid=4242),
        progress=Progress(step=step, total_steps=100),
        metrics=windows,
        **fields,
    ).to_dict()
    answer = client.post(
        "/api/v1/namespaces/default/jobs/xss/reports", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text


def test_every_user_supplied_string_is_shown_as_text_and_runs_nothing(page: Any, fleet: Any, shot: Any) -> None:
    fleet.register("xss", gpus=2, gpu_hour_cost=3.0, gpu_type=IMG, params={SVG: SCRIPT, IMG: LINK, PLOTLY: PLOTLY})
    token = fleet.tokens[("default", "xss")]
    http = fleet.http
    for step in (1, 2, 3):
        report(token, http, step, step, {IMG: 1.0 / step, PLOTLY: float(step), "loss": 1.0 / step})
        report(token, http, 100 + step, step, {}, rank=1)
    report(token, http, 4, 4, {IMG: math.nan, PLOTLY: math.inf, "loss": math.nan})  # diverging: the evidence names them
    policy = {"metric": PLOTLY, "mode": "min", "on": {"diverging": "notify"}}
    assert http.put("/api/v1/namespaces/default/jobs/xss/policy", json=policy).status_code == 200, "job policy"
    assert http.put("/api/v1/namespaces/default/policy", json={"metric": IMG}).status_code == 200, "namespace policy"
    command = {"kind": "checkpoint", "reason": SCRIPT}
    assert http.post("/api/v1/namespaces/default/jobs/xss/commands", json=command).status_code == 201
    fleet.register("ended", gpus=1, gpu_type=SVG)
    fleet.report("ended", 5, {"loss": 0.5})
    state = {"state": "failed", "reason": IMG, "exit_code": 1}
    ended = http.post(
        "/api/v1/namespaces/default/jobs/ended/state",
        json=state,
        headers={"Authorization": f"Bearer {fleet.tokens[('default', 'ended')]}"},
    )
    assert ended.status_code == 200, ended.text
    assert fleet.job("xss")["health"]["state"] == "diverging"

    page.goto(fleet.url + "/")
    page.wait_for_selector("a.job-link:text-is('xss')")
    page.goto(fleet.url + "/#/?job=default%2Fxss")
    page.wait_for_selector("#panel [data-testid=evidence]")
    page.wait_for_selector("#panel [data-testid=params] table")
    wait_js(page, "return [...document.querySelectorAll('.chart')].some((d) => d.data);")
    panel = page.locator("#panel")
    wait_js(page, f"return document.querySelector('#panel').innerText.includes({SVG!r});")  # the ranks' host
    text = panel.inner_text()
    for shown in (SVG, SCRIPT, IMG, LINK, PLOTLY):
        assert shown in text, shown
    assert page.locator(f".chart[data-metric='{IMG}'] .gtitle").text_content() == IMG  # plotly's own markup
    page.hover(f".chart[data-metric='{IMG}'] .nsewdrag")  # a hover label with the trace's name
    shot("panel")

    page.goto(fleet.url + "/#/?job=default%2Fended")
    wait_js(page, f"return document.querySelector('#panel').innerText.includes({IMG!r});")  # the reason it failed
    page.goto(fleet.url + "/#/admin")
    page.wait_for_selector("[data-testid=attention]")
    wait_js(page, "return document.querySelector('[data-testid=attention]').innerText.includes('default/xss');")
    shot("admin")
    page.goto(fleet.url + "/#/compare/default/xss")
    page.wait_for_selector("table.compare")
    wait_js(page, "return [...document.querySelectorAll('.chart')].some((d) => d.data);")
    assert IMG in page.locator("table.compare").inner_text()
    shot("compare")

    time.sleep(0.3)  # an injected handler would have run by now
    assert page.evaluate("window.__xss") is None
    assert page.evaluate(f"document.querySelectorAll({INJECTED!r}).length") == 0


# ------------------------------------------------------------------ the CLI, `stepwatch top`, notebooks

TERMINAL = "\x1b]0;owned\x07\x1b]52;c;b3duZWQ=\x07\x1b[2J\r\u202e"
"""A window title, a clipboard write (OSC 52), a cleared screen, a carriage return, a right-to-left override."""


def hostile_job(fleet: Any) -> None:
    """A job whose every free-text field carries markup or terminal control sequences."""
    fleet.register("hostile", gpus=1, gpu_type=IMG, params={"note": TERMINAL + SCRIPT, IMG: LINK})
    for step in (1, 2):
        fleet.report("hostile", step, {IMG: 1.0 / step, "loss": 1.0 / step})
    fleet.report("hostile", 3, {IMG: math.nan, "loss": math.nan})
    command = {"kind": "checkpoint", "reason": TERMINAL + IMG}
    assert fleet.http.post("/api/v1/namespaces/default/jobs/hostile/commands", json=command).status_code == 201
    state = {"state": "failed", "reason": TERMINAL + SCRIPT}
    token = fleet.tokens[("default", "hostile")]
    answer = fleet.http.post(
        "/api/v1/namespaces/default/jobs/hostile/state", json=state, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text


def test_the_cli_shows_control_characters_as_escapes(fleet: Any, capsys: Any) -> None:
    from stepwatch.cli import main

    hostile_job(fleet)
    assert main(["describe", "hostile", "--server", fleet.url]) == 0
    assert main(["jobs", "--server", fleet.url]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out and "\u202e" not in out
    assert r"\x1b]0;owned\x07" in out and SCRIPT in out and IMG in out  # shown, escaped, in full


def test_stepwatch_top_and_notebook_html_show_markup_and_control_characters_as_text(fleet: Any) -> None:
    pytest.importorskip("rich")
    from rich.text import Text

    from stepwatch.cli._top_view import job_details
    from stepwatch.client import Client

    hostile_job(fleet)
    with Client(fleet.url) as client:
        job = client.job("hostile")
        events = client.events("hostile")
        screen = Text.from_markup(job_details(job, events)).plain  # raises on markup it cannot parse
        html = job._repr_html_() + client.jobs()._repr_html_()
    assert "\x1b" not in screen and r"\x1b]52;c;" in screen and SCRIPT in screen and IMG in screen
    assert "<script" not in html and "<img" not in html and "<a " not in html
    assert "&lt;img src=x onerror=" in html and "&lt;/script&gt;&lt;script&gt;" in html
