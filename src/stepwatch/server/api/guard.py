"""What keeps a web page from acting on a local server, and the security headers of every answer.

An ASGI middleware in front of every route, as Jupyter's and TensorBoard's local servers do:

- **Host** (mode ``none``, on a loopback address): the ``Host`` header must name this server: a
  loopback address, ``localhost``, the address it listens on, or a name of ``STEPWATCH_ALLOWED_HOSTS``
  (``*``: any). A page that re-points its own name at 127.0.0.1 (DNS rebinding) sends its own name
  and gets 403. A server bound to another address (``--insecure``) is reachable by any name: no check.
- **Origin** (modes ``none`` and ``proxy``, where a browser holds the authority: being on this machine,
  or the proxy's session cookie): a request that changes something (``POST``, ``PUT``, ``PATCH``,
  ``DELETE``) with an ``Origin`` must come from this server's own origin or one of
  ``STEPWATCH_ALLOWED_ORIGINS``; ``Origin: null`` and ``Sec-Fetch-Site: cross-site`` are refused (403).
- **JSON only** (the same modes): a ``POST`` without an ``Authorization`` header must say
  ``Content-Type: application/json`` (415 otherwise). A cross-site form or a "simple" ``fetch`` can
  send neither that type nor that header without a CORS preflight, which this server never grants
  (nor any ``PUT``, ``PATCH`` or ``DELETE``: those always need one). Every client of the server sends
  it: the report core, the SDK and CLI, the dashboard, Kubeflow's SDK and transformers' callback. The
  Kubeflow status endpoint, which refuses any call without a token, answers in upstream's order.

Under ``tokens`` every call carries ``Authorization: Bearer``, which no cross-site page can attach.

Every answer carries ``Content-Security-Policy`` (scripts and styles from this server only, no
framing), ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy:
no-referrer``, 500s included: the app puts the guard outside Starlette's error middleware
(``server/app.py``), so the answers that middleware writes pass through it too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from .direct import DirectRoutes
from .errors import error_response

__all__ = ["KUBEFLOW_PREFIX", "SECURITY_HEADERS", "Guard", "GuardRules", "host_name"]

KUBEFLOW_PREFIX = "/apis/trainer.kubeflow.org/"
"""The upstream status endpoint's paths: exempt from the JSON-only rule (every call there carries a token)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""Scripts only from this server (no inline script, no eval); inline styles are allowed because the
charting library (plotly.js) sets them on the elements it draws."""

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
_SECURITY_NAMES = frozenset(name for name, _ in SECURITY_HEADERS)
_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_LOOPBACK_NAMES = frozenset({"localhost"})


def host_name(host: str) -> str:
    """The name in a ``Host`` header or an address setting, lowercased, without port, brackets or final dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_loopback_address(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class GuardRules:
    """Which checks run and what they allow (built from the settings: :meth:`for_server`)."""

    check_host: bool = True
    hosts: frozenset[str] = frozenset()
    """Names allowed besides loopback addresses and ``localhost``; ``*``: any."""
    check_origin: bool = True
    origins: frozenset[str] = frozenset()
    """Origins (``http://name:port``) allowed besides this server's own; ``*``: any."""

    @classmethod
    def for_server(cls, auth: str, bound: str, hosts: Iterable[str], origins: Iterable[str]) -> GuardRules:
        """The rules of a server in mode ``auth`` listening on ``bound`` (see the module docstring)."""
        name = host_name(bound)
        bound_is_loopback = name in _LOOPBACK_NAMES or _is_loopback_address(name)
        return cls(
            check_host=auth == "none" and bound_is_loopback,
            hosts=frozenset({name, *(host_name(h) if h != "*" else h for h in hosts)}),
            check_origin=auth in ("none", "proxy"),
            origins=frozenset(o.strip().lower().rstrip("/") for o in origins),
        )

    def host_allowed(self, host: str) -> bool:
        """Whether a ``Host`` header names this server."""
        name = host_name(host)
        return name in _LOOPBACK_NAMES or name in self.hosts or "*" in self.hosts or _is_loopback_address(name)

    def refusal(self, method: str, headers: dict[bytes, bytes], path: str = "/") -> tuple[int, str] | None:
        """Why a request is refused (status, message), or ``None`` when it may go on."""
        host = headers.get(b"host", b"").decode("latin-1")
        if self.check_host and host and not self.host_allowed(host):
            return 403, (
                f"Host {host[:100]!r} is not a name of this server (a page that re-points its name at this "
                "machine would send it); allow it with STEPWATCH_ALLOWED_HOSTS (see docs/auth.md)"
            )
        if not self.check_origin or method not in _UNSAFE:
            return None
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1").strip().lower()
            _, _, netloc = text.partition("://")
            if not (netloc and netloc == host.strip().lower()) and text not in self.origins and "*" not in self.origins:
                return 403, (
                    f"cross-site request refused: Origin {text[:100]!r} is not this server's; allow it with "
                    "STEPWATCH_ALLOWED_ORIGINS (see docs/auth.md)"
                )
        elif headers.get(b"sec-fetch-site", b"") in (b"cross-site", b"same-site"):
            return 403, "cross-site request refused (Sec-Fetch-Site says it comes from another site)"
        # POST is the one such method a page may send cross-site without a preflight, and only without an
        # Authorization header (a page cannot attach one without a preflight either). The Kubeflow status
        # endpoint always wants a token, and answers in upstream's order (size, token, body) whatever the type.
        if method == "POST" and b"authorization" not in headers and not path.startswith(KUBEFLOW_PREFIX):
            media = headers.get(b"content-type", b"").decode("latin-1").partition(";")[0].strip().lower()
            if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
                shown = f"Content-Type {media[:60]!r}" if media else "no Content-Type"
                return 415, (
                    f"a {method} to this server must be JSON (Content-Type: application/json), got {shown}; "
                    "a cross-site form cannot send that type"
                )
        return None


class Guard:
    """The middleware: refuses what :class:`GuardRules` refuses and adds :data:`SECURITY_HEADERS` to every answer."""

    def __init__(self, app: App, rules: GuardRules, direct: DirectRoutes | None = None) -> None:
        self.app = app
        self.rules = rules
        self.direct = direct
        """The routes served without ``app``'s middleware and router (:mod:`.direct`), once the checks passed."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                _with_security_headers(message)
            await send(message)

        refused = self.rules.refusal(scope["method"], dict(scope["headers"]), scope.get("path", "/"))
        if refused is not None:
            response = error_response(*refused)
            await response(scope, receive, send_with_headers)
            return
        found = self.direct.find(scope) if self.direct is not None else None
        if found is not None:  # its sender adds the headers (one wrapper of send, not two)
            assert self.direct is not None
            await self.direct.serve(found, scope, receive, send, on_start=_with_security_headers)
            return
        await self.app(scope, receive, send_with_headers)


def _with_security_headers(start: Message) -> None:
    """Add to a response's start the security headers it does not set itself."""
    headers = start.setdefault("headers", [])
    for name, _ in headers:
        if name.lower() in _SECURITY_NAMES:
            break
    else:  # it sets none of them (every answer of the app but a few): all of them, in their order
        if isinstance(headers, list):
            headers.extend(SECURITY_HEADERS)
        else:
            start["headers"] = [*headers, *SECURITY_HEADERS]
        return
    present = {name.lower() for name, _ in headers}
    if isinstance(headers, list):
        headers.extend(h for h in SECURITY_HEADERS if h[0] not in present)
    else:
        start["headers"] = [*headers, *(h for h in SECURITY_HEADERS if h[0] not in present)]
