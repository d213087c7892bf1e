"""Keeping each job's ETA fresh: after rank 0 reports, re-estimate from its recent progress samples."""

from __future__ import annotations

import dataclasses

from .analysis import estimate_eta
from .store import Job, Store

__all__ = ["HORIZON_S", "refresh_estimate"]

HORIZON_S = 3600.0
"""How much recent progress history the estimate reads (the estimator picks its own window in it)."""


def refresh_estimate(store: Store, job: Job, now: float) -> Job:
    """Re-estimate the ETA of a job, store it with the job, and return the job with it.

    A job's own ETA is preferred when it sends one on the native API (it knows its schedule). An ETA
    from an upstream Kubeflow client is the lifetime average (wrong for a resumed job, slow to see a
    warm-up end), so for those jobs it is used only until the recent rate is known.
    """
    samples = [(s.t, s.step) for s in store.progress_samples(job.id, since=now - HORIZON_S)]
    reported = job.reported_eta if job.source != "kubeflow" else None
    estimate = estimate_eta(samples, job.total_steps, now=now, reported_eta=reported, reported_at=job.last_report_at)
    if estimate.method == "insufficient" and job.reported_eta is not None:
        estimate = estimate_eta(
            samples, job.total_steps, now=now, reported_eta=job.reported_eta, reported_at=job.last_report_at
        )
    store.set_estimate(job.id, estimate.eta_seconds, estimate.rate, now)
    return dataclasses.replace(job, eta_seconds=estimate.eta_seconds, eta_rate=estimate.rate, eta_at=now)
