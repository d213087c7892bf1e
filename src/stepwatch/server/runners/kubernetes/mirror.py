"""What the runner does with an upstream status it reads off a TrainJob: the same as the Kubeflow status
endpoint does with one a pod posts (store, estimate, health, policy, live), so that a run shows the same
progress, ETA and metrics whether its pods post to stepwatch (endpoint mode) or to upstream's status
server (observer mode).

:func:`ingest_upstream_status` is the one place the runner reaches into the endpoint's ingest path.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

from ....protocol import TrainerStatus
from ...estimates import estimate_due
from ...routes.common import Services, blocking
from ...routes.ingest import _after_ingest, _estimate
from ...store import Job

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["ingest_upstream_status"]


async def ingest_upstream_status(svc: Services, job: Job, status: TrainerStatus, now: float) -> Job:
    """Store ``status`` for ``job`` as the Kubeflow status endpoint stores a posted one; the job after it.

    The steps after parsing of ``routes.ingest.trainer_status`` (which reads its services from the
    request: a stand-in request that carries only them is passed)."""
    result = await blocking(svc.store.ingest_status, job, status, now)
    if (
        not result.duplicate
        and result.job.step is not None
        and estimate_due(job, now, result.job.step, svc.progress.count(job.id))
    ):
        eta = await _estimate(svc, result.job, result.job.step, now, before=now)
        await blocking(svc.store.set_estimate, result.job.id, eta[0], eta[1], now)
        result = replace(result, job=replace(result.job, eta_seconds=eta[0], eta_rate=eta[1], eta_at=now))
    svc.stats["statuses"] += 1
    if result.duplicate:
        return result.job
    carrier = cast("Request", SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(services=svc))))
    return await _after_ingest(carrier, job, result, 0, result.job.step, result.job.total_steps)
