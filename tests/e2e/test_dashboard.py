"""The web dashboard in a real browser (Debian's headless Chromium through Playwright) against a real server
with real reporting jobs: the list renders and updates live, the side panel charts the reported points,
compare overlays runs, the stop button stops a job that runs the report core, the admin totals add up,
names carrying HTML are shown as text, and a lost server shows a banner until it is back.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

XSS = '<img src=x onerror="window.__xss=1;alert(1)">'


def wait_js(page: Any, expression: str, arg: Any = None, timeout: float = 10_000) -> Any:
    """Wait until a JavaScript expression (a function body of ``arg``) is truthy; return its value."""
    handle = page.wait_for_function(f"(arg) => {{ {expression} }}", arg=arg, timeout=timeout)
    return handle.json_value()


def row_text(page: Any, name: str) -> str:
    text: str = page.locator("tr", has=page.locator(f'a.job-link:text-is("{name}")')).inner_text()
    return text


def test_list_renders_every_column_and_updates_live_without_redrawing_rows(page: Any, fleet: Any, shot: Any) -> None:
    fleet.register("resnet", "vision", total_steps=1000, gpus=8, gpu_hour_cost=4.1)
    fleet.register("llama-sft", "nlp", total_steps=500)
    for step in (10, 20, 30):
        fleet.report("resnet", step, {"loss": 2.0 / step, "eval_loss": 1.5}, "vision", total_steps=1000)
    fleet.report("llama-sft", 50, {"train/loss": 0.75}, "nlp", total_steps=500)

    page.goto(fleet.url + "/")
    page.wait_for_selector("a.job-link")
    assert page.locator("a.job-link").count() == 2
    resnet = row_text(page, "resnet")
    for expected in ("vision", "running", "3.0%", "30 / 1,000", "0.06667", "$"):
        assert expected in resnet, (expected, resnet)
    assert "50 / 500" in row_text(page, "llama-sft") and "0.75" in row_text(page, "llama-sft")
    headers = page.locator("table.jobs thead th").all_inner_texts()
    for column in ("Name", "Namespace", "State", "Health", "Progress", "Step", "Epoch", "ETA", "Loss", "Cost", "Age"):
        assert any(column in h for h in headers), (column, headers)

    # live: a new report changes the texts of the rows in place (the same elements: nothing is redrawn)
    page.evaluate("document.querySelectorAll('tr[data-key]').forEach((r) => { r.dataset.marker = 'kept'; })")
    fleet.report("resnet", 400, {"loss": 0.01}, "vision", total_steps=1000)
    wait_js(
        page,
        "const r = document.querySelector('tr[data-key=\"vision/resnet\"]'); "
        "return r && r.innerText.includes('400 / 1,000');",
    )
    assert page.evaluate("[...document.querySelectorAll('tr[data-key]')].every((r) => r.dataset.marker === 'kept')")
    fleet.register("fresh", "vision", total_steps=10)
    wait_js(page, "return document.querySelectorAll('a.job-link').length === 3;")

    # filters and sort
    page.select_option("#f-namespace", "nlp")
    wait_js(page, "return document.querySelectorAll('a.job-link').length === 1;")
    assert page.locator("a.job-link").inner_text() == "llama-sft"
    page.select_option("#f-namespace", "")
    page.fill("#f-text", "resn")
    wait_js(page, "return document.querySelectorAll('a.job-link').length === 1;")
    page.click("text=Clear")
    page.click("button.sort:text-is('Step')")
    page.wait_for_selector("th.c-step[aria-sort=descending]")
    assert page.locator("a.job-link").first.inner_text() == "resnet"
    shot("list")


def test_side_panel_charts_the_reported_points_and_a_new_point_live(page: Any, fleet: Any, shot: Any) -> None:
    fleet.register("bert", total_steps=2000, gpus=2, gpu_hour_cost=3.0, params={"lr": 3e-4, "batch_size": 32})
    metrics = ("loss", "eval_loss", "learning_rate", "grad_norm", "train_samples_per_second")
    for i in range(1, 41):
        fleet.report(
            "bert", 10 * i, {"loss": 3.0 * math.exp(-i / 15), "eval_loss": 2.0 / i, "learning_rate": 1e-4,
                             "grad_norm": 1.0 + i / 40, "train_samples_per_second": 120.0}, total_steps=2000,
        )  # fmt: skip
    page.goto(fleet.url + "/")
    page.click("a.job-link:text-is('bert')")
    page.wait_for_selector("#panel h2:text-is('bert')")
    for metric in metrics:
        wait_js(
            page,
            "const d = document.querySelector(`.chart[data-metric='${arg}']`); "
            "return d && d.data && d.data.some((t) => t.y && t.y.length === 40);",
            metric,
        )
    panel = page.locator("#panel").inner_text()
    for expected in (
        "Time remaining",
        "Completed steps",
        "400 / 2,000",
        "20.0%",
        "Spent",
        "Projected",
        "Wasted",
        "lr",
        "batch_size",
    ):
        assert expected in panel, expected

    # a new point shows in the open chart through the live stream: the page reads no history for it
    reads: list[str] = []

    def on_request(request: Any) -> None:
        if "/history" in request.url:
            reads.append(request.url)

    page.on("request", on_request)
    fleet.report("bert", 410, {"loss": float("nan"), "eval_loss": 0.04}, total_steps=2000)
    wait_js(
        page,
        "const d = document.querySelector(\".chart[data-metric='eval_loss']\"); "
        "return d.data.some((t) => t.y && t.y.length === 41);",
    )
    page.remove_listener("request", on_request)
    assert not reads, f"the point came by reading the history again, not live: {reads}"
    # the latest values, as OpenShift AI's drawer lists them (train metrics, then eval ones), follow live too
    wait_js(
        page,
        "const l = document.querySelector('[data-testid=latest-values]'); return l && l.innerText.includes('0.04');",
    )
    latest = page.locator("[data-testid=latest-values]").inner_text()
    assert latest.index("Train metrics") < latest.index("grad_norm") < latest.index("Eval metrics"), latest
    assert latest.index("Eval metrics") < latest.index("eval_loss"), latest
    # the NaN shows as a marker (a trace on the hidden top axis), the line keeps its gap
    wait_js(
        page,
        "const d = document.querySelector(\".chart[data-metric='loss']\"); "
        "return d.data.some((t) => t.yaxis === 'y2');",
    )
    page.check("#p-log")
    wait_js(page, "return document.querySelector(\".chart[data-metric='loss']\").layout.yaxis.type === 'log';")
    page.fill("#p-smooth", "0.6")
    page.dispatch_event("#p-smooth", "input")
    wait_js(
        page,
        "return document.querySelector(\".chart[data-metric='loss']\").data.some((t) => (t.hovertemplate || "
        "'').includes('smoothed'));",
    )
    page.click("#p-x-time")
    wait_js(page, "return document.querySelector(\".chart[data-metric='loss']\").layout.xaxis.type === 'date';")
    # a policy switch: the job's own layer is saved at once
    page.select_option("#pol-not_learning", "checkpoint_stop")
    page.wait_for_selector("[data-testid=panel-status]:has-text('Policy saved')")
    policy = fleet.http.get("/api/v1/namespaces/default/jobs/bert/policy").json()
    assert policy["job"]["on"] == {"not_learning": "checkpoint_stop"}
    shot("panel")
    page.keyboard.press("Escape")
    page.wait_for_selector("#panel", state="hidden")


def test_compare_overlays_runs_and_marks_the_differences(page: Any, fleet: Any, shot: Any) -> None:
    for name, lr in (("lr-small", 1e-4), ("lr-big", 1e-3)):
        fleet.register(name, total_steps=100, params={"lr": lr, "optimizer": "adamw"})
        for step in range(10, 101, 10):
            fleet.report(
                name, step, {"loss": (1.0 if lr < 5e-4 else 0.5) / step, "eval_accuracy": step / 100 * lr * 1000}
            )
    page.goto(fleet.url + "/")
    page.wait_for_selector("a.job-link")
    page.check("tr[data-key='default/lr-small'] input[type=checkbox]")
    page.check("tr[data-key='default/lr-big'] input[type=checkbox]")
    page.click("text=Compare selected (2)")
    page.wait_for_selector("h1:text-is('Compare runs')")
    wait_js(
        page,
        "const d = document.querySelector(\".chart[data-metric='loss']\"); "
        "return d && d.data && d.data.filter((t) => t.showlegend !== false).length === 2;",
    )
    names = page.evaluate(
        "document.querySelector(\".chart[data-metric='loss']\").data.filter((t) => t.showlegend !== "
        "false).map((t) => t.name)"
    )
    assert sorted(names) == ["default/lr-big", "default/lr-small"]
    lr_row = page.locator("table.compare tr", has=page.locator("th:text-is('lr')"))
    assert "differs" in (lr_row.get_attribute("class") or "")
    same_row = page.locator("table.compare tr", has=page.locator("th:text-is('optimizer')"))
    assert "differs" not in (same_row.get_attribute("class") or "")
    best_loss = page.locator("table.compare tr", has=page.locator("th:text-is('loss (min)')"))
    assert "★" in best_loss.locator("td.best").inner_text()
    shot("compare")


def test_stop_button_stops_a_job_that_runs_the_report_core(page: Any, server: Any, shot: Any) -> None:
    import stepwatch

    run = stepwatch.init(job="stoppable", url=server.url, total_steps=100_000, interval=0.2, params={"lr": 0.1})
    ended = threading.Event()

    def train() -> None:
        step = 0
        while not run.should_stop and step < 100_000:
            step += 1
            run.step(loss=1.0 / step)
            time.sleep(0.005)
        run.finish("stopped", run.command_reason)
        ended.set()

    worker = threading.Thread(target=train, daemon=True)
    worker.start()
    try:
        page.goto(server.url + "/#/?job=default%2Fstoppable")
        page.wait_for_selector("#panel [data-testid=panel-state]:text-is('running')")
        # cancelling the confirmation sends nothing
        page.click("#panel button:text-is('Checkpoint')")
        page.click("#confirm button:text-is('Cancel')")
        page.click("#panel button:text-is('Stop…')")
        page.fill("#confirm-reason", "plateau, saving GPUs")
        shot("confirm")
        # the job sees the stop within one 0.2 s interval and its end replaces the "queued" line: record every
        # text the status line shows rather than hoping to catch a short-lived one
        page.evaluate(
            "() => { const el = document.querySelector('[data-testid=panel-status]'); window.statusSeen = [];"
            " new MutationObserver(() => window.statusSeen.push(el.textContent))"
            ".observe(el, { childList: true, characterData: true, subtree: true }); }"
        )
        page.click("#confirm-ok")
        wait_js(page, "return window.statusSeen.some((text) => text.includes('stop queued'));")
        assert ended.wait(10), "the job did not see the stop"
        page.wait_for_selector("#panel [data-testid=panel-state]:text-is('stopped')")
        page.wait_for_selector("[data-testid=panel-status]:has-text('has stopped')")  # never left at "queued"
        page.wait_for_selector("#panel [data-testid=events]:has-text('plateau, saving GPUs')")
        assert page.locator("#panel button:text-is('Stop…')").is_disabled()
        shot("stopped")
    finally:
        run.finish("stopped", "test over")
        worker.join(10)


def test_admin_totals_add_up(page: Any, fleet: Any, shot: Any) -> None:
    jobs = [  # name, namespace, gpus, price, end state
        ("a1", "team-a", 8, 4.0, None),
        ("a2", "team-a", 4, 4.0, None),
        ("b1", "team-b", 2, 2.5, None),
        ("b2", "team-b", 1, 2.5, "finished"),
        ("c1", "team-c", 0, 0.0, None),
    ]
    now = time.time()
    for name, ns, gpus, price, end in jobs:
        policy = {"on": {"diverging": "stop"}} if name == "b1" else None  # b1 goes NaN: its policy stops it
        fleet.register(name, ns, total_steps=1000, gpus=gpus, gpu_hour_cost=price, policy=policy)
        for i in range(1, 6):
            value = float("nan") if name == "b1" and i == 5 else 1.0 / i
            fleet.report(name, 100 * i, {"loss": value}, ns, total_steps=1000, sent_at=now - 60 + 10 * i)
        if end:
            fleet.report(name, 1000, {"loss": 0.1}, ns, total_steps=1000, state=end)
    page.goto(fleet.url + "/#/admin")
    page.wait_for_selector("[data-testid=total-jobs]:text-is('5')")
    wait_js(page, "return document.querySelector('[data-testid=attention]').innerText.includes('team-b/b1');")
    assert page.inner_text("[data-testid=total-running]") == "4"
    assert page.inner_text("[data-testid=total-gpus]") == "14"  # 8 + 4 + 2 running; b2 finished
    assert page.inner_text("[data-testid=total-burn]") == "$53.00/h"  # 32 + 16 + 5
    states = page.evaluate(
        "[...document.querySelectorAll('[data-testid=by-state] td[data-key]')].map((td) => Number(td.textContent))"
    )
    healths = page.evaluate(
        "[...document.querySelectorAll('[data-testid=by-health] td[data-key]')].map((td) => Number(td.textContent))"
    )
    assert sum(states) == 5 and sum(healths) == 5
    namespaces = page.evaluate(
        "[...document.querySelectorAll('[data-testid=namespaces] tbody tr')].map((tr) => "
        "Number(tr.cells[1].textContent))"
    )
    assert sorted(namespaces) == [1, 2, 2]
    foot = page.locator("[data-testid=namespaces] tfoot").inner_text()
    assert "$53.00" in foot and "14" in foot
    ledger = fleet.http.get("/api/v1/costs", params={"since": now - 7 * 86400}).json()["total"]
    page.wait_for_selector(f"[data-testid=total-saved]:text-is('${ledger['saved']:,.2f}')")
    attention = page.locator("[data-testid=attention]").inner_text()
    assert "diverging" in attention
    timeline = page.locator("[data-testid=timeline]").inner_text()
    assert "team-a/a1" in timeline
    shot("admin")
    page.click("[data-testid=attention] a")
    page.wait_for_selector("#panel [data-testid=evidence]")


def test_names_params_and_messages_carrying_html_are_shown_as_text(page: Any, fleet: Any, shot: Any) -> None:
    fleet.register("xss", params={XSS: XSS, "note": "<script>window.__xss=1</script>"})
    for step in (1, 2, 3):
        fleet.report("xss", step, {XSS: float(step), "loss": 1.0 / step})
    fleet.http.post("/api/v1/namespaces/default/jobs/xss/commands", json={"kind": "checkpoint", "reason": XSS})
    page.goto(fleet.url + "/#/?job=default%2Fxss")
    page.wait_for_selector("#panel [data-testid=params] table")
    wait_js(page, "return [...document.querySelectorAll('.chart')].some((d) => d.data);")
    page.wait_for_selector(f".chart[data-metric='{XSS}'] .gtitle")
    params = page.locator("#panel [data-testid=params]").inner_text()
    assert XSS in params and "<script>window.__xss=1</script>" in params
    assert XSS in page.locator(f".chart[data-metric='{XSS}'] .gtitle").text_content()
    assert XSS in page.locator("#panel [data-testid=events]").inner_text()
    page.goto(fleet.url + "/#/compare/default/xss")
    page.wait_for_selector("table.compare")
    assert XSS in page.locator("table.compare").inner_text()
    time.sleep(0.3)  # an injected onerror would run by now
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("window.__xss") is None
    shot("xss")


def test_a_lost_server_shows_a_banner_and_the_page_recovers(page: Any, server: Any, fleet: Any) -> None:
    fleet.register("steady", total_steps=100)
    fleet.report("steady", 10, {"loss": 0.5}, total_steps=100)
    page.goto(server.url + "/")
    page.wait_for_selector("#live:text-is('● live')")
    server.stop()
    page.wait_for_selector("#banner:has-text('does not answer')")
    server.start()
    fleet.report("steady", 20, {"loss": 0.4}, total_steps=100)
    page.wait_for_selector("#banner", state="hidden", timeout=15_000)
    wait_js(page, "return document.querySelector('tr[data-key=\"default/steady\"]').innerText.includes('20 / 100');")


@pytest.mark.slow
def test_ten_thousand_jobs_first_render_scroll_and_filter(page: Any, server: Any, shot: Any) -> None:
    from stepwatch.server.store import PendingReport, SQLiteStore

    _populate(SQLiteStore(server.db), 10)  # the baseline, in this run: the same page with 10 jobs
    t0 = time.monotonic()
    page.goto(server.url + "/")
    page.wait_for_selector("a.job-link", timeout=20_000)
    first_of_10 = time.monotonic() - t0
    _populate(SQLiteStore(server.db), 9_990, first=10)
    t0 = time.monotonic()
    page.goto(server.url + "/")
    page.wait_for_selector("a.job-link", timeout=20_000)
    first = time.monotonic() - t0
    page.wait_for_selector("text=10,000 of 10,000 jobs", timeout=40_000)
    rows = page.locator("table.jobs tbody tr:not(.spacer)").count()
    assert rows < 200, f"{rows} rows in the DOM: the table is not virtual"
    t0 = time.monotonic()
    page.evaluate("document.querySelector('.table-wrap').scrollTop = 200000")
    wait_js(
        page, "return [...document.querySelectorAll('tr[data-index]')].some((r) => Number(r.dataset.index) > 4900);"
    )
    scroll = time.monotonic() - t0
    t0 = time.monotonic()
    page.fill("#f-text", "job-0999")
    wait_js(page, "return document.querySelector('[data-testid=count]').textContent.startsWith('10 of');")
    filtered = time.monotonic() - t0
    shot("10k")
    print(
        f"\n10,000 jobs: first render {first * 1000:.0f} ms (10 jobs: {first_of_10 * 1000:.0f} ms), scroll "
        f"{scroll * 1000:.0f} ms, filter {filtered * 1000:.0f} ms"
    )
    # the first rows do not wait for the 10,000: at most 10 times the first render of 10 jobs (the target,
    # 1.5 s, is checked by benchmarks/dashboard.py; this guards a regression on any machine)
    assert first < 10 * first_of_10, (first, first_of_10)
    del PendingReport


def _populate(store: Any, n: int, first: int = 0) -> None:
    """``n`` jobs (numbered from ``first``) in 7 namespaces, each with one report, written through the store
    (what ingest does)."""
    from stepwatch.protocol import Identity, Progress, Report
    from stepwatch.server.store import PendingReport

    now = time.time()
    jobs = [
        store.register(f"ns-{i % 7}", f"job-{i:05d}", token_hash="-", now=now - 3600, total_steps=10_000,
                       gpus=float(i % 4 + 1), gpu_hour_cost=2.5)
        for i in range(first, first + n)
    ]  # fmt: skip
    batch = []
    for i, job in enumerate(jobs, start=first):
        report = Report(
            run_id="r", seq=1, sent_at=now - 5, identity=Identity(rank=0, world_size=1, host="h", pid=1),
            progress=Progress(step=100 + i, total_steps=10_000), metrics=(), state="running",
        )  # fmt: skip
        batch.append(PendingReport(job, report, now - 5, None))
    for start in range(0, n, 1000):
        store.ingest_reports(batch[start : start + 1000])
    store.close()


def test_an_eta_a_kubeflow_client_posted_is_labelled_as_reported(page: Any, fleet: Any) -> None:
    """A job that reports only through the Kubeflow endpoint (update_trainjob_status sends an ETA and no
    steps): the panel shows that ETA as the job's own, "Time remaining (reported)", never as stepwatch's."""
    fleet.register("kf-eta")
    status = {"trainerStatus": {"progressPercentage": 40, "estimatedRemainingSeconds": 3600,
                                "lastUpdatedTime": "2026-12-06T02:00:00Z"}}  # fmt: skip
    response = fleet.http.post(
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/kf-eta/status",
        json=status,
        headers={"Authorization": f"Bearer {fleet.tokens[('default', 'kf-eta')]}"},
    )
    assert response.status_code == 200, response.text
    page.goto(fleet.url + "/#/?job=default%2Fkf-eta")
    facts = page.locator("[data-testid=progress-facts]")
    facts.get_by_text("Time remaining (reported)").wait_for(timeout=10_000)
    assert "1h" in facts.inner_text() or "59m" in facts.inner_text(), facts.inner_text()


def test_the_panel_keeps_every_verdict_the_job_had_and_shows_a_new_one_live(page: Any, fleet: Any, shot: Any) -> None:
    """Issue 19 item 6 in the dashboard: a job that went NaN (diverging) and recovered keeps that span in
    the panel's health history, with the time it stood and what it wasted, as the API and `stepwatch
    describe` keep it; a verdict that comes while the panel is open appears there without a reload."""
    fleet.register("spiky", total_steps=1000, gpus=2, gpu_hour_cost=3.0)
    step = 0
    for i in range(1, 4):
        step += 10
        fleet.report("spiky", step, {"loss": 1.0 / i}, total_steps=1000)
    page.goto(fleet.url + "/")
    page.click("a.job-link:text-is('spiky')")
    page.wait_for_selector("#panel h2:text-is('spiky')")
    assert page.locator("#panel [data-testid=health-history]").count() == 0  # only ever healthy: nothing to add
    step += 10
    fleet.report("spiky", step, {"loss": float("nan")}, total_steps=1000)
    page.wait_for_selector("#panel [data-testid=health-history] td:has-text('Diverging')")  # live, no reload
    for _ in range(12):  # finite windows: it recovers
        step += 10
        fleet.report("spiky", step, {"loss": 0.2}, total_steps=1000)
    api = fleet.job("spiky")
    assert [s["state"] for s in api["health_history"]] == ["healthy", "diverging", "healthy"], api["health_history"]
    wait_js(page, "return document.querySelectorAll('#panel [data-testid=health-history] tbody tr').length === 3;")
    rows = page.locator("#panel [data-testid=health-history] tbody tr").all_inner_texts()
    assert "diverging" in rows[1].lower() and "wasted" in rows[1] and "still" not in rows[1], rows
    assert "still" in rows[2], rows  # the current verdict stands
    shot("health-history")
