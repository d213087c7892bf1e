"""``poll`` mode: the runner does what OpenShift AI 3.4's controller does, against the FAKE Kubernetes API server
(``fakeapi.py``: there is no API server on these machines; it follows the API's documented behaviour) with a
real HTTP server on loopback standing in for the pod (podIP 127.0.0.1, its port in the TrainJob's
``trainer.opendatahub.io/metrics-port`` annotation).

Ported cases name their upstream test: ``pkg/rhai/progression/progression_test.go`` of Red Hat's fork of
Kubeflow Trainer at c0df7487865d6e2ab90b14982ec7ae69ead41d30. ``Bn`` names a case of the reference
(docs/kubernetes.md's conformance table). The server's clock is the test's (``Clock``): a poll comes due when
the test moves it by the interval.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable

import pytest
from fakeapi import FakeApi
from kubehelp import Clock, Cluster, PodServer, trainjob, wait_for
from podhelp import annotation_of, history, poll_cluster, polled, rank0_pod, served, tracked

from stepwatch.protocol import format_rfc3339
from stepwatch.protocol.progression import (
    ANNOTATION_METRICS_PORT,
    ANNOTATION_STATUS,
    ANNOTATION_TRACKING,
    AnnotationStatus,
    build_status,
    encode_annotation,
    encode_served,
)

RH_MANAGER = "manager"
"""The field manager of Red Hat's controller: controller-runtime sets no fieldManager on its patches, so the API
server names the manager after the client's user agent, the controller's binary (``manager``)."""


FULL = served(
    progressPercentage=45,
    estimatedRemainingSeconds=9855,
    currentStep=4530,
    totalSteps=10000,
    currentEpoch=2,
    totalEpochs=5,
    trainMetrics={"loss": 0.234, "learning_rate": 0.00005, "throughput_samples_sec": 128.5},
    evalMetrics={"eval_accuracy": 0.89, "eval_f1_score": 0.87},
)


def _patches(cluster: Cluster, name: str) -> list[tuple[str, str, dict[str, list[str]]]]:
    return [c for c in cluster.fake.calls("PATCH", f"/trainjobs/{name}") if not c[1].endswith("/status")]


# ------------------------------------------------------------------------------- a poll, written


def test_poll_training_progress_successful(
    make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]
) -> None:
    """progression_test.go TestPollTrainingProgress "successful poll with complete metrics", end to end; B4:
    the annotation is written byte for byte as the controller writes it (summary "2 hours 44 minutes", the
    time in RFC 3339 seconds), by server-side apply under the field manager ``stepwatch``, and the poll is
    the job's progress, ETA, metrics and history in stepwatch."""
    clock = Clock()
    pod = pods(FULL)
    cluster, runner = poll_cluster(make_cluster, clock)
    rank0_pod(cluster, "llama")
    cluster.fake.create_trainjob(tracked("llama", pod.port))
    polled(runner, 1)
    assert pod.requests == ["/metrics"]
    expected = (
        '{"progressPercentage":45,"estimatedRemainingSeconds":9855,"estimatedRemainingTimeSummary":"2 hours 44 '
        'minutes","currentStep":4530,"totalSteps":10000,"currentEpoch":2,"totalEpochs":5,"trainMetrics":'
        '{"learning_rate":0.00005,"loss":0.234,"throughput_samples_sec":128.5},"evalMetrics":{"eval_accuracy":0.89,'
        '"eval_f1_score":0.87},"lastUpdatedTime":"' + format_rfc3339(clock.now) + '"}'
    )
    assert annotation_of(cluster, "llama") == expected
    [patch] = _patches(cluster, "llama")
    assert patch[2]["fieldManager"] == ["stepwatch"] and patch[2]["force"] == ["false"]
    managers = cluster.fake.trainjobs[("nlp", "llama")]["metadata"]["managedFields"]
    assert any(m["manager"] == "stepwatch" and "f:annotations" in m["fieldsV1"].get("f:metadata", {}) for m in managers)
    view = cluster.job("llama")
    assert view is not None
    assert (view["progress"]["percent"], view["progress"]["step"], view["progress"]["total_steps"]) == (45, 4530, 10000)
    assert (view["progress"]["epoch"], view["progress"]["total_epochs"]) == (2, 5)
    assert view["eta"]["reported_seconds"] == 9855 and view["eta"]["source"] == "reported"
    assert view["metrics"] == {
        "loss": 0.234,
        "learning_rate": 0.00005,
        "throughput_samples_sec": 128.5,
        "eval_accuracy": 0.89,
        "eval_f1_score": 0.87,
    }
    assert view["state"] == "running" and history(cluster, "llama", "loss") == [(4530, 0.234)]
    metrics = {m["name"]: m["value"] for m in view["trainerStatus"]["metrics"]}
    assert metrics["estimatedRemainingTimeSummary"] == "2 hours 44 minutes"


