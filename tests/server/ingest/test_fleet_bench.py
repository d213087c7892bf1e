"""Smoke test of the fleet simulation: ``benchmarks/fleet.py`` with a few ranks runs end to end against
a real server (ranks of several jobs, heartbeats, the live-stream reader, the projection). It checks
that the benchmark works, not its figures (they depend on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "fleet.py"


@pytest.mark.slow
def test_a_small_fleet_runs_and_projects(tmp_path: Path) -> None:
    figures = tmp_path / "fleet.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--ranks", "16", "--ranks-per-job", "4", "--seconds", "4", "--warmup", "2",
         "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(figures.read_text())
    assert (out["ranks"], out["jobs"]) == (16, 4)
    # 16 ranks every 2 s for 4 s: about 32 reports, every one answered 200
    assert set(out["statuses"]) == {"200"} and 20 <= out["statuses"]["200"] <= 48, out["statuses"]
    # every job's rank 0 was read back from the live stream
    assert out["live_delay_ms"]["n"] >= 4 and out["live_delay_ms"]["p50"] > 0
    assert out["server_cpu_ms_per_report"] > 0
    projected = out["projection"]
    assert projected["reports_per_s"] == 5000.0
    assert projected["cores_at_half_load"] == pytest.approx(2 * projected["cores_at_full_load"], rel=0.01)
