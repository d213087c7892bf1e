"""What the API shows of a job: stored fields plus the figures derived from them at read time."""

from __future__ import annotations

import math
from typing import Any

from ..protocol import encode_float, format_rfc3339
from .analysis.cost import Cost, job_cost
from .store import Job

__all__ = [
    "COMPACT_METRICS",
    "LIST_COLUMNS",
    "WASTEFUL_HEALTH",
    "CompactViews",
    "cost_of",
    "cost_view",
    "job_view",
    "json_float",
    "progress_percent",
    "remaining_seconds",
    "saved_by_policy",
]


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


WASTEFUL_HEALTH = frozenset({"stalled", "not_learning", "diverging"})
"""Health in which a job's GPU time counts as wasted (since its ``health_since``: for ``not_learning``
the last real improvement)."""


def cost_of(job: Job, now: float, remaining: float | None) -> Cost:
    """A job's cost at ``now`` (its GPUs and price; the ETA for the projection; its health for the waste)."""
    bad = job.health in WASTEFUL_HEALTH and job.health_since is not None
    return job_cost(
        gpus=job.gpus,
        gpu_hour_cost=job.gpu_hour_cost,
        started_at=job.started_at,
        finished_at=job.finished_at,
        now=now,
        remaining_seconds=remaining,
        wasted_since=job.health_since if bad else None,
        healthy=True if job.health in ("healthy", "straggling") else None,
    )


def saved_by_policy(job: Job) -> float | None:
    """Money the job's policy saved by stopping it early (``None``: it did not stop it, or the cost is unknown)."""
    saved = [f["saved"] for f in job.policy_fired.values() if not f.get("dry_run") and f.get("saved") is not None]
    return sum(saved) if saved else None


def cost_view(job: Job, now: float, remaining: float | None) -> dict[str, Any]:
    """The ``cost`` object of a job's view: its cost now and what its policy saved."""
    return {**cost_of(job, now, remaining).to_dict(), "saved": saved_by_policy(job)}


COMPACT_METRICS = 64
"""The most latest values a compact view carries (a job may have 1,024 metric names; lists and the
live stream's job updates would carry them all each time): losses first, then by name."""


def job_view(job: Job, now: float, compact: bool = False) -> dict[str, Any]:
    """The JSON object of a job; ``compact`` (lists, the live stream) leaves out params and the
    Kubeflow-shaped copy, and carries at most :data:`COMPACT_METRICS` latest values."""
    percent = progress_percent(job)
    remaining = remaining_seconds(job, now)
    end = job.finished_at if job.finished_at is not None else now
    elapsed = end - job.started_at if job.started_at is not None else None
    shown = _fewer(job.last_metrics) if compact else job.last_metrics
    metrics = {k: json_float(v) for k, v in sorted(shown.items())}
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
        "health": {"state": job.health, "since": job.health_since, "evidence": job.health_evidence},
        "params": job.params,
        "resources": {"gpus": job.gpus, "gpu_type": job.gpu_type or None, "gpu_hour_cost": job.gpu_hour_cost},
        "cost": cost_view(job, now, remaining),
        "trainerStatus": trainer_status,
    }
    if compact:
        del view["params"], view["trainerStatus"]
    return view


LIST_COLUMNS: tuple[str, ...] = (
    "namespace",
    "name",
    "attempt",
    "state",
    "source",
    "reason",
    "exit_code",
    "progress.percent",
    "progress.step",
    "progress.total_steps",
    "progress.epoch",
    "progress.total_epochs",
    "progress.samples",
    "progress.steps_per_second",
    "progress.samples_per_second",
    "progress.world_size",
    "eta.remaining_seconds",
    "eta.finish_time",
    "eta.reported_seconds",
    "times.created",
    "times.started",
    "times.finished",
    "times.updated",
    "times.last_report",
    "times.elapsed_seconds",
    "times.report_age_seconds",
    "metrics",
    "nonfinite_total",
    "health.state",
    "health.since",
    "health.evidence",
    "resources.gpus",
    "resources.gpu_type",
    "resources.gpu_hour_cost",
    "cost.currency",
    "cost.rate_per_hour",
    "cost.spent",
    "cost.projected",
    "cost.wasted",
    "cost.wasted_since",
    "cost.saved",
)
"""The columns of a list in its column form (``?form=columns``), in the order of the compact view's fields:
a name is a field of the view, or ``field.subfield`` for the fields of its objects (``metrics`` and
``health.evidence`` stay whole: their keys are the job's own)."""

