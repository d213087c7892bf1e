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
