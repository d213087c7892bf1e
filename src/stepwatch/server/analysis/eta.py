"""ETA of a training job from a robust recent rate, not the lifetime average.

A job's progress history is a list of ``(time, step)`` samples, one per report. The estimate splits
the time since the last (re)start into *stepping* time and *pauses*:

- the **stepping rate** is measured over the most recent stretch of stepping time (up to
  :attr:`EtaParams.window` seconds) whose chunks agree with the newest one, so a slow warm-up or any
  other earlier regime falls out of the window as soon as it is over;
- **pauses** (the step stands still far longer than a step takes: evaluation, checkpointing) are
  learnt from the whole segment: their typical length and how many steps apart they come; the
  remaining pauses up to ``total_steps`` are added at that length;
- time before the first progress of a segment (start-up, compilation, loading a checkpoint) is
  ignored, and so is the first progress itself: at a start or a resume the report core's first
  report says step 0 and the next one the step it resumed at, a jump that is not progress made in
  this attempt's time; a step that goes backwards starts a new segment (a restart from an earlier
  checkpoint, or a new process whose first report says step 0);
- when the step stands still for longer than a step, the report interval and an expected pause
  explain, the job is *overdue*: the overdue time is counted as stepping time that produced no steps,
  so the ETA grows with it; overdue for longer than :attr:`EtaParams.stall_after` (or ten step
  times, whichever is longer), the job is ``"stalled"`` and the ETA is unknown.

A reported ETA (the job's own estimate) is preferred when there is one, aged by the time since it
was reported, and inflated in the same way when progress is overdue. ``docs/eta.md`` explains the
choices and shows how the estimate compares with :func:`lifetime_average_eta`, the estimate of the
upstream callbacks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from itertools import islice, pairwise
from operator import itemgetter, le, lt, sub
from typing import Literal

__all__ = ["DEFAULT_PARAMS", "Estimate", "EtaParams", "Method", "estimate_eta", "lifetime_average_eta"]

Method = Literal["recent_rate", "reported", "stalled", "done", "no_total", "insufficient"]
"""How an :class:`Estimate` was reached.

``recent_rate``: stepwatch's own estimate. ``reported``: the job's reported ETA (aged). ``stalled``: no
progress for too long, ETA unknown. ``done``: the step reached ``total_steps``. ``no_total``: a rate
but no total to reach. ``insufficient``: not enough history for a rate (fewer than three distinct
steps at distinct times since the last restart: the first progress is start-up, not a rate).
"""


@dataclass(frozen=True, slots=True)
class EtaParams:
    """The knobs of :func:`estimate_eta`; the defaults are explained in ``docs/eta.md``."""

    window: float = 600.0
    """Most stepping seconds (pauses excluded) the stepping rate rests on."""
    chunk: float = 120.0
    """Stepping seconds per chunk: the window grows backwards chunk by chunk."""
    regime_change: float = 0.25
    """A chunk whose time per step differs from the window's so far by more than this fraction
    belongs to another regime (warm-up, throttling): the window stops before it."""
    min_pause: float = 10.0
    """Shortest standstill counted as a pause (also at least 1.5 report intervals and 3 step times)."""
    pause_memory: int = 8
    """How many recent pauses give the typical pause length."""
    grace: float = 30.0
    """Slack before a standstill counts as overdue (also at least 3 report intervals and 3 step times)."""
    stall_after: float = 600.0
    """Overdue for longer than this (and than ``stall_steps`` step times): stalled, ETA unknown."""
    stall_steps: float = 10.0
    """See ``stall_after``: slow jobs get this many step times."""
    history: int = 256
    """How many recent intervals give the typical step time and report interval."""


DEFAULT_PARAMS = EtaParams()


@dataclass(frozen=True, slots=True)
class Estimate:
    """What :func:`estimate_eta` concluded. Times are in the samples' clock (seconds)."""

    rate: float | None
    """Steps per second of wall time, pauses included at their observed share (0.0 when stalled)."""
    eta_seconds: float | None
    """Seconds from ``now`` until ``total_steps`` (pauses included); ``None`` when unknown."""
    finish_time: float | None
    """``now + eta_seconds``; for ``done``, when the step reached the total."""
    method: Method
    """How the estimate was reached (see :data:`Method`)."""
    eta_low: float | None = None
    """Optimistic end of the spread: the fastest chunk of the window (and the reported ETA)."""
    eta_high: float | None = None
    """Pessimistic end of the spread: the slowest chunk of the window (and the reported ETA)."""
    step: int | None = None
    """The current step (of the latest segment)."""
    moving_rate: float | None = None
    """Steps per second while stepping (pauses excluded)."""
    window_seconds: float = 0.0
    """Stepping seconds the rate rests on: a short window means a young or changing job."""
    pause_seconds: float | None = None
    """Typical length of a pause (evaluation, checkpoint), when pauses were seen."""
    pause_every: float | None = None
    """Steps from one pause to the next, when pauses were seen."""
    overdue_seconds: float = 0.0
    """How long progress is overdue beyond a step, the report interval and an expected pause."""
    since: float | None = None
    """When the latest segment began (after the last restart, if any)."""


