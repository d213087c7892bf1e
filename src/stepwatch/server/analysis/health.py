"""Health of a training job: healthy, stalled, not learning, diverging, straggling, or unknown.

One :class:`HealthTracker` per job is fed every stored window of the job's primary metric (rank 0)
and every report of every rank, in arrival order, with the **server's** arrival time (a reporter's
clock is never trusted). Each ``observe_*`` is a handful of comparisons and additions (and, once
per block of windows, the plateau test); state is a few fixed-size deques and arrays per job and
per rank, so memory is bounded however long the job runs.
:meth:`HealthTracker.verdict` is cheap and is called after each ingest and by a periodic sweep, so
that a stall shows while no report arrives.

The states, strongest first (when several hold, the first one wins):

- ``diverging``: a non-finite value of the metric (at once, within the report that carries it), or
  the metric's *level* worse than ``diverge_factor`` times its best level (a sustained blow-up);
- ``stalled``: no report from rank 0 for ``max(stall_intervals x the usual report interval,
  stall_floor_s)``; or the step stands still for longer than that, ``standstill_floor_s``,
  ``standstill_steps`` step times and the longest recent pause (evaluation, checkpoint) with margin,
  or, for a rank whose reports say it evaluates, ``max(eval_floor_s, eval_factor x the longest
  evaluation finished)`` from the evaluation's start; or one rank hangs: its heartbeats stop, or its
  step stands while the other ranks move on. A job whose report core says where its ranks stand
  (``Report.where``, ``Report.activity_shares``) is judged by the place instead (:mod:`.stall`: a save
  or an evaluation may last 30 min, a rank in its own code hangs after 35 s or 3 x its p99 step time);
- ``straggling``: a rank ``1 / straggler_fraction`` (1.5) times slower than the median rank for
  ``straggler_hold_s`` (its step rate, or its busy share from its activity shares; :mod:`.straggler`);
- ``not_learning``: the metric no longer improves, measured against its own noise: over the plateau
  window (7 % of the planned duration, between 2 and 10 minutes) it improved by less than
  ``min_delta`` and by less than ``noise_z`` standard errors, and over the longer history
  (``plateau_history`` windows) it did not improve significantly either, or its rate dropped
  significantly (a plateau after learning); held for ``plateau_confirm`` of a window; outside the
  warm-up, and never newly raised in the last ``finish_fraction`` of the planned steps;
- ``healthy``; ``unknown`` when no value of the metric has arrived (never an alarm without data).

The *level* (for blow-ups) is the median of the last ``level_blocks`` block means, a block being the
count-weighted mean of ``block_windows`` consecutive windows: windowed means, never single points,
and a median so that spikes (evaluation, bad batches, loss spikes that recover) neither make nor
break a best. The plateau test behind ``not_learning`` lives in :mod:`.plateau`
(:class:`~.plateau.PlateauDetector`, one per metric segment): it keeps its own blocks,
``plateau_blocks`` per plateau window, for ``plateau_history`` windows in compact arrays (a few kB
per job), and runs once per block.
A step that goes backwards starts a new segment (a restart from a checkpoint): the metric's history
and the step time are learnt afresh, and nothing about the jump itself is alarming.
The rules live in their own modules, behind this one tracker: the stall and straggler rules in
:mod:`.stall_rules` (with :mod:`.stall` and :mod:`.straggler`), the divergence rules in
:mod:`.divergence`, the plateau test in :mod:`.plateau` and the learning verdicts (the plateau's, a
learning rate at zero, an evaluation's veto) in :mod:`.learning`; their verdicts share
:class:`~.verdict.Verdict`. The tracker keeps the clock, the segments and the pace, asks the rules
strongest first, and remembers the state (``recovered from ...``).
``docs/health.md`` explains the defaults with the curves they were chosen on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ...protocol import HEALTH_STATES
from .divergence import Divergence
from .downsample import WindowLike
from .health_params import DEFAULT_HEALTH_PARAMS, HealthParams
from .learning import LearningRules
from .plateau import PlateauDetector
from .stall import RankPlaces
from .stall_rules import StallRules
from .verdict import Verdict, dur, num, pct, signed

__all__ = [
    "HEALTH_STATES",
    "HealthParams",
    "HealthTracker",
    "StoredWindow",
    "Verdict",
    "replay",
]

_BAD = ("diverging", "stalled", "straggling", "not_learning")

StoredWindow = WindowLike
"""A stored window of the primary metric, as the store returns it (``t`` is arrival time)."""


class HealthTracker:
    """Per job; incremental. Every ``observe_*`` is O(1) amortised; memory is bounded."""

    def __init__(self, params: HealthParams | None = None, metric: str = "loss", direction: str = "min") -> None:
        if direction not in ("min", "max"):
            raise ValueError(f"direction must be 'min' or 'max', got {direction!r}")
        self.params = params or DEFAULT_HEALTH_PARAMS
        self.metric = metric
        self.direction = direction
        self._sign = 1.0 if direction == "min" else -1.0
        self._t = -math.inf  # newest arrival time seen (server clock, never goes back)
        self._total: int | None = None
        self._stalls = StallRules(self.params)
        self.places: RankPlaces = self._stalls.places
        """Where each rank stands, for a job whose report core samples its stack (:mod:`.stall`)."""
        # metric, and the second signals (learning rate, an evaluation metric)
        self._learning = LearningRules(self.params, metric, self._plateau_window, self._judged_from, self._finishing)
        self._reset_metric()
        self._w_step: int | None = None
        # verdict memory
        self._state = "unknown"
        self._since: float | None = None
        self._recovered: dict[str, Any] | None = None
        self._settled: tuple[Verdict, float | None, dict[str, Any] | None, Verdict] | None = None
        """The last calm verdict settled: the rules' verdict, the since and recovery it was settled with, the
        result (a verdict follows every report; the calm one is mostly the rules' cached one)."""

    def _reset_metric(self) -> None:
        self._m_t0: float | None = None  # first window of the metric segment
        self._m_t = 0.0  # newest window
        self._m_step = 0
        self._finite = False
        self._plateau = PlateauDetector(
            self.params, self._sign, self._plateau_window, self._judged_from, self._annealing, self._finishing
        )
        self._divergence = Divergence(self.params, self._sign, self.metric)
        self._learning.reset(self._plateau, self._divergence)

    @property
    def eval_metric(self) -> str | None:
        """The evaluation metric followed: the first one the job reported (``None``: none yet)."""
        return self._learning.eval_metric

    # ------------------------------------------------------------------------------------------
    # Observations

    def _clock(self, t: float) -> float | None:
        """Arrival time made monotonic (an earlier arrival counts as the newest time)."""
        if not math.isfinite(t):
            return None
        if t < self._t:
            return self._t
        self._t = t
        return t

    def _recover(self, state: str, message: str | None) -> None:
        """Note the sentence of a recovery from ``state`` (``None``: none)."""
        if message is not None:
            self._recovered = {"state": state, "message": message}

    def observe_window(
        self,
        t: float,
        step: int,
        last: float,
        min: float | None,
        max: float | None,
        mean: float | None,
        count: int,
        nonfinite: int,
        first_step: int | None = None,
    ) -> None:
        """One stored window of the primary metric (rank 0); ``t`` is the server's arrival time."""
        clock = self._clock(t)
        if clock is None:
            return
        t = clock
        if self._w_step is not None and step < self._w_step:
            self._reset_metric()  # a restart from an earlier checkpoint: a new segment
        self._w_step = step
        if self._m_t0 is None:
            self._m_t0 = t
        self._m_t = t
        self._m_step = step
        finite = count - nonfinite
        divergence = self._divergence
        self._recover("diverging", divergence.observe_values(t, step, last, nonfinite))
        if mean is None or finite <= 0 or not math.isfinite(mean):
            return
        self._finite = True
        self._recover("diverging", divergence.observe_mean(t, step, mean))
        area = self._learning.lr.area(step) if self.params.rate_per_lr_area else math.nan
        if self._plateau.observe(t, mean, finite, step, area):
            test = self._plateau.test
            assert test is not None
            self._recovered = {
                "state": "not_learning",
                "message": f"{self.metric} improves again: {signed(test.gain)} per {dur(test.window)} "
                f"(standard error {pct(test.se)}), level {num(test.new)} at step {step:,}",
            }
        self._recover("diverging", divergence.observe_block(t, step, mean, finite))

    def _judged_from(self) -> float:
        """Learning is judged from here on: the warm-up after the first window of the segment."""
        assert self._m_t0 is not None
        return self._m_t0 + self._warmup()

    def _annealing(self) -> bool:
        """In the last ``anneal_fraction`` of the planned steps (the learning rate decays to its end)."""
        total = self._total
        return total is not None and self._m_step >= (1 - self.params.anneal_fraction) * total

    def _finishing(self) -> bool:
        """In the last ``finish_fraction`` of the planned steps (the schedule's flat end)."""
        total = self._total
        return total is not None and self._m_step >= (1 - self.params.finish_fraction) * total

    def observe_lr(self, t: float, step: int, lr: float) -> None:
        """The learning rate in force at ``step`` (rank 0's report; the largest of its parameter groups).

        With it the plateau test measures the loss's rates per unit of learning-rate area (a decaying
        schedule slows the loss by design), and a learning rate of zero is ``not_learning``.
        """
        clock = self._clock(t)
        if clock is None:
            return
        self._recover("not_learning", self._learning.observe_lr(clock, step, lr, self._m_t0 is not None))

    def observe_eval(self, t: float, step: int, value: float, metric: str = "eval_loss") -> None:
        """An evaluation metric's newest value (rank 0's report); its direction follows from its name.

        An evaluation that still improves beyond its noise since the loss went flat keeps the job healthy.
        """
        del step  # kept for symmetry with the other observations: the test is in server time
        clock = self._clock(t)
        if clock is None:
            return
        self._learning.observe_eval(clock, value, metric)

    def observe_progress(
        self,
        t: float,
        rank: int,
        step: int | None,
        total_steps: int | None = None,
        *,
        evaluating: float | None = None,
    ) -> None:
        """One report of any rank (rank 0's, and the heartbeats of the others), at arrival time ``t``.

        ``total_steps``, when the report carries it, lets the plateau window and the warm-up scale with
        the job's planned duration. ``evaluating``: the seconds the rank says it has been evaluating
        (``progress.phase == "eval"``), ``None`` while it trains: its step may then stand for the
        evaluation's longer limit (``eval_floor_s``, ``eval_factor``).
        """
        clock = self._clock(t)
        if clock is None:
            return
        if total_steps is not None and total_steps > 0:
            self._total = total_steps
        self._stalls.observe_progress(clock, rank, step, evaluating)

    def observe_where(
        self,
        t: float,
        rank: int,
        step: int | None,
        activity: str,
        stood: float,
        detail: str = "",
        frames: Iterable[str] = (),
    ) -> None:
        """Where a rank stands (``Report.where``), after :meth:`observe_progress` of the same report:
        its activity, the seconds its step has stood, the library call that decided it, and the
        innermost frames of its own code (``"function (file:line)"``). From then on the job's stalls
        are judged by where its ranks stand (:mod:`.stall`)."""
        clock = self._clock(t)
        if clock is not None:
            self.places.observe(clock, rank, step, activity, stood, detail, frames)

    def observe_shares(self, rank: int, shares: Mapping[str, float], host: str = "") -> None:
        """The shares of a rank's report interval in each activity (``Report.activity_shares``): its report
        core can sample, so its stalls are judged by where it stands; and a straggler's extra time is named."""
        self.places.observe_shares(rank, shares, host, self._t if math.isfinite(self._t) else None)

    def observe_gpu(self, rank: int, utilization: float) -> None:
        """The mean utilisation (percent) of a rank's GPUs in its newest report: when every rank's step
        stands, the rank whose GPUs idle while the others' are busy (spinning in a collective) is the
        one that hung."""
        self._stalls.observe_gpu(rank, utilization)

    # ------------------------------------------------------------------------------------------
    # Thresholds

    def report_interval(self) -> float:
        """The job's usual report interval: the median of rank 0's recent gaps (a default before)."""
        return self._stalls.report_interval()

    def step_time(self) -> float | None:
        """Typical seconds per step of rank 0 in this segment (pauses are outliers the median drops)."""
        return self._stalls.step_time()

    def _planned(self) -> float | None:
        """Planned duration of the job in seconds, from the total steps and this segment's pace."""
        rate = self._stalls.rate()
        return self._total / rate if self._total is not None and rate else None

    def _floor(self, slow: float, fast: float) -> float:
        """A floor in seconds that weighs evidence: ``fast`` for a job that makes ``fast_floor_steps``
        steps in it, else ``slow``."""
        rate = self._stalls.rate()
        return min(slow, fast) if rate is not None and rate * fast >= self.params.fast_floor_steps else slow

    def _plateau_window(self) -> float:
        p = self.params
        planned = self._planned()
        if planned is None:
            return p.plateau_window_s
        floor = self._floor(p.plateau_min_s, p.plateau_fast_min_s)
        return min(max(p.plateau_fraction * planned, floor), p.plateau_window_s)

    def _warmup(self) -> float:
        p = self.params
        planned = self._planned()
        share = min(p.warmup_fraction * planned, p.warmup_cap_s) if planned else 0.0
        return max(self._floor(p.warmup_s, p.warmup_fast_s), share)

    # ------------------------------------------------------------------------------------------
    # Verdict

    def verdict(self, now: float, *, live: bool = True) -> Verdict:
        """The job's health at server time ``now``; ``live=False`` once the job has ended.

        An ended job is judged at its last observation, without stalls or stragglers: its health is
        what it was when it ended (diverged, not learning), never an alarm about its silence.
        """
        if not math.isfinite(now) or now < self._t:
            now = self._t
        found = self._divergence.verdict(self.report_interval)
        if found is None and live:
            found = self._stalls.stalled(now) or self._stalls.rank_scan(now, self._remaining)
        if found is None:
            found = self._learning.not_learning(self._m_t, self._m_step)
        if found is None:
            return self._settle(self._learning.calm(self._finite), now)
        return self._settle(found, now)

    def _settle(self, verdict: Verdict, now: float) -> Verdict:
        state = verdict.state
        if state in _BAD:
            self._state, self._since = state, verdict.since
            self._recovered = None
            return verdict
        memo = self._settled
        if (
            memo is not None
            and memo[0] is verdict
            and state == self._state
            and self._since is not None
            and memo[1] == self._since
            and memo[2] is self._recovered
        ):
            return memo[3]  # the same calm verdict as the last one (its rules' cached answer), nothing new to say
        if state != self._state or self._since is None:
            came_from = self._state
            self._state, self._since = state, (now if math.isfinite(now) else None)
            if came_from in _BAD and state == "healthy":
                note = self._recovered if self._recovered and self._recovered["state"] == came_from else None
                message = note["message"] if note else f"{came_from.replace('_', ' ')} no longer holds"
                self._recovered = {"state": came_from, "message": f"recovered from {came_from}: {message}"}
            elif state == "healthy":
                self._recovered = None
        evidence = dict(verdict.evidence)
        evidence["since"] = self._since
        if state == "healthy" and self._recovered and self._recovered["message"].startswith("recovered"):
            evidence["recovered_from"] = self._recovered["state"]
            evidence["message"] = self._recovered["message"]
        settled = Verdict(state, self._since, evidence)
        self._settled = (verdict, self._since, self._recovered, settled)
        return settled

    def _remaining(self) -> float | None:
        """Seconds rank 0 still needs at its pace in this segment (``None``: no total or no pace yet)."""
        return self._stalls.remaining(self._total)

    # ------------------------------------------------------------------------------------------

    @classmethod
    def replay(
        cls,
        windows: Iterable[StoredWindow],
        params: HealthParams | None = None,
        metric: str = "loss",
        direction: str = "min",
        total_steps: int | None = None,
    ) -> HealthTracker:
        """Rebuild a tracker from a job's stored windows (after a server restart), in stored order.

        Each window also counts as a report of rank 0 at its step; the heartbeats of other ranks are
        not stored, so ranks are learnt afresh from the next reports.
        """
        tracker = cls(params, metric, direction)
        for w in windows:
            tracker.observe_progress(w.t, 0, w.step, total_steps)
            tracker.observe_window(w.t, w.step, w.last, w.min, w.max, w.mean, w.count, w.nonfinite)
        return tracker


def replay(params: HealthParams | None, metric: str, direction: str, windows: Iterable[StoredWindow]) -> HealthTracker:
    """Rebuild a tracker from stored windows; see :meth:`HealthTracker.replay`."""
    return HealthTracker.replay(windows, params, metric, direction)
