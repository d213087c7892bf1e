"""The wire format's OpenAPI schemas, generated from the protocol's dataclasses (``server/api/openapi_wire.py``),
against the protocol itself: the bodies a real report core sends validate; what the server refuses, the schema
refuses; every bound the schema states is the protocol's edge (the value on it is read, the next one refused,
by both); a field is required in the schema exactly when the protocol refuses a body without it."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import stepwatch
from stepwatch.protocol import (
    ACTIVITIES,
    INT32_MAX,
    LIMITS,
    Command,
    Frame,
    GpuReading,
    Identity,
    KubeflowMetric,
    MetricWindow,
    Progress,
    ProtocolError,
    Report,
    ReportResponse,
    TrainerStatus,
    Where,
)
from stepwatch.server.api.openapi import openapi_document
from stepwatch.server.api.openapi_wire import WIRE_CLASSES, wire_schemas
from stepwatch.testing import ReportSink

jsonschema = pytest.importorskip("jsonschema")

TIME = "2026-12-02T15:04:05Z"
TOP = LIMITS.max_integer
BASES: dict[type, dict[str, Any]] = {
    MetricWindow: {
        "name": "loss",
        "last": 0.5,
        "min": 0.1,
        "max": 0.9,
        "mean": 0.5,
        "count": 4,
        "nonfinite": 0,
        "first_step": 1,
        "last_step": 4,
    },
    Identity: {"rank": 0, "world_size": 2, "local_rank": 0, "host": "node-1", "pid": 42},
    Progress: {"step": 4, "total_steps": 10, "epoch": 0.5, "total_epochs": 2.0, "phase": "train"},
    GpuReading: {"index": 0, "utilization": 50.0, "memory_used": 1, "memory_total": 2},
    Frame: {"function": "train", "file": "train.py", "line": 3},
    Where: {"activity": "computing", "stood_seconds": 3.0, "detail": "torch.save", "samples": 2},
    Report: {"api_version": "v1", "run_id": "run-1", "seq": 1, "sent_at": 1.8e9, "reason": "x", "acks": ["c-1"]},
    Command: {"id": "c-1", "kind": "stop", "reason": "asked"},
    ReportResponse: {"accepted_seq": 1, "commands": []},
    KubeflowMetric: {"name": "loss", "value": "0.5"},
    TrainerStatus: {"progressPercentage": 40, "estimatedRemainingSeconds": 60, "lastUpdatedTime": TIME},
}
"""A valid body of each message, on the wire."""

ALL_NONFINITE = {**BASES[MetricWindow], "last": "NaN", "min": None, "max": None, "mean": None, "nonfinite": 4}
"""A window whose every value was non-finite: it has no min, max or mean."""
CONTEXT: dict[tuple[type, str, str], dict[str, Any]] = {
    (MetricWindow, "nonfinite", "maximum"): {**ALL_NONFINITE, "count": TOP},  # nonfinite counts some of count
    (MetricWindow, "first_step", "maximum"): {"last_step": TOP},  # first_step <= last_step
    (MetricWindow, "last_step", "minimum"): {"first_step": 0},
    (Identity, "rank", "maximum"): {"world_size": LIMITS.max_world_size},  # rank < world_size
}
"""What else a body needs for one field to stand on its edge (the checks that tie two fields)."""

ITEMS: dict[tuple[type, str], Callable[[int], Any]] = {
    (Report, "metrics"): lambda i: {**BASES[MetricWindow], "name": f"m{i}"},
    (Report, "acks"): lambda i: f"c-{i}",
    (Report, "gpus"): lambda i: {"index": i},
    (Where, "frames"): lambda i: BASES[Frame],
    (ReportResponse, "commands"): lambda i: {"id": f"c-{i}", "kind": "stop"},
    (TrainerStatus, "metrics"): lambda i: {"name": f"m{i}", "value": "1"},
}


def _read(cls: type, body: Any) -> Any:
    """The protocol's reading of a body, as the server reads it (``ProtocolError`` when it refuses it)."""
    if cls is KubeflowMetric:
        return TrainerStatus.from_request({"trainerStatus": {"lastUpdatedTime": TIME, "metrics": [body]}})
    if cls is TrainerStatus:
        return TrainerStatus.from_request({"trainerStatus": body})
    return cls.from_dict(body)  # type: ignore[attr-defined]


