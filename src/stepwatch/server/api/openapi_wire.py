"""The OpenAPI schemas of the wire format, generated from :mod:`stepwatch.protocol`'s dataclasses.

Each message the protocol reads (a report, its windows, identity, progress, GPU readings, where a rank
stands, the commands of the answer, Kubeflow's ``trainerStatus``) gets one schema whose property names,
types, nullability, nesting and ``required`` come from the dataclass itself (its fields, their type hints
and which have a default), and whose bounds come from :data:`~stepwatch.protocol.LIMITS` through the one
table below, :data:`BOUNDS`; descriptions are the docstrings of the class and of its fields. So a field
added, renamed or retyped in the protocol shows in ``/openapi.json``
without anyone writing it twice, and ``tests/server/api/test_openapi_wire.py`` holds every bound of the table to
the protocol's own checks (the edge value passes, the next one is refused), so the two cannot drift.

Every integer anywhere is at most ``LIMITS.max_integer`` (what the protocol checks of every integer).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Mapping
from typing import Any

from ...protocol import (
    ACTIVITIES,
    API_VERSION,
    INT32_MAX,
    LIMITS,
    PHASES,
    Command,
    Frame,
    GpuReading,
    Identity,
    KubeflowMetric,
    MetricWindow,
    Progress,
    Report,
    ReportResponse,
    TrainerStatus,
    Where,
)

__all__ = ["BOUNDS", "READ_DEFAULTS", "WIRE_CLASSES", "dataclass_schema", "wire_schemas"]

WIRE_CLASSES: tuple[type, ...] = (
    MetricWindow,
    Identity,
    Progress,
    GpuReading,
    Frame,
    Where,
    Report,
    Command,
    ReportResponse,
    KubeflowMetric,
    TrainerStatus,
)
"""The messages described, each under its class name."""

_NUMBER_OR_NONFINITE = {"oneOf": [{"type": "number"}, {"enum": ["NaN", "Infinity", "-Infinity"]}]}
_RUN_ID = {"minLength": 1, "maxLength": LIMITS.max_run_id_length, "pattern": "^[A-Za-z0-9._-]+$"}
_METRIC_NAME = {"minLength": 1, "maxLength": LIMITS.max_metric_name_length}
_AT_LEAST_0 = {"minimum": 0}

BOUNDS: dict[tuple[type, str], dict[str, Any]] = {
    (MetricWindow, "name"): _METRIC_NAME,
    (MetricWindow, "count"): {"minimum": 1},
    (MetricWindow, "nonfinite"): _AT_LEAST_0,
    (MetricWindow, "first_step"): _AT_LEAST_0,
    (MetricWindow, "last_step"): _AT_LEAST_0,
    (Identity, "rank"): {"minimum": 0, "maximum": LIMITS.max_world_size - 1},  # and below world_size
    (Identity, "world_size"): {"minimum": 1, "maximum": LIMITS.max_world_size},
    (Identity, "local_rank"): {"minimum": 0, "maximum": LIMITS.max_world_size},
    (Identity, "host"): {"maxLength": LIMITS.max_host_length},
    (Identity, "pid"): _AT_LEAST_0,
    (Progress, "step"): _AT_LEAST_0,
    (Progress, "total_steps"): {"minimum": 1},
    (Progress, "epoch"): _AT_LEAST_0,
    (Progress, "total_epochs"): {"exclusiveMinimum": 0},
    (Progress, "samples"): _AT_LEAST_0,
    (Progress, "steps_per_second"): _AT_LEAST_0,
    (Progress, "samples_per_second"): _AT_LEAST_0,
    (Progress, "step_time"): _AT_LEAST_0,
    (Progress, "eta_seconds"): _AT_LEAST_0,
    (Progress, "phase"): {"enum": [*PHASES, None]},
    (Progress, "phase_seconds"): _AT_LEAST_0,
    (GpuReading, "index"): {"minimum": 0, "maximum": LIMITS.max_gpus_per_report * 1024},
    (GpuReading, "utilization"): {"minimum": 0, "maximum": 100},
    (GpuReading, "memory_used"): _AT_LEAST_0,
    (GpuReading, "memory_total"): _AT_LEAST_0,
    (Frame, "function"): {"minLength": 1, "maxLength": LIMITS.max_frame_function_length},
    (Frame, "file"): {"minLength": 1, "maxLength": LIMITS.max_frame_file_length},
    (Frame, "line"): _AT_LEAST_0,
    (Where, "activity"): {"enum": list(ACTIVITIES)},
    (Where, "stood_seconds"): _AT_LEAST_0,
    (Where, "detail"): {"maxLength": LIMITS.max_where_detail_length},
    (Where, "frames"): {"maxItems": LIMITS.max_where_frames},
    (Where, "samples"): {"minimum": 1},
    (Report, "run_id"): _RUN_ID,
    (Report, "seq"): _AT_LEAST_0,
    (Report, "sent_at"): _AT_LEAST_0,
    (Report, "metrics"): {"maxItems": LIMITS.max_metrics_per_report},
    (Report, "params"): {
        "maxProperties": LIMITS.max_params,
        "propertyNames": {"minLength": 1, "maxLength": LIMITS.max_param_key_length},
        "additionalProperties": {"maxLength": LIMITS.max_param_value_length},
    },
    (Report, "acks"): {"maxItems": LIMITS.max_acks, "items": _RUN_ID},
    (Report, "reason"): {"maxLength": LIMITS.max_reason_length},
    (Report, "gpus"): {"maxItems": LIMITS.max_gpus_per_report},
    (Report, "activity_shares"): {
        "maxProperties": len(ACTIVITIES),
        "propertyNames": {"enum": list(ACTIVITIES)},
        "additionalProperties": {"minimum": 0, "maximum": 1},
    },
    (Command, "id"): _RUN_ID,
    (Command, "reason"): {"maxLength": LIMITS.max_reason_length},
    (ReportResponse, "accepted_seq"): _AT_LEAST_0,
    (ReportResponse, "commands"): {"maxItems": LIMITS.max_commands},
    (KubeflowMetric, "name"): _METRIC_NAME,
    (KubeflowMetric, "value"): {"minLength": 1, "maxLength": LIMITS.max_metric_value_length},
    (TrainerStatus, "progress_percentage"): {"minimum": 0, "maximum": 100},
    (TrainerStatus, "estimated_remaining_seconds"): {"minimum": 0, "maximum": INT32_MAX},
    (TrainerStatus, "metrics"): {"maxItems": LIMITS.max_metrics_per_report},
}
"""The bounds of each field the protocol checks, from :data:`~stepwatch.protocol.LIMITS` (merged into the
schema the field's type gives; ``items``, ``additionalProperties`` and ``propertyNames`` merge one level down)."""

_WIRE_TYPES: dict[tuple[type, str], dict[str, Any]] = {
    (MetricWindow, "last"): _NUMBER_OR_NONFINITE,
    (TrainerStatus, "metrics"): {
        "type": ["array", "null"],  # null is no metrics, as upstream's decoder reads it
        "items": {"$ref": "#/components/schemas/KubeflowMetric"},
    },
    (TrainerStatus, "last_updated_time"): {"type": "string", "format": "date-time", "description": "kept as sent"},
}
"""Where the wire differs from the field's Python type: a float that travels as a number or one of the three
non-finite strings, and Kubeflow's fields as upstream's status server reads them."""

READ_DEFAULTS: dict[type, frozenset[str]] = {
    MetricWindow: frozenset({"min", "max", "mean", "nonfinite"}),
}
"""Fields without a default in the dataclass that its ``from_dict`` fills in when absent (null, 0)."""

_REQUIRED_ON_THE_WIRE: dict[type, tuple[str, ...]] = {TrainerStatus: ("last_updated_time",)}
"""Fields with a default in the dataclass that a request must carry (upstream's TrainJob CRD)."""

_CAMEL_CASE = frozenset({TrainerStatus, KubeflowMetric})
"""Kubeflow's messages name their fields in camelCase on the wire."""

_EXTRA_PROPERTIES: dict[type, dict[str, Any]] = {Report: {"api_version": {"const": API_VERSION}}}
"""What travels besides the fields: the report's API version."""

_SCALARS: dict[Any, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _wire_name(cls: type, name: str) -> str:
    if cls not in _CAMEL_CASE:
        return name
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _type_schema(hint: Any) -> dict[str, Any]:
    """The JSON schema of a Python type hint of the protocol: scalars, ``X | None``, unions of scalars,
    ``Literal``, ``tuple[X, ...]``, ``Mapping[str, X]`` and the protocol's own dataclasses (a reference)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SCALARS:
        schema: dict[str, Any] = {"type": _SCALARS[hint]}
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
        schema = {"$ref": f"#/components/schemas/{hint.__name__}"}
    elif origin is typing.Literal:
        schema = {"enum": list(args)}
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        schema = {"type": "array", "items": _type_schema(args[0])}
    elif origin is Mapping and args and args[0] is str:
        schema = {"type": "object", "additionalProperties": _type_schema(args[1])}
    elif origin in (typing.Union, types.UnionType):
        schema = _union_schema(args)
    else:
        raise TypeError(f"no JSON schema for the type {hint!r}: teach openapi_wire._type_schema")
    kinds = schema.get("type")
    if kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds):
        schema["maximum"] = LIMITS.max_integer
    return schema


def _union_schema(args: tuple[Any, ...]) -> dict[str, Any]:
    """``X | None`` (nullable ``X``) and unions of scalars (a list of types)."""
    nullable = type(None) in args
    kinds = [arg for arg in args if arg is not type(None)]
    if all(kind in _SCALARS for kind in kinds):
        names = [_SCALARS[kind] for kind in kinds]
        if len(names) > 1 and "integer" in names and "number" in names:
            names.remove("integer")  # a number already admits every integer
        return {"type": [*names, "null"] if nullable else names if len(names) > 1 else names[0]}
    if len(kinds) != 1:
        raise TypeError(f"no JSON schema for a union of {kinds!r}")
    inner = _type_schema(kinds[0])
    if not nullable:
        return inner
    if isinstance(inner.get("type"), str):
        return {**inner, "type": [inner["type"], "null"]}
    return {"anyOf": [inner, {"type": "null"}]}


def _bounded(schema: dict[str, Any], bounds: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(schema)
    for key, value in bounds.items():
        if key in ("items", "additionalProperties", "propertyNames") and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _described(cls: type) -> str:
    """A class's docstring on one line."""
    return re.sub(r"\s+", " ", (cls.__doc__ or "").strip())


def _field_notes(cls: type) -> dict[str, str]:
    """The docstrings written under a dataclass's fields (read from its source), each on one line; none
    where the source cannot be read (a build without ``.py`` files)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    notes: dict[str, str] = {}
    for field, after in itertools.pairwise(body):
        if (
            isinstance(field, ast.AnnAssign)
            and isinstance(field.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            notes[field.target.id] = re.sub(r"\s+", " ", after.value.value.strip())
    return notes


def dataclass_schema(cls: type) -> dict[str, Any]:
    """The JSON schema of one of the protocol's messages, from its dataclass (see the module docstring)."""
    hints = typing.get_type_hints(cls)
    notes = _field_notes(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in dataclasses.fields(cls):
        name = _wire_name(cls, field.name)
        schema = _WIRE_TYPES.get((cls, field.name)) or _type_schema(hints[field.name])
        properties[name] = _bounded(schema, BOUNDS.get((cls, field.name), {}))
        if field.name in notes and "description" not in properties[name]:
            properties[name]["description"] = notes[field.name]
        has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
        if (
            not has_default and field.name not in READ_DEFAULTS.get(cls, ())
        ) or field.name in _REQUIRED_ON_THE_WIRE.get(cls, ()):
            required.append(name)
    schema = {
        "type": "object",
        "description": _described(cls),
        "properties": {**_EXTRA_PROPERTIES.get(cls, {}), **properties},
    }
    if required:
        schema["required"] = required
    return schema


def _trainer_status_body() -> dict[str, Any]:
    return {
        "type": "object",
        "description": (
            "Kubeflow Trainer's UpdateTrainJobStatusRequest, checked as upstream's status server and TrainJob CRD "
            "do: each POST replaces the whole trainerStatus (every reader shows it as posted; stepwatch also "
            "keeps it as history); a body without trainerStatus (or null) is answered 200 and changes nothing; "
            "checks run in upstream's order: size (413), token (403), body (422). See docs/kubernetes.md, "
            "Conformance."
        ),
        "properties": {"trainerStatus": {"anyOf": [{"$ref": "#/components/schemas/TrainerStatus"}, {"type": "null"}]}},
    }


@functools.cache
def wire_schemas() -> dict[str, Any]:
    """The wire format's messages, as :mod:`stepwatch.protocol` reads them, by name (made at the first call:
    reading the fields' docstrings from the source costs some 50 ms, which a server's start need not pay)."""
    return {
        **{cls.__name__: dataclass_schema(cls) for cls in WIRE_CLASSES},
        "TrainerStatusBody": _trainer_status_body(),
    }
