"""OpenShift AI 3.4's progression controller, its rules ported: which TrainJobs, which pod, how often, what the
annotation says at the end, and how stepwatch reads that annotation. Pure: no I/O, no clock.

Red Hat's fork of Kubeflow Trainer (``pkg/rhai/progression/progression.go`` at
c0df7487865d6e2ab90b14982ec7ae69ead41d30) polls the rank-0 pod of each TrainJob annotated
``trainer.opendatahub.io/progression-tracking: "true"`` and writes the annotation
``trainer.opendatahub.io/trainerStatus``. The wire format (the body, Go's decoding, the annotation's bytes) is
:mod:`stepwatch.protocol.progression`; this module holds the controller's decisions around it, each named
after the Go function it ports:

- the switches: :func:`tracking_enabled` (``IsProgressionTrackingEnabled``), :func:`metrics_port`
  (``GetMetricsPort``), :func:`poll_interval` (``GetMetricsPollInterval``, with Go's parsers from
  :mod:`.goparse`);
- the pod: :func:`primary_pod` (``GetPrimaryPod``: its label sets in order, Running with an IP and Ready),
  :func:`final_pod` (the choice of ``PollAndUpdateFinalProgress``), :func:`termination_status`
  (``CaptureMetricsFromTerminationMessage``);
- the annotation: :func:`to_annotation` (``ToAnnotationStatus``), :func:`with_final_summary` (the summaries
  of ``PollAndUpdateFinalProgress``), :func:`update_final_status` (``updateFinalStatus``),
  :func:`final_status_captured` (``IsFinalStatusCaptured``);
- when: :func:`next_poll` (``ReconcileProgression``): poll a live TrainJob every interval, capture the end
  of a finished or failed one once, nothing while it is suspended, and nothing at all for a TrainJob whose
  annotation another field manager writes (Red Hat's controller itself: stepwatch then only reads it).

And how stepwatch reads the annotation, in every mode: :func:`status_from_annotation` turns it into the
``trainerStatus`` stepwatch's ingest takes (progress, ETA, steps, epochs, train and eval metrics, and the
summary), with Go's decoding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Final, Literal

from ....protocol import INT32_MAX, KubeflowMetric, ProtocolError, TrainerStatus, format_rfc3339, parse_rfc3339
from ....protocol.progression import (
    ANNOTATION_METRICS_PORT,
    ANNOTATION_POLL_INTERVAL,
    ANNOTATION_STATUS,
    ANNOTATION_TRACKING,
    DEFAULT_METRICS_PORT,
    SUMMARY_METRIC,
    TRAINER_CONTAINER,
    AnnotationStatus,
    ProgressionError,
    ProgressionStatus,
    clean_invalid,
    decode_annotation,
    format_duration_summary,
    is_eval_metric,
)
from .goparse import GoSyntaxError, atoi, parse_duration, seconds_duration

__all__ = [
    "COMPLETION_INDEX",
    "DEFAULT_POLL_INTERVAL_S",
    "FINAL_RETRY_S",
    "JOBSET_NAME",
    "JOB_INDEX",
    "LEGACY_JOB_NAME",
    "LEGACY_REPLICA_INDEX",
    "LEGACY_REPLICA_TYPE",
    "POLL_TIMEOUT_S",
    "Poll",
    "PollState",
    "final_pod",
    "final_status_captured",
    "metrics_port",
    "next_poll",
    "pod_ready",
    "poll_interval",
    "primary_pod",
    "status_from_annotation",
    "termination_status",
    "to_annotation",
    "tracking_enabled",
    "update_final_status",
    "with_final_summary",
]

DEFAULT_POLL_INTERVAL_S: Final = 30
MIN_POLL_INTERVAL_S: Final = 5
MAX_POLL_INTERVAL_S: Final = 300
TERMINATION_GRACE_BUFFER_S: Final = 30
"""``constants.TerminationGraceBufferSecs``: added to three poll intervals before an old annotation counts as final."""
POLL_TIMEOUT_S: Final = 2.0
"""The controller's per-request deadline (``context.WithTimeout(ctx, 2*time.Second)``)."""
FINAL_RETRY_S: Final = 5.0
"""After a failed capture of the end, again in this many seconds (``RequeueAfter: 5 * time.Second``)."""