def test_each_poll_is_a_point_every_interval(
    make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]
) -> None:
    """One poll per interval on the runner's clock (not before: moving the clock 4 s of 5 polls nothing), each
    written and stored once; a restarted runner polls at once: within the same second, what it reads is stored
    already (nothing twice; its own annotation is no foreign change either), a second later it is a new point."""
    clock = Clock()
    pod = pods()
    cluster, runner = poll_cluster(make_cluster, clock)
    rank0_pod(cluster, "llama")
    cluster.fake.create_trainjob(tracked("llama", pod.port, interval="5s"))
    for i, step in enumerate((10, 20, 30)):
        pod.serve(encode_served(build_status(step=step, total_steps=100, metrics={"loss": 1 / step})))
        if i:
            clock.now += 4
            time.sleep(0.3)  # several decisions: not due yet
            assert runner.stats["polls"] == i
            clock.now += 1
        polled(runner, i + 1)
    assert [s for s, _ in history(cluster, "llama", "loss")] == [10, 20, 30]
    assert len(pod.requests) == 3
    cluster.close()
    again = cluster.start_runner(config=runner.options.config)  # a restart, within the second of the last poll
    polled(again, 1, key="polls")
    wait_for(lambda: not again.seen[("nlp", "llama")].poll.polling, 5, "the poll done")
    assert [s for s, _ in history(cluster, "llama", "loss")] == [10, 20, 30] and again.stats["mirrored"] == 0
    pod.serve(encode_served(build_status(step=40, total_steps=100, metrics={"loss": 1 / 40})))
    clock.now += 5
    polled(again, 1)
    assert [s for s, _ in history(cluster, "llama", "loss")] == [10, 20, 30, 40]


@pytest.mark.parametrize(
    ("name", "status", "body", "delay"),
    [
        ("http error", 500, "", 0.0),
        ("invalid json", 200, "{invalid json}", 0.0),
        ("a 3 s delay", 200, FULL, 3.0),
        ("a float in an int field (B11)", 200, '{"progressPercentage": 45.5}', 0.0),
        ("NaN (B11)", 200, '{"progressPercentage": 45, "trainMetrics": {"loss": NaN}}', 0.0),
        ("404", 404, FULL, 0.0),
    ],
)
def test_poll_failures_leave_the_annotation(
    make_cluster: Callable[..., Cluster],
    pods: Callable[..., PodServer],
    name: str,
    status: int,
    body: str,
    delay: float,
) -> None:
    """progression_test.go TestPollTrainingProgress "http error", "invalid json", and a pod slower than the 2 s
    deadline; B5, B11: no patch, the annotation and the job as they were, the next poll after the interval."""
    clock = Clock()
    pod = pods(served(progressPercentage=10, currentStep=10, totalSteps=100))
    cluster, runner = poll_cluster(make_cluster, clock)
    rank0_pod(cluster, "llama")
    cluster.fake.create_trainjob(tracked("llama", pod.port))
    polled(runner, 1)
    before = annotation_of(cluster, "llama")
    pod.serve(body, status, delay)
    clock.now += 5
    polled(runner, 1, key="poll_errors", timeout=15)
    if delay:
        assert pod.answered == 1  # it gave up before the pod answered (the 2 s deadline, not the pod's 3 s)
    assert len(_patches(cluster, "llama")) == 1 and annotation_of(cluster, "llama") == before
    assert (cluster.job("llama") or {})["progress"]["step"] == 10
    pod.serve(served(progressPercentage=20, currentStep=20, totalSteps=100))
    clock.now += 5
    polled(runner, 2, timeout=15)
    assert json.loads(annotation_of(cluster, "llama") or "{}")["currentStep"] == 20


