"""The two deployments of docs/kubernetes.md, against the FAKE Kubernetes API server (``fakeapi.py``: there is
no API server here; it follows the API's documented behaviour, see its docstring):

- **endpoint** (``STEPWATCH_K8S_MODE=endpoint``, the default; upstream's ``TrainJobStatus`` gate off): the
  pods post their status to stepwatch with their projected tokens, and the runner writes
  ``status.trainerStatus`` back;
- **observer** (``STEPWATCH_K8S_MODE=observer``; the gate on): the pods post to upstream's status server,
  which server-side applies ``status.trainerStatus`` with the field manager ``trainer-status`` and
  ``force`` (kubeflow/trainer ``pkg/statusserver/server.go``); here the test applies it so on the fake.
  The runner turns each change into history and never writes the field.

And the case of both at once: the gate on while stepwatch's endpoint env is in the runtime. Upstream's
plugin (``pkg/runtime/framework/plugins/trainjobstatus/trainjobstatus.go``) upserts the same three
variable names into the trainer containers after the runtime and the TrainJob's overrides are merged,
so upstream's values win and the pods post to upstream: the runner sees another manager own
``status.trainerStatus``, mirrors it, and stops writing its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubehelp import Clock, Cluster, trainjob, wait_for

from stepwatch.protocol import format_rfc3339
from stepwatch.server import ServerSettings
from stepwatch.server.runners.kubernetes.reconcile import Config

UPSTREAM_MANAGER = "trainer-status"
"""The field manager of upstream's status server (``client.FieldOwner("trainer-status")``)."""


def recorded_run(start: float) -> list[tuple[float, dict[str, Any]]]:
    """A run as transformers' KubeflowCallback posts it: a status every 10 s with step, totals, loss,
    progress and its ETA, then its final post (100 %, ETA 0). Times as the pod wrote them."""
    run = []
    for i, step in enumerate((10, 20, 30, 45, 60, 75, 90)):
        at = start + 10 * (i + 1)
        status = {
            "progressPercentage": step * 100 // 120,
            "estimatedRemainingSeconds": (120 - step) * 2,
            "metrics": [
                {"name": "loss", "value": str(round(3.0 / (1 + step / 10), 4))},
                {"name": "learning_rate", "value": "0.0001"},
                {"name": "current_step", "value": str(step)},
                {"name": "total_steps", "value": "120"},
                {"name": "current_epoch", "value": "1"},
            ],
            "lastUpdatedTime": format_rfc3339(at),
        }
        run.append((at, status))
    final_at = start + 90
    final = {
        "progressPercentage": 100,
        "estimatedRemainingSeconds": 0,
        "metrics": [{"name": "loss", "value": "0.25"}, {"name": "total_steps", "value": "120"}],
        "lastUpdatedTime": format_rfc3339(final_at),
    }
    return [*run, (final_at, final)]


def upstream_applies(cluster: Cluster, namespace: str, name: str, status: dict[str, Any]) -> None:
    """What upstream's status server does with a pod's post: server-side apply of the whole trainerStatus on
    the status subresource, as ``trainer-status``, forcing ownership."""
    config = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"trainerStatus": status},
    }
    cluster.fake.apply(namespace, name, config, UPSTREAM_MANAGER, True, "status")


