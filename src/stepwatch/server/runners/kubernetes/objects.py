"""TrainJobs as the runner sees them: parsed from the API's JSON, and the status it writes back. Pure.

Kubeflow Trainer's TrainJob (``trainer.kubeflow.org/v1alpha1``) says its lifecycle through conditions
(``Created``, ``Suspended``, ``Complete``, ``Failed``), its size through ``spec.trainer.numNodes`` and
``spec.trainer.resourcesPerNode`` over its runtime's ``mlPolicy.numNodes`` and trainer container, and
its progress through ``status.trainerStatus`` (KEP-2779) and, on Red Hat OpenShift AI, the annotation
``trainer.opendatahub.io/trainerStatus``. Who wrote a field is in ``metadata.managedFields``: the runner
mirrors what others wrote and writes only what is its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ....protocol import ProtocolError, TrainerStatus, format_rfc3339, parse_rfc3339
from ....protocol.progression import (
    ANNOTATION_STATUS,
    AnnotationStatus,
    encode_annotation,
    format_duration_summary,
    is_eval_metric,
)
from ...store import Job
from ...views.figures import eta_of, progress_percent
from ...views.serialisers import trainer_status_view

__all__ = [
    "ANNOTATION",
    "FIELD_MANAGER",
    "GPU_RESOURCES",
    "GROUP",
    "PLURAL",
    "VERSION",
    "Phase",
    "RuntimeSize",
    "TrainJob",
    "annotation_for",
    "gpu_type_of",
    "parse_trainjob",
    "runtime_size",
    "trainer_status_for",
    "upstream_status",
]

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
PLURAL = "trainjobs"
ANNOTATION = ANNOTATION_STATUS
"""Red Hat OpenShift AI's richer progress annotation (JSON), read by its dashboard."""
FIELD_MANAGER = "stepwatch"
"""The field manager of every write of the runner (server-side apply), so that its fields are its own."""
GPU_TYPE_KEY = "stepwatch.io/gpu-type"
"""Label or annotation naming the kind of GPU of a TrainJob (``h100``...), for its price."""
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "habana.ai/gaudi")
"""Extended resources counted as GPUs."""
_GPU_PRODUCT_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name", "cloud.google.com/gke-accelerator")
_KNOWN_GPUS = ("gb200", "b200", "h200", "h100", "a100", "a10g", "l40s", "l40", "l4", "v100", "t4", "mi300x", "mi250")

Phase = Literal["pending", "running", "suspended", "finished", "failed"]


@dataclass(frozen=True)
class RuntimeSize:
    """What a training runtime says of a job's size (the TrainJob's own spec overrides it)."""

    nodes: int | None = None
    gpus_per_node: float | None = None
    gpu_type: str = ""


@dataclass(frozen=True)
class TrainJob:
    """One TrainJob as observed."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    created_at: float
    phase: Phase
    reason: str = ""
    suspend: bool = False
    deleting: bool = False
    live_since: float = 0.0
    """When it last started to be live: created, or resumed after a suspension."""
    runtime_kind: str = "ClusterTrainingRuntime"
    runtime_name: str = ""
    nodes: int | None = None
    """``spec.trainer.numNodes`` (``None``: the runtime says)."""
    gpus_per_node: float | None = None
    """From ``spec.trainer.resourcesPerNode`` (``None``: the runtime says)."""
    gpu_type: str = ""
    trainer_status: dict[str, Any] | None = None
    """``status.trainerStatus`` as it is on the object."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """Every annotation of the object whose value is a string (the progression switches among them)."""
    status_owners: frozenset[str] = frozenset()
    """Field managers that own a part of ``status.trainerStatus``."""
    annotation_owners: frozenset[str] = frozenset()
    """Field managers that own the OpenShift AI annotation."""
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        """``(namespace, name)``."""
        return (self.namespace, self.name)

    @property
    def annotation(self) -> str | None:
        """The OpenShift AI annotation as it is on the object."""
        return self.annotations.get(ANNOTATION)

    @property
    def live(self) -> bool:
        """Pending or running (not suspended, not ended, not being deleted)."""
        return self.phase in ("pending", "running") and not self.deleting

    def foreign_progress(self, manager: str = FIELD_MANAGER) -> bool:
        """Whether another writer (Kubeflow's controller, OpenShift AI's) owns the job's progress fields."""
        return bool((self.status_owners | self.annotation_owners) - {manager})


def _time(text: object) -> float | None:
    try:
        return parse_rfc3339(text)
    except ProtocolError:
        return None


def _condition(conditions: list[Any], kind: str) -> dict[str, Any] | None:
    for c in conditions:
        if isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True":
            return c
    return None


