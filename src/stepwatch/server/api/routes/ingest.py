"""Ingest's routes: the native report endpoint and the Kubeflow Trainer status endpoint (KEP-2779).

They parse, authorise and answer; the report's trip itself (write, estimates, health, policies,
publish) is the ingest service's (:mod:`...ingest.service`).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ....protocol import Command, ProtocolError, Report, ReportResponse, TrainerStatus
from ...ingest.service import ingest_report, ingest_status
from ...services import Services
from ...store import Job, MetricLimitError
from ..direct import Receive, Scope, Send, direct, first_headers, send_json
from ..errors import ApiError
from ..request import bearer_of, decode_json, read_body, receive_body, require_writer, services, writer_of
from .pod_tokens import job_for_pod, pod_bearer

__all__ = ["routes"]


@direct
async def report(scope: Scope, receive: Receive, send: Send) -> None:
    """``POST /api/v1/namespaces/{namespace}/jobs/{name}/reports``: one rank's report.

    A direct endpoint (:mod:`..direct`): every rank of every job calls it every 2 s."""
    state, params = scope["app"].state, scope["path_params"]
    svc: Services = state.services
    head = first_headers(scope, _REPORT_HEADERS)
    token = bearer_of(head[b"authorization"].decode("latin-1")) if b"authorization" in head else None
    job = await writer_of(svc.store, params["namespace"], params["name"], token, hide=state.auth.enabled)
    _not_held_back(svc, job)
    declared = head[b"content-length"].decode("latin-1") if b"content-length" in head else None
    data = decode_json(await receive_body(receive, declared, state.settings.body_timeout_s))
    try:
        parsed = Report.from_dict(data)
    except ProtocolError as exc:
        raise ApiError(422, exc.message, exc.field or None) from None
    try:
        done = await ingest_report(svc, job, parsed)
    except MetricLimitError as exc:
        raise _over_limit(svc, exc) from None
    svc.stats["duplicates" if done.duplicate else "reports"] += 1
    await send_json(send, _answer(parsed.seq, done.commands))


_REPORT_HEADERS = frozenset({b"authorization", b"content-length"})


def _answer(seq: int, commands: tuple[Command, ...]) -> dict[str, Any]:
    """``ReportResponse(accepted_seq=seq, commands=commands).to_dict()``; the usual answer (no command pending)
    without making and checking the response (``seq`` was checked as the report was read)."""
    if commands:
        return ReportResponse(accepted_seq=seq, commands=commands).to_dict()
    return {"accepted_seq": seq, "commands": []}


async def trainer_status(request: Request) -> JSONResponse:
    """``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status``.

    Upstream's checks in upstream's order: the body's size (413), then who writes (403), then the job
    (for a pod token: registered here if the runner has not done it yet), then the body (422). The
    writer is the job's own token, or (when the server accepts them) a TrainJob pod's projected
    ServiceAccount token. A request without a status (``{}``) is answered 200 and changes nothing; a
    status replaces the last one whole (:func:`..ingest.service.ingest_status`); 200 echoes it.
    """
    namespace, name = request.path_params["namespace"], request.path_params["name"]
    body = await read_body(request)
    pod_token = pod_bearer(request)
    if pod_token is not None:
        job = await job_for_pod(request, namespace, name, pod_token)
    else:
        job = await require_writer(request, namespace, name, hide_missing=True)
    try:
        status = TrainerStatus.from_request(decode_json(body))
    except ProtocolError as exc:
        raise ApiError(422, exc.message, exc.field or None) from None
    if status is None:
        return JSONResponse({})  # upstream echoes the request it read: nothing
    svc = services(request)
    await ingest_status(svc, job, status, svc.clock())
    svc.stats["statuses"] += 1
    return JSONResponse(status.to_body())  # upstream echoes the payload


def _over_limit(svc: Services, exc: MetricLimitError) -> ApiError:
    """A report refused for the limit on metric names: 422, and its job's next reports held back."""
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


routes = [
    Route("/api/v1/namespaces/{namespace}/jobs/{name}/reports", report, methods=["POST"]),
    Route(
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status",
        trainer_status,
        methods=["POST"],
    ),
]