def test_invalid_values_are_cleaned_and_unknown_keys_dropped(
    make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]
) -> None:
    """cleanInvalidMetrics end to end: B6 (progress -1 or 150: null, the rest kept), B7 (negative step and
    epoch: 0), B8 (negative totals and ETA: left out; 0 steps kept), B9 (``{}``: progress null and the time
    only), B12 (an unknown key is not in the annotation)."""
    clock = Clock()
    pod = pods()
    cluster, runner = poll_cluster(make_cluster, clock)
    rank0_pod(cluster, "llama")
    cluster.fake.create_trainjob(tracked("llama", pod.port))
    when = format_rfc3339(clock.now)
    cases = [
        (served(progressPercentage=-1, currentStep=5), '{"progressPercentage":null,"currentStep":5,'),
        (served(progressPercentage=150, totalSteps=0), '{"progressPercentage":null,"totalSteps":0,'),
        (
            served(progressPercentage=3, currentStep=-1, currentEpoch=-5),
            '{"progressPercentage":3,"currentStep":0,"currentEpoch":0,',
        ),
        (
            served(progressPercentage=4, totalSteps=-100, totalEpochs=-3, estimatedRemainingSeconds=-100),
            '{"progressPercentage":4,',
        ),
        ("{}", '{"progressPercentage":null,'),
        (served(progressPercentage=5, elapsedSeconds=12), '{"progressPercentage":5,'),
    ]
    for i, (body, start) in enumerate(cases):
        pod.serve(body)
        if i:
            clock.now += 5
            when = format_rfc3339(clock.now)
        polled(runner, i + 1)
        assert annotation_of(cluster, "llama") == start + f'"lastUpdatedTime":"{when}"}}', body


# ----------------------------------------------------------------------------------- switches, pods


def test_tracking_switch_is_exactly_true(make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]) -> None:
    """progression_test.go TestIsProgressionTrackingEnabled end to end; B1: ``"enabled"``, ``"false"`` or no
    annotation: the pod is never polled and no annotation is written; ``"true"``: polled."""
    clock = Clock()
    pod = pods(FULL)
    cluster, runner = poll_cluster(make_cluster, clock)
    for name, value in (("enabled", "enabled"), ("off", "false"), ("absent", None), ("on", "true")):
        annotations = {ANNOTATION_METRICS_PORT: pod.port}
        if value is not None:
            annotations[ANNOTATION_TRACKING] = value
        rank0_pod(cluster, name)
        cluster.fake.create_trainjob(trainjob(name, nodes=1, gpus=1, annotations=annotations))
    polled(runner, 1)
    for name in ("enabled", "off", "absent"):
        cluster.wait_job(name)
    clock.now += 60
    time.sleep(0.5)
    assert runner.stats["polls"] == 2 and len(pod.requests) == 2  # "on", twice; the others never
    assert [n for n in ("enabled", "off", "absent", "on") if annotation_of(cluster, n)] == ["on"]


def test_default_port_28080(make_cluster: Callable[..., Cluster]) -> None:
    """B2: without the port annotation (or with it empty) the pod is polled on 28080."""
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", 28080))
    except OSError:
        probe.close()
        pytest.skip("port 28080 is taken on this machine")
    probe.close()
    server = PodServer(FULL.encode())
    server.httpd.server_close()
    from http.server import ThreadingHTTPServer

    server.httpd = ThreadingHTTPServer(("127.0.0.1", 28080), server.httpd.RequestHandlerClass)
    server.httpd.daemon_threads = True
    threading.Thread(target=server.httpd.serve_forever, daemon=True).start()
    try:
        clock = Clock()
        cluster, runner = poll_cluster(make_cluster, clock)
        rank0_pod(cluster, "llama")
        cluster.fake.create_trainjob(tracked("llama", None, **{ANNOTATION_METRICS_PORT: ""}))
        polled(runner, 1)
        assert server.requests == ["/metrics"]
    finally:
        server.close()


