"""Ingest: the native report endpoint and the Kubeflow Trainer status endpoint (KEP-2779)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ...protocol import GpuReading, ProtocolError, Report, ReportResponse, TrainerStatus
from .. import health
from ..errors import ApiError
from ..estimates import HORIZON_S, estimate_due, estimate_from_samples
from ..responses import FastJSONResponse
from ..store import IngestResult, Job, MetricLimitError, PendingReport
from ..store.base import FINAL_STATES
from ..store.job_updates import check_metric_names
from ..views import job_view, json_float
from .common import Services, authorize, blocking, read_json, require_job, services
from .pod_tokens import job_for_pod, pod_bearer

__all__ = ["review", "routes"]

_log = logging.getLogger("stepwatch.server")


async def report(request: Request) -> JSONResponse:
    """``POST /api/v1/namespaces/{namespace}/jobs/{name}/reports``: one rank's report."""
    job = await require_job(request, request.path_params["namespace"], request.path_params["name"])
    await authorize(request, job)
    svc = services(request)
    _not_held_back(svc, job)
    data = await read_json(request)
    try:
        parsed = Report.from_dict(data)
    except ProtocolError as exc:
        raise ApiError(422, exc.message, exc.field or None) from None
    _within_limit(svc, job, (w.name for w in parsed.metrics))
    now = svc.clock()
    estimate = None
    step = parsed.progress.step
    if parsed.identity.rank == 0 and step is not None and estimate_due(job, now, step, svc.progress.count(job.id)):
        with_totals = (
            job if parsed.progress.total_steps is None else replace(job, total_steps=parsed.progress.total_steps)
        )
        estimate = await _estimate(svc, with_totals, step, now)
    try:
        result = await svc.writer.write(PendingReport(job, parsed, now, estimate))
    except MetricLimitError as exc:  # the store counts again under the job's lock (replicas, concurrent reports)
        raise _over_limit(svc, exc) from None
    svc.stats["duplicates" if result.duplicate else "reports"] += 1
    commands = result.commands
    if not result.duplicate:
        after = await _after_ingest(
            request, job, result, parsed.identity.rank, step, parsed.progress.total_steps, parsed.gpus
        )
        if after.policy_fired != result.job.policy_fired:  # its policy queued commands: they go with this answer
            commands = tuple(await blocking(svc.store.pending_commands, job.id))
    answer = ReportResponse(accepted_seq=parsed.seq, commands=commands)
    return FastJSONResponse(answer.to_dict())


async def trainer_status(request: Request) -> JSONResponse:
    """``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status``.

    The job's own token, or (when the server accepts them) a TrainJob pod's projected ServiceAccount
    token: then the job is the TrainJob's, registered here if the runner has not done it yet.
    """
    namespace, name = request.path_params["namespace"], request.path_params["name"]
    pod_token = pod_bearer(request)
    if pod_token is not None:
        job = await job_for_pod(request, namespace, name, pod_token)
    else:
        job = await require_job(request, namespace, name)
        await authorize(request, job)
    data = await read_json(request)
    try:
        status = TrainerStatus.from_body(data)
    except ProtocolError as exc:
        raise ApiError(422, exc.message, exc.field or None) from None
    svc = services(request)
    now = svc.clock()
    result = await blocking(svc.store.ingest_status, job, status, now)
    if (
        not result.duplicate
        and result.job.step is not None
        and estimate_due(job, now, result.job.step, svc.progress.count(job.id))
    ):
        # the status is in the samples already: estimate from the ones before it, plus it
        eta = await _estimate(svc, result.job, result.job.step, now, before=now)
        await blocking(svc.store.set_estimate, result.job.id, eta[0], eta[1], now)
        result = replace(result, job=replace(result.job, eta_seconds=eta[0], eta_rate=eta[1], eta_at=now))
    svc.stats["statuses"] += 1
    if not result.duplicate:
        await _after_ingest(request, job, result, 0, result.job.step, result.job.total_steps)
    return JSONResponse(status.to_body())  # upstream echoes the payload


def _within_limit(svc: Services, job: Job, names: Iterable[str]) -> None:
    """Refuse at once a report over the limit on metric names, by the job as the route found it: it may
    hold fewer names than the store (never more), so this refuses nothing the store would take, and
    spares the writer the reports it would refuse."""
    try:
        check_metric_names(job, job.last_metrics, names, svc.store.max_metric_names)
    except MetricLimitError as exc:
        raise _over_limit(svc, exc) from None


def _over_limit(svc: Services, exc: MetricLimitError) -> ApiError:
    svc.stats["over_limit"] += 1
    held = svc.over_limit_until
    if len(held) > 10_000:  # bounded: forgetting only lets a job's next report be read
        held.clear()
    held[exc.job_id] = svc.clock() + HOLD_BACK_S
    return ApiError(422, str(exc), "metrics")


HOLD_BACK_S = 1.0
"""After a report refused for the limit on metric names, the job's reports are answered 429
(``Retry-After: 1``) for this long without reading them: the report core keeps them and retries."""


def _not_held_back(svc: Services, job: Job) -> None:
    until = svc.over_limit_until.get(job.id)
    if until is None:
        return
    if svc.clock() < until:
        raise ApiError(
            429,
            f"job {job.key}'s last report was refused for the limit on metric names; retry after 1 s",
            headers={"Retry-After": "1"},
        )
    del svc.over_limit_until[job.id]


async def _estimate(
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


async def _after_ingest(
    request: Request,
    before: Job,
    result: IngestResult,
    rank: int,
    step: int | None,
    total_steps: int | None,
    gpus: Sequence[GpuReading] = (),
) -> Job:
    """Publish what a stored report changed, judge the job's health, let its policy act; the job as it stands."""
    svc = services(request)
    job = result.job
    now = svc.clock()
    if result.sample is not None:
        svc.progress.add(job.id, result.sample)
    if job.state in FINAL_STATES:
        svc.progress.forget(job.id)
    job, update = await health.assess(svc.health, svc.store, blocking, result, rank, step, total_steps, now, gpus)
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


routes = [
    Route("/api/v1/namespaces/{namespace}/jobs/{name}/reports", report, methods=["POST"]),
    Route(
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status",
        trainer_status,
        methods=["POST"],
    ),
]