def _phase(spec: Mapping[str, Any], status: Mapping[str, Any]) -> tuple[Phase, str, float | None]:
    """The lifecycle from the conditions (and ``spec.suspend``), a reason, and when it was resumed."""
    conditions = status.get("conditions") or []
    if not isinstance(conditions, list):
        conditions = []
    resumed = None
    for c in conditions:
        if isinstance(c, dict) and c.get("type") == "Suspended" and c.get("status") == "False":
            resumed = _time(c.get("lastTransitionTime"))
    failed = _condition(conditions, "Failed")
    if failed is not None:
        return "failed", str(failed.get("message") or failed.get("reason") or "the TrainJob failed"), resumed
    complete = _condition(conditions, "Complete")
    if complete is not None:
        return "finished", str(complete.get("message") or "the TrainJob completed"), resumed
    if spec.get("suspend") is True or _condition(conditions, "Suspended") is not None:
        return "suspended", "the TrainJob is suspended (spec.suspend)", resumed
    jobs = status.get("jobsStatus") or []
    if isinstance(jobs, list) and any(
        isinstance(j, dict) and ((j.get("active") or 0) > 0 or (j.get("ready") or 0) > 0) for j in jobs
    ):
        return "running", "", resumed
    return "pending", "", resumed


def _owners(managed: object, path: tuple[str, ...]) -> frozenset[str]:
    """Managers whose ``fieldsV1`` reach ``path`` (``f:`` keys, as the API server writes them)."""
    found = set()
    if isinstance(managed, list):
        for entry in managed:
            if not isinstance(entry, dict):
                continue
            node = entry.get("fieldsV1")
            for part in path:
                node = node.get(f"f:{part}") if isinstance(node, dict) else None
            if node is not None:
                found.add(str(entry.get("manager") or ""))
    return frozenset(found)


def _quantity(value: object) -> float | None:
    """A Kubernetes quantity of whole devices (``"8"``, ``8``); ``None`` when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?", value.strip()):
        return float(value)
    return None


def gpus_of(resources: object) -> float | None:
    """GPUs in a ``ResourceRequirements`` (limits, else requests); ``None`` when it names none."""
    if not isinstance(resources, dict):
        return None
    for part in ("limits", "requests"):
        amounts = resources.get(part)
        if isinstance(amounts, dict):
            total = [q for r in GPU_RESOURCES if (q := _quantity(amounts.get(r))) is not None]
            if total:
                return sum(total)
    return None


def gpu_type_of(*sources: Mapping[str, Any] | None) -> str:
    """The kind of GPU: a ``stepwatch.io/gpu-type`` label or annotation, else a GPU product node label
    (``nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3`` is ``h100``); empty when none says."""
    for source in sources:
        if not source:
            continue
        given = source.get(GPU_TYPE_KEY)
        if isinstance(given, str) and given.strip():
            return given.strip().lower()[:64]
    for source in sources:
        if not source:
            continue
        for key in _GPU_PRODUCT_LABELS:
            product = source.get(key)
            if isinstance(product, str):
                lowered = product.lower()
                for known in _KNOWN_GPUS:
                    if known in lowered:
                        return known
    return ""


def parse_trainjob(obj: Mapping[str, Any]) -> TrainJob:
    """A TrainJob from the API's JSON (missing parts are read as absent, never as an error)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    trainer = spec.get("trainer") or {}
    runtime = spec.get("runtimeRef") or {}
    found = meta.get("annotations")
    annotations: dict[str, Any] = found if isinstance(found, dict) else {}
    labels = meta.get("labels") or {}
    phase, reason, resumed = _phase(spec, status)
    created = _time(meta.get("creationTimestamp")) or 0.0
    nodes = trainer.get("numNodes")
    node_selector = _pod_node_selector(spec)
    managed = meta.get("managedFields")
    ts = status.get("trainerStatus")
    return TrainJob(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        created_at=created,
        phase=phase,
        reason=reason,
        suspend=spec.get("suspend") is True,
        deleting=bool(meta.get("deletionTimestamp")),
        live_since=max(created, resumed or 0.0),
        runtime_kind=str(runtime.get("kind") or "ClusterTrainingRuntime"),
        runtime_name=str(runtime.get("name") or ""),
        nodes=nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 0 else None,
        gpus_per_node=gpus_of(trainer.get("resourcesPerNode")),
        gpu_type=gpu_type_of(labels, annotations, node_selector),
        trainer_status=ts if isinstance(ts, dict) else None,
        annotations={k: v for k, v in annotations.items() if isinstance(v, str)},
        status_owners=_owners(managed, ("status", "trainerStatus")),
        annotation_owners=_owners(managed, ("metadata", "annotations", ANNOTATION)),
        labels=dict(labels) if isinstance(labels, dict) else {},
    )


def _pod_node_selector(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Node selectors the TrainJob's pod template overrides set (where a GPU product label may be)."""
    found: dict[str, Any] = {}
    for patch in spec.get("runtimePatches") or []:
        if not isinstance(patch, dict):
            continue
        for rj in ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec", {}).get(
            "replicatedJobs"
        ) or []:
            pod_spec = _dig(rj, "template", "spec", "template", "spec")
            if isinstance(pod_spec, dict) and isinstance(pod_spec.get("nodeSelector"), dict):
                found.update(pod_spec["nodeSelector"])
    return found


