"""Access: who am I, API tokens (admins create, list and revoke them), and the audit log."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ....protocol import LIMITS
from ...store import AuditEntry
from ...store.offload import blocking
from ..auth import mint_token
from ..bodies import TOKEN_REQUEST, read_declared
from ..errors import ApiError
from ..request import authenticator, check_name, hash_token, identify, require, services

__all__ = ["routes"]


async def whoami(request: Request) -> JSONResponse:
    """``GET /api/v1/whoami``: the caller's identity and grants (the dashboard's login check)."""
    identity = await identify(request)
    return JSONResponse(
        {
            "who": identity.who,
            "auth": authenticator(request).mode,
            "token_id": identity.token_id,
            "expires_at": identity.expires_at,
            "grants": [
                {"role": g.role, "namespaces": sorted(g.namespaces) if g.namespaces is not None else ["*"]}
                for g in identity.grants
            ],
        }
    )


async def list_tokens(request: Request) -> JSONResponse:
    """``GET /api/v1/tokens``: every API token (never a secret); admins of every namespace only."""
    svc = services(request)
    await require(request, "admin")
    tokens = await blocking(svc.store.api_tokens)
    now = svc.clock()
    return JSONResponse({"items": [{**t.to_dict(), "valid": t.valid_at(now)} for t in tokens]})


async def create_token(request: Request) -> JSONResponse:
    """``POST /api/v1/tokens`` ``{"role", "namespaces": [...] or ["*"], "name", "expires_in": s, "reason"}``:
    a new token; its secret is in this answer only."""
    svc = services(request)
    identity = await require(request, "admin")
    said = await read_declared(request, TOKEN_REQUEST)
    now = svc.clock()
    expires_at = now + said["expires_in"] if said["expires_in"] is not None else None
    if not authenticator(request).enabled:
        raise ApiError(
            409,
            "this server runs without authentication, where anyone on this machine is its admin: a token made "
            "here would let them in after a restart with --auth tokens. Make tokens with --auth on, or straight "
            "into the database: stepwatch token create --db PATH (see docs/auth.md)",
        )
    try:
        token, secret = mint_token(
            said["role"], said["namespaces"], said["name"], now, expires_at=expires_at, by=identity.who
        )
    except ValueError as exc:
        raise ApiError(422, str(exc)) from None
    entry = AuditEntry(now, identity.who, "token_created", "", "", said["reason"], _token_data(token.to_dict()))
    await blocking(svc.store.create_token, token, hash_token(secret), entry)
    return JSONResponse({"token": token.to_dict(), "secret": secret}, status_code=201)


async def revoke_token(request: Request) -> JSONResponse:
    """``DELETE /api/v1/tokens/{id}?reason=``: revoke a token; refused at once, on every replica."""
    svc = services(request)
    identity = await require(request, "admin")
    token_id = request.path_params["id"]
    reason = _reason(request.query_params.get("reason", ""))
    entry = AuditEntry(svc.clock(), identity.who, "token_revoked", "", "", reason, {"id": token_id[:64]})
    token = await blocking(svc.store.revoke_token, token_id, svc.clock(), entry)
    if token is None:
        raise ApiError(404, f"no API token with id {token_id[:64]!r}")
    return JSONResponse(token.to_dict())


async def audit(request: Request) -> JSONResponse:
    """``GET /api/v1/audit?namespace=&job=&after=&limit=``: who did what and why, oldest first. Viewers
    see their namespaces' entries; the server-wide ones (token changes) are for admins of every namespace."""
    svc = services(request)
    q = request.query_params
    namespace = q.get("namespace") or None
    job = q.get("job") or None
    if namespace is not None:
        identity = await require(request, "viewer", namespace)
        check_name(namespace, "namespace")
        namespaces: tuple[str, ...] | None = (namespace,)
    else:
        identity = await identify(request)
        namespaces = identity.readable()
    if job is not None:
        check_name(job, "job")
    after = _int(q.get("after"), "after", 0, 2**62) or 0
    limit = _int(q.get("limit"), "limit", 1, 1000) or 100
    entries = await blocking(
        svc.store.audit_log,
        namespaces=namespaces,
        name=job,
        include_global=namespace is None and job is None and identity.allows("admin"),
        after=after,
        limit=limit,
    )
    return JSONResponse({"items": [e.to_dict() for e in entries]})


def _token_data(view: dict[str, Any]) -> dict[str, Any]:
    return {k: view[k] for k in ("id", "name", "role", "namespaces", "expires_at")}


def _reason(value: Any) -> str:
    if not isinstance(value, str) or len(value) > LIMITS.max_reason_length:
        raise ApiError(422, f"reason must be a string of at most {LIMITS.max_reason_length} characters", "reason")
    return value


def _int(raw: str | None, key: str, low: int, high: int) -> int | None:
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{key} must be an integer, got {raw[:40]!r}", key) from None
    if not low <= value <= high:
        raise ApiError(400, f"{key} must be between {low} and {high}", key)
    return value


routes = [
    Route("/api/v1/whoami", whoami, methods=["GET"]),
    Route("/api/v1/tokens", list_tokens, methods=["GET"]),
    Route("/api/v1/tokens", create_token, methods=["POST"]),
    Route("/api/v1/tokens/{id}", revoke_token, methods=["DELETE"]),
    Route("/api/v1/audit", audit, methods=["GET"]),
]
