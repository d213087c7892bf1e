"""Smoke test of ``benchmarks/health_detection.py --quick``: it runs, prints its tables, and meets
the issue's targets with margins that a quick run (4 seeds of 50 min jobs) holds on any machine.

The figures themselves are the benchmark's business (docs/health.md quotes the full run); here only
what must hold: NaN within one report, stalls within their target, every plateau found with a median
delay under 2x its target (measured: at most 1.3x; with 2 seeds the flat losses' median was 1.99x), no
false stall and at most 4 of the 40 healthy jobs ever flagged ``not_learning`` (the full run measures
the 1 % target), the healthy families of schedules that
flatten by design, and the analysis cost against a baseline measured in the same run (100 us is
about 500 x appending the window to a list on the machines measured; never an absolute time).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "health_detection.py"


@pytest.mark.slow
def test_quick_benchmark_runs_and_prints_the_tables() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--quick"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    rows = {line[:48].split(" (")[0].strip(): line[48:].split() for line in out.splitlines() if len(line) > 48}
    assert "ok" in rows["NaN"]
    assert "ok" in rows["stall: reports stop"] and "ok" in rows["hanging rank"]
    for name in ("plateau: lr decayed to 0", "plateau: flat after N steps", "plateau: accuracy stuck"):
        jobs, found, _median, _worst, _target, ratio = rows[name][:6]
        assert found == jobs and float(ratio) <= 2.0, (name, rows[name])
    # no healthy job is stalled: the evaluation pauses say so (progress.phase), as the integrations do
    assert "stalls: 0 outside an evaluation pause, 0 at one" in out
    rate = re.search(r"not_learning on healthy jobs \(target <= 1 %\): ([0-9.]+)% of jobs at any time", out)
    assert rate is not None and float(rate.group(1)) <= 10.0, out[-1500:]
    cost = re.search(
        r"analysis cost per ingest: ([0-9.]+) us .* observe_window alone: ([0-9.]+) us; "
        r"baseline list.append: ([0-9.]+) us",
        out,
    )
    assert cost is not None
    ingest, window, baseline = (float(cost.group(i)) for i in (1, 2, 3))
    assert window <= ingest  # a window is part of an ingest
    assert ingest < 500 * max(baseline, 0.01), cost.group(0)  # measured: 120-170x
    for family in ("warm-up + cosine decay to 0", "warm-up + linear decay to 0", "slow tail, 1 % noise"):
        assert family in out


def test_a_plateau_whose_confirmation_began_before_it_is_flagged() -> None:
    """Seeds 300-311, 'flat after N steps', seed 300 of 150 min: the confirmation of its plateau began
    on the learning just before it (kept by the drop test's hysteresis), and the evaluation, judged
    since then, improved by the learning before the plateau and vetoed it for ever (never flagged).
    The evaluation is now judged over the loss's history at most: found within 0.25 of the plan."""
    sys.path.insert(0, str(BENCHMARK.parent))
    try:
        import health_detection as bench
    finally:
        sys.path.remove(str(BENCHMARK.parent))
    job = next(j for j in bench.faulty_curves(300, 36_000) if j.name == "plateau: flat after N steps")
    outcome = bench.run(job)
    assert outcome.delay is not None and outcome.delay < 0.25 * outcome.planned, outcome


def test_the_benchmark_judges_with_the_learning_rate_but_no_evaluation() -> None:
    """``--signals lr``: a Trainer run without an evaluation set; the run says what it fed."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--quick", "--signals", "lr", "--seeds", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "signals: loss, learning rate\n" in proc.stdout
    assert "plateau: lr decayed to 0 (1/1 in time)" in proc.stdout  # found by the learning rate alone


@pytest.mark.slow
def test_where_rows_of_health_pace_meet_issue_29s_targets_on_a_few_seeds() -> None:
    """``health_pace.py --only where --jobs 3``: with where, no healthy heavy-tailed job with 5 min saves and
    no save of 10-30 min is flagged, and every hang is found in time, none early, each named; main's rules
    (the same jobs without where) flag the saves."""
    pace = BENCHMARK.parent / "health_pace.py"
    proc = subprocess.run(
        [sys.executable, str(pace), "--only", "where", "--jobs", "3"], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert re.search(r"now, where\s+0/6", out), out
    assert re.search(r"now, no where\s+6/6", out), out  # the earlier rules, kept for reports without where
    for ranks in (1, 4):
        row = next(line for line in out.splitlines() if line.startswith(f"{ranks} rank(s), now, where"))
        found, _median, _worst, in_time, early, named = row[48:].split()
        assert found == "3/3" and in_time == "3/3" and early == "0" and named == "3/3", row
    for save in (10, 20, 30):
        assert f"{save} min saves: main 3/3, now, no where 3/3, now, where 0/3" in out, out
    stragglers = {line.split()[0]: line.split()[1:] for line in out.splitlines() if re.match(r"[0-9.]+x ", line)}
    assert stragglers["1.2x"][0] == "0/3"  # under the threshold: never named
    for ratio in ("1.6x", "2x", "3x"):
        found, _median, worst, named, early = stragglers[ratio]
        assert found == "3/3" and named == "3" and early == "0", (ratio, stragglers[ratio])
        assert 300 <= float(worst) <= 600, (ratio, stragglers[ratio])  # the 5 min hold, and not much more