JOBSET_NAME: Final = "jobset.sigs.k8s.io/jobset-name"
JOB_INDEX: Final = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
LEGACY_JOB_NAME: Final = "training.kubeflow.org/job-name"
LEGACY_REPLICA_TYPE: Final = "training.kubeflow.org/replica-type"
LEGACY_REPLICA_INDEX: Final = "training.kubeflow.org/replica-index"


# ---------------------------------------------------------------------------------------- switches


def tracking_enabled(annotations: Mapping[str, str]) -> bool:
    """``IsProgressionTrackingEnabled``: the annotation is exactly ``"true"`` (``"enabled"``, ``"True"``: off)."""
    return annotations.get(ANNOTATION_TRACKING) == "true"


def metrics_port(annotations: Mapping[str, str]) -> str:
    """``GetMetricsPort``: the annotation verbatim, ``"28080"`` when missing or empty (not checked: Go puts
    it in the URL as it is, and a port that is no number fails that poll)."""
    port = annotations.get(ANNOTATION_METRICS_PORT)
    return port if port else str(DEFAULT_METRICS_PORT)


def poll_interval(annotations: Mapping[str, str]) -> float:
    """``GetMetricsPollInterval`` in seconds: Go's ``time.ParseDuration`` (``"30s"``, ``"1m"``), else whole
    seconds by ``strconv.Atoi`` (``"45"``), else 30 s; missing or empty 30 s; then clamped to 5..300 s."""
    text = annotations.get(ANNOTATION_POLL_INTERVAL)
    if not text:
        return float(DEFAULT_POLL_INTERVAL_S)
    try:
        nanoseconds = parse_duration(text)
    except GoSyntaxError:
        try:
            nanoseconds = seconds_duration(atoi(text))
        except GoSyntaxError:
            return float(DEFAULT_POLL_INTERVAL_S)
    seconds = nanoseconds / 1e9
    return float(min(max(seconds, MIN_POLL_INTERVAL_S), MAX_POLL_INTERVAL_S))


# ---------------------------------------------------------------------------------------------- pods


