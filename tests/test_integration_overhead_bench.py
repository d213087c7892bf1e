"""The integration overhead benchmark runs and prints its table (a smoke run; its figures are not checked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("xgboost")

ROOT = Path(__file__).parents[1]


@pytest.mark.slow
def test_quick_run_prints_the_table(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "integration_overhead.py"),
            "--quick",
            "--frameworks",
            "torch,xgboost",
            "--json",
            str(tmp_path / "figures.json"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("framework "))
    assert lines[header].split()[:2] == ["framework", "steps"]
    rows = lines[header + 2 : header + 4]
    assert [row.split()[0] for row in rows] == ["PyTorch", "XGBoost"]
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert {r["framework"] for r in figures["results"]} == {"torch", "xgboost"}
