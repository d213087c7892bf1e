"""Smoke tests of ``benchmarks/health_replay.py``: a tiny replay (6 jobs of 1 seed, seconds) of this tree
against itself says IDENTICAL, and against a copy of this tree whose stall threshold was changed says
DIFFERENT, with exit status 1 and the first answer that differs (so the tool can fail).

The figures of a full run are the benchmark's business; here only that it tells trees apart.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[3]
BENCHMARK = ROOT / "benchmarks" / "health_replay.py"


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny recording, replayed by every test of this module."""
    return tmp_path_factory.mktemp("replay") / "streams.pkl"


def replay(streams: Path, baseline_src: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(BENCHMARK), "--jobs", "6", "--seeds", "1", "--streams", str(streams)]
    command += ["--baseline-src", str(baseline_src)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def cells(out: str, row: str) -> list[str]:
    """The cells of a row of the table (one per tree)."""
    line = next(line for line in out.splitlines() if line.startswith(row))
    return line[34:].split()


def test_this_tree_against_itself_is_identical(streams: Path) -> None:
    proc = replay(streams, ROOT / "src")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert out.splitlines()[-1].startswith("IDENTICAL"), out
    assert cells(out, "jobs") == ["6", "6"]
    reports = cells(out, "reports")
    assert reports[0] == reports[1] and int(reports[0].replace(",", "")) > 1000, out
    first, second = cells(out, "hash")[-2:]
    assert first == second, out
    assert cells(out, "updates: stalled")[0] != "0", out  # the jobs do reach verdicts worth comparing


def test_a_changed_stall_threshold_is_different(streams: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
    params = src / "stepwatch" / "server" / "analysis" / "health_params.py"
    text = params.read_text()
    assert "standstill_floor_s: float = 30.0" in text  # the threshold this test changes
    params.write_text(text.replace("standstill_floor_s: float = 30.0", "standstill_floor_s: float = 90.0"))
    proc = replay(streams, src)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("DIFFERENT"), proc.stdout
    first, second = cells(proc.stdout, "hash")[-2:]
    assert first != second
    where = next(i for i, line in enumerate(lines) if line.startswith("first difference: job '"))
    mine, theirs = lines[where + 1], lines[where + 2]
    assert mine.split(",")[0] == theirs.split(",")[0]  # the same answer ("  answer N") of the same job...
    assert mine.split(": ", 2)[2] != theirs.split(": ", 2)[2]  # ...answered differently


def test_a_recorded_report_gathers_the_calls_after_it() -> None:
    """The recording's reports: a progress call and the window, learning rate, GPU, where and shares calls
    after it; a verdict call without one is a tick (time passes)."""
    sys.path.insert(0, str(BENCHMARK.parent))
    try:
        import health_replay as bench
    finally:
        sys.path.remove(str(BENCHMARK.parent))
    tracker = bench.Recorder()
    bench.Recorder.calls = [("new", "max")]
    tracker.observe_progress(10.0, 0, 8, 100)
    tracker.observe_window(10.0, 8, 0.5, 0.4, 0.6, 0.5, 8, 0)
    tracker.observe_lr(10.0, 8, 1e-3)
    tracker.observe_gpu(0, 99.0)
    tracker.verdict(10.0)
    tracker.verdict(12.0)
    tracker.observe_progress(14.0, 1, 9)
    tracker.observe_where(14.0, 1, 9, "waiting", 40.0, "threading.Lock.acquire", ["f (a.py:3)"])
    tracker.observe_shares(1, {"computing": 1.0}, "node-1")
    direction, events = bench.events_of(bench.Recorder.calls)
    assert direction == "max"
    windows = (("accuracy", 8, 0.5, 0.4, 0.6, 0.5, 8, 0, 8), ("learning_rate", 8, 1e-3, 1e-3, 1e-3, 1e-3, 1, 0, 8))
    assert events == [
        ("report", 10.0, 0, 8, 100, None, windows, (99.0,), None, None, ""),
        ("tick", 10.0),
        ("tick", 12.0),
        ("report", 14.0, 1, 9, None, None, (), (), ("waiting", 40.0, "threading.Lock.acquire", ("f (a.py:3)",)),
         {"computing": 1.0}, "node-1"),
    ]  # fmt: skip