@dataclass(frozen=True, slots=True)
class _Analysis:
    """The history of one segment, taken apart."""

    step: int
    spt: float | None  # stepping seconds per step, from the window
    spt_low: float | None  # fastest chunk
    spt_high: float | None  # slowest chunk
    window: float  # stepping seconds of the window
    pause_seconds: float | None
    pause_every: float | None
    last_pause_step: int | None
    overdue: float
    standing: float  # seconds since the step last changed
    pause_due: bool


def estimate_eta(
    samples: Sequence[tuple[float, int]],
    total_steps: int | None,
    *,
    now: float | None = None,
    reported_eta: float | None = None,
    reported_at: float | None = None,
    params: EtaParams = DEFAULT_PARAMS,
) -> Estimate:
    """Estimate the remaining time of a job from its ``(time, step)`` samples.

    ``now`` defaults to the time of the newest sample; pass the clock to see a stall develop while
    no report arrives. ``reported_eta`` is the job's own estimate of remaining seconds, made at
    ``reported_at`` (default: the newest sample, else ``now``): it is preferred when present, unless
    the job is stalled or done. Samples with a non-finite time or step are ignored; out-of-order
    samples are sorted by time. Never raises for odd histories: it answers ``insufficient`` instead.
    """
    points = _clean(samples)
    start = _segment_start(points)
    segment = points[start:]
    now, reported, age = _clock(segment[-1][0] if segment else None, now, reported_eta, reported_at)

    if not segment or now is None:
        if reported is not None:
            eta = max(reported - age, 0.0)
            finish = now + eta if now is not None else None
            return Estimate(None, eta, finish, "reported", eta, eta)
        return Estimate(None, None, None, "insufficient")

    since = segment[0][0]
    step = segment[-1][1]
    if total_steps is not None and step >= total_steps:
        reached = next(t for t, s in segment if s >= total_steps)
        return Estimate(None, 0.0, reached, "done", 0.0, 0.0, step=step, since=since)

    a = _analyse(segment, now, params)
    window = a.window if a.window > 0 else params.window
    factor = 1.0 + a.overdue / window
    pause_rate = a.pause_seconds / a.pause_every if a.pause_seconds and a.pause_every else 0.0
    rate = 1.0 / (a.spt * factor + pause_rate) if a.spt else None
    moving_rate = 1.0 / a.spt if a.spt else None

    def answer(
        rate: float | None, eta: float | None, finish: float | None, method: Method, low: float | None = None,
        high: float | None = None,
    ) -> Estimate:  # fmt: skip
        # what every answer carries, each Estimate built once (dataclasses.replace, as before, cost 3 us a
        # call, a fifth of a young job's estimate)
        return Estimate(
            rate, eta, finish, method, low, high, step, moving_rate, a.window, a.pause_seconds, a.pause_every,
            a.overdue, since,
        )  # fmt: skip

    stall_limit = max(params.stall_after, params.stall_steps * a.spt if a.spt else 0.0)
    if a.overdue > stall_limit:
        return answer(0.0, None, None, "stalled")

    own = _own_eta(a, total_steps, factor)

    if reported is not None:
        # aged since it was made; when progress is overdue, inflated like stepwatch's own estimate
        eta = max(reported - age, 0.0)
        if a.overdue > 0:
            eta = (eta + a.overdue) * factor
        low, high = (min(eta, own[1]), max(eta, own[2])) if own else (eta, eta)
        return answer(rate, eta, now + eta, "reported", low, high)
    if total_steps is None:
        return answer(rate, None, None, "no_total" if rate else "insufficient")
    if own is None:
        return answer(rate, None, None, "insufficient")
    eta, low, high = own
    return answer(rate, eta, now + eta, "recent_rate", low, high)


