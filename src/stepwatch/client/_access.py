"""Access through the SDK: who am I, API tokens (admins), and the audit log; their models and calls.

The calls are operations (see ``_core``), bound to :class:`~stepwatch.client.Client` and
:class:`~stepwatch.client.AsyncClient` like every other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._core import Config, Operation, Request, read_json
from ._parse import as_dict, as_list, opt_bool, opt_float, opt_str, req_int, req_str

__all__ = ["ApiToken", "AuditEntry", "audit", "create_token", "revoke_token", "tokens", "whoami"]


@dataclass(frozen=True)
class ApiToken:
    """An API token as the server shows it (never its secret)."""

    id: str
    name: str
    role: str
    namespaces: tuple[str, ...]
    """Where it is valid; ``("*",)`` for every namespace."""
    created_at: float | None
    created_by: str
    expires_at: float | None
    revoked_at: float | None
    valid: bool | None = None
    """Neither revoked nor expired (in lists)."""

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "token") -> ApiToken:
        """Read a token of the API."""
        return cls(
            id=req_str(obj, "id", where),
            name=req_str(obj, "name", where),
            role=req_str(obj, "role", where),
            namespaces=tuple(str(n) for n in as_list(obj.get("namespaces"), f"{where}.namespaces")),
            created_at=opt_float(obj, "created_at", where),
            created_by=opt_str(obj, "created_by", where) or "",
            expires_at=opt_float(obj, "expires_at", where),
            revoked_at=opt_float(obj, "revoked_at", where),
            valid=opt_bool(obj, "valid", where),
        )


@dataclass(frozen=True)
class AuditEntry:
    """One action: ``actor`` did ``action`` (on ``namespace``/``name``) because ``reason``."""

    id: int
    t: float | None
    actor: str
    action: str
    namespace: str | None
    name: str | None
    reason: str
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "audit") -> AuditEntry:
        """Read an audit entry of the API."""
        data = obj.get("data")
        return cls(
            id=req_int(obj, "id", where),
            t=opt_float(obj, "t", where),
            actor=req_str(obj, "actor", where),
            action=req_str(obj, "action", where),
            namespace=opt_str(obj, "namespace", where),
            name=opt_str(obj, "name", where),
            reason=opt_str(obj, "reason", where) or "",
            data=as_dict(data, f"{where}.data") if isinstance(data, dict) else {},
        )


def whoami(config: Config, /) -> Operation[dict[str, Any]]:
    """Who the server takes this client for: ``{"who", "auth", "token_id", "expires_at", "grants"}``."""
    response = yield Request("GET", "/api/v1/whoami")
    return as_dict(read_json(response), "whoami")


def tokens(config: Config, /) -> Operation[list[ApiToken]]:
    """Every API token, oldest first (an admin of every namespace only)."""
    response = yield Request("GET", "/api/v1/tokens")
    items = as_list(as_dict(read_json(response), "tokens").get("items"), "tokens.items")
    return [ApiToken.from_dict(as_dict(t, f"tokens.items[{i}]"), f"tokens.items[{i}]") for i, t in enumerate(items)]


def create_token(
    config: Config,
    /,
    role: str,
    namespaces: Sequence[str],
    name: str,
    *,
    expires_in: float | None = None,
    reason: str = "",
) -> Operation[tuple[ApiToken, str]]:
    """Create an API token with ``role`` (``viewer``, ``editor``, ``admin``) over ``namespaces`` (``["*"]``:
    all); returns it and its secret, which the server shows this once. Never retried."""
    body: dict[str, Any] = {"role": role, "namespaces": list(namespaces), "name": name, "reason": reason}
    if expires_in is not None:
        body["expires_in"] = expires_in
    response = yield Request("POST", "/api/v1/tokens", json=body, idempotent=False)
    found = as_dict(read_json(response), "token")
    return ApiToken.from_dict(as_dict(found.get("token"), "token.token")), req_str(found, "secret", "token")


def revoke_token(config: Config, /, token_id: str, *, reason: str = "") -> Operation[ApiToken]:
    """Revoke an API token: the server refuses it from now on. Revoking twice changes nothing."""
    params = {"reason": reason} if reason else {}
    response = yield Request("DELETE", f"/api/v1/tokens/{token_id}", params=params)
    return ApiToken.from_dict(as_dict(read_json(response), "token"))


def audit(
    config: Config,
    /,
    namespace: str | None = None,
    *,
    job: str | None = None,
    after: int = 0,
    limit: int = 100,
) -> Operation[list[AuditEntry]]:
    """Who did what and why (commands, policy and token changes), oldest first: of ``namespace`` (default:
    every namespace this client may read) and ``job``."""
    params: dict[str, Any] = {"after": after, "limit": limit}
    if namespace:
        params["namespace"] = namespace
    if job:
        params["job"] = job
    response = yield Request("GET", "/api/v1/audit", params=params)
    items = as_list(as_dict(read_json(response), "audit").get("items"), "audit.items")
    return [AuditEntry.from_dict(as_dict(e, f"audit.items[{i}]"), f"audit.items[{i}]") for i, e in enumerate(items)]
