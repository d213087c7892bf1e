"""A job instrumented only by Red Hat's SDK, in stepwatch with no pod change: each change of the annotation
``trainer.opendatahub.io/trainerStatus`` that OpenShift AI's controller writes becomes the job's progress and
history, in every mode of the runner, once, in order, across relists and restarts. Against the FAKE
Kubernetes API server (``fakeapi.py``: there is no API server here; it follows the API's documented
behaviour), where the test writes the annotation as that controller does: a JSON merge patch
(``client.MergeFrom``) under its own field manager.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubehelp import Clock, Cluster, trainjob, wait_for
from podhelp import history

from stepwatch.cli.describe import describe
from stepwatch.protocol import format_rfc3339
from stepwatch.protocol.progression import ANNOTATION_STATUS, AnnotationStatus, encode_annotation
from stepwatch.server.runners.kubernetes.reconcile import Config

RH_MANAGER = "manager"
"""Red Hat's controller as the API server names it (controller-runtime sends no fieldManager: its binary's name)."""


def red_hat_writes(cluster: Cluster, name: str, status: AnnotationStatus, namespace: str = "nlp") -> None:
    """What ``PollAndUpdateProgress`` does with a poll: the annotation by a JSON merge patch, its own manager."""
    patch = {"metadata": {"annotations": {ANNOTATION_STATUS: encode_annotation(status)}}}
    cluster.fake.merge_patch(namespace, name, patch, RH_MANAGER)


def polled_at(at: float, step: int, total: int = 200, **extra: Any) -> AnnotationStatus:
    """The annotation of a poll of a pod at ``step`` of ``total``, written at ``at``."""
    remaining = (total - step) * 3
    return AnnotationStatus(
        progress_percentage=step * 100 // total,
        estimated_remaining_seconds=remaining,
        summary=extra.pop("summary", f"{remaining // 60} minutes" if remaining >= 60 else "less than a minute"),
        current_step=step,
        total_steps=total,
        current_epoch=round(step / 100, 3),
        total_epochs=2,
        train_metrics={"loss": round(4.0 / (1 + step / 20), 5), "learning_rate": 5e-5},
        eval_metrics={"eval_loss": 3.5, "accuracy": 0.5},
        last_updated_time=format_rfc3339(at),
        **extra,
    )


@pytest.mark.parametrize("mode", ["endpoint", "observer", "poll"])
def test_each_change_of_red_hats_annotation_is_history_in_every_mode(
    make_cluster: Callable[..., Cluster], mode: str
) -> None:
    """Progress, ETA (``estimatedRemainingSeconds``), steps, epochs, train metrics and eval ones (recognisable
    as eval metrics: ``accuracy`` is ``eval_accuracy``), each change a point in order; health and cost as
    for any job; the final summary kept where readers see it. Nothing is written onto the TrainJob."""
    clock = Clock()
    cluster = make_cluster(clock=clock, k8s_mode=mode, k8s_pod_tokens=False, gpu_prices={"h100": 4.0})
    cluster.fake.create_trainjob(trainjob("rhoai", nodes=2, gpus=8, labels={"stepwatch.io/gpu-type": "h100"}))
    runner = cluster.start_runner(config=Config(mode=mode, status_interval_s=0.1))  # type: ignore[arg-type]
    cluster.wait_job("rhoai")
    start = clock.now
    for i, step in enumerate((20, 40, 60, 80)):
        clock.now = start + 30 * (i + 1)
        red_hat_writes(cluster, "rhoai", polled_at(clock.now, step))
        wait_for(lambda i=i: runner.stats["mirrored"] == i + 1, 10, f"change {i + 1}")
    view = cluster.job("rhoai")
    assert view is not None
    assert view["progress"] | {"steps_per_second": None} == {
        "percent": 40.0,
        "step": 80,
        "total_steps": 200,
        "epoch": 0.8,
        "total_epochs": 2,
        "samples": None,
        "steps_per_second": None,
        "samples_per_second": None,
        "world_size": 1,
    }
    assert view["eta"]["reported_seconds"] == 360 and view["eta"]["source"] == "reported"
    assert view["metrics"] == {"loss": 0.8, "learning_rate": 5e-5, "eval_loss": 3.5, "eval_accuracy": 0.5}
    assert history(cluster, "rhoai", "loss") == [(20, 2.0), (40, 1.33333), (60, 1.0), (80, 0.8)]
    assert [s for s, _ in history(cluster, "rhoai", "eval_accuracy")] == [20, 40, 60, 80]
    assert view["health"]["state"] == "healthy" and view["cost"]["spent"] == pytest.approx(16 * 4 * 90 / 3600)
    assert view["state"] == "running" and view["source"] == "kubeflow"
    # the end, as Red Hat's controller writes it from the termination message
    clock.now += 30
    final = polled_at(clock.now, 200, summary="complete")
    red_hat_writes(cluster, "rhoai", final)
    wait_for(lambda: runner.stats["mirrored"] == 5, 10, "the end")
    view = cluster.job("rhoai")
    assert view is not None and view["progress"]["percent"] == 100.0 and view["eta"]["reported_seconds"] == 0
    metrics = {m["name"]: m["value"] for m in view["trainerStatus"]["metrics"]}
    assert metrics["estimatedRemainingTimeSummary"] == "complete"
    time.sleep(0.3)
    assert runner.stats["writes"] == 0  # observed only, in every mode
    assert not [c for c in cluster.fake.calls("PATCH") if c[2].get("fieldManager") == ["stepwatch"]]


def test_two_changes_between_two_decisions_are_two_points_even_in_one_second(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Changes written back to back (before the runner decides) are each a point, in order; two in one
    second (the annotation's time is whole seconds: a last poll, then the capture of the end) too."""
    clock = Clock()
    cluster = make_cluster(clock=clock, k8s_mode="observer", k8s_pod_tokens=False)
    cluster.fake.create_trainjob(trainjob("burst"))
    runner = cluster.start_runner(config=Config(mode="observer"))
    cluster.wait_job("burst")
    at = clock.now - 100  # written before the runner reads them, as in a cluster
    for step in (10, 20, 30):
        red_hat_writes(cluster, "burst", polled_at(at + step, step))
    red_hat_writes(cluster, "burst", polled_at(at + 30, 31, summary="complete (early stopped)"))  # the same second
    wait_for(lambda: runner.stats["mirrored"] == 4, 10, "four changes")
    assert [s for s, _ in history(cluster, "burst", "loss")] == [10, 20, 30, 31]


