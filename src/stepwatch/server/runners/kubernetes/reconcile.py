"""The TrainJob runner's decisions: ``reconcile(observed) -> actions``. Pure: no I/O, no clock, no state.

What one TrainJob and its stepwatch job look like right now goes in (:class:`Observed`); what should be
done about it comes out, as plain values the I/O layer carries out (:mod:`.runner`):

- a TrainJob stepwatch has no live job for gets one (:class:`Register`): when it appears, and again
  when it is resumed or recreated after its last attempt ended (a new attempt);
- its lifecycle is mirrored (:class:`SetState`): running, finished, failed; suspended or deleted is
  ``stopped``;
- progress someone else writes (Kubeflow's ``status.trainerStatus``, OpenShift AI's annotation
  ``trainer.opendatahub.io/trainerStatus``) is mirrored into history (:class:`Mirror`): each change of
  either that the watch saw, in the order of their times, once (a relist or a restart does not store it
  again), in every mode;
- a job that reports to stepwatch gets stepwatch's progress written onto the TrainJob
  (:class:`WriteStatus`), at most once per ``status_interval_s`` and only when it changed; never in
  ``observer`` mode (``Config.mode``), where upstream's status server owns ``status.trainerStatus``;
- a stop: a job that reports gets a checkpoint command (:class:`QueueCommand`) and the grace period
  to stop by itself, then ``spec.suspend: true`` (:class:`Suspend`) or, when configured, deletion
  (:class:`Delete`); a job that does not report cannot be asked, so it is suspended at once;
- in ``poll`` mode, a TrainJob annotated for OpenShift AI's progression tracking is polled as Red Hat's
  controller polls it (:class:`~.progression.Poll`, the rules in :mod:`.progression`), unless that
  controller writes its annotation; with ``network_policy`` on, its pods get Red Hat's NetworkPolicy
  (:class:`EnsureNetworkPolicy`, built by :mod:`.networkpolicy`);
- :class:`Requeue` says when to look again if nothing changes before (a grace period or a throttled
  write ends); :class:`FetchRuntime` asks for the runtime when the job's size depends on it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ....protocol import ENDED_STATES, TrainerStatus, parse_rfc3339
from ...store import Job
from .networkpolicy import RUNNER_NAMESPACE, network_policy
from .objects import (
    FIELD_MANAGER,
    RuntimeSize,
    TrainJob,
    annotation_for,
    trainer_status_for,
    upstream_status,
)
from .progression import Poll, PollState, next_poll, status_from_annotation, tracking_enabled

__all__ = [
    "Action",
    "Config",
    "Delete",
    "EnsureNetworkPolicy",
    "FetchRuntime",
    "Mirror",
    "Mode",
    "Observed",
    "QueueCommand",
    "Register",
    "Requeue",
    "SetState",
    "StopRequest",
    "Suspend",
    "WriteStatus",
    "fingerprint",
    "reconcile",
    "stored_already",
]


Mode = Literal["endpoint", "observer", "poll"]
"""How the runner meets the pods' progress (``STEPWATCH_K8S_MODE``; see :class:`Config`)."""


@dataclass(frozen=True)
class Config:
    """The runner's knobs that decisions depend on."""

    grace_s: float = 300.0
    """How long a job that reports has, after a stop, to checkpoint and stop by itself."""
    delete_on_stop: bool = False
    """Delete the TrainJob instead of suspending it."""
    status_interval_s: float = 5.0
    """At most one status write per job in this many seconds."""
    field_manager: str = FIELD_MANAGER
    mode: Mode = "endpoint"
    """``endpoint``: pods post to stepwatch, which writes ``status.trainerStatus``; ``observer``: pods post to
    upstream's status server, stepwatch only reads ``status.trainerStatus`` (and never writes it); ``poll``:
    as observer, and stepwatch polls the pods of TrainJobs annotated for OpenShift AI's progression tracking
    as Red Hat's controller does, writing its annotation (for clusters without that controller)."""
    network_policy: bool = False
    """In ``poll`` mode, give each tracked TrainJob's pods Red Hat's NetworkPolicy (same-job pods, and the
    runner to the metrics port); off by default: it changes the pods' network posture (docs/kubernetes.md)."""
    runner_namespace: str = RUNNER_NAMESPACE
    """The namespace the runner's pods run in (the NetworkPolicy admits them from there)."""


