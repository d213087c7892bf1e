"""Smoke test of ``benchmarks/retention.py``: a short run builds, compacts, keeps the chart and prints the
table. It checks that the benchmark works, not the year's figure (a smoke run keeps level-1 rows)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette")

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "retention.py"


@pytest.mark.slow
def test_the_retention_benchmark_compacts_and_keeps_the_chart() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--quick"], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]  # 1: a chart changed
    assert "MB before" in proc.stdout and "a year (15,768,000 windows)" in proc.stdout, proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().endswith("yes")]
    assert len(rows) == 2 and all(float(r[3].replace(",", "")) < float(r[2].replace(",", "")) for r in rows)
