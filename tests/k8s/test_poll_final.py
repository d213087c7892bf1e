"""``poll`` mode at a TrainJob's end: the termination message, a last poll, or the annotation there is, with the
summary of the end, as OpenShift AI 3.4's controller writes them (``PollAndUpdateFinalProgress``), against the
FAKE Kubernetes API server (``fakeapi.py``: there is no API server here; it follows the API's documented
behaviour) and, where a pod still runs, a real HTTP server on loopback standing in for it.

Ported cases name their upstream test (``pkg/rhai/progression/progression_test.go`` of Red Hat's fork of Kubeflow
Trainer at c0df7487865d6e2ab90b14982ec7ae69ead41d30); ``Bn`` names a case of the reference.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from fakeapi import FakeApi
from kubehelp import Clock, Cluster, PodServer, trainjob, wait_for
from podhelp import RANK0, annotation_of, history, poll_cluster, polled, rank0_pod, served, tracked

from stepwatch.protocol import format_rfc3339
from stepwatch.protocol.progression import ANNOTATION_STATUS, ANNOTATION_TRACKING, AnnotationStatus, encode_annotation

MESSAGE = (
    '{"progressPercentage":100,"estimatedRemainingSeconds":0,"currentStep":124,"totalSteps":124,'
    '"currentEpoch":1.976,"totalEpochs":2,"trainMetrics":{"loss":3.4241},"evalMetrics":{"eval_loss":3.451}}'
)


def node(message: str | None, name: str = "node") -> list[dict[str, Any]]:
    """``containerStatuses`` with the trainer container ended (``message``: its termination message)."""
    terminated: dict[str, Any] = {"exitCode": 0, "reason": "Completed"}
    if message is not None:
        terminated["message"] = message
    return [{"name": name, "state": {"terminated": terminated}}]


def ended(fake: FakeApi, name: str, how: str = "Complete", namespace: str = "nlp") -> None:
    fake.set_condition(namespace, name, how, message=f"jobset {how.lower()}")


def captured(runner: Any, name: str, namespace: str = "nlp", timeout: float = 10.0) -> None:
    """Wait until the runner says the end of ``name`` is captured (or that there was nothing to capture)."""
    wait_for(lambda: runner.seen.get((namespace, name)) and runner.seen[(namespace, name)].poll.final_done, timeout)


# ------------------------------------------------------------- TestPollAndUpdateFinalProgress, ported


@pytest.mark.parametrize(
    ("name", "annotations", "labels", "phase", "message", "completed", "want_progress", "want_created"),
    [
        (
            "capture from termination message on Succeeded pod",
            {"trainer.opendatahub.io/metrics-port": "28080"},
            {"training.kubeflow.org/job-name": "test-job", "jobset.sigs.k8s.io/job-index": "0"},
            "Succeeded",
            '{"progressPercentage":100,"estimatedRemainingSeconds":0,"currentStep":50,"totalSteps":50,'
            '"currentEpoch":1.0,"totalEpochs":1,"trainMetrics":{"loss":0.5},"evalMetrics":{"eval_accuracy":0.95}}',
            True,
            None,
            False,  # (its pod has no JobSet label: the final capture lists by that label, and finds none)
        ),
        (
            "capture from termination message on Failed pod",
            {},
            {"training.kubeflow.org/job-name": "test-job", "training.kubeflow.org/replica-index": "0"},
            "Failed",
            '{"progressPercentage":100,"estimatedRemainingSeconds":0,"currentStep":25,"totalSteps":50}',
            False,
            None,
            False,
        ),
        (
            "no termination message and no existing status",
            {},
            {"training.kubeflow.org/job-name": "test-job"},
            "Succeeded",
            "",
            True,
            None,
            False,
        ),
        (
            "updates existing status when no termination message",
            {ANNOTATION_STATUS: '{"progressPercentage":85,"currentStep":42,"totalSteps":50}'},
            {"training.kubeflow.org/job-name": "test-job"},
            "Succeeded",
            "",
            True,
            85,
            True,
        ),
    ],
)
def test_poll_and_update_final_progress(
    fake: FakeApi,
    make_cluster: Callable[..., Cluster],
    name: str,
    annotations: dict[str, str],
    labels: dict[str, str],
    phase: str,
    message: str,
    completed: bool,
    want_progress: int | None,
    want_created: bool,
) -> None:
    """progression_test.go TestPollAndUpdateFinalProgress, every case but "progression tracking disabled"
    (below): the end is handled once (no retry), the annotation created only where upstream's is."""
    fake.create_trainjob(
        trainjob("test-job", "default", nodes=1, gpus=1, annotations={ANNOTATION_TRACKING: "true", **annotations})
    )
    fake.add_pod("default", "test-job-node-0", None, phase, labels=labels, pod_ip="10.0.0.1", containers=node(message))
    ended(fake, "test-job", "Complete" if completed else "Failed", "default")
    clock = Clock()
    cluster, runner = poll_cluster(make_cluster, clock)
    captured(runner, "test-job", "default")
    note = annotation_of(cluster, "test-job", "default")
    assert (note is not None) == (want_created or ANNOTATION_STATUS in annotations)
    if want_created:
        assert note != annotations.get(ANNOTATION_STATUS)  # created or modified
    if want_progress is not None:
        assert note is not None and json.loads(note)["progressPercentage"] == want_progress
    assert runner.stats["polls"] == 1


