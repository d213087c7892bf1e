"""How stored rows become records, the same for both stores: the job columns, JSON and float cells.

Both schemas keep a job's dicts as JSON text (``last_metrics`` and ``metric_means`` with non-finite values as strings,
which JSON has no numbers for) and a window's ``last`` as a float where ``NaN`` is not ``NULL``:
SQLite turns a NaN into ``NULL``, so it is stored there as the text ``'NaN'``, which PostgreSQL's
``double precision`` reads back as its own NaN.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import fields
from functools import lru_cache
from typing import Any

from ...protocol import decode_float, encode_float
from .base import Job
from .schema import JSON, TABLES
from .sql_dialect import Dialect

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is in the server extra
    orjson = None  # type: ignore[assignment]

__all__ = [
    "JOB_NAMES",
    "ROW_COLUMNS",
    "column_value",
    "column_values",
    "job_columns",
    "job_from_row",
    "load_float",
    "span_text",
    "spans_column",
    "store_float",
]

_JOB_TABLE = next(table for table in TABLES if table.name == "jobs")
JOB_NAMES: tuple[str, ...] = (
    *(c.name for c in _JOB_TABLE.columns if c.name in {f.name for f in fields(Job)}),
    "health_history",
)
"""What a row of :func:`job_columns` holds: the job table's columns a :class:`~.base.Job` holds (all but the
token's hash), in the schema's order, read from the one declaration of the schema so that a column added there is
read here too; then the job's verdicts, gathered from ``health_spans`` as one JSON list."""
ROW_COLUMNS = ", ".join(JOB_NAMES[:-1])
"""The job's own columns of :data:`JOB_NAMES` (its spans not included), as a ``SELECT`` list."""
_JSON_NAMES = (*(c.name for c in _JOB_TABLE.columns if c.type is JSON and c.name in JOB_NAMES), "health_history")
_METRIC_NAMES = ("last_metrics", "metric_means")
"""JSON dicts of metric values, their non-finite values written as strings."""


def spans_column(dialect: Dialect) -> str:
    """A job's spans gathered from ``health_spans`` in their order, as the text of one JSON list (``'[]'``: none),
    in ``dialect``'s SQL: an expression of a ``SELECT`` (or ``RETURNING``) of ``jobs``."""
    return dialect.json_list("span", "health_spans WHERE health_spans.job_id = jobs.id", "seq")


@lru_cache(maxsize=2)
def job_columns(dialect: Dialect) -> str:
    """:data:`JOB_NAMES` as a ``SELECT`` (or ``RETURNING``) list of ``jobs`` in ``dialect``'s SQL: the row
    :func:`job_from_row` reads. The verdicts' spans come in the same statement, and so from the same snapshot
    as the row: a job's health and its history always agree."""
    return f"{ROW_COLUMNS}, {spans_column(dialect)}"


def store_float(value: float) -> float | str:
    """SQLite turns NaN into NULL: store it as the text 'NaN' (infinities are REAL)."""
    return "NaN" if math.isnan(value) else value


def load_float(value: Any) -> float:
    """A stored ``last`` back as a float (``NULL`` and ``'NaN'`` are NaN)."""
    return math.nan if value is None or value == "NaN" else float(value)


def job_from_row(row: tuple[Any, ...]) -> Job:
    """A job from a row of :func:`job_columns`: JSON columns decoded (a ``NULL`` one is ``None``), metric values
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
    encode = _ENCODERS.get(name)
    return value if encode is None else encode(value)


def column_values(updates: dict[str, Any]) -> list[Any]:
    """:func:`column_value` of each of a job's changed fields, in their order (a report's update has a dozen)."""
    encoders = _ENCODERS
    return [value if (encode := encoders.get(name)) is None else encode(value) for name, value in updates.items()]


def span_text(span: dict[str, Any]) -> str:
    """A verdict's span as ``health_spans.span`` stores it (the JSON :func:`job_from_row` reads back)."""
    return _loose(span)


def _metric_values(value: dict[str, float]) -> str:
    """Metric values as JSON, non-finite ones as strings (when every value is finite, the dict as it is)."""
    if all(map(math.isfinite, value.values())):
        return _dumps(value)
    return _dumps({k: encode_float(v) for k, v in value.items()})


_ORJSON_OPTIONS = 0 if orjson is None else orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
"""Dataclasses and datetimes go to ``default`` as the standard encoder sends them (orjson would write
a dataclass as a dict and a datetime in ISO form, not what ``str`` gives)."""


def _dumps(value: Any, default: Callable[[Any], Any] | None = None, *, ensure_ascii: bool = True) -> str:
    """JSON text of a job's column that :func:`job_from_row`'s ``json.loads`` reads back as the standard
    encoder's would, by orjson (~5x faster: a report's update writes two or three of these).

    orjson's text is compact and UTF-8 where the standard encoder escapes (``ensure_ascii``): the same value
    when read. Where orjson would write something else, the standard encoder writes it: what orjson refuses
    (an integer beyond 64 bits, a key that is not a string, a lone surrogate: ``TypeError``), and any text
    with ``null`` in it, which is where orjson writes a non-finite float the standard encoder keeps as
    ``NaN`` or ``Infinity`` (a ``None`` or a string holding ``null`` only costs the slower path).
    """
    if orjson is not None:
        try:
            text = orjson.dumps(value, default=default, option=_ORJSON_OPTIONS)
        except TypeError:
            pass
        else:
            if b"null" not in text:
                return text.decode()
    return json.dumps(value, default=default, ensure_ascii=ensure_ascii)


def _str_like_json(obj: Any) -> Any:
    """``default=str`` as the standard encoder applies it, for both encoders: a subclass of float (numpy's
    float64) is a number to the standard encoder (which never calls ``default`` for it), orjson hands it here."""
    return float(obj) if isinstance(obj, float) else str(obj)


def _loose(value: Any) -> str:
    return _dumps(value, _str_like_json)


def _trainer_status(value: Any) -> str | None:
    return None if value is None else _dumps(value, ensure_ascii=False)


_ENCODERS: dict[str, Callable[[Any], Any]] = {
    "params": _dumps,
    "last_metrics": _metric_values,
    "metric_means": _metric_values,
    "health_evidence": _loose,
    "policy": _loose,
    "policy_fired": _loose,
    "trainer_status": _trainer_status,
}
"""How each JSON column is written (:func:`column_value`); every other column stores its value as it is."""
