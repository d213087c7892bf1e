"""The dashboard's own rules for the figures it shows, run as the page runs them: the modules the server
serves, imported in headless Chromium. One rounding rule for a percentage (one decimal, rounded down, 100 only
at 100), the list's fixed tie order, the LOSS column's smoothed value, no live rate or hourly cost for a job
that has ended or stands stalled, and the y scale that keeps a comparison readable beside a diverged run
(clipped to the sane runs, marked where a run leaves it, log only when asked or when every run spans decades).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_dashboard import wait_js


def run_module(page: Any, url: str, body: str) -> Any:
    """Import the served modules in the page and return what ``body`` (an async function's body) returns."""
    page.goto(url + "/")
    page.wait_for_selector("table.jobs")
    return page.evaluate(
        "async () => { const F = await import('/ui/js/format.js'); const C = await import('/ui/js/charts.js');"
        f" const L = await import('/ui/js/list.js'); {body} }}"
    )


def test_one_rounding_rule_for_a_percentage(page: Any, server: Any) -> None:
    shown = run_module(
        page,
        server.url,
        "return [9.96, 99.99, 100, 29.999999999999996, 0, 68.45, 3, null, 'NaN', 45]"
        ".map((v) => [F.shownPercent(v), F.fmtPercent(v)]);",
    )
    assert shown == [
        [9.9, "9.9%"],
        [99.9, "99.9%"],
        [100, "100%"],
        [30, "30.0%"],
        [0, "0%"],
        [68.4, "68.4%"],
        [3, "3.0%"],
        [None, "—"],
        [None, "—"],
        [45, "45.0%"],
    ]
    ended = run_module(
        page,
        server.url,
        "return [F.fmtProgress('stopped', 68.45), F.fmtProgress('failed', 99.99), F.fmtProgress('finished', 100),"
        " F.fmtProgress('running', 9.96)];",
    )
    assert ended == ["ended at 68.4%", "ended at 99.9%", "100%", "9.9%"]


def test_ties_keep_a_fixed_order_and_unknown_values_go_last(page: Any, server: Any) -> None:
    orders = run_module(
        page,
        server.url,
        """
        const job = (namespace, name, attempt = 1) => ({namespace, name, attempt});
        const rows = () => [[1, 'b/x', job('b', 'x')], [1, 'a/y', job('a', 'y')], [null, 'a/a', job('a', 'a')],
                            [2, 'a/z', job('a', 'z')], [1, 'a/x', job('a', 'x')]];
        return [L.sortRows(rows(), false).map((r) => r[1]), L.sortRows(rows(), true).map((r) => r[1]),
                L.sortRows(rows().reverse(), false).map((r) => r[1])];
        """,
    )
    ascending, descending, from_reversed = orders
    assert ascending == ["a/x", "a/y", "b/x", "a/z", "a/a"]
    assert descending == ["a/z", "a/x", "a/y", "b/x", "a/a"]  # ties in the same fixed order either way
    assert from_reversed == ascending  # the order of arrival changes nothing


def test_loss_rates_and_cost_as_the_server_sends_them(page: Any, server: Any) -> None:
    out = run_module(
        page,
        server.url,
        """
        const running = {state: 'running', health: {state: 'healthy'}, metrics: {loss: 0.91, lr: 1e-4},
                         metric_means: {loss: 0.4321}};
        const stalled = {state: 'running', health: {state: 'stalled', since: 1e9}};
        const stopped = {state: 'stopped', health: {state: 'healthy'}, metrics: {loss: 0.5}};
        const diverged = {state: 'running', health: {state: 'diverging'}, metrics: {loss: 'NaN'},
                          metric_means: {loss: 9.479744285347731e+34}};
        return {
          mean: F.lossFigure(running), last: F.lossFigure(stopped), nan: F.lossFigure(diverged),
          rates: [F.liveRate(running, 12.5), F.liveRate(stalled, 18.9), F.liveRate(stopped, 19.7)],
          texts: [F.fmtRate(running, 12.5), F.fmtRate(stalled, 18.9), F.fmtRate(stopped, 19.7)],
        };
        """,
    )
    assert out["mean"] == {"metric": "loss", "value": 0.4321, "last": 0.91, "smoothed": True}
    assert out["last"] == {"metric": "loss", "value": 0.5, "last": 0.5, "smoothed": False}
    # a NaN last batch is shown as NaN: the mean of the window's finite values would hide the blow-up
    assert out["nan"] == {"metric": "loss", "value": "NaN", "last": "NaN", "smoothed": False}
    assert out["rates"] == [12.5, None, None]
    running, stalled, stopped = out["texts"]
    assert running == "12.5"
    assert stalled.startswith("— (stalled since ") and stopped == "— (stopped)"


SCALES = """
const scale = (runs, log = false) => { const s = C.chooseScale(runs, log); return [s.log, s.range, s.note]; };
const lr = [5e-5, 4e-5, 3e-5, 2e-5, 1e-5, 0];
return {
  diverged: scale([[2.5, 1.25, 0.8, 0.5, 0.4, 0.31], [0.7, 0.5, 0.3, 0.2, 0.1], [2.5, 1.2, 0.8, 1e34, 3.4e34, 0]]),
  diverged_positive: scale([[2.5, 1.25, 0.8, 0.5, 0.4], [0.7, 0.5, 0.3, 0.2, 0.1], [2.5, 1.2, 1e34, 3.4e34]]),
  asked_log: scale([[2.5, 1.25, 0.8, 0.5, 0.4], [0.7, 0.5, 0.3, 0.2, 0.1], [2.5, 1.2, 1e34, 3.4e34]], true),
  learning_rate: scale([lr, lr.map((v) => 2 * v), [20, 20, 20, 20]]),
  auc: scale([[0.88, 0.9, 0.91, 0.92, 0.915], [0.89, 0.9, 0.905, 0.91]]),
  decades: scale([[10, 1, 0.1, 0.05], [8, 0.5, 0.04, 0.03]]),
  one_run_blows_up: scale([[2.5, 1.25, 0.8, 0.6, 0.5, 0.4, 0.35, 0.31, 1e34, 3.4e34, 0, null, NaN]]),
  steep_start: scale([[10, 5, 1, 0.3, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2]]),  // 50x: not decades
  two_levels: scale([[2.0, 1.5, 1.0, 0.5], [10, 8, 6, 5]]),
  markers: C.leaveMarkers([{name: 'a<b', x: [10, 20, 30, 40, 50, 60], values: [1, 2, 1e34, 3e34, 1, 1e34]},
                           {name: 'ok', x: [10, 20], values: [1, 2]}], {bounds: [0, 3]})
    .map((t) => [t.x, t.marker.symbol, t.text]),
};
"""


def test_a_diverged_run_never_flattens_the_others(page: Any, server: Any) -> None:
    s = run_module(page, server.url, SCALES)
    # clipped to the sane runs, linear (no log scale because one run blew up), said in the note
    log, (low, high), note = s["diverged"]
    assert not log and low < 0.1 and 2.5 < high < 3, s["diverged"]
    assert "clipped" in note and "off the chart" in note
    log, (low, high), _ = s["diverged_positive"]
    assert not log and high < 3, s["diverged_positive"]
    # the user asked for a log scale: log it is, and still clipped (in decades) to the sane runs
    log, (low, high), _ = s["asked_log"]
    assert log and -1.2 < low < -1 and 0.4 < high < 0.5, s["asked_log"]
    # a learning rate with one run at 20: the others' 0..1e-4 fill the chart
    log, (low, high), _ = s["learning_rate"]
    assert not log and high < 2e-4, s["learning_rate"]
    # a narrow flat series stays linear, on plotly's own range (readable ticks: 0.88, 0.89, ...)
    assert s["auc"] == [False, None, None]
    # every run spans decades: a log scale, said so; one run's steep start is not clipped
    assert s["decades"][0] is True and s["decades"][1] is None and "decades" in s["decades"][2]
    assert s["steep_start"] == [False, None, None]
    # one run's own blow-up (the side panel's chart) is off its chart
    log, (low, high), note = s["one_run_blows_up"]
    assert not log and high < 3 and "2 values off the chart" in note, s["one_run_blows_up"]
    # runs at different levels are all sane
    assert s["two_levels"] == [False, None, None]


def test_markers_show_where_a_run_leaves_the_range(page: Any, server: Any) -> None:
    markers = run_module(page, server.url, SCALES)["markers"]
    assert len(markers) == 1  # the run that stays inside has none
    x, symbols, text = markers[0]
    assert x == [30, 60] and symbols == ["triangle-up", "triangle-up"]  # the first point of each excursion
    assert text[0] == "a&lt;b leaves the chart above: 1e+34"


@pytest.mark.parametrize("end", ["stopped", "finished"])
def test_the_panel_of_an_ended_job_shows_no_live_rate_and_no_hourly_cost(page: Any, fleet: Any, end: str) -> None:
    fleet.register("ends", "team", total_steps=1000, gpus=2, gpu_hour_cost=3.0)
    for step in range(50, 700, 50):
        fleet.report("ends", step, {"loss": 1.0 / step}, "team", total_steps=1000)
    fleet.report("ends", 684, {"loss": 0.002}, "team", total_steps=1000, state=end)
    page.goto(f"{fleet.url}/#/?job=team%2Fends")
    page.wait_for_selector("#panel h2:text-is('ends')")
    page.wait_for_selector("#panel [data-testid=cost]")
    facts = dict(
        page.evaluate(
            "[...document.querySelectorAll('#panel dl.facts > div')]"
            ".map((d) => [d.querySelector('dt').textContent, d.querySelector('dd').textContent])"
        )
    )
    assert facts["Steps / s"] == f"— ({end})", facts
    assert facts["Rate"].startswith(f"— ({end}"), facts
    assert facts["Spent"].startswith("$"), facts
    assert page.locator("[data-testid=panel-percent]").inner_text() == "ended at 68.4%"
    bar = page.evaluate(
        "(() => { const b = document.querySelector('#panel .big-progress .bar'); "
        "return 100 * b.firstChild.getBoundingClientRect().width / b.getBoundingClientRect().width; })()"
    )
    assert abs(bar - 68.4) < 1, bar


def test_event_kinds_read_as_words(page: Any, server: Any) -> None:
    labels = run_module(
        page, server.url, "return ['command_acked', 'command', 'policy_set', 'some_new_kind'].map(F.eventLabel);"
    )
    assert labels == ["command received", "command sent", "policy set", "some new kind"]


def test_compare_marks_the_diverged_run_and_keeps_a_flat_metric_linear(page: Any, fleet: Any) -> None:
    for name in ("good", "also-good", "blows-up"):
        fleet.register(name, total_steps=1000)
    for i in range(1, 13):
        auc = 0.88 + 0.04 * (i % 5) / 4  # a narrow flat metric: 0.88..0.92
        fleet.report("good", 50 * i, {"loss": 2.0 / i, "auc": auc}, total_steps=1000)
        fleet.report("also-good", 50 * i, {"loss": 1.5 / i, "auc": auc - 0.005}, total_steps=1000)
        loss = 2.5 / i if i < 8 else 3.4e34 if i < 11 else float("nan")
        fleet.report("blows-up", 50 * i, {"loss": loss, "auc": 0.9}, total_steps=1000)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{fleet.url}/#/compare/default/good,default/also-good,default/blows-up")
    for metric in ("loss", "auc"):
        chart = f"document.querySelector(\".chart[data-metric='{metric}']\")"
        wait_js(page, f"const d = {chart}; return d && d._fullLayout;")
    loss = page.evaluate(
        "(() => { const d = document.querySelector(\".chart[data-metric='loss']\"); const y = d._fullLayout.yaxis; "
        "return {type: y.type, range: y.range, marks: d.data.filter((t) => /off the chart/.test(t.name))"
        ".map((t) => [t.x, t.marker.symbol])}; })()"
    )
    assert loss["type"] == "linear" and loss["range"][1] < 3, loss  # the others are not flattened
    assert loss["marks"] == [[[400], ["triangle-up"]]], loss  # where the diverged run leaves the chart
    note = page.locator(".chart[data-metric='loss'] + .chart-note").inner_text()
    assert "clipped" in note and "off the chart" in note
    auc = page.evaluate(
        "(() => { const y = document.querySelector(\".chart[data-metric='auc']\")._fullLayout.yaxis; "
        "return {type: y.type, ticks: y._vals.map((v) => v.text)}; })()"
    )
    assert auc["type"] == "linear", auc
    assert len(auc["ticks"]) >= 3 and all(len(t) <= 5 for t in auc["ticks"]), auc  # 0.88, 0.89, ...: readable
    # the user asks for a log scale: log it is, still clipped to the sane runs
    page.locator("#c-log").check()
    wait_js(page, "return document.querySelector(\".chart[data-metric='loss']\")._fullLayout.yaxis.type === 'log';")
    high = page.evaluate("document.querySelector(\".chart[data-metric='loss']\")._fullLayout.yaxis.range[1]")
    assert high < 1, high  # log10 units: under 10, not 3.4e34


def test_list_panel_and_compare_show_the_servers_figures_as_sent(page: Any, fleet: Any) -> None:
    fleet.register("at-9-96", total_steps=10_000, gpus=1, gpu_hour_cost=2.0)
    fleet.register("other", total_steps=100)
    fleet.report("at-9-96", 996, {"loss": [1.0, 0.2]}, total_steps=10_000)  # 9.96 %, loss mean 0.6, last 0.2
    fleet.report("other", 50, {"loss": 0.5}, total_steps=100)
    view = fleet.job("at-9-96")
    assert view["progress"]["percent"] == 9.9 and view["metric_means"]["loss"] == 0.6, view
    page.goto(f"{fleet.url}/")
    row = page.locator("tr[data-key='default/at-9-96']")
    row.wait_for()
    assert row.locator(".pct").inner_text() == "9.9%"
    loss = row.locator(".c-loss .v")
    assert loss.inner_text() == "0.6"  # the window's mean, not the last batch
    assert "last batch 0.2" in (loss.get_attribute("title") or "")
    page.goto(f"{fleet.url}/#/?job=default%2Fat-9-96")
    page.wait_for_selector("#panel h2:text-is('at-9-96')")
    assert page.locator("[data-testid=panel-percent]").inner_text() == "9.9%"
    page.goto(f"{fleet.url}/#/compare/default/at-9-96,default/other")
    progress = page.locator("table.compare tr", has=page.locator("th:text-is('progress')"))
    progress.wait_for()
    assert progress.locator("td:not(.mark)").all_inner_texts() == ["9.9%", "50.0%"]


def test_stall_evidence_reads_in_words_with_units(page: Any, server: Any) -> None:
    facts = run_module(
        page,
        server.url,
        """
        return F.evidenceFacts({metric: 'step', window: {seconds: 104.2}, threshold: 30.0, observed: 104.2,
          since: 1e9, message: 'x', rank: 0, step: 199, step_time: 0.1234, kind: 'busy', holding: [0],
          waiting: [1, 2], activity: 'loading_data', frames: ['train (train.py:42)', {function: 'load',
          file: 'data.py', line: 7}], eval_seconds: 65});
        """,
    )
    shown = dict(facts)
    assert shown["Observed"] == "1m 44s" and shown["Threshold"] == "30s", shown
    assert shown["At step"] == "199" and shown["Usual step time (p99)"] == "0.123 s"
    assert shown["Standing in"] == "a training step" and shown["Doing"] == "loading data"
    assert shown["Ranks standing"] == "rank 0" and shown["Ranks waiting for them"] == "ranks 1, 2"
    assert shown["In your code"] == "train (train.py:42); load (data.py:7)"
    assert shown["Evaluating for"] == "1m 05s"
    assert not any("_" in label or "_" in value for label, value in facts), facts


HANG = {  # evidence of a hang as the server writes it (analysis/stall.py), frames as the wire's text
    "metric": "step",
    "window": {"seconds": 36.0},
    "threshold": 35.0,
    "observed": 36.4,
    "since": 1e9,
    "message": "rank 1 has stood 36 s after step 29 in wait_for_lock (train.py:31), waiting "
    "(threading.Lock.acquire); rank 0 waits for it in torch.distributed.all_reduce",
    "rank": 1,
    "step": 29,
    "step_time": 0.5,
    "kind": "hang",
    "holding": [1],
    "waiting": [0],
    "activity": "waiting",
    "place": "in wait_for_lock (train.py:31), waiting (threading.Lock.acquire)",
    "frames": ["wait_for_lock (train.py:31)", "main (train.py:58)"],
    "detail": "threading.Lock.acquire",
    "ranks_standing": [1],
}
STRAGGLER = {  # a straggler's (analysis/straggler.py)
    "metric": "rank_pace",
    "window": {"seconds": 300},
    "threshold": 1.5,
    "observed": 2.44,
    "since": 1e9,
    "message": "rank 2 (host node-3) is 2.4x slower than the median rank, for 5 min; without rank 2 the job "
    "would run 2.4x faster",
    "rank": 2,
    "host": "node-3",
    "ratio": 2.44,
    "speedup_without": 2.4,
    "activity_shares": {"computing": 0.3, "loading_data": 0.6, "communicating": 0.1},
    "median_activity_shares": {"computing": 0.3, "communicating": 0.7},
    "hint": "without rank 2 the job would run 2.4x faster",
}
SAME_WORDS = {  # labels whose text both readers write the same way (durations and plain numbers have each their own)
    "Standing in", "Doing", "In the call", "In your code", "Ranks standing", "Ranks waiting for them", "Host",
    "Slower than the median rank by", "Faster without it by", "Its time goes to", "The median rank's time goes to",
    "At step", "Rank",
}  # fmt: skip


@pytest.mark.parametrize("evidence", [HANG, STRAGGLER], ids=["hang", "straggler"])
def test_the_dashboard_and_the_cli_say_a_verdict_in_the_same_words(page: Any, server: Any, evidence: Any) -> None:
    """Issue 29 item 6: ``evidenceFacts`` (the panel) and ``evidence_lines`` (``describe``, ``top``) give the same
    labels in the same order, and the same words for the rank, its place, its host and its shares."""
    from stepwatch.cli._format import evidence_lines

    facts = [tuple(f) for f in run_module(page, server.url, f"return F.evidenceFacts({json.dumps(evidence)});")]
    lines = evidence_lines(evidence)
    assert [label for label, _ in facts if label != "Since"] == [label for label, _ in lines]
    js, py = dict(facts), dict(lines)
    for label in SAME_WORDS & set(js):
        assert js[label] == py[label], (label, js[label], py[label])
    assert "Where" not in js and "Without it" not in js  # they repeat the message
    if evidence is STRAGGLER:
        assert js["Observed"] == py["Observed"] == "2.4x" and js["Threshold"] == py["Threshold"] == "1.5x"
        assert js["Its time goes to"] == "loading data 60%, computing 30%, communicating 10%"
    else:
        assert js["Standing in"] == "its own code, a lock or its loader"
