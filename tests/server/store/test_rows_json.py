"""A job's JSON columns written by orjson read back as the standard encoder's text did (``rows.column_value``)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import random
import uuid
from typing import Any

import pytest

from stepwatch.protocol import encode_float
from stepwatch.server.store import rows
from stepwatch.server.store.rows import column_value, column_values, span_text


class _Float(float):
    """A float subclass (numpy's float64 is one): a number to the standard encoder."""


@dataclasses.dataclass
class _Thing:
    x: int


def _old_column_value(name: str, value: Any) -> Any:
    """``column_value`` as it was, by the standard encoder: the reference."""
    if name == "params":
        return json.dumps(value)
    if name in ("last_metrics", "metric_means"):
        return json.dumps({k: encode_float(v) for k, v in value.items()})
    if name in ("health_evidence", "policy", "policy_fired", "health_span"):
        return json.dumps(value, default=str)
    if name == "trainer_status":
        return None if value is None else json.dumps(value, ensure_ascii=False)
    return value


_STRINGS = ["loss", "", "null", "é", "日本語", 'a"b\\c\n', "\ud800", "NaN", "x" * 40]
_FLOATS = [0.0, -0.0, 1.5, 3e-4, 0.1 + 0.2, 1e16, 1e-320, 1.7976931348623157e308, math.nan, math.inf, -math.inf]


def _scalar(rng: random.Random, safe: bool) -> Any:
    """A random leaf; ``safe``: only what a JSON body can hold (no objects for ``default``)."""
    kinds = ["str", "int", "bigint", "float", "none", "bool"] + ([] if safe else ["dt", "dc", "uuid", "sub"])
    kind = rng.choice(kinds)
    if kind == "str":
        return rng.choice(_STRINGS)
    if kind == "int":
        return rng.randint(-(2**63), 2**63 - 1)
    if kind == "bigint":
        return rng.choice([2**64, -(2**70), 10**30])
    if kind == "float":
        return rng.choice(_FLOATS) if rng.random() < 0.5 else rng.uniform(-1e6, 1e6)
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "dt":
        return datetime.datetime(2026, 12, 7, 6, 30, rng.randint(0, 59), tzinfo=datetime.UTC)
    if kind == "dc":
        return _Thing(rng.randint(0, 9))
    if kind == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    return _Float(rng.choice(_FLOATS))


def _tree(rng: random.Random, depth: int, safe: bool) -> Any:
    if depth == 0 or rng.random() < 0.3:
        return _scalar(rng, safe)
    if rng.random() < 0.6:
        keys: list[Any] = [rng.choice(_STRINGS) + str(i) for i in range(rng.randint(0, 5))]
        if not safe and rng.random() < 0.1:
            keys.append(7)  # an int key: the standard encoder writes it as a string
        return {k: _tree(rng, depth - 1, safe) for k in keys}
    return [_tree(rng, depth - 1, safe) for _ in range(rng.randint(0, 4))] + ([] if safe else [(1, 2)])


def _same_read(new: Any, old: Any) -> bool:
    """Whether both texts read back as the same value (NaN included: compared as re-encoded text)."""
    if new is None or old is None:
        return new is old
    return json.dumps(json.loads(new)) == json.dumps(json.loads(old))


@pytest.mark.parametrize("seed", range(8))
def test_json_columns_read_back_the_same_on_random_jobs(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        metrics = {rng.choice(_STRINGS) + str(i): rng.choice(_FLOATS) for i in range(rng.randint(0, 8))}
        columns: dict[str, Any] = {
            "params": _tree(rng, 4, safe=True),
            "last_metrics": metrics,
            "metric_means": {k: _Float(v) if rng.random() < 0.2 else v for k, v in metrics.items()},
            "health_evidence": _tree(rng, 4, safe=False),
            "policy": _tree(rng, 3, safe=False),
            "policy_fired": _tree(rng, 3, safe=False),
            "trainer_status": None if rng.random() < 0.2 else _tree(rng, 4, safe=True),
        }
        for name, value in columns.items():
            new, old = column_value(name, value), _old_column_value(name, value)
            assert _same_read(new, old), (name, value, new, old)
        for span in [_tree(rng, 3, safe=False) for _ in range(rng.randint(0, 4))]:  # health_spans.span, as the
            new, old = span_text(span), _old_column_value("health_span", span)  # job's health_history was written
            assert _same_read(new, old), (span, new, old)


def test_metric_columns_take_the_fast_path_and_read_back_exactly() -> None:
    """A report's metric dicts (the hot path) are compact orjson text, read back as the same floats."""
    metrics = {"loss": 0.1 + 0.2, "lr": 3e-4, "grad_norm": math.inf, "tokens/s": 12345.678}
    text = column_value("last_metrics", metrics)
    assert text == '{"loss":0.30000000000000004,"lr":0.0003,"grad_norm":"Infinity","tokens/s":12345.678}'
    assert json.loads(text) == {k: encode_float(v) for k, v in metrics.items()}


def test_non_finite_float_outside_metrics_keeps_the_standard_text() -> None:
    """orjson writes NaN as null; such a value goes to the standard encoder, which keeps NaN."""
    assert column_value("health_evidence", {"loss": math.nan}) == '{"loss": NaN}'
    assert column_value("params", {"big": 2**70}) == json.dumps({"big": 2**70})


@pytest.mark.parametrize("seed", range(4))
def test_a_reports_column_values_are_each_columns_value_and_the_metric_text_as_before(seed: int) -> None:
    """``column_values`` (an update's dozen columns at once) writes what ``column_value`` writes column by
    column; metric dicts whose values are all finite are written as they are, the same text as when each value
    went through ``encode_float`` first."""
    rng = random.Random(seed)
    for _ in range(300):
        metrics = {rng.choice(_STRINGS) + str(i): rng.choice(_FLOATS) for i in range(rng.randint(0, 8))}
        finite = {k: _Float(v) if rng.random() < 0.2 else v for k, v in metrics.items() if math.isfinite(v)}
        updates: dict[str, Any] = {
            "updated_at": rng.random(),
            "step": rng.randint(0, 10**6),
            "last_metrics": metrics,
            "metric_means": finite,
            "params": _tree(rng, 3, safe=True),
            "trainer_status": None,
            "policy": _tree(rng, 2, safe=False),
        }
        assert column_values(updates) == [column_value(k, v) for k, v in updates.items()]
        for value in (metrics, finite):
            assert column_value("metric_means", value) == rows._dumps({k: encode_float(v) for k, v in value.items()})
