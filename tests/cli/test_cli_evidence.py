"""How ``stepwatch describe`` prints a health verdict's evidence: every value formatted for a person, never
the Python or JSON spelling of the server's data (``Window: {'seconds': 30, 'steps': 574}``) nor a float
with all its digits (``0.07084809085767296``)."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest

from stepwatch.cli._format import clock_time, evidence_lines, value_text, window_text
from stepwatch.cli._top_view import job_details
from stepwatch.cli.describe import describe
from stepwatch.cli.watch import _Bar, _Lines, verdict_lines
from stepwatch.client import Job
from stepwatch.server.analysis.health import HealthTracker
from stepwatch.server.analysis.health_params import HealthParams

NOT_LEARNING = {  # a not_learning verdict's evidence as the server sends it (analysis/health.py)
    "metric": "loss",
    "window": {"seconds": 30, "steps": 574},
    "threshold": 0.01,
    "observed": -0.000412345678,
    "since": 1_796_457_916.346,
    "message": "loss has not improved by 1% over the last 574 steps (30s)",
    "noise": 0.00123456789,
    "noise_z": 2.0,
    "best": 0.07084809085767296,
    "best_step": 4100,
    "level": 0.06784123456,
}


def test_the_evidence_reads_as_labelled_rounded_values() -> None:
    lines = dict(evidence_lines(NOT_LEARNING))
    assert lines["Measured over"] == "30s, 574 steps"
    assert lines["Best smoothed level earlier"] == "0.07085" and lines["... at step"] == "4,100"
    assert lines["Level (recent mean)"] == "0.06784"
    assert lines["Observed"] == "-0.0004123" and lines["Threshold"] == "0.01"
    assert "message" not in lines and "Since" not in lines  # the message is the Why line, the start is Since
    assert list(lines)[:4] == ["Metric", "Measured over", "Observed", "Threshold"]
    assert window_text({"windows": 1}) == "1 report" and window_text({"windows": 3}) == "3 reports"
    fired = {"t": 1_796_457_916.346, "action": "stop"}
    assert value_text(fired) == f"t {clock_time(fired['t'])}, action stop"
    assert value_text("NaN") == "NaN" and value_text(None) == "-" and value_text(True) == "yes"


def test_describe_prints_no_raw_mapping_or_long_float() -> None:
    view = {
        "name": "bert",
        "namespace": "default",
        "state": "running",
        "health": {"state": "not_learning", "since": NOT_LEARNING["since"], "evidence": NOT_LEARNING},
        "progress": {"percent": 40.0, "step": 1199, "total_steps": 3000},
        "metrics": {"loss": 0.07084809085767296},
        "times": {"created": 1_796_450_000.0},
    }
    out = io.StringIO()
    describe(view, [], out, now=1_796_458_000.0)
    text = out.getvalue()
    assert "{" not in text and "}" not in text, text
    assert not re.search(r"\d\.\d{8,}", text), text
    assert "Measured over:" in text and "30s, 574 steps" in text


def test_describe_prints_every_verdict_the_job_had_with_its_span_and_cost() -> None:
    """A job that recovered keeps its verdicts (the job view's health_history): describe lists each, when
    it began, how long it stood and what it wasted, so 'healthy' now does not hide the stall before."""
    t0 = 1_796_450_000.0
    view = {
        "name": "bert",
        "namespace": "default",
        "state": "finished",
        "health": {"state": "healthy", "since": t0 + 600, "evidence": {}},
        "health_history": [
            {"state": "healthy", "from": t0, "to": t0 + 300, "seconds": 300.0, "cost": 0.5, "wasted": 0.0},
            {
                "state": "stalled",
                "from": t0 + 330,
                "since": t0 + 300,
                "to": t0 + 600,
                "seconds": 300.0,
                "cost": 0.5,
                "wasted": 0.5,
            },
            {"state": "healthy", "from": t0 + 600, "to": None, "seconds": 60.0, "cost": 0.1, "wasted": 0.0},
        ],
        "progress": {"percent": 100.0, "step": 3000, "total_steps": 3000},
        "times": {"created": t0},
    }
    out = io.StringIO()
    describe(view, [], out, now=t0 + 660)
    text = out.getvalue()
    section = text[text.index("Health history:") :].splitlines()[1:4]
    assert section[1].split() == ["stalled:", clock_time(t0 + 300, t0 + 660), "for", "5m00s,", "$0.50", "wasted"]
    assert section[0].strip().startswith("healthy:") and not section[2].strip().endswith("still")  # it ended
    out = io.StringIO()
    describe({**view, "state": "running"}, [], out, now=t0 + 660)
    assert out.getvalue().split("Health history:")[1].splitlines()[3].strip().endswith("still")
    healthy_only = {**view, "health_history": [view["health_history"][0]]}  # type: ignore[index]
    out = io.StringIO()
    describe(healthy_only, [], out, now=t0 + 660)
    assert "Health history" not in out.getvalue()


# ------------------------------------------------------- verdicts by where each rank stands (issue 29 item 6)


def _hang_and_straggler() -> tuple[dict[str, Any], dict[str, Any]]:
    """A hang's and a straggler's evidence as the server's own health tracker writes them (its knobs short,
    so that a few simulated seconds do what a real job does in 45 s and 5 minutes)."""
    params = HealthParams(hang_floor_s=1.0, stall_floor_s=2.0, standstill_floor_s=2.0, straggler_hold_s=2.0)
    hung = HealthTracker(params=params)
    t = 100.0
    for step in range(1, 21):
        for rank in range(2):
            hung.observe_progress(t, rank, step, 1000)
        t += 0.01
    for _ in range(20):
        t += 0.5
        hung.observe_progress(t, 1, 20, 1000)
        hung.observe_where(t, 1, 20, "waiting", t - 100.2, "threading.Lock.acquire", ["wait_for_lock (train.py:31)"])
        hung.observe_progress(t, 0, 20, 1000)
        hung.observe_where(t, 0, 20, "communicating", t - 100.2, "torch.distributed.all_reduce", ["main (train.py:9)"])
        hang = hung.verdict(t)
        if hang.state == "stalled":
            break
    assert hang.state == "stalled", hang
    slow = HealthTracker(params=params)
    waits = {"computing": 0.3, "communicating": 0.7}
    lags = {"computing": 0.3, "loading_data": 0.6, "communicating": 0.1}
    for i in range(200):
        t = 100.0 + i * 0.5
        for rank in range(3):
            slow.observe_progress(t, rank, 10 * (i + 1), 100_000)
            slow.observe_shares(rank, lags if rank == 2 else waits, host=f"node-{rank + 1}")
        straggler = slow.verdict(t)
        if straggler.state == "straggling":
            break
    assert straggler.state == "straggling", straggler
    return dict(hang.evidence), dict(straggler.evidence)


def test_a_hang_and_a_straggler_read_in_the_dashboards_words() -> None:
    hang, straggler = _hang_and_straggler()
    lines = dict(evidence_lines(hang))
    assert lines["Standing in"] == "its own code, a lock or its loader"  # never "Kind hang"
    assert lines["Doing"] == "waiting" and lines["In the call"] == "threading.Lock.acquire"
    assert lines["In your code"] == "wait_for_lock (train.py:31)"
    assert lines["Ranks standing"] == "rank 1" and lines["Ranks waiting for them"] == "rank 0"
    assert lines["Observed"].endswith("s") and lines["Threshold"].endswith("s")  # seconds, with their unit
    assert "Where" not in lines  # the place is in the message already
    lines = dict(evidence_lines(straggler))
    assert lines["Metric"] == "each rank's pace"
    assert lines["Observed"] == "3.0x" and lines["Threshold"] == "1.5x"  # times slower, never a bare fraction
    assert lines["Host"] == "node-3" and lines["Slower than the median rank by"] == "3.0x"
    assert lines["Its time goes to"] == "loading data 60%, computing 30%, communicating 10%"
    assert lines["The median rank's time goes to"] == "communicating 70%, computing 30%"
    assert "Without it" not in lines  # the elastic hint is in the message
    for label, text in lines.items():
        assert not re.fullmatch(r"0\.\d+", text), (label, text)
    # an ended job's final judgement: "final yes" says nothing the message does not
    assert "final" not in dict(evidence_lines({"message": "finished at step 9", "final": True}))


def test_watch_says_the_verdict_under_the_bar_wrapped_never_cut() -> None:
    hang, straggler = _hang_and_straggler()
    view: dict[str, Any] = {"health": {"state": "stalled", "evidence": hang}}
    message = hang["message"]
    assert "rank 1" in message and "wait_for_lock (train.py:31)" in message
    for width in (40, 60, 80, 200):
        lines = verdict_lines(view, width)
        assert all(len(line) <= width for line in lines), (width, lines)
        assert " ".join(line.strip() for line in lines) == f"stalled: {message}"  # every word, in order, whole
    # a word longer than the line stands alone, whole
    long_frame = {"health": {"state": "stalled", "evidence": {"message": "in " + "x" * 50 + " (a.py:1)"}}}
    assert "  " + "x" * 50 in verdict_lines(long_frame, 30)
    assert verdict_lines({"health": {"state": "healthy", "evidence": {"message": "fine"}}}, 80) == []
    assert verdict_lines({"health": {"state": "straggling", "evidence": straggler}}, 80)[0].startswith(
        "straggling: rank 2"
    )


def test_watch_piped_prints_the_verdict_once_under_its_line() -> None:
    hang, _ = _hang_and_straggler()
    view = {
        "name": "bert",
        "namespace": "default",
        "state": "running",
        "health": {"state": "stalled", "since": 1.0, "evidence": hang},
        "progress": {"percent": 2.0, "step": 20, "total_steps": 1000},
        "metrics": {},
    }
    out = io.StringIO()
    lines = _Lines(out)
    lines.show(view, None)
    text = out.getvalue().splitlines()
    assert text[0].startswith("default/bert running") and text[1].startswith("  stalled: rank 1 has stood")
    lines._last_at = -100.0  # the next line is due; the verdict has not changed: not said again
    view["progress"] = {**view["progress"], "percent": 2.1}
    lines.show(view, None)
    assert len([t for t in out.getvalue().splitlines() if "stalled:" in t]) == 1


def test_watch_on_a_terminal_puts_the_verdict_under_the_bar() -> None:
    pytest.importorskip("rich")
    hang, _ = _hang_and_straggler()
    view = {
        "name": "bert",
        "namespace": "default",
        "state": "running",
        "health": {"state": "stalled", "since": 1.0, "evidence": hang},
        "progress": {"percent": 2.0, "step": 20, "total_steps": 1000},
        "metrics": {},
    }
    out = io.StringIO()
    with _Bar(out, "default/bert") as bar:
        bar.show(view, None)
    text = out.getvalue()
    assert "━" in text and "stalled: rank 1 has stood" in text and "wait_for_lock" in text, text
    assert text.index("━") < text.index("stalled: rank 1")


def test_top_job_screen_gives_a_verdicts_evidence_in_words() -> None:
    hang, straggler = _hang_and_straggler()
    base = {"name": "ddp", "namespace": "default", "state": "running", "progress": {"step": 20, "total_steps": 1000}}
    text = job_details(Job({**base, "health": {"state": "stalled", "since": 1.0, "evidence": hang}}), [])
    assert "Standing in:[/dim] its own code, a lock or its loader" in text, text
    assert "In your code:[/dim] wait_for_lock (train.py:31)" in text and "Ranks waiting for them:[/dim] rank 0" in text
    text = job_details(Job({**base, "health": {"state": "straggling", "since": 1.0, "evidence": straggler}}), [])
    assert "Host:[/dim] node-3" in text and "loading data 60%" in text, text
    healthy = {"state": "healthy", "evidence": {"metric": "loss", "message": "fine", "threshold": 0.01}}
    assert "Threshold" not in job_details(Job({**base, "health": healthy}), [])  # nothing to act on: the message only
