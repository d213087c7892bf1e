"""Who is asking, and what they may do: identities from API tokens or an authenticating proxy, and roles.

Three modes (``STEPWATCH_AUTH``):

- ``none`` (the default): everyone is the local user, an admin of every namespace. Fine on loopback,
  where the server listens by default; the server refuses a non-loopback address in this mode unless
  ``STEPWATCH_INSECURE`` says so.
- ``tokens``: every API call carries ``Authorization: Bearer <API token>`` (``stepwatch token
  create``); a token gives a role over some namespaces.
- ``proxy``: as ``tokens``, and a request from a trusted proxy (its peer address in
  ``STEPWATCH_TRUSTED_PROXIES``) may instead name its user and groups in headers
  (``X-Forwarded-User``, ``X-Forwarded-Groups``: oauth2-proxy, the OpenShift OAuth proxy); groups
  (and ``user:NAME``) map to roles over namespaces through ``STEPWATCH_PROXY_GROUPS``. The headers of
  any other peer are ignored.

Roles grow: a ``viewer`` reads, an ``editor`` also acts (commands, policies, registering jobs), an
``admin`` also manages tokens and reads the server-wide audit. What spans every namespace (the
Prometheus endpoint, token management) needs its role over every namespace. Job reports keep their
per-job write tokens; this module is not on their path.

A request that is not authenticated gets 401; one whose identity lacks the role gets 403 naming
only the namespace (whether a job exists there is never said).
"""

from __future__ import annotations

import ipaddress
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from starlette.requests import Request

from ...protocol import is_valid_name
from ..store import ROLES, ApiToken, Store
from ..store.access import ALL_NAMESPACES, hash_token
from ..store.offload import Offload
from .errors import ApiError

__all__ = [
    "AUTH_MODES",
    "LOCAL",
    "TOKEN_COOKIE",
    "TOKEN_PREFIX",
    "Authenticator",
    "Grant",
    "Identity",
    "forbidden",
    "hash_token",
    "identity_of_token",
    "is_loopback",
    "mint_token",
    "parse_cidrs",
    "parse_group_roles",
]

AUTH_MODES: tuple[str, ...] = ("none", "tokens", "proxy")
TOKEN_COOKIE = "stepwatch_token"
"""The cookie the dashboard sets for its live stream (an ``EventSource`` cannot send headers); read
only on ``GET /api/v1/events``."""
_RANK = {role: i for i, role in enumerate(ROLES)}
_VERBS = {"viewer": "read", "editor": "change", "admin": "administer"}


@dataclass(frozen=True)
class Grant:
    """A role over some namespaces (``None``: all of them)."""

    role: str
    namespaces: frozenset[str] | None

    def covers(self, role: str, namespace: str | None) -> bool:
        """Whether this grant gives ``role`` in ``namespace`` (``None``: in every namespace)."""
        if _RANK[self.role] < _RANK[role]:
            return False
        if self.namespaces is None:
            return True
        return namespace is not None and namespace in self.namespaces


@dataclass(frozen=True)
class Identity:
    """Who a request comes from (``who`` goes in the audit log) and the grants it holds."""

    who: str
    grants: tuple[Grant, ...]
    token_id: str | None = None
    expires_at: float | None = None

    def allows(self, role: str, namespace: str | None = None) -> bool:
        """Whether ``role`` is granted in ``namespace`` (``None``: in every namespace)."""
        return any(g.covers(role, namespace) for g in self.grants)

    def readable(self) -> tuple[str, ...] | None:
        """The namespaces it may read, sorted; ``None`` when it may read every namespace."""
        found: set[str] = set()
        for grant in self.grants:
            if grant.namespaces is None:
                return None
            found |= grant.namespaces
        return tuple(sorted(found))


LOCAL = Identity("local", (Grant("admin", None),))
"""The one user of a server without authentication."""


def identity_of_token(token: ApiToken) -> Identity:
    """The identity an API token gives."""
    namespaces = None if token.all_namespaces else frozenset(token.namespaces)
    return Identity(f"token:{token.id} ({token.name})", (Grant(token.role, namespaces),), token.id, token.expires_at)


