"""When to save the next checkpoint: keep the work at risk under a budget, at the interval failures call for.

Work done since the last checkpoint is lost when the job dies (a node failure, a preemption, an OOM);
what it cost is the job's cost rate times the time since that checkpoint. Two limits set the next one:

- the **budget**: the money of work the owner accepts to lose (``max_at_risk``): the next checkpoint is
  due when ``rate x (t - last)`` reaches it;
- the **Young/Daly interval** ``sqrt(2 x C x MTBF)``, the first-order optimum between the time a
  checkpoint takes (``C``) and the work lost at a failure, for a mean time between failures ``MTBF``
  (Young 1974, Daly 2006); used alone when the job has no price.

No checkpoint is advised when the job will finish before it is due (its ETA), nor for an ended job.
Pure: the figures in, the advice out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CheckpointAdvice", "advise", "daly_interval"]


@dataclass(frozen=True)
class CheckpointAdvice:
    """The next checkpoint of a job (times are server times)."""

    last: float
    """When the last checkpoint was asked for (the job's start when none was)."""
    at_risk: float | None
    """Money of the work done since then (``None``: the job has no price)."""
    next_at: float | None
    """When the next one is due (``None``: none needed before the job ends)."""
    interval_s: float
    """The interval the advice keeps."""
    reason: str

    def due(self, now: float) -> bool:
        """Whether the next checkpoint is due now."""
        return self.next_at is not None and now >= self.next_at

    def to_dict(self) -> dict[str, float | str | None]:
        """The JSON object of the API."""
        return {
            "last": self.last,
            "at_risk": self.at_risk,
            "next_at": self.next_at,
            "interval_seconds": self.interval_s,
            "reason": self.reason,
        }


def daly_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young/Daly's checkpoint interval: ``sqrt(2 x C x MTBF)`` seconds."""
    return math.sqrt(2.0 * max(checkpoint_cost_s, 0.0) * max(mtbf_s, 0.0))


def advise(
    *,
    now: float,
    last: float,
    rate_per_hour: float | None,
    remaining_s: float | None,
    max_at_risk: float | None,
    checkpoint_cost_s: float,
    mtbf_s: float,
) -> CheckpointAdvice:
    """The advice for a running job whose last checkpoint was at ``last`` (see the module docstring)."""
    daly = daly_interval(checkpoint_cost_s, mtbf_s)
    priced = rate_per_hour is not None and rate_per_hour > 0
    at_risk = rate_per_hour * max(now - last, 0.0) / 3600.0 if priced and rate_per_hour is not None else None
    interval, why = daly, f"Young/Daly interval for a {checkpoint_cost_s:g} s checkpoint and {mtbf_s / 3600:g} h MTBF"
    if priced and rate_per_hour is not None and max_at_risk is not None:
        budget_s = max_at_risk / rate_per_hour * 3600.0
        if budget_s < interval:
            interval, why = budget_s, f"keeps the work at risk under {max_at_risk:g} at {rate_per_hour:g}/h"
    next_at: float | None = last + interval
    if remaining_s is not None and next_at is not None and next_at >= now + remaining_s:
        next_at, why = None, "the job finishes before a checkpoint is due"
    return CheckpointAdvice(last, at_risk, next_at, interval, why)
