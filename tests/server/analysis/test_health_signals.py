"""The second signals of ``not_learning``: the learning rate and an evaluation metric beside the loss.

Jobs of 12,000 planned steps, 8 steps per 2 s report (a plateau window of 210 s, a delay target of
300 s: 10 % of the 50 min plan), seeded ``random`` noise; the tracker is fed as the server feeds it:
progress, the loss window, then the learning rate and the evaluation of the same report, then a verdict.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from stepwatch.server.analysis.health import HealthParams, HealthTracker, Verdict
from stepwatch.server.analysis.plateau import PlateauTest
from stepwatch.server.analysis.signals import EvalTrend, LearningRate, eval_direction
from stepwatch.server.ingest.health_monitor import HealthMonitor, second_metrics
from stepwatch.server.store import Job, SeriesColumns

STEPS, EVERY, TOTAL = 8, 2.0, 12_000
TARGET = 0.1 * TOTAL / STEPS * EVERY  # 300 s


def power(s: int) -> float:
    """A power-law loss that keeps learning to the end (1.6 % per window at step 6,000)."""
    return 2.0 + 6.0 * (1 + s / 200) ** -0.6


def flat_after(at: int, curve: Callable[[int], float] = power) -> Callable[[int], float]:
    return lambda s: curve(min(s, at))


@dataclass
class Job_:
    """A simulated job: its loss, learning rate and evaluation per step (``None``: not reported)."""

    loss: Callable[[int], float]
    lr: Callable[[int], float] | None = None
    evaluation: Callable[[int], float] | None = None
    eval_every: int = 30  # reports between evaluations (60 s)
    eval_name: str = "eval_loss"
    noise: float = 0.05
    eval_noise: float = 0.003
    seed: int = 0
    verdicts: list[tuple[float, int, Verdict]] = field(default_factory=list)
    stored: dict[str, list[tuple[float, int, float]]] = field(default_factory=dict)


def simulate(job: Job_, tracker: HealthTracker | None = None, reports: int = TOTAL // STEPS) -> HealthTracker:
    tr = tracker or HealthTracker()
    rng = random.Random(job.seed)
    t, step = 1000.0, 0
    for i in range(reports):
        t += EVERY
        first, step = step + 1, step + STEPS
        tr.observe_progress(t, 0, step, TOTAL)
        values = [job.loss(s) * math.exp(rng.gauss(0, job.noise)) for s in range(first, step + 1)]
        mean = sum(values) / len(values)
        tr.observe_window(t, step, values[-1], min(values), max(values), mean, len(values), 0, first)
        job.stored.setdefault("loss", []).append((t, step, mean))
        if job.lr is not None:
            tr.observe_lr(t, step, job.lr(step))
            job.stored.setdefault("learning_rate", []).append((t, step, job.lr(step)))
        if job.evaluation is not None and i % job.eval_every == job.eval_every - 1:
            value = job.evaluation(step) * math.exp(rng.gauss(0, job.eval_noise))
            tr.observe_eval(t, step, value, job.eval_name)
            job.stored.setdefault(job.eval_name, []).append((t, step, value))
        job.verdicts.append((t, step, tr.verdict(t)))
    return tr


def first(job: Job_, state: str = "not_learning", after_step: int = 0) -> tuple[float, int] | None:
    return next(((t, s) for t, s, v in job.verdicts if v.state == state and s > after_step), None)


def time_at(step: int) -> float:
    return 1000.0 + step / STEPS * EVERY


# ------------------------------------------------------------------------------------------------
# Only a loss reported: the verdicts of the loss-only test, unchanged

# the first not_learning (step) of each curve and seed, measured with the tracker before the second
# signals were added (commit 88d540d); None: never flagged. Changed on purpose once since: the drop
# test compares rates per unit of log step with change_z 2 (was: per second, 3; docs/health.md),
# which finds the plateau of 'flat from 6,000', seed 1, at step 6,784 instead of 7,096; and twice since:
# change_z 2.5 with the hysteresis of change_keep_z 1.75 finds seed 0's at step 6,952 instead of
# 9,400 (a confirmation no longer restarted by one test just under the threshold); the rest held.
# Once more (issue 19, item 5): the first plateau block follows the window in force (it held the
# first 12.5 s whatever the window), so every block boundary moved: the plateaus are found within 60
# steps of before but for 'flat from 6,000', seed 1, now at step 9,392 (was 6,784); over the 96 such
# jobs of benchmarks/health_detection.py 56 are found in time against 55 before (docs/health.md).
LOSS_ONLY = [
    ("power law", power, 0, None),
    ("power law", power, 1, None),
    ("flat from 3,000", flat_after(3000), 0, 4064),
    ("flat from 3,000", flat_after(3000), 1, 3968),
    ("flat from 6,000", flat_after(6000), 0, 6992),
    ("flat from 6,000", flat_after(6000), 1, 9392),
]


@pytest.mark.parametrize(("name", "loss", "seed", "flagged_at"), LOSS_ONLY, ids=[f"{r[0]}-{r[2]}" for r in LOSS_ONLY])
def test_only_a_loss_reported_gives_the_verdicts_of_before(
    name: str, loss: Callable[[int], float], seed: int, flagged_at: int | None
) -> None:
    job = Job_(loss, seed=seed)
    simulate(job)
    found = first(job)
    assert (found[1] if found else None) == flagged_at, name


# ------------------------------------------------------------------------------------------------
# The evaluation metric


@pytest.mark.parametrize("seed", range(3))
def test_eval_improving_while_train_loss_flat_is_not_flagged(seed: int) -> None:
    """The training loss is flat within its noise from step 3,000; the evaluation loss improves by 1 % a minute."""
    job = Job_(flat_after(3000), evaluation=lambda s: 3.0 * math.exp(-s / 60_000 * 5), seed=seed)
    tr = simulate(job)
    assert first(job) is None
    v = tr.verdict(job.verdicts[-1][0])
    assert v.state == "healthy"


@pytest.mark.parametrize(
    ("case", "at", "lr"),
    [
        ("both flat, constant lr", 3000, lambda s: 1e-3),
        ("both flat, no lr reported", 3000, None),
    ],
)
@pytest.mark.parametrize("seed", range(2))
def test_both_flat_is_flagged_within_the_target_delay(
    case: str, at: int, lr: Callable[[int], float] | None, seed: int
) -> None:
    job = Job_(flat_after(at), lr=lr, evaluation=flat_after(at), seed=seed)
    simulate(job)
    found = first(job, after_step=at)
    assert found is not None, case
    assert found[0] - time_at(at) <= TARGET, (case, found[0] - time_at(at))
    assert first(job) == found  # and never before the plateau
    verdict = next(v for _, _, v in job.verdicts if v.state == "not_learning")
    assert verdict.evidence["eval_metric"] == "eval_loss" and "no evaluation metric" not in verdict.evidence["message"]


def test_a_flagged_plateau_whose_eval_improves_again_is_healthy_and_says_why() -> None:
    job = Job_(flat_after(3000), evaluation=lambda s: 3.0 if s < 6000 else 3.0 * math.exp(-(s - 6000) / 12_000))
    tr = simulate(job, reports=8000 // STEPS)
    assert first(job) is not None and job.verdicts[int(6000 / STEPS) - 1][2].state == "not_learning"
    v = job.verdicts[-1][2]
    assert v.state == "healthy", v
    assert v.evidence["recovered_from"] == "not_learning" and v.evidence["eval_metric"] == "eval_loss"
    assert v.evidence["eval_gain"] > 2 * v.evidence["eval_noise"] and tr.eval_metric == "eval_loss"


@pytest.mark.parametrize(
    ("name", "direction"),
    [("eval_loss", "min"), ("val_loss", "min"), ("eval_accuracy", "max"), ("val_acc", "max"), ("eval/f1", "max")],
)
def test_eval_direction_follows_the_name(name: str, direction: str) -> None:
    assert eval_direction(name) == direction


def test_eval_trend_needs_points_and_measures_its_noise() -> None:
    trend = EvalTrend("max")
    assert trend.improvement(0.0, 60.0, 3) is None
    rng = random.Random(0)
    for i in range(20):
        trend.observe(float(i * 60), 0.5 + 0.01 * i + rng.gauss(0, 0.001))
    trend.observe(float(19 * 60), 9.0)  # the same time again: kept once
    trend.observe(2000.0, math.nan)  # not finite: dropped
    gain, se, n = trend.improvement(600.0, 60.0, 3) or (0.0, 0.0, 0)
    assert n == 10 and gain > 0 and gain / se > 10


# ------------------------------------------------------------------------------------------------
# The learning rate


def test_a_learning_rate_of_zero_is_not_learning_soon_and_its_return_recovers() -> None:
    job = Job_(
        lambda s: power(s if s < 4000 else 4000 if s < 7000 else s - 3000),  # learns again with its rate
        lr=lambda s: 1e-3 if s < 4000 or s >= 7000 else 0.0,
    )
    simulate(job, reports=10_000 // STEPS)
    found = first(job)
    assert found is not None
    confirm = HealthParams().plateau_confirm * 0.07 * TOTAL / STEPS * EVERY
    assert 0 < found[0] - time_at(4000) <= confirm + 2 * EVERY
    v = next(v for _, s, v in job.verdicts if v.state == "not_learning")
    assert v.evidence["metric"] == "learning_rate" and v.evidence["observed"] == 0.0
    assert "the learning rate is 0" in v.evidence["message"]
    back = next(v for _, s, v in job.verdicts if s >= 7000 and v.state == "healthy")
    assert back.evidence["recovered_from"] == "not_learning"


def test_a_learning_rate_at_zero_before_the_warm_up_ends_is_not_learning_after_it() -> None:
    """A rate that reaches 0 at step 200 (50 s, inside the 150 s warm-up of this 50 min job) is judged from
    the warm-up's end: flagged after the confirmation from there (it used to be skipped for good)."""
    job = Job_(lambda s: power(min(s, 200)), lr=lambda s: 1e-3 if s < 200 else 0.0)
    simulate(job, reports=2_000 // STEPS)
    found = first(job)
    assert found is not None
    window = 0.07 * TOTAL / STEPS * EVERY
    warm_up_end = 1000.0 + EVERY + HealthParams().warmup_fraction * TOTAL / STEPS * EVERY
    assert 0 <= found[0] - (warm_up_end + HealthParams().plateau_confirm * window) <= 2 * EVERY
    v = next(v for _, s, v in job.verdicts if v.state == "not_learning")
    assert v.evidence["metric"] == "learning_rate"


@pytest.mark.parametrize("seed", range(3))
def test_a_learning_rate_that_decays_to_zero_at_the_schedules_end_is_not_flagged(seed: int) -> None:
    """Cosine to 0: under 0.1 % of the peak only in the last 2 % of the steps, where nothing new is
    raised: the learning-rate rule never flags it. (The loss's own test may, where the loss is flat
    within its noise in the schedule's tail before the last 5 %: 2 to 3 of 30 seeds of this curve
    without an evaluation metric, depending on where the blocks fall; seed 0 is one since the first
    block follows the window in force. What is asserted is the learning-rate rule.)"""

    def cosine(s: int) -> float:
        return 1e-3 * 0.5 * (1 + math.cos(math.pi * min(s / TOTAL, 1.0)))

    area = [0.0]
    for s in range(1, TOTAL + 1):
        area.append(area[-1] + cosine(s) / 1e-3)
    job = Job_(lambda s: 2.0 + 6.0 * (1 + area[s] / 200) ** -0.6, lr=cosine, seed=seed)
    simulate(job)
    by_lr = [(step, v.evidence) for _, step, v in job.verdicts if v.evidence.get("metric") == "learning_rate"]
    assert by_lr == []
    found = first(job)
    assert found is None or found[1] < (1 - HealthParams().finish_fraction) * TOTAL  # nothing new at the end


def test_learning_rate_area_and_zero() -> None:
    lr = LearningRate()
    assert math.isnan(lr.area(10))
    lr.observe(1.0, 0, 0.0, 0.001)
    assert lr.zero_since is None  # no peak yet: a warm-up from 0 is not zero
    lr.observe(2.0, 10, 1.0, 0.001)
    lr.observe(3.0, 20, 0.5, 0.001)
    assert lr.area(20) == 0.0 + 10 * 1.0 and lr.area(30) == 10 + 10 * 0.5
    lr.observe(4.0, 30, 0.0, 0.001)
    assert lr.zero_since == (4.0, 30) and lr.peak == 1.0
    lr.observe(5.0, 5, 0.2, 0.001)  # a restart from a checkpoint: learnt afresh
    assert lr.peak == 0.2 and lr.zero_since is None
    # the area counts from step 0: the first rate reported is taken as in force before it
    assert lr.area(5) == 5 * 0.2 and lr.area(15) == 5 * 0.2 + 10 * 0.2


# ------------------------------------------------------------------------------------------------
# The server: which metrics, and the replay after a restart


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["loss", "learning_rate", "eval_loss", "eval_accuracy"], ("learning_rate", "eval_loss")),
        (["train_loss", "lr-AdamW/pg2", "lr-AdamW/pg1", "val_acc"], ("lr-AdamW/pg1", "val_acc")),
        (["loss", "grad_norm"], (None, None)),
    ],
)
def test_second_metrics_are_chosen_by_name(names: list[str], expected: tuple[str | None, str | None]) -> None:
    assert second_metrics(names) == expected