def parse_group_roles(text: str) -> dict[str, Grant]:
    """``STEPWATCH_PROXY_GROUPS``: a JSON object of group (or ``user:NAME``) to ``"role:ns1,ns2"`` or
    ``"role:*"``. ``ValueError`` names what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError('give a JSON object such as {"ml-team": "editor:nlp,vision", "platform": "admin:*"}')
    found: dict[str, Grant] = {}
    for group, value in data.items():
        if not isinstance(value, str) or ":" not in value:
            raise ValueError(f"{group}: give 'role:namespace,namespace' or 'role:*', got {value!r}")
        role, _, spaces = value.partition(":")
        role = role.strip()
        if role not in ROLES:
            raise ValueError(f"{group}: the role is one of {', '.join(ROLES)}, got {role!r}")
        names = frozenset(n.strip() for n in spaces.split(",") if n.strip())
        if not names:
            raise ValueError(f"{group}: name its namespaces, or * for all")
        found[group] = Grant(role, None if ALL_NAMESPACES in names else names)
    return found


def parse_cidrs(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``STEPWATCH_TRUSTED_PROXIES``: addresses or networks separated by commas or spaces."""
    try:
        return tuple(ipaddress.ip_network(part, strict=False) for part in text.replace(",", " ").split())
    except ValueError as exc:
        raise ValueError(f"not an address or network: {exc}") from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Authenticator:
    """Resolves the identity of requests under one mode (see the module docstring)."""

    mode: str = "none"
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    user_header: str = "X-Forwarded-User"
    groups_header: str = "X-Forwarded-Groups"
    group_roles: Mapping[str, Grant] = field(default_factory=dict)
    _identities: dict[str, tuple[ApiToken, Identity]] = field(default_factory=dict, repr=False)
    """Identities by token hash, each with the store's record it was made from (reused while the store
    gives out that same record: a revocation makes the store drop it)."""

    @property
    def enabled(self) -> bool:
        """Whether requests must say who they are."""
        return self.mode != "none"

    async def identify(
        self, request: Request, store: Store, now: float, *, offload: Offload, cookie: bool = False
    ) -> Identity:
        """The identity of a request, or 401. ``offload`` runs a store read away from the event loop (the
        server's ``blocking``); ``cookie``: the dashboard's token cookie counts too."""
        if self.mode == "none":
            return LOCAL
        header = request.headers.get("authorization")
        secret: str | None = None
        if header is not None:
            scheme, _, value = header.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise _unauthenticated("the Authorization header must be 'Bearer <API token>'")
            secret = value.strip()
        elif cookie:
            secret = request.cookies.get(TOKEN_COOKIE) or None
        if secret is not None:
            return await self._token(secret, store, now, offload)
        if self.mode == "proxy" and self._trusted(request):
            user = (request.headers.get(self.user_header) or "").strip()
            if user:
                return self._proxy_identity(user, request.headers.get(self.groups_header) or "")
        raise _unauthenticated(
            "this server needs an API token: send 'Authorization: Bearer <token>' (CLI: --token or "
            "STEPWATCH_API_TOKEN; see docs/auth.md)"
        )

    async def _token(self, secret: str, store: Store, now: float, offload: Offload) -> Identity:
        digest = hash_token(secret)
        token = store.cached_api_token(digest)
        if token is None:
            token = await offload(store.api_token, digest)
        if token is None or not token.valid_at(now):
            raise _unauthenticated("this API token is not valid (unknown, revoked or expired)")
        if token.created_by == LOCAL.who:
            raise _unauthenticated(
                "this API token was made while the server ran without authentication (by anyone on its "
                "machine): it is refused; revoke it and make another (see docs/auth.md)"
            )
        seen = self._identities.get(digest)
        if seen is not None and seen[0] is token:  # the store still holds the same record: nothing changed
            return seen[1]
        identity = identity_of_token(token)
        if len(self._identities) >= 10_000:
            self._identities.clear()
        self._identities[digest] = (token, identity)
        return identity

    def _trusted(self, request: Request) -> bool:
        peer = request.client.host if request.client is not None else None
        if not peer or not self.trusted_proxies:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self.trusted_proxies)

    def _proxy_identity(self, user: str, groups_text: str) -> Identity:
        groups = [g.strip() for g in groups_text.split(",") if g.strip()]
        grants = _grants_of([f"user:{user}", *groups], self.group_roles)
        return Identity(f"user:{user[:128]}", grants)


def _grants_of(names: Iterable[str], roles: Mapping[str, Grant]) -> tuple[Grant, ...]:
    return tuple(roles[n] for n in names if n in roles)


def _unauthenticated(message: str) -> ApiError:
    return ApiError(401, message, headers={"WWW-Authenticate": 'Bearer realm="stepwatch"'})


def forbidden(identity: Identity, role: str, namespace: str | None) -> ApiError:
    """403 for an identity that lacks ``role`` (says nothing of what exists in the namespace)."""
    where = f"namespace {namespace}" if namespace is not None else "every namespace (this needs it over all)"
    return ApiError(403, f"{identity.who} may not {_VERBS[role]} {where}: the {role} role is needed")


TOKEN_PREFIX = "swt_"
"""API tokens start so: secret scanners and people tell them from job write tokens."""


def mint_token(
    role: str, namespaces: Iterable[str], name: str, now: float, *, expires_at: float | None = None, by: str = ""
) -> tuple[ApiToken, str]:
    """A new API token and its secret (shown once; only its hash is stored). ``ValueError`` names what is wrong."""
    if role not in ROLES:
        raise ValueError(f"the role is one of {', '.join(ROLES)}, got {role!r}")
    spaces = tuple(sorted(set(namespaces)))
    if not spaces:
        raise ValueError("name the namespaces of the token, or all of them ('*')")

    for space in spaces:
        if space != ALL_NAMESPACES and not is_valid_name(space):
            raise ValueError(f"{space[:80]!r} is not a namespace name (lowercase letters, digits and '-', at most 63)")
    if ALL_NAMESPACES in spaces:
        spaces = (ALL_NAMESPACES,)
    if not name or len(name) > 64 or not name.isprintable():
        raise ValueError("the name of a token is 1-64 printable characters")
    if expires_at is not None and expires_at <= now:
        raise ValueError("the expiry must be in the future")
    token = ApiToken(secrets.token_hex(6), name, role, spaces, now, by, expires_at)
    return token, TOKEN_PREFIX + secrets.token_urlsafe(32)
