"""The Kubeflow status endpoint's second way in: a TrainJob pod's projected ServiceAccount token.

Only when the server accepts them (``STEPWATCH_K8S_POD_TOKENS``); a stepwatch job token (no JWT) takes
the usual path, unchanged. The checks themselves are in ``runners.kubernetes.tokens``.
"""

from __future__ import annotations

import secrets

from starlette.requests import Request

from ....protocol import is_valid_name
from ...live.publish import publish_job
from ...runners.kubernetes.tokens import PodTokenError, looks_like_jwt
from ...store import Job
from ...store.offload import blocking
from ..errors import ApiError
from ..request import bearer_token, hash_token, services

__all__ = ["job_for_pod", "pod_bearer"]


def pod_bearer(request: Request) -> str | None:
    """The request's bearer token when it is a JWT and pod tokens are accepted; else ``None``."""
    if getattr(request.app.state, "pod_tokens", None) is None:
        return None
    token = bearer_token(request)
    return token if token is not None and looks_like_jwt(token) else None


async def job_for_pod(request: Request, namespace: str, name: str, token: str) -> Job:
    """The TrainJob's stepwatch job, once the token proves a pod of that TrainJob sent the request
    (403 otherwise, 429 over the rate limits); registered here when the runner has not yet."""
    if not (is_valid_name(namespace) and is_valid_name(name)):  # no TrainJob, no token for it: as upstream, 403
        raise ApiError(403, f"this token cannot write to job {namespace[:63]}/{name[:63]}")
    try:
        await request.app.state.pod_tokens.admit(namespace, name, token)
    except PodTokenError as exc:
        headers = {"Retry-After": str(int(exc.retry_after))} if exc.retry_after else None
        raise ApiError(exc.code, exc.message, headers=headers) from None
    svc = services(request)
    store = svc.store
    job = store.cached_job(namespace, name) or await blocking(store.job, namespace, name)
    if job is not None:
        return job
    try:
        job = await blocking(
            store.register,
            namespace,
            name,
            token_hash=hash_token(secrets.token_urlsafe(32)),
            now=svc.clock(),
            source="kubeflow",
        )
    except KeyError:  # registered meanwhile (the runner, another pod)
        found = await blocking(store.job, namespace, name)
        if found is None:
            raise ApiError(
                503, f"job {namespace}/{name} is being registered; try again", headers={"Retry-After": "1"}
            ) from None
        return found
    publish_job(svc.live, job, svc.clock())
    return job
