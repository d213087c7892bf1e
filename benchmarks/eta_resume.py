"""ETA error in the first 3 minutes after a resume: stepwatch now, the lifetime average, and the code on main.

A job resumed from a checkpoint at step 6,000 of 10,000 reports as the report core does: its first
report goes out at once with step 0 (the process has not loaded the checkpoint yet), later ones every
2 s (+-20 %) with the step it reached, so the step jumps from 0 to about 6,000 between two reports.
At every report in the first 3 minutes after that jump, three estimates are compared with the true
remaining time of the curve (known: it is simulated, seeded):

- **stepwatch**: ``stepwatch.server.analysis.estimate_eta`` of this checkout;
- **lifetime avg**: ``lifetime_average_eta``, what transformers' ``KubeflowCallback`` reports
  (time since the process started per global step);
- **before**: ``estimate_eta`` of the code at ``--baseline-ref`` (default ``main``), read with
  ``git show`` into a temporary module (the module is standard library only).

The error of a point is ``|estimate - truth| / truth``; a method's figure is the mean over the
points where it gives an ETA (``shown`` says at what share of points it gives one: stepwatch gives
none until it has seen two intervals of real progress, about 4 s). Scenarios: a plain resume, a slow
checkpoint load (2 min at step 0), a warm-up after the resume (the first minute at 30 % speed),
evaluation pauses (60 s every 500 steps) and a restart in the same attempt (the previous process's
history is before it: its step goes back to 0 at the new process's first report)::

    .venv/bin/python benchmarks/eta_resume.py            # 20 seeds per scenario (a few seconds)
    .venv/bin/python benchmarks/eta_resume.py --quick    # 4 seeds
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from types import ModuleType

from stepwatch.server.analysis import estimate_eta, lifetime_average_eta

ROOT = Path(__file__).resolve().parents[1]
ETA_PATH = "src/stepwatch/server/analysis/eta.py"
WINDOW_S = 180.0
"""The first 3 minutes after the resume are scored."""


@dataclass(frozen=True)
class Resume:
    """How a resumed process runs; times in seconds from its start."""

    name: str
    total: int = 10_000
    resumed_at: int = 6_000
    rate: float = 4.0
    """Steps per second while stepping, before noise."""
    load: float = 20.0
    """Process start to the first step (imports, loading the checkpoint): the reports say step 0."""
    warmup_seconds: float = 0.0
    """The first seconds after the first step run at ``warmup_speed``."""
    warmup_speed: float = 1.0
    eval_every: int = 0
    """An evaluation pause after every this many (global) steps; 0: none."""
    eval_seconds: float = 60.0
    report_every: float = 2.0
    noise: float = 0.15
    """Log-normal per-step noise."""
    earlier_process: bool = False
    """The same attempt ran before (to step ``resumed_at + 150``): its history precedes this process's."""


SCENARIOS = (
    Resume("resumed at 60%"),
    Resume("slow checkpoint load (2 min)", load=120.0),
    Resume("warm-up after the resume (1 min at 30%)", warmup_seconds=60.0, warmup_speed=0.3),
    Resume("eval pauses (60 s every 500 steps)", eval_every=500),
    Resume("restart in the same attempt", earlier_process=True),
)


@dataclass(frozen=True)
class Curve:
    """The reports of one resumed process, when it started, when the jump showed, when it really ended."""

    samples: list[tuple[float, int]]
    start: float
    resumed: float
    end: float
    total: int


def simulate(job: Resume, seed: int, t0: float = 10_000.0) -> Curve:
    """The ``(time, step)`` reports of one resumed process, as the report core sends them."""
    rng = random.Random(seed)
    t = t0 + job.load
    done_at: list[float] = []
    first = t
    for step in range(job.resumed_at + 1, job.total + 1):
        dt = math.exp(job.noise * rng.gauss(0.0, 1.0) - job.noise**2 / 2) / job.rate
        if t - first < job.warmup_seconds:
            dt /= job.warmup_speed
        t += dt
        done_at.append(t)
        if job.eval_every and step % job.eval_every == 0:
            t += job.eval_seconds * (1 + 0.05 * rng.gauss(0.0, 1.0))
    end = t
    samples: list[tuple[float, int]] = []
    if job.earlier_process:  # the previous process of this attempt: 4 steps/s up to its crash
        crash = t0 - 60.0
        samples = [(crash - 2.0 * k, job.resumed_at + 150 - 8 * k) for k in range(300, -1, -1)]
    r, done = t0, 0
    while r < end:
        while done < len(done_at) and done_at[done] <= r:
            done += 1
        samples.append((r, job.resumed_at + done if r >= first else 0))
        r += job.report_every * rng.uniform(0.8, 1.2)
    resumed = next(t for t, s in samples if t >= t0 and s > 0)
    return Curve(samples, t0, resumed, end, job.total)


