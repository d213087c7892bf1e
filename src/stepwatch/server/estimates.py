"""The ETA of a job, estimated when rank 0 reports, from its recent progress samples."""

from __future__ import annotations

from .analysis import estimate_eta
from .store import Job, Store

__all__ = ["ESTIMATE_EVERY_S", "HORIZON_S", "YOUNG_S", "estimate_due", "estimate_for_report"]

HORIZON_S = 1200.0
"""How much recent progress history the estimate reads: the estimator's 600 s of stepping, with room
for eval pauses (the ETA does not need more, and every report pays for what it reads)."""


ESTIMATE_EVERY_S = 10.0
"""How often a job's ETA is recomputed; in between, views count the last estimate down. Reading the
samples and estimating is most of an ingest's cost, and an ETA does not change much in 10 s."""


YOUNG_S = 120.0
"""A job's first two minutes of reports are all estimated."""


def estimate_due(job: Job, now: float, step: int | None) -> bool:
    """Whether the ETA of a job should be recomputed at a report of ``step``.

    Always for a job's first reports; then every :data:`ESTIMATE_EVERY_S`; in between only when the
    estimate is incomplete (no rate, or no ETA although the total is known) and the step moved —
    a stalled job's heartbeats do not pay for an estimate each.
    """
    if job.eta_at is None or job.state == "pending" or now - job.eta_at >= ESTIMATE_EVERY_S:
        return True
    if job.started_at is None or now - job.started_at < YOUNG_S:
        return True  # few samples: cheap to read, and each changes the estimate a lot
    incomplete = job.eta_rate is None or (job.eta_seconds is None and job.total_steps is not None)
    return incomplete and step != job.step


def estimate_for_report(store: Store, job: Job, step: int, now: float) -> tuple[float | None, float | None]:
    """(seconds left, steps per second) once this report's step is counted, to store with the report.

    A job's own ETA is preferred when it sends one on the native API (it knows its schedule). An ETA
    from an upstream Kubeflow client is the lifetime average (wrong for a resumed job, slow to see a
    warm-up end), so for those jobs it is used only until the recent rate is known.
    """
    samples = [(s.t, s.step) for s in store.progress_samples(job.id, since=now - HORIZON_S)]
    samples.append((now, step))
    reported = job.reported_eta if job.source != "kubeflow" else None
    estimate = estimate_eta(samples, job.total_steps, now=now, reported_eta=reported, reported_at=job.last_report_at)
    if estimate.method == "insufficient" and job.reported_eta is not None:
        estimate = estimate_eta(
            samples, job.total_steps, now=now, reported_eta=job.reported_eta, reported_at=job.last_report_at
        )
    return estimate.eta_seconds, estimate.rate