def _dig(obj: object, *keys: str) -> object:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def runtime_size(runtime: Mapping[str, Any]) -> RuntimeSize:
    """Nodes, GPUs per node and GPU type from a (Cluster)TrainingRuntime: ``mlPolicy.numNodes`` and the
    trainer container (the replicated job ``node``, container ``node``, else the first with GPUs)."""
    spec = runtime.get("spec") or {}
    nodes = _dig(spec, "mlPolicy", "numNodes")
    gpus: float | None = None
    gpu_type = ""
    jobs = _dig(spec, "template", "spec", "replicatedJobs")
    candidates = [j for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []
    candidates.sort(key=lambda j: j.get("name") != "node")  # the trainer's replicated job first
    for rj in candidates:
        pod_spec = _dig(rj, "template", "spec", "template", "spec")
        if not isinstance(pod_spec, dict):
            continue
        containers = [c for c in pod_spec.get("containers") or [] if isinstance(c, dict)]
        containers.sort(key=lambda c: c.get("name") != "node")
        for container in containers:
            found = gpus_of(container.get("resources"))
            if found is not None:
                gpus = found
                break
        selector = pod_spec.get("nodeSelector") if isinstance(pod_spec.get("nodeSelector"), dict) else None
        gpu_type = gpu_type or gpu_type_of(selector)
        if gpus is not None:
            break
    meta = runtime.get("metadata") or {}
    return RuntimeSize(
        nodes=nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 0 else None,
        gpus_per_node=gpus,
        gpu_type=gpu_type or gpu_type_of(meta.get("labels"), meta.get("annotations")),
    )


# ------------------------------------------------------------------------------------ progress out


def _metric_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.6g}"


def _status_time(job: Job) -> float:
    """The moment the status describes: the job's newest report (so that it changes only with the job)."""
    return job.last_report_at if job.last_report_at is not None else job.updated_at


def trainer_status_for(job: Job) -> dict[str, Any]:
    """The ``status.trainerStatus`` stepwatch writes for a job: progress, ETA and the last metrics (as
    strings, as upstream asks), with ``current_step``/``total_steps``/``current_epoch``/``total_epochs``
    among them as Hugging Face's KubeflowCallback sends them. A function of the stored job alone (the
    ETA as of the newest report), so an unchanged job gives an unchanged status. A job whose last word
    was an upstream status gets that status back as its client posted it (what the job view shows)."""
    at = _status_time(job)
    if job.trainer_status is not None:
        return trainer_status_view(job, at)
    status: dict[str, Any] = {}
    percent = progress_percent(job)
    if percent is not None:
        status["progressPercentage"] = int(percent)
    remaining = eta_of(job, at)[0]
    if remaining is not None:
        status["estimatedRemainingSeconds"] = round(remaining)
    metrics = []
    for name, value in (
        ("current_step", job.step),
        ("total_steps", job.total_steps),
        ("current_epoch", job.epoch),
        ("total_epochs", job.total_epochs),
    ):
        if value is not None:
            metrics.append({"name": name, "value": _metric_value(float(value))})
    for name, number in sorted(job.last_metrics.items()):
        if 1 <= len(name) <= 64 and len(metrics) < 256:
            metrics.append({"name": name, "value": _metric_value(number)})
    if metrics:
        status["metrics"] = metrics
    status["lastUpdatedTime"] = format_rfc3339(at)
    return status


def annotation_for(job: Job) -> str:
    """The OpenShift AI annotation for a job, byte for byte as Red Hat's controller writes it
    (:func:`~stepwatch.protocol.progression.encode_annotation`): progress, ETA and its summary, step and epoch
    of totals, train and eval metrics (``eval_*``, ``val_*``) as numbers (NaN and ±Inf as the strings ``NaN``,
    ``Inf``, ``-Inf``: Go's ``float64`` has no JSON for them), and the time of the newest report."""
    at = _status_time(job)
    percent = progress_percent(job)
    remaining = eta_of(job, at)[0]
    seconds = None if remaining is None else round(remaining)
    total_epochs = job.total_epochs
    metrics = sorted(job.last_metrics.items())
    status = AnnotationStatus(
        progress_percentage=None if percent is None else int(percent),
        estimated_remaining_seconds=seconds,
        current_step=job.step,
        total_steps=job.total_steps,
        current_epoch=job.epoch,
        # an integer in Go's struct: 2.5 epochs are 3 started ones (as the pod's side writes it)
        total_epochs=math.ceil(total_epochs) if total_epochs is not None and math.isfinite(total_epochs) else None,
        train_metrics={k: v for k, v in metrics if not is_eval_metric(k)},
        eval_metrics={k: v for k, v in metrics if is_eval_metric(k)},
        summary=format_duration_summary(seconds),
        last_updated_time=format_rfc3339(at),
    )
    return encode_annotation(status, nonfinite="string")


# ------------------------------------------------------------------------------------- progress in


def upstream_status(obj: Mapping[str, Any] | None) -> TrainerStatus | None:
    """``status.trainerStatus`` as stepwatch's ingest reads it; ``None`` when absent or invalid."""
    if not obj:
        return None
    try:
        return TrainerStatus.from_body({"trainerStatus": dict(obj)})
    except ProtocolError:
        return None
