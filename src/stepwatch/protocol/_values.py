"""Names, floats and times as they travel, and the percentage every reader shows."""

from __future__ import annotations

import datetime as _dt
import math
import re
from typing import Final

from ._errors import ProtocolError, _show
from ._limits import LIMITS
from ._vocabulary import ENDED_STATES

__all__ = [
    "decode_float",
    "encode_float",
    "ended_short_text",
    "format_rfc3339",
    "is_valid_metric_name",
    "is_valid_name",
    "parse_rfc3339",
    "sanitize_name",
    "shown_percent",
    "validate_metric_name",
    "validate_name",
]

_NAME_RE: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_RFC3339_RE: Final = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))"
)


def is_valid_name(name: object) -> bool:
    """Whether ``name`` is a valid job or namespace name (a Kubernetes DNS-1123 label)."""
    return isinstance(name, str) and len(name) <= LIMITS.max_name_length and bool(_NAME_RE.fullmatch(name))


def validate_name(name: object, field: str = "name") -> str:
    """Return ``name`` if it is a valid job or namespace name, else raise :class:`ProtocolError`."""
    if not is_valid_name(name):
        raise ProtocolError(
            field,
            f"must be 1-{LIMITS.max_name_length} lowercase letters, digits or '-', starting and ending "
            f"with a letter or digit (a Kubernetes name), got {_show(name)}",
        )
    assert isinstance(name, str)
    return name


def sanitize_name(text: str, fallback: str = "job") -> str:
    """Turn free text (a script name, ``My_Run v2``) into a valid job name (``my-run-v2``)."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    name = re.sub(r"-{2,}", "-", name)[: LIMITS.max_name_length].strip("-")
    return name or fallback


def is_valid_metric_name(name: object) -> bool:
    """Whether ``name`` is 1..64 printable characters (no control characters)."""
    return isinstance(name, str) and 0 < len(name) <= LIMITS.max_metric_name_length and name.isprintable()


def validate_metric_name(name: object, field: str = "name") -> str:
    """Return ``name`` if it is a valid metric name, else raise :class:`ProtocolError`."""
    if not isinstance(name, str):
        raise ProtocolError(
            field,
            f"a metric name must be a string of 1-{LIMITS.max_metric_name_length} printable characters, "
            f"got {_show(name)}",
        )
    if not is_valid_metric_name(name):
        raise ProtocolError(
            field,
            f"a metric name must be 1-{LIMITS.max_metric_name_length} printable characters "
            f"(no control characters), got {_show(name)}",
        )
    assert isinstance(name, str)
    return name


_NONFINITE_IN: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def shown_percent(value: float, ended: bool = False) -> float:
    """A percentage as every reader shows it: one decimal rounded down, within 0..100, and 100 only for a job
    that reached its total and ``ended`` (a job at 99.99 % reads 99.9; one at its last step but still running
    reads 99.9 until it ends). Rounded at the sixth decimal first, so that a float a hair under a tenth
    (``29.999999999999996``, ``2.3 * 10``) is not cut to the tenth below. The one rule: the server's figures,
    the CLI and :func:`ended_short_text` use it, the dashboard has a tested copy."""
    if not math.isfinite(value):
        return 0.0
    tenths = math.floor(round(max(0.0, min(100.0, value)) * 10, 6))
    return 100.0 if ended and tenths >= 1000 else min(tenths, 999) / 10


def ended_short_text(state: str, percent: float | None) -> str | None:
    """``"ended at 49.7%"`` for a job that ended (finished, failed or stopped) short of its total, else ``None``.

    Every reader (the CLI, the SDK, the dashboard's copy of this rule) says it the same way: a script
    that exits at step 199 of 400 ended at 49.7 % (:func:`shown_percent`: rounded down, never to 100.0,
    the job did not reach its total), whether the runner records it finished or failed.
    """
    if state not in ENDED_STATES or percent is None or not math.isfinite(percent) or percent >= 100.0:
        return None
    return f"ended at {shown_percent(percent):.1f}%"


def encode_float(value: float) -> float | str:
    """A float as it travels: itself when finite, else ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def decode_float(value: object, field: str) -> float:
    """Read a wire float: a JSON number or one of the three non-finite strings."""
    if isinstance(value, bool):
        raise ProtocolError(field, f"must be a number, got {_show(value)}")
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer literal beyond the largest float (JSON allows 4300 digits)
            raise ProtocolError(field, "must be a number within the range of a 64-bit float") from None
    if isinstance(value, str) and value in _NONFINITE_IN:
        return _NONFINITE_IN[value]
    raise ProtocolError(field, f"must be a number or 'NaN', 'Infinity', '-Infinity', got {_show(value)}")


def format_rfc3339(timestamp: float) -> str:
    """A Unix time as RFC 3339 in UTC with second precision (``2026-12-02T15:04:05Z``)."""
    moment = _dt.datetime.fromtimestamp(timestamp, tz=_dt.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: object, field: str = "time") -> float:
    """Parse an RFC 3339 time (``Z`` or an offset, optional fraction up to nanoseconds) into Unix time."""
    match = _RFC3339_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ProtocolError(
            field, f"must be an RFC 3339 time like 2026-12-02T15:04:05Z or ...05.123+02:00, got {_show(text)}"
        )
    year, month, day, hour, minute, second, fraction, zulu, sign, off_h, off_m = match.groups()
    offset = _dt.timedelta(0)
    if not zulu:
        offset = _dt.timedelta(hours=int(off_h), minutes=int(off_m)) * (1 if sign == "+" else -1)
    try:
        moment = _dt.datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            min(int(second), 59),  # a leap second reads as :59
            int((fraction or "0").ljust(6, "0")[:6]),
            tzinfo=_dt.timezone(offset),
        )
    except ValueError as exc:
        raise ProtocolError(field, f"must be a valid RFC 3339 time ({exc}), got {_show(text)}") from None
    return moment.timestamp()