def lifetime_average_eta(
    samples: Sequence[tuple[float, int]],
    total_steps: int | None,
    start_time: float,
    now: float | None = None,
) -> float | None:
    """The upstream estimate: time since the process started per step so far, times steps left.

    This is what transformers' ``KubeflowCallback`` reports, ``(now - start) / step * (total -
    step)``, where ``step`` is the global step (it includes the steps of a checkpoint the process
    resumed from) and ``now`` defaults to the time of the newest sample. It is the baseline that
    :func:`estimate_eta` is measured against; ``None`` before the first step.
    """
    if not samples or total_steps is None:
        return None
    t, step = max(samples, key=lambda sample: sample[0])
    elapsed = (t if now is None else now) - start_time
    if step <= 0 or elapsed <= 0 or not math.isfinite(elapsed):
        return None
    return max(total_steps - step, 0) * elapsed / step


# ------------------------------------------------------------------------------------------------


def _clock(
    last_t: float | None, now: float | None, reported_eta: float | None, reported_at: float | None
) -> tuple[float | None, float | None, float]:
    """The estimate's ``now``, the usable reported ETA and that ETA's age, from the caller's values.

    ``now`` defaults to (and is never before) ``last_t``, the newest sample's time, else the time the
    ETA was reported; the reported ETA is kept only when finite and not negative, and it was made at
    ``reported_at`` (default: ``last_t``, else ``now``). Non-finite times count as not given.
    """
    if now is not None and not math.isfinite(now):
        now = None
    if reported_at is not None and not math.isfinite(reported_at):
        reported_at = None  # a NaN time made the aged ETA NaN
    if now is None:
        now = last_t if last_t is not None else reported_at
    elif last_t is not None and now < last_t:
        now = last_t
    reported = reported_eta if reported_eta is not None and math.isfinite(reported_eta) and reported_eta >= 0 else None
    if reported_at is None:
        reported_at = last_t if last_t is not None else now
    age = max(now - reported_at, 0.0) if now is not None and reported_at is not None else 0.0
    return now, reported, age


def _own_eta(a: _Analysis, total_steps: int | None, factor: float) -> tuple[float, float, float] | None:
    """stepwatch's ETA and its spread (fastest and slowest chunk), or ``None`` without a rate or total."""
    if total_steps is None or a.spt is None or a.spt_low is None or a.spt_high is None:
        return None
    remaining = total_steps - a.step
    pauses = 0.0
    if a.pause_seconds and a.pause_every and a.last_pause_step is not None:
        # pauses at last_pause_step + k * pause_every, from the next one up to the last step; the time
        # already spent in one that is due now is not counted twice
        last = math.floor((total_steps - a.last_pause_step) / a.pause_every + 0.1)
        count = max(last - _first_pause_ahead(a.last_pause_step, a.pause_every, a.step) + 1, 0)
        spent = min(a.standing, a.pause_seconds) if a.pause_due else 0.0
        pauses = max(count * a.pause_seconds - spent, 0.0)
    stepping = remaining * factor
    return stepping * a.spt + pauses, stepping * a.spt_low + pauses, stepping * a.spt_high + pauses


