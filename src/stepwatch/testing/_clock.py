"""A clock that moves only when the test says so, for code that takes a clock (``create_app(clock=...)``)."""

from __future__ import annotations

__all__ = ["FakeClock"]

START = 1_800_000_000.0
"""The default first reading (2027-01-15): far from 0, so that a time of 0 (a missing value) shows."""


class FakeClock:
    """A callable clock (seconds, as ``time.time``) that stands still until :meth:`advance` moves it.

    ::

        clock = FakeClock()
        app = create_app(settings, clock=clock)
        clock.advance(600)          # ten minutes without a report: a stall, with no sleep
    """

    def __init__(self, start: float = START) -> None:
        self.now = start

    def __call__(self) -> float:
        """The current reading."""
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` forward; the new reading."""
        self.now += seconds
        return self.now
