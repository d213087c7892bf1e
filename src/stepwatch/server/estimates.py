"""Keeping each job's ETA fresh: after rank 0 reports, re-estimate from its recent progress samples."""

from __future__ import annotations

import dataclasses

from .store import Job, Store

__all__ = ["HORIZON_S", "refresh_estimate"]

HORIZON_S = 3600.0
"""How much recent progress history the estimate reads (the estimator picks its own window in it)."""


def refresh_estimate(store: Store, job: Job, now: float) -> Job:
    """Re-estimate the ETA of a job, store it with the job, and return the job with it."""
    samples = store.progress_samples(job.id, since=now - HORIZON_S)
    eta, rate = _estimate([(s.t, s.step) for s in samples], job.total_steps, now, reported_eta=job.reported_eta)
    store.set_estimate(job.id, eta, rate, now)
    return dataclasses.replace(job, eta_seconds=eta, eta_rate=rate, eta_at=now)


def _estimate(
    samples: list[tuple[float, int]], total: int | None, now: float, reported_eta: float | None = None
) -> tuple[float | None, float | None]:
    """Placeholder until analysis.eta lands: the rate over the last ten minutes."""
    recent = [(t, s) for t, s in samples if t >= now - 600]
    if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
        return reported_eta, None
    rate = (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])
    if total is None or rate <= 0:
        return reported_eta, rate
    return max(total - recent[-1][1], 0) / rate, rate
