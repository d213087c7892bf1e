"""``reconcile(observed) -> actions``, as tables: the TrainJob runner's decisions with no I/O at all."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest

from stepwatch.protocol import format_rfc3339
from stepwatch.server.runners.kubernetes.objects import (
    ANNOTATION,
    RuntimeSize,
    TrainJob,
    annotation_for,
    parse_trainjob,
    runtime_size,
    trainer_status_for,
)
from stepwatch.server.runners.kubernetes.progression import status_from_annotation
from stepwatch.server.runners.kubernetes.reconcile import (
    Config,
    Delete,
    FetchRuntime,
    Mirror,
    Observed,
    QueueCommand,
    Register,
    Requeue,
    SetState,
    StopRequest,
    Suspend,
    WriteStatus,
    fingerprint,
    reconcile,
)
from stepwatch.server.store import Job

NOW = 1_800_000_000.0


def tj(**over: Any) -> TrainJob:
    base = TrainJob(
        namespace="nlp",
        name="llama",
        uid="u1",
        resource_version="10",
        created_at=NOW - 3600,
        phase="running",
        live_since=NOW - 3600,
        runtime_name="torch-distributed",
        nodes=2,
        gpus_per_node=8.0,
    )
    return replace(base, **over)


def job(**over: Any) -> Job:
    base = Job(
        id=1,
        namespace="nlp",
        name="llama",
        attempt=1,
        state="running",
        created_at=NOW - 3500,
        updated_at=NOW - 10,
        started_at=NOW - 3400,
        last_report_at=NOW - 10,
        step=500,
        total_steps=1000,
        last_metrics={"loss": 0.5},
        gpus=16,
    )
    return replace(base, **over)


STOP = StopRequest(at=NOW - 60, reason="plateau", checkpoint_at=NOW - 60)
UPSTREAM_STATUS = {
    "progressPercentage": 40,
    "metrics": [{"name": "loss", "value": "0.7"}],
    "lastUpdatedTime": format_rfc3339(NOW - 5),
}
ANNOT = json.dumps(
    {"progressPercentage": 41, "currentStep": 410, "totalSteps": 1000, "lastUpdatedTime": format_rfc3339(NOW - 3)}
)


def kinds(actions: list[Any]) -> list[str]:
    return [a.kind for a in actions]


CASES: list[tuple[str, Observed, list[str]]] = [
    # -------------------------------------------------------------- registration
    ("new TrainJob is registered with nodes x GPUs", Observed(NOW, tj(), None), ["register"]),
    (
        "size from the runtime: read it first",
        Observed(NOW, tj(nodes=None, gpus_per_node=None), None),
        ["fetch_runtime"],
    ),
    (
        "size from the runtime once read",
        Observed(NOW, tj(nodes=None, gpus_per_node=None), None, size=RuntimeSize(4, 8.0, "h100")),
        ["register"],
    ),
    (
        "no runtime named: no fetch",
        Observed(NOW, tj(nodes=None, gpus_per_node=None, runtime_name=""), None),
        ["register"],
    ),
    (
        "resumed after its attempt ended: a new attempt",
        Observed(NOW, tj(live_since=NOW - 30), job(state="stopped", finished_at=NOW - 100)),
        ["register"],
    ),
    (
        "ended attempt, TrainJob live since before it ended: no new attempt",
        Observed(NOW, tj(live_since=NOW - 3600), job(state="stopped", finished_at=NOW - 100)),
        ["write_status"],  # its last progress still goes onto the TrainJob
    ),
    (
        "a finished TrainJob first seen is still registered (history)",
        Observed(NOW, tj(phase="finished"), None),
        ["register"],
    ),
    # -------------------------------------------------------------- lifecycle
    (
        "running pods move a pending job to running",
        Observed(NOW, tj(), job(state="pending", last_report_at=None)),
        ["set_state"],
    ),
    (
        "pending TrainJob, pending job: nothing",
        Observed(NOW, tj(phase="pending"), job(state="pending", last_report_at=None)),
        [],
    ),
    ("complete: finished", Observed(NOW, tj(phase="finished", reason="done"), job(last_report_at=None)), ["set_state"]),
    ("failed: failed", Observed(NOW, tj(phase="failed", reason="OOM"), job(last_report_at=None)), ["set_state"]),
    ("suspended: stopped", Observed(NOW, tj(phase="suspended", suspend=True), job(last_report_at=None)), ["set_state"]),
    ("deleted: stopped", Observed(NOW, None, job()), ["set_state"]),
    ("being deleted: stopped", Observed(NOW, tj(deleting=True), job()), ["set_state"]),
    ("deleted, job ended: nothing", Observed(NOW, None, job(state="finished")), []),
    ("deleted, never seen: nothing", Observed(NOW, None, None), []),
    # -------------------------------------------------------------- mirror of foreign progress
    (
        "upstream trainerStatus newer than stepwatch's: mirrored",
        Observed(
            NOW, tj(trainer_status=UPSTREAM_STATUS, status_owners=frozenset({"trainer"})), job(last_report_at=NOW - 60)
        ),
        ["mirror"],
    ),
    (
        "upstream trainerStatus already stored (older than the last report): not again",
        Observed(
            NOW, tj(trainer_status=UPSTREAM_STATUS, status_owners=frozenset({"trainer"})), job(last_report_at=NOW - 1)
        ),
        [],
    ),
    (
        "OpenShift AI annotation written by its controller: mirrored",
        Observed(
            NOW, tj(annotations={ANNOTATION: ANNOT}, annotation_owners=frozenset({"rhoai"})), job(last_report_at=None)
        ),
        ["mirror"],
    ),
    (
        "invalid upstream status: ignored",
        Observed(
            NOW,
            tj(trainer_status={"progressPercentage": 400}, status_owners=frozenset({"trainer"})),
            job(last_report_at=None),
        ),
        [],
    ),
    # -------------------------------------------------------------- write-back for jobs that report
    ("reporting job, nothing written yet: write", Observed(NOW, tj(), job()), ["write_status"]),
    (
        "reporting job, wrote 2 s ago something else: wait out the 5 s",
        Observed(NOW, tj(), job(), last_write_at=NOW - 2, written="old"),
        ["requeue"],
    ),
    (
        "reporting job, wrote 6 s ago something else: write",
        Observed(NOW, tj(), job(), last_write_at=NOW - 6, written="old"),
        ["write_status"],
    ),
    (
        "status on the object already stepwatch's: nothing",
        Observed(
            NOW,
            tj(
                trainer_status=trainer_status_for(job()),
                annotations={ANNOTATION: annotation_for(job())},
                status_owners=frozenset({"stepwatch"}),
                annotation_owners=frozenset({"stepwatch"}),
            ),
            job(),
        ),
        [],
    ),
    (
        "our own status on the object is not mirrored back",
        Observed(NOW, tj(trainer_status=UPSTREAM_STATUS, status_owners=frozenset({"stepwatch"})), job()),
        ["write_status"],
    ),
    ("job without reports: nothing to write", Observed(NOW, tj(), job(last_report_at=None)), []),
    # -------------------------------------------------------------- stop
    (
        "stop, reporting, within the grace period: wait",
        Observed(NOW, tj(), job(), stop=StopRequest(NOW - 10, "plateau", NOW - 10), written=None, last_write_at=NOW),
        ["requeue", "requeue"],
    ),
    (
        "stop, reporting, no checkpoint yet: ask for one, then wait",
        Observed(NOW, tj(), job(), stop=StopRequest(NOW - 10, "plateau"), last_write_at=NOW),
        ["requeue", "queue_command", "requeue"],
    ),
    (
        "stop, reporting, grace over: suspend",
        Observed(NOW, tj(), job(), stop=replace(STOP, at=NOW - 301)),
        ["write_status", "suspend"],
    ),
    (
        "stop, grace over, delete configured: delete",
        Observed(NOW, tj(), job(), stop=replace(STOP, at=NOW - 301), config=Config(delete_on_stop=True)),
        ["write_status", "delete"],
    ),
    ("stop, not reporting: suspend at once", Observed(NOW, tj(), job(last_report_at=None), stop=STOP), ["suspend"]),
    (
        "stop, upstream-reporting (no stepwatch commands reach it): suspend at once",
        Observed(
            NOW,
            tj(trainer_status=UPSTREAM_STATUS, status_owners=frozenset({"trainer"})),
            job(last_report_at=NOW - 1),
            stop=STOP,
        ),
        ["suspend"],
    ),
    (
        "stop, TrainJob suspended: the job is stopped, nothing more",
        Observed(NOW, tj(phase="suspended", suspend=True), job(last_report_at=None), stop=STOP),
        ["set_state"],
    ),
    (
        "stop, TrainJob completed as it stopped: stopped, not finished",
        Observed(NOW, tj(phase="finished"), job(last_report_at=None), stop=STOP),
        ["set_state"],
    ),
]


@pytest.mark.parametrize(("observed", "expected"), [(o, e) for _, o, e in CASES], ids=[c[0] for c in CASES])
def test_reconcile_table(observed: Observed, expected: list[str]) -> None:
    assert kinds(reconcile(observed)) == expected


def test_register_carries_nodes_times_gpus_and_type() -> None:
    [action] = reconcile(Observed(NOW, tj(gpu_type="a100"), None))
    assert action == Register("nlp", "llama", 16.0, "a100")
    [action] = reconcile(Observed(NOW, tj(nodes=None, gpus_per_node=None), None, size=RuntimeSize(4, 8.0, "h100")))
    assert action == Register("nlp", "llama", 32.0, "h100")
    [action] = reconcile(Observed(NOW, tj(nodes=3, gpus_per_node=None), None, size=RuntimeSize(4, 2.0)))
    assert action == Register("nlp", "llama", 6.0, "")
    [action] = reconcile(Observed(NOW, tj(nodes=None, gpus_per_node=None), None, size=RuntimeSize()))
    assert action == Register("nlp", "llama", 0.0, "")  # a runtime that could not be read: no GPUs, no cost
    [action] = reconcile(Observed(NOW, tj(nodes=None, gpus_per_node=None, runtime_kind="TrainingRuntime"), None))
    assert action == FetchRuntime("TrainingRuntime", "torch-distributed", "nlp")


def test_states_and_reasons() -> None:
    assert reconcile(Observed(NOW, tj(phase="failed", reason="OOMKilled"), job()))[0] == SetState("failed", "OOMKilled")
    assert reconcile(Observed(NOW, tj(phase="finished"), job(last_report_at=None), stop=STOP))[0] == SetState(
        "stopped", "plateau"
    )
    assert reconcile(Observed(NOW, None, job(), stop=STOP)) == [SetState("stopped", "plateau")]


def test_stop_actions_carry_preconditions_and_deadline() -> None:
    actions = reconcile(Observed(NOW, tj(), job(), stop=StopRequest(NOW - 10, "plateau"), last_write_at=NOW))
    assert QueueCommand("checkpoint", "before the stop: plateau") in actions
    assert Requeue(NOW - 10 + 300) in actions
    actions = reconcile(Observed(NOW, tj(resource_version="77"), job(last_report_at=None), stop=STOP))
    assert actions == [Suspend("77", "stop requested: plateau; suspended by stepwatch")]
    actions = reconcile(
        Observed(NOW, tj(uid="abc"), job(last_report_at=None), stop=STOP, config=Config(delete_on_stop=True))
    )
    assert actions == [Delete("abc", "stop requested: plateau; deleted by stepwatch")]
    actions = reconcile(
        Observed(NOW, tj(), job(), stop=StopRequest(NOW - 10), config=Config(grace_s=5), last_write_at=NOW)
    )
    assert actions[-1] == Suspend("10", "stop requested; suspended by stepwatch")


def test_write_status_is_what_kubeflow_and_openshift_ai_read() -> None:
    the_job = job(
        epoch=1.5,
        total_epochs=3.0,
        last_metrics={"loss": 0.25, "eval_loss": float("nan")},
        eta_seconds=100.0,
        eta_at=NOW - 10,
    )
    [action] = reconcile(Observed(NOW, tj(), the_job))
    assert isinstance(action, WriteStatus)
    status = action.trainer_status
    assert status["progressPercentage"] == 50
    assert status["estimatedRemainingSeconds"] == 100  # as of the newest report: unchanged until the next one
    names = {m["name"]: m["value"] for m in status["metrics"]}
    assert names == {
        "current_step": "500",
        "total_steps": "1000",
        "current_epoch": "1.5",
        "total_epochs": "3",
        "loss": "0.25",
        "eval_loss": "NaN",
    }
    assert status["lastUpdatedTime"] == format_rfc3339(NOW - 10)
    annotation = json.loads(action.annotation)
    assert annotation["currentStep"] == 500 and annotation["totalSteps"] == 1000
    assert annotation["trainMetrics"] == {"loss": 0.25}
    assert annotation["evalMetrics"] == {"eval_loss": "NaN"}
    assert annotation["estimatedRemainingTimeSummary"] == "1 minute"  # Red Hat's formatDurationSummary
    keys = list(annotation)
    assert (keys[0], keys[-1]) == ("progressPercentage", "lastUpdatedTime")  # in the order of Go's struct
    # the same job later: the same status (the ETA does not tick in it), so nothing to write
    again = reconcile(Observed(NOW + 60, tj(), the_job, last_write_at=NOW, written=action.fingerprint))
    assert again == []


def test_mirror_stores_status_and_annotation_both_in_the_order_of_their_times() -> None:
    """Both written for one run (KubeflowCallback's posts, Red Hat's polls): each is a point, oldest first."""
    both = tj(
        trainer_status=UPSTREAM_STATUS,
        status_owners=frozenset({"trainer"}),
        annotations={ANNOTATION: ANNOT},
        annotation_owners=frozenset({"rhoai"}),
    )
    first, second = reconcile(Observed(NOW, both, job(last_report_at=None)))
    assert isinstance(first, Mirror) and first.origin == "trainerStatus" and first.at == NOW - 5
    assert isinstance(second, Mirror) and second.origin == "annotation" and second.at == NOW - 3
    assert second.status.progress_percentage == 41
    assert {m.name: m.value for m in second.status.metrics}["current_step"] == "410"
    stored = job(last_report_at=NOW - 3, trainer_status=second.status.to_body()["trainerStatus"])
    assert reconcile(Observed(NOW, both, stored, mirrored=second.fingerprint)) == []
    assert reconcile(Observed(NOW, both, stored)) == []  # after a restart: older, or as old and the same


def test_parse_trainjob_reads_conditions_size_and_owners() -> None:
    obj = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "llama",
            "namespace": "nlp",
            "uid": "u1",
            "resourceVersion": "42",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"stepwatch.io/gpu-type": "H100"},
            "annotations": {ANNOTATION: ANNOT},
            "managedFields": [
                {"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {"f:suspend": {}}}},
                {
                    "manager": "trainer",
                    "operation": "Update",
                    "subresource": "status",
                    "fieldsV1": {"f:status": {"f:trainerStatus": {"f:progressPercentage": {}}}},
                },
            ],
        },
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}},
        },
        "status": {
            "conditions": [
                {
                    "type": "Suspended",
                    "status": "False",
                    "reason": "Resumed",
                    "lastTransitionTime": "2026-01-01T01:00:00Z",
                }
            ],
            "jobsStatus": [{"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0, "suspended": 0}],
            "trainerStatus": UPSTREAM_STATUS,
        },
    }
    parsed = parse_trainjob(obj)
    assert parsed.phase == "running" and parsed.live
    assert (parsed.nodes, parsed.gpus_per_node, parsed.gpu_type) == (2, 8.0, "h100")
    assert parsed.status_owners == {"trainer"} and parsed.annotation_owners == frozenset()
    assert parsed.live_since == parsed.created_at + 3600
    assert parsed.runtime_kind == "ClusterTrainingRuntime"
    obj["status"]["conditions"].append({"type": "Failed", "status": "True", "message": "node lost"})
    assert (parse_trainjob(obj).phase, parse_trainjob(obj).reason) == ("failed", "node lost")
    assert parse_trainjob({"metadata": {}, "spec": {"suspend": True}}).phase == "suspended"
    assert parse_trainjob({}).phase == "pending"


def test_runtime_size_reads_ml_policy_and_the_trainer_container() -> None:
    runtime = {
        "metadata": {"name": "torch-distributed"},
        "spec": {
            "mlPolicy": {"numNodes": 4, "torch": {"numProcPerNode": "auto"}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "dataset-initializer",
                            "template": {"spec": {"template": {"spec": {"containers": [{"name": "x"}]}}}},
                        },
                        {
                            "name": "node",
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                                            "containers": [
                                                {"name": "node", "resources": {"limits": {"nvidia.com/gpu": 4}}}
                                            ],
                                        }
                                    }
                                }
                            },
                        },
                    ]
                }
            },
        },
    }
    assert runtime_size(runtime) == RuntimeSize(4, 4.0, "a100")
    assert runtime_size({}) == RuntimeSize()


def test_annotation_round_trip() -> None:
    the_job = job(epoch=1.0, total_epochs=2.0, last_metrics={"loss": 0.5, "eval_acc": 0.9})
    status = status_from_annotation(annotation_for(the_job))
    assert status is not None
    values = {m.name: m.value for m in status.metrics}
    assert values["current_step"] == "500" and values["loss"] == "0.5" and values["eval_acc"] == "0.9"
    assert status_from_annotation("not json") is None
    assert status_from_annotation("[1]") is None


def test_fingerprint_is_stable() -> None:
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


def test_reconciling_a_thousand_jobs_costs_well_under_a_second_of_cpu() -> None:
    """Target of issue 8: 1,000 TrainJobs reconciled in < 1 s of CPU (each case builds its status)."""
    observed = [
        Observed(NOW, tj(name=f"job-{i}"), job(name=f"job-{i}", step=i, last_metrics={"loss": 1 / (i + 1), "lr": 1e-4}))
        for i in range(1000)
    ]
    start = time.process_time()
    for o in observed:
        reconcile(o)
    assert time.process_time() - start < 1.0


def test_each_change_of_a_foreign_status_is_a_mirror_in_order_at_its_own_time() -> None:
    changes = tuple(
        {"progressPercentage": p, "lastUpdatedTime": format_rfc3339(NOW - 30 + 10 * i)} for i, p in enumerate((5, 6, 7))
    )
    observed = tj(trainer_status=changes[-1], status_owners=frozenset({"trainer-status"}))
    actions = reconcile(Observed(NOW, observed, job(last_report_at=None), changes=changes))
    assert [(a.status.progress_percentage, a.at) for a in actions if isinstance(a, Mirror)] == [
        (5, NOW - 30),
        (6, NOW - 20),
        (7, NOW - 10),
    ]
    # seen again after a restart (the job's last report is the last one's, at its time): nothing twice
    stored = job(last_report_at=NOW - 10, trainer_status=changes[-1])
    assert reconcile(Observed(NOW, observed, stored, changes=changes)) == []
    # times are whole seconds: another status in the same second as the last stored is a change, stored
    same_second = {"progressPercentage": 8, "lastUpdatedTime": format_rfc3339(NOW - 10)}
    [action] = reconcile(Observed(NOW, replace(observed, trainer_status=same_second), stored))
    assert isinstance(action, Mirror) and action.status.progress_percentage == 8 and action.at == NOW - 10
    # a pod clock ahead of the runner's: stored now, not in the future
    ahead = {"progressPercentage": 8, "lastUpdatedTime": format_rfc3339(NOW + 60)}
    [action] = reconcile(
        Observed(NOW, tj(trainer_status=ahead, status_owners=frozenset({"x"})), job(last_report_at=None))
    )
    assert isinstance(action, Mirror) and action.at == NOW


def test_observer_mode_never_writes_the_status_back() -> None:
    reporting = job(last_report_at=NOW - 1, step=5, total_steps=10)
    assert kinds(reconcile(Observed(NOW, tj(), reporting))) == ["write_status"]
    assert reconcile(Observed(NOW, tj(), reporting, config=Config(mode="observer"))) == []
