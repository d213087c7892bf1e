"""What follows an accepted report or upstream status, the same for every way in.

A native report (``POST .../reports``), an upstream Kubeflow status posted to the compatible endpoint,
and a TrainJob's ``status.trainerStatus`` that the Kubernetes runner observes all take the same steps
once the store has them: the ETA (from the recent progress samples kept in memory), the job's health,
its policy, and what the live stream publishes (the job, its new points, its state events).
:func:`apply_trainer_status` is the one way an upstream status enters: the route and the runner call it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..protocol import GpuReading, TrainerStatus
from . import health
from .estimates import HORIZON_S, estimate_due, estimate_from_samples
from .routes.common import Services, blocking
from .store import IngestResult, Job
from .store.base import FINAL_STATES
from .views import job_view, json_float

__all__ = ["after_ingest", "apply_trainer_status", "estimate", "review"]

_log = logging.getLogger("stepwatch.server")


async def apply_trainer_status(svc: Services, job: Job, status: TrainerStatus, now: float) -> Job:
    """Store one upstream ``trainerStatus`` of ``job`` and let it take effect; the job as it then stands.

    The status replaces the job's last one whole, as upstream's status server does (every reader shows
    it as posted); here it is also history (its numeric metrics), progress (``current_step``), and it
    refreshes stepwatch's own ETA, health and policy, and the live stream.
    """
    result = await blocking(svc.store.ingest_status, job, status, now)
    step = result.job.step
    if not result.duplicate and step is not None and estimate_due(job, now, step, svc.progress.count(job.id)):
        # the status is in the samples already: estimate from the ones before it, plus it
        eta = await estimate(svc, result.job, step, now, before=now)
        await blocking(svc.store.set_estimate, result.job.id, eta[0], eta[1], now)
        result = replace(result, job=replace(result.job, eta_seconds=eta[0], eta_rate=eta[1], eta_at=now))
    if result.duplicate:
        return result.job
    return await after_ingest(svc, job, result, 0, step, result.job.total_steps)


async def estimate(
    svc: Services, job: Job, step: int, now: float, before: float | None = None
) -> tuple[float | None, float | None]:
    """A job's ETA once ``step`` at ``now`` counts, from its recent samples (read from the store once)."""
    since = now - HORIZON_S
    if job.id not in svc.progress:
        svc.progress.load(job.id, await blocking(svc.store.progress_samples, job.id, since))
    samples = svc.progress.samples(job.id, since) or []
    if before is not None:
        samples = [s for s in samples if s[0] < before]
    return estimate_from_samples(job, samples, step, now)


async def after_ingest(
    svc: Services,
    before: Job,
    result: IngestResult,
    rank: int,
    step: int | None,
    total_steps: int | None,
    gpus: Sequence[GpuReading] = (),
    *,
    evaluating: float | None = None,
) -> Job:
    """Publish what a stored report changed, judge the job's health, let its policy act; the job as it stands.

    ``evaluating``: the seconds the reporting rank says it has been evaluating, ``None`` while it trains."""
    job = result.job
    now = svc.clock()
    if result.sample is not None:
        svc.progress.add(job.id, result.sample)
    if job.state in FINAL_STATES:
        svc.progress.forget(job.id)
    job, update = await health.assess(
        svc.health, svc.store, blocking, result, rank, step, total_steps, now, gpus, evaluating=evaluating
    )
    job = await review(svc, job, now)
    svc.live.publish("job", job.namespace, job.name, {"job": job_view(job, now, compact=True)})
    if result.new_points:
        points: dict[str, Any] = {
            w.name: {
                "step": w.last_step,
                "last": json_float(w.last),
                "min": w.min,
                "max": w.max,
                "mean": w.mean,
                "count": w.count,
                "nonfinite": w.nonfinite,
            }
            for w in result.new_points
        }
        svc.live.publish("points", job.namespace, job.name, {"attempt": job.attempt, "t": now, "points": points})
    if job.state != before.state:
        for event in await blocking(svc.store.events, job_id=job.id, after=0, limit=1000):
            if event.kind == job.state:
                svc.live.publish("event", job.namespace, job.name, _event_view(event))
    if update is not None:
        health.publish_event(update, svc.live, now)
    return job


async def review(svc: Services, job: Job, now: float) -> Job:
    """Let the job's policy act; a failure is logged and costs the request nothing (its data is stored)."""
    try:
        return await svc.policies.review(job, now)
    except Exception:
        _log.exception("the policy review of %s failed; its data is stored all the same", job.key)
        return job


def _event_view(event: Any) -> dict[str, Any]:
    return {"id": event.id, "t": event.t, "kind": event.kind, "message": event.message, "data": event.data}
