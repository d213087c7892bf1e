"""History downsampling: against a brute-force reference on seeded random series, the properties a
chart relies on (extremes, spikes, NaN and Inf stay visible, step order), edge cases and speed."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pytest

from stepwatch.server.analysis import Columns, Point, downsample, downsample_columns

Row = tuple[int, float, float, float | None, float | None, float | None, int, int]


def series(n: int, seed: int, nonfinite_rate: float = 0.02) -> list[Row]:
    """``n`` windows of a noisy random walk; some hold NaN/Inf values, some hold nothing else."""
    rng = random.Random(seed)
    rows: list[Row] = []
    step, t, level = 0, 1000.0, 1.0
    for _ in range(n):
        step += rng.randint(1, 20)
        t += rng.uniform(1.5, 2.5)
        level += rng.gauss(0, 0.05)
        count = rng.randint(1, 50)
        nonfinite = 0
        if rng.random() < nonfinite_rate:
            nonfinite = count if rng.random() < 0.3 else rng.randint(1, count)
        if nonfinite == count:
            rows.append((step, t, rng.choice([math.nan, math.inf, -math.inf]), None, None, None, count, nonfinite))
            continue
        lo = level - rng.uniform(0, 0.5)
        hi = level + rng.uniform(0, 0.5)
        mean = rng.uniform(lo, hi)
        last = rng.uniform(lo, hi)
        if nonfinite and rng.random() < 0.5:
            last = rng.choice([math.nan, math.inf, -math.inf])
        rows.append((step, t, last, lo, hi, mean, count, nonfinite))
    return rows


def reference(rows: list[Row], max_points: int) -> list[tuple[object, ...]]:
    """The rule of the module docstring, written the plain way."""
    n = len(rows)
    if n <= max_points:
        return [(*r, r[0], 1) for r in rows]
    out: list[tuple[object, ...]] = []
    for k in range(max_points):
        bucket = rows[k * n // max_points : (k + 1) * n // max_points]
        mins = [r[3] for r in bucket if r[3] is not None]
        maxs = [r[4] for r in bucket if r[4] is not None]
        total = 0.0
        weight = 0
        for r in bucket:
            if r[5] is not None:
                total += r[5] * (r[6] - r[7])
                weight += r[6] - r[7]
        last = bucket[-1][2]
        if math.isfinite(last):
            for r in reversed(bucket):
                if not math.isfinite(r[2]):
                    last = r[2]
                    break
        out.append(
            (
                bucket[-1][0],
                bucket[-1][1],
                last,
                min(mins) if mins else None,
                max(maxs) if maxs else None,
                total / weight if weight else None,
                sum(r[6] for r in bucket),
                sum(r[7] for r in bucket),
                bucket[0][0],
                len(bucket),
            )
        )
    return out


def as_tuple(p: Point) -> tuple[object, ...]:
    return (p.step, p.t, p.last, p.min, p.max, p.mean, p.count, p.nonfinite, *p.step_range[:1], p.windows)


def same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Equal field by field; NaN equals NaN, means (index 5) to 1e-12."""
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if isinstance(x, float) and isinstance(y, float):
            if math.isnan(x) or math.isnan(y):
                if not (math.isnan(x) and math.isnan(y)):
                    return False
            elif i == 5:
                if x != pytest.approx(y, rel=1e-12):
                    return False
            elif x != y:
                return False
        elif x != y:
            return False
    return True


def columns_of(rows: list[Row], max_points: int) -> Columns:
    cols: list[list[Any]] = [list(c) for c in zip(*rows)] if rows else [[] for _ in range(8)]
    steps, times, lasts, mins, maxs, means, counts, nonfinites = cols
    return downsample_columns(steps, times, lasts, mins, maxs, means, counts, nonfinites, max_points)


@pytest.mark.parametrize(
    ("n", "max_points"),
    [(1, 1), (2, 1), (10, 3), (100, 7), (1000, 10), (1000, 999), (999, 1000), (5000, 123), (20, 20), (21, 20)],
)
@pytest.mark.parametrize("seed", range(3))
def test_matches_the_reference(n: int, max_points: int, seed: int) -> None:
    rows = series(n, seed, nonfinite_rate=0.05)
    expected = reference(rows, max_points)
    objects = downsample([Point(*r) for r in rows], max_points)
    columns = columns_of(rows, max_points)
    assert len(objects) == len(columns) == min(n, max_points)
    for e, p, q in zip(expected, objects, columns.points(), strict=True):
        assert same(e, as_tuple(p)), (e, p)
        assert same(e, as_tuple(q)), (e, q)


