"""OpenShift AI's progression format (stepwatch.protocol.progression) against Red Hat's own tests and Go itself.

Ported cases name their upstream test: Red Hat's fork of Kubeflow Trainer,
``pkg/rhai/progression/progression_test.go`` at c0df7487865d6e2ab90b14982ec7ae69ead41d30 (the last change of
``pkg/rhai`` on ``release/odh-3.4.0``). The controller's own decoder is Go's ``encoding/json``: where ``go``
is installed (CI installs Debian's ``golang-go``), every body of the corpus below is also read and written
by a Go program with the controller's struct shapes (tests/go/progression/main.go), and the port must
agree with it byte for byte.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from gohelp import needs_go, run_go
from stepwatch.protocol.progression import (
    MAX_TERMINATION_MESSAGE,
    AnnotationStatus,
    ProgressionError,
    ProgressionStatus,
    build_status,
    clean_invalid,
    decode_annotation,
    decode_status,
    encode_annotation,
    encode_served,
    format_duration_summary,
)

# ------------------------------------------------------------------ progression_test.go, ported


def test_poll_successful_with_complete_metrics() -> None:
    """progression_test.go TestPollTrainingProgress "successful poll with complete metrics"."""
    body = """{
        "progressPercentage": 45, "estimatedRemainingSeconds": 9855, "currentStep": 4530, "totalSteps": 10000,
        "currentEpoch": 2, "totalEpochs": 5,
        "trainMetrics": {"loss": 0.234, "learning_rate": 0.00005, "throughput_samples_sec": 128.5},
        "evalMetrics": {"eval_accuracy": 0.89, "eval_f1_score": 0.87}
    }"""
    assert decode_status(body) == ProgressionStatus(
        progress_percentage=45,
        estimated_remaining_seconds=9855,
        current_step=4530,
        total_steps=10000,
        current_epoch=2.0,
        total_epochs=5,
        train_metrics={"loss": 0.234, "learning_rate": 0.00005, "throughput_samples_sec": 128.5},
        eval_metrics={"eval_accuracy": 0.89, "eval_f1_score": 0.87},
    )


def test_poll_invalid_json() -> None:
    """progression_test.go TestPollTrainingProgress "invalid json"."""
    with pytest.raises(ProgressionError):
        decode_status("{invalid json}")


@pytest.mark.parametrize(
    ("name", "status", "expected"),
    [
        (
            "valid status unchanged",
            ProgressionStatus(50, 1200, 500, 1000, 2.0, 5),
            ProgressionStatus(50, 1200, 500, 1000, 2.0, 5),
        ),
        (
            "negative progress percentage removed",
            ProgressionStatus(-1, current_step=500),
            ProgressionStatus(None, current_step=500),
        ),
        (
            "progress percentage over 100 removed",
            ProgressionStatus(150, current_step=500, total_steps=1000),
            ProgressionStatus(None, current_step=500, total_steps=1000),
        ),
        (
            "negative current step clamped to 0",
            ProgressionStatus(50, current_step=-1),
            ProgressionStatus(50, current_step=0),
        ),
        (
            "negative total steps removed",
            ProgressionStatus(50, current_step=500, total_steps=-100),
            ProgressionStatus(50, current_step=500),
        ),
        (
            "zero total steps preserved (valid for indefinite training)",
            ProgressionStatus(current_step=500, total_steps=0),
            ProgressionStatus(current_step=500, total_steps=0),
        ),
        (
            "negative current epoch clamped to 0",
            ProgressionStatus(50, current_step=500, current_epoch=-5.0),
            ProgressionStatus(50, current_step=500, current_epoch=0.0),
        ),
        (
            "negative total epochs removed",
            ProgressionStatus(current_epoch=2.0, total_epochs=-3),
            ProgressionStatus(current_epoch=2.0),
        ),
        (
            "negative estimated remaining seconds removed",
            ProgressionStatus(50, estimated_remaining_seconds=-100),
            ProgressionStatus(50),
        ),
        (
            "nil progress percentage preserved",
            ProgressionStatus(None, current_step=500, current_epoch=1.0),
            ProgressionStatus(None, current_step=500, current_epoch=1.0),
        ),
        (
            "multiple invalid fields sanitized independently",
            ProgressionStatus(150, -50, -10, -100, -2.0, 5),
            ProgressionStatus(None, None, 0, None, 0.0, 5),
        ),
    ],
)
def test_clean_invalid_metrics(name: str, status: ProgressionStatus, expected: ProgressionStatus) -> None:
    """progression_test.go TestCleanInvalidMetrics, every case (``name``)."""
    assert clean_invalid(status) == expected


@pytest.mark.parametrize(
    ("name", "seconds", "want"),
    [
        ("nil input", None, ""),
        ("zero or negative", -100, ""),
        ("less than a minute", 30, "less than a minute"),
        ("minutes only", 90, "1 minute"),
        ("hours only", 3600, "1 hour"),
        ("hours and minutes", 3665, "1 hour 1 minute"),
        ("days only", 86400, "1 day"),
        ("days and hours", 90000, "1 day 1 hour"),
        ("truncates to first 2 parts", 90060, "1 day 1 hour"),
        # beyond upstream's cases: zero, plurals, days with minutes left out
        ("zero", 0, ""),
        ("plurals", 2 * 86400 + 5 * 3600, "2 days 5 hours"),
        ("hours and minutes, plural", 9855, "2 hours 44 minutes"),
        ("days and minutes: minutes dropped", 86400 + 120, "1 day"),
    ],
)
def test_format_duration_summary(name: str, seconds: int | None, want: str) -> None:
    """progression_test.go TestFormatDurationSummary, every case (``name``), and a few more."""
    assert format_duration_summary(seconds) == want


def test_update_trainer_status_annotation_with_metrics() -> None:
    """progression_test.go TestUpdateTrainerStatusAnnotation "successful update" and "update with metrics":
    the annotation is valid JSON holding every metric, and reads back as what was written."""
    plain = AnnotationStatus(10, 9000, 100, 1000, 1.0, 10, last_updated_time="2025-11-18T10:00:00Z")
    assert json.loads(encode_annotation(plain)) == {
        "progressPercentage": 10,
        "estimatedRemainingSeconds": 9000,
        "currentStep": 100,
        "totalSteps": 1000,
        "currentEpoch": 1,
        "totalEpochs": 10,
        "lastUpdatedTime": "2025-11-18T10:00:00Z",
    }
    rich = AnnotationStatus(
        50,
        current_step=500,
        total_steps=1000,
        current_epoch=5.0,
        train_metrics={"loss": 0.5, "learning_rate": 0.001},
        eval_metrics={"eval_accuracy": 0.95, "eval_f1_score": 0.92},
        last_updated_time="2025-11-18T11:00:00Z",
    )
    text = encode_annotation(rich)
    decoded = json.loads(text)
    assert set(decoded["trainMetrics"]) == {"loss", "learning_rate"}
    assert set(decoded["evalMetrics"]) == {"eval_accuracy", "eval_f1_score"}
    assert decode_annotation(text) == rich


def test_to_annotation_status_summary_and_omitted_fields() -> None:
    """progression_test.go TestToAnnotationStatus: "complete status conversion" (summary "1 hour 1 minute"),
    "nil remaining seconds" and "zero remaining seconds" (no summary; a remaining 0 is still written)."""
    assert format_duration_summary(3665) == "1 hour 1 minute"
    nil = AnnotationStatus(50, None, 500, summary=format_duration_summary(None), last_updated_time="T")
    assert encode_annotation(nil) == '{"progressPercentage":50,"currentStep":500,"lastUpdatedTime":"T"}'
    zero = AnnotationStatus(100, 0, 1000, summary=format_duration_summary(0), last_updated_time="T")
    assert encode_annotation(zero) == (
        '{"progressPercentage":100,"estimatedRemainingSeconds":0,"currentStep":1000,"lastUpdatedTime":"T"}'
    )
    empty = decode_status("{}")
    assert encode_annotation(AnnotationStatus(**vars(empty), last_updated_time="T")) == (
        '{"progressPercentage":null,"lastUpdatedTime":"T"}'
    )


# ------------------------------------------------------------------ what Go's decoder refuses


@pytest.mark.parametrize(
    "body",
    [
        '{"progressPercentage": 45.0}',  # a float in an int field: the whole poll is dropped
        '{"progressPercentage": 45.5}',
        '{"currentStep": 1e3}',
        '{"totalSteps": "100"}',
        '{"progressPercentage": NaN}',  # Python's json.dumps default
        '{"trainMetrics": {"loss": NaN}}',
        '{"trainMetrics": {"loss": Infinity}}',
        '{"trainMetrics": {"loss": 1e400}}',  # beyond float64
        '{"currentEpoch": 1e400}',
        '{"currentEpoch": "1.5"}',
        '{"trainMetrics": [1, 2]}',
        '{"evalMetrics": "none"}',
        '{"currentStep": 9223372036854775808}',  # beyond int64
        '{"currentStep": true}',
        "[]",
        '"status"',
        "45",
        '{"a": 1,}',
        '{"a": 1} {}',
        "",
        "\ufeff{}",
    ],
)
def test_go_refuses(body: str) -> None:
    with pytest.raises(ProgressionError):
        decode_status(body)


def test_go_reading_quirks() -> None:
    """What Go does and a naive reader would not: keys without regard to case, a map filled twice, null."""
    assert decode_status("null") == ProgressionStatus()
    assert decode_status('{"PROGRESSPERCENTAGE": 7, "currentstep": 3}') == ProgressionStatus(7, current_step=3)
    assert decode_status('{"trainMetrics": {"a": 1}, "trainMetrics": {"b": 2}}').train_metrics == {"a": 1.0, "b": 2.0}
    assert decode_status('{"currentStep": 5, "currentStep": null}').current_step is None
    assert decode_status('{"currentStep": -0, "elapsedSeconds": 12.5}') == ProgressionStatus(current_step=0)
    assert (
        decode_annotation(
            '{"progressPercentage": 1, "lastUpdatedTime": "x", "lastUpdatedTime": null}'
        ).last_updated_time
        == "x"
    )
    assert decode_status(b'{"trainMetrics": {"k": "\xff"}}').train_metrics == {"k": "\ufffd"}


# ------------------------------------------------------------------ what a pod serves


@pytest.mark.parametrize(
    ("step", "total", "percent"),
    [(371, 375, 98), (121, 124, 97), (999, 1000, 99), (1000, 1000, 100), (1001, 1000, 100), (0, 10, 0)],
)
def test_progress_is_rounded_down(step: int, total: int, percent: int) -> None:
    """kubeflow-sdk transformers_test.py's rounding cases (371/375 is 98, not 99): 100 only when done."""
    assert build_status(step=step, total_steps=total).progress_percentage == percent


