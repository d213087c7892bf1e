"""The plateau test behind ``not_learning``: is the primary metric still improving, beyond its noise?

:class:`PlateauDetector` is owned by a :class:`~.health.HealthTracker` (one per metric segment) and
fed the finite windows of the metric. It merges them into blocks (``plateau_blocks`` per plateau
window, kept for ``plateau_history`` windows in compact arrays: a few kB per job) and, once per
block, runs the test (:meth:`PlateauDetector._measure`): trimmed means of groups of blocks compared
with their standard errors, over the plateau window and over the longer history. The verdict
(:attr:`PlateauDetector.flat`) follows the tests with a confirmation both ways, so that one noisy
test neither raises nor clears it. ``docs/health.md`` explains the test and its defaults with the
curves they were chosen on.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import sub
from typing import NamedTuple

from .health_params import HealthParams

__all__ = ["PlateauDetector", "PlateauTest"]


class PlateauTest(NamedTuple):
    """One plateau test: the relative improvement per window, its standard error, the verdict."""

    t: float
    window: float
    gain: float  # relative improvement per window, from the window's oldest to its newest group
    se: float
    old: float
    new: float
    steps: int  # steps in the window
    long_gain: float | None  # the same over the longer history (None before it is covered)
    long_se: float | None
    learning: bool  # improved by min_delta or significantly: a job that learns stays healthy
    significant: bool  # improved significantly: a job that was not learning recovers
    since: float  # the centre of the window's oldest group: where a flat stretch begins
    since_step: int  # the step there
    early: float | None = None  # the rate before the window (per window; per its span of area with a learning rate)
    recent: float | None = None  # the rate over the window, in the same unit
    change_se: float | None = None  # the standard error of early - recent
    dropped: bool = False  # the recent rate fell significantly below the earlier one (the drop test's evidence)
    keeps_learning: bool | None = None  # learning with the drop test's lower threshold of a plateau being confirmed


class PlateauDetector:
    """The plateau test of one metric segment, fed window by window; O(1) amortised per window.

    What the test needs from the job is asked of its tracker, lazily (once per block): the plateau
    window in seconds, the time from which learning is judged (after the warm-up), and whether the
    job is in the annealing share or the last share of its planned steps.
    """

    def __init__(
        self,
        params: HealthParams,
        sign: float,
        window: Callable[[], float],
        judged_from: Callable[[], float],
        annealing: Callable[[], bool],
        finishing: Callable[[], bool],
    ) -> None:
        self.params = params
        self._sign = sign
        self._window = window
        self._judged_from = judged_from
        self._annealing = annealing
        self._finishing = finishing
        # the blocks (about window / plateau_blocks seconds each), oldest first, in compact arrays:
        # end time, mean, last step, windows; the oldest go once there are over 2 x ``keep`` blocks
        self.keep = int(max(params.plateau_history, 2.0) * params.plateau_blocks) + 16
        self._t = array("d")
        self._m = array("d")
        self._s = array("q")
        self._w = array("q")
        self._a = array("d")  # the learning-rate area at the block's end (NaN: no learning rate known)
        self._t0: float | None = None  # start of the current block
        self._start = math.inf  # the first window's time: the blocks cover the segment from there
        self._span = 0.0  # its length: the plateau window over plateau_blocks when it began (the first: in force)
        self._sum = 0.0
        self._weight = 0
        self._n = 0
        self._step = 0  # the newest window's step
        self.test: PlateauTest | None = None
        """The newest test (``None`` until a whole plateau window after the warm-up is in the blocks)."""
        self.flat = False
        """Not learning: the no-learning condition held for the confirmation."""
        self.flat_from: tuple[float, int] = (0.0, 0)
        """Where the flat stretch begins (time, step): the older group of the test that began it."""
        self._hold_t: float | None = None  # the no-learning condition holds since this test
        self._learn_t: float | None = None  # while flat: the learning condition holds since
        self._worse_t: float | None = None  # tests significantly worse than the window's start since
        self._worse_from: tuple[float, int] = (0.0, 0)

    def __len__(self) -> int:
        """Blocks held (memory is bounded: at most 2 x :attr:`keep`)."""
        return len(self._t)

    def observe(self, t: float, mean: float, weight: int, step: int, area: float = math.nan) -> bool:
        """One finite window (its mean over ``weight`` values) at server time ``t``; ``area`` is the
        learning-rate area at its step (:class:`~.signals.LearningRate`), NaN when the job reports none.

        Returns ``True`` when this window ended a plateau (the job learns again, confirmed).
        """
        self._step = step
        if self._t0 is None:
            self._t0 = self._start = t
        if not self._t:
            # the first block follows the window in force: the window is not known until the pace is
            # (600 s until then), and a first block of 600 s / 48 held a fast job's first 15 s, its
            # start-up fall included, in one mean that biased its first tests towards "learning"
            self._span = self._window() / self.params.plateau_blocks
        self._sum += mean * weight
        self._weight += weight
        self._n += 1
        if t - self._t0 < self._span:
            return False
        self._t.append(t)
        self._m.append(self._sum / self._weight)
        self._s.append(step)
        self._w.append(self._n)
        self._a.append(area)
        if len(self._t) > 2 * self.keep:
            for arr in (self._t, self._m, self._s, self._w, self._a):
                del arr[: len(arr) - self.keep]
        self._t0, self._sum, self._weight, self._n = t, 0.0, 0, 0
        self._span = self._window() / self.params.plateau_blocks
        return self._judge(t)

    def _judge(self, t: float) -> bool:
        """The test, once per block; the verdict follows the tests with a confirmation."""
        test = self._measure(t)
        if test is None:
            return False
        self.test = test
        p = self.params
        window = test.window
        confirm = (p.evidence_confirm if test.steps >= p.evidence_steps else p.plateau_confirm) * window
        if p.first_confirm and self._confirming_first(window):
            confirm = min(confirm, p.first_confirm * window)
        # a plateau ends only on evidence: an improvement beyond the noise (1 % in noise of 2 % is
        # no evidence), held for the confirmation too (no flapping on one lucky test)
        holding = not self.flat and self._hold_t is not None and test.keeps_learning is not None
        if (test.keeps_learning if holding else test.learning) if not self.flat else test.significant:
            self._worse_t = None
            if not self.flat:
                self._hold_t = None
                return False
            if self._learn_t is None:
                self._learn_t = t
            if t - self._learn_t >= confirm:
                self.flat, self._learn_t, self._hold_t = False, None, None
                return True
            return False
        self._learn_t = None
        if self.flat:
            return False
        # significantly worse than at the window's start: a spike that will recover, or a rise that
        # lasts; a spike neither confirms a plateau nor counts towards one, a rise that outlasts a
        # window is not learning
        if -test.gain >= max(2 * p.min_delta, p.change_z * test.se):
            self._hold_t = None
            if self._worse_t is None:
                self._worse_t = t
                self._worse_from = (test.since, test.since_step)
            if t - self._worse_t >= window and not self._finishing():
                self.flat, self.flat_from = True, self._worse_from
            return False
        self._worse_t = None
        if self._hold_t is None:
            self._hold_t = t
            self.flat_from = (test.since, test.since_step)
        if t - self._hold_t >= confirm and not self._finishing():
            self.flat = True
        return False

    def _steps_since(self, i: int) -> int:
        """Steps since the end of the block before block ``i`` (the first block's end for 0)."""
        return self._step - (self._s[i - 1] if i > 0 else self._s[0])

    def _learning_z(self, steps: int, first: bool) -> float:
        """Standard errors of improvement that count as learning under ``min_delta``: ``noise_z``, or
        ``noise_keep_z`` while a plateau of a window of ``evidence_steps`` steps or more is being
        confirmed: with a test per block, one in forty reaches ``noise_z`` on a flat loss by chance, and
        that sent the confirmation back to its start; ``first_keep_z`` (``first``) while a plateau from the
        segment's start is."""
        p = self.params
        if first:
            return p.first_keep_z
        confirming = not self.flat and self._hold_t is not None and steps >= p.evidence_steps
        return p.noise_keep_z if confirming else p.noise_z

    def _confirming_first(self, window: float) -> bool:
        """A plateau whose confirmation began in the segment's first ``first_windows`` windows is being
        confirmed."""
        hold = self._hold_t
        return not self.flat and hold is not None and hold - self._start < self.params.first_windows * window

    def _tested_span(self, t: float, window: float) -> float | None:
        """The span the test covers: the window, or, for a first window of ``first_share_steps`` steps or
        more, the share of it already in once that is ``plateau_first_share``; ``None`` before (its
        rates are per window all the same, only their noise is larger)."""
        p = self.params
        if self._start <= t - window + window / p.plateau_blocks:  # a whole window is in
            return window
        span = t - self._start + window / p.plateau_blocks
        if span < p.plateau_first_share * window or not self._s or self._step - self._s[0] < p.first_share_steps:
            return None
        return span

    def _lags(
        self, far: tuple[int, int], old: tuple[int, int], i_new: int, early_lag: float, lag: float
    ) -> tuple[float, float]:
        """The spans of the earlier and the recent rate, between the groups' centres: in learning-rate
        area when the job reports its learning rate and the area grew over both, else in steps; with
        ``rate_per_log_progress`` in the logarithm of either (see :class:`~.health_params.HealthParams`);
        in seconds when neither grew (no steps known)."""
        log = self.params.rate_per_log_progress
        for clock in (self._a, self._s):  # NaN (no learning rate known) compares false below
            if log:
                if not clock[far[0]] > 0:
                    continue
                x_far, x_old, x_new = (_mean_log(clock[a:b]) for a, b in (far, old, (i_new, len(clock))))
            elif clock is self._a:
                x_far, x_old, x_new = (_mean(clock[a:b]) for a, b in (far, old, (i_new, len(clock))))
            else:
                break  # without the logarithm, a job without a learning rate is measured in seconds, as before
            if x_old - x_far > 0 and x_new - x_old > 0:
                return x_old - x_far, x_new - x_old
        return early_lag, lag

    def _measure(self, t: float) -> PlateauTest | None:
        """Is the metric still improving? ``None`` until a whole plateau window is in the blocks.

        Three groups of blocks, each summarised by a trimmed mean (the worst 7/16 and the best 1/16 of
        its blocks dropped, so spikes towards the worse side go): the newest ``plateau_group`` of the
        plateau window, the oldest, and the window ``plateau_history`` windows back. The noise of a
        block is measured from the spread of successive blocks' differences, so each mean has a
        standard error. The job learns when (a) over the window it improved by ``min_delta`` or by
        ``noise_z`` standard errors, or (b) over the longer history it improved by ``noise_z``
        standard errors and the recent rate is not significantly below the earlier one: a slow steady
        tail, too slow to show within one window, still learns; a rate that drops to nothing does not.
        """
        p = self.params
        window = self._window()
        judged_from = self._judged_from()
        times, means = self._t, self._m
        # judged once the warm-up is over and a whole window is in: the first window may reach back into
        # the warm-up (a job flat from its start is seen a window after it starts, not warm-up + window)
        span = self._tested_span(t, window)
        if t < judged_from or not times or span is None:
            return None
        group = p.plateau_group * span
        history = max(p.plateau_history, 2.0) * window
        # a block is in a span when its end time is; bisect on the (increasing) end times
        i_last = bisect_right(times, t - span)
        i_old = bisect_right(times, t - span + group)
        i_new = bisect_right(times, t - group)
        n_old, n_new = i_old - i_last, len(times) - i_new
        i_span = bisect_right(times, t - history)
        windows = sum(self._w[i_span:])  # over the history: short windows of short jobs count too
        if n_old < 2 or n_new < 2 or windows < p.plateau_min_windows:
            return None
        sign = self._sign
        m_old, m_new = _trimmed(means[i_last:i_old], sign), _trimmed(means[i_new:], sign)
        c_old, c_new = sum(times[i_last:i_old]) / n_old, sum(times[i_new:]) / n_new
        lag = c_new - c_old
        if lag <= 0 or m_old == 0:
            return None
        # the noise from the whole history: a steadier estimate, but from few blocks (a first window: ~30)
        # still a noisy one: the thresholds of learning are Student-t quantiles at the estimate's degrees
        # of freedom (a seed of health_pace.py read its noise at half its size, and its flat loss as
        # learning); the drop test keeps its normal ones (with Student's, plateaus after learning came later)
        sigma, dof = _block_noise(means[i_span:]), p.noise_dof_per_block * (len(times) - i_span) or math.inf
        unit = sign * window / abs(m_old)  # a difference of means -> relative improvement per window
        gain = (m_old - m_new) * unit / lag
        se_old, se_new = sigma / math.sqrt(n_old), sigma / math.sqrt(n_new)
        se = math.hypot(se_old, se_new) * abs(unit) / lag
        # while a plateau from the start is being confirmed, min_delta alone ends nothing (first_keep_z)
        first = p.first_keep_z > 0 and self._confirming_first(window)
        significant = gain >= _student(self._learning_z(self._steps_since(i_last), first), dof) * se
        learning = significant or (gain >= p.min_delta and not first)
        long_gain = long_se = early = recent = change_se = keeps_learning = None
        dropped = False
        groups = _Groups(i_span, i_last, i_old, i_new, c_old, lag, m_old, m_new, sigma, dof, unit)
        past = self._over_history(t, history, window, judged_from, groups) if i_span > 0 else None
        if past is not None:
            long_gain, long_se, early, recent, change_se, dropped, steady, keeps = past
            # while a plateau is being confirmed, a rate whose drop falls just under change_z does not
            # end the confirmation: only one that is clearly no drop does (hysteresis)
            learning, significant, keeps_learning = (learning or steady, significant or steady, learning or keeps)
        since_step = self._s[min(bisect_right(times, c_old), len(times) - 1)]
        return PlateauTest(
            t,
            window,
            gain,
            se,
            m_old,
            m_new,
            self._steps_since(i_last),
            long_gain,
            long_se,
            learning,
            significant,
            c_old,
            since_step,
            early,
            recent,
            change_se,
            dropped,
            keeps_learning,
        )

    def _over_history(self, t: float, history: float, window: float, judged_from: float, g: _Groups) -> _History | None:
        """The test over the longer history (``None`` before it is covered, or when it reaches into the
        warm-up): a slow steady tail, too slow to show within one window, still learns; a rate that drops
        to nothing does not."""
        p = self.params
        times, means, sign = self._t, self._m, self._sign
        i_far = bisect_right(times, t - history + window)  # the history's first window: i_span..i_far
        n_far, n_last = i_far - g.i_span, len(times) - g.i_last
        if t - history < judged_from or n_far < 2:
            return None
        m_far, c_far = _trimmed(means[g.i_span : i_far], sign), sum(times[g.i_span : i_far]) / n_far
        m_last, c_last = _trimmed(means[g.i_last :], sign), sum(times[g.i_last :]) / n_last
        unit, sigma = g.unit, g.sigma
        # the last window against the window at the start of the history
        long_gain = (m_far - m_last) * unit / (c_last - c_far)
        # 1.15: a trimmed mean of a whole window also trims along the trend (measured on the healthy curves)
        long_se = 1.15 * sigma * math.sqrt(1 / n_far + 1 / n_last) * abs(unit) / (c_last - c_far)
        # the rate from there to the window's start against the rate over the window: per second,
        # or, when the job reports its learning rate, per unit of learning-rate area (a schedule
        # that decays the rate slows the loss by design; a loss flat while the area grows is not)
        early_lag, new_lag = self._lags((g.i_span, i_far), (g.i_last, g.i_old), g.i_new, g.c_old - c_far, g.lag)
        early = (m_far - g.m_old) * unit / early_lag
        recent = (g.m_old - g.m_new) * unit / new_lag
        se_far, se_old = sigma / math.sqrt(n_far), sigma / math.sqrt(g.i_old - g.i_last)
        se_new = sigma / math.sqrt(len(times) - g.i_new)
        change_se = abs(unit) * math.sqrt(
            (se_far / early_lag) ** 2 + (se_old * (1 / early_lag + 1 / new_lag)) ** 2 + (se_new / new_lag) ** 2
        )
        # a slow steady tail: improving over the history, at a rate that did not drop; near the
        # planned end a falling rate is the schedule annealing, and only a flat history counts
        dropped = early - recent >= p.change_z * change_se and not self._annealing()
        steady = long_gain >= _student(p.noise_z, g.dof) * long_se and not dropped
        if self.flat and t - history < self.flat_from[0]:
            # a plateau ends on an improvement made on it: a history that reaches back to the
            # learning before the plateau shows that learning, not a recovery
            steady = False
        keeps = steady and (self._annealing() or early - recent < p.change_keep_z * change_se)
        return _History(long_gain, long_se, early, recent, change_se, dropped, steady, keeps)


class _Groups(NamedTuple):
    """The window's groups of blocks in one test, as :meth:`PlateauDetector._over_history` needs them."""

    i_span: int  # the first block of the history
    i_last: int  # the first block of the window (its oldest group: i_last..i_old)
    i_old: int
    i_new: int  # the first block of the newest group (to the end)
    c_old: float  # the oldest group's centre (time)
    lag: float  # from the oldest group's centre to the newest's (seconds)
    m_old: float  # the groups' trimmed means
    m_new: float
    sigma: float  # a block's noise
    dof: float  # its degrees of freedom
    unit: float  # a difference of means -> relative improvement per window


class _History(NamedTuple):
    """The test over the history: the last window against the history's first, and the drop of the rate."""

    long_gain: float
    long_se: float
    early: float  # the rate before the window (per window; per its span of area with a learning rate)
    recent: float  # the rate over the window, in the same unit
    change_se: float  # the standard error of early - recent
    dropped: bool  # the recent rate fell significantly below the earlier one
    steady: bool  # improving over the history, at a rate that did not drop: a slow steady tail learns
    keeps: bool  # steady, with the drop test's lower threshold of a plateau being confirmed


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _mean_log(values: Sequence[float]) -> float:
    return sum(map(math.log, values)) / len(values)


def _student(z: float, dof: float) -> float:
    """The quantile of Student's t with ``dof`` degrees of freedom at the normal quantile ``z`` (the
    Cornish-Fisher expansion to 1/dof^4, Abramowitz & Stegun 26.7.5; for z <= 3 within 2.3 % of the
    exact value at 3 degrees of freedom, the least it is asked for, 0.7 % at 4, 0.1 % from 6); ``z``
    itself at ``math.inf``."""
    if math.isinf(dof) or math.isinf(z):
        return z
    k = max(dof, 3.0)
    z2 = z * z
    g1 = (z2 + 1) * z / 4
    g2 = ((5 * z2 + 16) * z2 + 3) * z / 96
    g3 = (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384
    g4 = ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160
    return z + (g1 + (g2 + (g3 + g4 / k) / k) / k) / k


def _block_noise(means: Sequence[float]) -> float:
    """One block's noise, robustly: 1.48 x the median absolute deviation of the differences of
    successive blocks (spikes and steps of the trend are outliers), over sqrt(2); times 1.1, the
    trimmed mean's loss of precision against a plain mean, so that sigma / sqrt(n) is its error."""
    diffs = sorted(map(sub, means[1:], means[:-1]))
    mid = diffs[len(diffs) // 2]
    spread = sorted(map(abs, map(sub, diffs, repeat(mid))))  # |d - mid|, without a Python loop
    return 1.1 * 1.4826 * float(spread[len(spread) // 2]) / math.sqrt(2)


def _trimmed(values: Sequence[float], sign: float) -> float:
    """Mean of the blocks left when the worst 7/16 and the best 1/16 are dropped: spikes go worse,
    so up to 7/16 of a group may be spiked; for normal noise its error is 1.1 times the mean's."""
    ordered = sorted(values) if sign > 0 else sorted(values, reverse=True)  # best first
    n = len(ordered)
    kept = ordered[n // 16 : n - 7 * n // 16]
    return sum(kept) / len(kept)
