"""Ingest: the native report endpoint and the Kubeflow Trainer status endpoint (KEP-2779)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ...protocol import ProtocolError, Report, ReportResponse, TrainerStatus
from ..errors import ApiError
from ..estimates import estimate_due, estimate_for_report
from ..store import IngestResult, Job
from ..views import job_view, json_float
from .common import authorize, blocking, read_json, require_job, services

__all__ = ["routes"]


async def report(request: Request) -> JSONResponse:
    """``POST /api/v1/namespaces/{namespace}/jobs/{name}/reports``: one rank's report."""
    job = await require_job(request, request.path_params["namespace"], request.path_params["name"])
    await authorize(request, job)
    data = await read_json(request)
    try:
        parsed = Report.from_dict(data)
    except ProtocolError as exc:
        raise ApiError(422, exc.message, exc.field or None) from None
    svc = services(request)
    now = svc.clock()
    estimate = None
    if parsed.identity.rank == 0 and parsed.progress.step is not None and estimate_due(job, now, parsed.progress.step):
        with_totals = (
            job if parsed.progress.total_steps is None else replace(job, total_steps=parsed.progress.total_steps)
        )
        estimate = await blocking(estimate_for_report, svc.store, with_totals, parsed.progress.step, now)
    result = await blocking(svc.store.ingest_report, job, parsed, now, estimate)
    svc.stats["duplicates" if result.duplicate else "reports"] += 1
    if not result.duplicate:
        await _after_ingest(request, job, result)
    answer = ReportResponse(accepted_seq=parsed.seq, commands=result.commands)
    return JSONResponse(answer.to_dict())


async def trainer_status(request: Request) -> JSONResponse:
    """``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status``."""
    job = await require_job(request, request.path_params["namespace"], request.path_params["name"])
    await authorize(request, job)
    data = await read_json(request)
    try:
        status = TrainerStatus.from_body(data)
    except ProtocolError as exc:
        raise ApiError(422, exc.message, exc.field or None) from None
    svc = services(request)
    result = await blocking(svc.store.ingest_status, job, status, svc.clock())
    if not result.duplicate and result.job.step is not None and estimate_due(job, svc.clock(), result.job.step):
        eta = await blocking(estimate_for_report, svc.store, result.job, result.job.step, svc.clock())
        await blocking(svc.store.set_estimate, result.job.id, eta[0], eta[1], svc.clock())
        result = replace(result, job=replace(result.job, eta_seconds=eta[0], eta_rate=eta[1], eta_at=svc.clock()))
    svc.stats["statuses"] += 1
    if not result.duplicate:
        await _after_ingest(request, job, result)
    return JSONResponse(status.to_body())  # upstream echoes the payload


async def _after_ingest(request: Request, before: Job, result: IngestResult) -> None:
    svc = services(request)
    job = result.job
    now = svc.clock()
    svc.live.publish("job", job.namespace, job.name, {"job": job_view(job, now)})
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
