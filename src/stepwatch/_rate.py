"""The recent pace of a run, sampled by the sender thread (the hot path never reads a clock)."""

from __future__ import annotations

from collections import deque

__all__ = ["RateMeter"]


class RateMeter:
    """Steps per second over the last ``horizon`` seconds of (time, step) samples.

    A recent window, not the lifetime average: warm-up and a resumed job's first step do not
    distort it. A step that goes backwards (a job resumed from an earlier checkpoint) restarts it.
    """

    def __init__(self, horizon: float = 60.0, max_samples: int = 128) -> None:
        self.horizon = horizon
        self._samples: deque[tuple[float, int]] = deque(maxlen=max_samples)

    def add(self, now: float, step: int | None) -> None:
        """Record the step seen at ``now`` (monotonic seconds)."""
        if step is None:
            return
        if self._samples and step < self._samples[-1][1]:
            self._samples.clear()
        self._samples.append((now, step))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.horizon:
            self._samples.popleft()

    def steps_per_second(self) -> float | None:
        """The recent rate, or ``None`` before two samples with time between them."""
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return None
        return (s1 - s0) / (t1 - t0)

    def eta_seconds(self, step: int | None, total: int | None) -> float | None:
        """Seconds until ``total`` at the recent rate; ``None`` when unknown."""
        rate = self.steps_per_second()
        if step is None or total is None or not rate:
            return None
        return max(total - step, 0) / rate
