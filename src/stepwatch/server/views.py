"""What the API shows of a job: stored fields plus the figures derived from them at read time."""

from __future__ import annotations

import math
from typing import Any

from ..protocol import encode_float, format_rfc3339
from .store import Job

__all__ = ["job_view", "json_float", "progress_percent", "remaining_seconds"]


def json_float(value: float | None) -> float | str | None:
    """A float for a JSON body: non-finite values as the strings of the protocol."""
    return None if value is None else encode_float(value)


def progress_percent(job: Job) -> float | None:
    """Progress in percent: from steps, else epochs, else what the job reported; 100 once finished."""
    if job.state == "finished":
        return 100.0
    if job.step is not None and job.total_steps:
        return max(0.0, min(100.0, 100.0 * job.step / job.total_steps))
    if job.epoch is not None and job.total_epochs:
        return max(0.0, min(100.0, 100.0 * job.epoch / job.total_epochs))
    if job.reported_progress is not None:
        return float(job.reported_progress)
    return None


def remaining_seconds(job: Job, now: float) -> float | None:
    """Seconds left: the last estimate counted down since it was made (``None`` once the job ended)."""
    if job.state in ("finished", "failed", "stopped"):
        return 0.0 if job.state == "finished" else None
    if job.eta_seconds is None or job.eta_at is None:
        return None
    return max(job.eta_seconds - max(now - job.eta_at, 0.0), 0.0)


def job_view(job: Job, now: float, compact: bool = False) -> dict[str, Any]:
    """The JSON object of a job; ``compact`` (lists) leaves out params and the Kubeflow-shaped copy."""
    percent = progress_percent(job)
    remaining = remaining_seconds(job, now)
    end = job.finished_at if job.finished_at is not None else now
    elapsed = end - job.started_at if job.started_at is not None else None
    metrics = {k: json_float(v) for k, v in sorted(job.last_metrics.items())}
    kubeflow_metrics = [{"name": k, "value": _metric_string(v)} for k, v in sorted(job.last_metrics.items())]
    if job.step is not None:
        kubeflow_metrics.insert(0, {"name": "current_step", "value": str(job.step)})
    trainer_status: dict[str, Any] = {"metrics": kubeflow_metrics[:256]}
    if percent is not None:
        trainer_status["progressPercentage"] = int(percent)
    if remaining is not None:
        trainer_status["estimatedRemainingSeconds"] = round(remaining)
    if job.last_report_at is not None:
        trainer_status["lastUpdatedTime"] = format_rfc3339(job.last_report_at)
    view = {
        "namespace": job.namespace,
        "name": job.name,
        "attempt": job.attempt,
        "state": job.state,
        "source": job.source,
        "reason": job.reason,
        "exit_code": job.exit_code,
        "progress": {
            "percent": percent,
            "step": job.step,
            "total_steps": job.total_steps,
            "epoch": job.epoch,
            "total_epochs": job.total_epochs,
            "samples": job.samples,
            "steps_per_second": job.eta_rate if job.eta_rate is not None else job.steps_per_second,
            "samples_per_second": job.samples_per_second,
            "world_size": job.world_size,
        },
        "eta": {
            "remaining_seconds": remaining,
            "finish_time": now + remaining if remaining is not None else None,
            "reported_seconds": job.reported_eta,
        },
        "times": {
            "created": job.created_at,
            "started": job.started_at,
            "finished": job.finished_at,
            "updated": job.updated_at,
            "last_report": job.last_report_at,
            "elapsed_seconds": elapsed,
            "report_age_seconds": now - job.last_report_at if job.last_report_at is not None else None,
        },
        "metrics": metrics,
        "nonfinite_total": job.nonfinite_total,
        "params": job.params,
        "resources": {"gpus": job.gpus, "gpu_hour_cost": job.gpu_hour_cost},
        "trainerStatus": trainer_status,
    }
    if compact:
        del view["params"], view["trainerStatus"]
    return view


def _metric_string(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)[:64]
