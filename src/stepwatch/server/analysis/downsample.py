"""History reads downsampled to the points a chart can show, keeping extremes and non-finite values.

Every stored window of a metric (``last``, ``min``, ``max``, ``mean``, ``count``, ``nonfinite``) is a
point. To show a series in at most ``max_points`` points, consecutive windows are merged into buckets
of equal count (bucket ``k`` of ``n`` windows holds windows ``k * n // max_points`` up to the next
bucket's first), and each bucket is aggregated exactly:

- ``min`` is the min of the mins, ``max`` the max of the maxes, so the global extremes and every spike
  stay visible; ``count`` and ``nonfinite`` are sums; ``mean`` is weighted by the finite counts;
  ``min``, ``max`` and ``mean`` are ``None`` only when the whole bucket had no finite value;
- ``step``, ``t`` and ``last`` are those of the bucket's last window, except that a finite ``last``
  gives way to the latest non-finite ``last`` of the bucket: a NaN or an infinity stays visible on
  a chart of ``last`` too, and ``nonfinite > 0`` marks every bucket that held one;
- ``first_step`` is the step of the bucket's first window and ``windows`` how many it merged.

Merging is associative, so downsampling an already downsampled series gives the same buckets as
downsampling the original with the coarser boundaries. Inputs that are themselves buckets of
different sizes (the store's roll-ups of long series, then their newest windows) are split by
windows, not by entries: each output bucket merges about the same number of windows. With
``max_points >= len(points)`` the points come back unchanged. :func:`downsample_columns` is the
fast path (parallel lists, C-level ``min``, ``max`` and ``sum`` over slices); ``docs/eta.md`` has
the figures.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, compress, pairwise
from operator import attrgetter, is_not, mul, sub
from typing import Any, Protocol, TypeVar, cast

__all__ = ["Columns", "Point", "WindowLike", "downsample", "downsample_columns"]


_T = TypeVar("_T")


class WindowLike(Protocol):
    """Anything with the fields of a stored window (the store's ``SeriesPoint``, a :class:`Point`)."""

    @property
    def step(self) -> int: ...
    @property
    def t(self) -> float: ...
    @property
    def last(self) -> float: ...
    @property
    def min(self) -> float | None: ...
    @property
    def max(self) -> float | None: ...
    @property
    def mean(self) -> float | None: ...
    @property
    def count(self) -> int: ...
    @property
    def nonfinite(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Point:
    """One window, or a bucket of consecutive windows merged (see the module docstring)."""

    step: int
    t: float
    last: float
    min: float | None
    max: float | None
    mean: float | None
    count: int
    nonfinite: int
    first_step: int | None = None
    """Step of the bucket's first window; ``None`` for a single window (then it is ``step``)."""
    windows: int = 1
    """How many stored windows this point merges."""

    @property
    def step_range(self) -> tuple[int, int]:
        """The first and the last step the point covers."""
        return (self.step if self.first_step is None else self.first_step, self.step)


@dataclass(frozen=True, slots=True)
class Columns:
    """A series as parallel lists, one entry per point (``first_steps`` always holds a step)."""

    steps: list[int]
    times: list[float]
    lasts: list[float]
    mins: list[float | None]
    maxs: list[float | None]
    means: list[float | None]
    counts: list[int]
    nonfinites: list[int]
    first_steps: list[int]
    windows: list[int]

    def __len__(self) -> int:
        return len(self.steps)

    def points(self) -> list[Point]:
        """The same series as :class:`Point` objects (``first_step`` is ``None`` for single windows)."""
        return [
            Point(s, t, last, lo, hi, mean, c, nf, None if w == 1 else f, w)
            for s, t, last, lo, hi, mean, c, nf, f, w in zip(
                self.steps,
                self.times,
                self.lasts,
                self.mins,
                self.maxs,
                self.means,
                self.counts,
                self.nonfinites,
                self.first_steps,
                self.windows,
            )
        ]


_FIELDS = attrgetter("step", "t", "last", "min", "max", "mean", "count", "nonfinite")


def downsample(points: Sequence[WindowLike], max_points: int) -> list[Point]:
    """At most ``max_points`` points for ``points`` (windows in step order), extremes and NaNs kept.

    ``points`` may be :class:`Point` objects (merged ones included: their ranges and window counts
    add up) or any objects with the same eight fields. With ``max_points >= len(points)`` the
    points come back as they are (objects that are not a :class:`Point` are copied into one).
    """
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    if len(points) <= max_points:
        return [p if isinstance(p, Point) else Point(*_FIELDS(p)) for p in points]
    # One comprehension per field: several times faster than transposing with zip(*rows).
    steps = [p.step for p in points]
    times = [p.t for p in points]
    lasts = [p.last for p in points]
    mins = [p.min for p in points]
    maxs = [p.max for p in points]
    means = [p.mean for p in points]
    counts = [p.count for p in points]
    nonfinites = [p.nonfinite for p in points]
    first_steps = windows = None
    if any(isinstance(p, Point) and p.windows != 1 for p in points):
        first_steps = [p.step_range[0] if isinstance(p, Point) else p.step for p in points]
        windows = [p.windows if isinstance(p, Point) else 1 for p in points]
    return downsample_columns(
        steps,
        times,
        lasts,
        mins,
        maxs,
        means,
        counts,
        nonfinites,
        max_points,
        first_steps=first_steps,
        windows=windows,
    ).points()


def downsample_columns(
    steps: Sequence[int],
    times: Sequence[float],
    lasts: Sequence[float],
    mins: Sequence[float | None],
    maxs: Sequence[float | None],
    means: Sequence[float | None],
    counts: Sequence[int],
    nonfinites: Sequence[int],
    max_points: int,
    *,
    first_steps: Sequence[int] | None = None,
    windows: Sequence[int] | None = None,
) -> Columns:
    """:func:`downsample` on parallel columns, one entry per window: the fast path.

    ``first_steps`` and ``windows`` describe inputs that are themselves merged buckets (default:
    single windows). Raises ``ValueError`` when the columns differ in length or ``max_points < 1``.
    """
    n = len(steps)
    _check(n, (times, lasts, mins, maxs, means, counts, nonfinites, first_steps, windows), max_points)
    if n <= max_points:  # nothing to merge: the columns, copied
        first = steps if first_steps is None else first_steps
        ones = [1] * n if windows is None else windows
        return Columns(*_copied(steps, times, lasts, mins, maxs, means, counts, nonfinites, first, ones))
    # Slicing a list copies pointers at C speed; other sequences are copied once into lists.
    steps, times, lasts = _as_list(steps), _as_list(times), _as_list(lasts)
    mins, maxs, means = _as_list(mins), _as_list(maxs), _as_list(means)
    counts, nonfinites = _as_list(counts), _as_list(nonfinites)

    bounds = _bounds(n, windows, max_points)
    ends = [b - 1 for b in bounds[1:]]
    out_mins: list[float | None] = []
    out_maxs: list[float | None] = []
    out_means: list[float | None] = []
    out_counts: list[int] = []
    out_nonfinites: list[int] = []
    out_lasts = [lasts[e] for e in ends]
    isfinite = math.isfinite
    some_nonfinite = nonfinites.count(0) != n  # one C-level pass spares a sum per bucket when none
    for k, (a, b) in enumerate(pairwise(bounds)):
        bucket_counts = counts[a:b]
        count = sum(bucket_counts)
        nonfinite = sum(bucket_nonfinites := nonfinites[a:b]) if some_nonfinite else 0
        try:
            # At C speed while every window has a finite min, max and mean (a None raises).
            lo: float | None = min(mins[a:b])  # type: ignore[type-var]
            hi: float | None = max(maxs[a:b])  # type: ignore[type-var]
            weights = list(map(sub, bucket_counts, bucket_nonfinites)) if nonfinite else bucket_counts
            total = _sumprod(means[a:b], weights)
            mean: float | None = total / (count - nonfinite)
            if not isfinite(total):  # overflow near the largest floats
                mean = _stable_mean(means, counts, nonfinites, a, b)
        except (TypeError, ZeroDivisionError):
            lo, hi, mean = _slow(mins, maxs, means, counts, nonfinites, a, b)
        if nonfinite and isfinite(out_lasts[k]):
            for i in range(b - 1, a - 1, -1):
                if not isfinite(lasts[i]):
                    out_lasts[k] = lasts[i]
                    break
        out_mins.append(lo)
        out_maxs.append(hi)
        out_means.append(mean)
        out_counts.append(count)
        out_nonfinites.append(nonfinite)

    starts = bounds[:-1]
    return Columns(
        [steps[e] for e in ends],
        [times[e] for e in ends],
        out_lasts,
        out_mins,
        out_maxs,
        out_means,
        out_counts,
        out_nonfinites,
        [steps[a] for a in starts] if first_steps is None else [first_steps[a] for a in starts],
        [b - a for a, b in pairwise(bounds)] if windows is None else [sum(windows[a:b]) for a, b in pairwise(bounds)],
    )


def _copied(*columns: Sequence[Any]) -> Iterator[list[Any]]:
    """Each column as a list of its own."""
    return map(list, columns)


def _check(n: int, columns: Iterable[Sequence[object] | None], max_points: int) -> None:
    """Refuse columns of another length than ``n`` (``None``: an optional column left out) and
    ``max_points < 1``."""
    if any(c is not None and len(c) != n for c in columns):
        raise ValueError("all columns must have the same length")
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")


def _bounds(n: int, windows: Sequence[int] | None, max_points: int) -> list[int]:
    """Bucket boundaries: equal numbers of windows per bucket (of entries, when each is one window).

    When entries merge different numbers of windows (roll-ups of several levels), bucket ``k`` starts
    at the first entry with ``k * W // max_points`` windows before it; an entry larger than a bucket
    is a bucket of its own (boundaries that meet are dropped, so there may be fewer buckets).
    """
    if windows is None or windows.count(1) == n:
        return [k * n // max_points for k in range(max_points + 1)]
    before = [0, *accumulate(windows)]
    total = before[-1]
    bounds = sorted({bisect_left(before, k * total // max_points) for k in range(max_points)} | {n})
    return bounds if bounds[0] == 0 else [0, *bounds]


def _as_list(column: Sequence[_T]) -> list[_T]:
    return column if isinstance(column, list) else list(column)


def _slow(
    mins: list[float | None],
    maxs: list[float | None],
    means: list[float | None],
    counts: list[int],
    nonfinites: list[int],
    a: int,
    b: int,
) -> tuple[float | None, float | None, float | None]:
    """Min, max and finite-weighted mean of windows ``a..b-1`` when some have no finite value."""
    lo = min(cast("Iterator[float]", filter(_not_none, mins[a:b])), default=None)
    hi = max(cast("Iterator[float]", filter(_not_none, maxs[a:b])), default=None)
    bucket_means = means[a:b]
    keep = list(map(_not_none, bucket_means))
    weights = list(compress(map(sub, counts[a:b], nonfinites[a:b]), keep))
    weight = sum(weights)
    if not weight:
        return lo, hi, None
    total = _sumprod(list(compress(bucket_means, keep)), weights)
    if not math.isfinite(total):
        return lo, hi, _stable_mean(means, counts, nonfinites, a, b)
    return lo, hi, total / weight


_not_none = partial(is_not, None)


def _sum_of_products(p: Iterable[Any], q: Iterable[Any]) -> float:
    return float(sum(map(mul, p, q)))


# math.sumprod (Python 3.12+) runs the loop in C, with extended precision.
_sumprod: Callable[[Iterable[Any], Iterable[Any]], float] = getattr(math, "sumprod", _sum_of_products)


def _stable_mean(means: list[float | None], counts: list[int], nonfinites: list[int], a: int, b: int) -> float | None:
    """The weighted mean by running updates: no overflow when means are near the largest floats."""
    result: float | None = None
    weight = 0
    for i in range(a, b):
        m = means[i]
        w = counts[i] - nonfinites[i]
        if m is None or w <= 0:
            continue
        weight += w
        result = m if result is None else result + (m - result) * (w / weight)
    return result
