"""What the API and the live stream show: a job (stored fields plus the figures derived from them at read
time), a metric point, an event. Each has one serialiser here, used by the API's reads and by what the
live stream publishes alike, so that no reader has a field to patch in."""

from __future__ import annotations

import math
from typing import Any

from ...protocol import ENDED_STATES, INT32_MAX, MetricWindow, encode_float, format_rfc3339
from ..store import Event, Job
from .figures import (
    WASTEFUL_HEALTH,
    eta_of,
    health_timeline,
    hourly_rate,
    live_samples_per_second,
    live_steps_per_second,
    metric_means,
    progress_percent,
    remaining_seconds,
    saved_by_policy,
    shown_cost,
    span_cost,
)

__all__ = [
    "COMPACT_METRICS",
    "LIST_COLUMNS",
    "CompactViews",
    "cost_view",
    "eta_view",
    "event_view",
    "health_history_view",
    "job_view",
    "json_float",
    "point_view",
    "trainer_status_view",
    "window_view",
]
# The figures (progress, ETA, rates, cost, waste) live in .figures; they are named here too for the modules
# that import them from this one (policies, Prometheus, the Kubernetes runner).


def json_float(value: float | None) -> float | str | None:
    """A float for a JSON body: non-finite values as the strings of the protocol."""
    return None if value is None else encode_float(value)


def point_view(
    step: int,
    first_step: int,
    t: float,
    last: float,
    min_: float | None,
    max_: float | None,
    mean: float | None,
    count: int,
    nonfinite: int,
    windows: int,
) -> dict[str, Any]:
    """The JSON object of a metric point: one stored window, or consecutive ones merged (``windows`` of
    them, from ``first_step`` to ``step``), as history reads and the live stream send it."""
    return {
        "step": step,
        "first_step": first_step,
        "t": t,
        "last": json_float(last),
        "min": min_,
        "max": max_,
        "mean": mean,
        "count": count,
        "nonfinite": nonfinite,
        "windows": windows,
    }


def window_view(window: MetricWindow, t: float) -> dict[str, Any]:
    """The point of a window just stored at ``t``, as a history read will show it: the store keeps a
    window's last step only, so a single window's ``first_step`` is that step."""
    w = window
    return point_view(w.last_step, w.last_step, t, w.last, w.min, w.max, w.mean, w.count, w.nonfinite, 1)


def event_view(event: Event) -> dict[str, Any]:
    """The JSON object of an event, as the events API reads it back and the live stream sends it."""
    return {
        "id": event.id,
        "namespace": event.namespace,
        "name": event.name,
        "t": event.t,
        "kind": event.kind,
        "message": event.message,
        "data": event.data,
    }


def eta_view(job: Job, now: float) -> dict[str, Any]:
    """The ``eta`` object of a job's view: what readers show (``remaining_seconds``, ``finish_time``, its
    ``source``), what the job itself last reported (``reported_seconds``, as sent) and stepwatch's own
    estimate beside it (``estimate_seconds``)."""
    remaining, source = eta_of(job, now)
    return {
        "remaining_seconds": remaining,
        "finish_time": now + remaining if remaining is not None else None,
        "source": source,
        "reported_seconds": job.reported_eta,
        "estimate_seconds": None if job.state in ENDED_STATES else remaining_seconds(job, now),
    }


def trainer_status_view(job: Job, at: float) -> dict[str, Any]:
    """The job in Kubeflow Trainer's ``trainerStatus`` shape: the last status its upstream client posted,
    as posted (strings as sent); for a job that reports otherwise, built from stepwatch's figures at ``at``."""
    if job.trainer_status is not None:
        return dict(job.trainer_status)
    percent = progress_percent(job)
    remaining, _ = eta_of(job, at)
    metrics = [{"name": k, "value": _metric_string(v)} for k, v in sorted(job.last_metrics.items())]
    if job.step is not None:
        metrics.insert(0, {"name": "current_step", "value": str(job.step)})
    status: dict[str, Any] = {"metrics": metrics[:256]}
    if percent is not None:
        status["progressPercentage"] = int(percent)
    if remaining is not None:
        status["estimatedRemainingSeconds"] = min(round(remaining), INT32_MAX)
    if job.last_report_at is not None:
        status["lastUpdatedTime"] = format_rfc3339(job.last_report_at)
    return status