@pytest.mark.parametrize("max_points", [1, 2, 17, 500])
def test_extremes_and_non_finite_windows_stay_visible(max_points: int) -> None:
    rows = series(20_000, seed=7)
    out = downsample([Point(*r) for r in rows], max_points)
    assert min(p.min for p in out if p.min is not None) == min(r[3] for r in rows if r[3] is not None)
    assert max(p.max for p in out if p.max is not None) == max(r[4] for r in rows if r[4] is not None)
    assert sum(p.count for p in out) == sum(r[6] for r in rows)
    assert sum(p.nonfinite for p in out) == sum(r[7] for r in rows)
    start = 0
    for p in out:
        inside = rows[start : start + p.windows]
        start += p.windows
        assert p.step_range == (inside[0][0], inside[-1][0])
        assert (p.nonfinite > 0) == any(r[7] for r in inside)
        assert math.isfinite(p.last) == all(math.isfinite(r[2]) for r in inside)


def test_a_spike_a_nan_and_an_inf_survive_heavy_downsampling() -> None:
    rng = random.Random(3)
    rows: list[Row] = [(i, 2.0 * i, 1.0, 0.9, 1.1, 1.0, 10, 0) for i in range(100_000)]
    spike, nan, inf = rng.sample(range(100_000), 3)
    rows[spike] = (spike, 2.0 * spike, 1e6, 0.9, 1e6, 1000.0, 10, 0)
    rows[nan] = (nan, 2.0 * nan, math.nan, 0.9, 1.1, 1.0, 10, 1)
    rows[inf] = (inf, 2.0 * inf, math.inf, None, None, None, 3, 3)
    out = downsample([Point(*r) for r in rows], 300)

    def covering(step: int) -> Point:
        return next(p for p in out if p.step_range[0] <= step <= p.step_range[1])

    assert covering(spike).max == 1e6
    assert math.isnan(covering(nan).last) and covering(nan).nonfinite == 1
    assert covering(inf).last == math.inf and covering(inf).nonfinite == 3
    assert sum(p.max == 1e6 for p in out) == 1
    assert sum(p.nonfinite > 0 for p in out) == 2


def test_step_order_and_contiguous_ranges() -> None:
    rows = series(10_000, seed=11)
    out = downsample([Point(*r) for r in rows], 333)
    assert all(p.step_range[0] <= p.step for p in out)
    assert all(a.step < b.step_range[0] for a, b in pairwise(out))
    assert out[0].step_range[0] == rows[0][0] and out[-1].step == rows[-1][0]
    assert sum(p.windows for p in out) == len(rows)


def test_idempotent_and_unchanged_below_the_limit() -> None:
    points = [Point(*r) for r in series(5000, seed=5)]
    once = downsample(points, 100)
    assert downsample(once, 100) == once
    assert downsample(once, 1000) == once
    unchanged = downsample(points, 5000)
    assert unchanged == points and all(a is b for a, b in zip(unchanged, points))


def test_merging_is_associative() -> None:
    """Downsampling in two stages with nested boundaries equals one stage: aggregation is exact."""
    points = [Point(*r) for r in series(1000, seed=9, nonfinite_rate=0.05)]
    direct = downsample(points, 10)
    staged = downsample(downsample(points, 100), 10)
    assert len(direct) == len(staged) == 10
    for a, b in zip(direct, staged):
        assert same(as_tuple(a), as_tuple(b)), (a, b)


@dataclass(frozen=True)
class SeriesPoint:
    """The shape of the store's window (any object with these fields will do)."""

    step: int
    t: float
    last: float
    min: float | None
    max: float | None
    mean: float | None
    count: int
    nonfinite: int


def test_any_object_with_the_fields() -> None:
    rows = series(300, seed=2)
    out = downsample([SeriesPoint(*r) for r in rows], 30)
    assert out == downsample([Point(*r) for r in rows], 30)
    few = downsample([SeriesPoint(*r) for r in rows[:5]], 30)
    assert few == [Point(*r) for r in rows[:5]]


