"""Jobs: register, list, get, history, events, commands, and the runner's record of how a job ended."""

from __future__ import annotations

import math
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ....protocol import ENDED_STATES, LIMITS, is_valid_metric_name
from ...ingest.service import review
from ...live.publish import publish_events, publish_job
from ...store import HEALTH_STATES, JOB_STATES, SORT_KEYS, Job, JobFilter
from ...store.offload import blocking
from ...views.history import downsampled
from ...views.serialisers import event_view, job_view
from ..bodies import COMMAND_REQUEST, REGISTRATION, STATE_CHANGE, read_declared
from ..errors import ApiError
from ..request import check_name, hash_token, identify, require, require_job, require_writer, services
from ..responses import FastJSONResponse
from .policies import policy_view, read_policy

__all__ = ["routes"]

MAX_LIST = 10_000
MAX_POINTS = 10_000
MAX_OFFSET = 1_000_000_000
MAX_ATTEMPT = 1_000_000_000
MAX_EVENT_ID = 2**62


async def register(request: Request) -> JSONResponse:
    """``POST /api/v1/namespaces/{namespace}/jobs``: a new job (or a new attempt) and its write token."""
    await require(request, "editor", request.path_params["namespace"])
    namespace = check_name(request.path_params["namespace"], "namespace")
    svc = services(request)
    fields = await read_declared(request, REGISTRATION)
    name, params = fields.pop("name"), fields.pop("params")
    fields["gpu_type"] = (fields["gpu_type"] or "").lower()
    if fields["policy"] is not None:  # checked by its declaration; its notification targets here
        fields["policy"] = (await read_policy(svc, fields["policy"], "policy.")).to_dict()
    if not fields["gpu_hour_cost"] and fields["gpus"]:  # the server's default price for its namespace and GPU type
        fields["gpu_hour_cost"] = svc.prices.price(namespace, fields["gpu_type"])
    token = secrets.token_urlsafe(32)
    try:
        job = await blocking(
            svc.store.register, namespace, name, token_hash=hash_token(token), now=svc.clock(), params=params, **fields
        )
    except KeyError:
        current = await blocking(svc.store.job, namespace, name)
        raise ApiError(
            409,
            f"job {namespace}/{name} is {current.state if current else 'live'} (attempt "
            f"{current.attempt if current else '?'}): stop it or pick another name; a new attempt starts once it "
            "has ended",
            "name",
        ) from None
    now = svc.clock()
    publish_job(svc.live, job, now)
    return JSONResponse({"job": job_view(job, now), "token": token}, status_code=201)


