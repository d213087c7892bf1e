"""Retries: the one backoff and ``Retry-After`` reading of the report core, the client and the notifier."""

from __future__ import annotations

import datetime as _dt
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

__all__ = ["Backoff", "Jitter", "parse_retry_after"]


Jitter = Literal["full", "equal", "decorrelated", "none"]
_JITTERS: Final[tuple[str, ...]] = ("full", "equal", "decorrelated", "none")
_DELTA_SECONDS_RE: Final = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_ASCTIME_RE: Final = re.compile(r"[A-Za-z]{3} [A-Za-z]{3} [ \d]\d \d\d:\d\d:\d\d \d{4}")
"""The third HTTP-date form (``Sun Nov  6 08:49:37 1994``): the one that writes no zone."""


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: how long to wait before retry ``n`` (1 for the first).

    The wait grows as ``base * 2**(n - 1)``, at most ``cap``, and ``jitter`` spreads it so that many
    senders that failed together do not come back together:

    * ``"full"``: anywhere in ``[0, wait]`` (the widest spread; a retry may come at once);
    * ``"equal"``: in ``[wait / 2, wait]`` (spread, yet never sooner than half the wait);
    * ``"decorrelated"``: between ``base`` and three times the ``previous`` wait, at most ``cap``
      (each wait follows the last one rather than the count);
    * ``"none"``: exactly the wait.

    Each caller keeps its own numbers (``base``, ``cap``, how many attempts) and its own random source.
    """

    base: float
    cap: float
    jitter: Jitter = "full"

    def __post_init__(self) -> None:
        if not (0.0 <= self.base < math.inf and 0.0 <= self.cap < math.inf):
            raise ValueError(f"base and cap are seconds, 0 or more and finite, got {self.base!r} and {self.cap!r}")
        if self.jitter not in _JITTERS:
            raise ValueError(f"jitter must be one of {', '.join(_JITTERS)}, got {self.jitter!r}")

    def delay(self, retry: int, rand: Callable[[], float] = random.random, previous: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first); ``rand`` gives a float in ``[0, 1)``.

        ``previous`` (the wait before the last retry) is what ``"decorrelated"`` grows from; the other
        kinds ignore it.
        """
        if self.jitter == "decorrelated":
            last = self.base if previous is None else max(previous, self.base)
            return min(self.cap, self.base + (min(last * 3.0, self.cap) - self.base) * rand())
        wait = min(self.cap, self.base * 2.0 ** min(max(retry, 1) - 1, 62))  # 2**62: past any cap, no overflow
        if self.jitter == "full":
            return wait * rand()
        if self.jitter == "equal":
            return wait * (0.5 + 0.5 * rand())
        return wait


def parse_retry_after(value: str | None, *, now: float | None = None, cap: float = 86_400.0) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110), clamped to ``[0, cap]``.

    The header holds delta-seconds (``"120"``; a fraction such as ``"2.5"`` is read too) or an
    HTTP-date in any of its three forms (``"Fri, 15 Jan 2027 08:00:30 GMT"``, always GMT), counted
    from ``now`` (Unix time, the wall clock by default). A time already past reads 0; ``None`` when
    the header is absent or unreadable (garbage, ``NaN``, no such day, a zone nobody knows), so that
    the caller falls back on its backoff.
    """
    if not value:
        return None
    text = value.strip()
    if _DELTA_SECONDS_RE.fullmatch(text):
        return min(max(float(text), 0.0), cap)
    # Only a date needs the e-mail parser (RFC 9110's three date forms): imported when one comes, so
    # that importing the protocol (every report core, client and server) does not pay for it.
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # no zone the parser knew: only asctime's form is GMT without saying it
        if not _ASCTIME_RE.fullmatch(text):
            return None
        when = when.replace(tzinfo=_dt.timezone.utc)
    return min(max(when.timestamp() - (time.time() if now is None else now), 0.0), cap)
