"""The figures a person reads about a job, computed in one place: progress percent (one rounding rule), the ETA
shown, the live rates, cost and waste, and the health timeline whose spans add up to the job's age.

Serialisers (:mod:`.serialisers`) only shape these into JSON; policies, Prometheus and the Kubernetes runner
call the same functions, so no two readers can disagree about a number (issue 30: 9.9 % in one view and
10.0 % in another, a stalled job at 18.9 steps/s, $0.50 wasted beside $0.46).

The rules, each applied here once:

- **Percent**: one decimal, rounded *down* (9.96 reads 9.9, 99.99 reads 99.9), 100 only for a job that
  reached its total and ended (finished, or stopped after its last step). ``progress.percent`` in a job
  view *is* that shown value: readers print it with one decimal and draw bars from it, never round it
  again. A percentage an upstream Kubeflow client posted is shown as posted (an integer).
- **Rates**: a stalled or ended job has no live rate (``None``: readers show "—").
- **Cost**: an ended job has no hourly rate (``rate_per_hour`` is ``None``); what it spent stays.
- **Health timeline**: each verdict covers the time from where it began (``since`` for a bad verdict: for
  ``not_learning`` the last real improvement) to where the next one began; a later verdict that reaches back
  cuts the earlier one short. The first healthy verdict covers the job from its start (its windows judged
  those steps); a time with no verdict is an ``unknown`` span. The spans add up to the job's elapsed time,
  and the cost block's ``wasted`` is the sum of the timeline's ``wasted``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from ...protocol import ENDED_STATES, shown_percent
from ..analysis.cost import WASTEFUL_HEALTH, Cost, job_cost
from ..store import Job

__all__ = [
    "WASTEFUL_HEALTH",
    "EtaSource",
    "cost_of",
    "eta_of",
    "health_timeline",
    "hourly_rate",
    "live_samples_per_second",
    "live_steps_per_second",
    "metric_means",
    "progress_percent",
    "remaining_seconds",
    "saved_by_policy",
    "shown_cost",
    "shown_percent",
    "span_cost",
    "wasted_spans",
]

_HOUR = 3600.0


# ------------------------------------------------------------------------------------------- progress


def progress_percent(job: Job) -> float | None:
    """The job's progress as readers show it (see :func:`shown_percent`): what its upstream client posted
    in its last status (as posted), else from steps, else epochs, else 100 for a finished job that never
    said how far it got.

    An ended job keeps its real progress (a script that exits at step 199 of 400 ended at 49.7 %, whatever
    its state). The stores' ``Dialect.progress`` (the sort and filter by progress) takes the same sources.
    """
    if job.reported_progress is not None:
        return float(job.reported_progress)
    ended = job.state in ENDED_STATES
    if job.step is not None and job.total_steps:
        # integer arithmetic: 100 * 3 / 10 must not land a hair under 30
        return shown_percent((1000 * max(job.step, 0) // job.total_steps) / 10, ended)
    if job.epoch is not None and job.total_epochs:
        return shown_percent(100.0 * job.epoch / job.total_epochs, ended)
    if job.state == "finished":
        return 100.0
    return None


# ------------------------------------------------------------------------------------------------ ETA


EtaSource = Literal["reported", "estimate", "final"]
"""Where a shown ETA comes from: the job's own (``reported``: posted by its Kubeflow client, or sent by
the report core, counted down since it arrived), stepwatch's (``estimate``: its recent rate), or the
end (``final``: 0 once finished)."""


def remaining_seconds(job: Job, now: float) -> float | None:
    """Seconds left: the last estimate counted down since it was made (``None`` once the job ended)."""
    if job.state in ENDED_STATES:
        return 0.0 if job.state == "finished" else None
    if job.eta_seconds is None or job.eta_at is None:
        return None
    return max(job.eta_seconds - max(now - job.eta_at, 0.0), 0.0)


def eta_of(job: Job, now: float) -> tuple[float | None, EtaSource | None]:
    """The seconds left that readers show, and where they come from.

    An ETA a Kubeflow client posted in the job's last status is shown as posted (counted down since it
    arrived), never replaced by stepwatch's own; else none while the job is stalled; else stepwatch's
    estimate; else, while stepwatch has no rate of its own, what the job reported (its report core's ETA).
    """
    if job.state in ENDED_STATES:
        return (0.0, "final") if job.state == "finished" else (None, None)
    posted = _posted_eta(job)
    if posted is not None:
        return _counted_down(posted, job.last_report_at, now), "reported"
    if job.health == "stalled":  # no progress: a rate's countdown would be a guess dressed as fact
        return None, None
    own = remaining_seconds(job, now)
    if own is not None:
        # a job's own ETA on the native API is preferred by the estimate (analysis.eta: "reported")
        return own, "reported" if job.reported_eta is not None and job.trainer_status is None else "estimate"
    if job.eta_rate is None and job.reported_eta is not None and math.isfinite(job.reported_eta):
        return _counted_down(job.reported_eta, job.last_report_at, now), "reported"
    return None, None


def _posted_eta(job: Job) -> float | None:
    if job.trainer_status is None:
        return None
    posted = job.trainer_status.get("estimatedRemainingSeconds")
    return float(posted) if isinstance(posted, int) else None


def _counted_down(seconds: float, since: float | None, now: float) -> float:
    return max(seconds - max(now - since, 0.0), 0.0) if since is not None else max(seconds, 0.0)


# ---------------------------------------------------------------------------------------------- rates


def _moving(job: Job) -> bool:
    return job.state not in ENDED_STATES and job.health != "stalled"


def live_steps_per_second(job: Job) -> float | None:
    """Steps per second now: the ETA's robust recent rate, else the last reported one; ``None`` for a job that
    is stalled or has ended (a rate measured before it stopped moving is not its rate now)."""
    if not _moving(job):
        return None
    return job.eta_rate if job.eta_rate is not None else job.steps_per_second


def live_samples_per_second(job: Job) -> float | None:
    """Samples per second now; ``None`` for a job that is stalled or has ended."""
    return job.samples_per_second if _moving(job) else None


def metric_means(job: Job) -> dict[str, float]:
    """The mean of the latest window of each metric (the job record's ``metric_means``, where the store keeps
    it; ``{}`` before that): what the list's LOSS shows, smoother than the last single batch."""
    means = getattr(job, "metric_means", None)
    return dict(means) if means else {}


# ------------------------------------------------------------------------------------ health timeline


def health_timeline(job: Job, now: float) -> list[tuple[dict[str, Any], float, float]]:
    """The job's verdicts as a timeline: ``(span, start, end)`` per span, oldest first, with no overlap and
    no gap from the job's start to its end (or ``now``); gaps with no verdict become ``unknown`` spans
    (``{"state": "unknown", "from": .., "to": .., "since": None, "message": ""}``). See the module docstring."""
    history = job.health_history
    if not history:
        return []
    end = job.finished_at if job.finished_at is not None else now
    origin = job.started_at
    raw: list[list[Any]] = []
    for span in history:
        begun = span.get("since") if span.get("state") in WASTEFUL_HEALTH else None
        start = float(begun if begun is not None else span["from"])
        stop = float(span["to"]) if span.get("to") is not None else end
        if origin is not None:
            start = max(start, origin)
        start, stop = min(start, end), min(stop, end)
        raw.append([span, start, max(stop, start)])
    # a later verdict wins the time it claims: one that reaches back (a plateau from the last real
    # improvement) cuts those before it short, however many
    for i in range(len(raw) - 2, -1, -1):
        raw[i][2] = min(raw[i][2], raw[i + 1][1])
        raw[i][1] = min(raw[i][1], raw[i][2])
    out: list[tuple[dict[str, Any], float, float]] = []
    for span, start, stop in raw:
        if out and out[-1][2] < start:  # no verdict stood in between
            out.append((_unknown(out[-1][2], start), out[-1][2], start))
        out.append((span, start, stop))
    first, first_start, first_stop = out[0]
    if origin is not None and first_start > origin:
        if first.get("state") == "healthy":  # its windows judged the steps from the start
            out[0] = (first, origin, first_stop)
        else:
            out.insert(0, (_unknown(origin, first_start), origin, first_start))
    last_stop = out[-1][2]
    if last_stop < end:
        out.append((_unknown(last_stop, end), last_stop, end))
    return out


def _unknown(start: float, stop: float) -> dict[str, Any]:
    return {"state": "unknown", "from": start, "to": stop, "since": None, "message": ""}


def wasted_spans(job: Job, now: float | None = None) -> list[tuple[float, float | None]]:
    """The spans (start, end; ``None``: it still stands) of the job's bad verdicts, as the health timeline
    has them when ``now`` is given; without a history yet, its current verdict."""
    if job.health_history and now is not None:
        timeline = health_timeline(job, now)
        return [(start, stop) for span, start, stop in timeline if span.get("state") in WASTEFUL_HEALTH]
    spans = [
        (s["since"] if s.get("since") is not None else s["from"], s.get("to"))
        for s in job.health_history
        if s.get("state") in WASTEFUL_HEALTH
    ]
    if not job.health_history and job.health in WASTEFUL_HEALTH and job.health_since is not None:
        spans.append((job.health_since, None))
    return spans


# ----------------------------------------------------------------------------------------------- cost


def hourly_rate(job: Job) -> float | None:
    """What an hour of the job costs (GPUs x price; ``None``: no GPUs or no price)."""
    return job.gpus * job.gpu_hour_cost if job.gpus > 0 and job.gpu_hour_cost > 0 else None


def span_cost(seconds: float, rate: float | None) -> float | None:
    """What ``seconds`` of a job cost at ``rate`` per hour (``None``: no price)."""
    return seconds / _HOUR * rate if rate is not None else None


def cost_of(job: Job, now: float, remaining: float | None) -> Cost:
    """A job's cost at ``now``: its GPUs and price, the ETA for the projection, the waste its health timeline
    sums to. ``rate_per_hour`` is the job's price per hour even after it ended (sums over jobs count a job as
    priced by it: ``analysis.cost.totals``); what a person reads is :func:`shown_cost`."""
    bad = job.health in WASTEFUL_HEALTH and job.health_since is not None
    cost = job_cost(
        gpus=job.gpus,
        gpu_hour_cost=job.gpu_hour_cost,
        started_at=job.started_at,
        finished_at=job.finished_at,
        now=now,
        remaining_seconds=remaining,
        wasted_since=job.health_since if bad else None,
        healthy=True if job.health in ("healthy", "straggling") else None,
        wasted_spans=wasted_spans(job, now),
    )
    rate = hourly_rate(job)
    if rate is not None and job.health_history and job.started_at is not None:
        wasted = [span_cost(stop - start, rate) or 0.0 for span, start, stop in health_timeline(job, now)
                  if span.get("state") in WASTEFUL_HEALTH]  # fmt: skip
        if wasted:  # the same sum, in the same order, as the history's spans: equal to the cent and beyond
            cost = dataclasses.replace(cost, wasted=sum(wasted))
    return cost


def shown_cost(job: Job, now: float, remaining: float | None) -> Cost:
    """The cost a person reads (the job view's ``cost``): :func:`cost_of`, with no hourly rate once the job
    ended (it burns nothing now; what it spent stays)."""
    cost = cost_of(job, now, remaining)
    return dataclasses.replace(cost, rate_per_hour=None) if job.state in ENDED_STATES else cost


def saved_by_policy(job: Job) -> float | None:
    """Money the job's policy saved by stopping it early (``None``: it did not stop it, or the cost is unknown)."""
    saved = [f["saved"] for f in job.policy_fired.values() if not f.get("dry_run") and f.get("saved") is not None]
    return sum(saved) if saved else None
