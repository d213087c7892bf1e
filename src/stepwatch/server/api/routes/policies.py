"""Policies through the API: a namespace's layer and a job's layer, each with the effective policy."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ...ingest.publish import publish_events
from ...ingest.service import review
from ...policies import Policy, PolicyError, parse_policy
from ...policies.enforce import checkpoint_advice
from ...services import Services, blocking
from ...store import Job
from ..errors import ApiError
from ..request import check_name, read_json, require, require_job, services

__all__ = ["policy_view", "read_policy", "routes"]


async def read_policy(svc: Services, data: Any, prefix: str = "") -> Policy:
    """A policy layer from a request body (its notification targets checked, their names resolved in a
    worker thread), or 422 naming the field (``prefix``: where the policy sits in the body)."""
    try:
        policy = parse_policy(data)
        if policy.notify:
            await blocking(svc.policies.book.check_targets, policy.notify)
        return policy
    except PolicyError as exc:
        raise ApiError(422, f"{prefix}{exc}", f"{prefix}{exc.field}") from None


def policy_view(svc: Services, job: Job) -> dict[str, Any]:
    """A job's layer, its effective policy (with the layer that set each action) and what it did."""
    effective = svc.policies.book.effective(job)
    advice = checkpoint_advice(effective, job, svc.clock())
    return {
        "job": job.policy,
        "effective": effective.to_dict(),
        "set_by": dict(sorted(effective.origin.items())),
        "fired": job.policy_fired,
        "checkpoint": advice.to_dict() if advice is not None else None,
    }


async def get_namespace_policy(request: Request) -> JSONResponse:
    """``GET /api/v1/namespaces/{namespace}/policy``: the namespace's layer and the server's under it."""
    svc = services(request)
    await require(request, "viewer", request.path_params["namespace"])
    namespace = check_name(request.path_params["namespace"], "namespace")
    return JSONResponse(_namespace_view(svc, namespace))


async def put_namespace_policy(request: Request) -> JSONResponse:
    """``PUT /api/v1/namespaces/{namespace}/policy``: replace the namespace's layer (``{}`` clears it)."""
    svc = services(request)
    identity = await require(request, "editor", request.path_params["namespace"])
    namespace = check_name(request.path_params["namespace"], "namespace")
    policy = await read_policy(svc, await read_json(request))
    stored = policy.to_dict() or None
    await blocking(svc.store.set_namespace_policy, namespace, stored, svc.clock(), identity.who)
    svc.policies.book.set_namespace(namespace, policy if stored else None)
    return JSONResponse(_namespace_view(svc, namespace))


async def get_job_policy(request: Request) -> JSONResponse:
    """``GET .../jobs/{name}/policy``."""
    svc = services(request)
    await require(request, "viewer", request.path_params["namespace"])
    job = await require_job(request, request.path_params["namespace"], request.path_params["name"])
    return JSONResponse(policy_view(svc, job))


async def put_job_policy(request: Request) -> JSONResponse:
    """``PUT .../jobs/{name}/policy``: replace the job's layer; it applies at once."""
    svc = services(request)
    identity = await require(request, "editor", request.path_params["namespace"])
    job = await require_job(request, request.path_params["namespace"], request.path_params["name"])
    policy = await read_policy(svc, await read_json(request))
    now = svc.clock()
    said = policy.to_dict()
    message = "policy set: " + (", ".join(f"{k} {v}" for k, v in policy.on.items()) or "no actions")
    job, events = await blocking(svc.store.with_events, svc.store.set_policy, job.id, said, now, message, identity.who)
    svc.health.forget(job.id)  # the metric it follows may have changed: replayed on the next report
    publish_events(svc.live, events)
    job = await review(svc, job, now)
    return JSONResponse(policy_view(svc, job))


def _namespace_view(svc: Services, namespace: str) -> dict[str, Any]:
    book = svc.policies.book
    layer = book.namespace(namespace)
    effective = layer.over(book.server, "namespace") if layer is not None else book.server
    return {
        "namespace": namespace,
        "policy": layer.to_dict() if layer is not None else {},
        "server": book.server.to_dict(),
        "effective": effective.to_dict(),
    }


routes = [
    Route("/api/v1/namespaces/{namespace}/policy", get_namespace_policy, methods=["GET"]),
    Route("/api/v1/namespaces/{namespace}/policy", put_namespace_policy, methods=["PUT"]),
    Route("/api/v1/namespaces/{namespace}/jobs/{name}/policy", get_job_policy, methods=["GET"]),
    Route("/api/v1/namespaces/{namespace}/jobs/{name}/policy", put_job_policy, methods=["PUT"]),
]
