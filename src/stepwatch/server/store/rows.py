"""How stored rows become records, the same for both stores: the job columns, JSON and float cells.

Both schemas keep a job's dicts as JSON text (``last_metrics`` and ``metric_means`` with non-finite values as strings,
which JSON has no numbers for) and a window's ``last`` as a float where ``NaN`` is not ``NULL``:
SQLite turns a NaN into ``NULL``, so it is stored there as the text ``'NaN'``, which PostgreSQL's
``double precision`` reads back as its own NaN.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Any

from ...protocol import decode_float, encode_float
from .base import Job
from .schema import JSON, TABLES

__all__ = ["JOB_COLUMNS", "JOB_NAMES", "column_value", "job_from_row", "load_float", "store_float"]

_JOB_TABLE = next(table for table in TABLES if table.name == "jobs")
JOB_NAMES: tuple[str, ...] = tuple(c.name for c in _JOB_TABLE.columns if c.name in {f.name for f in fields(Job)})
"""The job table's columns a :class:`~.base.Job` holds (all but the token's hash), in the schema's order: read
from the one declaration of the schema, so that a column added there is read here too."""
JOB_COLUMNS = ", ".join(JOB_NAMES)
""":data:`JOB_NAMES` as a ``SELECT`` list, the row :func:`job_from_row` reads."""
_JSON_NAMES = tuple(c.name for c in _JOB_TABLE.columns if c.type is JSON and c.name in JOB_NAMES)
_METRIC_NAMES = ("last_metrics", "metric_means")
"""JSON dicts of metric values, their non-finite values written as strings."""


def store_float(value: float) -> float | str:
    """SQLite turns NaN into NULL: store it as the text 'NaN' (infinities are REAL)."""
    return "NaN" if math.isnan(value) else value


def load_float(value: Any) -> float:
    """A stored ``last`` back as a float (``NULL`` and ``'NaN'`` are NaN)."""
    return math.nan if value is None or value == "NaN" else float(value)


def job_from_row(row: tuple[Any, ...]) -> Job:
    """A job from a row of :data:`JOB_COLUMNS`: JSON columns decoded (a ``NULL`` one is ``None``), metric values
    back to floats."""
    values = dict(zip(JOB_NAMES, row, strict=True))
    for name in _JSON_NAMES:
        text = values[name]
        values[name] = None if text is None else json.loads(text)
    for name in _METRIC_NAMES:
        values[name] = {k: decode_float(v, k) for k, v in values[name].items()}
    return Job(**values)


def column_value(name: str, value: Any) -> Any:
    """A job field as its column stores it (the dicts are JSON; non-finite metrics as strings)."""
    if name == "params":
        return json.dumps(value)
    if name in ("last_metrics", "metric_means"):
        return json.dumps({k: encode_float(v) for k, v in value.items()})
    if name in ("health_evidence", "policy", "policy_fired", "health_history"):
        return json.dumps(value, default=str)
    if name == "trainer_status":
        return None if value is None else json.dumps(value, ensure_ascii=False)
    return value
