"""A metric's window: the aggregates of one metric since the previous report, and its one-pass reader."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._checks import (
    _check_int,
    _isfinite,
    _object,
    _optional_float,
    _required,
)
from ._errors import ProtocolError, _prefix, _show
from ._limits import LIMITS
from ._values import decode_float, encode_float, is_valid_metric_name, validate_metric_name

__all__ = ["MetricWindow"]


@dataclass(frozen=True)
class MetricWindow:
    """Aggregates of one metric since the previous report.

    ``count`` counts every value logged, ``nonfinite`` those that were NaN or ±Inf; ``min``,
    ``max`` and ``mean`` are over the finite values only (``None`` when there were none), and
    ``last`` is the last value, finite or not. ``first_step``..``last_step`` is the step range.
    """

    name: str
    last: float
    min: float | None
    max: float | None
    mean: float | None
    count: int
    nonfinite: int
    first_step: int
    last_step: int

    def __post_init__(self) -> None:
        validate_metric_name(self.name)
        if not isinstance(self.last, (int, float)) or isinstance(self.last, bool):
            raise ProtocolError("last", f"must be a number, got {_show(self.last)}")
        for name in ("min", "max", "mean"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise ProtocolError(name, f"must be a number or null, got {_show(value)}")
        _check_int(self.count, "count", minimum=1)
        _check_int(self.nonfinite, "nonfinite", minimum=0)
        if self.nonfinite > self.count:
            raise ProtocolError("nonfinite", f"must be at most count ({self.count}), got {self.nonfinite}")
        _check_int(self.first_step, "first_step", minimum=0)
        _check_int(self.last_step, "last_step", minimum=0)
        if self.first_step > self.last_step:
            raise ProtocolError("last_step", f"must be >= first_step ({self.first_step}), got {self.last_step}")
        finite = (self.min, self.max, self.mean)
        if self.nonfinite == self.count:
            if any(v is not None for v in finite):
                raise ProtocolError("min", "min, max and mean must be null when every value is non-finite")
            return
        for name, value in zip(("min", "max", "mean"), finite):
            if value is None or not math.isfinite(value):
                raise ProtocolError(name, f"must be a finite number when some values are finite, got {value!r}")
        assert self.min is not None and self.max is not None and self.mean is not None
        if not self.min <= self.max:
            raise ProtocolError("max", f"must be >= min ({self.min!r}), got {self.max!r}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this window."""
        return {
            "name": self.name,
            "last": encode_float(self.last),
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "count": self.count,
            "nonfinite": self.nonfinite,
            "first_step": self.first_step,
            "last_step": self.last_step,
        }

    @classmethod
    def from_dict(cls, data: object, field: str = "metric") -> MetricWindow:
        """Validate and read one window."""
        if type(data) is dict:
            fast = _window_at_once(cls, data)
            if fast is not None:
                return fast
        return cls._field_by_field(data, field)

    @classmethod
    def _field_by_field(cls, data: object, field: str = "metric") -> MetricWindow:
        """The reading every body gets that the one-pass reader does not take (the reference its
        tests compare it with): each field checked in turn, errors with their JSON path."""
        obj = _object(data, field)
        with _prefix(field):
            return cls(
                name=_required(obj, "name"),
                last=decode_float(_required(obj, "last"), "last"),
                min=_optional_float(obj, "min"),
                max=_optional_float(obj, "max"),
                mean=_optional_float(obj, "mean"),
                count=_required(obj, "count"),
                nonfinite=obj.get("nonfinite", 0),
                first_step=_required(obj, "first_step"),
                last_step=_required(obj, "last_step"),
            )

    def merge(self, newer: MetricWindow) -> MetricWindow:
        """One window covering this one and a newer one of the same metric."""
        if newer.name != self.name:
            raise ProtocolError("name", f"cannot merge a window of {newer.name!r} into one of {self.name!r}")
        finite_self = self.count - self.nonfinite
        finite_new = newer.count - newer.nonfinite
        finite = finite_self + finite_new
        if finite_self and finite_new:
            assert self.min is not None and self.max is not None and self.mean is not None
            assert newer.min is not None and newer.max is not None and newer.mean is not None
            lo: float | None = min(self.min, newer.min)
            hi: float | None = max(self.max, newer.max)
            # a weighted step from the older mean: no overflow near the largest floats
            step = self.mean + (newer.mean - self.mean) * (finite_new / finite)
            if not math.isfinite(step):  # means of opposite signs near the largest floats: weigh each
                step = self.mean * (finite_self / finite) + newer.mean * (finite_new / finite)
            mean: float | None = step
        else:
            source = self if finite_self else newer
            lo, hi, mean = source.min, source.max, source.mean
        return MetricWindow(
            name=self.name,
            last=newer.last,
            min=lo,
            max=hi,
            mean=mean,
            count=self.count + newer.count,
            nonfinite=self.nonfinite + newer.nonfinite,
            first_step=min(self.first_step, newer.first_step),
            last_step=max(self.last_step, newer.last_step),
        )


_KNOWN_METRIC_NAMES: set[str] = set()
"""Metric names already found valid (a server reads the same few names in every report); bounded."""


def _windows(items: list[Any]) -> tuple[MetricWindow, ...]:
    """The windows of a report's ``metrics`` array, as ``MetricWindow.from_dict(item, f"metrics[{i}]")`` reads
    each (its field's name made only for a window read field by field)."""
    windows = []
    for i, item in enumerate(items):
        window = _window_at_once(MetricWindow, item) if type(item) is dict else None
        windows.append(window if window is not None else MetricWindow._field_by_field(item, f"metrics[{i}]"))
    return tuple(windows)


def _window_at_once(cls: type[MetricWindow], obj: dict[str, Any]) -> MetricWindow | None:
    """The window of a JSON object in the shape the report core sends (finite floats, integer counts and
    steps, every field present), checked in one pass and built without ``__init__``; ``None`` for
    anything else, which :meth:`MetricWindow.from_dict` then reads field by field (so every error keeps
    its words and its field). It accepts exactly what ``__post_init__`` would, and builds the same
    window: a server reads five to fifty of these per report."""
    try:
        name, last, lo, hi, mean = obj["name"], obj["last"], obj["min"], obj["max"], obj["mean"]
        count, nonfinite, first_step, last_step = obj["count"], obj["nonfinite"], obj["first_step"], obj["last_step"]
    except KeyError:
        return None
    top = LIMITS.max_integer
    if not (
        type(name) is str
        and type(last) is float
        and type(lo) is float
        and type(hi) is float
        and type(mean) is float
        and type(count) is int
        and type(nonfinite) is int
        and type(first_step) is int
        and type(last_step) is int
        and 0 <= nonfinite < count <= top
        and 0 <= first_step <= last_step <= top
        and _isfinite(lo)
        and _isfinite(hi)
        and _isfinite(mean)
        and lo <= hi
    ):
        return None
    if name not in _KNOWN_METRIC_NAMES:
        if not is_valid_metric_name(name):
            return None
        if len(_KNOWN_METRIC_NAMES) >= 4096:
            _KNOWN_METRIC_NAMES.clear()
        _KNOWN_METRIC_NAMES.add(name)
    window = object.__new__(cls)
    window.__dict__.update(
        name=name,
        last=last,
        min=lo,
        max=hi,
        mean=mean,
        count=count,
        nonfinite=nonfinite,
        first_step=first_step,
        last_step=last_step,
    )
    return window
