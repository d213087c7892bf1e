"""ETA estimation: accuracy on recorded curves against the lifetime average, and a table of edge cases.

The curves are generated here, deterministically (seeded NumPy): a job steps at a true rate with
per-step noise and a slow drift, reports ``(time, step)`` about every 2 s, and may pause for
evaluation, warm up slowly, resume from a checkpoint, lose reports for minutes or restart from an
earlier checkpoint. The true remaining time of every point is known from the curve. Run with ``-s``
to see the error table (docs/eta.md quotes it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from statistics import mean
from typing import Any

import numpy as np
import pytest

from stepwatch.server.analysis import DEFAULT_PARAMS, Estimate, EtaParams, estimate_eta, lifetime_average_eta

# ------------------------------------------------------------------------------------------------
# Recorded curves


@dataclass(frozen=True)
class Job:
    """How a simulated job runs. Times in seconds from ``t0``, the start of its process."""

    total: int = 10_000
    first_step: int = 0  # a resumed job's first step
    rate: float = 4.0  # steps per second while stepping, before noise
    eval_every: int = 0  # an evaluation pause after every this many steps (0: none)
    eval_seconds: float = 60.0
    warmup_seconds: float = 0.0  # the first seconds of the process run at warmup_speed
    warmup_speed: float = 1.0
    startup: float = 20.0  # process start to the first step (imports, compilation, loading)
    report_every: float = 2.0  # +-20% jitter
    gaps: tuple[tuple[float, float], ...] = ()  # (from, to) seconds after t0 without reports
    noise: float = 0.15  # log-normal per-step noise
    drift: float = 0.05  # slow log-normal drift of the rate, correlated over ~1,000 steps
    report_core: bool = False  # reports as the report core does: the first at t0, step 0 until the first step


def simulate(job: Job, seed: int, t0: float = 0.0) -> tuple[list[tuple[float, int]], float]:
    """The ``(time, step)`` reports of one run of ``job`` and the time it really finished.

    An evaluation at the last step still runs before the job finishes (as in transformers).
    """
    rng = np.random.default_rng(seed)
    n = job.total - job.first_step
    z = rng.standard_normal((3, n))
    rho = math.exp(-1 / 1000)
    t = t0 + job.startup
    done_at = np.empty(n)
    drift = 0.0
    for i in range(n):
        drift = rho * drift + math.sqrt(1 - rho * rho) * job.drift * z[0, i]
        dt = math.exp(drift + job.noise * z[1, i] - job.noise**2 / 2) / job.rate
        if t - t0 < job.warmup_seconds:
            dt /= job.warmup_speed
        t += dt
        done_at[i] = t
        if job.eval_every and (job.first_step + i + 1) % job.eval_every == 0:
            t += job.eval_seconds * (1 + 0.05 * z[2, i])
    samples = []
    r = t0 if job.report_core else t0 + rng.uniform(0, job.report_every)
    while r < t:
        if not any(a <= r - t0 < b for a, b in job.gaps):
            done = int(np.searchsorted(done_at, r, side="right"))
            # the report core knows the resumed step only once the loop counts it: step 0 until then
            samples.append((float(r), job.first_step + done if done or not job.report_core else 0))
        r += job.report_every * rng.uniform(0.8, 1.2)
    return samples, t


@dataclass(frozen=True)
class Curve:
    """A recorded history; points from ``evaluate_from`` on are scored."""

    samples: list[tuple[float, int]]
    total: int
    start_time: float  # when the process that reports now started: the lifetime average's origin
    end_time: float  # when the job really finished
    first_step: int  # the step the scored run started from
    evaluate_from: int = 0


def plain(job: Job) -> Callable[[int], Curve]:
    def make(seed: int) -> Curve:
        samples, end = simulate(job, seed)
        return Curve(samples, job.total, 0.0, end, job.first_step)

    return make


def restarted(seed: int) -> Curve:
    """A job crashes at step 5,000 and restarts a minute later from its checkpoint at step 4,000."""
    job = Job(eval_every=500)
    before, _ = simulate(job, seed)
    crash = next(t for t, s in before if s >= 5000) + 30
    before = [(t, s) for t, s in before if t < crash]
    t0 = crash + 60
    after, end = simulate(Job(eval_every=500, first_step=4000), seed + 1000, t0=t0)
    return Curve(before + after, job.total, t0, end, 4000, evaluate_from=len(before))


SCENARIOS: dict[str, Callable[[int], Curve]] = {
    "a eval pauses (60 s every 500 steps)": plain(Job(eval_every=500)),
    "b warm-up (first 5 min at 30%)": plain(Job(warmup_seconds=300, warmup_speed=0.3)),
    "c resumed at 60%": plain(Job(first_step=6000)),
    "d combination": plain(
        # resumed at 40% of 20,000 steps, 3 min warm-up at 30%, eval pauses, 5 min without reports
        Job(total=20_000, first_step=8000, eval_every=500, warmup_seconds=180, warmup_speed=0.3, gaps=((1200, 1500),))
    ),
    "e gaps (two 5 min without reports)": plain(Job(eval_every=500, gaps=((600, 900), (1500, 1800)))),
    "f restart from an earlier checkpoint": restarted,
    # as the report core reports: its first report at the process start says step 0, the next one the
    # resumed step (the jump from 0 to 6,000 is not progress)
    "g resumed at 60%, first report at step 0": plain(Job(first_step=6000, report_core=True)),
    "h resumed at 40%, step 0 first, warm-up, evals": plain(
        Job(total=20_000, first_step=8000, eval_every=500, warmup_seconds=180, warmup_speed=0.3, report_core=True)
    ),
}
SEEDS = range(5)
FRACTIONS = [f / 100 for f in range(10, 100, 5)]  # every 5% of the run's progress after the first 10%


@dataclass
class Score:
    """Absolute percentage errors of stepwatch and of the lifetime average at every scored point."""

    ours: list[float] = field(default_factory=list)
    lifetime: list[float] = field(default_factory=list)


def score(curve: Curve) -> Score:
    result = Score()
    for fraction in FRACTIONS:
        target = curve.first_step + fraction * (curve.total - curve.first_step)
        j = next(i for i, (_, s) in enumerate(curve.samples) if s >= target and i >= curve.evaluate_from)
        history = curve.samples[: j + 1]
        now = history[-1][0]
        truth = curve.end_time - now
        estimate = estimate_eta(history, curve.total, now=now)
        baseline = lifetime_average_eta(history, curve.total, curve.start_time)
        assert estimate.method == "recent_rate", estimate
        assert estimate.eta_seconds is not None and baseline is not None
        assert estimate.eta_low is not None and estimate.eta_high is not None
        assert estimate.eta_low <= estimate.eta_seconds <= estimate.eta_high
        result.ours.append(abs(estimate.eta_seconds - truth) / truth * 100)
        result.lifetime.append(abs(baseline - truth) / truth * 100)
    return result


@pytest.fixture(scope="module")
def table() -> dict[str, Score]:
    scores: dict[str, Score] = {}
    for name, make in SCENARIOS.items():
        total = Score()
        for seed in SEEDS:
            one = score(make(seed))
            total.ours += one.ours
            total.lifetime += one.lifetime
        scores[name] = total
    lines = [
        "",
        f"ETA mean absolute % error, {len(SEEDS)} seeds x {len(FRACTIONS)} points (10%..95% of each run)",
        f"{'scenario':48} {'stepwatch':>10} {'worst':>7} {'lifetime avg':>13} {'worst':>7} {'error cut':>10}",
    ]
    for name, s in scores.items():
        ours, life = mean(s.ours), mean(s.lifetime)
        lines.append(
            f"{name:48} {ours:9.1f}% {max(s.ours):6.1f}% {life:12.1f}% {max(s.lifetime):6.1f}%"
            f" {(1 - ours / life) * 100:9.0f}%"
        )
    print("\n".join(lines))
    return scores


def test_error_table(table: dict[str, Score], record_property: Callable[[str, object], None]) -> None:
    for name, s in table.items():
        record_property(name, f"stepwatch {mean(s.ours):.2f}% lifetime {mean(s.lifetime):.2f}%")
        assert mean(s.ours) < 8.0, name
        assert max(s.ours) < 25.0, name


@pytest.mark.parametrize(
    "name",
    [
        "b warm-up (first 5 min at 30%)",
        "c resumed at 60%",
        "d combination",
        "f restart from an earlier checkpoint",
        "g resumed at 60%, first report at step 0",
        "h resumed at 40%, step 0 first, warm-up, evals",
    ],
)
def test_beats_the_lifetime_average_by_a_clear_margin(table: dict[str, Score], name: str) -> None:
    assert mean(table[name].ours) < 0.5 * mean(table[name].lifetime)


def _resume_benchmark() -> Any:
    """``benchmarks/eta_resume.py``: its recorded resumes and their scoring (the figures of docs/eta.md)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "eta_resume.py"
    spec = importlib.util.spec_from_file_location("eta_resume_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["eta_resume_bench"] = module
    spec.loader.exec_module(module)
    return module


def test_the_first_minutes_after_a_resume() -> None:
    """Issue 19: a resumed job's ETA is right from its first minutes (<= 20 % mean absolute error over
    the first 3 minutes), although its first report says step 0 and the next one the resumed step."""
    bench = _resume_benchmark()
    table = bench.run(range(6), baseline=None)
    for name in ("resumed at 60%", "slow checkpoint load (2 min)", "restart in the same attempt"):
        ours, lifetime = table[name]["stepwatch"], table[name]["lifetime avg"]
        assert ours.mae <= 20.0 and ours.mae < 0.25 * lifetime.mae, (name, ours.mae, lifetime.mae)
        assert ours.shown >= 95.0, (name, ours.shown)  # no ETA only before two intervals of real progress
    for row in table.values():
        assert row["stepwatch"].mae < row["lifetime avg"].mae
    # the jump itself is never a rate: at the report that shows it, there is no ETA rather than a wrong one
    curve = bench.simulate(bench.SCENARIOS[0], seed=1)
    i = next(i for i, (t, _) in enumerate(curve.samples) if t == curve.resumed)
    assert estimate_eta(curve.samples[: i + 1], curve.total).eta_seconds is None


def test_eval_pauses_are_learnt() -> None:
    samples, _ = simulate(Job(eval_every=500), seed=1)
    history = [p for p in samples if p[1] <= 5200]
    estimate = estimate_eta(history, 10_000)
    assert estimate.pause_every == pytest.approx(500, rel=0.02)
    assert estimate.pause_seconds == pytest.approx(60, rel=0.1)
    assert estimate.moving_rate == pytest.approx(4.0, rel=0.1)
    assert estimate.rate is not None and estimate.moving_rate is not None
    assert estimate.rate < estimate.moving_rate  # pauses take their share


def test_an_eval_pause_in_progress_counts_down_then_the_job_is_overdue() -> None:
    samples, end = simulate(Job(eval_every=500), seed=2)
    i = next(i for i, (_, s) in enumerate(samples) if s >= 3000)
    history = samples[: i + 1]
    first = estimate_eta(history, 10_000)
    assert first.eta_seconds is not None and first.pause_seconds is not None
    assert first.eta_seconds == pytest.approx(end - history[-1][0], rel=0.1)
    # during the expected pause the finish time holds still
    for c in (10.0, 30.0, first.pause_seconds):
        later = estimate_eta(history, 10_000, now=history[-1][0] + c)
        assert later.finish_time == pytest.approx(first.finish_time, abs=1.0)
        assert later.overdue_seconds == 0
    # well past it, the job is overdue and the ETA grows
    late = estimate_eta(history, 10_000, now=history[-1][0] + first.pause_seconds + 120)
    assert late.overdue_seconds > 0
    assert late.eta_seconds is not None and late.eta_seconds > first.eta_seconds


# ------------------------------------------------------------------------------------------------
# Edge cases

STEADY = [(2.0 * i, 8 * i) for i in range(301)]  # 4 steps/s for 600 s, up to step 2,400
"""A clean job: 4 steps per second, a report every 2 s."""


def steady(until: float, rate: float = 4.0, t0: float = 0.0, step0: int = 0) -> list[tuple[float, int]]:
    return [(t0 + 2.0 * i, step0 + round(rate * 2.0 * i)) for i in range(int(until / 2) + 1)]


@dataclass(frozen=True)
class Case:
    samples: list[tuple[float, int]]
    total: int | None
    method: str
    eta: float | None = None  # expected eta_seconds (approx), or None to skip
    kwargs: dict[str, Any] = field(default_factory=dict)
    check: Callable[[Estimate], bool] | None = None


CASES = {
    "no samples": Case([], 1000, "insufficient", check=lambda e: e.rate is None and e.eta_seconds is None),
    "no samples, a reported ETA": Case([], 1000, "reported", 300.0, {"reported_eta": 300.0}),
    "one sample": Case([(5.0, 100)], 1000, "insufficient", check=lambda e: e.step == 100 and e.rate is None),
    # the first progress is start-up (it may be the jump to a resumed step): the rate needs one more
    "two samples": Case([(0.0, 0), (2.0, 8)], 1000, "insufficient", check=lambda e: e.rate is None and e.step == 8),
    "three samples": Case([(0.0, 0), (2.0, 8), (4.0, 16)], 1000, "recent_rate", 246.0),
    "a resume's first reports: step 0, then the resumed step": Case(
        [(0.0, 0), (2.0, 6000)], 10_000, "insufficient", check=lambda e: e.rate is None and e.eta_seconds is None
    ),
    "a resume: the jump is not progress": Case(
        [(0.0, 0), (2.0, 6000), (4.0, 6008), (6.0, 6016)], 10_000, "recent_rate", 3984 / 4
    ),
    "no total": Case(STEADY, None, "no_total", check=lambda e: e.rate == pytest.approx(4.0) and e.eta_seconds is None),
    "step at total": Case([*steady(100), (102.0, 500)], 500, "done", 0.0, check=lambda e: e.finish_time == 102.0),
    "step beyond total": Case(STEADY, 2000, "done", 0.0, check=lambda e: e.finish_time == 500.0),
    "all samples at the same time": Case([(7.0, s) for s in range(0, 50, 5)], 1000, "insufficient"),
    "time does not pass but steps do, then it does": Case(
        [(0.0, 0), (0.0, 10), (2.0, 18), (2.0, 20), (4.0, 30)], 100, "recent_rate", 14.0
    ),
    "unsorted samples": Case(list(reversed(STEADY)), 4800, "recent_rate", 600.0),
    "non-finite times are ignored": Case(
        [*STEADY[:150], (math.nan, 10**6), (math.inf, 10**6), *STEADY[150:]], 4800, "recent_rate", 600.0
    ),
    "non-finite steps are ignored": Case([*STEADY, (602.0, math.nan), (604.0, math.inf)], 4800, "recent_rate", 600.0),  # type: ignore[list-item]
    "a NaN clock is no clock": Case(STEADY, 4800, "recent_rate", 600.0, {"now": math.nan}),
    "no progress since the start, for long": Case(
        [(0.0, 0), (2.0, 0)], 4800, "stalled", kwargs={"now": 2.0 + 30 + 601}, check=lambda e: e.eta_seconds is None
    ),
    "start-up before the first step is ignored": Case(
        [(float(t), 0) for t in range(0, 120, 2)] + steady(300, t0=120.0), 2400, "recent_rate", 300.0
    ),
    "backwards step: the estimate starts afresh": Case(
        steady(600) + steady(300, rate=2.0, t0=700.0, step0=1000),
        2800,
        "recent_rate",
        600.0,  # 1,200 steps left at the new rate, 2/s
        check=lambda e: e.since == 700.0 and e.moving_rate == pytest.approx(2.0) and e.step == 1600,
    ),
    "backwards step, one sample since": Case(
        [*steady(600), (700.0, 1000)], 2800, "insufficient", check=lambda e: e.since == 700.0 and e.rate is None
    ),
    "long gap with progress": Case(
        steady(600) + steady(600, t0=900.0, step0=3600),
        9600,
        "recent_rate",
        900.0,
        check=lambda e: e.pause_every is None,
    ),
    "long gap at the end: overdue": Case(
        STEADY,
        4800,
        "recent_rate",
        # the window is 598 s of stepping: the first 2 s (step 0 to 8) are the start's, not a rate
        check=lambda e: (
            e.overdue_seconds == pytest.approx(270.0) and e.eta_seconds == pytest.approx(600 * (1 + 270 / 598))
        ),
        kwargs={"now": 900.0},
    ),
    "stall past the threshold": Case(STEADY, 4800, "stalled", kwargs={"now": 600.0 + 30 + 601}),
    "stall just before the threshold": Case(STEADY, 4800, "recent_rate", kwargs={"now": 600.0 + 30 + 599}),
    "reported ETA is preferred": Case(STEADY, 4800, "reported", 200.0, {"reported_eta": 200.0}),
    "reported ETA, aged": Case(STEADY, 4800, "reported", 180.0, {"reported_eta": 200.0, "reported_at": 580.0}),
    "reported ETA, no total": Case(STEADY, None, "reported", 200.0, {"reported_eta": 200.0}),
    "reported ETA, the job is done": Case(STEADY, 2400, "done", 0.0, {"reported_eta": 200.0}),
    "reported ETA, the job is stalled": Case(STEADY, 4800, "stalled", None, {"reported_eta": 200.0, "now": 1300.0}),
    "reported ETA, overdue: it grows": Case(
        STEADY, 4800, "reported", (200.0 - 130 + 100) * (1 + 100 / 598), {"reported_eta": 200.0, "now": 730.0}
    ),
    "negative reported ETA is ignored": Case(STEADY, 4800, "recent_rate", 600.0, {"reported_eta": -5.0}),
    "NaN reported ETA is ignored": Case(STEADY, 4800, "recent_rate", 600.0, {"reported_eta": math.nan}),
    "now before the newest sample": Case(STEADY, 4800, "recent_rate", 600.0, {"now": 10.0}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_edge_cases(name: str) -> None:
    case = CASES[name]
    kwargs = dict(case.kwargs)
    estimate = estimate_eta(case.samples, case.total, **kwargs)
    assert estimate.method == case.method, estimate
    if case.eta is not None:
        assert estimate.eta_seconds == pytest.approx(case.eta, rel=1e-6), estimate
    if estimate.eta_seconds is not None and estimate.method != "done":
        times = [t for t, s in case.samples if math.isfinite(t) and math.isfinite(s)]
        clock = kwargs.get("now")
        clocks = [clock] if clock is not None and math.isfinite(clock) else []
        now = max(times + clocks) if times or clocks else None
        assert estimate.finish_time == (None if now is None else pytest.approx(now + estimate.eta_seconds))
    if case.check is not None:
        assert case.check(estimate), estimate


def test_a_stall_makes_the_eta_grow_then_unknown() -> None:
    """Stall rule: after a grace (a step, 3 report intervals, 30 s, and an expected pause), the overdue
    time counts as stepping time that made no steps, so the ETA grows; overdue for longer than
    ``stall_after`` (10 min, or 10 step times if longer), the job is stalled and the ETA is unknown."""
    last = STEADY[-1][0]
    etas = []
    for c in range(0, 1300, 20):
        for samples in (STEADY, STEADY + [(last + k, STEADY[-1][1]) for k in range(2, c + 1, 2)]):
            e = estimate_eta(samples, 4800, now=last + c)
            overdue = max(c - DEFAULT_PARAMS.grace, 0)
            assert e.overdue_seconds == pytest.approx(overdue)
            if overdue > DEFAULT_PARAMS.stall_after:
                assert e.method == "stalled" and e.eta_seconds is None and e.rate == 0.0
            else:
                assert e.method == "recent_rate" and e.eta_seconds is not None
        if e.eta_seconds is not None:
            etas.append((c, e.eta_seconds))
    grown = [eta for c, eta in etas if c > DEFAULT_PARAMS.grace]
    assert all(a < b for a, b in pairwise(grown))
    assert grown[0] > 600.0  # never below the pre-stall estimate
    assert etas[-1][1] > 1.9 * 600.0


def test_slow_steps_are_not_a_stall() -> None:
    """A step every 90 s with reports every 2 s: standing still between steps is normal."""
    samples = [(2.0 * i, i // 45) for i in range(45 * 40)]
    estimate = estimate_eta(samples, 100, now=samples[-1][0] + 60)
    assert estimate.method == "recent_rate"
    assert estimate.overdue_seconds == 0
    assert estimate.pause_every is None
    assert estimate.eta_seconds == pytest.approx(61 * 90, rel=0.05)


def test_params_change_the_stall_threshold() -> None:
    params = EtaParams(stall_after=60.0, grace=10.0)
    assert estimate_eta(STEADY, 4800, now=600.0 + 75, params=params).method == "stalled"
    assert estimate_eta(STEADY, 4800, now=600.0 + 65, params=params).method == "recent_rate"


def test_regime_change_leaves_the_window() -> None:
    """A job that slows to half speed: the estimate follows within a few chunks."""
    samples = steady(1200) + steady(300, rate=2.0, t0=1202.0, step0=4808)[1:]
    estimate = estimate_eta(samples, 10_000)
    assert estimate.moving_rate == pytest.approx(2.0)
    assert estimate.window_seconds <= 300.0


# ------------------------------------------------------------------------------------------------
# The baseline


@pytest.mark.parametrize(
    ("samples", "total", "start", "now", "expected"),
    [
        ([(100.0, 50)], 100, 0.0, None, 100.0),  # 2 s per step, 50 left
        ([(100.0, 50)], 100, 0.0, 200.0, 200.0),  # the clock moves on
        ([(0.0, 0), (100.0, 50)], 100, 0.0, None, 100.0),
        ([(110.0, 50), (100.0, 40)], 100, 10.0, None, 100.0),  # the newest sample by time
        ([(10.0, 6050)], 10_000, 0.0, None, 10 / 6050 * 3950),  # resumed: wildly optimistic
        ([(100.0, 150)], 100, 0.0, None, 0.0),  # beyond total
        ([], 100, 0.0, None, None),
        ([(100.0, 50)], None, 0.0, None, None),
        ([(100.0, 0)], 100, 0.0, None, None),  # before the first step
        ([(100.0, 50)], 100, 100.0, None, None),  # no time has passed
    ],
)
def test_lifetime_average(
    samples: list[tuple[float, int]], total: int | None, start: float, now: float | None, expected: float | None
) -> None:
    assert lifetime_average_eta(samples, total, start, now) == pytest.approx(expected)


def test_the_package_exports_both_modules() -> None:
    import importlib

    from stepwatch.server import analysis

    # the package's ``downsample`` is the function, so the modules are looked up by name
    modules = [importlib.import_module(f"stepwatch.server.analysis.{name}") for name in ("eta", "downsample")]
    assert set(analysis.__all__) == {name for module in modules for name in module.__all__}
    assert len(analysis.__all__) == len(set(analysis.__all__))
    assert all(getattr(analysis, name) is not None for name in analysis.__all__)
