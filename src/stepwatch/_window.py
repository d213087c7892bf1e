"""Metric windows: the hot path's queue and the per-metric series the sender folds it into.

The hot path only appends its keyword dict, with the step under the key ``0``, to a deque (atomic
under the GIL). Folding moves each
value into its metric's series (two list appends); reducing a series to last, min, max, mean,
count, non-finite count and step range uses the C builtins ``sum``, ``min`` and ``max`` over whole
lists, so per-value work stays a few dozen nanoseconds.

Values that live on an accelerator (CUDA tensors, JAX arrays on a device) are kept by reference and
turned into floats only in the sender thread, in one batched transfer per device and dtype: the
training thread never waits for a device.

Memory is bounded: at most ``max_metrics`` series; a series is reduced to its aggregates whenever
it holds ``series_cap`` values; device values held back by a reduction on the training thread are
capped at ``max_held`` per metric (the oldest beyond it are dropped and counted); and the queue is
folded by the training thread itself past ``hard_limit`` entries (see ``Run.step``).
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

_DEVICE_MODULES = frozenset({"torch", "jax", "jaxlib", "tensorflow", "cupy", "mlx"})
_FOLD_CHUNK = 512
STEP_KEY = 0
"""The key under which a queued metrics dict carries its step (no keyword argument is an int)."""
_FLOAT_ONLY = frozenset({float})


class _Series:
    """The values of one metric in the current window, and the aggregates of those already reduced."""

    __slots__ = (
        "count",
        "first_step",
        "held",
        "hi",
        "last",
        "last_step",
        "lo",
        "nonfinite",
        "steps",
        "total",
        "values",
    )

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.steps: list[int] = []
        self.held: list[tuple[int, Any]] = []
        self.count = 0
        self.nonfinite = 0
        self.total = 0.0
        self.lo = math.inf
        self.hi = -math.inf
        self.last = math.nan
        self.first_step = -1
        self.last_step = -1

    def reduce(self, buffer: WindowBuffer, name: str, on_training_thread: bool) -> None:
        """Fold the listed values into the aggregates (device values wait if on the training thread)."""
        values, steps = self.values[:], self.steps[:]
        self.values.clear()  # cleared in place: the drain loop holds their bound append methods
        self.steps.clear()
        if not on_training_thread and self.held:
            steps = [s for s, _ in self.held] + steps
            values = [v for _, v in self.held] + values
            self.held = []
        if not values:
            return
        if not _FLOAT_ONLY.issuperset(map(type, values)):
            values, steps = self._convert(buffer, name, values, steps, on_training_thread)
            if not values:
                return
        total = sum(values)
        if total - total == 0.0:  # every value finite (a NaN or an infinity makes the sum non-finite)
            finite = values
        else:
            finite = [v for v in values if v - v == 0.0]
            self.nonfinite += len(values) - len(finite)
            total = sum(finite)
        if finite:
            self.total += total
            lo, hi = min(finite), max(finite)
            self.lo = min(self.lo, lo)
            self.hi = max(self.hi, hi)
        self.count += len(values)
        self.last = values[-1]
        first, last = min(steps), max(steps)
        if self.first_step < 0 or first < self.first_step:
            self.first_step = first
        self.last_step = max(self.last_step, last)

    def _convert(
        self, buffer: WindowBuffer, name: str, values: list[Any], steps: list[int], on_training_thread: bool
    ) -> tuple[list[float], list[int]]:
        """Floats in logging order; values that cannot be read here are held back or dropped."""
        out: list[float | None] = [None] * len(values)
        device: list[int] = []
        for i, value in enumerate(values):
            cls = value.__class__
            if cls is float:
                out[i] = value
            elif cls.__module__.partition(".")[0] in _DEVICE_MODULES:
                device.append(i)
            else:
                try:
                    out[i] = float(value)
                except Exception:  # a user's object may raise anything from __float__
                    buffer.drop(name, f"a value of type {cls.__name__} is not a number")
        if device and on_training_thread:  # only values already in host memory may be read here
            held = [i for i in device if not _on_cpu(values[i])]
            self.held.extend((steps[i], values[i]) for i in held)
            if len(self.held) > buffer.max_held:
                del self.held[: len(self.held) - buffer.max_held]
                buffer.drop(name, "more accelerator values than fit in one window; the oldest were dropped")
            device = [i for i in device if _on_cpu(values[i])]
        if device:
            for i, number in zip(device, _to_floats([values[i] for i in device])):
                out[i] = number
                if number is None:
                    buffer.drop(name, "an accelerator value that is not a single number")
        kept = [i for i, number in enumerate(out) if number is not None]
        return [out[i] for i in kept], [steps[i] for i in kept]  # type: ignore[misc]

    def window(self, name: str) -> MetricWindow | None:
        if self.count == 0:
            return None
        finite = self.count - self.nonfinite
        mean = self.total / finite if finite else None
        if mean is not None and not math.isfinite(mean):
            # the sum of values near the largest floats overflowed: the mean lies within [min, max]
            mean = self.lo / 2 + self.hi / 2 if math.isnan(mean) else min(max(mean, self.lo), self.hi)
        return MetricWindow(
            name=name,
            last=self.last,
            min=self.lo if finite else None,
            max=self.hi if finite else None,
            mean=mean,
            count=self.count,
            nonfinite=self.nonfinite,
            first_step=max(self.first_step, 0),
            last_step=max(self.last_step, 0),
        )


class WindowBuffer:
    """The queue the hot path appends to, and the series of the current window."""

    def __init__(
        self,
        *,
        max_metrics: int = LIMITS.max_metrics_per_report,
        series_cap: int = 4096,
        max_held: int = 4096,
    ) -> None:
        self.queue: deque[dict[Any, Any]] = deque()
        """Keyword dicts of ``step()``/``log()``, each with its step under :data:`STEP_KEY`."""
        self.max_metrics = max_metrics
        self.series_cap = series_cap
        self.max_held = max_held
        self._lock = threading.Lock()
        self._series: dict[str, _Series] = {}
        self._appends: dict[str, tuple[Any, Any]] = {}
        self._known: set[str] = set()
        self._rejected: set[str] = set()
        self.dropped = 0
        """Values dropped since the run started (bad names, non-numbers, over the limits)."""

    def reset_after_fork(self) -> None:
        """Fresh lock and empty state in a forked child (the parent's lock may be held)."""
        self._lock = threading.Lock()
        self.queue = deque()
        self._series = {}
        self._appends = {}

    def add(self, step: int, metrics: dict[str, Any]) -> None:
        """Queue metrics at a step (the hot path of ``Run.step`` does the same inline)."""
        self.queue.append({**metrics, STEP_KEY: step})

    def drain(self, on_training_thread: bool = False) -> None:
        """Fold everything queued so far into the current window."""
        queue = self.queue
        popleft = queue.popleft
        while queue:
            with self._lock:
                series = self._series
                appends = self._appends
                for _ in range(_FOLD_CHUNK):
                    try:
                        metrics = popleft()
                    except IndexError:
                        break
                    step = metrics.pop(STEP_KEY, 0)
                    for name, value in metrics.items():
                        pair = appends.get(name)
                        if pair is None:
                            if name not in self._known and not self._admit(name):
                                continue
                            s = series[name] = _Series()
                            pair = appends[name] = (s.values.append, s.steps.append)
                        pair[0](value)
                        pair[1](step)
                cap = self.series_cap
                for name, s in series.items():
                    if len(s.values) >= cap:
                        s.reduce(self, name, on_training_thread)

    def take(self) -> list[MetricWindow]:
        """Close the current window (sender thread): drain, resolve device values, return the windows."""
        self.drain()
        with self._lock:
            series, self._series = self._series, {}
            self._appends = {}
        windows = []
        for name, s in series.items():
            try:  # one metric that cannot be read must not take the others with it
                s.reduce(self, name, on_training_thread=False)
                window = s.window(name)
            except Exception as exc:
                self.drop(name, f"its window could not be closed ({type(exc).__name__}: {exc})")
                continue
            if window is not None:
                windows.append(window)
        return windows

    def _admit(self, name: object) -> bool:
        if not is_valid_metric_name(name):
            self.drop(name, f"a metric name must be 1-{LIMITS.max_metric_name_length} printable characters")
            return False
        if len(self._known) >= self.max_metrics:
            self.drop(name, f"a run reports at most {self.max_metrics} distinct metrics")
            return False
        assert isinstance(name, str)
        self._known.add(name)
        return True

    def drop(self, name: object, why: str) -> None:
        """Count a dropped value and warn once per metric."""
        self.dropped += 1
        key = repr(name)[:80]
        if key not in self._rejected and len(self._rejected) < 1024:
            self._rejected.add(key)
            _log.warning("stepwatch: dropped metric %s: %s (warned once per metric)", key, why)


def _on_cpu(value: Any) -> bool:
    """Whether reading ``value`` needs no device synchronisation (a CPU tensor, a computed CPU array).

    A JAX array on the CPU may still be computing (dispatch is asynchronous there too): it counts as
    readable only once ``is_ready()``.
    """
    try:
        device = getattr(value, "device", None)
        kind = getattr(device, "type", None)  # torch: device.type; JAX: a Device with platform
        if kind is None:
            kind = getattr(device, "platform", None)
            if kind == "cpu" and callable(getattr(value, "is_ready", None)):
                return bool(value.is_ready())
        return kind == "cpu"
    except Exception:  # a sharded array without one device, say: read it in the sender
        return False


def _to_floats(values: list[Any]) -> list[float | None]:
    """Floats of device values: torch tensors in one stacked transfer, JAX arrays in one
    pass (all copies started before the first is waited for), others one by one.

    The common case (scalars of one device and dtype) costs one ``torch.stack`` and one copy; mixed
    devices, dtypes or shapes fall back to one group per kind, and the rest to ``float()``.
    """
    out: list[float | None] = [None] * len(values)
    torch: Any = sys.modules.get("torch")
    tensor_type = torch.Tensor if torch is not None else ()
    tensors = [i for i, value in enumerate(values) if isinstance(value, tensor_type)]
    jax: Any = sys.modules.get("jax")
    array_type = getattr(jax, "Array", ()) if jax is not None else ()
    arrays = [i for i, value in enumerate(values) if isinstance(value, array_type)]
    batched = set(tensors) | set(arrays)
    for i, value in enumerate(values):
        if i not in batched:
            out[i] = _one_float(value)
    if arrays:
        _arrays_into(values, arrays, out)
    if tensors and not _stack_into(torch, values, tensors, out):
        groups: dict[tuple[Any, Any, Any], list[int]] = {}
        for i in tensors:
            value = values[i]
            groups.setdefault((value.device, value.dtype, tuple(value.shape)), []).append(i)
        for indices in groups.values():
            if not _stack_into(torch, values, indices, out):
                for i in indices:
                    out[i] = _one_float(values[i])
    return out


def _stack_into(torch: Any, values: list[Any], indices: list[int], out: list[float | None]) -> bool:
    try:
        with torch.no_grad():
            numbers = torch.stack([values[i] for i in indices]).double().cpu().reshape(-1).tolist()
    except Exception:  # devices, dtypes or shapes differ
        return False
    if len(numbers) != len(indices):  # tensors of more than one element are not metrics
        return False
    for i, number in zip(indices, numbers):
        out[i] = float(number)
    return True


def _arrays_into(values: list[Any], indices: list[int], out: list[float | None]) -> None:
    """Floats of JAX arrays: every copy off an accelerator started before the first is waited for.

    What ``jax.device_get`` does, without its per-leaf tree walk: for arrays already in host memory
    (the CPU backend) ``numpy.asarray`` is a view of the buffer, 2 us a value against 9-10 us through
    ``device_get`` (measured on 1,000 scalars; this is GIL time the training thread waits for).
    """
    numpy: Any = sys.modules.get("numpy")
    for i in indices:
        try:
            if values[i].device.platform != "cpu":
                values[i].copy_to_host_async()
        except Exception:  # a sharded array has no single device: numpy.asarray gathers it below
            pass
    for i in indices:
        try:  # each on its own: a deleted or donated buffer must not spoil the others
            host = numpy.asarray(values[i])
            if host.size == 1:  # arrays of more than one element are not metrics
                out[i] = float(host.reshape(()))
        except Exception:
            out[i] = None


def _one_float(value: Any) -> float | None:
    try:
        return float(value)
    except Exception:
        return None