Estimator = Callable[[list[tuple[float, int]], Curve, float], "float | None"]


def estimators(baseline: ModuleType | None) -> dict[str, Estimator]:
    """The methods compared, by column name."""

    def ours(history: list[tuple[float, int]], curve: Curve, now: float) -> float | None:
        return estimate_eta(history, curve.total, now=now).eta_seconds

    def lifetime(history: list[tuple[float, int]], curve: Curve, now: float) -> float | None:
        own = [(t, s) for t, s in history if t >= curve.start]  # the process's own clock and global step
        return lifetime_average_eta(own, curve.total, curve.start, now)

    methods: dict[str, Estimator] = {"stepwatch": ours, "lifetime avg": lifetime}
    if baseline is not None:

        def before(history: list[tuple[float, int]], curve: Curve, now: float) -> float | None:
            found: float | None = baseline.estimate_eta(history, curve.total, now=now).eta_seconds
            return found

        methods["before"] = before
    return methods


@dataclass
class Score:
    """Absolute percentage errors where a method gave an ETA, and how many points it was asked for."""

    errors: list[float]
    points: int = 0

    @property
    def mae(self) -> float:
        return mean(self.errors) if self.errors else math.nan

    @property
    def shown(self) -> float:
        return 100.0 * len(self.errors) / self.points if self.points else math.nan


def score(curve: Curve, methods: dict[str, Estimator]) -> dict[str, Score]:
    """Each method's errors at every report of the first :data:`WINDOW_S` seconds after the resume."""
    scores = {name: Score([]) for name in methods}
    for i, (now, _) in enumerate(curve.samples):
        if now < curve.resumed or now > curve.resumed + WINDOW_S:
            continue
        history = curve.samples[: i + 1]
        truth = curve.end - now
        for name, method in methods.items():
            scores[name].points += 1
            estimate = method(history, curve, now)
            if estimate is not None:
                scores[name].errors.append(abs(estimate - truth) / truth * 100)
    return scores


def run(seeds: Sequence[int], baseline: ModuleType | None) -> dict[str, dict[str, Score]]:
    """Scores by scenario and method, over ``seeds``; an ``all`` row pools every scenario."""
    methods = estimators(baseline)
    table: dict[str, dict[str, Score]] = {}
    pooled = {name: Score([]) for name in methods}
    for job in SCENARIOS:
        row = {name: Score([]) for name in methods}
        for seed in seeds:
            for name, one in score(simulate(job, seed), methods).items():
                for target in (row[name], pooled[name]):
                    target.errors += one.errors
                    target.points += one.points
        table[job.name] = row
    table["all scenarios"] = pooled
    return table


def load_baseline(ref: str) -> ModuleType | None:
    """``analysis/eta.py`` as it is at ``ref``, imported from a temporary file; ``None`` when git cannot say."""
    try:
        source = subprocess.run(
            ["git", "show", f"{ref}:{ETA_PATH}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"(no baseline: git show {ref}:{ETA_PATH} failed: {exc})", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "eta_before.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("eta_before", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["eta_before"] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
    return module


def render(table: dict[str, dict[str, Score]], seeds: int, ref: str) -> str:
    """The table: mean absolute % error and the share of points with an ETA, per method."""
    methods = list(next(iter(table.values())))
    head = f"{'scenario':42}" + "".join(f"{name:>14} {'shown':>6}" for name in methods)
    lines = [
        f"ETA mean absolute % error in the first {WINDOW_S:.0f} s after a resume, {seeds} seeds per scenario"
        + (f" (before = {ref})" if "before" in methods else ""),
        head,
    ]
    for name, row in table.items():
        lines.append(f"{name:42}" + "".join(f"{row[m].mae:13.1f}% {row[m].shown:5.0f}%" for m in methods))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 seeds per scenario")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--baseline-ref", default="main", help="the git ref whose eta.py is 'before'")
    args = parser.parse_args(argv)
    seeds = range(4 if args.quick else args.seeds)
    table = run(seeds, load_baseline(args.baseline_ref))
    print(render(table, len(seeds), args.baseline_ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