def test_served_json_is_what_go_takes() -> None:
    status = build_status(
        step=371,
        total_steps=375,
        epoch=1.98,
        total_epochs=2.5,
        eta_seconds=12.6,
        metrics={"loss": math.nan, "grad_norm": math.inf, "learning_rate": 5e-5, "eval_loss": 0.5, "val_acc": 0.9},
    )
    body = encode_served(status)
    data = json.loads(body)
    assert data == {
        "progressPercentage": 98,
        "estimatedRemainingSeconds": 13,
        "currentStep": 371,
        "totalSteps": 375,
        "currentEpoch": 1.98,
        "totalEpochs": 3,
        "trainMetrics": {"loss": None, "grad_norm": None, "learning_rate": 5e-5},
        "evalMetrics": {"eval_loss": 0.5, "val_acc": 0.9},
    }
    assert decode_status(body).progress_percentage == 98


def test_ended_runs() -> None:
    early = build_status(step=500, total_steps=1000, eta_seconds=600.0, ended="stopped")
    assert (early.progress_percentage, early.estimated_remaining_seconds) == (50, 0)
    unknown_total = build_status(step=42, total_steps=None, ended="finished")
    assert (unknown_total.progress_percentage, unknown_total.total_steps) == (100, None)
    crashed = build_status(step=42, total_steps=None, ended="failed")
    assert crashed.progress_percentage is None
    running = build_status(step=42, total_steps=None)
    assert running.progress_percentage is None and running.estimated_remaining_seconds is None


