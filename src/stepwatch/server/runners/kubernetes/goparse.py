"""Go's ``time.ParseDuration`` and ``strconv.Atoi``, ported: how Red Hat's controller reads its poll interval.

OpenShift AI 3.4's controller reads the annotation ``trainer.opendatahub.io/metrics-poll-interval`` with
``time.ParseDuration``, else ``strconv.Atoi`` (whole seconds), and multiplies the seconds into a
``time.Duration`` (``pkg/rhai/progression/progression.go`` ``GetMetricsPollInterval``). The port follows
Go's code (``src/time/format.go``, ``src/strconv/atoi.go``; the same in Go 1.19 and 1.24) on the string's
UTF-8 bytes, overflow checks and int64 wrap-around included, so that every annotation gives the interval
the controller would use. ``tests/go/duration`` holds it to Go itself. Pure, standard library only.
"""

from __future__ import annotations

from typing import Final

__all__ = ["GoSyntaxError", "atoi", "parse_duration", "seconds_duration"]

_U63: Final = 1 << 63
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1

_UNITS: Final = {
    b"ns": 1,
    b"us": 1_000,
    "µs".encode(): 1_000,  # U+00B5, the micro sign
    "μs".encode(): 1_000,  # U+03BC, the Greek letter mu
    b"ms": 1_000_000,
    b"s": 1_000_000_000,
    b"m": 60_000_000_000,
    b"h": 3_600_000_000_000,
}


class GoSyntaxError(ValueError):
    """Where Go's parser returns an error."""


def _leading_int(s: bytes) -> tuple[int, bytes]:
    """``leadingInt``: the leading ``[0-9]*`` as a uint64 (an error past 1<<63)."""
    x, i = 0, 0
    while i < len(s) and 0x30 <= s[i] <= 0x39:
        if x > _U63 // 10:
            raise GoSyntaxError("bad [0-9]*")
        x = x * 10 + s[i] - 0x30
        if x > _U63:
            raise GoSyntaxError("bad [0-9]*")
        i += 1
    return x, s[i:]


def _leading_fraction(s: bytes) -> tuple[int, float, bytes]:
    """``leadingFraction``: the digits after a period; past 63 bits it stops adding precision, no error."""
    x, scale, i, overflow = 0, 1.0, 0, False
    while i < len(s) and 0x30 <= s[i] <= 0x39:
        if not overflow:
            if x > (_U63 - 1) // 10:
                overflow = True
            else:
                y = x * 10 + s[i] - 0x30
                if y > _U63:
                    overflow = True
                else:
                    x, scale = y, scale * 10
        i += 1
    return x, scale, s[i:]


def parse_duration(text: str) -> int:
    """``time.ParseDuration``: nanoseconds (``"1m30s"`` is 90,000,000,000); :class:`GoSyntaxError` where Go fails.

    A possibly signed sequence of decimal numbers, each with an optional fraction and a unit (``ns``,
    ``us``/``µs``/``μs``, ``ms``, ``s``, ``m``, ``h``); ``"0"`` alone needs no unit.
    """
    s = text.encode("utf-8", "surrogatepass")
    d, neg = 0, False
    if s[:1] in (b"-", b"+"):
        neg, s = s[:1] == b"-", s[1:]
    if s == b"0":
        return 0
    if not s:
        raise GoSyntaxError(f"time: invalid duration {text!r}")
    while s:
        if not (s[0] == 0x2E or 0x30 <= s[0] <= 0x39):  # the next byte must be [0-9.]
            raise GoSyntaxError(f"time: invalid duration {text!r}")
        before = len(s)
        try:
            v, s = _leading_int(s)
        except GoSyntaxError:
            raise GoSyntaxError(f"time: invalid duration {text!r}") from None
        pre = before != len(s)
        f, scale, post = 0, 1.0, False
        if s[:1] == b".":
            s = s[1:]
            before = len(s)
            f, scale, s = _leading_fraction(s)
            post = before != len(s)
        if not pre and not post:
            raise GoSyntaxError(f"time: invalid duration {text!r}")
        i = 0
        while i < len(s) and not (s[i] == 0x2E or 0x30 <= s[i] <= 0x39):
            i += 1
        if i == 0:
            raise GoSyntaxError(f"time: missing unit in duration {text!r}")
        unit = _UNITS.get(s[:i])
        s = s[i:]
        if unit is None:
            raise GoSyntaxError(f"time: unknown unit in duration {text!r}")
        if v > _U63 // unit:
            raise GoSyntaxError(f"time: invalid duration {text!r}")
        v *= unit
        if f > 0:
            # Go: uint64(float64(f) * (float64(unit) / scale)), truncated towards zero
            v += int(float(f) * (float(unit) / scale))
            if v > _U63:
                raise GoSyntaxError(f"time: invalid duration {text!r}")
        d += v
        if d > _U63:
            raise GoSyntaxError(f"time: invalid duration {text!r}")
    if neg:
        return _wrap(-d)
    if d > _INT64_MAX:
        raise GoSyntaxError(f"time: invalid duration {text!r}")
    return d


def atoi(text: str) -> int:
    """``strconv.Atoi`` on a 64-bit platform: an optional sign and decimal digits, within int64 (no spaces,
    no underscores); :class:`GoSyntaxError` otherwise."""
    s = text[1:] if text[:1] in ("+", "-") else text
    if not s or not all("0" <= c <= "9" for c in s):  # (str.isdigit would take other scripts' digits)
        raise GoSyntaxError(f"strconv.Atoi: parsing {text!r}: invalid syntax")
    value = -int(s) if text[:1] == "-" else int(s)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise GoSyntaxError(f"strconv.Atoi: parsing {text!r}: value out of range")
    return value


def seconds_duration(seconds: int) -> int:
    """``time.Duration(seconds) * time.Second`` in nanoseconds, wrapping around int64 as Go's arithmetic does."""
    return _wrap(seconds * 1_000_000_000)


def _wrap(value: int) -> int:
    """An integer as Go's int64 holds it (two's complement wrap-around)."""
    return (value + _U63) % (1 << 64) - _U63