_TIMED = (
    "eta.remaining_seconds",
    "eta.finish_time",
    "times.elapsed_seconds",
    "times.report_age_seconds",
    "cost.spent",
    "cost.projected",
    "cost.wasted",
)
"""The columns :meth:`CompactViews.columns` sets at each request."""
_PATHS = tuple((c.partition(".")[0], c.partition(".")[2] or None) for c in LIST_COLUMNS)


class CompactViews:
    """The compact views of jobs for lists, built once per version of a job, timed at each request.

    A list of 10,000 jobs would otherwise build 10,000 views from scratch per request. What depends
    on the time (the ETA counted down, the elapsed time, the age of the last report, the running cost)
    is set at each request, on a copy of the view (:meth:`view`) or in its own columns (:meth:`columns`);
    the rest is kept for as long as the job does not change (the store hands out a new ``Job`` object
    for every change).
    """

    def __init__(self, capacity: int = 50_000) -> None:
        self.capacity = capacity
        self._views: dict[int, list[Any]] = {}
        """``[job, view, row]`` by job id; ``row`` (the view's values in the order of ``LIST_COLUMNS``) once
        a column form asked for it."""

    def _kept(self, job: Job, now: float) -> list[Any]:
        kept = self._views.get(job.id)
        if kept is None or kept[0] is not job:
            if len(self._views) >= self.capacity:
                self._views.clear()
            kept = self._views[job.id] = [job, job_view(job, now, compact=True), None]
        return kept

    def view(self, job: Job, now: float) -> dict[str, Any]:
        """``job_view(job, now, compact=True)``, from the kept part when the job has not changed."""
        view: dict[str, Any] = self._kept(job, now)[1].copy()
        remaining = remaining_seconds(job, now)
        view["eta"] = {
            "remaining_seconds": remaining,
            "finish_time": now + remaining if remaining is not None else None,
            "reported_seconds": job.reported_eta,
        }
        times = view["times"] = view["times"].copy()
        if job.started_at is not None and job.finished_at is None:
            times["elapsed_seconds"] = now - job.started_at
            if job.gpus > 0 and job.gpu_hour_cost > 0:
                view["cost"] = cost_view(job, now, remaining)
        if job.last_report_at is not None:
            times["report_age_seconds"] = now - job.last_report_at
        return view

    def columns(self, jobs: list[Job], now: float) -> dict[str, Any]:
        """The compact views of ``jobs`` at ``now`` as columns: ``{name: [one value per job]}`` for each of
        ``LIST_COLUMNS``, each value the one :meth:`view` gives.

        A list's answer in this form is about 40% of the size of its items and far quicker to decode:
        the field names are written once, not once per job.
        """
        rows = []
        for job in jobs:
            kept = self._kept(job, now)
            if kept[2] is None:
                view = kept[1]
                kept[2] = tuple(view[top] if key is None else view[top][key] for top, key in _PATHS)
            rows.append(kept[2])
        if not rows:
            return {name: [] for name in LIST_COLUMNS}
        columns: dict[str, Any] = dict(zip(LIST_COLUMNS, zip(*rows)))  # tuples: orjson writes them as arrays
        # what depends on the time, as view() sets it (the kept row has the values of when it was built)
        for name in _TIMED:
            columns[name] = list(columns[name])
        remaining_col, finish_col = columns["eta.remaining_seconds"], columns["eta.finish_time"]
        elapsed_col, age_col = columns["times.elapsed_seconds"], columns["times.report_age_seconds"]
        spent_col, projected_col, wasted_col = columns["cost.spent"], columns["cost.projected"], columns["cost.wasted"]
        for i, job in enumerate(jobs):
            remaining = remaining_seconds(job, now)
            remaining_col[i] = remaining
            finish_col[i] = now + remaining if remaining is not None else None
            if job.started_at is not None and job.finished_at is None:
                elapsed_col[i] = now - job.started_at
                if job.gpus > 0 and job.gpu_hour_cost > 0:
                    cost = cost_of(job, now, remaining)
                    spent_col[i], projected_col[i], wasted_col[i] = cost.spent, cost.projected, cost.wasted
            if job.last_report_at is not None:
                age_col[i] = now - job.last_report_at
        return columns


def _fewer(values: dict[str, float]) -> dict[str, float]:
    if len(values) <= COMPACT_METRICS:
        return values
    ranked = sorted(values, key=lambda name: ("loss" not in name.lower(), name))
    return {name: values[name] for name in ranked[:COMPACT_METRICS]}


def _metric_string(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(value)[:64]
