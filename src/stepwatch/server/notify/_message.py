"""What is sent (:class:`Notification`), where to (:class:`NotifyTarget`), and the JSON a webhook receives."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from ...protocol import encode_float, format_rfc3339

__all__ = ["KINDS", "Notification", "NotifyTarget", "encode_body", "parse_targets", "webhook_payload"]

KINDS: Final = ("finished", "failed", "health", "action", "deadline")
"""What a notification can be about: a job finished or failed, its health changed, a policy acted on it,
or its ETA is now past its deadline."""

PAYLOAD_VERSION: Final = 1
"""The version of the webhook body (``"version"``); a change that breaks receivers increments it."""


@dataclass(frozen=True, kw_only=True)
class Notification:
    """One message about one job, sent to every target of a :meth:`Notifier.notify` call.

    ``key`` is what de-duplication compares: the same key is sent once per window, so a key names a state
    change (``f"{job_id}:{kind}:{new_state}"``), not a moment. ``data`` is JSON-ready (state, health,
    evidence, cost, ``url`` of the job in the dashboard when the server knows its base URL); non-finite
    floats in it are sent as the protocol's strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
    ``ValueError`` at creation for an unknown kind or an empty required field.
    """

    kind: Literal["finished", "failed", "health", "action", "deadline"]
    namespace: str
    job: str
    title: str
    message: str
    key: str
    attempt: int = 1
    data: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a notification's kind is one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in ("namespace", "job", "title", "key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"a notification needs a non-empty {name}")
        if not isinstance(self.message, str):
            raise ValueError("a notification's message is a string")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) or self.attempt < 0:
            raise ValueError(f"a notification's attempt is a non-negative integer, got {self.attempt!r}")
        if not isinstance(self.data, Mapping):
            raise ValueError("a notification's data is a mapping (JSON object)")

    @property
    def url(self) -> str | None:
        """The job's dashboard address, when ``data`` carries one."""
        url = self.data.get("url")
        return url if isinstance(url, str) and url else None


@dataclass(frozen=True)
class NotifyTarget:
    """Where notifications go. An ``http://`` or ``https://`` URL is a webhook (JSON POST, signed with
    ``secret`` when there is one); any other URL (``slack://``, ``mailto://``, ``json://``, ...) goes
    through Apprise and ignores ``secret``.

    The URL and the secret never appear in ``repr`` or logs (chat URLs hold tokens): see :attr:`redacted`.
    """

    url: str = field(repr=False)
    secret: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if not parts.scheme or "://" not in self.url:
            start = self.url[:8] + ("…" if len(self.url) > 8 else "")
            raise ValueError(f"a notification target is a URL with a scheme (https://..., slack://...), got {start!r}")
        if self.is_webhook and not parts.hostname:
            raise ValueError(f"a webhook URL needs a host: {self}")
        if self.secret is not None and not self.secret:
            raise ValueError("a webhook secret, when given, is not empty")

    @property
    def is_webhook(self) -> bool:
        """Whether this target is a stepwatch webhook (else an Apprise URL)."""
        return self.url.split(":", 1)[0].lower() in ("http", "https")

    @property
    def redacted(self) -> str:
        """The target as logs show it: a webhook without credentials or query, an Apprise URL as its scheme."""
        parts = urlsplit(self.url)
        if not self.is_webhook:
            return f"{parts.scheme}://…"
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"

    def __repr__(self) -> str:
        signed = ", signed" if self.is_webhook and self.secret else ""
        return f"NotifyTarget({self.redacted!r}{signed})"

    __str__ = __repr__


# A URL starts where a scheme follows a separator: a comma inside a URL (``mailto://...?to=a@x,b@y``) stays.
_SPLIT = re.compile(r"[\s,]+(?=[A-Za-z][A-Za-z0-9+.\-]*://)")


def parse_targets(text: str | None, secret: str | None = None) -> tuple[NotifyTarget, ...]:
    """The targets of a ``STEPWATCH_NOTIFY`` value: URLs separated by commas or white space.

    ``http(s)://`` URLs are webhooks, signed with ``secret`` (``STEPWATCH_NOTIFY_SECRET``) when it is
    given; anything else is an Apprise URL. A comma not followed by ``scheme://`` belongs to the URL
    before it. Syntax only: whether Apprise knows a URL is checked by :func:`check_target`.
    ``ValueError`` names the item at fault (without its credentials).
    """
    if not text or not text.strip():
        return ()
    secret = secret or None
    targets: list[NotifyTarget] = []
    for item in _SPLIT.split(text.strip()):
        url = item.strip().strip(",").strip()
        if not url:
            continue
        target = NotifyTarget(url)  # validates; the secret goes to webhooks only
        if target.is_webhook and secret:
            target = NotifyTarget(url, secret)
        if target not in targets:
            targets.append(target)
    return tuple(targets)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else encode_float(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def webhook_payload(notification: Notification, delivery_id: str, at: float) -> dict[str, Any]:
    """The JSON object a webhook receives (documented in docs/notifications.md)."""
    n = notification
    return {
        "version": PAYLOAD_VERSION,
        "id": delivery_id,
        "time": format_rfc3339(at),
        "kind": n.kind,
        "namespace": n.namespace,
        "job": n.job,
        "attempt": n.attempt,
        "title": n.title,
        "message": n.message,
        "key": n.key,
        "data": _json_safe(n.data),
    }


def encode_body(payload: Mapping[str, Any]) -> bytes:
    """Standard compact JSON; a value JSON does not know (a datetime, a path) is sent as its ``str``."""
    return json.dumps(
        _json_safe(payload), separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str
    ).encode()
