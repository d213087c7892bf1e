"""Second signals for ``not_learning``: the learning rate and an evaluation metric, beside the loss.

A :class:`~.health.HealthTracker` follows one primary metric (the training loss). Trainers report
more: the learning rate (Hugging Face ``learning_rate``, Lightning ``lr-*``) and evaluation metrics
(``eval_loss``, ``val_loss``, ``eval_accuracy``). These classes keep what the plateau verdict needs
of them, bounded in memory and O(1) amortised per observation:

- :class:`LearningRate`: the peak, the newest value, since when it has been (nearly) zero, and the
  *learning-rate area* (the sum of the learning rate over the steps). A loss is a function of that
  area far more than of time (the schedule's decay slows the loss by design), so the plateau test
  measures its rates of improvement per unit of area when the job reports a learning rate; and a
  learning rate of zero cannot learn: a plateau then is certain.
- :class:`EvalTrend`: the evaluation metric's points; is it improving significantly since a given
  time (where the training loss went flat)? An evaluation on a fixed set is a second, independent
  measurement of learning: a job whose evaluation metric still improves beyond its noise is not
  flagged.

``docs/health.md`` explains the rules and measures them.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import islice
from operator import sub

__all__ = ["EvalTrend", "LearningRate", "eval_direction"]


def eval_direction(name: str) -> str:
    """Whether an evaluation metric is minimised or maximised, from its name (``min`` for a loss)."""
    lowered = name.lower()
    if any(word in lowered for word in ("acc", "f1", "bleu", "rouge", "auc", "precision", "recall", "score")):
        return "max"
    return "min"


class LearningRate:
    """What is known of a job's learning rate in one segment (see the module docstring)."""

    __slots__ = ("_area", "_step", "last", "peak", "zero_since")

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.peak = 0.0
        """The highest learning rate seen."""
        self.last: float | None = None
        """The newest learning rate."""
        self.zero_since: tuple[float, int] | None = None
        """(time, step) since which the learning rate has been at most ``zero_fraction`` of its peak."""
        self._area = 0.0
        self._step: int | None = None

    def observe(self, t: float, step: int, lr: float, zero_fraction: float) -> None:
        """The learning rate in force at ``step`` (the largest of the job's parameter groups)."""
        if not math.isfinite(lr) or lr < 0:
            return
        if self._step is not None and step < self._step:  # a restart from a checkpoint: learnt afresh
            self._reset()
        if self._step is not None and self.last is not None:
            self._area += self.last * (step - self._step)  # the rate in force over the steps since
        elif self._step is None:
            # the steps before the first report (a warm-up's few, or a resumed job's many) at this rate:
            # the logarithm of the area needs its origin at step 0, not at the first report
            self._area = lr * max(step, 0)
        self._step = step
        self.last = lr
        self.peak = max(self.peak, lr)
        if self.peak > 0 and lr <= zero_fraction * self.peak:
            if self.zero_since is None:
                self.zero_since = (t, step)
        else:
            self.zero_since = None

    def area(self, step: int) -> float:
        """The learning-rate area from step 0 up to ``step`` (the newest rate carried on; the first rate
        reported taken as in force before it); NaN before a rate is known."""
        if self._step is None or self.last is None:
            return math.nan
        return self._area + self.last * max(step - self._step, 0)


class EvalTrend:
    """The newest points of an evaluation metric (bounded), and a test of its improvement."""

    __slots__ = ("_points", "_sign")

    def __init__(self, direction: str = "min", keep: int = 128) -> None:
        self._sign = 1.0 if direction == "min" else -1.0
        self._points: deque[tuple[float, float]] = deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self._points)

    def observe(self, t: float, value: float) -> None:
        """One evaluation (its newest value) at server time ``t``; a repeat of the same value and time is kept once."""
        if not math.isfinite(value):
            return
        if self._points and self._points[-1][0] >= t:
            return
        self._points.append((t, value))

    def newest(self) -> float:
        """The time of the newest point (-inf before any)."""
        return self._points[-1][0] if self._points else -math.inf

    def improvement(self, since: float, span: float, min_points: int) -> tuple[float, float, int] | None:
        """The improvement since ``since``, relative per ``span`` seconds, its standard error and the
        points it rests on; ``None`` with fewer than ``min_points`` points since then.

        The slope of a least-squares line through the points since ``since``; the noise of one point
        is measured robustly over all points kept (1.48 x the median absolute deviation of the
        differences of successive points, over sqrt(2)), so a few points still have a steady error.
        """
        points = self._points
        if len(points) < min_points:
            return None
        recent = [p for p in points if p[0] >= since]
        n = len(recent)
        if n < min_points:
            return None
        values = [v for _, v in points]
        diffs = sorted(map(sub, islice(values, 1, None), values))
        mid = diffs[len(diffs) // 2]
        spread = sorted(abs(d - mid) for d in diffs)
        t_mean = sum(t for t, _ in recent) / n
        v_mean = sum(v for _, v in recent) / n
        sxx = sum((t - t_mean) ** 2 for t, _ in recent)
        if sxx <= 0 or v_mean == 0:
            return None
        # a floor of 0.001 % of the level: values that repeat (a rounded accuracy) have no zero noise
        sigma = max(1.4826 * spread[len(spread) // 2] / math.sqrt(2), 1e-5 * abs(v_mean))
        slope = sum((t - t_mean) * (v - v_mean) for t, v in recent) / sxx
        unit = span / abs(v_mean)
        return -self._sign * slope * unit, sigma / math.sqrt(sxx) * unit, n
