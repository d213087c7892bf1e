"""What a job costs: GPUs x the price of a GPU hour, spent so far, projected at its ETA, and wasted.

Pure functions over a job's figures; the server calls them when it shows a job, so the figures of a
running job move with the clock. Prices are whatever the job (or its namespace's default) says,
in one currency (USD unless the settings say otherwise); a job with no GPUs or no price costs
``None``, shown as unknown rather than as free.

``wasted`` is the money spent while the job did no useful work: over every span of its verdict
history in which its health was bad (stalled, not learning, diverging; from the last real
improvement when the health analysis gives one), counted once where spans overlap, whether the job
has since recovered or ended (:func:`wasted_seconds`): what was wasted stays wasted. A job that
never had a bad verdict and is healthy has wasted nothing; an unknown health wastes ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "WASTEFUL_HEALTH",
    "Cost",
    "CostTotals",
    "PriceList",
    "job_cost",
    "parse_prices",
    "totals",
    "wasted_seconds",
]

WASTEFUL_HEALTH = frozenset({"stalled", "not_learning", "diverging"})
"""Health in which a job's GPU time counts as wasted (from its ``since``: for ``not_learning`` the last real
improvement)."""
_HOUR = 3600.0


@dataclass(frozen=True)
class Cost:
    """A job's money figures at one time (``None``: not known)."""

    rate_per_hour: float | None
    """What an hour of the job costs now: GPUs x price per GPU hour."""
    spent: float | None
    """From the start of the job to its end (or now)."""
    projected: float | None
    """``spent`` plus the rest at the ETA; equals ``spent`` once the job has ended."""
    wasted: float | None
    """Spent since the job stopped doing useful work (``wasted_since``)."""
    wasted_since: float | None = None

    def to_dict(self, currency: str = "USD") -> dict[str, float | str | None]:
        """The JSON object of the API."""
        return {
            "currency": currency,
            "rate_per_hour": self.rate_per_hour,
            "spent": self.spent,
            "projected": self.projected,
            "wasted": self.wasted,
            "wasted_since": self.wasted_since,
        }


@dataclass(frozen=True)
class PriceList:
    """Default prices of a GPU hour, for jobs that register without one (server settings).

    ``by_gpu`` maps a GPU type to its price (``*``: any type); ``by_namespace`` maps a namespace, or
    ``namespace/gpu_type``, to the price its jobs pay. The most specific entry wins: namespace and
    type, then namespace, then type, then ``*``; no entry means no price (cost unknown, not free).
    """

    by_gpu: dict[str, float] = field(default_factory=dict)
    by_namespace: dict[str, float] = field(default_factory=dict)

    def price(self, namespace: str, gpu_type: str = "") -> float:
        """The price of one GPU hour for a job of this namespace and GPU type (0.0: none known)."""
        for table, key in (
            (self.by_namespace, f"{namespace}/{gpu_type}" if gpu_type else None),
            (self.by_namespace, namespace),
            (self.by_gpu, gpu_type or None),
            (self.by_gpu, "*"),
        ):
            if key is not None and key in table:
                return table[key]
        return 0.0


def parse_prices(text: str | None) -> dict[str, float]:
    """``a100=2.5,h100=4.1`` (commas or spaces) → a table of prices; ``ValueError`` names the bad entry."""
    table: dict[str, float] = {}
    for entry in (text or "").replace(",", " ").split():
        key, sep, value = entry.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not sep or not key or not math.isfinite(price) or price < 0:
            raise ValueError(f"give KEY=PRICE with a price >= 0, got {entry!r}")
        table[key.lower()] = price
    return table


def job_cost(
    *,
    gpus: float,
    gpu_hour_cost: float,
    started_at: float | None,
    finished_at: float | None,
    now: float,
    remaining_seconds: float | None,
    wasted_since: float | None = None,
    healthy: bool | None = None,
    wasted_spans: Sequence[tuple[float, float | None]] = (),
) -> Cost:
    """The cost of a job from its GPUs, their hourly price, when it ran and its ETA.

    ``remaining_seconds`` is the ETA (``None``: unknown, so no projection while it runs).
    ``wasted_since`` is when the job stopped doing useful work; ``healthy`` says whether the health
    analysis found it working (``None``: it does not know, so nothing is said about waste).
    ``wasted_spans`` are the spans (start, end; ``None``: it still stands) of every bad verdict the job
    had: when given, the waste is their union, and ``wasted_since`` only says since when the current
    one stands.
    """
    if gpus <= 0 or gpu_hour_cost <= 0:
        return Cost(None, None, None, None)
    rate = gpus * gpu_hour_cost
    end = finished_at if finished_at is not None else now
    spent = 0.0 if started_at is None else max(end - started_at, 0.0) / _HOUR * rate
    if finished_at is not None:
        projected: float | None = spent
    elif remaining_seconds is None:
        projected = None
    else:
        projected = spent + remaining_seconds / _HOUR * rate
    if wasted_spans and started_at is not None:
        wasted: float | None = wasted_seconds(wasted_spans, started_at, end) / _HOUR * rate
    elif wasted_since is not None and started_at is not None:
        wasted = max(end - max(wasted_since, started_at), 0.0) / _HOUR * rate
    elif healthy:
        wasted = 0.0
    else:
        wasted = None
    return Cost(rate, spent, projected, wasted, wasted_since)


def wasted_seconds(spans: Iterable[tuple[float, float | None]], started_at: float, end: float) -> float:
    """Seconds covered by the union of ``spans`` (start, end; ``None``: up to ``end``), within
    ``started_at``..``end``: overlapping verdicts (a stall inside a plateau) count once."""
    clipped = sorted((max(a, started_at), min(b if b is not None else end, end)) for a, b in spans)
    total, reach = 0.0, started_at
    for a, b in clipped:
        start = max(a, reach)
        if b > start:
            total += b - start
            reach = b
    return total


@dataclass(frozen=True)
class CostTotals:
    """Sums over jobs (unknown figures count as nothing) and how many jobs had a price."""

    jobs: int
    priced: int
    rate_per_hour: float
    spent: float
    projected: float
    wasted: float


def totals(costs: Iterable[Cost]) -> CostTotals:
    """Sum the known figures of many jobs (a namespace, or all)."""
    jobs = priced = 0
    rate = spent = projected = wasted = 0.0
    for cost in costs:
        jobs += 1
        if cost.rate_per_hour is None:
            continue
        priced += 1
        rate += cost.rate_per_hour
        spent += cost.spent or 0.0
        projected += cost.projected if cost.projected is not None else cost.spent or 0.0
        wasted += cost.wasted or 0.0
    return CostTotals(jobs, priced, rate, spent, projected, wasted)
