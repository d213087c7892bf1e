"""Smoke test of ``benchmarks/paced_penalty.py``: it runs, and prints a row per gap with its ratio to back to back.

The figures themselves are the machine's (the point of the script), so only their shape is checked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "paced_penalty.py"


def test_a_short_run_prints_a_row_per_gap() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--gaps", "0.001", "--units", "50", "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["between", "units", "CPU", "us/unit,", "median", "range", "x", "back", "to", "back"]
    rows = {line[:16].strip(): line[16:].split() for line in lines[1:]}
    assert set(rows) == {"back to back", "1 ms"}, rows
    assert rows["back to back"][-1] == "1.00"
    for cells in rows.values():
        assert float(cells[0]) > 0 and float(cells[-1]) > 0, cells
