"""OpenShift AI's progression controller, its pure rules as ported (``progression.py``), against Red Hat's own tests.

Each test names its upstream case: Red Hat's fork of Kubeflow Trainer, ``pkg/rhai/progression/progression_test.go``
at c0df7487865d6e2ab90b14982ec7ae69ead41d30 (the last change of ``pkg/rhai`` on ``release/odh-3.4.0``).
Upstream's pod cases run on controller-runtime's fake client; here the pure choice gets the pods as the API
lists them, and ``test_poll_mode.py`` runs the same cases through the runner against the FAKE API server.
``Bn`` names a case of the reference (docs/kubernetes.md's conformance table).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from stepwatch.protocol import format_rfc3339
from stepwatch.protocol.progression import (
    ANNOTATION_METRICS_PORT,
    ANNOTATION_POLL_INTERVAL,
    ANNOTATION_STATUS,
    ANNOTATION_TRACKING,
    SUMMARY_METRIC,
    AnnotationStatus,
    ProgressionError,
    decode_annotation,
)
from stepwatch.server.runners.kubernetes.progression import (
    Poll,
    PollState,
    final_pod,
    final_status_captured,
    metrics_port,
    next_poll,
    primary_pod,
    status_from_annotation,
    termination_status,
    to_annotation,
    tracking_enabled,
    update_final_status,
    with_final_summary,
)

NOW = 1_800_000_000.0


# ------------------------------------------------------------------------------------- switches


@pytest.mark.parametrize(
    ("name", "annotations", "enabled"),
    [
        ("enabled with true", {ANNOTATION_TRACKING: "true"}, True),
        ("other values not accepted", {ANNOTATION_TRACKING: "enabled"}, False),
        ("false value", {ANNOTATION_TRACKING: "false"}, False),
        ("no annotation", {}, False),
        ("nil annotations", {}, False),
    ],
)
def test_is_progression_tracking_enabled(name: str, annotations: dict[str, str], enabled: bool) -> None:
    """progression_test.go TestIsProgressionTrackingEnabled, every case (``name``); B1."""
    assert tracking_enabled(annotations) is enabled


@pytest.mark.parametrize("value", ["True", "TRUE", " true", "true ", "1", "yes", ""])
def test_tracking_is_exactly_true(value: str) -> None:
    """B1: exactly ``"true"`` (the package README's ``"enabled"`` and every other spelling leave it off)."""
    assert not tracking_enabled({ANNOTATION_TRACKING: value})


@pytest.mark.parametrize(
    ("name", "annotations", "port"),
    [
        ("custom port", {ANNOTATION_METRICS_PORT: "8080"}, "8080"),
        ("default port", {}, "28080"),
        ("nil annotations", {}, "28080"),
        ("empty annotation (B2)", {ANNOTATION_METRICS_PORT: ""}, "28080"),
        ("verbatim, not checked (B2)", {ANNOTATION_METRICS_PORT: "http"}, "http"),
    ],
)
def test_get_metrics_port(name: str, annotations: dict[str, str], port: str) -> None:
    """progression_test.go TestGetMetricsPort, every case (``name``), and B2's empty and verbatim values."""
    assert metrics_port(annotations) == port


# ------------------------------------------------------------------------------------------ pods


def pod(
    name: str,
    labels: dict[str, str],
    phase: str = "Running",
    ip: str = "",
    ready: bool | None = None,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "podIP": ip}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
    if containers is not None:
        status["containerStatuses"] = containers
    return {"metadata": {"name": name, "namespace": "default", "labels": labels}, "status": status}


LEGACY = "training.kubeflow.org/job-name"


@pytest.mark.parametrize(
    ("name", "pods", "want"),
    [
        (
            "running pod found",
            [pod("test-job-worker-0", {LEGACY: "test-job"}, ip="10.0.0.1", ready=True)],
            "test-job-worker-0",
        ),
        ("no running pod", [pod("test-job-worker-0", {LEGACY: "test-job"}, phase="Pending")], None),
        ("no pods", [], None),
    ],
)
def test_get_primary_pod(name: str, pods: list[dict[str, Any]], want: str | None) -> None:
    """progression_test.go TestGetPrimaryPod, every case (``name``); B13."""
    found = primary_pod("test-job", pods)
    assert (found["metadata"]["name"] if found else None) == want


@pytest.mark.parametrize(
    ("name", "job", "pods", "want"),
    [
        (
            "jobset pods with job-index and completion-index",
            "test-job",
            [
                pod(
                    "test-job-worker-0-0",
                    {
                        "jobset.sigs.k8s.io/jobset-name": "test-job",
                        "jobset.sigs.k8s.io/job-index": "0",
                        "batch.kubernetes.io/job-completion-index": "0",
                    },
                    ip="10.0.0.1",
                    ready=True,
                )
            ],
            "test-job-worker-0-0",
        ),
        (
            "pytorch worker with replica-index",
            "pytorch-job",
            [
                pod(
                    "pytorch-job-worker-0",
                    {
                        LEGACY: "pytorch-job",
                        "training.kubeflow.org/replica-type": "Worker",
                        "training.kubeflow.org/replica-index": "0",
                    },
                    ip="10.0.0.2",
                    ready=True,
                )
            ],
            "pytorch-job-worker-0",
        ),
        (
            "mpi launcher pod",
            "mpi-job",
            [
                pod(
                    "mpi-job-launcher",
                    {LEGACY: "mpi-job", "training.kubeflow.org/replica-type": "Launcher"},
                    ip="10.0.0.3",
                    ready=True,
                )
            ],
            "mpi-job-launcher",
        ),
        ("pod without IP returns error", "test-job", [pod("test-job-worker-0", {LEGACY: "test-job"})], None),
    ],
)
def test_get_primary_pod_different_label_patterns(
    name: str, job: str, pods: list[dict[str, Any]], want: str | None
) -> None:
    """progression_test.go TestGetPrimaryPod_DifferentLabelPatterns, every case (``name``); B13."""
    found = primary_pod(job, pods)
    assert (found["metadata"]["name"] if found else None) == want


def test_primary_pod_order_of_the_label_sets() -> None:
    """B13: rank 0 of the JobSet first even when listed after other ready pods; a pod not Ready, or Running
    without an IP, is never taken; a Pending pod neither."""
    jobset = {"jobset.sigs.k8s.io/jobset-name": "llama"}
    rank0 = {**jobset, "jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": "0"}
    pods = [
        pod("llama-a", {**jobset, "jobset.sigs.k8s.io/job-index": "1"}, ip="10.0.0.9", ready=True),
        pod("llama-b", rank0, ip="10.0.0.1", ready=True),
    ]
    assert primary_pod("llama", pods) is pods[1]
    not_ready = [pod("llama-b", rank0, ip="10.0.0.1", ready=False), pods[0]]
    assert primary_pod("llama", not_ready) is pods[0]  # the second set: any pod of the JobSet that will do
    assert primary_pod("llama", [pod("x", rank0, ready=True)]) is None  # Running, Ready, no IP
    assert primary_pod("llama", [pod("x", rank0, phase="Pending", ip="10.0.0.1", ready=True)]) is None
    assert (
        primary_pod("llama", [pod("x", {"jobset.sigs.k8s.io/jobset-name": "other"}, ip="1.1.1.1", ready=True)]) is None
    )


def test_final_pod_prefers_index_zero_else_the_first() -> None:
    """PollAndUpdateFinalProgress's pod: job-index 0 or legacy replica-index 0, else the first listed."""
    a = pod("a", {"jobset.sigs.k8s.io/job-index": "1"})
    b = pod("b", {"jobset.sigs.k8s.io/job-index": "0"})
    c = pod("c", {"training.kubeflow.org/replica-index": "0"})
    assert final_pod([a, b]) is b
    assert final_pod([a, c]) is c
    assert final_pod([a]) is a
    assert final_pod([]) is None


# --------------------------------------------------------------------------- termination message


def node(message: str | None = None, name: str = "node", running: bool = False) -> dict[str, Any]:
    state: dict[str, Any] = {"running": {}} if running else {"terminated": {"exitCode": 0, "message": message}}
    return {"name": name, "state": state}


FULL_MESSAGE = """{
    "progressPercentage": 100,
    "estimatedRemainingSeconds": 0,
    "currentStep": 124,
    "totalSteps": 124,
    "currentEpoch": 1.976,
    "totalEpochs": 2,
    "trainMetrics": {"loss": 3.4241},
    "evalMetrics": {"eval_loss": 3.451}
}"""


def test_capture_metrics_from_termination_message_valid() -> None:
    """progression_test.go TestCaptureMetricsFromTerminationMessage "valid termination message with all fields"
    and "node container name"; B15 (the values as written, the time now)."""
    status = termination_status(pod("p", {}, containers=[node(FULL_MESSAGE)]), NOW)
    assert (status.progress_percentage, status.current_step, status.total_steps) == (100, 124, 124)
    assert status.current_epoch == 1.976
    assert status.train_metrics and status.eval_metrics
    assert status.last_updated_time == format_rfc3339(NOW)
    small = termination_status(pod("p", {}, containers=[node('{"progressPercentage": 50, "currentStep": 50}')]), NOW)
    assert small.progress_percentage == 50


@pytest.mark.parametrize(
    ("name", "the_pod"),
    [
        ("nil pod", None),
        ("empty termination message", pod("p", {}, containers=[node("")])),
        ("invalid JSON in termination message", pod("p", {}, containers=[node("{invalid json}")])),
        (
            "missing progressPercentage field",
            pod("p", {}, containers=[node('{"currentStep": 100, "totalSteps": 1000}')]),
        ),
        ("container not terminated", pod("p", {}, containers=[node(running=True)])),
        ("wrong container name", pod("p", {}, containers=[node('{"progressPercentage": 100}', name="sidecar")])),
        ("no container statuses", pod("p", {}, containers=[])),
    ],
)
def test_capture_metrics_from_termination_message_refused(name: str, the_pod: dict[str, Any] | None) -> None:
    """progression_test.go TestCaptureMetricsFromTerminationMessage, the cases that return an error; B17."""
    with pytest.raises(ProgressionError):
        termination_status(the_pod, NOW)


def test_a_termination_message_is_not_cleaned() -> None:
    """The controller cleans polls only: a message's 150 % stays 150 in what it writes (B15's "not sanitised")."""
    status = termination_status(pod("p", {}, containers=[node('{"progressPercentage": 150, "currentStep": -3}')]), NOW)
    assert (status.progress_percentage, status.current_step) == (150, -3)


# --------------------------------------------------------------------------------- final summaries


@pytest.mark.parametrize(
    ("message", "completed", "summary"),
    [
        (FULL_MESSAGE, True, "complete"),  # B15
        ('{"progressPercentage": 50, "currentStep": 25, "totalSteps": 50}', True, "complete (early stopped)"),  # B16
        ('{"progressPercentage": 50, "currentStep": 25, "totalSteps": 0}', True, "complete"),  # no total: not early
        ('{"progressPercentage": 60, "currentStep": 30, "totalSteps": 50}', False, "failed at 60%"),  # B16
        ('{"progressPercentage": 100}', False, "failed at 100%"),
    ],
)
def test_summaries_of_the_end(message: str, completed: bool, summary: str) -> None:
    """PollAndUpdateFinalProgress's summaries of a termination message (or a last poll)."""
    status = termination_status(pod("p", {}, containers=[node(message)]), NOW)
    assert with_final_summary(status, completed).summary == summary


@pytest.mark.parametrize(
    ("annotation", "completed", "progress", "summary"),
    [
        ('{"progressPercentage":85,"currentStep":42,"totalSteps":50}', True, 85, "early stopped"),  # B18
        ('{"progressPercentage":85,"currentStep":50,"totalSteps":50}', True, 85, "complete"),  # B18
        ('{"progressPercentage":null,"currentStep":5}', False, None, "failed at 0%"),  # B18
        ('{"progressPercentage":40,"currentStep":5}', False, 40, "failed at 40%"),
    ],
)
def test_update_final_status(annotation: str, completed: bool, progress: int | None, summary: str) -> None:
    """updateFinalStatus: the figures kept, the summary and the time new (B18)."""
    status = update_final_status(annotation, completed, NOW)
    assert status is not None
    assert (status.progress_percentage, status.summary, status.last_updated_time) == (
        progress,
        summary,
        format_rfc3339(NOW),
    )


def test_update_final_status_without_an_annotation_writes_nothing() -> None:
    """B19: a TrainJob that never had metrics gets no annotation in 3.4; one that is not JSON is an error."""
    assert update_final_status(None, True, NOW) is None
    assert update_final_status("", False, NOW) is None
    with pytest.raises(ProgressionError):
        update_final_status("{invalid json}", True, NOW)


# ------------------------------------------------------------------------------ final status captured


@pytest.mark.parametrize(
    ("name", "annotations", "captured"),
    [
        ("nil annotations", {}, False),
        ("missing trainer status annotation", {"other-annotation": "value"}, False),
        (
            "progress at 100%",
            {
                ANNOTATION_STATUS: '{"progressPercentage":100,"estimatedRemainingSeconds":0,'
                '"currentStep":1000,"totalSteps":1000}'
            },
            True,
        ),
        (
            "progress incomplete",
            {ANNOTATION_STATUS: '{"progressPercentage":50,"currentStep":500,"totalSteps":1000}'},
            False,
        ),
        ("invalid JSON", {ANNOTATION_STATUS: "{invalid json}"}, False),
        ("empty annotation value", {ANNOTATION_STATUS: ""}, False),
        ("null progress percentage", {ANNOTATION_STATUS: '{"progressPercentage":null,"currentStep":500}'}, False),
    ],
)
def test_is_final_status_captured(name: str, annotations: dict[str, str], captured: bool) -> None:
    """progression_test.go TestIsFinalStatusCaptured, every case (``name``); B20."""
    assert final_status_captured(annotations, NOW) is captured


def _at(seconds_ago: float) -> str:
    return format_rfc3339(NOW - seconds_ago)


@pytest.mark.parametrize(
    ("name", "status", "interval", "captured"),
    [
        (
            "final status with zero remaining seconds",
            {"progressPercentage": 100, "estimatedRemainingSeconds": 0},
            None,
            True,
        ),
        (
            "final status with complete summary",
            {"progressPercentage": 100, "estimatedRemainingTimeSummary": "complete"},
            None,
            True,
        ),
        (
            "grace period not expired (recent update)",
            {"progressPercentage": 50, "estimatedRemainingSeconds": 100, "lastUpdatedTime": _at(1)},
            "30s",
            False,
        ),
        (
            "grace period expired (old update)",
            {"progressPercentage": 50, "estimatedRemainingSeconds": 100, "lastUpdatedTime": _at(200)},
            "7s",
            True,
        ),
        ("no progress percentage", {"currentStep": 50}, None, False),
        ("incomplete with remaining time", {"progressPercentage": 75, "estimatedRemainingSeconds": 300}, None, False),
    ],
)
def test_is_final_status_captured_with_grace_period(
    name: str, status: dict[str, Any], interval: str | None, captured: bool
) -> None:
    """progression_test.go TestIsFinalStatusCaptured_WithGracePeriod, every case (``name``); B20."""
    status.setdefault("lastUpdatedTime", _at(0))
    annotations = {ANNOTATION_STATUS: json.dumps(status)}
    if interval is not None:
        annotations[ANNOTATION_POLL_INTERVAL] = interval
    assert final_status_captured(annotations, NOW) is captured


def test_grace_period_is_three_intervals_and_thirty_seconds() -> None:
    """B20: 3 x 7 s + 30 s = 51 s: 51 s old is not yet captured, 52 s is."""
    for age, captured in ((51, False), (52, True)):
        status = {"progressPercentage": 50, "estimatedRemainingSeconds": 100, "lastUpdatedTime": _at(age)}
        annotations = {ANNOTATION_STATUS: json.dumps(status), ANNOTATION_POLL_INTERVAL: "7s"}
        assert final_status_captured(annotations, NOW) is captured
    zero_seconds = {ANNOTATION_STATUS: '{"progressPercentage":10,"estimatedRemainingTimeSummary":"0 seconds"}'}
    assert final_status_captured(zero_seconds, NOW)  # 3.4's other "captured" summary


# ------------------------------------------------------------------------------ when to poll (B14, B21)

ON = {ANNOTATION_TRACKING: "true", ANNOTATION_POLL_INTERVAL: "10s"}


@pytest.mark.parametrize(
    ("case", "annotations", "phase", "foreign", "state", "expected"),
    [
        ("tracking off (B1)", {}, "running", False, PollState(), None),
        ("first poll of a running job", ON, "running", False, PollState(), Poll("28080", 10.0)),
        (
            "pending jobs are polled too (ReconcileProgression's isRunning)",
            ON,
            "pending",
            False,
            PollState(),
            Poll("28080", 10.0),
        ),
        ("interval not over: look again then", ON, "running", False, PollState(last_poll_at=NOW - 4), NOW + 6),
        ("interval over", ON, "running", False, PollState(last_poll_at=NOW - 10), Poll("28080", 10.0)),
        ("a poll under way", ON, "running", False, PollState(polling=True), None),
        ("suspended (B14)", ON, "suspended", False, PollState(), None),
        ("Red Hat's controller writes the annotation: observe only", ON, "running", True, PollState(), None),
        (
            "completed: capture the end",
            ON,
            "finished",
            False,
            PollState(last_poll_at=NOW - 1),
            Poll("28080", 10.0, True, True),
        ),
        ("failed: capture the end", ON, "failed", False, PollState(), Poll("28080", 10.0, True, False)),
        ("end captured (B21)", ON, "finished", False, PollState(final_done=True), None),
        ("capture failed: again after 5 s", ON, "failed", False, PollState(retry_at=NOW + 5), NOW + 5),
    ],
)
def test_next_poll(
    case: str, annotations: dict[str, str], phase: str, foreign: bool, state: PollState, expected: Any
) -> None:
    """ReconcileProgression's decision, as a table."""
    assert next_poll(NOW, annotations, phase, foreign, state) == expected


def test_no_capture_when_the_annotation_already_says_the_end() -> None:
    """B20 in ReconcileProgression: a last live poll with 0 seconds left is final; no capture follows."""
    done = {**ON, ANNOTATION_STATUS: '{"progressPercentage":100,"estimatedRemainingSeconds":0}'}
    assert next_poll(NOW, done, "finished", False, PollState()) is None


# ----------------------------------------------------------------------- the annotation, read by stepwatch


def test_to_annotation_status() -> None:
    """progression_test.go TestToAnnotationStatus (its conversions: the summary of the ETA, the time); B4."""
    from stepwatch.protocol.progression import decode_status, encode_annotation

    polled = decode_status(
        '{"progressPercentage":45,"estimatedRemainingSeconds":9855,"currentStep":4530,"totalSteps":10000,'
        '"currentEpoch":2,"totalEpochs":5,"trainMetrics":{"loss":0.234,"learning_rate":0.00005,'
        '"throughput_samples_sec":128.5},"evalMetrics":{"eval_accuracy":0.89,"eval_f1_score":0.87}}'
    )
    written = encode_annotation(to_annotation(polled, NOW))
    assert written == (
        '{"progressPercentage":45,"estimatedRemainingSeconds":9855,"estimatedRemainingTimeSummary":'
        '"2 hours 44 minutes","currentStep":4530,"totalSteps":10000,"currentEpoch":2,"totalEpochs":5,'
        '"trainMetrics":{"learning_rate":0.00005,"loss":0.234,"throughput_samples_sec":128.5},'
        '"evalMetrics":{"eval_accuracy":0.89,"eval_f1_score":0.87},"lastUpdatedTime":"' + format_rfc3339(NOW) + '"}'
    )


def test_status_from_annotation_keeps_what_it_says() -> None:
    """(a): progress, ETA, steps, epochs, train and eval metrics (eval ones recognisable), the summary."""
    text = (
        '{"progressPercentage":100,"estimatedRemainingSeconds":0,"estimatedRemainingTimeSummary":"complete",'
        '"currentStep":124,"totalSteps":124,"currentEpoch":1.976,"totalEpochs":2,'
        '"trainMetrics":{"loss":3.4241,"learning_rate":"0.0001","note":null,"ok":true},'
        '"evalMetrics":{"eval_loss":3.451,"accuracy":0.5,"val_f1":0.25},"lastUpdatedTime":"2027-01-01T00:00:10Z"}'
    )
    status = status_from_annotation(text)
    assert status is not None
    assert (status.progress_percentage, status.estimated_remaining_seconds) == (100, 0)
    assert status.last_updated_time == "2027-01-01T00:00:10Z"
    assert {m.name: m.value for m in status.metrics} == {
        "current_step": "124",
        "total_steps": "124",
        "current_epoch": "1.976",
        "total_epochs": "2",
        SUMMARY_METRIC: "complete",
        "loss": "3.4241",
        "learning_rate": "0.0001",  # a string value (TrainingHub writes "%.4f") as written
        "eval_loss": "3.451",
        "eval_accuracy": "0.5",  # an eval metric under a name that says so
        "val_f1": "0.25",  # (already one: Keras' val_ prefix)
    }


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[1]", '{"progressPercentage": 45.0}', '{"progressPercentage": NaN}', '{"currentStep": "3"}'],
)
def test_status_from_annotation_refuses_what_go_refuses(text: str) -> None:
    """Read with Go's decoding: what the controller could not read is no status (B11's float, a NaN)."""
    assert status_from_annotation(text) is None