@dataclass(frozen=True)
class StopRequest:
    """A stop asked of the job's current attempt (``stepwatch stop``, a policy), and its checkpoint."""

    at: float
    reason: str = ""
    checkpoint_at: float | None = None
    """When a checkpoint command was queued with it (``None``: none yet)."""


@dataclass(frozen=True)
class Observed:
    """Everything a decision about one TrainJob needs."""

    now: float
    trainjob: TrainJob | None
    """``None``: the TrainJob is gone."""
    job: Job | None
    """stepwatch's latest attempt for it (``None``: none)."""
    config: Config = Config()
    size: RuntimeSize | None = None
    """What its runtime says of its size (``None``: not read yet)."""
    stop: StopRequest | None = None
    last_write_at: float | None = None
    """When the runner last wrote this job's progress onto the TrainJob."""
    written: str | None = None
    """The :func:`fingerprint` of what it wrote then."""
    mirrored: str | None = None
    """The fingerprint of the foreign progress it mirrored last."""
    changes: tuple[Mapping[str, Any], ...] = ()
    """Each ``status.trainerStatus`` another manager wrote that the watch showed since the last mirror,
    oldest first (the object's current one last); empty: only the object's current one counts."""
    annotation_changes: tuple[str, ...] = ()
    """Likewise each OpenShift AI annotation another manager wrote; empty: only the object's current one."""
    poll: PollState = field(default_factory=PollState)
    """Where polling this TrainJob stands (``poll`` mode)."""
    network_policy: str | None = None
    """The :func:`fingerprint` of the NetworkPolicy last made sure of for it (``poll`` mode)."""


@dataclass(frozen=True)
class Register:
    """Create the stepwatch job (or its next attempt) for the TrainJob."""

    namespace: str
    name: str
    gpus: float
    gpu_type: str
    kind: Literal["register"] = "register"


@dataclass(frozen=True)
class SetState:
    """Move the stepwatch job to a state."""

    state: Literal["running", "finished", "failed", "stopped"]
    reason: str
    kind: Literal["set_state"] = "set_state"


@dataclass(frozen=True)
class Mirror:
    """Store progress another writer put on the TrainJob as the job's progress and history."""

    status: TrainerStatus
    origin: Literal["trainerStatus", "annotation"]
    fingerprint: str
    at: float
    """The time it is stored at: its ``lastUpdatedTime`` (when the pod was at that step, however late the
    runner reads it; never later than now), else now."""
    kind: Literal["mirror"] = "mirror"


@dataclass(frozen=True)
class WriteStatus:
    """Write ``status.trainerStatus`` and the OpenShift AI annotation (server-side apply, own manager)."""

    trainer_status: dict[str, Any]
    annotation: str
    fingerprint: str
    kind: Literal["write_status"] = "write_status"


@dataclass(frozen=True)
class QueueCommand:
    """Queue a command for the job's reporter."""

    command: Literal["checkpoint", "stop"]
    reason: str
    kind: Literal["queue_command"] = "queue_command"


@dataclass(frozen=True)
class Suspend:
    """``spec.suspend: true``, if the TrainJob is still at ``resource_version`` (else look again)."""

    resource_version: str
    reason: str
    kind: Literal["suspend"] = "suspend"


@dataclass(frozen=True)
class Delete:
    """Delete the TrainJob, if it is still the one with ``uid``."""

    uid: str
    reason: str
    kind: Literal["delete"] = "delete"


@dataclass(frozen=True)
class FetchRuntime:
    """Read the TrainJob's runtime (its size), then decide again."""

    runtime_kind: str
    name: str
    namespace: str
    kind: Literal["fetch_runtime"] = "fetch_runtime"


@dataclass(frozen=True)
class EnsureNetworkPolicy:
    """Create the TrainJob's NetworkPolicy, or replace its spec and labels (Red Hat's ``ReconcileNetworkPolicy``)."""

    policy: dict[str, Any]
    fingerprint: str
    kind: Literal["ensure_network_policy"] = "ensure_network_policy"


