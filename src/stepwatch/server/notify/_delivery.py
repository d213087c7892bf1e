"""One delivery to one target: a webhook POST retried with backoff, or an Apprise call in a worker thread."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any, Final

import httpx

from ...protocol import Backoff, parse_retry_after
from ._message import Notification, NotifyTarget, encode_body, webhook_payload
from ._signing import SIGNATURE_HEADER, signature_header

__all__ = [
    "APPRISE_HINT",
    "DELIVERY_HEADER",
    "EVENT_HEADER",
    "USER_AGENT",
    "Attempt",
    "RetryPolicy",
    "apprise_body",
    "build_apprise",
    "check_target",
    "new_delivery_id",
    "post_webhook",
    "retry_after",
    "send_apprise",
    "webhook_body",
]

DELIVERY_HEADER: Final = "X-Stepwatch-Delivery"
"""A delivery's id, the same on each of its retries (a receiver that saw it already can ignore it)."""

EVENT_HEADER: Final = "X-Stepwatch-Event"
"""The notification's kind, so a receiver can route before parsing the body."""

USER_AGENT: Final = "stepwatch-notify/1"

APPRISE_HINT: Final = "pip install 'stepwatch[notify]'"

_RETRY_STATUS: Final = frozenset({408, 429})


@dataclass(frozen=True)
class RetryPolicy:
    """How hard one delivery is tried.

    A webhook is tried up to ``attempts`` times: again after a connection error, a timeout, a 5xx, a 408
    or a 429, never after another 4xx. The wait before retry ``n`` is ``backoff_s * 2**(n-1)``, capped at
    ``max_backoff_s``, times a random factor in [0.5, 1) (so that many senders do not retry in step); a
    ``Retry-After`` header (seconds or an HTTP date) replaces it, capped at ``max_retry_after_s``. Each
    request is bounded by ``timeout_s``. An Apprise target says only "failed", so it is tried
    ``apprise_attempts`` times, within ``apprise_timeout_s`` each.
    """

    attempts: int = 6
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    max_retry_after_s: float = 300.0
    timeout_s: float = 10.0
    apprise_attempts: int = 3
    apprise_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.apprise_attempts < 1:
            raise ValueError("a delivery is attempted at least once")
        if min(self.backoff_s, self.max_backoff_s, self.max_retry_after_s) < 0:
            raise ValueError("waits are not negative")
        if self.timeout_s <= 0 or self.apprise_timeout_s <= 0:
            raise ValueError("timeouts are positive")

    def backoff(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number ``retry`` (1 for the first), with jitter."""
        return Backoff(self.backoff_s, self.max_backoff_s, jitter="equal").delay(retry, rng.random)


@dataclass(frozen=True)
class Attempt:
    """What one try gave: delivered, or why not, whether trying again may help, and after how long."""

    ok: bool
    reason: str = ""
    retry: bool = False
    wait_s: float | None = None


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta seconds or an HTTP date), ``None`` if absent or bad."""
    return parse_retry_after(value, now=now)


def new_delivery_id() -> str:
    """A fresh delivery id (a UUID4 in hex)."""
    return uuid.uuid4().hex


def webhook_body(notification: Notification, delivery_id: str, accepted_at: float) -> bytes:
    """The bytes a webhook receives (and that its signature covers)."""
    return encode_body(webhook_payload(notification, delivery_id, accepted_at))


async def post_webhook(
    client: httpx.AsyncClient,
    target: NotifyTarget,
    kind: str,
    body: bytes,
    delivery_id: str,
    now: float,
    address: str | None = None,
) -> Attempt:
    """POST ``body`` to a webhook once, signed at ``now`` when the target has a secret.

    ``address``: connect to this address (the one the allow-list checked), with the URL's host as
    ``Host`` and as the TLS server name, so that a name re-pointed since cannot redirect the request."""
    headers = {"Content-Type": "application/json", DELIVERY_HEADER: delivery_id, EVENT_HEADER: kind}
    if target.secret:
        headers[SIGNATURE_HEADER] = signature_header(target.secret, now, body)
    url: str | httpx.URL = target.url
    extensions: dict[str, Any] = {}
    if address is not None:
        original = httpx.URL(target.url)
        url = original.copy_with(host=address)
        headers["Host"] = original.netloc.decode("ascii").rpartition("@")[2]
        if original.scheme == "https":
            extensions["sni_hostname"] = original.host
    try:
        response = await client.post(url, content=body, headers=headers, extensions=extensions)
    except httpx.TransportError as exc:  # connection refused or reset, DNS, every timeout
        return Attempt(False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, retry=True)
    except httpx.HTTPError as exc:  # an invalid URL and the like: trying again changes nothing
        return Attempt(False, f"{type(exc).__name__}: {exc}")
    status = response.status_code
    if 200 <= status < 300:
        return Attempt(True)
    reason = f"HTTP {status}"
    if status >= 500 or status in _RETRY_STATUS:
        return Attempt(False, reason, retry=True, wait_s=retry_after(response.headers.get("Retry-After"), now))
    return Attempt(False, reason)


def build_apprise(target: NotifyTarget) -> Any:
    """An ``apprise.Apprise`` holding ``target``'s URL. ``ImportError`` with the install hint when Apprise
    is missing, ``ValueError`` when Apprise does not know the URL. Imports Apprise (about 0.2 s the first time).
    """
    try:
        import apprise
    except ImportError as exc:
        raise ImportError(f"notifications to {target.redacted} need Apprise: {APPRISE_HINT}") from exc
    asset = apprise.AppriseAsset(app_id="stepwatch", app_desc="stepwatch: live progress, health and cost of training")
    sender = apprise.Apprise(asset=asset)
    if not sender.add(target.url):
        raise ValueError(
            f"Apprise does not understand the notification URL {target.redacted} (see its wiki for URL forms)"
        )
    return sender


def check_target(target: NotifyTarget) -> Any:
    """Raise now what would make every delivery to ``target`` fail (an unknown Apprise URL, Apprise missing).

    Returns the Apprise sender for an Apprise target (to be reused), ``None`` for a webhook.
    """
    return None if target.is_webhook else build_apprise(target)


def apprise_body(notification: Notification) -> str:
    """The text of a chat or e-mail message: the sentence, then the dashboard link when there is one."""
    url = notification.url
    return f"{notification.message}\n{url}" if url else notification.message


def _notify_type(notification: Notification) -> str:
    if notification.kind == "finished":
        return "success"
    if notification.kind == "failed":
        return "failure"
    if notification.kind == "health" and notification.data.get("health") == "healthy":
        return "success"
    return "warning"


def send_apprise(sender: Any, notification: Notification) -> bool:
    """Send through Apprise (blocks: run it in a worker thread); whether every service accepted it."""
    return bool(
        sender.notify(body=apprise_body(notification), title=notification.title, notify_type=_notify_type(notification))
    )