def _clean(samples: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """Samples with a finite time and step, in time order (a stable sort keeps report order for ties).

    The usual history (finite, in order: the server's own) is checked and converted by C loops
    (``map``), the rest sample by sample: a job's estimate reads up to 600 samples."""
    times = list(map(itemgetter(0), samples))
    steps = list(map(itemgetter(1), samples))
    if all(map(math.isfinite, times)) and all(map(math.isfinite, steps)):
        times = list(map(float, times))
        points = list(zip(times, map(int, steps)))
    else:
        points = [(float(t), int(s)) for t, s in samples if math.isfinite(t) and math.isfinite(s)]
        times = [t for t, _ in points]
    if not all(map(le, times, islice(times, 1, None))):
        points.sort(key=itemgetter(0))
    return points


def _segment_start(points: list[tuple[float, int]]) -> int:
    """Index of the first sample after the last backwards step (0 when the step never went back)."""
    steps = list(map(itemgetter(1), points))
    back = list(map(lt, islice(steps, 1, None), steps))  # back[i - 1]: the step went back at sample i
    if True not in back:
        return 0
    return len(back) - back[::-1].index(True)


def _analyse(segment: list[tuple[float, int]], now: float, params: EtaParams) -> _Analysis:
    events = _progress_events(segment)
    step = events[-1][1]
    standing = max(now - events[-1][0], 0.0)
    times = list(map(itemgetter(0), segment[-params.history - 1 :]))
    gaps = list(filter(partial(lt, 0.0), map(sub, islice(times, 1, None), times)))  # those > 0
    report_interval = _median(gaps) if gaps else 0.0
    # The first progress of a segment is never progress made in its time: the report core's first
    # report of a process says step 0, the next one the step it resumed at (6,000 steps "in 2 s").
    # The rate is measured from the first sample at a new step (see _progress_events).
    intervals = [(b[0] - a[0], b[1] - a[1], a[1]) for a, b in pairwise(events[1:])]
    if not intervals:
        slack = max(params.grace, 3 * report_interval)
        return _Analysis(step, None, None, None, 0.0, None, None, None, max(standing - slack, 0.0), standing, False)

    typical = _median([dt / ds for dt, ds, _ in intervals[-params.history :]])
    moving, pauses = _split(intervals, typical, report_interval, params)
    spt, spt_low, spt_high, window = _stepping_time(moving, params)
    pause_seconds, pause_every, anchor = _pause_model(pauses, events[1][1], step, params)
    pause_due = False
    if pause_every is not None and anchor is not None:
        due = anchor + _first_pause_ahead(anchor, pause_every, step) * pause_every
        pause_due = due <= step + 0.1 * pause_every

    step_time = spt if spt is not None else typical
    slack = max(params.grace, 3 * report_interval, 3 * step_time)
    allowance = slack + (pause_seconds if pause_due and pause_seconds else 0.0)
    overdue = max(standing - allowance, 0.0)
    return _Analysis(
        step, spt, spt_low, spt_high, window, pause_seconds, pause_every, anchor, overdue, standing, pause_due
    )


def _median(values: Sequence[float]) -> float:
    """:func:`statistics.median` of a non-empty list, the same way (the middle one, or the mean of the two
    middle ones), without its checks (five medians an estimate)."""
    data = sorted(values)
    n = len(data)
    if n % 2:
        return data[n // 2]
    return (data[n // 2 - 1] + data[n // 2]) / 2


def _progress_events(segment: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The first sample at each new step, from an origin: the last sample still at the first step.

    Starting at the origin leaves out the start-up time before the first progress (process start,
    compilation, loading a checkpoint). Readings at the same time collapse into the newest. The
    interval from the origin to the first progress is start-up too (it may hold the jump to a resumed
    step): :func:`_analyse` measures from the second event on.
    """
    first_step = segment[0][1]
    origin = 0
    while origin + 1 < len(segment) and segment[origin + 1][1] == first_step:
        origin += 1
    events = [segment[origin]]
    for t, s in segment[origin + 1 :]:
        if s > events[-1][1]:
            if t > events[-1][0]:
                events.append((t, s))
            else:
                events[-1] = (events[-1][0], s)
    return events


_Pauses = list[tuple[int, float | None]]
"""(step, seconds of standstill) of each pause in order; ``None`` seconds: reports went missing over a
stretch with both steps and standstill, so how many pauses it hid is unknown (the step is its end)."""


def _split(
    intervals: list[tuple[float, int, int]], typical: float, report_interval: float, params: EtaParams
) -> tuple[list[tuple[float, int]], _Pauses]:
    """Split the intervals between progress events into stepping ones and pauses.

    An interval is a pause when it took longer than its steps explain (at the typical time per step)
    by more than a threshold; that excess is the pause's length. A pause begins inside the interval
    before it (the last report before the standstill came some time before it began), so that
    interval's own excess moves to the pause. A standstill in the first interval is start-up (with no
    report between the start and the first progress) and counts as neither.
    """
    threshold = max(params.min_pause, 1.5 * report_interval, 3 * typical)
    moving: list[tuple[float, int]] = []
    pauses: _Pauses = []
    before: float | None = None  # the previous interval's excess if it was a stepping one
    for i, (dt, ds, at) in enumerate(intervals):
        stepping = ds * typical
        excess = dt - stepping
        if excess <= threshold:
            moving.append((dt, ds))
            before = excess
            continue
        if i == 0:
            pass  # start-up
        elif stepping > max(2 * report_interval, excess / 4) or (before is None and pauses and pauses[-1][1] is None):
            # Reports went missing over a stretch with both steps and standstill, or the standstill
            # began in such a stretch: how many pauses it holds, and how long, is unknown.
            pauses.append((at + ds, None))
        else:
            if before is not None and before > 0:
                moving[-1] = (moving[-1][0] - before, moving[-1][1])
                excess += before
            pauses.append((at, excess))
        before = None
    return moving, pauses


def _pause_model(
    pauses: _Pauses, origin: int, step: int, params: EtaParams
) -> tuple[float | None, float | None, int | None]:
    """Typical pause length, steps between pauses and the step of the last clear pause.

    The spacing is the median of the spacings between consecutive clear pauses (a stretch of missing
    reports breaks the chain); with one clear pause, the larger of the steps before and after it.
    Pauses that stopped coming (none seen in three spacings) are no longer expected.
    """
    clear = [(at, d) for at, d in pauses if d is not None]
    if not clear:
        return None, None, None
    spacings = [b[0] - a[0] for a, b in pairwise(pauses) if a[1] is not None and b[1] is not None]
    anchor = clear[-1][0]
    if spacings:
        every = float(_median(spacings[-params.history :]))
    elif len(pauses) == 1:
        every = float(max(anchor - origin, step - anchor))
    else:
        return None, None, anchor
    if every <= 0 or step - pauses[-1][0] > 3 * every:
        return None, None, anchor
    recent = [d for _, d in clear[-params.pause_memory :]]
    cap = 3 * _median(recent)  # one freak standstill must not set the length of every pause ahead
    return sum(min(d, cap) for d in recent) / len(recent), every, anchor


def _first_pause_ahead(anchor: int, every: float, step: int) -> int:
    """The ``k >= 1`` of the first pause at ``anchor + k * every`` not behind ``step`` (10% tolerance)."""
    return max(math.ceil((step - anchor) / every - 0.1), 1)


def _stepping_time(
    moving: list[tuple[float, int]], params: EtaParams
) -> tuple[float | None, float | None, float | None, float]:
    """Seconds per step over the recent window of stepping intervals, its fastest and slowest chunk.

    Chunks of at least ``params.chunk`` seconds are taken from the newest backwards, up to
    ``params.window`` seconds; an older chunk that disagrees with the window so far ends it.
    """
    # A young segment (a start, a resume) has less than a few chunks of stepping: its chunks are
    # shorter (a quarter of what there is, with at least 20 steps), so that a warm-up that just ended
    # leaves the window within seconds rather than minutes.
    stepping = sum(map(itemgetter(0), moving))
    steps = sum(map(itemgetter(1), moving))
    chunk = params.chunk
    if steps and stepping < 4 * params.chunk:
        chunk = max(stepping / 4, 20 * stepping / steps, min(params.chunk, params.min_pause))
    chunks: list[tuple[float, int]] = []
    span = 0.0
    dt_sum = 0.0
    ds_sum = 0
    for dt, ds in reversed(moving):
        dt_sum += dt
        ds_sum += ds
        if dt_sum >= chunk:
            chunks.append((dt_sum, ds_sum))
            span += dt_sum
            dt_sum, ds_sum = 0.0, 0
            if span >= params.window:
                break
    if ds_sum and (not chunks or dt_sum >= chunk / 2):
        chunks.append((dt_sum, ds_sum))  # the oldest, partial chunk
    if not chunks:
        return None, None, None, 0.0
    window_dt, window_ds = chunks[0]
    rates = [window_dt / window_ds]
    for dt, ds in chunks[1:]:
        ratio = (dt / ds) / (window_dt / window_ds)
        if max(ratio, 1 / ratio) - 1 > params.regime_change:
            break  # an older regime (warm-up, another phase) ends the window
        window_dt += dt
        window_ds += ds
        rates.append(dt / ds)
    return window_dt / window_ds, min(rates), max(rates), window_dt
