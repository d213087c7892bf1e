"""Smoke test of ``benchmarks/server_limits.py --quick``: the attacks of issue 21 (items 2, 3, 11) on a
real server of this tree, and the table. It checks the limits hold under the attacks (names stored,
streams refused); the latency figures of a run this short are printed, not judged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "server_limits.py"


@pytest.mark.slow
def test_the_limits_benchmark_runs_the_attacks_and_prints_the_table(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--quick", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| 1. names stored" in proc.stdout and "| 3. server RSS" in proc.stdout, proc.stdout
    (after,) = json.loads(figures.read_text())
    assert after["names"] == 1024  # the default limit, reached and held
    assert after["refused"] >= 1 and after["accepted"] == 4  # 4 x 256 names, then refusals
    assert after["streams_opened"] == 32 and after["streams_refused"] == 200 - 32  # the limit per client
    assert after["job_get_bytes"] < 200_000
