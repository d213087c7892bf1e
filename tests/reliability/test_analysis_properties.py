"""Properties of the analysis and of window merging (Hypothesis).

- ETA (``estimate_eta``): for any history at all (unsorted, repeated, non-finite times and steps, steps
  going backwards) it answers, and every time it gives is finite and never negative;
- downsampling keeps the global min and max, every non-finite value (a bucket that held one says so
  and shows it as its ``last``), the total count, and never returns more than ``max_points`` points;
- window merging (the report core's ``WindowBuffer`` and ``MetricWindow.merge``): however values are
  split into windows and windows merged, count, non-finite count, min, max and last are exact and the
  mean is the mean of the finite values.
"""

from __future__ import annotations

import math
from functools import reduce

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stepwatch._window import WindowBuffer
from stepwatch.protocol import MetricWindow
from stepwatch.server.analysis import Point, downsample, estimate_eta

pytestmark = pytest.mark.reliability

values = st.floats(min_value=-1e300, max_value=1e300) | st.sampled_from([math.nan, math.inf, -math.inf])
any_value = st.floats()

# ------------------------------------------------------------------------------------------------- ETA

times = st.floats(-1e6, 1e10) | st.sampled_from([math.nan, math.inf, -math.inf])
steps = st.integers(-10, 10**12)


def _ok(x: float | None) -> bool:
    return x is None or (math.isfinite(x) and x >= 0)


@given(
    st.lists(st.tuples(times, steps), max_size=40),
    st.none() | st.integers(1, 10**12),
    st.none() | times,
    st.none() | st.floats(),
    st.none() | times,
)
@example([], None, None, 0.0, math.nan)  # found here: a NaN reported_at made the aged ETA NaN
def test_eta_is_never_negative_nor_nan(
    samples: list[tuple[float, int]],
    total: int | None,
    now: float | None,
    reported: float | None,
    reported_at: float | None,
) -> None:
    est = estimate_eta(samples, total, now=now, reported_eta=reported, reported_at=reported_at)
    for name in ("eta_seconds", "eta_low", "eta_high", "rate", "moving_rate", "pause_seconds"):
        assert _ok(getattr(est, name)), (name, est)
    assert est.eta_low is None or est.eta_seconds is None or est.eta_low <= est.eta_seconds * (1 + 1e-9) + 1e-9
    assert est.finish_time is None or not math.isnan(est.finish_time)
    if est.method in ("stalled", "insufficient", "no_total"):
        assert est.eta_seconds is None


@st.composite
def steady_histories(draw: st.DrawFn) -> tuple[list[tuple[float, int]], int]:
    """A job stepping at a steady pace, reported every few seconds."""
    every = draw(st.floats(0.5, 30))
    per_report = draw(st.integers(1, 1000))
    n = draw(st.integers(3, 60))
    total = per_report * n + draw(st.integers(1, 10**6))
    return [(1e9 + i * every, i * per_report) for i in range(n)], total


@given(steady_histories())
def test_eta_of_a_steady_job_is_its_remaining_steps_over_its_rate(history: tuple[list[tuple[float, int]], int]) -> None:
    samples, total = history
    est = estimate_eta(samples, total)
    assert est.method == "recent_rate"
    (t0, s0), (t1, s1) = samples[0], samples[-1]
    expected = (total - s1) / ((s1 - s0) / (t1 - t0))
    assert est.eta_seconds == pytest.approx(expected, rel=1e-6)


# -------------------------------------------------------------------------------------------- downsample


@st.composite
def series(draw: st.DrawFn) -> list[Point]:
    n = draw(st.integers(1, 300))
    out = []
    for i in range(n):
        vs = draw(st.lists(values, min_size=1, max_size=4))
        good = [v for v in vs if math.isfinite(v)]
        out.append(
            Point(
                step=i,
                t=float(i),
                last=vs[-1],
                min=min(good) if good else None,
                max=max(good) if good else None,
                mean=sum(good) / len(good) if good else None,
                count=len(vs),
                nonfinite=len(vs) - len(good),
            )
        )
    return out


@given(series(), st.integers(1, 400))
def test_downsampling_keeps_extremes_and_nonfinite_points(points: list[Point], max_points: int) -> None:
    out = downsample(points, max_points)
    assert 1 <= len(out) <= max_points
    assert sum(p.count for p in out) == sum(p.count for p in points)
    assert sum(p.nonfinite for p in out) == sum(p.nonfinite for p in points)
    assert sum(p.windows for p in out) == len(points)
    mins = [p.min for p in points if p.min is not None]
    maxs = [p.max for p in points if p.max is not None]
    out_mins = [p.min for p in out if p.min is not None]
    out_maxs = [p.max for p in out if p.max is not None]
    assert (min(out_mins) if out_mins else None) == (min(mins) if mins else None)
    assert (max(out_maxs) if out_maxs else None) == (max(maxs) if maxs else None)
    assert out[-1].step == points[-1].step
    # every non-finite last stays visible as the last of its bucket
    bad_lasts = [p for p in points if not math.isfinite(p.last)]
    for p in bad_lasts:
        bucket = next(b for b in out if b.step_range[0] <= p.step <= b.step_range[1])
        assert bucket.nonfinite > 0
        assert not math.isfinite(bucket.last)
    for b in out:
        if b.mean is not None:
            assert b.min is not None and b.max is not None
            assert b.min <= b.mean * (1 - 1e-12 * math.copysign(1, b.mean)) + 1e-300 or b.min <= b.mean
            assert b.mean <= b.max or math.isclose(b.mean, b.max, rel_tol=1e-9)


