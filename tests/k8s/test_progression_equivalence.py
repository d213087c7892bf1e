"""Issue 28's "done when": one recorded run, fed to stepwatch four ways, shows the same progress, ETA and metrics.

The run (``fixtures/progression_run.json``) was recorded once from a real small training loop: a Hugging Face
``Trainer`` training an MLP on CPU for 3 epochs of 160 steps, logging every 20 steps and evaluating every 160,
with a callback that wrote down, after every log, what a training pod would say at that moment (step, totals,
epoch, the ETA both callbacks compute, the latest metrics); ``fixtures/record_progression_run.py`` is the
recorder (run it to record again). Each snapshot is replayed on the server's clock 10 s after the last (whole
seconds, so that the second-precision times of three of the four ways agree, and poll mode's 5 s interval
passes between snapshots), four ways, each against the FAKE Kubernetes API server (``fakeapi.py``: there is
no API server here; it follows the API's documented behaviour):

1. **push**: posts to stepwatch's Kubeflow endpoint, as transformers' ``KubeflowCallback`` sends them
   (``on_step_end``: progress ``min(int(step/max*100), 99)``, its ETA, the metrics with ``current_step``,
   ``total_steps`` and ``current_epoch`` rounded to 2 places, all as strings; ``on_train_end``: 100 %, ETA 0,
   the metrics), with a pod's projected token (endpoint mode);
2. **observer**: the same posts as upstream's status server applies them to ``status.trainerStatus``
   (server-side apply, field manager ``trainer-status``, ``lastUpdatedTime`` re-encoded by ``metav1.Time``);
3. **annotation**: ``trainer.opendatahub.io/trainerStatus`` as OpenShift AI's controller writes it from a poll of
   a pod serving the snapshot (Red Hat's callback's JSON, read with Go's decoding, cleaned, the summary and
   time added, ``json.Marshal``'s bytes, by a JSON merge patch under its own field manager);
4. **poll**: stepwatch's poll mode polls a real HTTP server on loopback standing in for the pod, which serves
   each snapshot as ``encode_served(build_status(...))``, and captures the end.

After every snapshot, and at the end, the job and its history as the API returns them are compared. Where the
four cannot agree, it is the wire formats that differ, not stepwatch; each difference is asserted as such
(docs/openshift-ai.md, "Cluster side", says the same):

- transformers' callback caps its progress at 99 % until ``on_train_end`` (so at the last step it says 99 where
  Red Hat's says 100), rounds the epoch to 2 places (0.125 is 0.12) and sends no total of epochs;
- transformers' callback posts once more at the end (100 %, ETA 0, the last metrics): one more point, at the
  last step with the last values; Red Hat's controller writes nothing more at the end of this run, since its
  last poll already said 0 seconds left (``IsFinalStatusCaptured``, case B20);
- times: the push carries the pod's own time (microseconds, ``+00:00``), the other three whole seconds; here
  the replay's clock is whole seconds, so the stored times agree; in a cluster they differ by under a second.
- String metrics (TrainingHub's ``"%.4f"``) read as numbers either way; this run has none.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubehelp import Clock, Cluster, PodServer, trainjob, wait_for
from podhelp import polled, rank0_pod, tracked

from stepwatch.protocol import format_rfc3339
from stepwatch.protocol.progression import (
    ANNOTATION_STATUS,
    build_status,
    clean_invalid,
    decode_status,
    encode_annotation,
    encode_served,
)
from stepwatch.server.runners.kubernetes.progression import to_annotation
from stepwatch.server.runners.kubernetes.reconcile import Config

RUN = json.loads((Path(__file__).parent / "fixtures" / "progression_run.json").read_text())
SNAPSHOTS: list[dict[str, Any]] = [s for s in RUN["snapshots"] if "end" not in s]
END: dict[str, Any] = next(s for s in RUN["snapshots"] if "end" in s)
METRICS = sorted(END["metrics"])
WAYS = ("push", "observer", "annotation", "poll")
RH_MANAGER = "manager"
UPSTREAM_MANAGER = "trainer-status"


# ------------------------------------------------------------------------------------ the wire, four ways


def kubeflow_callback_status(snapshot: dict[str, Any], at: float, end: bool = False) -> dict[str, Any]:
    """The ``trainerStatus`` transformers' KubeflowCallback posts (``_update_status``), from a snapshot."""
    status: dict[str, Any] = {"lastUpdatedTime": dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat()}
    if end:  # on_train_end: progress_percent=100, estimated_time_remaining=0, metrics=self._metrics
        status |= {"progressPercentage": 100, "estimatedRemainingSeconds": 0}
        metrics: dict[str, Any] = dict(snapshot["metrics"])
    else:  # on_step_end
        progress = min(int((snapshot["step"] / snapshot["total_steps"]) * 100), 99)
        status["progressPercentage"] = max(0, min(100, progress))
        if snapshot["eta"] is not None:
            status["estimatedRemainingSeconds"] = max(0, int(snapshot["eta"]))
        metrics = {
            **snapshot["metrics"],
            "current_step": snapshot["step"],
            "total_steps": snapshot["total_steps"],
            "current_epoch": round(snapshot["epoch"], 2),
        }
    status["metrics"] = [{"name": str(k), "value": str(v)} for k, v in metrics.items()]
    return status


