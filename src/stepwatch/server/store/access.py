"""What the stores keep for access control: API tokens (hashed) and the audit log, and their rows.

An API token gives a person or a program a role (``viewer``, ``editor``, ``admin``) over some
namespaces (``*``: all). Only the SHA-256 of its secret is stored; its ``id`` is public (lists,
revocation, audit). The audit log records who did what and why: commands, policy changes, token
changes. Both stores share these records and the SQL that reads them (``?`` placeholders; the
PostgreSQL store swaps them for its own).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ALL_NAMESPACES",
    "AUDIT_COLUMNS",
    "ROLES",
    "TOKEN_COLUMNS",
    "ApiToken",
    "AuditEntry",
    "audit_from_row",
    "audit_where",
    "hash_token",
    "token_from_row",
]

ROLES: tuple[str, ...] = ("viewer", "editor", "admin")
"""Roles in increasing power: each can do what the ones before it can."""
ALL_NAMESPACES = "*"
"""The namespace entry of a token valid in every namespace (no namespace can be named so)."""

TOKEN_COLUMNS = "id, name, role, namespaces, created_at, created_by, expires_at, revoked_at, revoked_by"
AUDIT_COLUMNS = "id, t, actor, action, namespace, name, reason, data"


def hash_token(token: str) -> str:
    """How tokens (API and job write tokens) are stored: SHA-256, never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class ApiToken:
    """An API token as stored (never its secret)."""

    id: str
    name: str
    role: str
    namespaces: tuple[str, ...]
    """The namespaces it is valid in; ``("*",)`` for all."""
    created_at: float
    created_by: str = ""
    expires_at: float | None = None
    revoked_at: float | None = None
    revoked_by: str = ""

    @property
    def all_namespaces(self) -> bool:
        """Whether the token is valid in every namespace."""
        return ALL_NAMESPACES in self.namespaces

    def valid_at(self, now: float) -> bool:
        """Neither revoked nor expired at ``now``."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def to_dict(self) -> dict[str, Any]:
        """The token as the API shows it."""
        return {
            "id": self.id,
            "name": self.name,
            "role": self.role,
            "namespaces": list(self.namespaces),
            "created_at": self.created_at,
            "created_by": self.created_by,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "revoked_by": self.revoked_by,
        }


@dataclass(frozen=True)
class AuditEntry:
    """One action someone took: ``actor`` did ``action`` (on ``namespace``/``name``) because ``reason``."""

    t: float
    actor: str
    action: str
    namespace: str = ""
    """Empty for server-wide actions (token changes)."""
    name: str = ""
    """The job acted on; empty when the action is not on one job."""
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    id: int = 0
    """Given by the store."""

    def to_dict(self) -> dict[str, Any]:
        """The entry as the API shows it."""
        return {
            "id": self.id,
            "t": self.t,
            "actor": self.actor,
            "action": self.action,
            "namespace": self.namespace or None,
            "name": self.name or None,
            "reason": self.reason,
            "data": self.data,
        }


def token_from_row(row: tuple[Any, ...]) -> ApiToken:
    """An :class:`ApiToken` from a row of :data:`TOKEN_COLUMNS`."""
    return ApiToken(
        id=row[0],
        name=row[1],
        role=row[2],
        namespaces=tuple(json.loads(row[3])),
        created_at=row[4],
        created_by=row[5],
        expires_at=row[6],
        revoked_at=row[7],
        revoked_by=row[8],
    )


def audit_from_row(row: tuple[Any, ...]) -> AuditEntry:
    """An :class:`AuditEntry` from a row of :data:`AUDIT_COLUMNS`."""
    return AuditEntry(
        id=row[0], t=row[1], actor=row[2], action=row[3], namespace=row[4], name=row[5], reason=row[6],
        data=json.loads(row[7]),
    )  # fmt: skip


def audit_where(
    namespaces: tuple[str, ...] | None, name: str | None, include_global: bool, after: int
) -> tuple[str, list[Any]]:
    """The ``WHERE`` of an audit read: entries after ``after`` in ``namespaces`` (``None``: any), of
    job ``name``, and the server-wide ones (no namespace) when ``include_global``."""
    clauses = ["id > ?"]
    args: list[Any] = [after]
    if namespaces is not None:
        scope = [f"namespace IN ({', '.join('?' for _ in namespaces)})"] if namespaces else []
        if include_global:
            scope.append("namespace = ''")
        clauses.append(f"({' OR '.join(scope)})" if scope else "1 = 0")
        args.extend(namespaces)
    elif not include_global:
        clauses.append("namespace <> ''")
    if name is not None:
        clauses.append("name = ?")
        args.append(name)
    return " AND ".join(clauses), args
