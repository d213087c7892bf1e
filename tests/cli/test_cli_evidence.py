"""How ``stepwatch describe`` prints a health verdict's evidence: every value formatted for a person, never
the Python or JSON spelling of the server's data (``Window: {'seconds': 30, 'steps': 574}``) nor a float
with all its digits (``0.07084809085767296``)."""

from __future__ import annotations

import io
import re

from stepwatch.cli._format import clock_time, evidence_lines, value_text, window_text
from stepwatch.cli.describe import describe

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
