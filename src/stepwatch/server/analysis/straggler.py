"""Stragglers: a rank persistently slower than the median rank, named with where its extra time goes.

Two measures of a rank's slowness against the median rank, the larger one counts:

- its **step rate** over the last ``rate_window_s`` (ranks that step on their own: the median rank's rate
  over its own);
- its **busy share** (:meth:`.stall.RankPlaces.busy`: the share of its time not in a collective and not
  waiting, from its activity shares): in synchronous data parallelism every rank steps at the same
  rate, and the slow one is the one the others wait for; its busy share over the median rank's.

A rank ``1 / straggler_fraction`` (1.5) times slower or more for ``straggler_hold_s`` (5 min) is named:
rank, host, how much slower, where its extra time goes (its activity shares against the median rank's)
and the elastic hint: the job's pace is its slowest rank's, so without it the job would run as fast as
its next slowest rank (the ETA said both ways). It is a health (``straggling``) and its event; no policy
acts on it: it never stops a job by itself.

Pure; the state is one time per rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import median

from .stall import RankPlaces, duration, straggler_words

__all__ = ["KEEP", "RankPace", "Stragglers"]

KEEP = 0.9
"""A rank found slow stays slow while its slowness is at least this share of the ratio (1.35 for 1.5)."""


@dataclass(frozen=True, slots=True)
class RankPace:
    """A rank's recent step rate as the tracker measured it (``None``: not enough of it yet)."""

    rank: int
    rate: float | None


class Stragglers:
    """Per job: since when each rank has been slow (see the module docstring)."""

    def __init__(self, fraction: float, hold_s: float) -> None:
        self.ratio = 1.0 / fraction
        """How many times slower than the median rank a straggler is (1.5)."""
        self.hold_s = hold_s
        self._slow_since: dict[int, float] = {}

    def restart(self, rank: int) -> None:
        """A rank's step went back: its slowness is learnt afresh."""
        self._slow_since.pop(rank, None)

    def scan(
        self,
        paces: Iterable[RankPace],
        places: RankPlaces,
        now: float,
        remaining_s: float | None,
    ) -> tuple[float, dict[str, object]] | None:
        """The straggler to name at ``now``, ``(since, evidence)``, or ``None``; ``remaining_s``: the job's
        ETA in seconds when known (for the elastic hint)."""
        ranks = list(paces)
        if len(ranks) < 2:
            return None
        slowness = self._slowness(ranks, places)
        worst: tuple[float, int] | None = None
        for rank, slow in slowness.items():
            # once slow, a rank stays slow down to KEEP x the ratio: its measure wanders with the noise of
            # its shares, and one report under 1.5 must not send 5 minutes of evidence back to zero
            if slow >= self.ratio or (rank in self._slow_since and slow >= KEEP * self.ratio):
                since = self._slow_since.setdefault(rank, now)
                if now - since >= self.hold_s and (worst is None or slow > worst[0]):
                    worst = (slow, rank)
            else:
                self._slow_since.pop(rank, None)
        if worst is None:
            return None
        slow, rank = worst
        since = self._slow_since[rank]
        return since, self._evidence(rank, slow, slowness, places, now, since, remaining_s)

    def _slowness(self, ranks: list[RankPace], places: RankPlaces) -> dict[int, float]:
        """Each rank's slowness against the median rank: the larger of its rate's and its busy share's."""
        found: dict[int, float] = {}
        rates = [r.rate for r in ranks if r.rate is not None]
        typical_rate = median(rates) if len(rates) >= 2 else None
        busy = {r.rank: b for r in ranks if (b := places.busy(r.rank)) is not None}
        typical_busy = median(busy.values()) if len(busy) >= 2 else None
        for r in ranks:
            slow = 1.0
            if typical_rate is not None and typical_rate > 0 and r.rate is not None:
                slow = max(slow, typical_rate / r.rate if r.rate > 0 else math.inf)
            b = busy.get(r.rank)
            if typical_busy is not None and typical_busy > 0 and b is not None:
                slow = max(slow, b / typical_busy)
            found[r.rank] = slow
        return found

    def _evidence(
        self,
        rank: int,
        slow: float,
        slowness: dict[int, float],
        places: RankPlaces,
        now: float,
        since: float,
        remaining_s: float | None,
    ) -> dict[str, object]:
        host = places.host(rank)
        others = [v for k, v in slowness.items() if k != rank]
        next_slowest = max(others) if others else 1.0
        speedup = slow / max(next_slowest, 1.0) if math.isfinite(slow) else math.inf
        who = f"rank {rank}" + (f" (host {host})" if host else "")
        times = f"{slow:.1f}x" if math.isfinite(slow) else "infinitely"
        message = f"{who} is {times} slower than the median rank, for {duration(now - since)}"
        typical_shares = _median_shares(places, [k for k in slowness if k != rank])
        extra = straggler_words(places.shares(rank), typical_shares)
        if extra:
            message += f"; {extra}"
        hint = ""
        if math.isfinite(speedup) and speedup >= 1.05:
            hint = f"without rank {rank} the job would run {speedup:.1f}x faster"
            if remaining_s is not None and math.isfinite(remaining_s) and remaining_s > 0:
                hint += f", ETA {duration(remaining_s / speedup)} instead of {duration(remaining_s)}"
            message += f"; {hint}"
        return {
            "metric": "rank_pace",
            "window": {"seconds": self.hold_s},
            "threshold": self.ratio,
            "observed": round(slow, 3) if math.isfinite(slow) else None,
            "since": since,
            "message": message,
            "rank": rank,
            "host": host,
            "ratio": round(slow, 3) if math.isfinite(slow) else None,
            "speedup_without": round(speedup, 3) if math.isfinite(speedup) else None,
            "activity_shares": places.shares(rank),
            "median_activity_shares": typical_shares,
            "hint": hint,
        }


def _median_shares(places: RankPlaces, ranks: list[int]) -> dict[str, float] | None:
    """The median, activity by activity, of these ranks' smoothed shares."""
    found = [s for s in (places.shares(r) for r in ranks) if s]
    if not found:
        return None
    keys = sorted({k for s in found for k in s})  # the same order in every process (a set's depends on its hash seed)
    return {k: median(s.get(k, 0.0) for s in found) for k in keys}