def test_poll_and_update_final_progress_tracking_disabled(fake: FakeApi, make_cluster: Callable[..., Cluster]) -> None:
    """progression_test.go TestPollAndUpdateFinalProgress "progression tracking disabled": not handled, nothing."""
    fake.create_trainjob(trainjob("test-job", "default", nodes=1, gpus=1))
    ended(fake, "test-job", namespace="default")
    cluster, runner = poll_cluster(make_cluster, Clock())
    cluster.wait_job("test-job", "default", state="finished")
    time.sleep(0.3)
    assert runner.stats["polls"] == 0 and annotation_of(cluster, "test-job", "default") is None


# -------------------------------------------------------------------------- the end, case by case


def test_termination_message_complete(make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]) -> None:
    """B15: a run polled while it trains, then its pod ends with the termination message and the TrainJob
    completes: the annotation is the message with "complete" and the time, byte for byte; the job in
    stepwatch is finished at 100 % with the message's figures, its last point the end's; no poll after (B21)."""
    clock = Clock()
    pod = pods(served(progressPercentage=50, estimatedRemainingSeconds=60, currentStep=62, totalSteps=124))
    cluster, runner = poll_cluster(make_cluster, clock)
    fake = cluster.fake
    rank0_pod(cluster, "llama")
    fake.create_trainjob(tracked("llama", pod.port))
    polled(runner, 1)
    clock.now += 20
    fake.set_pod_status("nlp", "llama-node-0-0", phase="Succeeded", containerStatuses=node(MESSAGE))
    ended(fake, "llama")
    captured(runner, "llama")
    expected = AnnotationStatus(
        progress_percentage=100,
        estimated_remaining_seconds=0,
        current_step=124,
        total_steps=124,
        current_epoch=1.976,
        total_epochs=2,
        train_metrics={"loss": 3.4241},
        eval_metrics={"eval_loss": 3.451},
        summary="complete",
        last_updated_time=format_rfc3339(clock.now),
    )
    assert annotation_of(cluster, "llama") == encode_annotation(expected)
    view = cluster.wait_job("llama", state="finished")
    assert (view["progress"]["percent"], view["progress"]["step"], view["progress"]["epoch"]) == (100, 124, 1.976)
    assert view["metrics"] == {"loss": 3.4241, "eval_loss": 3.451}
    assert history(cluster, "llama", "eval_loss") == [(124, 3.451)]
    summary = {m["name"]: m["value"] for m in view["trainerStatus"]["metrics"]}["estimatedRemainingTimeSummary"]
    assert summary == "complete"
    # the poll and the capture; and a third when the runner looked between the pod's end and the TrainJob's
    # condition (two writes of the fake, as of a real API server; seen on a loaded machine): it reads the
    # ended pod's status and asks the pod nothing
    requests, patches, polls = len(pod.requests), len(fake.calls("PATCH")), runner.stats["polls"]
    assert requests == 1 and polls in (2, 3)
    for _ in range(3):  # B21: nothing more
        clock.now += 60
        time.sleep(0.2)
    assert (len(pod.requests), len(fake.calls("PATCH")), runner.stats["polls"]) == (requests, patches, polls)