def _validator(name: str) -> Any:
    document = openapi_document("test")
    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return jsonschema.Draft202012Validator(schema)


VALIDATORS = {cls: _validator(cls.__name__) for cls in WIRE_CLASSES}


def _agree(cls: type, body: dict[str, Any], accepted: bool, why: str) -> None:
    try:
        _read(cls, body)
        protocol_reads = True
    except ProtocolError:
        protocol_reads = False
    schema_takes = VALIDATORS[cls].is_valid(body)
    assert (protocol_reads, schema_takes) == (accepted, accepted), f"{cls.__name__} {why}: {body}"


def _edges(cls: type, name: str, schema: dict[str, Any]) -> Iterator[tuple[str, Any, bool]]:
    """(what, value, accepted) on and past each bound the property states."""
    kinds = schema.get("type", [])
    whole = "integer" in kinds
    if "minimum" in schema:
        yield "minimum", schema["minimum"], True
        yield "below minimum", schema["minimum"] - (1 if whole else 0.5), False
    if "maximum" in schema:
        yield "maximum", schema["maximum"], True
        yield "above maximum", schema["maximum"] + (1 if whole else 0.5), False
    if "exclusiveMinimum" in schema:
        yield "just above", schema["exclusiveMinimum"] + 1e-9, True
        yield "exclusiveMinimum", schema["exclusiveMinimum"], False
    if "minLength" in schema:
        yield "minLength", "a" * schema["minLength"], True
        yield "below minLength", "a" * (schema["minLength"] - 1), False
    if "maxLength" in schema:
        yield "maxLength", "a" * schema["maxLength"], True
        yield "above maxLength", "a" * (schema["maxLength"] + 1), False
    if "pattern" in schema:
        yield "off pattern", "a b", False
    if "enum" in schema:
        yield from (("enum", value, True) for value in schema["enum"])
        yield "off enum", "no-such-value", False
    if "maxItems" in schema:
        make = ITEMS[(cls, name)]
        yield "maxItems", [make(i) for i in range(schema["maxItems"])], True
        yield "above maxItems", [make(i) for i in range(schema["maxItems"] + 1)], False


@pytest.mark.parametrize("cls", WIRE_CLASSES, ids=lambda c: c.__name__)
def test_each_bound_of_the_schema_is_the_protocols_edge(cls: type) -> None:
    probed = 0
    for name, schema in wire_schemas()[cls.__name__]["properties"].items():
        for what, value, accepted in _edges(cls, name, schema):
            context = CONTEXT.get((cls, name, what), {})
            _agree(cls, {**BASES[cls], **context, name: value}, accepted, f"{name} {what}")
            probed += 1
    assert probed >= 2


@pytest.mark.parametrize("cls", WIRE_CLASSES, ids=lambda c: c.__name__)
def test_a_field_is_required_exactly_when_the_protocol_refuses_every_body_without_it(cls: type) -> None:
    """(A window's min, max and mean may be absent only when every value was non-finite: the schema, which
    cannot compare two fields, says they are optional, and its description says when.)"""
    schema = wire_schemas()[cls.__name__]
    bases = [BASES[cls], *([ALL_NONFINITE] if cls is MetricWindow else [])]
    for base in bases:
        _agree(cls, base, True, "as it is")
    for name in schema["properties"]:
        read = []
        for base in bases:
            body = {k: v for k, v in base.items() if k != name}
            try:
                _read(cls, body)
                read.append(True)
            except ProtocolError:
                read.append(False)
            if name in schema.get("required", []):
                assert not VALIDATORS[cls].is_valid(body), f"{cls.__name__} without {name}"
        assert any(read) == (name not in schema.get("required", [])), f"{cls.__name__} without {name}: {read}"


