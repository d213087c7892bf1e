"""Metric windows: the hot path's queue and the per-metric aggregates the sender folds it into.

The hot path only appends ``(step, metrics)`` to a deque (an atomic operation under the GIL). The
sender thread drains the deque and folds each value into an :class:`_Aggregate` (last, min, max,
sum, count, non-finite count, step range). Values that live on a device (torch tensors, JAX
arrays) are kept by reference and turned into floats only when the sender takes the window, in
one batched transfer per device, so the training thread never waits for a device.

Memory is bounded: at most ``max_metrics`` aggregates, each of fixed size, plus at most
``hard_limit`` queued entries (past it the hot path folds inline, which converts no device value)
and at most ``max_deferred`` device values per metric and window (past it the oldest are dropped
and counted).
"""

from __future__ import annotations

import logging
import math
import sys
import threading
from collections import deque
from typing import Any

from .protocol import LIMITS, MetricWindow, is_valid_metric_name

__all__ = ["WindowBuffer"]

_log = logging.getLogger("stepwatch")

_DEVICE_MODULES = ("torch", "jax", "jaxlib", "tensorflow", "cupy", "mlx")
_FOLD_CHUNK = 256


class _Aggregate:
    """Running aggregates of one metric within one window."""

    __slots__ = (
        "count",
        "deferred",
        "first_step",
        "hi",
        "last",
        "last_order",
        "last_step",
        "lo",
        "nonfinite",
        "order",
        "total",
    )

    def __init__(self) -> None:
        self.count = 0
        self.nonfinite = 0
        self.total = 0.0
        self.lo = math.inf
        self.hi = -math.inf
        self.last = math.nan
        self.last_order = -1
        self.order = 0
        self.first_step = -1
        self.last_step = -1
        self.deferred: list[tuple[int, int, Any]] = []

    def add(self, step: int, value: float, order: int) -> None:
        self.count += 1
        if value - value == 0.0:  # finite: inf - inf and nan - nan are nan
            self.total += value
            self.lo = min(self.lo, value)
            self.hi = max(self.hi, value)
        else:
            self.nonfinite += 1
        if order > self.last_order:  # device values resolve later than the plain ones logged after them
            self.last = value
            self.last_order = order
        if self.first_step < 0 or step < self.first_step:
            self.first_step = step
        self.last_step = max(self.last_step, step)

    def window(self, name: str) -> MetricWindow | None:
        if self.count == 0:
            return None
        finite = self.count - self.nonfinite
        return MetricWindow(
            name=name,
            last=self.last,
            min=self.lo if finite else None,
            max=self.hi if finite else None,
            mean=self.total / finite if finite else None,
            count=self.count,
            nonfinite=self.nonfinite,
            first_step=max(self.first_step, 0),
            last_step=max(self.last_step, 0),
        )


class WindowBuffer:
    """The queue the hot path appends to, and the aggregates of the current window."""

    def __init__(
        self,
        *,
        max_metrics: int = LIMITS.max_metrics_per_report,
        hard_limit: int = 16384,
        max_deferred: int = 8192,
    ) -> None:
        self.queue: deque[tuple[int, dict[str, Any]]] = deque()
        self.hard_limit = hard_limit
        self.max_deferred = max_deferred
        self.max_metrics = max_metrics
        self._lock = threading.Lock()
        self._aggregates: dict[str, _Aggregate] = {}
        self._known: set[str] = set()
        self._rejected: set[str] = set()
        self.dropped = 0
        """Values dropped since the run started (bad names, non-numbers, over the limits)."""

    def reset_after_fork(self) -> None:
        """Fresh lock and empty state in a forked child (the parent's lock may be held)."""
        self._lock = threading.Lock()
        self.queue = deque()
        self._aggregates = {}

    # ----------------------------------------------------------------------------------------- fold

    def drain(self) -> None:
        """Fold everything queued so far into the current aggregates (never converts device values)."""
        queue = self.queue
        while queue:
            with self._lock:
                for _ in range(_FOLD_CHUNK):
                    try:
                        step, metrics = queue.popleft()
                    except IndexError:
                        break
                    self._fold(step, metrics)

    def _fold(self, step: int, metrics: dict[str, Any]) -> None:
        aggregates = self._aggregates
        for name, value in metrics.items():
            agg = aggregates.get(name)
            if agg is None:
                if name not in self._known and not self._admit(name):
                    continue
                agg = aggregates[name] = _Aggregate()
            agg.order += 1
            cls = value.__class__
            if cls is float:
                agg.add(step, value, agg.order)
            elif getattr(cls, "__module__", "").partition(".")[0] in _DEVICE_MODULES:
                deferred = agg.deferred
                deferred.append((agg.order, step, value))
                if len(deferred) > self.max_deferred:
                    del deferred[: len(deferred) - self.max_deferred]
                    self._drop(name, "more device values than fit in one window; the oldest were dropped")
            else:
                try:
                    number = float(value)
                except (TypeError, ValueError, OverflowError):
                    self._drop(name, f"value of type {cls.__name__} is not a number")
                    continue
                agg.add(step, number, agg.order)

    def _admit(self, name: object) -> bool:
        if not is_valid_metric_name(name):
            self._drop(name, "a metric name must be 1-64 printable characters")
            return False
        if len(self._known) >= self.max_metrics:
            self._drop(name, f"a run reports at most {self.max_metrics} distinct metrics")
            return False
        assert isinstance(name, str)
        self._known.add(name)
        return True

    def _drop(self, name: object, why: str) -> None:
        self.dropped += 1
        key = repr(name)[:80]
        if key not in self._rejected and len(self._rejected) < 1024:
            self._rejected.add(key)
            _log.warning("stepwatch: dropped metric %s: %s (warned once per metric)", key, why)

    # ----------------------------------------------------------------------------------------- take

    def take(self) -> list[MetricWindow]:
        """Close the current window: drain the queue, resolve device values, return the windows."""
        self.drain()
        with self._lock:
            aggregates, self._aggregates = self._aggregates, {}
        self._resolve_deferred(aggregates)
        windows = []
        for name, agg in aggregates.items():
            window = agg.window(name)
            if window is not None:
                windows.append(window)
        return windows

    def _resolve_deferred(self, aggregates: dict[str, _Aggregate]) -> None:
        """Turn the deferred device values into floats, one transfer per device and dtype."""
        pending = [(name, agg) for name, agg in aggregates.items() if agg.deferred]
        if not pending:
            return
        floats = _to_floats([value for _, agg in pending for (_, _, value) in agg.deferred])
        i = 0
        for name, agg in pending:
            deferred, agg.deferred = agg.deferred, []
            for order, step, _ in deferred:
                number = floats[i]
                i += 1
                if number is None:
                    self._drop(name, "a device value that is not a single number")
                else:
                    agg.add(step, number, order)


def _to_floats(values: list[Any]) -> list[float | None]:
    """Floats of device values: torch tensors batched per device and dtype, others one by one."""
    out: list[float | None] = [None] * len(values)
    torch: Any = sys.modules.get("torch")
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, value in enumerate(values):
        if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1:
            groups.setdefault((value.device, value.dtype), []).append(i)
            continue
        out[i] = _one_float(value)
    for indices in groups.values():
        try:
            with torch.no_grad():
                stacked = torch.stack([values[i].detach().reshape(()) for i in indices])
                numbers = stacked.double().cpu().tolist()
            for i, number in zip(indices, numbers):
                out[i] = float(number)
        except Exception:  # a dtype that does not stack or convert: fall back to one at a time
            for i in indices:
                out[i] = _one_float(values[i])
    return out


def _one_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None
