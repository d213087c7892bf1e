"""The security headers a response's start gets: every one it does not set itself, in order, whatever the
case of its own header names (a start that sets none of them, nearly every answer, takes a shortcut)."""

from __future__ import annotations

import random
from typing import Any

from stepwatch.server.api.guard import SECURITY_HEADERS, _with_security_headers


def _reference(start: dict[str, Any]) -> None:
    """The long way: a set of the names present, and each header not among them."""
    headers = start.setdefault("headers", [])
    present = {name.lower() for name, _ in headers}
    if isinstance(headers, list):
        headers.extend(h for h in SECURITY_HEADERS if h[0] not in present)
    else:
        start["headers"] = [*headers, *(h for h in SECURITY_HEADERS if h[0] not in present)]


def test_a_start_gets_the_headers_the_long_way_gives() -> None:
    rng = random.Random(5)
    pool = [
        (b"content-length", b"2"),
        (b"content-type", b"application/json"),
        (b"retry-after", b"1"),
        *SECURITY_HEADERS,
        (b"X-Frame-Options", b"SAMEORIGIN"),
        (b"Content-Security-Policy", b"default-src 'none'"),
        ("x-frame-options", "DENY"),  # not bytes: not one of them
    ]
    for _ in range(3000):
        headers = rng.sample(pool, rng.randint(0, 5))
        shape = rng.choice([list, tuple, None])
        start: dict[str, Any] = {"type": "http.response.start", "status": 200}
        if shape is not None:
            start["headers"] = shape(headers)
        expected = {**start, "headers": list(headers) if shape is list else start.get("headers", [])}
        if shape is None:
            expected.pop("headers")
        _reference(expected)
        _with_security_headers(start)
        assert start == expected
        assert type(start["headers"]) is type(expected["headers"])
