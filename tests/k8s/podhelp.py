"""Helpers of the poll-mode tests: TrainJobs annotated for OpenShift AI's progression tracking, their rank-0 pod
in the FAKE API server (``fakeapi.py``), a real HTTP server on loopback standing in for that pod
(``kubehelp.PodServer``), and a runner in ``poll`` mode on a clock the test moves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubehelp import Clock, Cluster, trainjob, wait_for

from stepwatch.protocol.progression import (
    ANNOTATION_METRICS_PORT,
    ANNOTATION_POLL_INTERVAL,
    ANNOTATION_STATUS,
    ANNOTATION_TRACKING,
)
from stepwatch.server.runners.kubernetes.reconcile import Config
from stepwatch.server.runners.kubernetes.runner import TrainJobRunner

__all__ = ["RANK0", "annotation_of", "history", "poll_cluster", "polled", "rank0_pod", "served", "tracked"]

RANK0 = {"jobset.sigs.k8s.io/job-index": "0", "batch.kubernetes.io/job-completion-index": "0"}


def tracked(name: str, port: str | None, namespace: str = "nlp", interval: str = "5s", **more: str) -> dict[str, Any]:
    """A TrainJob annotated as Red Hat's SDK annotates it (tracking on, the port, the interval)."""
    annotations = {ANNOTATION_TRACKING: "true", ANNOTATION_POLL_INTERVAL: interval, **more}
    if port is not None:
        annotations[ANNOTATION_METRICS_PORT] = port
    return trainjob(name, namespace, nodes=1, gpus=8, annotations=annotations)


def rank0_pod(
    cluster: Cluster, tj: str, namespace: str = "nlp", ready: bool = True, ip: str | None = "127.0.0.1", **kw: Any
) -> dict[str, Any]:
    """The TrainJob's rank-0 pod as JobSet labels it, Running on loopback (where the PodServer listens)."""
    labels = {"jobset.sigs.k8s.io/jobset-name": tj, "trainer.kubeflow.org/trainjob-name": tj, **RANK0}
    return cluster.fake.add_pod(namespace, f"{tj}-node-0-0", tj, labels=labels, pod_ip=ip, ready=ready, **kw)


def poll_cluster(make_cluster: Callable[..., Cluster], clock: Clock, **config: Any) -> tuple[Cluster, TrainJobRunner]:
    """A stepwatch server on ``clock`` whose runner is in ``poll`` mode (started: its first list done)."""
    cluster = make_cluster(clock=clock, k8s_mode="poll", k8s_pod_tokens=False)
    options = {k: config.pop(k) for k in ("max_concurrent_polls", "namespaces", "writes_per_s") if k in config}
    runner = cluster.start_runner(config=Config(mode="poll", **config), **options)
    return cluster, runner


def polled(runner: TrainJobRunner, count: int, key: str = "polled", timeout: float = 10.0) -> None:
    """Wait until the runner's ``key`` statistic reaches ``count`` and no poll is under way (so that the next
    one is timed from this one's end before the test moves the clock)."""

    def done() -> bool:
        return runner.stats[key] >= count and not any(s.poll.polling for s in list(runner.seen.values()))

    wait_for(done, timeout, f"{key} >= {count} (now {runner.stats[key]})")


def annotation_of(cluster: Cluster, name: str, namespace: str = "nlp") -> str | None:
    """The OpenShift AI annotation on the TrainJob in the fake, as written."""
    meta = cluster.fake.trainjobs[(namespace, name)]["metadata"]
    value: str | None = meta.get("annotations", {}).get(ANNOTATION_STATUS)
    return value


def history(cluster: Cluster, name: str, metric: str, namespace: str = "nlp") -> list[tuple[Any, Any]]:
    response = cluster.client.get(f"/api/v1/namespaces/{namespace}/jobs/{name}/history", params={"metrics": metric})
    assert response.status_code == 200, response.text
    return [(p["step"], p["last"]) for p in response.json()["metrics"].get(metric, [])]


def served(**fields: Any) -> str:
    """A body as a pod serves it (the keys as given)."""
    return json.dumps(fields)
