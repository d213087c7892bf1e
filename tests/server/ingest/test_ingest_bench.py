"""Smoke test of the server benchmark: ``benchmarks/server_ingest.py --quick`` runs end to end.

It checks that the benchmark works (a real server in a subprocess, load generators, SSE, the bulk
database), not the figures: they depend on the machine, and the targets are for the full sizes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("httpx")

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "server_ingest.py"


@pytest.mark.slow
def test_quick_benchmark_runs_and_prints_the_table(tmp_path: Path) -> None:
    figures = tmp_path / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(BENCHMARK), "--quick", "--json", str(figures)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    header = next((line for line in proc.stdout.splitlines() if line.startswith("measure")), None)
    assert header is not None, proc.stdout[-2000:]
    assert header.split() == ["measure", "target", "measured", "verdict"]
    for section in ("1 ingest", "2 step -> SSE", "3 history", "4 list jobs", "5 server RSS"):
        assert f"\n{section}" in proc.stdout, section

    results = json.loads(figures.read_text())
    ingest = results["ingest"]
    # every request in the measured windows was answered as expected: 404 for the floor (no route), else 200
    assert ingest["floor"]["statuses"] == {"404": ingest["floor"]["requests"]}, ingest["floor"]
    for phase in (ingest["fresh"], ingest["steady"], *ingest["paced"]):
        assert "unavailable" not in phase, phase
        assert phase["requests"] > 0
        assert phase["statuses"] == {"200": phase["requests"]}, phase["statuses"]
    assert results["sse"]["windows"] >= 1 and not results["sse"]["problems"]
    assert results["reads"]["history_long"]["points"] > 0
    assert results["reads"]["list_all"]["items"] == results["bulk"]["jobs"]
    # section 6 without PostgreSQL or a baseline: the floor and this tree's one process, the others said why
    compare = {row["key"]: row for row in results["compare"]}
    for key in ("bare", "sqlite"):
        assert compare[key]["statuses"] == {"200": compare[key]["requests"]} and compare[key]["requests"] > 0
    assert compare["postgres_2"]["unavailable"] == "no --database-url"
    assert compare["sqlite_before"]["unavailable"] == "no --baseline"
    assert "6. one process, and replicas" in proc.stdout


def test_slow_answers_are_grouped_into_bursts() -> None:
    """The tail's shape: answers over the target less than 0.5 s apart are one burst (a pause of the server),
    whatever order the load generators' processes gave them in."""
    sys.path.insert(0, str(BENCHMARK.parent))
    try:
        from server_ingest import slow_bursts
    finally:
        sys.path.remove(str(BENCHMARK.parent))
    slow = [(8.3, 70.0), (1.0, 55.0), (8.1, 90.0), (1.2, 60.0), (8.2, 61.0), (5.0, 51.0)]
    assert slow_bursts(slow) == [
        {"at_s": 1.0, "last_s": 1.2, "answers": 2, "slowest_ms": 60.0},
        {"at_s": 5.0, "last_s": 5.0, "answers": 1, "slowest_ms": 51.0},
        {"at_s": 8.1, "last_s": 8.3, "answers": 3, "slowest_ms": 90.0},
    ]
    assert slow_bursts([]) == []
