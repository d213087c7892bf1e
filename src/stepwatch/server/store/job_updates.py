"""What a stored report or upstream status changes in its job's row: the same rules for both stores.

Each store writes the rows its own way (SQLite one statement at a time, PostgreSQL in pipelined
batches); what follows from a report once it is stored (progress only from rank 0's newest report,
parameters that only grow, the latest values only from the newest report, the count of non-finite
values) and how an upstream Kubeflow status is read (it replaces the job's last ``trainerStatus`` whole,
as upstream does; numeric metrics also become one-value windows, ``current_step`` and its kin progress)
is decided here, once. So is when a heartbeat leaves the job's row as it is (:data:`HEARTBEAT_LAG_S`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from ...protocol import ENDED_STATES, MetricWindow, Report, TrainerStatus, parse_rfc3339
from .base import Job, MetricLimitError, PendingReport, ProgressSample

__all__ = ["HEARTBEAT_LAG_S", "UpstreamStatus", "check_metric_names", "report_updates", "upstream_status"]

HEARTBEAT_LAG_S = 1.0
"""How far (seconds) a job's row may lag the heartbeats it was sent: a report that would change nothing of
its job but ``updated_at`` and ``last_report_at`` (a heartbeat of a rank other than 0, or a late report:
no metrics, parameters, acknowledgements, final state or first report) leaves the row as it is while the
row's ``last_report_at`` is less than this old, and writes both times again once it is this old.

Why: seven reports in eight of a fleet are such heartbeats, and each rewrote the job's whole row (its
statement and its pages of the write-ahead log at commit) only to move two times; a job of 8 ranks
reporting every 2 s now writes its row about once a second, not four times.