@dataclass(frozen=True)
class Requeue:
    """Decide again at ``at`` if nothing changes before."""

    at: float
    kind: Literal["requeue"] = "requeue"


Action = (
    Register
    | SetState
    | Mirror
    | WriteStatus
    | QueueCommand
    | Suspend
    | Delete
    | FetchRuntime
    | Poll
    | EnsureNetworkPolicy
    | Requeue
)


def fingerprint(*parts: Any) -> str:
    """A short stable digest of JSON-able values (what was written or mirrored)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def reconcile(o: Observed) -> list[Action]:
    """What to do about one TrainJob (see the module docstring)."""
    tj, job = o.trainjob, o.job
    if tj is None or tj.deleting:
        if job is not None and job.state not in ENDED_STATES:
            reason = o.stop.reason if o.stop and o.stop.reason else "the TrainJob was deleted"
            return [SetState("stopped", reason)]
        return []
    needs_runtime = (tj.nodes is None or tj.gpus_per_node is None) and tj.runtime_name
    if job is None or (job.state in ENDED_STATES and tj.live and tj.live_since > (job.finished_at or 0.0)):
        if needs_runtime and o.size is None:
            return [FetchRuntime(tj.runtime_kind, tj.runtime_name, tj.namespace)]
        size = o.size or RuntimeSize()
        nodes = tj.nodes or size.nodes or 1
        per_node = tj.gpus_per_node if tj.gpus_per_node is not None else (size.gpus_per_node or 0.0)
        return [Register(tj.namespace, tj.name, nodes * per_node, tj.gpu_type or size.gpu_type)]
    actions: list[Action] = []
    actions += _lifecycle(o, tj, job)
    foreign = tj.foreign_progress(o.config.field_manager)
    reporting = job.last_report_at is not None and not foreign and o.config.mode == "endpoint"
    if foreign:
        actions += _mirror(o, tj, job)
    elif reporting:
        actions += _write_back(o, tj, job)
    if o.config.mode == "poll":
        actions += _poll(o, tj)
    if o.stop is not None:
        actions += _stop(o, o.stop, tj, job, reporting)
    return actions


def _lifecycle(o: Observed, tj: TrainJob, job: Job) -> list[Action]:
    if job.state in ENDED_STATES:
        return []
    if tj.phase == "finished":
        if o.stop is not None:
            return [SetState("stopped", o.stop.reason or "stopped")]
        return [SetState("finished", tj.reason)]
    if tj.phase == "failed":
        return [SetState("failed", tj.reason)]
    if tj.phase == "suspended":
        return [SetState("stopped", (o.stop.reason if o.stop and o.stop.reason else tj.reason))]
    if tj.phase == "running" and job.state == "pending":
        return [SetState("running", "the TrainJob's pods are running")]
    return []


Origin = Literal["trainerStatus", "annotation"]


def _foreign(o: Observed, tj: TrainJob) -> list[tuple[TrainerStatus, Origin]]:
    """The foreign progress to consider, in the order of its times (the order it was seen for equal times):
    each ``status.trainerStatus`` and each OpenShift AI annotation another manager wrote that the watch
    showed. Both describe the same run when both are written (transformers' KubeflowCallback posting to
    upstream's status server, Red Hat's controller polling the pod): each change is a point of it."""
    manager = o.config.field_manager
    found: list[tuple[TrainerStatus, Origin]] = []
    if tj.status_owners - {manager}:
        for raw in o.changes or ((tj.trainer_status,) if tj.trainer_status else ()):
            status = upstream_status(raw)
            if status is not None:
                found.append((status, "trainerStatus"))
    if tj.annotation_owners - {manager}:
        for text in o.annotation_changes or ((tj.annotation,) if tj.annotation else ()):
            from_annotation = status_from_annotation(text)
            if from_annotation is not None:
                found.append((from_annotation, "annotation"))
    return sorted(found, key=lambda item: _when(item[0]))  # (stable: ties keep the order seen)


def _when(status: TrainerStatus) -> float:
    if status.last_updated_time is None:
        return float("-inf")
    return parse_rfc3339(status.last_updated_time)


def _mirror(o: Observed, tj: TrainJob, job: Job) -> list[Action]:
    """A :class:`Mirror` for each foreign status not stored yet: not the one mirrored last, none twice (by
    content, ``lastUpdatedTime`` included), and none the job has (:func:`stored_already`)."""
    actions: list[Action] = []
    marks = {o.mirrored}
    for status, origin in _foreign(o, tj):
        body = status.to_body()["trainerStatus"]
        mark = fingerprint(body)
        if mark in marks:
            continue
        marks.add(mark)
        if stored_already(job, status):
            continue
        when = _when(status)
        at = o.now if when == float("-inf") else min(when, o.now)
        actions.append(Mirror(status, origin, mark, at))
        job = replace(job, trainer_status=body, last_report_at=at)  # as the store will have it
    return actions


def stored_already(job: Job, status: TrainerStatus) -> bool:
    """Whether the job has this status already: it is older than the job's last report, or as old (or
    without a time) and the same as the one stored last. A mirrored status is stored at its own
    ``lastUpdatedTime``, so after a restart or a relist the two compare like with like; times are whole
    seconds, so two different statuses within one second are both stored."""
    when = _when(status)
    same = status.to_body()["trainerStatus"] == job.trainer_status
    if when == float("-inf") or job.last_report_at is None:
        return same and when == float("-inf")
    return when < job.last_report_at or (when == job.last_report_at and same)


def _poll(o: Observed, tj: TrainJob) -> list[Action]:
    """``poll`` mode: the controller's polling of the TrainJob (:func:`.progression.next_poll`), and its
    NetworkPolicy when that is switched on."""
    actions: list[Action] = []
    foreign = bool(tj.annotation_owners - {o.config.field_manager})
    due = next_poll(o.now, tj.annotations, tj.phase, foreign, o.poll)
    if isinstance(due, Poll):
        actions.append(due)
    elif due is not None:
        actions.append(Requeue(due))
    if o.config.network_policy and tj.live and not foreign and tracking_enabled(tj.annotations):
        policy = network_policy(tj, o.config.runner_namespace)
        mark = fingerprint(policy)
        if mark != o.network_policy:
            actions.append(EnsureNetworkPolicy(policy, mark))
    return actions


def _write_back(o: Observed, tj: TrainJob, job: Job) -> list[Action]:
    status = trainer_status_for(job)
    annotation = annotation_for(job)
    if tj.trainer_status == status and tj.annotation == annotation:
        return []  # on the object already
    mark = fingerprint(status, annotation)
    if mark == o.written:
        return []
    due = o.last_write_at is None or o.now >= o.last_write_at + o.config.status_interval_s
    if not due:
        assert o.last_write_at is not None
        return [Requeue(o.last_write_at + o.config.status_interval_s)]
    return [WriteStatus(status, annotation, mark)]


def _stop(o: Observed, stop: StopRequest, tj: TrainJob, job: Job, reporting: bool) -> list[Action]:
    if not tj.live:
        return []  # suspended, ended or being deleted already
    end: Action = (
        Delete(tj.uid, _why(stop, "deleted"))
        if o.config.delete_on_stop
        else Suspend(tj.resource_version, _why(stop, "suspended"))
    )
    if not reporting or (job.state in ENDED_STATES and job.state != "stopped"):
        return [end]  # nobody to ask for a checkpoint: stop it now
    actions: list[Action] = []
    if stop.checkpoint_at is None and job.state not in ENDED_STATES:
        actions.append(QueueCommand("checkpoint", f"before the stop: {stop.reason}" if stop.reason else "before stop"))
    deadline = stop.at + o.config.grace_s
    if o.now < deadline:
        actions.append(Requeue(deadline))
        return actions
    return [*actions, end]


def _why(stop: StopRequest, done: str) -> str:
    reason = f": {stop.reason}" if stop.reason else ""
    return f"stop requested{reason}; {done} by stepwatch"
