"""A token bucket: the runner's cap on API writes, and the pod-token rate limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; :meth:`take` waits for one."""

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(rate, 1.0)
        self.tokens = self.burst
        self.clock = clock
        self.at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def try_take(self) -> float:
        """Take a token now (0.0), or say how many seconds until one is there (nothing taken)."""
        self._refill()
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    async def take(self) -> None:
        """Wait for a token and take it."""
        while (wait := self.try_take()) > 0:
            await asyncio.sleep(wait)