def _columns(points: list[tuple[float, int, float]]) -> SeriesColumns:
    n = len(points)
    return SeriesColumns(
        steps=[s for _, s, _ in points],
        times=[t for t, _, _ in points],
        lasts=[v for _, _, v in points],
        mins=[v for _, _, v in points],
        maxs=[v for _, _, v in points],
        means=[v for _, _, v in points],
        counts=[STEPS] * n,
        nonfinites=[0] * n,
    )


@pytest.mark.parametrize(
    ("case", "job"),
    [
        ("lr at zero", Job_(flat_after(4000), lr=lambda s: 1e-3 if s < 4000 else 0.0)),
        ("eval vetoes a flat loss", Job_(flat_after(3000), evaluation=lambda s: 3.0 * math.exp(-s / 12_000))),
        ("both flat", Job_(flat_after(3000), lr=lambda s: 1e-3, evaluation=flat_after(3000))),
    ],
)
def test_a_restart_replays_the_second_signals_to_the_same_verdict(case: str, job: Job_) -> None:
    live = simulate(job, reports=6000 // STEPS)
    t, step, verdict = job.verdicts[-1]
    monitor = HealthMonitor()
    stored = Job(1, "ns", "j", 1, "running", 0.0, t, last_report_at=t, step=step, total_steps=TOTAL)
    second = {name: _columns(points) for name, points in job.stored.items() if name != "loss"}
    monitor.start(stored, _columns(job.stored["loss"]), "loss", "min", second)
    update = monitor.judge(stored, t)
    again = update.verdict if update is not None else None
    assert again is not None and again.state == verdict.state == live.verdict(t).state, case
    if verdict.state == "not_learning":
        assert again.since == verdict.since and again.evidence["metric"] == verdict.evidence["metric"], case


@pytest.mark.parametrize(
    ("case", "long_gain", "dropped", "over_history", "since"),
    [
        ("history not covered yet", None, False, True, 5000.0),
        ("the evidence is a drop of the rate", 0.02, True, True, 5000.0),
        ("the evidence is a history without significant gain", 0.001, False, True, 6000.0 - 4 * 300.0),
        ("the same, eval_over_history off", 0.001, False, False, 5000.0),
    ],
)
def test_the_evaluation_is_judged_over_the_span_of_the_losss_evidence(
    case: str, long_gain: float | None, dropped: bool, over_history: bool, since: float
) -> None:
    """Flat since t=5,000; the newest test at t=6,000 with a 300 s window and a 4-window history."""
    tr = HealthTracker(HealthParams(eval_over_history=over_history))
    long_se = None if long_gain is None else 0.001
    tr._plateau.test = PlateauTest(
        6000.0, 300.0, 0.0, 0.01, 2.0, 2.0, 1200, long_gain, long_se, False, False, 5000.0, 0, dropped=dropped
    )
    assert tr._learning.eval_since(5000.0) == since, case


def test_a_veto_that_lapses_in_the_last_planned_steps_raises_nothing() -> None:
    """A flat loss kept healthy by its improving evaluation; in the last 5 % of the steps the evaluation
    gets worse: nothing new is raised there (a plateau flagged before would stay flagged)."""
    job = Job_(lambda s: 2.0, evaluation=lambda s: 3.0 * math.exp(-s / 20_000) if s < 11_300 else 3.5)
    simulate(job)
    assert job.verdicts[int(11_000 / STEPS)][2].evidence.get("eval_metric") == "eval_loss"  # vetoed before
    assert first(job, after_step=int(0.95 * TOTAL)) is None and job.verdicts[-1][2].state == "healthy"
