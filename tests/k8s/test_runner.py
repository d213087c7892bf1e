"""The TrainJob runner end to end: the official ``kubernetes`` client against a FAKE Kubernetes API server
(``fakeapi.py``: there is no API server on these machines), and a real stepwatch server on SQLite."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from kubeflow_trainer_api import models as trainer_models
from kubehelp import Cluster, cluster_runtime, pod_status, trainjob, wait_for

from stepwatch.server.runners.kubernetes.objects import ANNOTATION
from stepwatch.server.runners.kubernetes.reconcile import Config


def test_registers_trainjobs_with_nodes_times_gpus(cluster: Cluster) -> None:
    fake = cluster.fake
    fake.runtimes[("ClusterTrainingRuntime", "", "big-runtime")] = cluster_runtime("big-runtime", nodes=4, gpus=4)
    fake.create_trainjob(trainjob("llama", nodes=2, gpus=8))
    fake.create_trainjob(trainjob("mistral", nodes=None, gpus=None, runtime="big-runtime"))
    cluster.start_runner()
    llama = cluster.wait_job("llama")
    assert (llama["resources"]["gpus"], llama["source"], llama["state"]) == (16, "kubeflow", "pending")
    mistral = cluster.wait_job("mistral")
    assert mistral["resources"] == {
        "gpus": 16,
        "gpu_type": "h100",
        "gpu_hour_cost": mistral["resources"]["gpu_hour_cost"],
    }
    fake.create_trainjob(trainjob("late", nodes=1, gpus=2))  # seen through the watch
    assert cluster.wait_job("late")["resources"]["gpus"] == 2


def history(cluster: Cluster, name: str, metric: str = "loss", namespace: str = "nlp") -> list[tuple[Any, Any]]:
    response = cluster.client.get(f"/api/v1/namespaces/{namespace}/jobs/{name}/history", params={"metrics": metric})
    assert response.status_code == 200, response.text
    return [(p["step"], p["last"]) for p in response.json()["metrics"].get(metric, [])]


def reporting_pod(cluster: Cluster, name: str, namespace: str = "nlp", account: str = "default") -> str:
    """A running pod of TrainJob ``name`` and its projected token (what the kubelet mounts)."""
    pod = f"{name}-node-0-0"
    cluster.fake.add_pod(namespace, pod, name)
    return cluster.fake.token(namespace, pod, service_account=account)


def test_watches_only_the_selected_namespaces(cluster: Cluster) -> None:
    cluster.fake.create_trainjob(trainjob("other", namespace="vision"))
    cluster.start_runner(namespaces=("nlp",))
    cluster.fake.create_trainjob(trainjob("mine"))
    cluster.wait_job("mine")
    assert cluster.job("other", "vision") is None
    assert all("/namespaces/nlp/" in path for _, path, _ in cluster.fake.calls("GET", "/trainjobs"))


def test_mirrors_the_lifecycle(cluster: Cluster) -> None:
    fake = cluster.fake
    for name in ("done", "broken", "paused"):
        fake.create_trainjob(trainjob(name))
    cluster.start_runner()
    for name in ("done", "broken", "paused"):
        fake.controller_update_status("nlp", name, {"jobsStatus": [{"name": "node", "active": 2}]}, "trainer")
        cluster.wait_job(name, state="running")
    fake.set_condition("nlp", "done", "Complete", message="jobset completed")
    fake.set_condition("nlp", "broken", "Failed", message="pod node-0 OOMKilled")
    fake.merge_patch("nlp", "paused", {"spec": {"suspend": True}}, "kubectl")
    assert cluster.wait_job("done", state="finished")["reason"] == "jobset completed"
    assert cluster.wait_job("broken", state="failed")["reason"] == "pod node-0 OOMKilled"
    cluster.wait_job("paused", state="stopped")
    time.sleep(1.0)  # conditions tell time in whole seconds: a resume is told from the stop a second later
    fake.merge_patch("nlp", "paused", {"spec": {"suspend": False}}, "kubectl")  # resumed: a new attempt
    fake.set_condition("nlp", "paused", "Suspended", status="False")
    cluster.wait_job("paused", attempt=2)
    fake.delete_trainjob("nlp", "paused")
    cluster.wait_job("paused", state="stopped")


def test_mirrors_upstream_trainer_status_and_the_openshift_ai_annotation(cluster: Cluster) -> None:
    """Jobs that report to Kubeflow's own controller (it writes status.trainerStatus) are observed too."""
    fake = cluster.fake
    fake.create_trainjob(trainjob("upstream"))
    fake.create_trainjob(trainjob("rhoai"))
    cluster.start_runner()
    cluster.wait_job("upstream")
    for step, loss, when in ((10, 2.0, "2027-01-01T00:00:10Z"), (20, 1.5, "2027-01-01T00:00:20Z")):
        body = pod_status(step, loss=loss, when=when)["trainerStatus"]
        fake.controller_update_status("nlp", "upstream", {"trainerStatus": body}, "trainer-controller")
        wait_for(lambda step=step: (cluster.job("upstream") or {})["progress"]["step"] == step)
    view = cluster.job("upstream")
    assert view is not None and view["progress"]["percent"] == 20.0 and view["metrics"]["loss"] == 1.5
    assert history(cluster, "upstream") == [(10, 2.0), (20, 1.5)]

    annotation = {
        "progressPercentage": 40,
        "estimatedRemainingSeconds": 600,
        "currentStep": 400,
        "totalSteps": 1000,
        "trainMetrics": {"loss": 0.8},
        "evalMetrics": {"eval_accuracy": 0.7},
        "lastUpdatedTime": "2027-01-01T00:01:00Z",
    }
    fake.merge_patch(
        "nlp", "rhoai", {"metadata": {"annotations": {ANNOTATION: json.dumps(annotation)}}}, "rhoai-trainer"
    )
    view = cluster.wait_job("rhoai")
    view = wait_for(lambda: (v := cluster.job("rhoai")) and v["progress"]["step"] == 400 and v)
    assert view["metrics"] == {"loss": 0.8, "eval_accuracy": 0.7}
    assert view["eta"]["reported_seconds"] == 600
    time.sleep(0.3)  # nothing written back onto jobs someone else reports for
    assert not [c for c in fake.calls("PATCH") if c[2].get("fieldManager") == ["stepwatch"]]
    assert history(cluster, "upstream") == [(10, 2.0), (20, 1.5)]  # looked at again and again, stored once


