"""The knobs of the health analysis (:class:`HealthParams`), each default with the reason for it.

Kept apart from :mod:`.health` (the tracker that uses them) and read by :mod:`.plateau` too; the
server's settings take a JSON object of them (``STEPWATCH_HEALTH``), and
``docs/health.md`` shows the curves each default was chosen on.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_HEALTH_PARAMS", "HealthParams"]


@dataclass(frozen=True, slots=True)
class HealthParams:
    """The knobs of :class:`HealthTracker`; ``docs/health.md`` shows the curves behind each default."""

    stall_intervals: float = 5.0
    """Reports missed before rank 0 counts as silent: 5 intervals stay within the target of
    ``2 x interval + 30 s`` for any interval up to 10 s, and a late report or two is not a stall."""
    stall_floor_s: float = 20.0
    """Silence shorter than this is never a stall: retries with backoff after a network blip last
    a few seconds; 20 s plus a sweep every few seconds still meets the 34 s target of a 2 s job."""
    default_interval_s: float = 2.0
    """The report interval assumed until the job's own gaps are known (the reporter's default)."""
    interval_memory: int = 31
    """Recent gaps between rank 0's reports whose median is the job's usual report interval."""
    standstill_floor_s: float = 30.0
    """A rank's step may stand this long with its reports arriving before the job is stalled, however
    fast it steps: with a report every 2 s and a sweep every 5 s, a hang is flagged 30-37 s after the
    rank's last step, within the target of 45 s (``docs/health.md``). An evaluation the reports
    announce (``progress.phase``) has its own limit (``eval_floor_s``); other pauses longer than this
    (a checkpoint, an unannounced evaluation) are flagged the first time and allowed after
    (``pause_factor``)."""
    standstill_steps: float = 2.5
    """A slow rank's step may stand for this many of its own recent step times (the
    ``standstill_quantile`` of them, measured between the reports that saw the step change, so a
    little longer than the true ones): 2.5 x that p95 plus a report interval and a sweep stays within
    the target of 4 x the p95 step time (3 x missed it for 3 of 20 jobs of 10 s steps). Healthy jobs
    of benchmarks/health_pace.py: 0 of 80 flagged at 0.1 s and 1 s steps, 5 of 40 at 10 s steps (4
    with 3 x, 3 before issue 19): an open question, see docs/health.md."""
    standstill_quantile: float = 0.95
    """Which of a rank's recent step times sets its allowance (0.95: its p95; 0.5, the median, was used
    before the per-rank rule)."""
    pause_factor: float = 1.5
    """A standstill that ended with progress (a pause) allows the next ones to be this much longer."""
    pause_memory: int = 4
    """How many recent pauses set the allowance (a pattern of evaluations, not one old freak)."""
    pause_cap_s: float = 1800.0
    """The learnt pause allowance never exceeds this: a hang that once resolved must not hide the next."""
    eval_floor_s: float = 600.0
    """A rank that says it evaluates (``progress.phase == "eval"``) may stand this long, counted from the
    start of its evaluation, before it is stalled: an evaluation is not a hang, but one that never ends
    is. Generous because a job's first evaluation has no precedent (10 min)."""
    eval_factor: float = 4.0
    """... or this many times the longest evaluation the job has finished, when that is longer."""
    startup_s: float = 600.0
    """Before the first step of a segment moves (loading, compiling, restoring a checkpoint)."""
    min_delta: float = 0.01
    """Relative improvement per plateau window that counts as learning whatever the noise (1 %)."""
    noise_z: float = 2.0
    """An improvement this many standard errors above zero counts as learning even when it is under
    ``min_delta``: a slow tail that improves by more than its noise is still learning.
    ``math.inf`` gives the plain ``min_delta`` rule."""
    noise_dof_per_block: float = 0.3
    """Degrees of freedom of the block noise per block it is measured from: the plateau test's
    thresholds of learning (``noise_z``, ``noise_keep_z``, over the window and over the history) are
    Student-t quantiles at that many degrees of freedom, not normal ones, so that a noise measured from
    few blocks (a first window: about 30) does not make a flat loss read as learning. 0.3: measured on
    normal noise, the median absolute deviation of successive differences that measures it has the
    spread of a standard deviation with 0.29-0.30 x its blocks degrees of freedom (20-400 blocks).
    The drop test (``change_z``, ``change_keep_z``) keeps normal quantiles: with Student's, plateaus
    after learning were found later on the default set (docs/health.md). 0: normal quantiles (before)."""
    plateau_window_s: float = 600.0
    """Longest plateau window: a plateau after clear learning is seen in about 1.2 windows, within
    the 15 min target."""
    plateau_min_s: float = 120.0
    """Shortest plateau window, for short jobs: below it the noise of the means makes false alarms."""
    plateau_fast_min_s: float = 30.0
    """Shortest plateau window of a fast job, one that makes ``fast_floor_steps`` steps in it: the
    floor weighs evidence (steps), not only seconds (a 20 min job at 50 steps/s gets 7 % = 84 s)."""
    fast_floor_steps: int = 1000
    """Steps a job must make in ``plateau_fast_min_s`` (``warmup_fast_s``) for that shorter floor to
    apply: 33 steps/s at 30 s. Slower jobs keep ``plateau_min_s`` and ``warmup_s``."""
    plateau_fraction: float = 0.07
    """Plateau window as a share of the planned duration (when the total steps are known): the
    delay after clear learning is about 1.2 of it, within the target of 10 %."""
    plateau_min_windows: int = 20
    """The plateau test needs at least this many windows in its history (jobs that report rarely),
    and at least 2 blocks in each group."""
    plateau_group: float = 0.35
    """The plateau test compares the first and the last this share of the window (two groups of
    blocks, each summarised by a trimmed mean): near a third gives the smallest error."""
    plateau_blocks: int = 48
    """Blocks per plateau window: a block lasts the window over this, and at least one window; a
    group then has about 17 blocks, enough to trim evaluation and recovering loss spikes."""
    plateau_history: float = 4.0
    """The longer history, in plateau windows (at least 2), over which a slow steady improvement is
    tested: the last window against the window this many windows back. Longer than 3 also helps a
    plateau after learning: the earlier rate is measured more precisely, so its drop shows sooner."""
    change_z: float = 2.5
    """A slow steady tail stops counting as learning when its recent rate falls this many standard
    errors below its earlier rate (a plateau after learning is seen before the history goes flat).
    Compared per unit of log progress (``rate_per_log_progress``): per second, a healthy power law's
    own slowing came within 3 standard errors of a drop, and 3 was needed. 2.5 with the hysteresis
    of ``change_keep_z`` (2 without it: fewer false alarms, later plateaus)."""
    change_keep_z: float = 1.75
    """While a plateau is being confirmed, a drop keeps counting down to this many standard errors:
    the statistic of a real drop hovers around ``change_z`` (each test moves it by a block's noise),
    and without the hysteresis one test at 1.9 restarted the confirmation, which delayed a plateau
    after clear learning by up to a window. At most ``change_z``; equal to it: no hysteresis."""
    plateau_confirm: float = 0.4
    """A verdict changes only when the opposite condition has held for this share of the plateau
    window (longer than a group): one unlucky test is no alarm, one lucky test no recovery."""
    plateau_first_share: float = 0.75
    """The first plateau window of a segment is tested once this share of it is in, when that share
    holds ``first_share_steps`` steps (a fast job flat from its start is seen at 0.75 + 0.4 window, not
    1.4 window); its gain is per window all the same, only its noise is larger."""
    first_share_steps: int = 600
    """Steps a first window's ``plateau_first_share`` must hold for it to be tested before it is whole:
    600 lets a 1 h job at 4 steps/s (756) be seen at 0.75 + 0.4 window, 8.2 % of its plan (median of 100
    flat from the start; 80 within 10 %, 67 with 3,000); a 20 min one (360) keeps its whole 120 s
    window. The default health set's verdicts are the same, line for line, with 600 and 3,000."""
    evidence_confirm: float = 0.3
    """The confirmation (a share of the window, as ``plateau_confirm``) of a test whose window holds
    ``evidence_steps`` steps or more: each test of such a window is a mean of thousands of steps, so an
    unlucky one is rarer and the confirmation guards less (0.3: a 20 min job at 50 steps/s flat from its
    start is flagged at 7.6 % of its plan, median of 100, not 8.3 %; 5 of 960 healthy fast jobs flagged
    against 0, see docs/health.md). Equal to ``plateau_confirm``: off."""
    noise_keep_z: float = 3.0
    """While the plateau of a window of ``evidence_steps`` steps or more is being confirmed, an
    improvement under ``min_delta`` ends the confirmation only at this many standard errors (not
    ``noise_z``): the test runs once per block, and on a flat loss one test in forty reached 2 by
    chance and sent the confirmation back to its start (the worst 20 min job: 12.2 % of its plan with
    2, 9.7 % with 3). ``noise_z``: off."""
    first_keep_z: float = 3.0
    """While a plateau whose confirmation began in the segment's first ``first_windows`` windows is being
    confirmed (a loss flat from its start), only an improvement of this many standard errors ends the
    confirmation (a Student-t quantile, as ``noise_z``), ``min_delta`` or not: at 4 steps/s, one test a
    little over ``min_delta`` (1 %) at 1-2 standard errors sent the confirmation of a 1 h job back to
    its start (20 of 100 such jobs flagged past 10 % of their plan; 0 with this and ``first_confirm``,
    docs/health.md). A healthy job learns clearly in its first windows, so it is seldom confirming a
    plateau there: the default set's healthy jobs are flagged as before. 0: off."""
    first_confirm: float = 0.25
    """The confirmation (a share of the window, as ``plateau_confirm``) of a plateau whose confirmation
    began in the segment's first ``first_windows`` windows, when shorter: a first window is tested from
    ``plateau_first_share`` (0.75) of it, so with 0.4 a loss flat from its start was flagged at 1.15
    windows, 8 % of a plan whose window is 7 % of it, and a wander of its first tests of more than a
    minute made a 1 h job at 4 steps/s late. 0: off."""
    first_windows: float = 1.5
    """The segment's first windows, for ``first_keep_z`` and ``first_confirm``: they cover the first tests
    (from 0.75 window) and a confirmation begun after a first test or two that read learning."""
    evidence_steps: int = 3000
    """Steps of evidence in a window for ``evidence_confirm`` and ``noise_keep_z``: a job at 50 steps/s
    has 4,200 in the 84 s window of a 20 min plan; the benchmark's jobs at 4 steps/s have 840-2,400 per
    window and are judged as before."""
    lr_zero_fraction: float = 0.001
    """A learning rate at most this share of its peak is zero: a job that reports one, past its
    warm-up and held for ``plateau_confirm`` of a window, is not learning whatever its loss does
    (a cosine decay to 0 gets there only in its last 2 % of steps, a linear one in its last 0.1 %:
    inside ``finish_fraction``)."""
    rate_per_lr_area: bool = True
    """When the job reports its learning rate, the drop test compares the loss's rates of improvement
    per unit of learning-rate area (the sum of the rate over the steps), not per second: a schedule
    that decays the rate slows the loss by design, a loss flat while the area grows is a plateau."""
    rate_per_log_progress: bool = True
    """The drop test compares the rates per unit of the *logarithm* of the progress (the learning-rate
    area, or the step without a learning rate): a learning curve is close to a power law of its
    progress, whose rate per step falls as the progress grows, by design; per unit of log progress
    it falls far less, so a healthy curve's slowing is not a drop, and a flat loss still is."""
    eval_min_points: int = 3
    """An evaluation metric vetoes ``not_learning`` when, over at least this many evaluations since
    the loss went flat, it improved by ``noise_z`` standard errors (its noise measured over all its
    points kept): the evaluation is a second, independent measurement of learning."""
    eval_over_history: bool = True
    """When the loss's evidence for a plateau is its history (no significant improvement over
    ``plateau_history`` windows) rather than a drop of its rate, the evaluation is judged over that
    same history, not only since the loss went flat: a slow tail that the loss's noise hides over
    the history may show in a quieter evaluation over it."""
    confirm_levels: int = 4
    """Unused since the plateau test compares windowed means with their standard errors; kept so
    that settings naming it still work."""
    block_windows: int = 5
    """Windows per block of the level (10 s at the default interval)."""
    level_blocks: int = 8
    """Blocks whose median is the level (80 s): a spike shorter than 4 blocks leaves it unchanged."""
    warmup_s: float = 120.0
    """Learning is not judged in the first seconds of a segment (learning-rate warm-up)..."""
    warmup_fraction: float = 0.05
    """...nor in the first share of the planned duration, when the total steps are known (at most
    ``warmup_cap_s``). The first plateau test may reach back into the warm-up: it runs once the
    warm-up is over and a whole plateau window is in, not a window after the warm-up."""
    warmup_fast_s: float = 30.0
    """The warm-up of a fast job (``fast_floor_steps`` steps in it), instead of ``warmup_s``."""
    warmup_cap_s: float = 600.0
    """The share of the planned duration never makes a warm-up longer than this (10 min): a 10 h
    job's 5 % would be 30 min, past the 15 min target for a plateau."""
    anneal_fraction: float = 0.25
    """In the last share of the planned steps a falling rate of improvement is the schedule's
    annealing (cosine or linear decay to zero), not a plateau: there only a history that did not
    improve at all counts as not learning."""
    finish_fraction: float = 0.05
    """Nor in the last share of the planned steps: schedules anneal to a flat end, and stopping
    then would save at most this share."""
    diverge_factor: float = 2.0
    """A level this many times worse than the best level is a blow-up (loss twice its best;
    an accuracy half its best); warm-up bumps and recovering spikes of the curves stay under 1.5x."""
    diverge_orders: float = 3.0
    """A minimised metric (positive best) whose window mean is this many orders of magnitude above its
    running best (the best median of ``diverge_smooth`` windows) for ``diverge_windows`` windows in
    a row, still rising, is diverging at once, without waiting for the level: healthy spikes of the
    benchmark's curves stay under 10x, a blow-up passes 1,000x long before it overflows."""
    diverge_growth: float = 2.0
    """...and so is one whose window mean grew by at least this factor in each of ``diverge_windows``
    + 1 windows in a row while above 10 x its running best (an exponential blow-up, caught before it
    is 1,000x)."""
    diverge_windows: int = 2
    """Windows in a row the fast divergence rules need: one window of a spike is no divergence."""
    diverge_smooth: int = 5
    """Window means whose median makes the running best of the fast divergence rules (a lucky window
    makes no best)."""
    nonfinite_recover_windows: int = 10
    """Consecutive finite windows after a non-finite value before ``diverging`` clears (20 s)."""
    hang_floor_s: float = 35.0
    """A rank whose report core says it stands in its own code, a lock or its data loader (or in a
    collective while another rank does) is hung after this long at least, or 3 x its p99 step time less
    10 s (:mod:`.stall`): flagged within 45 s with a report every 2 s and a sweep every 5 s."""
    busy_floor_s: float = 120.0
    """A rank whose report core says it computes (or has not said where it stands yet) may stand this
    long at least, or 6 x its p99 step time: a single slow step is no stall."""
    patient_floor_s: float = 1800.0
    """A rank whose report core says it saves a checkpoint or evaluates may stand this long (30 min), or
    4 x the longest save or evaluation it finished, before it is stalled."""
    straggler_fraction: float = 1 / 1.5
    """A rank stepping at less than this share of the median rank's rate (or busy this many times less
    than it: see :mod:`.straggler`), that is 1.5x slower, is a straggler once it holds for
    ``straggler_hold_s`` (issue 29; 0.5 at once before)."""
    straggler_hold_s: float = 300.0
    """How long a rank must stay that slow to be named a straggler: persistently, not one slow minute."""
    rate_window_s: float = 60.0
    """Seconds over which each rank's step rate is measured."""
    rank_check_s: float = 5.0
    """Ranks are scanned (hangs, stragglers) at most this often: a scan is O(ranks)."""
    max_ranks: int = 65_536
    """Ranks beyond this many are not tracked (memory bound)."""

    def __post_init__(self) -> None:
        # counts and lengths that the analysis divides by or takes a median of must be positive
        for name in _POSITIVE_KNOBS:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be greater than 0, got {getattr(self, name)!r}")
        if not self.change_keep_z <= self.change_z:
            raise ValueError(f"change_keep_z must be at most change_z ({self.change_z!r}), got {self.change_keep_z!r}")
        if not 0 < self.standstill_quantile <= 1:
            raise ValueError(f"standstill_quantile must be in (0, 1], got {self.standstill_quantile!r}")
        if not self.noise_dof_per_block >= 0:
            raise ValueError(f"noise_dof_per_block must be at least 0, got {self.noise_dof_per_block!r}")
        if not 0 < self.plateau_group <= 0.5:
            raise ValueError(f"plateau_group must be in (0, 0.5], got {self.plateau_group!r}")


_POSITIVE_KNOBS = (
    "default_interval_s",
    "interval_memory",
    "pause_memory",
    "plateau_window_s",
    "plateau_min_s",
    "plateau_fast_min_s",
    "plateau_blocks",
    "block_windows",
    "eval_min_points",
    "level_blocks",
    "rate_window_s",
    "diverge_windows",
    "diverge_smooth",
)


DEFAULT_HEALTH_PARAMS = HealthParams()
