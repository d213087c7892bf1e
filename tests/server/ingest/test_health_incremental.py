"""Health judged incrementally at ingest (issue 31) says what it said before, at the same report.

The per-report shortcuts of the health path (rank 0's report interval as a running median, a calm verdict
settled once while it holds, a rank's p99 step time kept while its tail does not change) must not move a
verdict to a later report nor change its words: a NaN is judged at the report that carries it, a standstill
at the first report or sweep past its limit, and every verdict equals the one a tracker gives when it
settles each verdict afresh.
"""

from __future__ import annotations

import math
import random
from statistics import median
from typing import Any

from stepwatch.protocol import MetricWindow
from stepwatch.server.analysis.health import HealthTracker, Verdict
from stepwatch.server.analysis.health_params import HealthParams
from stepwatch.server.analysis.stall import RankPlaces, StallKnobs
from stepwatch.server.analysis.stall_rules import StallRules
from stepwatch.server.ingest.health_monitor import SWEEP_EVERY_S, HealthMonitor, HealthUpdate
from stepwatch.server.store import IngestResult, Job


def _job(**fields: Any) -> Job:
    return Job(
        id=7, namespace="default", name="j", attempt=1, state="running", created_at=0.0, updated_at=0.0, **fields
    )


def _loss(step: int, value: float, steps: int = 10) -> MetricWindow:
    if math.isfinite(value):
        return MetricWindow("loss", value, value, value, value, steps, 0, step - steps + 1, step)
    return MetricWindow("loss", value, None, None, None, steps, steps, step - steps + 1, step)


class _Trip:
    """A job's reports through a HealthMonitor as the server sends them, with a sweep every 5 s; every
    answer kept with its time and kind (the job takes each recorded health, as the store would)."""

    def __init__(self) -> None:
        self.monitor = HealthMonitor()
        self.job = _job(total_steps=100_000, last_metrics={"loss": 3.0})
        self.monitor.start(self.job, None, "loss")
        self.next_sweep = 1000.0 + SWEEP_EVERY_S
        self.answers: list[tuple[float, str, HealthUpdate | None]] = []

    def _keep(self, t: float, kind: str, update: HealthUpdate | None) -> None:
        if update is not None:
            v = update.verdict
            self.job = self.job.changed(health=v.state, health_since=v.since, health_evidence=v.evidence)
        self.answers.append((t, kind, update))

    def report(self, t: float, step: int, value: float | None = None) -> None:
        while self.next_sweep <= t:
            for update in self.monitor.sweep([self.job], self.next_sweep) or [None]:
                self._keep(self.next_sweep, "sweep", update)
            self.next_sweep += SWEEP_EVERY_S
        points = (_loss(step, value),) if value is not None else ()
        self.job = self.job.changed(step=step, last_report_at=t)
        result = IngestResult(self.job, False, new_points=points)
        self._keep(t, "report", self.monitor.observe(result, 0, step, t, 100_000))

    def first(self, state: str) -> tuple[float, str, Verdict]:
        for t, kind, update in self.answers:
            if update is not None and update.verdict.state == state:
                return t, kind, update.verdict
        raise AssertionError(f"never {state}: {[(t, u.verdict.state) for t, _, u in self.answers if u]}")


def test_a_nan_is_judged_at_the_report_that_carries_it() -> None:
    trip = _Trip()
    t, step = 1000.0, 0
    for k in range(150):
        t, step = t + 2.0, step + 10
        trip.report(t, step, float("nan") if k == 120 else 3.0 * math.exp(-step / 2000))
        if k == 120:
            nan_t = t
    when, kind, verdict = trip.first("diverging")
    assert (when, kind) == (nan_t, "report")
    assert verdict.since == nan_t
    assert "non-finite (NaN) at step 1,210" in verdict.evidence["message"]


def test_a_standstill_is_judged_at_the_first_report_past_its_limit() -> None:
    trip = _Trip()
    t, step = 1000.0, 0
    for _ in range(100):  # 200 s of 10 steps a report, then the step stands while the reports go on
        t, step = t + 2.0, step + 10
        trip.report(t, step, 2.0)
    moved = t
    for _ in range(40):
        t += 2.0
        trip.report(t, step)
    when, kind, verdict = trip.first("stalled")
    limit = verdict.evidence["threshold"]
    assert limit == HealthParams().standstill_floor_s  # 30 s: the floor, above 5 intervals and 2.5 steps
    # judged at the first report or sweep past the limit, not one later
    past = [(at, how) for at, how, _ in trip.answers if at > moved + limit]
    assert (when, kind) == past[0]
    assert verdict.since == moved
    assert verdict.evidence["step"] == step