async def list_jobs(request: Request) -> JSONResponse:
    """``GET /api/v1/jobs`` and ``GET /api/v1/namespaces/{namespace}/jobs``: filter, sort, page.

    ``form=columns`` gives the same compact views as columns (``{"columns": {name: [values]}, "total"}``,
    see ``views.LIST_COLUMNS``): the SDK's form, 40% of the bytes and far quicker to decode.
    """
    q = request.query_params
    namespace = request.path_params.get("namespace") or q.get("namespace") or None
    readable: tuple[str, ...] | None = None
    if namespace is not None:
        await require(request, "viewer", namespace)
        check_name(namespace, "namespace")
    else:
        readable = (await identify(request)).readable()
    states = [s for s in q.get("state", "").split(",") if s]
    for state in states:
        if state not in JOB_STATES:
            raise ApiError(400, f"state must be among {', '.join(JOB_STATES)}, got {state[:40]!r}", "state")
    healths = [h for h in q.get("health", "").split(",") if h]
    for health in healths:
        if health not in HEALTH_STATES:
            raise ApiError(400, f"health must be among {', '.join(HEALTH_STATES)}, got {health[:40]!r}", "health")
    raw_sort = q.get("sort") or "-updated"
    descending = raw_sort.startswith("-")
    sort = raw_sort.removeprefix("-")
    if sort not in SORT_KEYS:
        raise ApiError(400, f"sort must be one of {', '.join(SORT_KEYS)}, '-' first for descending", "sort")
    full = q.get("full", "") in ("1", "true", "yes")
    form = q.get("form") or "items"
    if form not in ("items", "columns"):
        raise ApiError(400, f"form must be items or columns, got {form[:40]!r}", "form")
    if form == "columns" and full:
        raise ApiError(400, "full views come as items only: leave out full, or form=columns", "form")
    where = JobFilter(
        namespace=namespace,
        namespaces=readable,
        state=states,
        health=healths,
        text=(q.get("text") or None),
        min_progress=_query_number(q.get("min_progress"), "min_progress", 0, 100),
        max_progress=_query_number(q.get("max_progress"), "max_progress", 0, 100),
        all_attempts=q.get("all_attempts", "") in ("1", "true", "yes"),
        sort=sort,
        descending=descending,
        limit=int(_query_number(q.get("limit"), "limit", 1, MAX_LIST) or 1000),
        offset=int(_query_number(q.get("offset"), "offset", 0, MAX_OFFSET) or 0),
    )
    svc = services(request)
    jobs = await blocking(svc.store.jobs, where)
    total = await blocking(svc.store.count_jobs, where)
    now = svc.clock()
    if form == "columns":
        return FastJSONResponse({"columns": svc.views.columns(jobs, now), "total": total})
    items = [job_view(j, now) for j in jobs] if full else [svc.views.view(j, now) for j in jobs]
    return FastJSONResponse({"items": items, "total": total})


async def get_job(request: Request) -> JSONResponse:
    """``GET /api/v1/namespaces/{namespace}/jobs/{name}`` (``?attempt=N`` for an earlier attempt)."""
    svc = services(request)
    job = await _attempt(request)
    view = job_view(job, svc.clock())
    view["metric_names"] = await blocking(svc.store.metric_names, job.id)
    view["pending_commands"] = [c.to_dict() for c in await blocking(svc.store.pending_commands, job.id)]
    now = svc.clock()
    view["policy"] = policy_view(svc, job)
    view["ranks"] = [
        {
            "rank": r.rank,
            "step": r.step,
            "step_time": r.step_time,
            "host": r.host,
            "pid": r.pid,
            "last_report_age_seconds": max(now - r.last_seen_at, 0.0),
            "gpus": [g.to_dict() for g in r.gpus],
        }
        for r in await blocking(svc.store.ranks, job.id)
    ]
    return JSONResponse(view)


async def _attempt(request: Request) -> Job:
    """The job of the path, at the attempt the query asks for (default: the latest); viewers only."""
    svc = services(request)
    await require(request, "viewer", request.path_params["namespace"])
    job = await require_job(request, request.path_params["namespace"], request.path_params["name"])
    attempt = request.query_params.get("attempt")
    if attempt is None:
        return job
    number = int(_query_number(attempt, "attempt", 1, MAX_ATTEMPT) or 1)
    found = await blocking(svc.store.job, job.namespace, job.name, number)
    if found is None:
        raise ApiError(404, f"job {job.key} has no attempt {number} (latest: {job.attempt})", "attempt")
    return found


async def history(request: Request) -> JSONResponse:
    """``GET .../jobs/{name}/history?metrics=loss,eval_loss&max_points=1000&attempt=N``: downsampled series."""
    svc = services(request)
    job = await _attempt(request)
    q = request.query_params
    max_points = int(_query_number(q.get("max_points"), "max_points", 2, MAX_POINTS) or 1000)
    names = [n for n in q.get("metrics", "").split(",") if n]
    for name in names:
        if not is_valid_metric_name(name):
            raise ApiError(400, f"metric names are 1-64 printable characters, got {name[:80]!r}", "metrics")
    if not names:
        names = await blocking(svc.store.metric_names, job.id)
    series: dict[str, Any] = {}
    for name in names[: LIMITS.max_metrics_per_report]:
        columns = await blocking(svc.store.history_columns, job.id, name, max_points)
        series[name] = await blocking(downsampled, columns, max_points)
    return FastJSONResponse({"namespace": job.namespace, "name": job.name, "attempt": job.attempt, "metrics": series})


