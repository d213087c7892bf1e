"""Webhook signatures: HMAC-SHA256 of ``timestamp + "." + body`` with the shared secret (Stripe's scheme).

The header is ``X-Stepwatch-Signature: t=<unix seconds>,v1=<hex digest>``. A receiver recomputes the
digest over the raw body it received, compares in constant time, and rejects a timestamp too far from
its own clock (a replayed request). Several ``v1=`` entries may appear (verification accepts any), so
a secret can be rotated by signing with both for a while.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Final

__all__ = ["SIGNATURE_HEADER", "sign", "signature_header", "verify_signature"]

SIGNATURE_HEADER: Final = "X-Stepwatch-Signature"


def _as_bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def sign(secret: str | bytes, timestamp: int, body: str | bytes) -> str:
    """The hex HMAC-SHA256 of ``f"{timestamp}." + body`` under ``secret``."""
    message = str(int(timestamp)).encode() + b"." + _as_bytes(body)
    return hmac.new(_as_bytes(secret), message, hashlib.sha256).hexdigest()


def signature_header(secret: str | bytes, timestamp: float, body: str | bytes) -> str:
    """The value of :data:`SIGNATURE_HEADER` for ``body`` sent at ``timestamp`` (Unix seconds)."""
    t = int(timestamp)
    return f"t={t},v1={sign(secret, t, body)}"


def verify_signature(
    secret: str | bytes,
    header: str | None,
    body: str | bytes,
    tolerance_s: float = 300,
    now: float | None = None,
) -> bool:
    """Whether ``header`` (the :data:`SIGNATURE_HEADER` value) signs ``body`` (the raw bytes received)
    with ``secret``, at a time within ``tolerance_s`` of ``now`` (default: this machine's clock).

    Never raises: a missing or malformed header is ``False``. Pass the body exactly as received, before
    any JSON parsing (re-encoding changes the bytes).
    """
    if not header or not secret:
        return False
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if name == "t":
            try:
                timestamp = int(value)
            except ValueError:
                return False
        elif name == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        return False
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body)
    # compare every candidate (no early exit on the first): the time taken does not depend on which matched
    matched = False
    for candidate in candidates:
        matched |= hmac.compare_digest(expected.encode(), candidate.lower().encode("utf-8", "replace"))
    return matched