def test_the_report_interval_is_the_median_of_the_newest_gaps() -> None:
    params = HealthParams()
    rng = random.Random(31)
    for _ in range(20):
        rules = StallRules(params)
        t, kept, previous = 1000.0, [], None
        for _ in range(200):
            t += rng.choice([0.0, 2.0, 2.0, rng.uniform(0.1, 30.0), rng.expovariate(0.5)])
            if previous is not None and t > previous:
                kept = [*kept, t - previous][-params.interval_memory :]
            previous = t
            rules.observe_progress(t, 0, None, None)
            expected = median(kept) if len(kept) >= 3 else params.default_interval_s
            assert rules.report_interval() == expected


class _Afresh(HealthTracker):
    """A tracker that settles every verdict afresh (what the calm verdict's shortcut must equal)."""

    def _settle(self, verdict: Verdict, now: float) -> Verdict:
        self._settled = None
        return super()._settle(verdict, now)


def test_every_verdict_equals_one_settled_afresh() -> None:
    """Healthy, a NaN and its recovery, a standstill and its recovery, a silent rank, sweeps in between."""
    rng = random.Random(29)
    ours, afresh = HealthTracker(), _Afresh()
    t, step, judged = 1000.0, 0, 0
    for k in range(900):
        t += rng.uniform(1.8, 2.2)
        standing = 300 <= k < 340 or 600 <= k < 700
        if not standing:
            step += 10
        value = float("nan") if k in (200, 205) else 3.0 * math.exp(-step / 4000) * rng.uniform(0.95, 1.05)
        for tracker in (ours, afresh):
            tracker.observe_progress(t, 0, step, 100_000)
            if not standing:
                w = _loss(step, value)
                tracker.observe_window(t, step, w.last, w.min, w.max, w.mean, w.count, w.nonfinite, w.first_step)
            if k % 5 == 0 and not 500 <= k < 560:  # rank 1 heartbeats every 10 s, but falls silent a while
                tracker.observe_progress(t, 1, step, 100_000)
        for now in (t, t + 1.0, t + 1.0):  # the report's verdict, then a sweep (twice: nothing new)
            a, b = ours.verdict(now), afresh.verdict(now)
            assert (a.state, a.since, a.evidence) == (b.state, b.since, b.evidence), (k, now)
            judged += 1
    assert judged == 2700


def test_a_ranks_p99_follows_its_new_step_times() -> None:
    """The p99 read at every verdict while a rank stands is kept; a new step time or a restart renews it."""
    rng = random.Random(99)
    places = RankPlaces(StallKnobs(tail_memory=64))
    times: list[float] = []
    for k in range(300):
        if k == 150:
            places.restart(0)
            times = []
        step_time = rng.expovariate(1.0) * (5 if k % 40 == 0 else 1)
        places.moved(float(k), 0, step_time)
        times = [*times, step_time][-64:]
        afresh = RankPlaces(StallKnobs(tail_memory=64))
        for s in times:
            afresh.moved(0.0, 0, s)
        assert places.p99(0) == places.p99(0) == afresh.p99(0)


def test_the_calm_verdict_kept_across_a_moving_learning_rate_equals_one_built_afresh() -> None:
    """The calm verdict is kept while what it reads holds, not while the learning rate holds (a schedule
    moves it at every report): a cosine schedule that ends at zero, evaluations, a loss that learns, goes
    flat and learns again — every verdict the same as a tracker whose calm verdict is built at each call."""
    rng = random.Random(31)
    ours, afresh = HealthTracker(), _Afresh()
    afresh._learning.calm = afresh._learning._calm_verdict  # type: ignore[method-assign]
    t, step, states = 1000.0, 0, set()
    for k in range(1500):
        t += rng.uniform(1.8, 2.2)
        step += 10
        level = 3.0 * math.exp(-min(step, 4000) / 2000) * math.exp(-max(step - 9000, 0) / 3000)
        value = level * rng.uniform(0.97, 1.03)
        lr = max(0.0, 1e-3 * math.cos(math.pi * min(step / 28_000, 0.5)) ** 2) if step < 13_000 else 0.0
        evaluation = level * 1.1 + rng.uniform(-0.01, 0.01)
        for tracker in (ours, afresh):
            tracker.observe_progress(t, 0, step, 16_000)
            w = _loss(step, value)
            tracker.observe_window(t, step, w.last, w.min, w.max, w.mean, w.count, w.nonfinite, w.first_step)
            tracker.observe_lr(t, step, lr)
            if k % 25 == 0:
                tracker.observe_eval(t, step, evaluation)
        a, b = ours.verdict(t), afresh.verdict(t)
        assert (a.state, a.since, a.evidence) == (b.state, b.since, b.evidence), k
        states.add(a.state)
    assert {"healthy", "not_learning"} <= states, states