def test_status_from_annotation_cleans_as_the_controller_cleans() -> None:
    """A termination message reaches the annotation uncleaned: 150 % is no progress, -3 steps are 0 (B6, B7),
    negative totals and ETA are none (B8), an ETA beyond int32 none (upstream's trainerStatus cannot hold it)."""
    status = status_from_annotation(
        '{"progressPercentage":150,"currentStep":-3,"totalSteps":-1,"estimatedRemainingSeconds":-5,"currentEpoch":-2}'
    )
    assert status is not None and status.progress_percentage is None and status.estimated_remaining_seconds is None
    assert {m.name: m.value for m in status.metrics} == {"current_step": "0", "current_epoch": "0.0"}
    big = status_from_annotation('{"progressPercentage":1,"estimatedRemainingSeconds":4294967296}')
    assert big is not None and big.estimated_remaining_seconds is None and big.progress_percentage == 1
    empty = status_from_annotation('{"progressPercentage":null,"lastUpdatedTime":"yesterday"}')  # B9
    assert empty is not None and empty.metrics == () and empty.last_updated_time is None


def test_status_from_annotation_round_trips_the_annotation_stepwatch_writes() -> None:
    written = AnnotationStatus(
        progress_percentage=7, current_step=7, total_steps=100, summary="1 hour", last_updated_time=format_rfc3339(NOW)
    )
    from stepwatch.protocol.progression import encode_annotation

    status = status_from_annotation(encode_annotation(written))
    assert status is not None and decode_annotation(encode_annotation(written)).current_step == 7
    assert {m.name: m.value for m in status.metrics}[SUMMARY_METRIC] == "1 hour"