@given(series(), st.integers(2, 50))
def test_downsampling_twice_is_downsampling_once_coarser(points: list[Point], k: int) -> None:
    """Merging is associative: an already downsampled series merges into the same extremes and counts."""
    fine = downsample(points, k * 2)
    coarse_of_fine = downsample(fine, k)
    coarse = downsample(points, k)
    assert sum(p.count for p in coarse_of_fine) == sum(p.count for p in coarse)
    assert {p.min for p in coarse_of_fine} >= {min((p.min for p in coarse if p.min is not None), default=None)} - {None}


# ------------------------------------------------------------------------------------------ window merging


def _expect(vals: list[float]) -> tuple[int, int, float | None, float | None, float | None]:
    good = [v for v in vals if math.isfinite(v)]
    mean = math.fsum(good) / len(good) if good else None
    return len(vals), len(vals) - len(good), min(good) if good else None, max(good) if good else None, mean


def _check(window: MetricWindow, vals: list[float], first: int, last: int) -> None:
    count, nonfinite, lo, hi, mean = _expect(vals)
    assert (window.count, window.nonfinite, window.min, window.max) == (count, nonfinite, lo, hi)
    assert (window.first_step, window.last_step) == (first, last)
    assert window.last == vals[-1] or (math.isnan(window.last) and math.isnan(vals[-1]))
    if mean is None:
        assert window.mean is None
    else:
        assert window.mean is not None
        scale = max(abs(v) for v in vals if math.isfinite(v))
        assert abs(window.mean - mean) <= 1e-9 * scale + 1e-300
        assert lo is not None and hi is not None and lo <= window.mean <= hi


@given(st.lists(values, min_size=1, max_size=200), st.integers(1, 64))
def test_a_buffer_window_is_exact(vals: list[float], cap: int) -> None:
    """However often the series is reduced on the way (``series_cap``), the window is exact."""
    buffer = WindowBuffer(series_cap=cap)
    for step, v in enumerate(vals):
        buffer.add(step, {"loss": v})
        if step % 7 == 0:
            buffer.drain(on_training_thread=True)
    (window,) = buffer.take()
    _check(window, vals, 0, len(vals) - 1)


@given(st.lists(st.lists(values, min_size=1, max_size=20), min_size=1, max_size=20))
def test_merged_windows_are_exact(chunks: list[list[float]]) -> None:
    """Windows closed one after another (unsent reports) merge into the window of all their values."""
    buffer = WindowBuffer()
    parts = []
    step = 0
    for chunk in chunks:
        for v in chunk:
            buffer.add(step, {"loss": v})
            step += 1
        parts.extend(buffer.take())
    merged = reduce(MetricWindow.merge, parts)
    _check(merged, [v for chunk in chunks for v in chunk], 0, step - 1)


@given(st.lists(st.lists(values, min_size=1, max_size=10), min_size=3, max_size=3))
def test_merge_is_associative(chunks: list[list[float]]) -> None:
    buffer = WindowBuffer()
    parts: list[MetricWindow] = []
    step = 0
    for chunk in chunks:
        for v in chunk:
            buffer.add(step, {"m": v})
            step += 1
        parts.extend(buffer.take())
    a, b, c = parts
    left, right = a.merge(b).merge(c), a.merge(b.merge(c))
    assert (left.count, left.nonfinite, left.min, left.max, left.first_step, left.last_step) == (
        right.count,
        right.nonfinite,
        right.min,
        right.max,
        right.first_step,
        right.last_step,
    )
    assert (left.mean is None) == (right.mean is None)


@given(st.lists(any_value, min_size=1, max_size=50), st.lists(any_value, min_size=1, max_size=50))
@example([1.5e308, 1.5e308], [1.0])  # found here: the sum overflowed and the whole window was dropped
@example([-1.7e308], [1.7e308])  # found here: merging the two means overflowed (a ProtocolError)
@example([1e308, 1e308, math.nan], [-1e308, -1e308])
def test_windows_of_any_floats_close_and_merge(first: list[float], second: list[float]) -> None:
    """Values near the largest floats: the sum overflows, the window must still close and merge."""
    buffer = WindowBuffer()
    for i, v in enumerate(first):
        buffer.add(i, {"x": v})
    (a,) = buffer.take()
    for i, v in enumerate(second):
        buffer.add(len(first) + i, {"x": v})
    (b,) = buffer.take()
    merged = a.merge(b)
    assert merged.count == len(first) + len(second)
    assert buffer.dropped == 0
    good = [v for v in first + second if math.isfinite(v)]
    if good:
        assert merged.min == min(good) and merged.max == max(good)
        assert merged.mean is not None and min(good) <= merged.mean <= max(good)