def shown(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """What stepwatch shows of a job: progress, ETA, metrics, health, cost, and the loss history."""
    view = cluster.job(name, namespace)
    assert view is not None
    history = cluster.client.get(
        f"/api/v1/namespaces/{namespace}/jobs/{name}/history", params={"metrics": "loss,learning_rate"}
    ).json()["metrics"]
    return {
        "progress": view["progress"],
        "eta": view["eta"],
        "metrics": view["metrics"],
        "health": view["health"]["state"],
        "cost": view["cost"],
        "history": {m: [(p["step"], p["last"]) for p in points] for m, points in sorted(history.items())},
    }


def replay_endpoint(cluster: Cluster, clock: Clock, run: list[tuple[float, dict[str, Any]]]) -> None:
    """Endpoint mode: the pod posts each status to stepwatch with its projected token."""
    cluster.fake.add_pod("ep", "run-node-0-0", "run")
    token = cluster.fake.token("ep", "run-node-0-0")
    for at, status in run:
        clock.now = at
        answer = cluster.post_status("run", token, {"trainerStatus": status}, namespace="ep")
        assert answer.status_code == 200, answer.text


def replay_observer(cluster: Cluster, clock: Clock, run: list[tuple[float, dict[str, Any]]]) -> None:
    """Observer mode: upstream's status server applies each post onto the TrainJob; the runner reads it."""
    runner = cluster.runner
    assert runner is not None
    for i, (at, status) in enumerate(run):
        clock.now = at
        upstream_applies(cluster, "obs", "run", status)
        wait_for(lambda i=i: runner.stats["mirrored"] == i + 1, 10, f"status {i + 1} mirrored")


def test_the_same_run_shows_the_same_in_both_modes(make_cluster: Callable[..., Cluster]) -> None:
    clock = Clock()
    run = recorded_run(clock.now)
    seen: dict[str, dict[str, Any]] = {}
    for mode, namespace, replay in (("endpoint", "ep", replay_endpoint), ("observer", "obs", replay_observer)):
        clock.now = run[0][0] - 10
        cluster = make_cluster(clock=clock, k8s_mode=mode, k8s_pod_tokens=mode == "endpoint")
        cluster.fake.create_trainjob(trainjob("run", namespace, nodes=1, gpus=8))
        runner = cluster.start_runner(namespaces=(namespace,), config=Config(status_interval_s=0.1, mode=mode))
        cluster.wait_job("run", namespace)
        replay(cluster, clock, run)
        seen[mode] = shown(cluster, namespace, "run")
        writes = [c for c in cluster.fake.calls("PATCH", f"/namespaces/{namespace}/") if c[2].get("fieldManager")]
        if mode == "observer":
            assert writes == [] and runner.stats["writes"] == 0  # never writes trainerStatus (nor the annotation)
        else:
            wait_for(lambda runner=runner: runner.stats["writes"] > 0, 10, "the endpoint-mode runner's write-back")
        cluster.close()
    endpoint, observer = seen["endpoint"], seen["observer"]
    assert observer == endpoint
    # (what a final post without a step shows is issue 18's replace semantics, tested with the ingest)
    assert endpoint["metrics"]["loss"] == 0.25 and endpoint["progress"]["total_steps"] == 120
    assert endpoint["eta"]["remaining_seconds"] is not None and endpoint["cost"]
    assert [step for step, _ in endpoint["history"]["loss"]][:3] == [10, 20, 30]
    assert len(endpoint["history"]["loss"]) == len(run)


def test_observer_mode_stores_each_change_once(make_cluster: Callable[..., Cluster]) -> None:
    """Three statuses applied back to back (the runner decides once for all three: each is still history);
    then a 410 relist and a restart of the runner: nothing is stored twice."""
    cluster = make_cluster(k8s_mode="observer", k8s_pod_tokens=False)
    cluster.fake.create_trainjob(trainjob("burst", "obs"))
    runner = cluster.start_runner(config=Config(status_interval_s=0.1, mode="observer"))
    cluster.wait_job("burst", "obs")
    start = time.time() - 200  # written by the pods before the runner reads them, as in a cluster
    run = recorded_run(start)[:3]
    for _, status in run:
        upstream_applies(cluster, "obs", "burst", status)
    wait_for(lambda: runner.stats["mirrored"] == 3, 10, "three statuses mirrored")

    def losses() -> list[int]:
        return [step for step, _ in shown(cluster, "obs", "burst")["history"]["loss"]]

    assert losses() == [10, 20, 30]
    cluster.fake.fail("GET", "/trainjobs", 500)  # the watch is away for a while...
    cluster.fake.drop_watches()
    cluster.fake.create_trainjob(trainjob("other", "obs"))
    cluster.fake.compact()  # ...and expires (410): the runner lists again and sees the same status again
    wait_for(lambda: runner.stats["lists"] >= 2, 10, "a relist")
    cluster.wait_job("other", "obs")
    cluster.close()
    again = cluster.start_runner(config=Config(status_interval_s=0.1, mode="observer"))  # a restart
    time.sleep(0.5)
    assert again.stats["mirrored"] == 0 and losses() == [10, 20, 30]
    upstream_applies(cluster, "obs", "burst", recorded_run(start)[3][1])
    wait_for(lambda: again.stats["mirrored"] == 1, 10, "the next status")
    assert losses() == [10, 20, 30, 45]
    assert not [c for c in cluster.fake.calls("PATCH") if c[2].get("fieldManager") == ["stepwatch"]]


def test_observer_mode_does_not_write_for_a_job_that_reports_to_stepwatch(make_cluster: Callable[..., Cluster]) -> None:
    """A pod that still posts to stepwatch (a leftover env) is stored, but the TrainJob's trainerStatus stays
    upstream's: in observer mode the runner writes nothing onto it."""
    cluster = make_cluster(k8s_mode="observer")
    cluster.fake.create_trainjob(trainjob("stray", "obs"))
    runner = cluster.start_runner(config=Config(status_interval_s=0.1, mode="observer"))
    cluster.wait_job("stray", "obs")
    cluster.fake.add_pod("obs", "stray-node-0-0", "stray")
    token = cluster.fake.token("obs", "stray-node-0-0")
    status = recorded_run(time.time() - 200)[0][1]
    assert cluster.post_status("stray", token, {"trainerStatus": status}, namespace="obs").status_code == 200
    wait_for(lambda: (cluster.job("stray", "obs") or {})["progress"]["step"] == 10, 10, "the post stored")
    time.sleep(0.5)  # several decisions
    assert runner.stats["writes"] == 0
    assert "trainerStatus" not in cluster.fake.trainjobs[("obs", "stray")].get("status", {})


def test_gate_on_while_stepwatch_injects_upstream_wins_and_the_runner_follows(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Endpoint mode, and upstream's gate switched on mid-run: its plugin's env wins in the pods, which now
    post to upstream's status server. The runner sees ``trainer-status`` own trainerStatus, stops writing
    its own (no tug of war: no write after that, no conflict) and mirrors upstream's statuses."""
    cluster = make_cluster()
    cluster.fake.create_trainjob(trainjob("both", "nlp"))
    runner = cluster.start_runner(config=Config(status_interval_s=0.1))
    cluster.wait_job("both")
    cluster.fake.add_pod("nlp", "both-node-0-0", "both")
    token = cluster.fake.token("nlp", "both-node-0-0")
    run = recorded_run(time.time())  # (upstream's statuses come after the post to stepwatch)
    assert cluster.post_status("both", token, {"trainerStatus": run[0][1]}).status_code == 200
    wait_for(lambda: runner.stats["writes"] > 0, 10, "stepwatch's write-back while it is the endpoint")
    wait_for(lambda: not runner.in_flight and not runner.writes, 10, "its writes done")
    writes_before = runner.stats["writes"]
    for i, (_, status) in enumerate(run[1:4]):  # now the pods post to upstream
        upstream_applies(cluster, "nlp", "both", status)
        wait_for(lambda i=i: runner.stats["mirrored"] == i + 1, 10, f"upstream status {i + 1} mirrored")
    time.sleep(0.5)
    assert runner.stats["writes"] == writes_before and runner.stats["write_errors"] == 0
    on_object = cluster.fake.trainjobs[("nlp", "both")]["status"]["trainerStatus"]
    assert on_object["lastUpdatedTime"] == run[3][1]["lastUpdatedTime"]  # upstream's, untouched
    steps = [step for step, _ in shown(cluster, "nlp", "both")["history"]["loss"]]
    assert steps == [10, 20, 30, 45]


@pytest.mark.parametrize(("value", "mode"), [("observer", "observer"), (" Endpoint ", "endpoint"), (None, "endpoint")])
def test_the_mode_setting(value: str | None, mode: str) -> None:
    env = {} if value is None else {"STEPWATCH_K8S_MODE": value}
    assert ServerSettings.resolve({}, env).k8s_mode == mode


def test_a_wrong_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="STEPWATCH_K8S_MODE"):
        ServerSettings.resolve({}, {"STEPWATCH_K8S_MODE": "watch"})