@pytest.mark.parametrize(
    ("message", "how", "summary", "progress"),
    [
        ('{"progressPercentage":50,"currentStep":25,"totalSteps":50}', "Complete", "complete (early stopped)", 50),
        ('{"progressPercentage":60,"currentStep":30,"totalSteps":50}', "Failed", "failed at 60%", 60),
        ('{"progressPercentage":150,"currentStep":30,"totalSteps":50}', "Failed", "failed at 150%", 150),
    ],
)
def test_termination_message_early_stop_and_failure(
    make_cluster: Callable[..., Cluster], message: str, how: str, summary: str, progress: int
) -> None:
    """B16: ended below its total: "complete (early stopped)"; failed: "failed at N%". The message's values are
    written as they are (not cleaned, as upstream), stepwatch reads 150 % as no percentage."""
    clock = Clock()
    cluster, runner = poll_cluster(make_cluster, clock)
    cluster.fake.create_trainjob(tracked("llama", "1"))
    rank0_pod(cluster, "llama", ip=None, phase="Failed" if how == "Failed" else "Succeeded", containers=node(message))
    ended(cluster.fake, "llama", how)
    captured(runner, "llama")
    note = json.loads(annotation_of(cluster, "llama") or "{}")
    assert (note["estimatedRemainingTimeSummary"], note["progressPercentage"]) == (summary, progress)
    view = cluster.wait_job("llama", state="finished" if how == "Complete" else "failed")
    assert view["progress"]["step"] == (30 if how == "Failed" else 25)


@pytest.mark.parametrize(
    ("containers", "summary"),
    [
        (node(""), "early stopped"),
        (node("{invalid json}"), "early stopped"),
        (node('{"currentStep": 100, "totalSteps": 1000}'), "early stopped"),
        ([{"name": "node", "state": {"running": {}}}], "early stopped"),
        (node(MESSAGE, name="trainer"), "early stopped"),
        ([], "early stopped"),
    ],
)
def test_termination_message_ignored(
    make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer], containers: list[dict[str, Any]], summary: str
) -> None:
    """B17 (TestCaptureMetricsFromTerminationMessage's refusals, end to end): an empty, invalid or incomplete
    message, a container not terminated or not named ``node``, no statuses: ignored; the pod is no longer
    Running, so the last annotation stands with the summary of the end (the live poll said 42 of 50)."""
    clock = Clock()
    pod = pods(served(progressPercentage=84, estimatedRemainingSeconds=30, currentStep=42, totalSteps=50))
    cluster, runner = poll_cluster(make_cluster, clock)
    rank0_pod(cluster, "llama")
    cluster.fake.create_trainjob(tracked("llama", pod.port))
    polled(runner, 1)
    clock.now += 10
    cluster.fake.set_pod_status("nlp", "llama-node-0-0", phase="Succeeded", containerStatuses=containers)
    ended(cluster.fake, "llama")
    captured(runner, "llama")
    note = json.loads(annotation_of(cluster, "llama") or "{}")
    assert (note["estimatedRemainingTimeSummary"], note["progressPercentage"], note["currentStep"]) == (summary, 84, 42)
    assert note["estimatedRemainingSeconds"] == 30 and note["lastUpdatedTime"] == format_rfc3339(clock.now)
    assert len(pod.requests) == 1  # not polled again: the pod is not Running


def test_a_pod_still_running_is_polled_once_more(
    make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]
) -> None:
    """PollAndUpdateFinalProgress's second way: no termination message, the pod still Running with its IP
    (its readiness not asked): polled once more, with the summary of the end."""
    clock = Clock()
    pod = pods(served(progressPercentage=90, estimatedRemainingSeconds=12, currentStep=45, totalSteps=50))
    cluster, runner = poll_cluster(make_cluster, clock)
    rank0_pod(cluster, "llama", ready=False)
    cluster.fake.create_trainjob(tracked("llama", pod.port))
    ended(cluster.fake, "llama")
    captured(runner, "llama")
    note = json.loads(annotation_of(cluster, "llama") or "{}")
    assert (note["estimatedRemainingTimeSummary"], note["currentStep"]) == ("complete (early stopped)", 45)
    assert pod.requests == ["/metrics"]