def test_a_relist_and_a_restart_store_nothing_twice(make_cluster: Callable[..., Cluster]) -> None:
    """After a 410 relist and a restart of the runner, the annotation seen again is not stored again; the
    next change is."""
    clock = Clock()
    cluster = make_cluster(clock=clock, k8s_mode="endpoint", k8s_pod_tokens=False)
    cluster.fake.create_trainjob(trainjob("again"))
    runner = cluster.start_runner(config=Config())
    cluster.wait_job("again")
    for step in (10, 20):
        red_hat_writes(cluster, "again", polled_at(clock.now - 50 + step, step))
    wait_for(lambda: runner.stats["mirrored"] == 2, 10, "two changes")
    cluster.fake.fail("GET", "/trainjobs", 500)  # the watch is away for a while...
    cluster.fake.drop_watches()
    cluster.fake.create_trainjob(trainjob("other"))
    cluster.fake.compact()  # ...and expires (410): listed again, the same annotation seen again
    wait_for(lambda: runner.stats["lists"] >= 2, 10, "a relist")
    cluster.wait_job("other")
    cluster.close()
    again = cluster.start_runner(config=Config())  # a restart
    time.sleep(0.5)
    assert again.stats["mirrored"] == 0 and runner.stats["mirrored"] == 2
    assert [s for s, _ in history(cluster, "again", "loss")] == [10, 20]
    red_hat_writes(cluster, "again", polled_at(clock.now, 30))
    wait_for(lambda: again.stats["mirrored"] == 1, 10, "the next change")
    assert [s for s, _ in history(cluster, "again", "loss")] == [10, 20, 30]


def test_an_annotation_go_cannot_read_is_not_stored(make_cluster: Callable[..., Cluster]) -> None:
    """Read with Go's semantics: a float in an integer field (``45.0``) is no status for the controller, nor
    here; the next good one is stored."""
    clock = Clock()
    cluster = make_cluster(clock=clock, k8s_mode="observer", k8s_pod_tokens=False)
    cluster.fake.create_trainjob(trainjob("odd"))
    runner = cluster.start_runner(config=Config(mode="observer"))
    cluster.wait_job("odd")
    bad = '{"progressPercentage":45.0,"currentStep":9,"lastUpdatedTime":"' + format_rfc3339(clock.now - 5) + '"}'
    cluster.fake.merge_patch("nlp", "odd", {"metadata": {"annotations": {ANNOTATION_STATUS: bad}}}, RH_MANAGER)
    red_hat_writes(cluster, "odd", polled_at(clock.now, 10))
    wait_for(lambda: runner.stats["mirrored"] == 1, 10, "the good one")
    time.sleep(0.2)
    assert runner.stats["mirrored"] == 1 and (cluster.job("odd") or {})["progress"]["step"] == 10


def test_describe_shows_what_the_openshift_ai_drawer_shows(make_cluster: Callable[..., Cluster]) -> None:
    """Issue 28, Build 6: for a job seen only through Red Hat's annotation, ``stepwatch describe`` shows what
    OpenShift AI's drawer shows (time remaining, completed steps x/y, epochs x/y, the train metrics then the
    eval ones) and, once the job has ended, how the controller summed up its end."""
    clock = Clock()
    cluster = make_cluster(clock=clock, k8s_mode="observer", k8s_pod_tokens=False)
    cluster.fake.create_trainjob(trainjob("drawer"))
    runner = cluster.start_runner(config=Config(mode="observer"))
    cluster.wait_job("drawer")
    clock.now += 30
    red_hat_writes(cluster, "drawer", polled_at(clock.now, 80))
    wait_for(lambda: runner.stats["mirrored"] == 1, 10, "a poll")
    view = cluster.job("drawer")
    assert view is not None
    out = io.StringIO()
    describe(view, [], out, now=clock.now)
    running = out.getvalue()
    assert "Step:" in running and "80/200" in running and "0.8/2" in running
    assert "6m" in running and "reported by the job" in running  # 360 s remaining, the job's own ETA
    train, evals = running.index("Train metrics:"), running.index("Eval metrics:")
    assert train < running.index("loss:") < evals < running.index("eval_accuracy:") < running.index("eval_loss:")
    assert "OpenShift AI summary" not in running  # a running job's summary is its ETA, shown above
    clock.now += 30
    red_hat_writes(cluster, "drawer", polled_at(clock.now, 150, summary="complete (early stopped)"))
    wait_for(lambda: runner.stats["mirrored"] == 2, 10, "the end")
    cluster.fake.set_condition("nlp", "drawer", "Complete")
    wait_for(lambda: (cluster.job("drawer") or {}).get("state") == "finished", 10, "finished")
    view = cluster.job("drawer")
    assert view is not None
    out = io.StringIO()
    describe(view, [], out, now=clock.now)
    ended = out.getvalue()
    assert "ended at 75.0%" in ended and "150/200" in ended
    assert re.search(r"OpenShift AI summary: +complete \(early stopped\)", ended), ended