Why it is safe: every reader of the two times reads them at most this much older than the newest
report: ``report_age_seconds`` (views) and Prometheus' ``last_report_age_seconds`` are at most 1 s higher;
``trainerStatus.lastUpdatedTime`` (whole seconds) and a Kubernetes TrainJob's mirrored status time at
most 1 s older; the silent-job rule of ``ingest.health_monitor`` (a running job without a tracker is
stalled after 120 s, at least the 20 s ``stall_floor_s``) decides at most 1 s later, and its tracked
rules are fed by each report, not by the row; a job's own ETA counted down from ``last_report_at`` is at
most 1 s shorter; lists ordered by ``updated_at`` may order jobs within 1 s of each other otherwise. A
job that stops reporting keeps the time of a report less than 1 s before its last one. The job the store
answers with is its row as stored (the times it holds), so the next heartbeat compares with the row."""


def check_metric_names(job: Job, known: Collection[str], names: Iterable[str], limit: int) -> None:
    """Refuse (:class:`MetricLimitError`) a report whose ``names`` would take the job's distinct metric
    names (``known``: its latest values' names, which hold every name it ever reported) over ``limit``."""
    new = {n for n in names if n not in known}
    if new and len(known) + len(new) > limit:
        shown = ", ".join(repr(n) for n in sorted(new)[:3])
        raise MetricLimitError(
            f"job {job.key} has {len(known)} distinct metric names and this report adds {len(new)} new ones "
            f"({shown}{', ...' if len(new) > 3 else ''}): the limit is {limit} per job (STEPWATCH_MAX_METRIC_NAMES); "
            "reports of the names it has are still accepted",
            job.id,
        )


def report_updates(job: Job, item: PendingReport, newest: bool) -> tuple[dict[str, Any], ProgressSample | None]:
    """The job columns a new (not duplicate) native report changes, and the progress sample it adds.

    ``newest``: the report is its rank's newest by the reporter's clock (a late one is history only).
    """
    report, now, identity, progress = item.report, item.now, item.report.identity, item.report.progress
    sample = None
    if identity.rank == 0 and newest:
        updates: dict[str, Any] = {
            "updated_at": now,
            "last_report_at": now,
            "step": progress.step,
            "epoch": progress.epoch,
            "samples": progress.samples,
            "steps_per_second": progress.steps_per_second,
            "samples_per_second": progress.samples_per_second,
            "world_size": identity.world_size,
        }
        if progress.total_steps is not None:
            updates["total_steps"] = progress.total_steps
        if progress.total_epochs is not None:
            updates["total_epochs"] = progress.total_epochs
        if progress.eta_seconds is not None:
            updates["reported_eta"] = progress.eta_seconds
        if item.estimate is not None:
            updates.update(eta_seconds=item.estimate[0], eta_rate=item.estimate[1], eta_at=now)
        if progress.step is not None:
            sample = ProgressSample(now, progress.step)
        if job.trainer_status is not None:  # a native report is the job's last word now, not the upstream status
            updates.update(trainer_status=None, reported_progress=None)
    elif _leaves_row(job, report, now):
        return {}, None  # a heartbeat: the row keeps its times a little longer (HEARTBEAT_LAG_S)
    else:
        updates = {"updated_at": now, "last_report_at": now}
    if report.params is not None:  # params only grow: a run's later ones add to those it started with
        updates["params"] = {**job.params, **report.params}
    windows = report.metrics
    if windows and (newest or any(w.name not in job.last_metrics for w in windows)):
        values = {w.name: w.last for w in windows}
        means = {w.name: w.last if w.mean is None else w.mean for w in windows}
        # a late report is history, not the latest values; the names it brings count all the same (the
        # latest values hold every name a job has: the limit on names is counted from them)
        if newest:
            updates["last_metrics"] = {**job.last_metrics, **values}
            updates["metric_means"] = {**job.metric_means, **means}
        else:
            updates["last_metrics"] = {**values, **job.last_metrics}
            updates["metric_means"] = {**means, **job.metric_means}
    if windows:
        updates["nonfinite_total"] = job.nonfinite_total + sum([w.nonfinite for w in windows])
    return updates, sample


def _leaves_row(job: Job, report: Report, now: float) -> bool:
    """Whether a report that is not rank 0's newest changes nothing of its job's row but its two times,
    and the row heard a report less than :data:`HEARTBEAT_LAG_S` before ``now`` (a clock gone back
    writes, as before). Anything else writes: metrics, parameters, acknowledgements, a final state (rank 0's
    late report may end its job), the first report (it starts its job)."""
    last = job.last_report_at
    return (
        last is not None
        and 0.0 <= now - last < HEARTBEAT_LAG_S
        and report.params is None
        and not report.metrics
        and not report.acks
        and report.state not in ENDED_STATES
        and job.state != "pending"
    )


@dataclass(frozen=True)
class UpstreamStatus:
    """An upstream status as the store keeps it: a report row, one-value windows, the job's new columns."""

    received_at: float
    """The server's arrival time."""
    sent_at: float
    """The reporter's ``lastUpdatedTime``, or the arrival time."""
    step: int | None
    """``current_step`` when it is a non-negative finite number, else the job's step so far."""
    windows: tuple[MetricWindow, ...]
    """Every other numeric metric, as a window of one value at ``step``."""
    updates: dict[str, Any]
    """The job columns the status changes (before the state transition)."""

    @property
    def sample(self) -> ProgressSample | None:
        """The progress sample the status adds (at its arrival time), if it has a step."""
        return None if self.step is None else ProgressSample(self.received_at, self.step)


def upstream_status(job: Job, status: TrainerStatus, now: float) -> UpstreamStatus:
    """Read a Kubeflow ``trainerStatus`` for a job as it now stands: progress, ETA and numeric metrics.

    The status replaces the last one whole (upstream's semantics): the job keeps it as posted
    (``trainer_status``), and its progress and ETA are the ones it posted, or none when it posted none.
    Upstream metric values are any strings; only those that read as numbers become history (and
    ``current_step`` the step: a status without it leaves the last step known).
    """
    values: dict[str, float] = {}
    for metric in status.metrics:
        try:
            values[metric.name] = float(metric.value)
        except ValueError:
            continue
    sent_at = now if status.last_updated_time is None else parse_rfc3339(status.last_updated_time)
    step = values.pop("current_step", None)
    total = values.pop("total_steps", None)
    epoch = values.pop("current_epoch", None)
    total_epochs = values.pop("total_epochs", None)
    step_int = int(step) if step is not None and math.isfinite(step) and step >= 0 else job.step
    windows = tuple(_one_value_window(name, value, step_int or 0) for name, value in values.items())
    updates: dict[str, Any] = {
        "updated_at": now,
        "last_report_at": now,
        "step": step_int,
        "reported_progress": status.progress_percentage,
        "reported_eta": status.estimated_remaining_seconds,
        "last_metrics": {**job.last_metrics, **values},
        "metric_means": {**job.metric_means, **values},  # a window of one value: its mean is the value
        "nonfinite_total": job.nonfinite_total + sum(w.nonfinite for w in windows),
        "source": "kubeflow",
        "trainer_status": status.to_body()["trainerStatus"],
    }
    if total is not None and math.isfinite(total) and total >= 1:
        updates["total_steps"] = int(total)
    if epoch is not None and math.isfinite(epoch):
        updates["epoch"] = epoch
    if total_epochs is not None and math.isfinite(total_epochs) and total_epochs > 0:
        updates["total_epochs"] = total_epochs
    return UpstreamStatus(now, sent_at, step_int, windows, updates)


def _one_value_window(name: str, value: float, step: int) -> MetricWindow:
    finite = math.isfinite(value)
    return MetricWindow(
        name=name,
        last=value,
        min=value if finite else None,
        max=value if finite else None,
        mean=value if finite else None,
        count=1,
        nonfinite=0 if finite else 1,
        first_step=step,
        last_step=step,
    )