def test_the_bodies_a_real_report_core_sends_validate(sink: ReportSink) -> None:
    run = stepwatch.init(job="wire", url=sink.url, interval=0.05, total_steps=100, params={"lr": 0.1, "opt": "adam"})
    for step in range(1, 6):
        run.step(step, loss=1.0 / step, grad_norm=math.nan if step == 5 else 2.0, lr=math.inf if step == 4 else 0.1)
    assert run.finish() is True
    bodies = [received.json() for received in sink.received if received.path.endswith("/reports")]
    assert bodies and any(b.get("params") for b in bodies) and bodies[-1]["state"] == "finished"
    assert any(m["last"] == "NaN" for b in bodies for m in b["metrics"])  # the last grad_norm
    assert any(m["nonfinite"] and m["name"] == "lr" for b in bodies for m in b["metrics"])
    for body in bodies:
        VALIDATORS[Report].validate(body)


def test_what_the_report_core_builds_of_every_part_validates() -> None:
    """The parts a short run above does not send (a heartbeat rank, GPUs, where it stands, activity shares, the
    answer with commands, a Kubeflow status), built by the protocol as the report core and server build them."""
    where = Where("communicating", 40.0, "torch.distributed.all_reduce", (Frame("step", "train.py", 31),), 3)
    report = Report(
        run_id="run-2",
        seq=9,
        sent_at=1.8e9,
        identity=Identity(rank=1, world_size=4, local_rank=1, host="node-2", pid=7),
        progress=Progress(step=29, step_time=0.4, phase="eval", phase_seconds=2.0),
        gpus=(GpuReading(0, 97.0, 1 << 30, 1 << 34),),
        where=where,
        activity_shares=dict.fromkeys(ACTIVITIES, 1 / len(ACTIVITIES)),
        state="stopped",
        reason="asked to stop",
    )
    VALIDATORS[Report].validate(report.to_dict())
    answer = ReportResponse(9, (Command("c-1", "checkpoint", "policy"), Command("c-2", "stop")))
    VALIDATORS[ReportResponse].validate(answer.to_dict())
    status = TrainerStatus(40, INT32_MAX, (KubeflowMetric("loss", "0.25"),), TIME)
    _validator("TrainerStatusBody").validate(status.to_body())
    _validator("TrainerStatusBody").validate({"trainerStatus": None})


@pytest.mark.parametrize(
    ("cls", "change", "why"),
    [
        (MetricWindow, {"count": 0}, "a window of no value"),
        (MetricWindow, {"name": "x" * 65}, "a metric name over 64 characters"),
        (MetricWindow, {"last": "nan"}, "a non-finite value not in its wire spelling"),
        (Report, {"run_id": "run 1"}, "a run id with a space"),
        (Report, {"seq": TOP + 1}, "an integer JavaScript cannot read exactly"),
        (Report, {"state": "paused"}, "no such state"),
        (Report, {"metrics": [BASES[MetricWindow]] * 2 + [{}] * 255}, "257 metrics"),
        (Report, {"activity_shares": {"dreaming": 0.1}}, "no such activity"),
        (Report, {"activity_shares": {"computing": 1.5}}, "a share over 1"),
        (Report, {"params": {"k": "v" * 257}}, "a parameter value over 256 characters"),
        (Report, {"params": {"k" * 65: 1}}, "a parameter name over 64 characters"),
        (Report, {"acks": ["c 1"]}, "an acknowledgement that is no command id"),
        (Progress, {"step": -1}, "a negative step"),
        (Progress, {"step": 1.5}, "a step between two"),
        (Progress, {"total_epochs": 0}, "no epochs to run"),
        (Where, {"frames": [{"function": "f", "file": "x.py"}]}, "a frame without its line"),
        (TrainerStatus, {"lastUpdatedTime": None}, "a status without its time"),
        (TrainerStatus, {"progressPercentage": 101}, "over 100 %"),
        (TrainerStatus, {"estimatedRemainingSeconds": INT32_MAX + 1}, "an ETA over int32"),
    ],
)
def test_what_the_server_refuses_the_schema_refuses(cls: type, change: dict[str, Any], why: str) -> None:
    _agree(cls, {**copy.deepcopy(BASES[cls]), **change}, False, why)