def test_get_primary_pod_through_the_api(make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]) -> None:
    """progression_test.go TestGetPrimaryPod ("no running pod", "no pods", "running pod found") and
    TestGetPrimaryPod_DifferentLabelPatterns ("pod without IP returns error", "pytorch worker with
    replica-index", "mpi launcher pod") through the FAKE API's pod list; B13: Pending, no pod, Running
    without an IP, not Ready: no poll; legacy Worker and Launcher labels are found."""
    clock = Clock()
    pod = pods(FULL)
    cluster, runner = poll_cluster(make_cluster, clock)
    fake = cluster.fake
    fake.create_trainjob(tracked("llama", pod.port))
    cluster.wait_job("llama")
    polled(runner, 1, key="poll_errors")  # "no pods"
    legacy = {"training.kubeflow.org/job-name": "llama"}
    for step, (phase, ip, ready) in enumerate(
        (("Pending", None, None), ("Running", None, True), ("Running", "127.0.0.1", False))
    ):
        fake.add_pod("nlp", "llama-worker-0", None, phase, labels=legacy, pod_ip=ip, ready=ready)
        clock.now += 5
        polled(runner, step + 2, key="poll_errors")
    assert pod.requests == []
    fake.add_pod("nlp", "llama-worker-0", None, labels=legacy, pod_ip="127.0.0.1", ready=True)  # "running pod found"
    clock.now += 5
    polled(runner, 1)
    for name, labels in (
        ("pytorch-job", {"training.kubeflow.org/replica-type": "Worker", "training.kubeflow.org/replica-index": "0"}),
        ("mpi-job", {"training.kubeflow.org/replica-type": "Launcher"}),
    ):
        fake.add_pod(
            "nlp",
            f"{name}-0",
            None,
            labels={"training.kubeflow.org/job-name": name, **labels},
            pod_ip="127.0.0.1",
            ready=True,
        )
        fake.create_trainjob(tracked(name, pod.port))
    polled(runner, 3)
    assert annotation_of(cluster, "pytorch-job") and annotation_of(cluster, "mpi-job")
    selectors = {c[2].get("labelSelector", [""])[0] for c in fake.calls("GET", "/pods")}
    assert selectors == {"jobset.sigs.k8s.io/jobset-name=llama", "training.kubeflow.org/job-name=llama"} | {
        f"{k}={n}"
        for n in ("pytorch-job", "mpi-job")
        for k in ("jobset.sigs.k8s.io/jobset-name", "training.kubeflow.org/job-name")
    }


def test_rank_zero_of_the_jobset_is_polled(
    make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]
) -> None:
    """TestGetPrimaryPod_DifferentLabelPatterns "jobset pods with job-index and completion-index": with two nodes
    Running and Ready, the pod with job-index 0 and completion index 0 is polled, even listed second."""
    clock = Clock()
    pod = pods(FULL)
    cluster, runner = poll_cluster(make_cluster, clock)
    jobset = {"jobset.sigs.k8s.io/jobset-name": "llama"}
    # node 1 is listed first and would be refused: nothing listens on 127.0.0.2 (the pod server is on 127.0.0.1)
    node1 = {**jobset, "jobset.sigs.k8s.io/job-index": "1", "batch.kubernetes.io/job-completion-index": "0"}
    cluster.fake.add_pod("nlp", "llama-a", None, labels=node1, pod_ip="127.0.0.2", ready=True)
    rank0_pod(cluster, "llama")
    cluster.fake.create_trainjob(tracked("llama", pod.port))
    polled(runner, 1)
    assert runner.stats["poll_errors"] == 0 and pod.requests == ["/metrics"]


def test_no_polling_while_suspended(
    fake: FakeApi, make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]
) -> None:
    """B14: a suspended TrainJob is not polled."""
    clock = Clock()
    pod = pods(FULL)
    fake.create_trainjob(tracked("llama", pod.port))
    fake.set_condition("nlp", "llama", "Suspended")
    cluster, runner = poll_cluster(make_cluster, clock)
    rank0_pod(cluster, "llama")
    cluster.wait_job("llama", state="stopped")
    for _ in range(3):
        clock.now += 30
        time.sleep(0.2)
    assert runner.stats["polls"] == 0 and pod.requests == []


# ---------------------------------------------------------------------- the patch, and who owns it


def test_the_patch_touches_only_the_annotation(
    make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]
) -> None:
    """B22: other annotations, the labels and the spec are as they were; only the one key changes."""
    clock = Clock()
    pod = pods(FULL)
    cluster, runner = poll_cluster(make_cluster, clock)
    obj = tracked("llama", pod.port, **{"team.example.com/owner": "nlp-team"})
    obj["metadata"]["labels"] = {"app": "llama"}
    cluster.fake.create_trainjob(obj)
    polled(runner, 1, key="poll_errors")  # no pod yet
    before = json.loads(json.dumps(cluster.fake.trainjobs[("nlp", "llama")]))
    rank0_pod(cluster, "llama")  # (polled from now: the next poll finds it)
    clock.now += 5
    polled(runner, 1)
    after = cluster.fake.trainjobs[("nlp", "llama")]
    assert after["spec"] == before["spec"] and after["metadata"]["labels"] == before["metadata"]["labels"]
    added = {k: v for k, v in after["metadata"]["annotations"].items() if before["metadata"]["annotations"].get(k) != v}
    assert list(added) == [ANNOTATION_STATUS]
    assert {k: v for k, v in after["metadata"]["annotations"].items() if k != ANNOTATION_STATUS} == before["metadata"][
        "annotations"
    ]


