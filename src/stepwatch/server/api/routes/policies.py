"""Policies through the API: a namespace's layer and a job's layer, each with the effective policy.

``PUT`` merges the body into the layer that stands (see :func:`~stepwatch.server.policies.model.merge_layer`:
a key given replaces that key, trigger by trigger under ``on``; ``null`` removes one); it replaces the
layer only when asked, by ``"replace": true`` in the body or ``?replace=true``; ``{}`` alone clears it.
Every answer carries the layer and the effective policy now in force.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ...ingest.service import review
from ...live.publish import publish_events
from ...policies import Policy, PolicyError, parse_policy
from ...policies.enforce import checkpoint_advice
from ...policies.model import merge_layer
from ...services import Services
from ...store import Job
from ...store.offload import blocking
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


_REPLACE = "replace"
"""The body key (and query parameter) that asks a ``PUT`` to replace the layer rather than merge into it."""


async def read_layer(svc: Services, request: Request, stands: dict[str, Any] | None) -> Policy:
    """The layer a ``PUT`` leaves: its body merged into the layer that ``stands``, or in its place when asked
    (``"replace": true`` in the body, ``?replace=true``) or when the body is ``{}``; 422 naming the field."""
    data = await read_json(request)
    replace = _flag(request.query_params.get(_REPLACE), f"?{_REPLACE}")
    if isinstance(data, dict) and _REPLACE in data:
        data = dict(data)
        replace = _flag(data.pop(_REPLACE), _REPLACE) or replace
    said = await read_policy(svc, data)  # the body checked as the user wrote it: errors name its fields
    if replace or not data:
        return said
    return await read_policy(svc, merge_layer(stands, data))


def _flag(value: object, where: str) -> bool:
    if value is None or value is False or value in ("", "false", "0"):
        return False
    if value is True or value in ("true", "1"):
        return True
    raise ApiError(422, f"{where}: must be true or false, got {value!r}", where.lstrip("?"))


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
    """``PUT /api/v1/namespaces/{namespace}/policy``: merge into the namespace's layer (replace when asked;
    ``{}`` clears it)."""
    svc = services(request)
    identity = await require(request, "editor", request.path_params["namespace"])
    namespace = check_name(request.path_params["namespace"], "namespace")
    stands = svc.policies.book.namespace(namespace)
    policy = await read_layer(svc, request, stands.to_dict() if stands is not None else None)
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
    """``PUT .../jobs/{name}/policy``: merge into the job's layer (replace when asked; ``{}`` clears it); it
    applies at once."""
    svc = services(request)
    identity = await require(request, "editor", request.path_params["namespace"])
    job = await require_job(request, request.path_params["namespace"], request.path_params["name"])
    policy = await read_layer(svc, request, job.policy)
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
