"""Smoke tests of ``benchmarks/report_http.py``: a tiny run prints the table with positive figures, and a run
whose reports the server refuses fails. They check that the benchmark works, not its figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "report_http.py"
TINY = ["--rounds", "1", "--seconds", "1", "--warm", "0.5", "--conns", "4"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCHMARK), *TINY, *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_a_tiny_stubbed_run_prints_a_row_per_target_with_positive_figures() -> None:
    proc = _run("--stub", "--cut", "decode")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "cut after decode" in proc.stdout
    rows = {}
    for line in proc.stdout.splitlines():
        # target, round, reports/s, p50 ms, p99 ms, server CPU ms/report, vs floor
        found = re.match(r"(\w+)\s+1\s+([\d,]+)\s+([\d.]+) ms / ([\d.]+) ms\s+([\d.]+)\s+(\S+)", line)
        if found:
            rows[found[1]] = found.groups()[1:]
    assert set(rows) == {"bare", "this"}, proc.stdout
    for key, (per_s, p50, p99, cpu, _versus) in rows.items():
        assert float(per_s.replace(",", "")) > 0 and 0 < float(p50) <= float(p99) and float(cpu) > 0, key
    assert rows["this"][4].endswith("x") and float(rows["this"][4][:-1]) > 0
    assert "median over rounds:" in proc.stdout and "NOT 200" not in proc.stdout


def test_a_run_whose_reports_are_refused_fails() -> None:
    # a real setting of the server: a job may have 2 metric names, a report carries 5 (422, then 429)
    proc = _run("--no-bare", env={"STEPWATCH_MAX_METRIC_NAMES": "2"})
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "NOT 200" in proc.stdout and "no round answered 200 throughout" in proc.stdout
    assert "were not answered 200" in proc.stderr