def test_never_fights_red_hats_controller(make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]) -> None:
    """Where Red Hat's controller writes the annotation (another field manager), the runner only observes:
    it does not poll, it stores each of that controller's annotations as history; and a write of the
    controller that lands between the runner's poll and its write wins (server-side apply without force:
    409, nothing overwritten)."""
    clock = Clock()
    pod = pods(FULL)
    cluster, runner = poll_cluster(make_cluster, clock)
    fake = cluster.fake

    def red_hats(step: int) -> str:
        return encode_annotation(
            AnnotationStatus(
                progress_percentage=step // 100,
                current_step=step,
                total_steps=10000,
                train_metrics={"loss": 1000 / step},
                last_updated_time=format_rfc3339(clock.now),
            )
        )

    theirs = red_hats(5000)

    def red_hat_writes_first() -> None:  # the race: their patch lands while our GET is answered
        fake.merge_patch("nlp", "llama", {"metadata": {"annotations": {ANNOTATION_STATUS: theirs}}}, RH_MANAGER)

    pod.on_get = red_hat_writes_first
    rank0_pod(cluster, "llama")
    fake.create_trainjob(tracked("llama", pod.port))
    wait_for(lambda: runner.stats["write_errors"] >= 1, 10, "our write refused (409)")
    assert annotation_of(cluster, "llama") == theirs
    pod.on_get = None
    wait_for(lambda: (cluster.job("llama") or {})["progress"]["step"] == 5000, 10, "theirs stored")
    requests = len(pod.requests)
    for i, step in enumerate((6000, 7000)):
        clock.now += 30
        newer = red_hats(step)
        fake.merge_patch("nlp", "llama", {"metadata": {"annotations": {ANNOTATION_STATUS: newer}}}, RH_MANAGER)
        wait_for(lambda i=i: runner.stats["mirrored"] >= i + 2, 10, "their next one mirrored")
    time.sleep(0.3)  # several decisions
    assert len(pod.requests) == requests  # not polled since
    [ours] = _patches(cluster, "llama")  # (their patches are made on the fake directly) our one write, refused
    assert ours[2]["fieldManager"] == ["stepwatch"] and ours[2]["force"] == ["false"]
    assert annotation_of(cluster, "llama") == newer
    assert [s for s, _ in history(cluster, "llama", "loss")] == [5000, 6000, 7000]


# ------------------------------------------------------------------------------------------ bounds


def test_slow_pods_do_not_hold_up_the_others(
    make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]
) -> None:
    """Polls are bounded: at most ``max_concurrent_polls`` at once, each within 2 s, on the event loop without
    blocking it. Three pods that take 4 s and five that answer at once, with room for four polls at a
    time: the five are written while the three are still waiting, and the server answers meanwhile."""
    clock = Clock()
    cluster, runner = poll_cluster(make_cluster, clock, max_concurrent_polls=4)
    slow = [pods(FULL, delay=4.0) for _ in range(3)]
    fast = [pods(FULL) for _ in range(5)]
    for i, pod in enumerate(slow + fast):
        name = f"{'slow' if i < 3 else 'fast'}-{i}"
        rank0_pod(cluster, name)
        cluster.fake.create_trainjob(tracked(name, pod.port))
    wait_for(lambda: runner.stats["polled"] >= 5, 10, "the fast pods written")
    assert all(p.answered == 0 for p in slow)  # still waiting for the slow ones
    assert runner.stats["poll_errors"] == 0
    assert cluster.client.get("/api/v1/jobs").status_code == 200  # the event loop answers...
    assert runner.stats["poll_errors"] == 0  # ...while the slow polls still wait (not after they gave up)
    polled(runner, 3, key="poll_errors", timeout=15)  # each slow one given up at the 2 s deadline
    assert all(p.answered == 0 for p in slow)  # (before the pods answered)
    assert [len(p.requests) for p in slow + fast] == [1] * 8


def test_at_most_the_cap_at_once(make_cluster: Callable[..., Cluster], pods: Callable[..., PodServer]) -> None:
    """Ten slow pods (1 s each), room for three polls: never more than three requests in flight at the pods."""
    clock = Clock()
    cluster, runner = poll_cluster(make_cluster, clock, max_concurrent_polls=3)
    shared = pods(FULL, delay=1.0)  # one server for all: its in-flight count is the runner's concurrency
    for i in range(10):
        rank0_pod(cluster, f"job-{i}")
        cluster.fake.create_trainjob(tracked(f"job-{i}", shared.port))
    polled(runner, 10, timeout=30)
    assert 1 < shared.most_in_flight <= 3  # several at once, never more than the cap