def health_history_view(job: Job, now: float) -> list[dict[str, Any]]:
    """Every verdict the job had, oldest first, as a timeline (:func:`.figures.health_timeline`): each span as
    stored (``from`` when it was recorded, ``to`` when replaced, ``None`` while it stands, ``since`` where the
    analysis says it began), with ``start``/``end`` (the time it covers: no overlap, no gap, adding up to the
    job's elapsed time), how long that is (``seconds``) and what it cost (``cost``, ``wasted``; ``None``: no
    price). The ``wasted`` of the spans add up to the cost block's ``wasted``."""
    rate = hourly_rate(job)
    out = []
    for span, start, stop in health_timeline(job, now):
        seconds = stop - start
        cost = span_cost(seconds, rate)
        out.append(
            {
                **span,
                "start": start,
                "end": stop,
                "seconds": seconds,
                "cost": cost,
                "wasted": cost if span["state"] in WASTEFUL_HEALTH else (0.0 if rate is not None else None),
            }
        )
    return out


def cost_view(job: Job, now: float, remaining: float | None) -> dict[str, Any]:
    """The ``cost`` object of a job's view: its cost now and what its policy saved."""
    return {**shown_cost(job, now, remaining).to_dict(), "saved": saved_by_policy(job)}


COMPACT_METRICS = 64
"""The most latest values a compact view carries (a job may have 1,024 metric names; lists and the
live stream's job updates would carry them all each time): losses first, then by name."""


def job_view(job: Job, now: float, compact: bool = False) -> dict[str, Any]:
    """The JSON object of a job; ``compact`` (lists, the live stream) leaves out params and the
    Kubeflow-shaped copy, and carries at most :data:`COMPACT_METRICS` latest values."""
    percent = progress_percent(job)
    eta = eta_view(job, now)
    remaining = eta["remaining_seconds"]
    end = job.finished_at if job.finished_at is not None else now
    elapsed = end - job.started_at if job.started_at is not None else None
    shown = _fewer(job.last_metrics) if compact else job.last_metrics
    metrics = {k: json_float(v) for k, v in sorted(shown.items())}
    means = metric_means(job)
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
            "steps_per_second": live_steps_per_second(job),
            "samples_per_second": live_samples_per_second(job),
            "world_size": job.world_size,
        },
        "eta": eta,
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
        "metric_means": {k: json_float(v) for k, v in sorted(means.items()) if k in shown},
        "nonfinite_total": job.nonfinite_total,
        "health": {"state": job.health, "since": job.health_since, "evidence": job.health_evidence},
        "params": job.params,
        "resources": {"gpus": job.gpus, "gpu_type": job.gpu_type or None, "gpu_hour_cost": job.gpu_hour_cost},
        "cost": cost_view(job, now, remaining),
    }
    if not compact:
        view["trainerStatus"] = trainer_status_view(job, now)
        view["health_history"] = health_history_view(job, now)
    else:
        del view["params"]
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
    "eta.source",
    "eta.reported_seconds",
    "eta.estimate_seconds",
    "times.created",
    "times.started",
    "times.finished",
    "times.updated",
    "times.last_report",
    "times.elapsed_seconds",
    "times.report_age_seconds",
    "metrics",
    "metric_means",
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
    "eta.estimate_seconds",
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
        view["eta"] = eta = eta_view(job, now)
        remaining = eta["remaining_seconds"]
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
        estimate_col = columns["eta.estimate_seconds"]
        elapsed_col, age_col = columns["times.elapsed_seconds"], columns["times.report_age_seconds"]
        spent_col, projected_col, wasted_col = columns["cost.spent"], columns["cost.projected"], columns["cost.wasted"]
        for i, job in enumerate(jobs):
            eta = eta_view(job, now)
            remaining = remaining_col[i] = eta["remaining_seconds"]
            finish_col[i], estimate_col[i] = eta["finish_time"], eta["estimate_seconds"]
            if job.started_at is not None and job.finished_at is None:
                elapsed_col[i] = now - job.started_at
                if job.gpus > 0 and job.gpu_hour_cost > 0:
                    cost = shown_cost(job, now, remaining)
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
