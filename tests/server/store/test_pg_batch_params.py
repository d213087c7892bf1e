"""The parameters of PostgreSQL's batch statement (``postgres_ingest._batch_params``), written in one pass
over each report's windows: the same text arrays as a column written over every window at once, the way
they were written before (:func:`_reference`), on random reports. No database needed."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any

import pytest

from stepwatch.protocol import GpuReading, Identity, MetricWindow, Progress, Report
from stepwatch.server.store import PendingReport

pytest.importorskip("psycopg")

from stepwatch.server.store.postgres_ingest import _array, _batch_params, _float, _quoted


@dataclass
class _Job:
    id: int


def _reference(items: list[PendingReport]) -> dict[str, Any]:
    """The parameters that changed as they were written (the windows' columns, each a generator over every
    window; the GPUs, each report's encoded)."""
    windows = [(item, w) for item in items for w in item.report.metrics]
    return {
        "gpus": _array(_quoted(json.dumps([g.to_dict() for g in item.report.gpus])) for item in items),
        "w_job": _array(str(item.job.id) for item, _ in windows),
        "w_rank": _array(str(item.report.identity.rank) for item, _ in windows),
        "metrics": _array(_quoted(w.name) for _, w in windows),
        "steps": _array(str(w.last_step) for _, w in windows),
        "ts": _array(repr(item.now) for item, _ in windows),
        "lasts": _array(repr(w.last) for _, w in windows),
        "mins": _array(_float(w.min) for _, w in windows),
        "maxs": _array(_float(w.max) for _, w in windows),
        "means": _array(_float(w.mean) for _, w in windows),
        "counts": _array(str(w.count) for _, w in windows),
        "nonfinites": _array(str(w.nonfinite) for _, w in windows),
    }


def _value(rng: random.Random) -> float | int:
    return rng.choice((rng.random() * 10 ** rng.randint(-30, 30), -rng.random(), 0.0, 3, -7, 1e308, 5e-324))


def _window(rng: random.Random, name: str) -> MetricWindow:
    last: float | int = rng.choice((_value(rng), math.nan, math.inf, -math.inf))
    finite = rng.random() < 0.8
    values = [_value(rng) for _ in range(3)]
    step = rng.randint(0, 10**12)
    count = rng.randint(1, 50)
    return MetricWindow(
        name=name,
        last=last,
        min=min(values) if finite else None,
        max=max(values) if finite else None,
        mean=sum(v / 3 for v in values) if finite else None,
        count=count,
        nonfinite=rng.randint(0, count - 1) if finite else count,
        first_step=step,
        last_step=step,
    )


def _report(rng: random.Random, seq: int) -> Report:
    names = ["loss", "eval/accuracy", 'a "quoted" name', "back\\slash", "rewards/chosen", "ünïcode", "comma,brace}"]
    windows = tuple(_window(rng, name) for name in rng.sample(names, rng.randint(0, len(names))))
    gpus = tuple(
        GpuReading(index=i, utilization=rng.choice((None, 55.5)), memory_used=rng.choice((None, 2**33)))
        for i in range(rng.choice((0, 0, 2)))
    )
    return Report(
        run_id=rng.choice(("run-1", "run_2.b")),
        seq=seq,
        sent_at=1.7e9 + rng.random(),
        identity=Identity(
            rank=rng.randint(0, 7), world_size=8, host=rng.choice(("node-1", "", 'n\\"x')), pid=rng.choice((1, 4242))
        ),
        progress=Progress(step=rng.choice((None, rng.randint(0, 10**9))), step_time=rng.choice((None, 0.25))),
        metrics=windows,
        gpus=gpus,
    )


def test_the_batch_parameters_are_the_arrays_a_column_at_once_gave() -> None:
    rng = random.Random(2026)
    for n in range(300):
        items = [
            PendingReport(_Job(rng.randint(1, 10**6)), _report(rng, n * 10 + i), 1.7e9 + rng.random())  # type: ignore[arg-type]
            for i in range(rng.randint(1, 12))
        ]
        params, reference = _batch_params(items), _reference(items)
        assert {k: params[k] for k in reference} == reference
        assert params["job"] == _array(str(item.job.id) for item in items)  # (the reports' columns: unchanged)
