"""A smoke run of ``benchmarks/k8s_runner.py`` (small N, a few seconds), against the FAKE API server: the
benchmark keeps working, and its figures keep the targets it reports (writes capped overall and per job)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "k8s_runner.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("k8s_runner_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_runner_benchmark_runs_and_keeps_its_targets() -> None:
    bench = load()
    results = bench.measure(n=20, seconds=1.5, baseline_seconds=2.5, every_s=0.4)
    throttled, baseline = results["throttled"]["writes"], results["baseline"]["writes"]
    assert 0 < throttled.busiest_second <= 20
    assert throttled.busiest_job_5s == 1
    assert baseline.busiest_job_5s >= 2  # unthrottled: a write for every report
    assert results["reconcile_writes"] > 0  # jobs were due a write in the timed pass
    assert results["reconcile_cpu_s"] < 1.0
    table = bench.table(results)
    assert "CPU to reconcile 20 jobs" in table and "<= 20" in table
