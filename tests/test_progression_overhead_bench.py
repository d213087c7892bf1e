"""The progression endpoint's benchmark runs and prints its table (a smoke run; its figures are not checked)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_quick_run_prints_the_table(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    bench = str(ROOT / "benchmarks" / "progression_overhead.py")
    done = subprocess.run(
        [sys.executable, bench, "--quick", "--work-us", "500", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("step work ") for line in lines)
    assert sum(1 for line in lines if line.lstrip().startswith(("off", "on", "0.5 ms"))) == 3
    result = json.loads(figures.read_text())["results"][0]
    assert set(result["configs"]) == {"off", "on", "on, polled"}
    assert result["polls"]["count"] > 0 and result["polls"]["errors"] == 0