async def events(request: Request) -> JSONResponse:
    """``GET .../jobs/{name}/events?after=ID&limit=N&attempt=N``: what happened to a job, oldest first."""
    svc = services(request)
    job = await _attempt(request)
    q = request.query_params
    after = int(_query_number(q.get("after"), "after", 0, MAX_EVENT_ID) or 0)
    limit = int(_query_number(q.get("limit"), "limit", 1, 1000) or 100)
    found = await blocking(svc.store.events, job_id=job.id, after=after, limit=limit)
    return JSONResponse({"items": [event_view(e) for e in found]})


async def add_command(request: Request) -> JSONResponse:
    """``POST .../jobs/{name}/commands`` ``{"kind": "stop"|"checkpoint", "reason": "..."}``."""
    svc = services(request)
    identity = await require(request, "editor", request.path_params["namespace"])
    job = await require_job(request, request.path_params["namespace"], request.path_params["name"])
    said = await read_declared(request, COMMAND_REQUEST)
    kind, reason = said["kind"], said["reason"]
    if job.state in ENDED_STATES:
        raise ApiError(409, f"job {job.key} has already {job.state}: there is nothing to {kind}", "kind")
    command, events = await blocking(
        svc.store.with_events, svc.store.add_command, job, kind, reason, svc.clock(), identity.who
    )
    publish_events(svc.live, events)
    return JSONResponse(command.to_dict(), status_code=201)


async def list_commands(request: Request) -> JSONResponse:
    """``GET .../jobs/{name}/commands``: commands the job has not acknowledged yet."""
    svc = services(request)
    await require(request, "viewer", request.path_params["namespace"])
    job = await require_job(request, request.path_params["namespace"], request.path_params["name"])
    return JSONResponse({"items": [c.to_dict() for c in await blocking(svc.store.pending_commands, job.id)]})


async def set_state(request: Request) -> JSONResponse:
    """``POST .../jobs/{name}/state`` (job token): the runner records how the process ended."""
    svc = services(request)
    job = await require_writer(request, request.path_params["namespace"], request.path_params["name"])
    said = await read_declared(request, STATE_CHANGE)
    state, exit_code, reason = said["state"], said["exit_code"], said["reason"]
    job, events = await blocking(svc.store.with_events, svc.store.set_state, job, state, svc.clock(), reason, exit_code)
    job = await review(svc, job, svc.clock())
    now = svc.clock()
    publish_job(svc.live, job, now)
    publish_events(svc.live, events)
    return JSONResponse(job_view(job, now))


# ----------------------------------------------------------------------------------------- queries


def _query_number(raw: str | None, key: str, low: float, high: float) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(400, f"{key} must be a number, got {raw[:40]!r}", key) from None
    if not (low <= value <= high) or math.isnan(value):
        raise ApiError(400, f"{key} must be between {low:g} and {high:g}, got {raw[:40]!r}", key)
    return value


routes = [
    Route("/api/v1/jobs", list_jobs, methods=["GET"]),
    Route("/api/v1/namespaces/{namespace}/jobs", list_jobs, methods=["GET"]),
    Route("/api/v1/namespaces/{namespace}/jobs", register, methods=["POST"]),
    Route("/api/v1/namespaces/{namespace}/jobs/{name}", get_job, methods=["GET"]),
    Route("/api/v1/namespaces/{namespace}/jobs/{name}/history", history, methods=["GET"]),
    Route("/api/v1/namespaces/{namespace}/jobs/{name}/events", events, methods=["GET"]),
    Route("/api/v1/namespaces/{namespace}/jobs/{name}/commands", add_command, methods=["POST"]),
    Route("/api/v1/namespaces/{namespace}/jobs/{name}/commands", list_commands, methods=["GET"]),
    Route("/api/v1/namespaces/{namespace}/jobs/{name}/state", set_state, methods=["POST"]),
]