@pytest.mark.parametrize(
    ("before", "how", "summary", "progress"),
    [
        ('{"progressPercentage":85,"currentStep":42,"totalSteps":50}', "Complete", "early stopped", 85),
        ('{"progressPercentage":100,"currentStep":50,"totalSteps":50}', "Complete", "complete", 100),
        ('{"progressPercentage":null,"currentStep":5}', "Failed", "failed at 0%", None),
    ],
)
def test_no_pod_left_the_annotation_stands_with_the_summary(
    fake: FakeApi, make_cluster: Callable[..., Cluster], before: str, how: str, summary: str, progress: int | None
) -> None:
    """B18: no termination message, the pod gone: the figures kept, the summary of the end."""
    fake.create_trainjob(tracked("llama", "1", **{ANNOTATION_STATUS: before}))
    ended(fake, "llama", how)
    clock = Clock()
    cluster, runner = poll_cluster(make_cluster, clock)
    captured(runner, "llama")
    note = json.loads(annotation_of(cluster, "llama") or "{}")
    assert (note["estimatedRemainingTimeSummary"], note["progressPercentage"]) == (summary, progress)
    assert note["lastUpdatedTime"] == format_rfc3339(clock.now)


def test_never_had_metrics_no_annotation(fake: FakeApi, make_cluster: Callable[..., Cluster]) -> None:
    """B19: a TrainJob that completed without a status ever gets no annotation (OpenShift AI 3.4), once."""
    fake.create_trainjob(tracked("llama", "1"))
    fake.add_pod(
        "nlp", "llama-node-0-0", "llama", "Succeeded", labels={"jobset.sigs.k8s.io/jobset-name": "llama", **RANK0}
    )
    ended(fake, "llama")
    clock = Clock()
    cluster, runner = poll_cluster(make_cluster, clock)
    captured(runner, "llama")
    clock.now += 60
    time.sleep(0.3)
    assert annotation_of(cluster, "llama") is None and runner.stats["polls"] == 1


def test_a_last_poll_with_nothing_left_is_the_end(
    make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]
) -> None:
    """B20: the last live poll said 0 seconds left: that is final (IsFinalStatusCaptured); the TrainJob's
    completion adds no capture and no summary."""
    clock = Clock()
    pod = pods(served(progressPercentage=100, estimatedRemainingSeconds=0, currentStep=50, totalSteps=50))
    cluster, runner = poll_cluster(make_cluster, clock)
    rank0_pod(cluster, "llama")
    cluster.fake.create_trainjob(tracked("llama", pod.port))
    polled(runner, 1)
    written = annotation_of(cluster, "llama")
    ended(cluster.fake, "llama")
    cluster.wait_job("llama", state="finished")
    clock.now += 60
    time.sleep(0.3)
    assert annotation_of(cluster, "llama") == written and runner.stats["polls"] == 1


def test_a_failed_capture_is_tried_again_after_five_seconds(
    fake: FakeApi, make_cluster: Callable[..., Cluster]
) -> None:
    """ReconcileProgression: a capture that fails (here its write: 500) is tried again 5 s later, then done."""
    fake.create_trainjob(tracked("llama", "1"))
    fake.add_pod(
        "nlp",
        "llama-node-0-0",
        "llama",
        "Succeeded",
        labels={"jobset.sigs.k8s.io/jobset-name": "llama", **RANK0},
        containers=node(MESSAGE),
    )
    ended(fake, "llama")
    fake.fail("PATCH", "/trainjobs/llama", 500)
    clock = Clock()
    cluster, runner = poll_cluster(make_cluster, clock)
    polled(runner, 1, key="polls")
    wait_for(lambda: not runner.seen[("nlp", "llama")].poll.polling, 5)
    assert annotation_of(cluster, "llama") is None and not runner.seen[("nlp", "llama")].poll.final_done
    clock.now += 4
    time.sleep(0.3)
    assert runner.stats["polls"] == 1
    clock.now += 1
    captured(runner, "llama")
    assert json.loads(annotation_of(cluster, "llama") or "{}")["estimatedRemainingTimeSummary"] == "complete"
