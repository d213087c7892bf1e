"""The stall and straggler rules of a job, from its ranks' progress: what is known of each rank, rank 0's
report gaps, step times and pauses, and the verdicts they give.

:class:`StallRules` is owned by a :class:`~.health.HealthTracker` (one per job, kept across segments)
and fed every report of every rank. ``stalled``: no report from rank 0 for ``max(stall_intervals x the
usual report interval, stall_floor_s)``; or a rank's step stands still for longer than that,
``standstill_floor_s``, ``standstill_steps`` step times and the longest recent pause (evaluation,
checkpoint) with margin, or, for a rank whose reports say it evaluates, ``max(eval_floor_s,
eval_factor x the longest evaluation finished)`` from the evaluation's start; or one rank hangs: its
heartbeats stop, or its step stands while the other ranks move on. A job whose report core says
where its ranks stand is judged by the place instead (:mod:`.stall`); stragglers are found by
:mod:`.straggler`. Rank 0's pace (:meth:`StallRules.rate`) also sizes the plateau window.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterable
from statistics import median

from .health_params import HealthParams
from .stall import RankPlaces, StallKnobs, Standing, judge
from .straggler import RankPace, Stragglers
from .verdict import Verdict, dur, evidence

__all__ = ["StallRules"]

_GPU_IDLE = 5.0
"""A rank whose GPUs run kernels less than this share of the time (percent) is idle."""


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


class StallRules:
    """The ranks' progress and the stall and straggler verdicts of one job; O(1) per report, O(ranks)
    per scan (at most every ``rank_check_s``)."""

    def __init__(self, params: HealthParams) -> None:
        self.params = params
        p = params
        # rank 0 progress
        self._r0_t: float | None = None
        self._r0_step: int | None = None
        self._r0_change_t = 0.0
        self._r0_moved = False  # the step moved in this segment
        self._seg_t0: float | None = None
        self._seg_step0 = 0
        self._gaps: deque[float] = deque(maxlen=p.interval_memory)
        self._gaps_sorted: list[float] = []  # the same gaps in order: their median without a sort per report
        self._interval = p.default_interval_s  # report_interval(), updated with each gap
        self._spt: deque[float] = deque(maxlen=31)
        self._pauses: deque[float] = deque(maxlen=p.pause_memory)
        self._longest_eval = 0.0  # the longest evaluation any rank finished (seconds)
        # ranks
        self._ranks: dict[int, _Rank] = {}
        knobs = StallKnobs(patient_floor_s=p.patient_floor_s, hang_floor_s=p.hang_floor_s, busy_floor_s=p.busy_floor_s)
        self.places = RankPlaces(knobs, max_ranks=p.max_ranks)
        """Where each rank stands, for a job whose report core samples its stack (:mod:`.stall`)."""
        self._stragglers = Stragglers(p.straggler_fraction, p.straggler_hold_s)
        self._scan_t = -math.inf
        self._scan: Verdict | None = None

    # ------------------------------------------------------------------------------------------
    # Observations (``t`` is the tracker's monotonic arrival time)

    def observe_progress(self, t: float, rank: int, step: int | None, evaluating: float | None) -> None:
        """One report of any rank (rank 0's, and the heartbeats of the others); ``evaluating``: the
        seconds the rank says it has been evaluating, ``None`` while it trains."""
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

    def observe_gpu(self, rank: int, utilization: float) -> None:
        """The mean utilisation (percent) of a rank's GPUs in its newest report (the idle one of ranks
        that all stand is the one that hung)."""
        r = self._ranks.get(rank)
        if r is not None and math.isfinite(utilization):
            r.busy = utilization

    def _progress0(self, t: float, step: int | None, resumed: float) -> None:
        """Rank 0's report: its report gaps, step times and pauses (``resumed``: the end of its last
        evaluation, which neither counts as step time nor as a pause)."""
        if self._r0_t is not None and t > self._r0_t:
            self._add_gap(t - self._r0_t)
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
            if standing > self.params.stall_floor_s and standing > self.silence_limit():  # the limit's floor first
                self._pauses.append(standing)
        else:
            self._seg_t0, self._seg_step0 = self._r0_change_t, old  # start-up time is not stepping time
        self._r0_step, self._r0_change_t, self._r0_moved = step, t, True

    def _add_gap(self, gap: float) -> None:
        """A gap between two reports of rank 0: the newest ``interval_memory`` are kept, in arrival order
        and sorted, and their median (:meth:`report_interval`, read several times a report) updated."""
        gaps, ordered = self._gaps, self._gaps_sorted
        if len(gaps) == gaps.maxlen:
            del ordered[bisect_left(ordered, gaps[0])]
        gaps.append(gap)
        insort(ordered, gap)
        n = len(ordered)
        if n >= 3:  # as statistics.median: the middle one, or the mean of the middle two
            half = n // 2
            self._interval = ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2

    # ------------------------------------------------------------------------------------------
    # Thresholds

    def report_interval(self) -> float:
        """The job's usual report interval: the median of rank 0's recent gaps (a default before)."""
        return self._interval

    def step_time(self) -> float | None:
        """Typical seconds per step of rank 0 in this segment (pauses are outliers the median drops)."""
        return median(self._spt) if self._spt else None

    def silence_limit(self) -> float:
        """How long rank 0 (or a rank's heartbeats) may be silent: ``stall_intervals`` usual intervals,
        at least ``stall_floor_s``."""
        p = self.params
        return max(p.stall_intervals * self.report_interval(), p.stall_floor_s)

    def _standstill_limit(self, r: _Rank) -> tuple[float, float | None]:
        """How long a rank's step may stand while its reports arrive, and its recent step time used
        (the ``standstill_quantile`` of its own recent step times)."""
        p = self.params
        spt = _quantile(r.spt, p.standstill_quantile) if r.spt else None
        limit = max(self.silence_limit(), p.standstill_floor_s, p.standstill_steps * spt if spt else 0.0)
        if self._pauses:
            limit = max(limit, min(p.pause_factor * max(self._pauses), p.pause_cap_s))
        if not r.moved:
            limit = max(limit, p.startup_s)
        return limit, spt

    def eval_limit(self) -> float:
        """How long an evaluation may last before its rank is stalled: ``eval_floor_s``, or
        ``eval_factor`` x the longest evaluation the job finished."""
        p = self.params
        return max(p.eval_floor_s, p.eval_factor * self._longest_eval)

    def rate(self) -> float | None:
        """Rank 0's steps per second in this segment (from its first step on), once known."""
        if self._seg_t0 is None or self._r0_step is None or self._r0_t is None:
            return None
        steps = self._r0_step - self._seg_step0
        if steps <= 0 or self._r0_t <= self._seg_t0:
            return None
        return steps / (self._r0_t - self._seg_t0)

    # ------------------------------------------------------------------------------------------
    # Verdicts

    def stalled(self, now: float) -> Verdict | None:
        """Rank 0 silent past its limit, or (a job of one rank) its step standing past its limit."""
        if self._r0_t is None:
            return None
        silent = now - self._r0_t
        if silent > self.params.stall_floor_s:
            limit = self.silence_limit()
            if silent > limit:
                message = f"no report from rank 0 for {dur(silent)} (usually every {dur(self.report_interval())})"
                ev = evidence("reports", {"seconds": limit}, limit, silent, self._r0_t, message, rank=0)
                return Verdict("stalled", self._r0_t, ev)
        if len(self._ranks) > 1:
            return None  # the ranks' standstills are scanned with the ranks (rank_scan)
        return self._standstill(now)

    def _standstill(self, now: float) -> Verdict | None:
        """A rank whose step stands past its limit while its reports arrive, named.

        When several stand (a rank hung in its data loader blocks the others in the next collective),
        the one named is the one behind: the lowest step, then the one whose GPUs idle while the
        others' are busy, then the one that stood first."""
        p = self.params
        floor = now - p.standstill_floor_s
        if not any(r.clock_t < floor and r.last_t > r.clock_t for r in self._ranks.values()):
            return None  # the common case, without a limit computed: every rank stepped within the floor
        silence = self.silence_limit()
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
                standing, limit = now - r.eval_t, max(limit, self.eval_limit())
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
        message = f"{who} {how} from {step:,} for {dur(standing)} while reports arrive"
        if r.eval_t is not None:
            longest = (
                f", {p.eval_factor:g}x the longest one finished ({dur(self._longest_eval)})"
                if self._longest_eval
                else ""
            )
            message += (
                f"; it has been evaluating for {dur(now - r.eval_t)} "
                f"(allowed {dur(limit)}: at least {dur(p.eval_floor_s)}{longest})"
            )
        elif spt is not None:
            message += f" (its recent p{p.standstill_quantile * 100:.0f} step time {spt:.3g} s, allowed {dur(limit)})"
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
        ev = evidence("step", {"seconds": bound}, bound, round(standing, 1), change_t, message)
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
            eval_limit=self.eval_limit(),
            ranks=len(self._ranks),
        )
        if found is None:
            return None
        since, evidence = found
        return Verdict("stalled", since, evidence)

    def rank_scan(self, now: float, remaining: Callable[[], float | None]) -> Verdict | None:
        """Hanging ranks and stragglers, from a scan of every rank at most every ``rank_check_s``;
        ``remaining`` gives the seconds rank 0 still needs (a straggler's cost)."""
        if len(self._ranks) < 2:
            return None
        p = self.params
        if now - self._scan_t < p.rank_check_s:
            return self._scan
        self._scan_t = now
        silence = self.silence_limit()
        rates: list[tuple[float, int, _Rank]] = []
        for rank, r in self._ranks.items():
            if now - r.last_t > silence:
                message = f"rank {rank} has sent no heartbeat for {dur(now - r.last_t)}"
                ev = evidence("heartbeats", {"seconds": silence}, silence, now - r.last_t, r.last_t, message)
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
        found = self._stragglers.scan(paces, self.places, now, remaining())
        if found is None:
            return None
        since, ev = found
        self._scan = Verdict("straggling", since, ev)
        return self._scan

    def remaining(self, total: int | None) -> float | None:
        """Seconds rank 0 still needs at its pace in this segment to ``total`` steps (``None``: no total
        or no pace yet)."""
        rate = self.rate()
        if total is None or not rate or self._r0_step is None:
            return None
        return max(total - self._r0_step, 0) / rate


def _quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of a few values (the nearest rank: no interpolation between two step times)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
