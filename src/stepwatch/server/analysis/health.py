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
``docs/health.md`` explains the defaults with the curves they were chosen on.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from .downsample import WindowLike
from .health_params import DEFAULT_HEALTH_PARAMS, HealthParams
from .plateau import PlateauDetector
from .signals import EvalTrend, LearningRate, eval_direction
from .stall import RankPlaces, StallKnobs, Standing, judge
from .straggler import RankPace, Stragglers

__all__ = [
    "HEALTH_STATES",
    "HealthParams",
    "HealthTracker",
    "StoredWindow",
    "Verdict",
    "replay",
]

HEALTH_STATES = ("healthy", "stalled", "not_learning", "diverging", "straggling", "unknown")
"""Every health a job can have (the store keeps the same tuple)."""

_BAD = ("diverging", "stalled", "straggling", "not_learning")

_GPU_IDLE = 5.0
"""A rank whose GPUs run kernels less than this share of the time (percent) is idle."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A job's health at one time, with the evidence for it (JSON-ready)."""

    state: str
    """One of :data:`HEALTH_STATES`."""
    since: float | None
    """Server time the state began (for ``not_learning``: the last real improvement)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """``metric``, ``window``, ``threshold``, ``observed``, ``since`` and ``message`` (one sentence)."""


StoredWindow = WindowLike
"""A stored window of the primary metric, as the store returns it (``t`` is arrival time)."""


class _Rank:
    """What is known of one rank's progress."""

    __slots__ = (
        "busy",
        "change_t",
        "checkpoints",
        "clock_t",
        "eval_t",
        "last_t",
        "moved",
        "spt",
        "step",
    )

    def __init__(self, t: float, step: int | None) -> None:
        self.last_t = t
        self.step = step
        self.change_t = t
        self.clock_t = t  # where its standstill is counted from: its last change of step, or the end of an evaluation
        self.eval_t: float | None = None  # when the evaluation it says it is in began (server time)
        self.checkpoints: deque[tuple[float, int]] = deque(maxlen=9)
        if step is not None:
            self.checkpoints.append((t, step))
        self.moved = False  # its step moved in this segment
        self.spt: deque[float] = deque(maxlen=31)  # recent seconds per step, one per change of step
        self.busy: float | None = None  # its GPUs' mean utilisation in its newest report (percent)

    def advance(self, t: float, step: int) -> None:
        """A report at ``t`` whose step differs from the one known (a restart when it went back)."""
        old = self.step
        if old is not None and step < old:
            self.checkpoints.clear()
            self.spt.clear()
            self.moved = False
        elif old is not None:
            if self.moved:
                self.spt.append((t - self.clock_t) / (step - old))  # an evaluation's time is no step time
            self.moved = True
        self.step, self.change_t, self.clock_t = step, t, t

    def phase(self, t: float, previous_t: float, evaluating: float | None) -> float | None:
        """Note the phase of a report at ``t`` (``evaluating``: seconds into an evaluation, ``None``:
        training); the length of the evaluation it ends, if it ends one. An evaluation began at its
        report's time less the seconds it says, not before the rank's previous report (which said
        otherwise) nor after this one."""
        if evaluating is not None:
            if self.eval_t is None:
                self.eval_t = min(t, max(t - evaluating, previous_t))
            return None
        if self.eval_t is None:
            return None
        length = t - self.eval_t
        self.eval_t = None
        self.clock_t = max(self.clock_t, t)  # the standstill is counted afresh from the end of the evaluation
        return length


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
        # rank 0 progress
        self._r0_t: float | None = None
        self._r0_step: int | None = None
        self._r0_change_t = 0.0
        self._r0_moved = False  # the step moved in this segment
        self._seg_t0: float | None = None
        self._seg_step0 = 0
        self._gaps: deque[float] = deque(maxlen=self.params.interval_memory)
        self._spt: deque[float] = deque(maxlen=31)
        self._pauses: deque[float] = deque(maxlen=self.params.pause_memory)
        self._longest_eval = 0.0  # the longest evaluation any rank finished (seconds)
        # ranks
        self._ranks: dict[int, _Rank] = {}
        p = self.params
        knobs = StallKnobs(patient_floor_s=p.patient_floor_s, hang_floor_s=p.hang_floor_s, busy_floor_s=p.busy_floor_s)
        self.places = RankPlaces(knobs, max_ranks=p.max_ranks)
        self._stragglers = Stragglers(self.params.straggler_fraction, self.params.straggler_hold_s)
        """Where each rank stands, for a job whose report core samples its stack (:mod:`.stall`)."""
        self._scan_t = -math.inf
        self._scan: Verdict | None = None
        # metric, and the second signals (learning rate, an evaluation metric)
        self.eval_metric: str | None = None
        self._eval_direction = "min"
        self._reset_metric()
        self._w_step: int | None = None
        # verdict memory
        self._state = "unknown"
        self._since: float | None = None
        self._recovered: dict[str, Any] | None = None
        self._calm_cache: tuple[tuple[Any, ...], Verdict] | None = None
        self._flagged = False  # the newest judgement of learning was not_learning

    def _reset_metric(self) -> None:
        self._m_t0: float | None = None  # first window of the metric segment
        self._m_t = 0.0  # newest window
        self._m_step = 0
        self._finite = False
        self._b_sum = 0.0
        self._b_weight = 0
        self._b_n = 0
        self._blocks: deque[float] = deque(maxlen=self.params.level_blocks)
        self._level: float | None = None
        self._best: float | None = None  # best level (for blow-ups)
        self._best_step = 0
        self._plateau = PlateauDetector(
            self.params, self._sign, self._plateau_window, self._judged_from, self._annealing, self._finishing
        )
        self._blow_since: float | None = None
        # the fast divergence rules (orders of magnitude above the running best, or doubling per window)
        self._recent: deque[float] = deque(maxlen=self.params.diverge_smooth)
        self._fast_best: tuple[float, int] | None = None  # (best median of recent window means, its step)
        self._prev_mean: float | None = None
        self._orders_run: list[tuple[float, int]] = []  # (time, step) of the windows in a row over the bound
        self._grow_run: list[tuple[float, int]] = []
        self._fast: dict[str, Any] | None = None  # the evidence while the fast rules hold
        self._nan_since: float | None = None
        self._nan_step = 0
        self._nan_value = math.nan
        self._clean = 0  # finite windows since the last non-finite one
        self._lr = LearningRate()
        self._lr_flat = False  # the learning rate has been zero for the confirmation (decided on observation)
        self._eval = EvalTrend(self._eval_direction)
        self._veto_cache: tuple[tuple[float, float, float], tuple[float, float, int] | None] | None = None

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
        if nonfinite > 0 or not math.isfinite(last):
            if self._nan_since is None:
                self._nan_since, self._nan_step = t, step
                self._nan_value = last if not math.isfinite(last) else math.nan
            self._clean = 0
        elif self._nan_since is not None:
            self._clean += 1
            if self._clean >= self.params.nonfinite_recover_windows:
                self._recovered = {"state": "diverging", "message": f"{self.metric} is finite again"}
                self._nan_since = None
        if mean is None or finite <= 0 or not math.isfinite(mean):
            return
        self._finite = True
        if self._sign > 0:
            self._fast_divergence(t, step, mean)
        area = self._lr.area(step) if self.params.rate_per_lr_area else math.nan
        if self._plateau.observe(t, mean, finite, step, area):
            test = self._plateau.test
            assert test is not None
            self._recovered = {
                "state": "not_learning",
                "message": f"{self.metric} improves again: {_signed(test.gain)} per {_dur(test.window)} "
                f"(standard error {_pct(test.se)}), level {_num(test.new)} at step {step:,}",
            }
        self._b_sum += mean * finite
        self._b_weight += finite
        self._b_n += 1
        if self._b_n >= self.params.block_windows:
            self._blocks.append(self._b_sum / self._b_weight)
            self._b_sum, self._b_weight, self._b_n = 0.0, 0, 0
            if len(self._blocks) == self.params.level_blocks:
                self._new_level(t, step)

    def _fast_divergence(self, t: float, step: int, mean: float) -> None:
        """The fast divergence rules of a minimised metric, one finite window mean at a time: the mean
        ``10 ** diverge_orders`` times its running best for ``diverge_windows`` windows in a row, or
        growing ``diverge_growth`` times per window for ``diverge_windows`` + 1 windows in a row while
        above 10 x that best. Both compare window means (many steps each) with a best that is a median
        of window means, so neither a lucky window nor a one-window spike decides."""
        p = self.params
        found = self._fast_best
        prev = self._prev_mean
        self._prev_mean = mean
        if found is not None and found[0] > 0:
            best, best_step = found
            ratio = mean / best
            if ratio >= 10**p.diverge_orders:
                self._orders_run.append((t, step))
            else:
                self._orders_run.clear()
            if ratio >= 10 and prev is not None and prev > 0 and mean >= p.diverge_growth * prev:
                self._grow_run.append((t, step))
            else:
                self._grow_run.clear()
            rule = None
            if len(self._orders_run) >= p.diverge_windows:
                rule, run = "orders", self._orders_run
            elif len(self._grow_run) >= p.diverge_windows + 1:
                rule, run = "growth", self._grow_run
            if rule is not None and self._fast is None:
                since, since_step = run[0]
                self._fast = {"rule": rule, "since": since, "since_step": since_step}
                self._fast.update(best=best, best_step=best_step)
            if self._fast is not None:
                self._fast.update(observed=mean, step=step, ratio=ratio)
                if ratio < 10:
                    self._recovered = {"state": "diverging", "message": f"{self.metric} is back within 10x its best"}
                    self._fast = None
            if ratio >= 10:
                return  # a window of a blow-up makes no best
        self._recent.append(mean)
        level = median(self._recent)
        if found is None or level < found[0]:
            self._fast_best = (level, step)

    def _new_level(self, t: float, step: int) -> None:
        ordered = sorted(self._blocks)
        half = len(ordered) // 2
        level = ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2
        self._level = level
        sign = self._sign
        best = self._best
        if best is None or sign * level < sign * best:
            self._best, self._best_step = level, step
            best = level
        threshold = self._blow_threshold(best)
        if threshold is not None and sign * level > sign * threshold:
            if self._blow_since is None:
                self._blow_since = t
        elif self._blow_since is not None:
            self._recovered = {"state": "diverging", "message": f"{self.metric} came back under the blow-up threshold"}
            self._blow_since = None

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

    def _blow_threshold(self, best: float) -> float | None:
        k = self.params.diverge_factor
        if best == 0 or k <= 1:
            return None
        if self._sign > 0:
            return best * k if best > 0 else best + (k - 1) * abs(best)
        return best / k if best > 0 else best - (1 - 1 / k) * abs(best)

    def observe_lr(self, t: float, step: int, lr: float) -> None:
        """The learning rate in force at ``step`` (rank 0's report; the largest of its parameter groups).

        With it the plateau test measures the loss's rates per unit of learning-rate area (a decaying
        schedule slows the loss by design), and a learning rate of zero is ``not_learning``.
        """
        clock = self._clock(t)
        if clock is None:
            return
        t = clock
        lr_state = self._lr
        lr_state.observe(t, step, lr, self.params.lr_zero_fraction)
        zero = lr_state.zero_since
        if zero is None:
            if self._lr_flat:
                self._recovered = {"state": "not_learning", "message": f"the learning rate is {lr:.3g} again"}
            self._lr_flat = False
        elif not self._lr_flat and self._m_t0 is not None:
            # held for the confirmation past the warm-up: a rate that reached zero inside the warm-up
            # (a short schedule, a bad config) counts from the warm-up's end, never not at all
            held = t - max(zero[0], self._judged_from()) >= self.params.plateau_confirm * self._plateau_window()
            self._lr_flat = held and not self._finishing()

    def observe_eval(self, t: float, step: int, value: float, metric: str = "eval_loss") -> None:
        """An evaluation metric's newest value (rank 0's report); its direction follows from its name.

        An evaluation that still improves beyond its noise since the loss went flat keeps the job healthy.
        """
        del step  # kept for symmetry with the other observations: the test is in server time
        clock = self._clock(t)
        if clock is None:
            return
        if self.eval_metric is None:
            self.eval_metric, self._eval_direction = metric, eval_direction(metric)
            self._eval = EvalTrend(self._eval_direction)
        elif metric != self.eval_metric:
            return
        self._eval.observe(clock, value)

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
        t = clock
        if total_steps is not None and total_steps > 0:
            self._total = total_steps
        if evaluating is not None and not (evaluating >= 0 and math.isfinite(evaluating)):
            evaluating = 0.0
        r = self._ranks.get(rank)
        resumed = -math.inf  # the end of the rank's last evaluation, or its last change of step
        if r is None:
            if len(self._ranks) < self.params.max_ranks:
                r = self._ranks[rank] = _Rank(t, step)
                r.phase(t, -math.inf, evaluating)
        else:
            length = r.phase(t, r.last_t, evaluating)
            if length is not None:
                self._longest_eval = max(self._longest_eval, length)
            resumed = r.clock_t
            r.last_t = t
            if step is not None:
                if r.step is None or step != r.step:
                    self._moved(t, rank, r, step)
                    r.advance(t, step)
                cps = r.checkpoints
                if not cps or t - cps[-1][0] >= self.params.rate_window_s / 8:
                    cps.append((t, step))
        if rank == 0:
            self._progress0(t, step, resumed)

    def _moved(self, t: float, rank: int, r: _Rank, step: int) -> None:
        """Tell :attr:`places` that a rank's step moved (with its step time) or went back."""
        if r.step is not None and step < r.step:
            self.places.restart(rank)
            self._stragglers.restart(rank)
        elif r.step is not None and r.moved:
            self.places.moved(t, rank, (t - r.clock_t) / (step - r.step))
        else:
            self.places.moved(t, rank, None)

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
        r = self._ranks.get(rank)
        if r is not None and math.isfinite(utilization):
            r.busy = utilization

    def _progress0(self, t: float, step: int | None, resumed: float) -> None:
        """Rank 0's report: its report gaps, step times and pauses (``resumed``: the end of its last
        evaluation, which neither counts as step time nor as a pause)."""
        if self._r0_t is not None and t > self._r0_t:
            self._gaps.append(t - self._r0_t)
        self._r0_t = t
        if step is None:
            return
        old = self._r0_step
        if old is None or step < old:  # the first report, or a restart: a new segment
            self._r0_step, self._r0_change_t, self._r0_moved = step, t, False
            self._seg_t0, self._seg_step0 = t, step
            self._spt.clear()
            self._pauses.clear()
            return
        if step == old:
            return
        standing = t - max(self._r0_change_t, resumed)
        if self._r0_moved:
            self._spt.append(standing / (step - old))
            if standing > self._silence_limit():
                self._pauses.append(standing)
        else:
            self._seg_t0, self._seg_step0 = self._r0_change_t, old  # start-up time is not stepping time
        self._r0_step, self._r0_change_t, self._r0_moved = step, t, True

    # ------------------------------------------------------------------------------------------
    # Thresholds

    def report_interval(self) -> float:
        """The job's usual report interval: the median of rank 0's recent gaps (a default before)."""
        return median(self._gaps) if len(self._gaps) >= 3 else self.params.default_interval_s

    def step_time(self) -> float | None:
        """Typical seconds per step of rank 0 in this segment (pauses are outliers the median drops)."""
        return median(self._spt) if self._spt else None

    def _silence_limit(self) -> float:
        p = self.params
        return max(p.stall_intervals * self.report_interval(), p.stall_floor_s)

    def _standstill_limit(self, r: _Rank) -> tuple[float, float | None]:
        """How long a rank's step may stand while its reports arrive, and its recent step time used
        (the ``standstill_quantile`` of its own recent step times)."""
        p = self.params
        spt = _quantile(r.spt, p.standstill_quantile) if r.spt else None
        limit = max(self._silence_limit(), p.standstill_floor_s, p.standstill_steps * spt if spt else 0.0)
        if self._pauses:
            limit = max(limit, min(p.pause_factor * max(self._pauses), p.pause_cap_s))
        if not r.moved:
            limit = max(limit, p.startup_s)
        return limit, spt

    def _eval_limit(self) -> float:
        """How long an evaluation may last before its rank is stalled: ``eval_floor_s``, or
        ``eval_factor`` x the longest evaluation the job finished."""
        p = self.params
        return max(p.eval_floor_s, p.eval_factor * self._longest_eval)

    def _rate(self) -> float | None:
        """Rank 0's steps per second in this segment (from its first step on), once known."""
        if self._seg_t0 is None or self._r0_step is None or self._r0_t is None:
            return None
        steps = self._r0_step - self._seg_step0
        if steps <= 0 or self._r0_t <= self._seg_t0:
            return None
        return steps / (self._r0_t - self._seg_t0)

    def _planned(self) -> float | None:
        """Planned duration of the job in seconds, from the total steps and this segment's pace."""
        rate = self._rate()
        return self._total / rate if self._total is not None and rate else None

    def _floor(self, slow: float, fast: float) -> float:
        """A floor in seconds that weighs evidence: ``fast`` for a job that makes ``fast_floor_steps``
        steps in it, else ``slow``."""
        rate = self._rate()
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
        found = self._diverging()
        if found is None and live:
            found = self._stalled(now) or self._rank_scan(now)
        if found is None:
            found = self._not_learning()
        if found is None:
            return self._settle(self._calm(), now)
        return self._settle(found, now)

    def _settle(self, verdict: Verdict, now: float) -> Verdict:
        state = verdict.state
        if state in _BAD:
            self._state, self._since = state, verdict.since
            self._recovered = None
            return verdict
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
        return Verdict(state, self._since, evidence)

    def _evidence(
        self, metric: str, window: Any, threshold: Any, observed: Any, since: float | None, message: str, **more: Any
    ) -> dict[str, Any]:
        return {
            "metric": metric,
            "window": window,
            "threshold": threshold,
            "observed": observed,
            "since": since,
            "message": message,
            **more,
        }

    def _diverging(self) -> Verdict | None:
        m = self.metric
        if self._nan_since is not None:
            value = "NaN" if math.isnan(self._nan_value) else ("Inf" if self._nan_value > 0 else "-Inf")
            message = f"{m} became non-finite ({value}) at step {self._nan_step:,}"
            ev = self._evidence(m, {"windows": 1}, "finite", value, self._nan_since, message)
            return Verdict("diverging", self._nan_since, ev)
        fast = self._fast
        if fast is not None:
            orders = math.log10(fast["ratio"]) if fast["ratio"] > 0 else 0.0
            steps = fast["step"] - fast["since_step"]
            if fast["rule"] == "orders":
                why = f"{orders:.1f} orders of magnitude above its best"
            else:
                growth = self.params.diverge_growth
                why = f"{growth:g}x or more per report for {steps:,} steps, {fast['ratio']:.3g}x its best"
            message = (
                f"{m} climbs: {_num(fast['observed'])} at step {fast['step']:,}, {why} "
                f"({_num(fast['best'])} at step {fast['best_step']:,}), since step {fast['since_step']:,}"
            )
            threshold = fast["best"] * (10**self.params.diverge_orders if fast["rule"] == "orders" else 10)
            ev = self._evidence(
                m,
                {"windows": self.params.diverge_windows, "steps": steps},
                threshold,
                fast["observed"],
                fast["since"],
                message,
                best=fast["best"],
                best_step=fast["best_step"],
                step=fast["step"],
                since_step=fast["since_step"],
                ratio=fast["ratio"],
                rule=fast["rule"],
            )
            return Verdict("diverging", fast["since"], ev)
        if self._blow_since is not None and self._best is not None and self._level is not None:
            threshold = self._blow_threshold(self._best)
            word = "above" if self._sign > 0 else "below"
            message = (
                f"{m} level {_num(self._level)} is {word} {self.params.diverge_factor:g}x its best "
                f"({_num(self._best)} at step {self._best_step:,})"
            )
            ev = self._evidence(
                m, self._level_window(), threshold, self._level, self._blow_since, message, best=self._best
            )
            return Verdict("diverging", self._blow_since, ev)
        return None

    def _level_window(self) -> dict[str, float]:
        p = self.params
        return {"seconds": round(p.block_windows * p.level_blocks * self.report_interval(), 1)}

    def _stalled(self, now: float) -> Verdict | None:
        if self._r0_t is None:
            return None
        silent = now - self._r0_t
        if silent > self.params.stall_floor_s:
            limit = self._silence_limit()
            if silent > limit:
                message = f"no report from rank 0 for {_dur(silent)} (usually every {_dur(self.report_interval())})"
                ev = self._evidence("reports", {"seconds": limit}, limit, silent, self._r0_t, message, rank=0)
                return Verdict("stalled", self._r0_t, ev)
        if len(self._ranks) > 1:
            return None  # the ranks' standstills are scanned with the ranks (_rank_scan)
        return self._standstill(now)

    def _standstill(self, now: float) -> Verdict | None:
        """A rank whose step stands past its limit while its reports arrive, named.

        When several stand (a rank hung in its data loader blocks the others in the next collective),
        the one named is the one behind: the lowest step, then the one whose GPUs idle while the
        others' are busy, then the one that stood first."""
        p = self.params
        silence = self._silence_limit()
        floor = now - p.standstill_floor_s
        if not any(r.clock_t < floor and r.last_t > r.clock_t for r in self._ranks.values()):
            return None  # the common case, without a limit computed: every rank stepped within the floor
        if self.places.any_sampling():
            return self._placed_standstill(now, silence)
        over: list[tuple[tuple[bool, int, bool, float, int], float, float | None]] = []
        passed = False  # some rank stood past its limit
        for rank, r in self._ranks.items():
            if r.step is None or now - r.last_t > silence:
                continue  # a silent rank is judged by its silence
            if r.last_t <= r.clock_t:
                continue  # not one report since its step last moved (or its evaluation ended): it may be moving
            limit, spt = self._standstill_limit(r)
            standing = now - r.clock_t
            if r.eval_t is not None:  # evaluating: counted from the evaluation's start, with its own limit
                standing, limit = now - r.eval_t, max(limit, self._eval_limit())
            late = standing > p.standstill_floor_s and standing > limit
            passed = passed or late
            idle = r.busy is not None and r.busy < _GPU_IDLE
            # a rank within its evaluation's allowance is named last: it says why it stands
            over.append(((r.eval_t is not None and not late, r.step, not idle, r.clock_t, rank), limit, spt))
        if not passed:
            return None
        # the rank named is chosen among every rank that stands (a report since its step last moved), not
        # only those past their limit: the ranks a hung one blocks may be seen standing first
        (_, step, busy, change_t, rank), limit, spt = min(over)  # change_t: its last step, or evaluation's end
        r = self._ranks[rank]
        standing = now - change_t
        how = "has not moved" if r.moved else "has not moved since the start"
        if change_t > r.change_t:
            how += " since its evaluation ended"
        who = f"rank {rank}'s step" if len(self._ranks) > 1 else "step"
        message = f"{who} {how} from {step:,} for {_dur(standing)} while reports arrive"
        if r.eval_t is not None:
            longest = (
                f", {p.eval_factor:g}x the longest one finished ({_dur(self._longest_eval)})"
                if self._longest_eval
                else ""
            )
            message += (
                f"; it has been evaluating for {_dur(now - r.eval_t)} "
                f"(allowed {_dur(limit)}: at least {_dur(p.eval_floor_s)}{longest})"
            )
        elif spt is not None:
            message += f" (its recent p{p.standstill_quantile * 100:.0f} step time {spt:.3g} s, allowed {_dur(limit)})"
        others = sorted(k for k in self._ranks if k != rank)
        if others:
            waiting = [k for (*_, k), _, _ in over if k != rank]
            if len(waiting) == len(others):
                message += f"; the other {len(others)} ranks stand too, behind it"
                if not busy:
                    message += " (its GPUs idle while theirs are busy)"
            else:
                message += f"; {len(others) - len(waiting)} of the other {len(others)} ranks move on"
        bound = round(limit, 1)
        ev = self._evidence("step", {"seconds": bound}, bound, round(standing, 1), change_t, message)
        ev.update(rank=rank, step=step, step_time=spt)
        if others:  # a single rank standing beside itself is no news ("ranks standing 0")
            ev["ranks_standing"] = sorted(k for (*_, k), _, _ in over)
        if r.eval_t is not None:
            ev.update(phase="eval", eval_seconds=round(now - r.eval_t, 1), longest_eval=round(self._longest_eval, 1))
        return Verdict("stalled", change_t, ev)

    def _placed_standstill(self, now: float, silence: float) -> Verdict | None:
        """The standstill of a job whose ranks say where they stand (:func:`.stall.judge`)."""
        standing = [
            Standing(
                rank,
                r.step,
                r.clock_t,
                r.moved,
                r.eval_t,
                r.busy is not None and r.busy < _GPU_IDLE,
            )
            for rank, r in self._ranks.items()
            if r.step is not None and now - r.last_t <= silence and r.last_t > r.clock_t
        ]
        found = judge(
            self.places,
            standing,
            now,
            startup_s=self.params.startup_s,
            eval_limit=self._eval_limit(),
            ranks=len(self._ranks),
        )
        if found is None:
            return None
        since, evidence = found
        return Verdict("stalled", since, evidence)

    def _rank_scan(self, now: float) -> Verdict | None:
        """Hanging ranks and stragglers, from a scan of every rank at most every ``rank_check_s``."""
        if len(self._ranks) < 2:
            return None
        p = self.params
        if now - self._scan_t < p.rank_check_s:
            return self._scan
        self._scan_t = now
        silence = self._silence_limit()
        rates: list[tuple[float, int, _Rank]] = []
        for rank, r in self._ranks.items():
            if now - r.last_t > silence:
                message = f"rank {rank} has sent no heartbeat for {_dur(now - r.last_t)}"
                ev = self._evidence("heartbeats", {"seconds": silence}, silence, now - r.last_t, r.last_t, message)
                self._scan = Verdict("stalled", r.last_t, {**ev, "rank": rank})
                return self._scan
            if len(r.checkpoints) >= 2 and r.step is not None:
                t0, s0 = r.checkpoints[0]
                if r.last_t - t0 >= p.rate_window_s / 2:
                    rates.append(((r.step - s0) / (r.last_t - t0), rank, r))
        self._scan = self._standstill(now)
        if self._scan is not None:
            return self._scan
        paces = [RankPace(rank, rate) for rate, rank, _ in rates]
        paces += [RankPace(rank, None) for rank in self._ranks if rank not in {k for _, k, _ in rates}]
        found = self._stragglers.scan(paces, self.places, now, self._remaining())
        if found is None:
            return None
        since, ev = found
        self._scan = Verdict("straggling", since, ev)
        return self._scan

    def _remaining(self) -> float | None:
        """Seconds rank 0 still needs at its pace in this segment (``None``: no total or no pace yet)."""
        rate = self._rate()
        if self._total is None or not rate or self._r0_step is None:
            return None
        return max(self._total - self._r0_step, 0) / rate

    def _eval_vetoes(self, since: float) -> tuple[float, float, int] | None:
        """The evaluation metric's improvement since ``since`` when it is significant (the job learns)."""
        if self.eval_metric is None:
            return None
        p = self.params
        window = self._plateau_window()
        key = (since, self._eval.newest(), window)
        if self._veto_cache is not None and self._veto_cache[0] == key:
            return self._veto_cache[1]  # a verdict follows every ingest; the evaluations change every few minutes
        found = self._eval.improvement(since, window, p.eval_min_points)
        if found is None:
            return None
        gain, se, _ = found
        vetoed = found if gain > 0 and gain >= p.noise_z * se else None
        self._veto_cache = (key, vetoed)
        return vetoed

    def _eval_since(self, since: float) -> float:
        """Where the evaluation is judged from when the loss is flat since ``since``: there when the
        loss's evidence is a drop of its rate (a significant slowing since its history); from the
        start of that history when its evidence is the history itself, which did not improve
        significantly: the evaluation then answers the same question over the same span
        (``eval_over_history``). Never from before that history: a flat stretch that began before a
        plateau (a confirmation begun on noise and kept by the hysteresis) must not let the
        learning before it veto the plateau for ever."""
        p = self.params
        test = self._plateau.test
        if test is None or test.long_gain is None:
            return since
        start = test.t - max(p.plateau_history, 2.0) * test.window
        if not p.eval_over_history or test.dropped:
            return max(since, start)
        return start

    def _not_learning(self) -> Verdict | None:
        plateau = self._plateau
        test = plateau.test
        lr_zero = self._lr.zero_since if self._lr_flat else None
        if lr_zero is not None:
            if self._eval_vetoes(lr_zero[0]) is None:
                return self._lr_verdict(lr_zero)
            return None
        if not plateau.flat or test is None:
            self._flagged = False
            return None
        m = self.metric
        since, since_step = plateau.flat_from
        if self._eval_vetoes(self._eval_since(since)) is not None:
            self._flagged = False
            return None  # the evaluation metric still improves beyond its noise: the job learns
        if self._finishing() and not self._flagged:
            return None  # a veto that lapses in the last planned steps raises nothing new there either
        self._flagged = True
        steps = self._m_step - since_step
        message = (
            f"{m} has not improved by {_pct(self.params.min_delta)} over the last {steps:,} steps "
            f"({_dur(self._m_t - since)}): {_signed(test.gain)} per {_dur(test.window)} "
            f"(standard error {_pct(test.se)}), level {_num(test.new)}"
        )
        if self._best is not None:  # the best of the smoothed level, which lags the recent mean: said so, so
            # that a recent mean below it ("level 0.0678 (best 0.0708)") does not read as a contradiction
            message += f" (a recent mean; the best smoothed level was {_num(self._best)} at step {self._best_step:,})"
        if self.eval_metric is None:  # without one, about twice as many healthy runs are flagged (docs/health.md)
            message += "; no evaluation metric reported to confirm it"
        ev = self._evidence(
            m,
            {"seconds": round(test.window, 1), "steps": test.steps},
            self.params.min_delta,
            round(test.gain, 6),
            since,
            message,
            noise=round(test.se, 6),
            noise_z=self.params.noise_z,
            best=self._best,
            best_step=self._best_step,
            level=test.new,
        )
        lr = self._lr.last
        if lr is not None:
            ev["learning_rate"] = lr
        if self.eval_metric is not None:
            ev["eval_metric"] = self.eval_metric
        return Verdict("not_learning", since, ev)

    def _lr_verdict(self, zero: tuple[float, int]) -> Verdict:
        """``not_learning`` because the learning rate is zero (the loss cannot improve)."""
        since, since_step = zero
        lr = self._lr.last or 0.0
        steps = self._m_step - since_step
        message = (
            f"the learning rate is {lr:.3g} ({_pct(lr / self._lr.peak)} of its peak {self._lr.peak:.3g}) "
            f"since step {since_step:,} ({steps:,} steps, {_dur(self._m_t - since)}): {self.metric} cannot improve"
        )
        if self._level is not None:
            message += f"; level {_num(self._level)}"
        threshold = self.params.lr_zero_fraction * self._lr.peak
        ev = self._evidence(
            "learning_rate",
            {"seconds": round(self._m_t - since, 1), "steps": steps},
            threshold,
            lr,
            since,
            message,
            best=self._best,
            best_step=self._best_step,
            level=self._level,
            learning_rate=lr,
        )
        return Verdict("not_learning", since, ev)

    def _calm(self) -> Verdict:
        key = (self._finite, self._level, self._plateau.test, self._finishing(), len(self._eval), self._lr.last)
        if self._calm_cache is not None and self._calm_cache[0] == key:
            return self._calm_cache[1]  # unchanged since the last verdict (a verdict follows each ingest)
        verdict = self._calm_verdict()
        self._calm_cache = (key, verdict)
        return verdict

    def _calm_verdict(self) -> Verdict:
        m = self.metric
        if not self._finite:
            message = f"no value of {m} has arrived yet, so learning cannot be judged"
            return Verdict("unknown", None, self._evidence(m, None, None, None, None, message))
        if self._level is None:
            message = f"{m} is finite; too few windows yet to judge learning"
            return Verdict("healthy", None, self._evidence(m, None, None, None, None, message))
        test = self._plateau.test
        if test is None:
            message = f"{m} level {_num(self._level)}; learning is judged after the warm-up and one plateau window"
            return Verdict("healthy", None, self._evidence(m, None, None, self._level, None, message))
        message = (
            f"{m} level {_num(test.new)}, {_signed(test.gain)} per {_dur(test.window)} (standard error {_pct(test.se)})"
        )
        if self._finishing():
            message += "; the last planned steps are not judged"
        more: dict[str, Any] = {}
        flat_since = self._lr.zero_since if self._lr_flat else (self._plateau.flat_from if self._plateau.flat else None)
        if flat_since is None:
            vetoed = None
        else:
            vetoed = self._eval_vetoes(flat_since[0] if self._lr_flat else self._eval_since(flat_since[0]))
        if vetoed is not None:
            gain, se, n = vetoed
            message += (
                f"; flat, but {self.eval_metric} improves by {_signed(gain)} per {_dur(test.window)} "
                f"(standard error {_pct(se)}, {n} evaluations): the job learns"
            )
            more = {"eval_metric": self.eval_metric, "eval_gain": round(gain, 6), "eval_noise": round(se, 6)}
        ev = self._evidence(
            m,
            {"seconds": round(test.window, 1), "steps": test.steps},
            self.params.min_delta,
            test.new,  # the level, as before; the improvement per window and its error beside it
            None,
            message,
            gain=round(test.gain, 6),
            noise=round(test.se, 6),
            **more,
        )
        return Verdict("healthy", None, ev)

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


def _quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of a few values (the nearest rank: no interpolation between two step times)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _signed(x: float) -> str:
    """A relative change for a sentence: '-0.3%', '+1.2%' (an improvement is positive)."""
    return f"{x * 100:+.2g}%"


def _num(x: float) -> str:
    """A metric value for a sentence: 4 significant digits."""
    return f"{x:.4g}"


def _dur(seconds: float) -> str:
    """A duration for a sentence: '45 s', '12 min', '2.5 h'."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _pct(x: float) -> str:
    """A share for a sentence: '1%', '0.5%'."""
    return f"{x * 100:.3g}%"