def _status_writes(cluster: Cluster, name: str) -> list[float]:
    return [
        t for t, method, path in cluster.fake.timed_calls() if method == "PATCH" and path.endswith(f"/{name}/status")
    ]


def test_writes_progress_back_throttled_with_its_own_field_manager(cluster: Cluster) -> None:
    fake = cluster.fake
    fake.create_trainjob(trainjob("llama"))
    runner = cluster.start_runner(config=Config(status_interval_s=0.5))
    token = reporting_pod(cluster, "llama")
    cluster.wait_job("llama")
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < 2.0:  # a report every 0.1 s for 2 s: 20 reports
        step += 1
        assert cluster.post_status("llama", token, pod_status(step, total=100, loss=5.0 / step)).status_code == 200
        time.sleep(0.1)

    def final() -> dict[str, Any] | None:
        obj = fake.trainjobs[("nlp", "llama")]
        status = obj.get("status", {}).get("trainerStatus", {})
        metrics = {m["name"]: m["value"] for m in status.get("metrics", [])}
        note = json.loads(obj["metadata"].get("annotations", {}).get(ANNOTATION, "{}"))
        return obj if metrics.get("current_step") == str(step) and note.get("currentStep") == step else None

    obj = wait_for(final, 5, "the last progress on the TrainJob")  # no status lost: the newest is there
    assert obj["status"]["trainerStatus"]["progressPercentage"] == step
    written = trainer_models.TrainerV1alpha1TrainJob.from_dict(obj)  # what Kubeflow's own models accept
    assert written is not None and written.status is not None and written.status.trainer_status is not None
    assert written.status.trainer_status.progress_percentage == step
    assert {m.name for m in written.status.trainer_status.metrics or []} >= {"current_step", "total_steps", "loss"}
    note = json.loads(obj["metadata"]["annotations"][ANNOTATION])
    assert (note["currentStep"], note["totalSteps"]) == (step, 100)
    assert note["trainMetrics"]["loss"] == pytest.approx(5.0 / step, rel=1e-5)
    managers = {(m["manager"], m["operation"], m.get("subresource", "")) for m in obj["metadata"]["managedFields"]}
    assert ("stepwatch", "Apply", "status") in managers and ("stepwatch", "Apply", "") in managers
    writes = _status_writes(cluster, "llama")
    assert 2 <= len(writes) <= 6  # 20 reports in 2 s, at most one write per 0.5 s
    gaps = [b - a for a, b in itertools.pairwise(writes)]
    assert min(gaps) >= 0.5 - 0.02, gaps
    assert runner.stats["write_errors"] == 0