def served(snapshot: dict[str, Any], end: bool = False) -> bytes:
    """What Red Hat's callback (or stepwatch's report core) serves at that moment: ``TrainerStatus``."""
    status = build_status(
        step=snapshot["step"],
        total_steps=snapshot["total_steps"],
        epoch=snapshot["epoch"],
        total_epochs=snapshot["total_epochs"],
        eta_seconds=snapshot["eta"],
        metrics=snapshot["metrics"],
        ended="finished" if end else None,
    )
    return encode_served(status)


def red_hat_annotation(snapshot: dict[str, Any], at: float) -> str:
    """What OpenShift AI's controller writes from a poll of a pod serving the snapshot (PollAndUpdateProgress)."""
    return encode_annotation(to_annotation(clean_invalid(decode_status(served(snapshot))), at))


# ------------------------------------------------------------------------------------------ replays


@pytest.fixture
def pod() -> Iterator[PodServer]:
    server = PodServer()
    yield server
    server.close()


def view_of(cluster: Cluster, namespace: str) -> dict[str, Any]:
    view = cluster.job("run", namespace)
    assert view is not None
    return {k: view[k] for k in ("state", "progress", "eta", "metrics")} | {"health": view["health"]["state"]}


def history_of(cluster: Cluster, namespace: str) -> dict[str, list[tuple[Any, Any, Any]]]:
    answer = cluster.client.get(
        f"/api/v1/namespaces/{namespace}/jobs/run/history", params={"metrics": ",".join(METRICS)}
    ).json()["metrics"]
    return {m: [(p["t"], p["step"], p["last"]) for p in answer.get(m, [])] for m in METRICS}


def feed(
    way: str, cluster: Cluster, pod: PodServer, snapshot: dict[str, Any], at: float, token: str, count: int
) -> None:
    """One snapshot, one way (``count``: how many the runner has taken once it took this one)."""
    ns = way
    runner = cluster.runner
    assert runner is not None
    if way == "push":
        body = {"trainerStatus": kubeflow_callback_status(snapshot, at)}
        assert cluster.post_status("run", token, body, namespace=ns).status_code == 200
    elif way == "observer":
        status = kubeflow_callback_status(snapshot, at)
        status["lastUpdatedTime"] = format_rfc3339(at)  # metav1.Time: UTC, whole seconds
        upstream_applies(cluster, ns, status)
        wait_for(lambda: runner.stats["mirrored"] == count, 10, f"status {count} mirrored")
    elif way == "annotation":
        patch = {"metadata": {"annotations": {ANNOTATION_STATUS: red_hat_annotation(snapshot, at)}}}
        cluster.fake.merge_patch(ns, "run", patch, RH_MANAGER)
        wait_for(lambda: runner.stats["mirrored"] == count, 10, f"annotation {count} mirrored")
    else:
        pod.serve(served(snapshot))
        polled(runner, count)


def finish(way: str, cluster: Cluster, ns: str, at: float, token: str) -> None:
    """The end: the pod's last word (transformers' final post; the termination message), then Complete."""
    runner = cluster.runner
    assert runner is not None
    if way in ("push", "observer"):
        status = kubeflow_callback_status(END, at, end=True)
        if way == "push":
            assert cluster.post_status("run", token, {"trainerStatus": status}, namespace=ns).status_code == 200
        else:
            status["lastUpdatedTime"] = format_rfc3339(at)
            upstream_applies(cluster, ns, status)
            wait_for(lambda: runner.stats["mirrored"] == len(SNAPSHOTS) + 1, 10, "the final status")
    if way == "poll":
        ended = {"name": "node", "state": {"terminated": {"message": served(END, end=True).decode()}}}
        cluster.fake.set_pod_status(ns, "run-node-0-0", phase="Succeeded", containerStatuses=[ended])
    cluster.fake.set_condition(ns, "run", "Complete", message="jobset completed")
    cluster.wait_job("run", ns, state="finished")
    if way == "poll":
        wait_for(lambda: not runner.seen[(ns, "run")].poll.polling, 5, "no poll under way")
        time.sleep(0.3)  # (a capture of the end would have started by now: none should)
        # one per snapshot, none at the end (B20: 0 s left); a poll that failed (a loaded machine can make the
        # loopback pod miss the controller's 2 s timeout) is tried again at the next interval and not counted
        answered = runner.stats["polls"] - runner.stats["poll_errors"]
        assert answered == len(SNAPSHOTS), runner.stats