def test_termination_message_fits_the_kubelet_limit() -> None:
    metrics = {f"metric_{i:03d}_with_a_long_name": 1.0 / (i + 3) for i in range(200)}
    metrics.update({f"eval_metric_{i:03d}": 0.5 for i in range(50)})
    status = build_status(step=10, total_steps=20, metrics=metrics, ended="finished")
    body = encode_served(status, max_bytes=MAX_TERMINATION_MESSAGE)
    assert len(body) <= MAX_TERMINATION_MESSAGE
    back = decode_status(body)
    assert (back.progress_percentage, back.current_step, back.estimated_remaining_seconds) == (50, 10, 0)
    assert back.train_metrics and "metric_000_with_a_long_name" in back.train_metrics
    assert len(encode_served(status)) > MAX_TERMINATION_MESSAGE  # the cut was needed


# ------------------------------------------------------------------ against Go's own encoding/json


def _corpus() -> list[tuple[str, str]]:
    cases = [
        '{"progressPercentage": 45, "estimatedRemainingSeconds": 9855, "currentStep": 4530, "totalSteps": 10000,'
        ' "currentEpoch": 2, "totalEpochs": 5, "trainMetrics": {"loss": 0.234, "learning_rate": 0.00005,'
        ' "throughput_samples_sec": 128.5}, "evalMetrics": {"eval_accuracy": 0.89, "eval_f1_score": 0.87}}',
        '{"progressPercentage": 45.0}',
        '{"progressPercentage": NaN}',
        '{"trainMetrics": {"loss": 1e400}}',
        '{"trainMetrics": {"tiny": 1e-400, "big": 1e21, "small": 1.5e-7, "edge": 1e-6, "plain": 1e20}}',
        '{"currentEpoch": 1.976, "totalEpochs": 2}',
        '{"currentEpoch": -0.0, "currentStep": -0}',
        "null",
        "{}",
        "[]",
        '{"PROGRESSPERCENTAGE": 7, "currentstep": 3, "CurrentEpoch": 0.5}',
        '{"trainMetrics": {"a": 1}, "trainMetrics": {"b": 2}}',
        '{"trainMetrics": {"a": 1}, "trainMetrics": null}',
        '{"currentStep": 5, "currentStep": null}',
        '{"trainMetrics": {"html": "<a & b>", "line": "x\\u2028y", "ctl": "\\u0001", "uni": "\\u00e9\\ud83d\\ude00"}}',
        '{"trainMetrics": {"lone": "\\ud800"}}',
        '{"evalMetrics": {"nested": {"b": [1, "two", null, true], "a": {}}}}',
        '{"trainMetrics": {"\\u00e9": 1, "z": 2, "A": 3, "a": 4}}',
        '{"currentStep": 9223372036854775807}',
        '{"currentStep": 9223372036854775808}',
        '{"totalSteps": "100"}',
        '{"evalMetrics": []}',
        '{"trainMetrics": {"n": 123456789012345678901234567890}}',
        '{"trainMetrics": {"n": 0.1, "m": 100.0, "o": -2.5e-300}}',
        '{"a": 1,}',
        '{"progressPercentage": 1} x',
    ]
    annotations = [
        '{"progressPercentage":98,"estimatedRemainingSeconds":0,"estimatedRemainingTimeSummary":"complete",'
        '"currentStep":371,"totalSteps":375,"currentEpoch":1.98,"totalEpochs":2,"trainMetrics":{"loss":0.5},'
        '"lastUpdatedTime":"2026-12-06T10:00:00Z"}',
        '{"progressPercentage":null,"lastUpdatedTime":"2026-12-06T10:00:00Z"}',
        '{"estimatedRemainingTimeSummary": 5}',
        '{"lastUpdatedTime": null, "progressPercentage": 3}',
        '{"estimatedRemainingTimeSummary": "failed at 60%", "progressPercentage": 60}',
        "not json",
    ]
    rng = random.Random(20261206)
    values = [
        "0", "-0", "1", "-1", "45", "100", "150", "-100", "2.0", "1.98", "1e2", "1E-3", '"7"', "null", "true",
        "[]", "{}", '{"loss": 0.5}', '{"loss": null, "x": "y"}', "9007199254740993", "0.000001", "1e21",
    ]  # fmt: skip
    keys = [
        "progressPercentage", "estimatedRemainingSeconds", "currentStep", "totalSteps", "currentEpoch",
        "totalEpochs", "trainMetrics", "evalMetrics", "TotalSteps", "other",
    ]  # fmt: skip
    for _ in range(300):
        chosen = rng.sample(keys, rng.randint(0, 6))
        cases.append("{" + ", ".join(f'"{k}": {rng.choice(values)}' for k in chosen) + "}")
    return [("status", body) for body in cases] + [("annotation", body) for body in annotations]


def _python_side(kind: str, body: str) -> dict[str, object]:
    try:
        if kind == "status":
            status = decode_status(body)
            annotation = AnnotationStatus(**vars(status), last_updated_time="T")
        else:
            annotation = decode_annotation(body)
    except ProgressionError:
        return {"ok": False}
    return {"ok": True, "annotation": encode_annotation(annotation)}


@needs_go
def test_port_agrees_with_go_encoding_json() -> None:
    """Every body of the corpus: accepted or refused alike, and written back byte for byte alike."""
    corpus = _corpus()
    answers = run_go("progression", [{"kind": kind, "body": body} for kind, body in corpus])
    disagreements = []
    for (kind, body), go in zip(corpus, answers):
        ours = _python_side(kind, body)
        theirs = {"ok": go["ok"], **({"annotation": go["annotation"]} if go["ok"] else {})}
        if ours != theirs:
            disagreements.append((kind, body, ours, theirs, go.get("error")))
    assert not disagreements, "\n".join(map(repr, disagreements[:10]))
    accepted = sum(1 for a in answers if a["ok"])
    assert 0 < accepted < len(corpus)  # the corpus holds both kinds