def test_writes_at_most_the_overall_rate(make_cluster: Any) -> None:
    cluster = make_cluster(k8s_job_rate=100.0, k8s_account_rate=1000.0)
    names = [f"job-{i}" for i in range(15)]
    for name in names:
        cluster.fake.create_trainjob(trainjob(name))
    cluster.start_runner(writes_per_s=10.0)
    for name in names:
        token = reporting_pod(cluster, name)
        assert cluster.post_status(name, token, pod_status(1)).status_code == 200

    def writes() -> list[float]:
        return sorted(t for t, method, path in cluster.fake.timed_calls() if method == "PATCH" and "/job-" in path)

    times = wait_for(lambda: len(writes()) >= 30 and writes(), 10, "status and annotation of every job")
    assert len(times) == 30
    busiest = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert busiest <= 10 + 1, busiest  # the bucket holds one write in reserve


def test_stop_is_a_checkpoint_then_suspend_after_the_grace_period(cluster: Cluster) -> None:
    fake = cluster.fake
    fake.create_trainjob(trainjob("llama"))
    cluster.start_runner(config=Config(grace_s=0.6, status_interval_s=0.2))
    token = reporting_pod(cluster, "llama")
    cluster.wait_job("llama")
    assert cluster.post_status("llama", token, pod_status(10)).status_code == 200
    fake.fail("PATCH", "/trainjobs/llama", 409)  # someone else's write got in first: read again, then suspend
    asked = time.monotonic()
    response = cluster.client.post(
        "/api/v1/namespaces/nlp/jobs/llama/commands", json={"kind": "stop", "reason": "loss plateau"}
    )
    assert response.status_code == 201, response.text
    wait_for(lambda: fake.trainjobs[("nlp", "llama")]["spec"].get("suspend") is True, 5, "spec.suspend")
    assert time.monotonic() - asked >= 0.6  # the grace period to checkpoint and stop by itself
    view = cluster.wait_job("llama", state="stopped")
    assert "loss plateau" in view["reason"]
    events = cluster.client.get("/api/v1/namespaces/nlp/jobs/llama/events", params={"limit": 100}).json()["items"]
    commands = [e["data"]["kind"] for e in events if e["kind"] == "command"]
    assert commands.count("checkpoint") == 1 and commands.count("stop") == 1
    suspends = [c for c in fake.calls("PATCH", "/trainjobs/llama") if not c[1].endswith("/status")]
    assert any(c[2].get("fieldManager") == ["stepwatch"] for c in suspends)