def _labels(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = (pod.get("metadata") or {}).get("labels")
    return labels if isinstance(labels, dict) else {}


def _status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    status = pod.get("status")
    return status if isinstance(status, dict) else {}


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """``isPodReady``: the first ``Ready`` condition says ``True``."""
    for condition in _status(pod).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _pollable(pod: Mapping[str, Any]) -> bool:
    status = _status(pod)
    return status.get("phase") == "Running" and bool(status.get("podIP")) and pod_ready(pod)


def primary_pod_selectors(name: str) -> list[dict[str, str]]:
    """``GetPrimaryPod``'s label sets, tried in this order, then any pod of the legacy job-name label."""
    return [
        {JOBSET_NAME: name, JOB_INDEX: "0", COMPLETION_INDEX: "0"},  # JobSet's rank 0 (Kubeflow Trainer v2)
        {JOBSET_NAME: name},
        {LEGACY_JOB_NAME: name, LEGACY_REPLICA_TYPE: "Worker", LEGACY_REPLICA_INDEX: "0"},  # training-operator v1
        {LEGACY_JOB_NAME: name, LEGACY_REPLICA_TYPE: "Launcher"},  # MPI
        {LEGACY_JOB_NAME: name, LEGACY_REPLICA_INDEX: "0"},
        {LEGACY_JOB_NAME: name},
    ]


def primary_pod(name: str, pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """``GetPrimaryPod``: the first pod, label set by label set, that is Running with an IP and Ready.

    ``pods`` are the TrainJob's pods in the order the API lists them (by name): those with its JobSet label
    and those with the legacy ``training.kubeflow.org/job-name`` label. The Go code's last fallback (any
    pod with the JobSet label when none has the legacy one) can find no pod the second set did not.
    """
    for selector in primary_pod_selectors(name):
        for pod in pods:
            labels = _labels(pod)
            if all(labels.get(k) == v for k, v in selector.items()) and _pollable(pod):
                return pod
    return None


def final_pod(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The pod ``PollAndUpdateFinalProgress`` reads at the end, from the TrainJob's pods listed by its JobSet
    label: the first with ``job-index`` 0 or legacy ``replica-index`` 0, else the first (the completion
    index is not looked at, so it may be an initializer's pod)."""
    for pod in pods:
        labels = _labels(pod)
        if labels.get(JOB_INDEX) == "0" or labels.get(LEGACY_REPLICA_INDEX) == "0":
            return pod
    return pods[0] if pods else None


def termination_status(pod: Mapping[str, Any] | None, now: float) -> AnnotationStatus:
    """``CaptureMetricsFromTerminationMessage``: the status the trainer container ``node`` left in its
    termination message, timed ``now``; :class:`ProgressionError` when there is none to take (no pod, no
    terminated ``node`` container, an empty message, not the JSON, no ``progressPercentage``). Its values
    are taken as they are: the controller does not clean them."""
    if pod is None:
        raise ProgressionError("pod is nil")
    for container in _status(pod).get("containerStatuses") or []:
        if not isinstance(container, dict) or container.get("name") != TRAINER_CONTAINER:
            continue
        terminated = (container.get("state") or {}).get("terminated")
        if not isinstance(terminated, dict):
            continue
        message = terminated.get("message")
        if not message or not isinstance(message, str):
            raise ProgressionError(f"termination message is empty for container {TRAINER_CONTAINER}")
        status = decode_annotation(message)
        if status.progress_percentage is None:
            raise ProgressionError("termination message missing progressPercentage")
        return replace(status, last_updated_time=format_rfc3339(now))
    raise ProgressionError("no terminated trainer container found in pod")


# ---------------------------------------------------------------------------------------- annotation


def to_annotation(status: ProgressionStatus, now: float) -> AnnotationStatus:
    """``ToAnnotationStatus``: a polled status with its time summary and the time (UTC, to the second)."""
    values = {f.name: getattr(status, f.name) for f in fields(ProgressionStatus)}
    return AnnotationStatus(
        **values,
        summary=format_duration_summary(status.estimated_remaining_seconds),
        last_updated_time=format_rfc3339(now),
    )


def _early(status: ProgressionStatus) -> bool:
    """Stopped before its total: a current step below a positive total of steps."""
    return (
        status.current_step is not None
        and status.total_steps is not None
        and status.total_steps > 0
        and status.current_step < status.total_steps
    )


def _failed_at(status: ProgressionStatus) -> str:
    return f"failed at {status.progress_percentage or 0}%"


def with_final_summary(status: AnnotationStatus, completed: bool) -> AnnotationStatus:
    """The summary ``PollAndUpdateFinalProgress`` gives what the termination message or a last poll said:
    ``complete``, ``complete (early stopped)`` (it ended below its total of steps) or ``failed at N%``."""
    if completed:
        return replace(status, summary="complete (early stopped)" if _early(status) else "complete")
    return replace(status, summary=_failed_at(status))


def update_final_status(annotation: str | None, completed: bool, now: float) -> AnnotationStatus | None:
    """``updateFinalStatus``: the annotation there is, with the summary of the end (``complete``, ``early
    stopped``, ``failed at N%``) and the time; its figures kept. ``None`` when there is no annotation (OpenShift
    AI 3.4 then writes none); :class:`ProgressionError` when it is not the JSON."""
    if not annotation:
        return None
    status = decode_annotation(annotation)
    summary = ("early stopped" if _early(status) else "complete") if completed else _failed_at(status)
    return replace(status, summary=summary, last_updated_time=format_rfc3339(now))


def final_status_captured(annotations: Mapping[str, str], now: float) -> bool:
    """``IsFinalStatusCaptured``: the annotation parses, has a progress, and says the end (0 seconds left, or
    the summary ``complete`` or ``0 seconds``), or is older than three poll intervals and 30 s (the pod
    went away: its last state stands)."""
    text = annotations.get(ANNOTATION_STATUS)
    if not text:
        return False
    try:
        status = decode_annotation(text)
    except ProgressionError:
        return False
    if status.progress_percentage is None:
        return False
    if status.estimated_remaining_seconds == 0 or status.summary in ("complete", "0 seconds"):
        return True
    if status.last_updated_time:
        try:
            updated = parse_rfc3339(status.last_updated_time)
        except ProtocolError:
            return False
        grace = 3 * poll_interval(annotations) + TERMINATION_GRACE_BUFFER_S
        return now - updated > grace
    return False


# --------------------------------------------------------------------------------------------- when


@dataclass(frozen=True)
class PollState:
    """What the runner keeps per TrainJob between polls (in memory: a restarted runner polls at once)."""

    last_poll_at: float | None = None
    """When the last poll of it ended (the interval counts from there, as the controller's requeue does)."""
    polling: bool = False
    """A poll of it is under way."""
    final_done: bool = False
    """Its end was captured (or there was nothing to capture): no more polls of this attempt."""
    retry_at: float = 0.0
    """After a failed capture of the end, not before this."""


@dataclass(frozen=True)
class Poll:
    """Poll a TrainJob's rank-0 pod and write the annotation (``final``: capture its end instead)."""

    port: str
    interval_s: float
    final: bool = False
    completed: bool = False
    """At the end: it completed (else it failed)."""
    kind: Literal["poll"] = "poll"


def next_poll(
    now: float,
    annotations: Mapping[str, str],
    phase: str,
    foreign_annotation: bool,
    state: PollState,
) -> Poll | float | None:
    """``ReconcileProgression``: a :class:`Poll` to make now, or when to look again, or ``None`` (nothing to do).

    A live TrainJob (not suspended, complete or failed: pending ones too) is polled every interval; a
    complete or failed one has its end captured once, unless the annotation already says the end; a
    suspended one is left alone. A TrainJob whose annotation another field manager writes (Red Hat's
    controller) is never polled: the runner only reads what that one writes.
    """
    if not tracking_enabled(annotations) or foreign_annotation or state.polling:
        return None
    interval = poll_interval(annotations)
    port = metrics_port(annotations)
    if phase in ("pending", "running"):
        if state.last_poll_at is None or now >= state.last_poll_at + interval:
            return Poll(port, interval)
        return state.last_poll_at + interval
    if phase in ("finished", "failed") and not state.final_done:
        if final_status_captured(annotations, now):
            return None
        if now < state.retry_at:
            return state.retry_at
        return Poll(port, interval, final=True, completed=phase == "finished")
    return None


# ------------------------------------------------------------------------------- stepwatch reads it


def status_from_annotation(text: str | None) -> TrainerStatus | None:
    """The annotation (as Red Hat's controller or stepwatch's poll mode wrote it) as the ``trainerStatus``
    stepwatch's ingest takes; ``None`` when absent or not what Go would read.

    Read with Go's semantics (:func:`~stepwatch.protocol.progression.decode_annotation`) and cleaned as the
    controller cleans a poll (a termination message reaches the annotation uncleaned). Progress and ETA
    stay themselves; steps and epochs become ``current_step``, ``total_steps``, ``current_epoch``,
    ``total_epochs`` (the names transformers' KubeflowCallback posts, so both read alike); train metrics keep
    their names, eval metrics are named so that they read as eval metrics (``accuracy`` in ``evalMetrics``
    is ``eval_accuracy``); the summary is kept as the string metric ``estimatedRemainingTimeSummary``.
    Values are the strings upstream's metrics are (numbers as Python writes them back exactly); ``null``,
    booleans, objects, empty strings and names upstream refuses are left out.
    """
    if not text:
        return None
    try:
        written = decode_annotation(text)
    except ProgressionError:
        return None
    status = clean_invalid(written)
    metrics: list[KubeflowMetric] = []
    progress = (
        ("current_step", status.current_step),
        ("total_steps", status.total_steps),
        ("current_epoch", status.current_epoch),
        ("total_epochs", status.total_epochs),
        (SUMMARY_METRIC, written.summary or None),
    )
    evals = ((n if is_eval_metric(n) else f"eval_{n}", v) for n, v in (status.eval_metrics or {}).items())
    for name, value in (*progress, *(status.train_metrics or {}).items(), *evals):
        text_value = _metric_text(value)
        if text_value is None or len(metrics) >= 256:
            continue
        try:
            metrics.append(KubeflowMetric(str(name), text_value))
        except ProtocolError:
            continue  # a name or value upstream's CRD would refuse: the rest stands
    remaining = status.estimated_remaining_seconds
    when: str | None = written.last_updated_time or None
    if when is not None:
        try:
            parse_rfc3339(when)
        except ProtocolError:
            when = None
    return TrainerStatus(
        progress_percentage=status.progress_percentage,
        estimated_remaining_seconds=remaining if remaining is None or remaining <= INT32_MAX else None,
        metrics=tuple(metrics),
        last_updated_time=when,
    )


def _metric_text(value: object) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return value or None
    return None