def test_edge_cases() -> None:
    assert downsample([], 10) == []
    assert len(columns_of([], 10)) == 0
    rows = series(50, seed=1)
    (one,) = downsample([Point(*r) for r in rows], 1)
    assert one.step_range == (rows[0][0], rows[-1][0]) and one.windows == 50 and one.t == rows[-1][1]
    assert one.count == sum(r[6] for r in rows)
    two = downsample([Point(*r) for r in rows], 2)
    assert [p.windows for p in two] == [25, 25]
    with pytest.raises(ValueError, match="max_points"):
        downsample([Point(*rows[0])], 0)
    with pytest.raises(ValueError, match="same length"):
        downsample_columns([1, 2], [1.0], [1.0], [1.0], [1.0], [1.0], [1], [0], 5)


def test_an_all_nan_series() -> None:
    rows: list[Row] = [(i, float(i), math.nan, None, None, None, 4, 4) for i in range(1, 1001)]
    out = downsample([Point(*r) for r in rows], 10)
    assert len(out) == 10
    for p in out:
        assert p.min is None and p.max is None and p.mean is None
        assert math.isnan(p.last) and p.nonfinite == p.count == 400


def test_means_near_the_largest_float_do_not_overflow() -> None:
    big = 1.7e308
    rows: list[Row] = [(i, float(i), big, big, big, big, 10, 0) for i in range(1, 101)]
    rows[50] = (51, 51.0, big, big, big, big, 10, 5)  # the slow path too
    for r in (rows[:50], rows):
        out = downsample([Point(*x) for x in r], 3)
        assert all(p.mean == pytest.approx(big) for p in out)


def test_mixed_windows_weight_by_finite_counts() -> None:
    rows: list[Row] = [
        (1, 1.0, 0.0, 0.0, 0.0, 0.0, 10, 9),  # one finite value of ten
        (2, 2.0, 1.0, 1.0, 1.0, 1.0, 3, 0),
        (3, 3.0, 5.0, 5.0, 5.0, 5.0, 1, 0),
    ]
    (p,) = downsample([Point(*r) for r in rows], 1)
    assert p.mean == pytest.approx((0.0 * 1 + 1.0 * 3 + 5.0 * 1) / 5)
    assert p.last == 5.0 and p.nonfinite == 9 and p.count == 14


@pytest.mark.perf
def test_speed_against_a_plain_loop() -> None:
    """1,000,000 windows to 1,000 points, compared with one plain Python loop over one column of the
    same data (best of several runs each, interleaved). docs/eta.md has the figures."""
    n = 1_000_000
    rng = random.Random(0)
    lasts = [rng.random() for _ in range(n)]
    cols = (
        list(range(n)),
        [2.0 * i for i in range(n)],
        lasts,
        [x - 0.1 for x in lasts],
        [x + 0.1 for x in lasts],
        list(lasts),
        [rng.randint(1, 20) for _ in range(n)],
        [0] * n,
    )
    for i in rng.sample(range(n), 100):  # a few windows with NaN, to exercise both paths
        cols[7][i] = 1
        cols[2][i] = math.nan

    def loop() -> float:
        total = 0.0
        for x in lasts:
            total += x
        return total

    ours, base = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        downsample_columns(*cols, 1000)
        t1 = time.perf_counter()
        loop()
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        base.append(t2 - t1)
    ratio = min(ours) / min(base)
    print(
        f"\ndownsample_columns 1M->1000: {min(ours) * 1e3:.1f} ms; plain loop: {min(base) * 1e3:.1f} ms; x{ratio:.1f}"
    )
    assert ratio < 15


def test_merged_inputs_of_different_sizes_are_bucketed_by_windows() -> None:
    # three roll-ups of 64 windows, then 64 single windows: 256 windows in 67 entries
    steps = [64, 128, 192, *range(193, 257)]
    n = len(steps)
    windows = [64, 64, 64, *([1] * 64)]
    first_steps = [1, 65, 129, *range(193, 257)]
    c = downsample_columns(
        steps,
        [float(s) for s in steps],
        [1.0] * n,
        [0.5] * n,
        [2.0] * n,
        [1.0] * n,
        windows,
        [0] * n,
        4,
        first_steps=first_steps,
        windows=windows,
    )
    assert c.windows == [64, 64, 64, 64]  # by windows: not three buckets for three entries and one for 64
    assert c.first_steps == [1, 65, 129, 193] and c.steps == [64, 128, 192, 256]
    # an entry larger than a bucket is a bucket of its own; the rest still share the windows out
    c = downsample_columns(
        [100, 101, 102],
        [0.0, 1.0, 2.0],
        [1.0] * 3,
        [1.0] * 3,
        [1.0] * 3,
        [1.0] * 3,
        [100, 1, 1],
        [0] * 3,
        2,
        windows=[100, 1, 1],
    )
    assert c.windows == [100, 2]