def test_stop_deletes_when_configured_and_at_once_when_nobody_reports(cluster: Cluster) -> None:
    fake = cluster.fake
    fake.create_trainjob(trainjob("silent"))
    cluster.start_runner(config=Config(grace_s=60, delete_on_stop=True))
    cluster.wait_job("silent")
    response = cluster.client.post("/api/v1/namespaces/nlp/jobs/silent/commands", json={"kind": "stop"})
    assert response.status_code == 201, response.text
    wait_for(lambda: ("nlp", "silent") not in fake.trainjobs, 5, "the TrainJob deleted")
    cluster.wait_job("silent", state="stopped")


def test_a_dropped_watch_resumes_with_nothing_missed_or_duplicated(cluster: Cluster) -> None:
    fake = cluster.fake
    for i in range(3):
        fake.create_trainjob(trainjob(f"before-{i}"))
    runner = cluster.start_runner()
    for i in range(3):
        cluster.wait_job(f"before-{i}")
    lists = len([c for c in fake.calls("GET", "/trainjobs") if "watch" not in c[2]])
    fake.fail("GET", "/trainjobs", 500)  # the reconnect fails once too (backoff)
    fake.drop_watches()
    for i in range(3):
        fake.create_trainjob(trainjob(f"during-{i}"))
    fake.controller_update_status("nlp", "before-0", {"jobsStatus": [{"name": "node", "active": 1}]}, "trainer")
    for i in range(3):
        cluster.wait_job(f"during-{i}")
    cluster.wait_job("before-0", state="running")
    watches = [c for c in fake.calls("GET", "/trainjobs") if "watch" in c[2]]
    assert len([c for c in fake.calls("GET", "/trainjobs") if "watch" not in c[2]]) == lists  # resumed, not relisted
    assert watches[-1][2]["resourceVersion"] != ["0"]
    jobs = cluster.client.get("/api/v1/jobs", params={"limit": 100}).json()["items"]
    assert sorted((j["name"], j["attempt"]) for j in jobs) == sorted(
        [(f"before-{i}", 1) for i in range(3)] + [(f"during-{i}", 1) for i in range(3)]
    )
    assert runner.stats["lists"] == 1


def test_410_gone_lists_again_and_sees_what_the_watch_missed(cluster: Cluster) -> None:
    fake = cluster.fake
    fake.create_trainjob(trainjob("old"))
    runner = cluster.start_runner()
    cluster.wait_job("old")
    fake.fail("GET", "/trainjobs", 500)  # the watch is away for a while...
    fake.drop_watches()
    fake.create_trainjob(trainjob("new"))
    fake.delete_trainjob("nlp", "old")
    fake.compact()  # ...and its resourceVersion is gone from the history: 410 Expired
    cluster.wait_job("new")
    cluster.wait_job("old", state="stopped")
    wait_for(lambda: runner.stats["lists"] == 2, 5, "a second list")
    jobs = cluster.client.get("/api/v1/jobs", params={"limit": 100}).json()["items"]
    assert sorted((j["name"], j["attempt"]) for j in jobs) == [("new", 1), ("old", 1)]


def test_api_errors_are_retried_and_no_status_is_lost(cluster: Cluster) -> None:
    fake = cluster.fake
    fake.create_trainjob(trainjob("llama"))
    fake.fail("GET", "/trainjobs", 410)  # the first list: 410 (a continue token expired): list again
    runner = cluster.start_runner(config=Config(status_interval_s=0.1))
    token = reporting_pod(cluster, "llama")
    cluster.wait_job("llama")
    fake.fail("PATCH", "/llama/status", 500, times=2)
    fake.fail("PATCH", "/trainjobs/llama", 409)
    for step in (1, 2, 3):
        assert cluster.post_status("llama", token, pod_status(step)).status_code == 200

    def written() -> bool:
        obj = fake.trainjobs[("nlp", "llama")]
        note = json.loads(obj["metadata"].get("annotations", {}).get(ANNOTATION, "{}"))
        return (
            obj.get("status", {}).get("trainerStatus", {}).get("progressPercentage") == 3
            and note.get("currentStep") == 3
        )

    wait_for(written, 10, "the newest status on the TrainJob despite the errors")
    assert runner.stats["write_errors"] >= 3