def replay(
    way: str, make_cluster: Callable[..., Cluster], clock: Clock, pod: PodServer
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Feed the run one way; the job's view after each snapshot and at the end, and its history."""
    ns = way
    mode = {"push": "endpoint", "observer": "observer", "annotation": "endpoint", "poll": "poll"}[way]
    start = clock.now
    clock.now = start + 10
    # (the push posts one status every 10 s of the clock; the rate limits of pod tokens are not what is tested)
    cluster = make_cluster(
        clock=clock, k8s_mode=mode, k8s_pod_tokens=way == "push", k8s_job_rate=1000.0, k8s_account_rate=1000.0
    )
    fake = cluster.fake
    if way == "poll":
        pod.serve(served(SNAPSHOTS[0]))
        rank0_pod(cluster, "run", ns)
        fake.create_trainjob(tracked("run", pod.port, ns, interval="5s"))
    else:
        fake.create_trainjob(trainjob("run", ns, nodes=1, gpus=8))
    cluster.start_runner(namespaces=(ns,), config=Config(mode=mode, status_interval_s=0.1))  # type: ignore[arg-type]
    cluster.wait_job("run", ns)
    token = ""
    if way == "push":
        fake.add_pod(ns, "run-node-0-0", "run")
        token = fake.token(ns, "run-node-0-0")
    views = []
    for i, snapshot in enumerate(SNAPSHOTS):
        clock.now = start + 10 * (i + 1)
        feed(way, cluster, pod, snapshot, clock.now, token, i + 1)
        views.append(view_of(cluster, ns))
    clock.now = start + 10 * (len(SNAPSHOTS) + 1)
    finish(way, cluster, ns, clock.now, token)
    views.append(view_of(cluster, ns))
    history = history_of(cluster, ns)
    cluster.close()
    return views, history


def upstream_applies(cluster: Cluster, ns: str, status: dict[str, Any]) -> None:
    config = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "run", "namespace": ns},
        "status": {"trainerStatus": status},
    }
    cluster.fake.apply(ns, "run", config, UPSTREAM_MANAGER, True, "status")


# ------------------------------------------------------------------------------------------- the test


def test_one_recorded_run_four_ways_shows_the_same(
    make_cluster: Callable[..., Cluster], pod: PodServer, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock()
    base = clock.now
    seen: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {}
    for way in WAYS:
        clock.now = base
        seen[way] = replay(way, make_cluster, clock, pod)
    push, observer, annotation, polled_ = (seen[w] for w in WAYS)

    # the two ways that speak Red Hat's protocol agree in everything, points and their times included
    assert polled_ == annotation
    # and so do the two that speak KEP-2779's
    assert observer == push

    # KEP-2779's ways and Red Hat's: the same, but for the formats' own differences, asserted as such
    (push_views, push_history), (rh_views, rh_history) = push, annotation
    assert len(push_views) == len(rh_views) == len(SNAPSHOTS) + 1
    for i, (kep, rh) in enumerate(zip(push_views, rh_views)):
        live = i < len(SNAPSHOTS)
        kep_p, rh_p = dict(kep["progress"]), dict(rh["progress"])
        # transformers' callback: 99 % at most until its final post
        assert kep_p.pop("percent") == (min(rh_p["percent"], 99) if live else rh_p["percent"])
        rh_p.pop("percent")
        assert kep_p.pop("epoch") == round(rh_p.pop("epoch"), 2)  # it rounds the epoch to 2 places
        assert (kep_p.pop("total_epochs"), rh_p.pop("total_epochs")) == (None, 3)  # and sends no total of epochs
        assert kep_p == rh_p, i  # steps, totals, rate
        assert kep["eta"] == rh["eta"], i  # remaining, reported, stepwatch's estimate, source
        assert kep["metrics"] == rh["metrics"], i
        assert (kep["state"], kep["health"]) == (rh["state"], rh["health"]), i
    for metric in METRICS:
        kep_points, rh_points = push_history[metric], rh_history[metric]
        assert kep_points[:-1] == rh_points, metric  # every live point, at the same step and time, same value
        final = kep_points[-1]  # the callback's final post: one point more, at the last step, with the last value
        assert final[1:] == rh_points[-1][1:] and final[0] == base + 10 * (len(SNAPSHOTS) + 1)

    end = rh_views[-1]
    assert end["state"] == "finished" and end["progress"]["percent"] == 100.0
    assert end["progress"]["step"] == END["step"] and end["eta"]["reported_seconds"] == 0
    assert end["metrics"] == pytest.approx(END["metrics"])
    with capsys.disabled():  # the figures the docs quote
        first, middle = rh_views[0], rh_views[len(SNAPSHOTS) // 2]
        print(
            f"\n  {len(SNAPSHOTS)} snapshots + the end, four ways; points per metric: push/observer "
            f"{len(push_history['loss'])}, annotation/poll {len(rh_history['loss'])}; "
            f"first: {first['progress']['percent']} % ETA {first['eta']['reported_seconds']} s; "
            f"middle: step {middle['progress']['step']}, {middle['progress']['percent']} %, "
            f"ETA {middle['eta']['reported_seconds']} s, loss {middle['metrics']['loss']:.4f}; "
            f"end: {end['progress']['percent']} %, loss {end['metrics']['loss']:.4f}, "
            f"eval_accuracy {end['metrics']['eval_accuracy']}"
        )
