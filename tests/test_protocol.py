"""The wire format: round trips, every limit, malformed input, window merging, paths and times.

Bodies are built as the JSON a client sends (plain dicts), passed through real JSON, and read back with
the ``from_dict``/``from_body`` of the message; every rejection is checked for its exact JSON path
(``ProtocolError.field``) and for a message that says what was expected. Several tests pin down
bugs found and fixed in review (trailing newlines in names, deep nesting, overflowing merges, RFC 3339
forms that ``datetime.fromisoformat`` accepts but RFC 3339 does not).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import datetime as dt
import functools
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from stepwatch import protocol
from stepwatch.protocol import (
    API_VERSION,
    COMMAND_KINDS,
    LIMITS,
    REPORT_STATES,
    BodyTooLarge,
    Command,
    Identity,
    KubeflowMetric,
    Limits,
    MetricWindow,
    Progress,
    ProtocolError,
    Report,
    ReportResponse,
    TrainerStatus,
    decode_body,
    decode_float,
    encode_body,
    encode_float,
    format_rfc3339,
    is_valid_metric_name,
    is_valid_name,
    kubeflow_status_path,
    parse_rfc3339,
    report_path,
    sanitize_name,
    validate_metric_name,
    validate_name,
)

NAN, INF = math.nan, math.inf
T0 = 1_796_223_845.25  # 2026-12-02T15:04:05.25Z

# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def wire(obj: Any) -> Any:
    """``obj`` as the server sees it after a trip through standard JSON."""
    return json.loads(encode_body(obj))


def lenient(obj: Any) -> Any:
    """``obj`` as sent by a lenient client: bare ``NaN``/``Infinity`` tokens, read by decode_body."""
    return decode_body(json.dumps(obj).encode())


def strict_json(body: bytes) -> Any:
    """Parse ``body`` as standard JSON, failing on any NaN/Infinity token."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"non-standard JSON token {token!r} in {body[:200]!r}")

    return json.loads(body, parse_constant=refuse)


def rejected(call: Callable[[], Any], field: str, *expected: str) -> ProtocolError:
    """``call()`` raises ProtocolError at JSON path ``field`` whose message contains each of ``expected``."""
    with pytest.raises(ProtocolError) as info:
        call()
    error = info.value
    assert error.field == field, f"field {error.field!r} != {field!r} ({error})"
    for text in expected:
        assert text in error.message, f"{text!r} not in message {error.message!r}"
    assert str(error) == (f"{field}: {error.message}" if field else error.message)
    return error


def same(a: Any, b: Any) -> bool:
    """Deep equality of decoded messages, of the same types, where NaN equals NaN."""
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def window_of(values: Sequence[float], name: str = "loss", first_step: int = 0) -> MetricWindow:
    """Reference: the window of ``values`` logged at consecutive steps from ``first_step``."""
    finite = [v for v in values if math.isfinite(v)]
    return MetricWindow(
        name=name,
        last=values[-1],
        min=min(finite) if finite else None,
        max=max(finite) if finite else None,
        mean=math.fsum(finite) / len(finite) if finite else None,
        count=len(values),
        nonfinite=len(values) - len(finite),
        first_step=first_step,
        last_step=first_step + len(values) - 1,
    )


# Bodies as clients send them; ``**over`` replaces or adds fields.


def report(**over: Any) -> dict[str, Any]:
    return {"run_id": "run-1", "seq": 0, "sent_at": T0, **over}


def where(**over: Any) -> dict[str, Any]:
    """A reading of where a rank stands (``Report.where``)."""
    return {"activity": "communicating", "stood_seconds": 61.5, "detail": "torch.distributed.all_reduce", **over}


def frame(**over: Any) -> dict[str, Any]:
    return {"function": "train_step", "file": "train.py", "line": 31, **over}


def window(name: str = "loss", **over: Any) -> dict[str, Any]:
    body = {"name": name, "last": 1.0, "min": 1.0, "max": 1.0, "mean": 1.0, "count": 1, "nonfinite": 0}
    return {**body, "first_step": 0, "last_step": 0, **over}


def windows(n: int) -> list[dict[str, Any]]:
    return [window(f"m{i}") for i in range(n)]


def status(**fields: Any) -> dict[str, Any]:
    return {"trainerStatus": fields}


def kf_metrics(n: int) -> list[dict[str, str]]:
    return [{"name": f"m{i}", "value": str(i)} for i in range(n)]


def command(**over: Any) -> dict[str, Any]:
    return {"id": "cmd-1", "kind": "stop", "reason": "", **over}


def response(**over: Any) -> dict[str, Any]:
    return {"accepted_seq": 0, **over}


# --------------------------------------------------------------------------------------------------
# 1. Round trips and standard JSON
# --------------------------------------------------------------------------------------------------

RICH_METRICS = (
    window_of([2.5, 2.25, 2.0], "train/loss", first_step=100),
    window_of([1.0, NAN], "train/grad_norm", first_step=101),  # last is NaN
    window_of([3e-4, INF], "learning_rate", first_step=101),  # last is +Inf
    window_of([-0.5, -INF], "rewards/chosen", first_step=101),  # last is -Inf
    window_of([NAN, INF, -INF], "eval/perplexity", first_step=90),  # nothing finite: min/max/mean None
    window_of([NAN], "eval/nan_only", first_step=102),
    window_of([0.875], "eval_accuracy", first_step=102),
    window_of([1e-12, -1e300, 1e300], "précision moyenne (val)", first_step=0),
)
PARAMS = {"model": "llama-3-8b", "lr": 3e-4, "batch_size": 32, "bf16": True, "resume": False}
PARAMS |= {"warmup": None, "notes": "", "big": 2**62, "scale": 2.0, "ünï côdé": "✓"}


def rich_report(state: str = "running", reason: str = "", metrics: tuple[MetricWindow, ...] = RICH_METRICS) -> Report:
    return Report(
        run_id="2026-12-02_run.A-7",
        seq=41,
        sent_at=T0,
        identity=Identity(rank=3, world_size=8, local_rank=3, host="node-7.cluster.local", pid=4242),
        progress=Progress(
            step=102,
            total_steps=1000,
            epoch=0.25,
            total_epochs=3.0,
            samples=3264,
            steps_per_second=4.5,
            samples_per_second=144.0,
            step_time=0.222,
            eta_seconds=200.0,
        ),
        metrics=metrics,
        params=PARAMS,
        acks=("cmd-1", "cmd.2_b"),
        state=state,  # type: ignore[arg-type]
        reason=reason,
    )


DECODERS = [pytest.param(json.loads, id="json.loads"), pytest.param(decode_body, id="decode_body")]
STATES = [
    ("running", ""),
    ("finished", ""),
    ("failed", "CUDA out of memory at step 102"),
    ("stopped", "stopped by ann"),
]


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize(("state", "reason"), STATES)
def test_report_round_trip(decode: Callable[[Any], Any], state: str, reason: str) -> None:
    original = rich_report(state, reason)
    decoded = Report.from_dict(decode(encode_body(original.to_dict())))
    assert same(decoded, original)
    assert decoded.to_dict() == original.to_dict()
    assert decoded.params is not None
    assert [type(v) for v in decoded.params.values()] == [type(v) for v in PARAMS.values()]


@pytest.mark.parametrize("decode", DECODERS)
def test_report_round_trip_is_equal_without_nan(decode: Callable[[Any], Any]) -> None:
    original = rich_report(metrics=tuple(m for m in RICH_METRICS if not math.isnan(m.last)))
    assert Report.from_dict(decode(encode_body(original.to_dict()))) == original


@pytest.mark.parametrize(
    "original",
    [
        Report(run_id="r", seq=0, sent_at=0.0),
        Report(run_id="r", seq=1, sent_at=T0, params={}),
        Report(run_id="r", seq=2, sent_at=T0, progress=Progress(step=0, epoch=1.0), identity=Identity(rank=0)),
    ],
    ids=["minimal", "empty-params", "partial-progress"],
)
def test_small_report_round_trip(original: Report) -> None:
    assert Report.from_dict(decode_body(encode_body(original.to_dict()))) == original


def test_window_round_trip_keeps_non_finite_last() -> None:
    for original in RICH_METRICS:
        decoded = MetricWindow.from_dict(wire(original.to_dict()))
        assert same(decoded, original), original.name


@pytest.mark.parametrize("n_commands", [0, 1, LIMITS.max_commands])
@pytest.mark.parametrize("decode", DECODERS)
def test_report_response_round_trip(decode: Callable[[Any], Any], n_commands: int) -> None:
    commands = tuple(
        Command(id=f"cmd-{i}", kind=COMMAND_KINDS[i % 2], reason="requested by ann" if i % 3 else "")  # type: ignore[arg-type]
        for i in range(n_commands)
    )
    original = ReportResponse(accepted_seq=41, commands=commands)
    assert ReportResponse.from_dict(decode(encode_body(original.to_dict()))) == original


TRAINER_STATUSES = {
    "empty": TrainerStatus(),
    "full": TrainerStatus(
        progress_percentage=42,
        estimated_remaining_seconds=3600,
        metrics=(KubeflowMetric("loss", "0.1234"), KubeflowMetric("eval_accuracy", "nan")),
        last_updated_time="2026-12-02T15:04:05Z",
    ),
    "bounds": TrainerStatus(progress_percentage=100, estimated_remaining_seconds=0, metrics=()),
    "max-metrics": TrainerStatus(
        metrics=tuple(KubeflowMetric(f"m{i}", str(i)) for i in range(LIMITS.max_metrics_per_report))
    ),
}


@pytest.mark.parametrize("original", TRAINER_STATUSES.values(), ids=TRAINER_STATUSES.keys())
@pytest.mark.parametrize("decode", DECODERS)
def test_trainer_status_round_trip(decode: Callable[[Any], Any], original: TrainerStatus) -> None:
    assert TrainerStatus.from_body(decode(encode_body(original.to_body()))) == original


def test_trainer_status_body_omits_unknown_fields() -> None:
    assert TrainerStatus().to_body() == {"trainerStatus": {}}
    assert TrainerStatus(progress_percentage=0).to_body() == {"trainerStatus": {"progressPercentage": 0}}


def test_an_upstream_request_without_a_status_is_none_and_a_status_needs_its_time() -> None:
    """Upstream's UpdateTrainJobStatusRequest (kubeflow/trainer pkg/statusserver/server.go) and the CRD's
    ``has(self.lastUpdatedTime)`` rule; ``metrics: null`` is no metrics, as Go's decoder reads it."""
    assert TrainerStatus.from_request({}) is None
    assert TrainerStatus.from_request({"trainerStatus": None}) is None
    rejected(lambda: TrainerStatus.from_request({"trainerStatus": {}}), "trainerStatus.lastUpdatedTime", "required")
    rejected(lambda: TrainerStatus.from_request({"trainerStatus": []}), "trainerStatus", "must be a JSON object")
    read = TrainerStatus.from_request({"trainerStatus": {"lastUpdatedTime": "2026-01-02T03:04:05Z", "metrics": None}})
    assert read == TrainerStatus(last_updated_time="2026-01-02T03:04:05Z")
    body = {"trainerStatus": {"lastUpdatedTime": "2026-01-02T03:04:05Z", "estimatedRemainingSeconds": 2**31}}
    rejected(lambda: TrainerStatus.from_request(body), "trainerStatus.estimatedRemainingSeconds", "<= 2147483647")


def test_trainer_status_from_upstream_sdk() -> None:
    """What ``kubeflow.trainer.update_trainjob_status`` and transformers' KubeflowCallback send."""
    body = status(
        progressPercentage=42,
        estimatedRemainingSeconds=3600,
        metrics=[
            {"name": "current_step", "value": "420"},
            {"name": "loss", "value": str(0.123456789012345678)},
            {"name": "eval_accuracy", "value": "0.9"},
        ],
        lastUpdatedTime=dt.datetime.now(dt.timezone.utc).isoformat(),
    )
    parsed = TrainerStatus.from_body(decode_body(json.dumps(body).encode()))
    assert parsed.progress_percentage == 42
    assert [m.name for m in parsed.metrics] == ["current_step", "loss", "eval_accuracy"]


def test_encoded_bodies_are_standard_json() -> None:
    body = encode_body(rich_report().to_dict())
    parsed = strict_json(body)
    lasts = {m["name"]: m["last"] for m in parsed["metrics"]}
    assert lasts["train/grad_norm"] == "NaN"
    assert lasts["learning_rate"] == "Infinity"
    assert lasts["rewards/chosen"] == "-Infinity"
    perplexity = next(m for m in parsed["metrics"] if m["name"] == "eval/perplexity")
    assert (perplexity["min"], perplexity["max"], perplexity["mean"]) == (None, None, None)
    assert perplexity["count"] == perplexity["nonfinite"] == 3
    assert "précision moyenne (val)".encode() in body  # UTF-8, not \u escapes
    assert b": " not in body
    assert b", " not in body  # compact


def test_encode_body_refuses_raw_non_finite_floats() -> None:
    with pytest.raises(ValueError):
        encode_body({"x": NAN})


@pytest.mark.parametrize(
    ("value", "wire_value"),
    [(NAN, "NaN"), (INF, "Infinity"), (-INF, "-Infinity"), (1.5, 1.5), (0.0, 0.0), (-2.0, -2.0), (1e308, 1e308)],
)
def test_encode_and_decode_float(value: float, wire_value: float | str) -> None:
    encoded = encode_float(value)
    assert encoded == wire_value
    decoded = decode_float(json.loads(json.dumps(encoded)), "x")
    assert type(decoded) is float
    assert same(decoded, value)


@pytest.mark.parametrize(("value", "expected"), [(3, 3.0), (-7, -7.0), (NAN, NAN), (-INF, -INF)])
def test_decode_float_accepts_numbers_and_bare_constants(value: float, expected: float) -> None:
    decoded = decode_float(value, "x")
    assert type(decoded) is float
    assert same(decoded, expected)


@pytest.mark.parametrize("value", [True, False, None, "nan", "inf", "-inf", "+Infinity", "1.0", "", [], {}])
def test_decode_float_rejects(value: object) -> None:
    rejected(lambda: decode_float(value, "metrics[2].last"), "metrics[2].last", "must be a number")


def test_decode_body_accepts_bare_non_finite_tokens() -> None:
    body = report(metrics=[window("a", last=NAN), window("b", last=INF), window("c", last=-INF)])
    raw = json.dumps(body).encode()
    assert b"NaN" in raw
    assert b"-Infinity" in raw
    parsed = Report.from_dict(decode_body(raw))
    lasts = [m.last for m in parsed.metrics]
    assert math.isnan(lasts[0])
    assert lasts[1:] == [INF, -INF]


def test_encode_float_of_numpy_nan() -> None:
    np = pytest.importorskip("numpy", exc_type=ImportError)
    assert encode_float(np.float64("nan")) == "NaN"


# --------------------------------------------------------------------------------------------------
# 2. Limits
# --------------------------------------------------------------------------------------------------


def test_documented_limit_values() -> None:
    """DESIGN.md "Limits" and the Kubeflow section fix these numbers."""
    assert (LIMITS.max_body_bytes, LIMITS.max_name_length, LIMITS.max_metric_name_length) == (64 * 1024, 63, 64)
    assert (LIMITS.max_metrics_per_report, LIMITS.max_metric_value_length) == (256, 64)
    assert API_VERSION == "v1"
    assert REPORT_STATES == ("running", "finished", "failed", "stopped")
    assert COMMAND_KINDS == ("stop", "checkpoint")


@dataclasses.dataclass(frozen=True)
class LimitCase:
    """``parse(build(n))`` is accepted at ``n = LIMITS.<limit>`` and rejected at ``field`` for ``n + 1``."""

    limit: str
    parse: Callable[[Any], Any]
    build: Callable[[int], Any]
    field: str
    expected: str


LIMIT_CASES = [
    LimitCase(
        "max_metric_name_length",
        Report.from_dict,
        lambda n: report(metrics=[window("a"), window("b"), window("c"), window("x" * n)]),
        "metrics[3].name",
        "1-64 printable characters",
    ),
    LimitCase(
        "max_metrics_per_report", Report.from_dict, lambda n: report(metrics=windows(n)), "metrics", "at most 256"
    ),
    LimitCase(
        "max_metrics_per_report",
        TrainerStatus.from_body,
        lambda n: status(metrics=kf_metrics(n)),
        "trainerStatus.metrics",
        "at most 256",
    ),
    LimitCase(
        "max_metric_name_length",
        TrainerStatus.from_body,
        lambda n: status(metrics=[*kf_metrics(2), {"name": "x" * n, "value": "1"}]),
        "trainerStatus.metrics[2].name",
        "64",  # a fix may reuse the native metric-name message
    ),
    LimitCase(
        "max_metric_value_length",
        TrainerStatus.from_body,
        lambda n: status(metrics=[{"name": "loss", "value": "9" * n}]),
        "trainerStatus.metrics[0].value",
        "at most 64 characters",
    ),
    LimitCase(
        "max_params", Report.from_dict, lambda n: report(params={f"p{i}": i for i in range(n)}), "params", "at most 128"
    ),
    LimitCase(
        "max_param_key_length", Report.from_dict, lambda n: report(params={"k" * n: 1}), "params", "1-64 printable"
    ),
    LimitCase(
        "max_param_value_length",
        Report.from_dict,
        lambda n: report(params={"note": "v" * n}),
        "params.note",
        "at most 256 characters",
    ),
    LimitCase(
        "max_reason_length",
        Report.from_dict,
        lambda n: report(state="failed", reason="r" * n),
        "reason",
        "at most 256 characters",
    ),
    LimitCase(
        "max_reason_length",
        ReportResponse.from_dict,
        lambda n: response(commands=[command(), command(id="cmd-2", reason="r" * n)]),
        "commands[1].reason",
        "at most 256 characters",
    ),
    LimitCase(
        "max_run_id_length", Report.from_dict, lambda n: report(run_id="r" * n), "run_id", "at most 64 characters"
    ),
    LimitCase("max_run_id_length", Report.from_dict, lambda n: report(acks=["a", "b" * n]), "acks[1]", "at most 64"),
    LimitCase(
        "max_run_id_length",
        ReportResponse.from_dict,
        lambda n: response(commands=[command(id="c" * n)]),
        "commands[0].id",
        "at most 64 characters",
    ),
    LimitCase(
        "max_host_length",
        Report.from_dict,
        lambda n: report(identity={"host": "h" * n}),
        "identity.host",
        "at most 253 characters",
    ),
    LimitCase(
        "max_acks", Report.from_dict, lambda n: report(acks=[f"cmd-{i}" for i in range(n)]), "acks", "at most 64"
    ),
    LimitCase(
        "max_commands",
        ReportResponse.from_dict,
        lambda n: response(commands=[command(id=f"cmd-{i}") for i in range(n)]),
        "commands",
        "at most 16",
    ),
    LimitCase(
        "max_world_size",
        Report.from_dict,
        lambda n: report(identity={"world_size": n, "rank": n - 1}),
        "identity.world_size",
        "<= 1048576",
    ),
    LimitCase(
        "max_world_size",
        Report.from_dict,
        lambda n: report(identity={"world_size": 2, "local_rank": n}),
        "identity.local_rank",
        "<= 1048576",
    ),
    LimitCase(
        "max_gpus_per_report",
        Report.from_dict,
        lambda n: report(gpus=[{"index": i, "utilization": 50.0} for i in range(n)]),
        "gpus",
        "at most 64",
    ),
    LimitCase(
        "max_where_frames",
        Report.from_dict,
        lambda n: report(where=where(frames=[frame()] * n)),
        "where.frames",
        "at most 8",
    ),
    LimitCase(
        "max_frame_function_length",
        Report.from_dict,
        lambda n: report(where=where(frames=[frame(), frame(function="f" * n)])),
        "where.frames[1].function",
        "at most 128 characters",
    ),
    LimitCase(
        "max_frame_file_length",
        Report.from_dict,
        lambda n: report(where=where(frames=[frame(file="d/" * (n // 2) + "f" * (n % 2))])),
        "where.frames[0].file",
        "at most 256 characters",
    ),
    LimitCase(
        "max_where_detail_length",
        Report.from_dict,
        lambda n: report(where=where(detail="torch." + "x" * (n - 6))),
        "where.detail",
        "at most 128 characters",
    ),
    LimitCase("max_integer", Report.from_dict, lambda n: report(seq=n), "seq", "<= 9007199254740991"),
    LimitCase(
        "max_integer",
        Report.from_dict,
        lambda n: report(progress={"step": n}),
        "progress.step",
        "<= 9007199254740991",
    ),
    LimitCase(
        "max_depth",
        lambda obj: Report.from_dict(lenient(obj)),
        lambda n: report(future=functools.reduce(lambda inner, _: [inner], range(n - 1), 1)),  # n deep in all
        "",
        "body nests too deeply: at most 64 levels",
    ),
]
LIMITS_WITH_OWN_TESTS = {"max_body_bytes", "max_name_length"}


@pytest.mark.parametrize("case", LIMIT_CASES, ids=lambda c: f"{c.limit}-{c.field}")
def test_limit(case: LimitCase) -> None:
    n = getattr(LIMITS, case.limit)
    case.parse(wire(case.build(n)))
    rejected(lambda: case.parse(wire(case.build(n + 1))), case.field, case.expected)


def test_every_max_limit_is_tested() -> None:
    tested = {case.limit for case in LIMIT_CASES} | LIMITS_WITH_OWN_TESTS
    assert tested == {f.name for f in dataclasses.fields(Limits) if f.name.startswith("max_")}


@pytest.mark.parametrize(
    ("build", "field", "expected"),
    [
        (
            lambda: Report(run_id="r", seq=0, sent_at=T0, metrics=tuple(window_of([1.0], f"m{i}") for i in range(257))),
            "metrics",
            "at most 256",
        ),
        (
            lambda: TrainerStatus(metrics=tuple(KubeflowMetric(f"m{i}", "1") for i in range(257))),
            "metrics",
            "at most 256",
        ),
        (lambda: ReportResponse(0, tuple(Command(f"c{i}", "stop") for i in range(17))), "commands", "at most 16"),
        (lambda: Report(run_id="r", seq=0, sent_at=T0, acks=("a",) * 65), "acks", "at most 64"),
    ],
    ids=["report-metrics", "trainer-metrics", "commands", "acks"],
)
def test_constructors_enforce_count_limits(build: Callable[[], Any], field: str, expected: str) -> None:
    rejected(build, field, expected)


# Body size


def json_body_of_size(size: int) -> bytes:
    body = b'{"pad":"' + b"x" * (size - 10) + b'"}'
    assert len(body) == size
    return body


def test_body_at_limit_is_accepted() -> None:
    body = json_body_of_size(LIMITS.max_body_bytes)
    assert len(decode_body(body)["pad"]) == LIMITS.max_body_bytes - 10


def test_body_over_limit_is_rejected_before_parsing() -> None:
    for body in (json_body_of_size(LIMITS.max_body_bytes + 1), b"\xff" * (LIMITS.max_body_bytes + 1)):
        error = rejected(lambda body=body: decode_body(body), "", "65537 bytes", "limit is 65536 bytes")
        assert isinstance(error, BodyTooLarge)


def test_body_limit_counts_bytes_not_characters() -> None:
    text = "é" * (LIMITS.max_body_bytes // 2)  # 64 KiB of UTF-8, half as many characters
    body = json.dumps({"pad": text}, ensure_ascii=False).encode()
    with pytest.raises(BodyTooLarge):
        decode_body(body)


# Job and namespace names

VALID_NAMES = ["a", "0", "my-job", "a-b-c", "job-123", "123", "llama-3-8b-sft", "a" * 63, "a" + "-" * 61 + "b"]
INVALID_NAMES = ["", "-a", "a-", "-", "A", "My-Job", "my_job", "my.job", "my job", "a" * 64, "jöb", " a", "a\tb"]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_valid_names(name: str) -> None:
    assert is_valid_name(name)
    assert validate_name(name) == name
    assert validate_name(name, "namespace") == name


@pytest.mark.parametrize("name", [*INVALID_NAMES, None, 5, b"job", ["job"]])
def test_invalid_names(name: object) -> None:
    assert not is_valid_name(name)
    rejected(lambda: validate_name(name, "namespace"), "namespace", "1-63 lowercase letters, digits or '-'")


@pytest.mark.parametrize("name", ["my-job\n", "a\n"])
def test_name_with_trailing_newline_is_invalid(name: str) -> None:
    assert not is_valid_name(name)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My_Run v2", "my-run-v2"),
        ("train.py", "train-py"),
        ("--Fine--Tune--", "fine-tune"),
        ("a__b  c", "a-b-c"),
        ("Llama-3 8B (SFT)", "llama-3-8b-sft"),
        ("", "job"),
        ("___", "job"),
        ("日本語", "job"),
        ("a" * 100, "a" * 63),
        ("a" * 62 + "_b", "a" * 62),
        ("Ünïcødé", "n-c-d"),
    ],
)
def test_sanitize_name(text: str, expected: str) -> None:
    assert sanitize_name(text) == expected
    assert is_valid_name(expected)


def test_sanitize_name_fallback() -> None:
    assert sanitize_name("!!!", fallback="run") == "run"


def test_sanitize_name_always_gives_a_valid_name() -> None:
    rng = random.Random(1123)
    alphabet = "abcXYZ019-_. /\\:é日\n\t\x00🚀İK"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 120)))
        name = sanitize_name(text)
        assert is_valid_name(name), (text, name)
        assert sanitize_name(name) == name


# Metric names

VALID_METRIC_NAMES = [
    "train/loss",
    "eval_accuracy",
    "rewards/chosen",
    "loss (smoothed)",
    "précision",
    "損失",
    "x" * 64,
    "a",
]
INVALID_METRIC_NAMES = ["", "x" * 65, "a\nb", "loss\n", "\x00", "a\tb", "a\rb", "del\x7f", "a\u2028b", "\x1b[31m"]


@pytest.mark.parametrize("name", VALID_METRIC_NAMES)
def test_valid_metric_names(name: str) -> None:
    assert is_valid_metric_name(name)
    assert validate_metric_name(name) == name
    assert Report.from_dict(wire(report(metrics=[window(name)]))).metrics[0].name == name


@pytest.mark.parametrize("name", INVALID_METRIC_NAMES)
def test_invalid_metric_names(name: str) -> None:
    assert not is_valid_metric_name(name)
    rejected(lambda: validate_metric_name(name), "name", "1-64 printable characters")
    body = wire(report(metrics=[window("ok"), window(name)]))
    rejected(lambda: Report.from_dict(body), "metrics[1].name", "1-64 printable characters")


@pytest.mark.parametrize("name", [None, 3, ["loss"], {"n": 1}])
def test_metric_name_of_wrong_type(name: object) -> None:
    assert not is_valid_metric_name(name)
    rejected(lambda: Report.from_dict(report(metrics=[window(name)])), "metrics[0].name", "printable characters")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["a\nb", "\x00", "a\tb"])
def test_kubeflow_metric_name_with_control_characters(name: str) -> None:
    body = status(metrics=[{"name": name, "value": "1"}])
    rejected(lambda: TrainerStatus.from_body(body), "trainerStatus.metrics[0].name", "printable")


def test_duplicate_metric_names_in_one_report() -> None:
    body = wire(report(metrics=[window("loss"), window("lr"), window("loss")]))
    rejected(lambda: Report.from_dict(body), "metrics[2].name", "duplicate", "'loss'")
    windows_ = (window_of([1.0], "loss"), window_of([2.0], "loss"))
    rejected(lambda: Report(run_id="r", seq=0, sent_at=T0, metrics=windows_), "metrics[1].name", "duplicate")


def test_metric_names_differing_in_case_are_distinct() -> None:
    assert len(Report.from_dict(wire(report(metrics=[window("Loss"), window("loss")]))).metrics) == 2


def test_kubeflow_metric_name_and_value_must_not_be_empty() -> None:
    body = status(metrics=[{"name": "loss", "value": ""}])
    rejected(lambda: TrainerStatus.from_body(body), "trainerStatus.metrics[0].value", "must not be empty")
    body = status(metrics=[{"name": "", "value": "1"}])
    rejected(lambda: TrainerStatus.from_body(body), "trainerStatus.metrics[0].name")


# Kubeflow trainerStatus fields


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("progressPercentage", 0),
        ("progressPercentage", 100),
        ("progressPercentage", None),
        ("estimatedRemainingSeconds", 0),
        ("estimatedRemainingSeconds", 10**9),
        ("estimatedRemainingSeconds", None),
    ],
)
def test_trainer_status_numbers_accepted(key: str, value: int | None) -> None:
    TrainerStatus.from_body(wire(status(**{key: value})))


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("progressPercentage", 101, "must be <= 100"),
        ("progressPercentage", -1, "must be >= 0"),
        ("progressPercentage", 50.5, "must be an integer"),
        ("progressPercentage", 50.0, "must be an integer"),
        ("progressPercentage", True, "must be an integer"),
        ("progressPercentage", "50", "must be an integer"),
        ("estimatedRemainingSeconds", -1, "must be >= 0"),
        ("estimatedRemainingSeconds", 1.5, "must be an integer"),
        ("estimatedRemainingSeconds", False, "must be an integer"),
        ("estimatedRemainingSeconds", "60", "must be an integer"),
    ],
)
def test_trainer_status_numbers_rejected(key: str, value: object, expected: str) -> None:
    body = wire(status(**{key: value}))
    rejected(lambda: TrainerStatus.from_body(body), f"trainerStatus.{key}", expected)


VALID_TIMES = [
    "2026-12-02T15:04:05Z",
    "2026-12-02T15:04:05.123456Z",
    "2026-12-02T15:04:05.123Z",
    "2026-12-02T15:04:05+00:00",
    "2026-12-02T17:04:05+02:00",
    "2026-12-02T15:04:05.123456+00:00",
    "2026-12-02t15:04:05z",
    # the upstream kubeflow SDK writes datetime.now(timezone.utc).isoformat(): this shape, fixed so that every
    # collection of the suite (pytest-xdist workers included) sees the same parameters
    dt.datetime(2026, 12, 7, 6, 5, 21, 76079, tzinfo=dt.timezone.utc).isoformat(),
    dt.datetime(2026, 12, 2, 15, 4, 5, tzinfo=dt.timezone.utc).isoformat(),
]
INVALID_TIMES = [
    "yesterday",
    "",
    "2026-12-02",
    "2026-12-02T15:04:05",
    "2026-12-02T15:04:05.123456",
    "15:04:05Z",
    "2026-13-02T15:04:05Z",
    "2026-12-02T25:04:05Z",
    "2026-12-02 15:04:05Z",
    "2026-12-02T15:04:05." + "1" * 50 + "Z",  # longer than 64 characters
    1796223845,
    None,
]


@pytest.mark.parametrize("text", VALID_TIMES)
def test_last_updated_time_accepted(text: str) -> None:
    assert TrainerStatus.from_body(wire(status(lastUpdatedTime=text))).last_updated_time == text


@pytest.mark.parametrize("text", [t for t in INVALID_TIMES if t is not None])
def test_last_updated_time_rejected(text: object) -> None:
    body = wire(status(lastUpdatedTime=text))
    rejected(lambda: TrainerStatus.from_body(body), "trainerStatus.lastUpdatedTime", "RFC 3339")


@pytest.mark.parametrize("text", INVALID_TIMES)
def test_parse_rfc3339_rejects(text: object) -> None:
    rejected(lambda: parse_rfc3339(text, "at"), "at", "RFC 3339")


@pytest.mark.parametrize("text", ["2026-12-02T15:04Z", "2026-12-02T15Z", "2026-12-02T15:04:05.Z"])
def test_parse_rfc3339_rejects_non_rfc3339_iso_forms(text: str) -> None:
    rejected(lambda: parse_rfc3339(text, "at"), "at", "RFC 3339")


@pytest.mark.parametrize(
    "text",
    [
        "20261202T150405Z",
        "2026-W49-3T15:04:05Z",
        "2026-12-02T15:04:05+0000",
        "2026-12-02T15:04:05+02",
        "2026-12-02T15:04:05,5Z",
    ],
)
def test_parse_rfc3339_rejects_iso8601_only_forms(text: str) -> None:
    rejected(lambda: parse_rfc3339(text, "at"), "at", "RFC 3339")


@pytest.mark.parametrize(
    ("text", "fraction"),
    [("2026-12-02T15:04:05.5Z", 0.5), ("2026-12-02T15:04:05.12Z", 0.12), ("2026-12-02T15:04:05.123456789Z", 0.123456)],
)
def test_parse_rfc3339_any_fraction_length(text: str, fraction: float) -> None:
    """RFC 3339 allows any number of fraction digits; Go's RFC3339Nano sends up to nine."""
    assert parse_rfc3339(text) == pytest.approx(1_796_223_845 + fraction, abs=1e-6)


# Params


@pytest.mark.parametrize(
    ("params", "field", "expected"),
    [
        ({"lr": NAN}, "params.lr", "must be finite"),
        ({"lr": INF}, "params.lr", "must be finite"),
        ({"lr": -INF}, "params.lr", "must be finite"),
        ({"optimizer": {"name": "adam"}}, "params.optimizer", "string, number, boolean or null"),
        ({"layers": [1, 2]}, "params.layers", "string, number, boolean or null"),
        ({"": 1}, "params", "1-64 printable"),
        ({"a\nb": 1}, "params", "1-64 printable"),
        ({"\x00": 1}, "params", "1-64 printable"),
    ],
)
def test_params_rejected(params: dict[str, Any], field: str, expected: str) -> None:
    body = lenient(report(params=params))
    rejected(lambda: Report.from_dict(body), field, expected)


@pytest.mark.parametrize("params", [[], "lr=1", 3, True])
def test_params_must_be_an_object(params: object) -> None:
    rejected(lambda: Report.from_dict(wire(report(params=params))), "params", "must be a JSON object")


def test_params_direct_construction_rejected() -> None:
    rejected(lambda: Report(run_id="r", seq=0, sent_at=T0, params={"lr": NAN}), "params.lr", "must be finite")
    rejected(lambda: Report(run_id="r", seq=0, sent_at=T0, params={"s": {1}}), "params.s", "string, number")  # type: ignore[dict-item]
    rejected(lambda: Report(run_id="r", seq=0, sent_at=T0, params={1: "x"}), "params", "keys must be")  # type: ignore[dict-item]


def test_null_params_means_none() -> None:
    assert Report.from_dict(wire(report(params=None))).params is None
    assert "params" not in Report(run_id="r", seq=0, sent_at=T0).to_dict()


# Run ids, acks and commands

VALID_IDS = ["r", "run-1", "2026.12.02_a-B", "A" * 64, "0", "..."]
INVALID_IDS = ["", "run 1", "run/1", "rün", "run:1", "a" * 65, " run", "run\t"]


@pytest.mark.parametrize("run_id", VALID_IDS)
def test_valid_run_ids(run_id: str) -> None:
    parsed = Report.from_dict(wire(report(run_id=run_id, acks=[run_id])))
    assert (parsed.run_id, parsed.acks) == (run_id, (run_id,))
    assert ReportResponse.from_dict(wire(response(commands=[command(id=run_id)]))).commands[0].id == run_id


@pytest.mark.parametrize("run_id", [*INVALID_IDS, None, 7])
def test_invalid_run_ids(run_id: object) -> None:
    expected = "must" if not isinstance(run_id, str) or len(run_id) > 64 or not run_id else "letters, digits"
    rejected(lambda: Report.from_dict(wire(report(run_id=run_id))), "run_id", expected)
    rejected(lambda: Report.from_dict(wire(report(acks=["ok", run_id]))), "acks[1]", expected)
    rejected(
        lambda: ReportResponse.from_dict(wire(response(commands=[command(id=run_id)]))), "commands[0].id", expected
    )


@pytest.mark.parametrize(
    ("parse", "body", "field"),
    [
        (Report.from_dict, report(run_id="run-1\n"), "run_id"),
        (Report.from_dict, report(acks=["cmd-1\n"]), "acks[0]"),
        (ReportResponse.from_dict, response(commands=[command(id="cmd-1\n")]), "commands[0].id"),
    ],
    ids=["run_id", "ack", "command-id"],
)
def test_ids_with_trailing_newline_rejected(parse: Callable[[Any], Any], body: Any, field: str) -> None:
    rejected(lambda: parse(body), field, "letters, digits")


@pytest.mark.parametrize("kind", COMMAND_KINDS)
def test_command_kinds_accepted(kind: str) -> None:
    assert ReportResponse.from_dict(wire(response(commands=[command(kind=kind)]))).commands[0].kind == kind


@pytest.mark.parametrize("kind", ["kill", "", "STOP", "Stop", "pause", None, 1, ["stop"], {"stop": 1}])
def test_command_kinds_rejected(kind: object) -> None:
    body = wire(response(commands=[command(), command(id="cmd-2", kind=kind)]))
    rejected(lambda: ReportResponse.from_dict(body), "commands[1].kind", "must be one of stop, checkpoint")


@pytest.mark.parametrize("accepted_seq", [-1, 1.0, True, "3", None])
def test_accepted_seq_rejected(accepted_seq: object) -> None:
    rejected(lambda: ReportResponse.from_dict(wire(response(accepted_seq=accepted_seq))), "accepted_seq", "must be")


# Identity, progress and report scalars


@pytest.mark.parametrize(
    ("identity", "field", "expected"),
    [
        ({"rank": 4, "world_size": 4}, "identity.rank", "must be <= 3"),
        ({"rank": 1}, "identity.rank", "must be <= 0"),
        ({"rank": -1, "world_size": 4}, "identity.rank", "must be >= 0"),
        ({"world_size": 0}, "identity.world_size", "must be >= 1"),
        ({"world_size": -2}, "identity.world_size", "must be >= 1"),
        ({"pid": -1}, "identity.pid", "must be >= 0"),
        ({"local_rank": -1}, "identity.local_rank", "must be >= 0"),
        ({"rank": True, "world_size": 2}, "identity.rank", "must be an integer"),
        ({"world_size": 2.0}, "identity.world_size", "must be an integer"),
        ({"world_size": "8"}, "identity.world_size", "must be an integer"),
        ({"pid": 12.5}, "identity.pid", "must be an integer"),
        ({"host": 5}, "identity.host", "must be a string"),
        ({"host": None}, "identity.host", "must be a string"),
    ],
)
def test_identity_rejected(identity: dict[str, Any], field: str, expected: str) -> None:
    rejected(lambda: Report.from_dict(wire(report(identity=identity))), field, expected)


def test_identity_defaults_and_bounds() -> None:
    assert Report.from_dict(wire(report())).identity == Identity(rank=0, world_size=1, local_rank=0, host="", pid=0)
    ident = Report.from_dict(wire(report(identity={"rank": 7, "world_size": 8, "pid": 0}))).identity
    assert (ident.rank, ident.world_size) == (7, 8)


@pytest.mark.parametrize(
    ("progress", "field", "expected"),
    [
        ({"step": -1}, "progress.step", "must be >= 0"),
        ({"step": 5.0}, "progress.step", "must be an integer"),
        ({"step": True}, "progress.step", "must be an integer"),
        ({"step": "5"}, "progress.step", "must be an integer"),
        ({"total_steps": 0}, "progress.total_steps", "must be >= 1"),
        ({"total_steps": 100.0}, "progress.total_steps", "must be an integer"),
        ({"total_steps": False}, "progress.total_steps", "must be an integer"),
        ({"samples": -1}, "progress.samples", "must be >= 0"),
        ({"samples": 1.5}, "progress.samples", "must be an integer"),
        ({"epoch": NAN}, "progress.epoch", "must be finite"),
        ({"epoch": INF}, "progress.epoch", "must be finite"),
        ({"epoch": "NaN"}, "progress.epoch", "must be a number"),
        ({"epoch": -0.5}, "progress.epoch", "must be >= 0"),
        ({"epoch": True}, "progress.epoch", "must be a number"),
        ({"total_epochs": 0}, "progress.total_epochs", "must be > 0"),
        ({"total_epochs": 0.0}, "progress.total_epochs", "must be > 0"),
        ({"total_epochs": -1}, "progress.total_epochs", "must be > 0"),
        ({"total_epochs": INF}, "progress.total_epochs", "must be finite"),
        ({"steps_per_second": -1.0}, "progress.steps_per_second", "must be >= 0"),
        ({"samples_per_second": NAN}, "progress.samples_per_second", "must be finite"),
        ({"step_time": -INF}, "progress.step_time", "must be finite"),
        ({"step_time": [0.1]}, "progress.step_time", "must be a number"),
        ({"eta_seconds": -5}, "progress.eta_seconds", "must be >= 0"),
    ],
)
def test_progress_rejected(progress: dict[str, Any], field: str, expected: str) -> None:
    body = lenient(report(progress=progress))
    rejected(lambda: Report.from_dict(body), field, expected)


@pytest.mark.parametrize(
    "progress",
    [
        {},
        {"step": 0, "total_steps": 1},
        {"epoch": 0, "total_epochs": 0.5},
        {"epoch": 3, "total_epochs": 3},
        {"step": 10**12, "samples": 0, "steps_per_second": 0.0, "step_time": 0, "eta_seconds": 0.0},
        {"step": None, "epoch": None},
    ],
)
def test_progress_accepted(progress: dict[str, Any]) -> None:
    parsed = Report.from_dict(wire(report(progress=progress))).progress
    assert parsed.to_dict() == {k: v for k, v in progress.items() if v is not None}


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("seq", -1, "must be >= 0"),
        ("seq", 1.0, "must be an integer"),
        ("seq", True, "must be an integer"),
        ("seq", "1", "must be an integer"),
        ("seq", None, "must be an integer"),
        ("sent_at", -1.0, "must be >= 0"),
        ("sent_at", "now", "must be a number"),
        ("sent_at", "2026-12-02T15:04:05Z", "must be a number"),
        ("sent_at", True, "must be a number"),
        ("sent_at", NAN, "must be finite"),
        ("sent_at", INF, "must be finite"),
        ("state", "paused", "must be one of running, finished, failed, stopped"),
        ("state", "RUNNING", "must be one of"),
        ("state", "", "must be one of"),
        ("state", None, "must be one of"),
        ("state", ["running"], "must be one of"),
        ("reason", 5, "must be a string"),
        ("reason", None, "must be a string"),
        ("api_version", "v2", "this server speaks 'v1'"),
        ("api_version", "", "'v1'"),
        ("api_version", None, "'v1'"),
        ("api_version", 1, "'v1'"),
    ],
)
def test_report_scalars_rejected(key: str, value: object, expected: str) -> None:
    body = lenient(report(**{key: value}))
    rejected(lambda: Report.from_dict(body), key, expected)


def test_sent_at_null_rejected() -> None:
    rejected(lambda: Report.from_dict(wire(report(sent_at=None))), "sent_at", "must be a number")


@pytest.mark.parametrize("sent_at", [0, 0.0, T0, 1796223845])
def test_sent_at_accepted(sent_at: float) -> None:
    assert Report.from_dict(wire(report(sent_at=sent_at))).sent_at == sent_at


# MetricWindow invariants


@pytest.mark.parametrize(
    ("over", "field", "expected"),
    [
        ({"count": 0, "nonfinite": 0}, "count", "must be >= 1"),
        ({"count": -1}, "count", "must be >= 1"),
        ({"count": 1.0}, "count", "must be an integer"),
        ({"count": True}, "count", "must be an integer"),
        ({"count": 2, "nonfinite": 3, "min": None, "max": None, "mean": None}, "nonfinite", "at most count (2)"),
        ({"nonfinite": -1}, "nonfinite", "must be >= 0"),
        ({"nonfinite": 0.0}, "nonfinite", "must be an integer"),
        ({"first_step": 5, "last_step": 4}, "last_step", "must be >= first_step (5)"),
        ({"first_step": -1}, "first_step", "must be >= 0"),
        ({"last_step": 2.0}, "last_step", "must be an integer"),
        ({"min": 2.0, "max": 1.0, "count": 2}, "max", "must be >= min"),
        ({"nonfinite": 1, "last": NAN}, "min", "must be null when every value is non-finite"),
        ({"nonfinite": 1, "last": NAN, "min": None, "max": None}, "min", "must be null"),
        ({"min": None}, "min", "must be a finite number"),
        ({"max": None}, "max", "must be a finite number"),
        ({"mean": None}, "mean", "must be a finite number"),
        ({"mean": "NaN"}, "mean", "must be a finite number"),
        ({"min": -INF}, "min", "must be a finite number"),
        ({"max": "Infinity"}, "max", "must be a finite number"),
        ({"min": "1.0"}, "min", "must be a number"),
        ({"mean": True}, "mean", "must be a number"),
        ({"last": True}, "last", "must be a number"),
        ({"last": "nan"}, "last", "must be a number"),
        ({"last": None}, "last", "must be a number"),
        ({"last": [1.0]}, "last", "must be a number"),
    ],
)
def test_metric_window_invariants(over: dict[str, Any], field: str, expected: str) -> None:
    body = lenient(report(metrics=[window("a"), window("b", **over)]))
    rejected(lambda: Report.from_dict(body), f"metrics[1].{field}", expected)


@pytest.mark.parametrize(
    "over",
    [
        {"count": 3, "nonfinite": 3, "last": "NaN", "min": None, "max": None, "mean": None},
        {"count": 1, "nonfinite": 1, "last": "-Infinity", "min": None, "max": None, "mean": None},
        {"count": 2, "nonfinite": 1, "last": "Infinity", "min": 0.5, "max": 0.5, "mean": 0.5},
        {"count": 5, "min": -1.0, "max": 3.0, "mean": 0.25, "first_step": 7, "last_step": 7},
        {"last": 1},  # an integer is a number
    ],
)
def test_metric_window_accepted(over: dict[str, Any]) -> None:
    Report.from_dict(wire(report(metrics=[window("a", **over)])))


def test_metric_window_nonfinite_defaults_to_zero() -> None:
    body = window()
    del body["nonfinite"]
    assert MetricWindow.from_dict(body).nonfinite == 0


@pytest.mark.parametrize(
    "over", [{"last": None}, {"last": "NaN"}, {"min": True}], ids=["last-None", "last-str", "min-bool"]
)
def test_metric_window_constructor_checks_values(over: dict[str, Any]) -> None:
    """These windows cannot be encoded, or encode to a body that from_dict rejects."""
    values = {"name": "loss", "last": 1.0, "min": 1.0, "max": 1.0, "mean": 1.0, "count": 1}
    values |= {"nonfinite": 0, "first_step": 0, "last_step": 0, **over}
    with pytest.raises(ProtocolError):
        MetricWindow(**values)


# --------------------------------------------------------------------------------------------------
# 3. Malformed input
# --------------------------------------------------------------------------------------------------

PARSERS = [
    pytest.param(Report.from_dict, id="report"),
    pytest.param(ReportResponse.from_dict, id="response"),
    pytest.param(TrainerStatus.from_body, id="trainer-status"),
]


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize("body", [b"[]", b'"report"', b"42", b"1.5", b"null", b"true", b"[{}]"])
def test_non_object_bodies(parse: Callable[[Any], Any], body: bytes) -> None:
    data = decode_body(body)
    rejected(lambda: parse(data), "", "must be a JSON object")


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   ",
        b"{",
        b'{"run_id": "r",}',
        b"{'run_id': 'r'}",
        b'{"a": nan}',
        b'{"a": NaN1}',
        b"\xff\xfe\xfd",
        b'{"run_id": "\xff"}',
        b'{"run_id": "\xc3"}',
        b'{"a": 1} {"b": 2}',
    ],
)
def test_decode_body_rejects_invalid_json(body: bytes) -> None:
    rejected(lambda: decode_body(body), "", "not valid JSON")


def test_decode_body_uses_the_fast_parser_and_falls_back_on_any_refusal() -> None:
    body = json.dumps(report(metrics=[window("a", last=NAN)])).encode()  # a bare NaN token

    def refuses(raw: bytes) -> Any:
        raise ValueError("not for me")

    assert decode_body(b'{"a": 1}', lambda raw: {"fast": True}) == {"fast": True}
    assert math.isnan(decode_body(body, refuses)["metrics"][0]["last"])
    rejected(lambda: decode_body(b"{", refuses), "", "not valid JSON")  # the standard parser words the error
    with pytest.raises(BodyTooLarge):  # the limits hold whichever parser reads
        decode_body(b" " * (LIMITS.max_body_bytes + 1), lambda raw: {})


def test_decode_body_of_deep_nesting_raises_only_protocol_error() -> None:
    depth = 32_000
    body = b"[" * depth + b"]" * depth
    assert len(body) <= LIMITS.max_body_bytes
    try:
        decode_body(body)
    except ProtocolError:
        pass


@pytest.mark.parametrize(
    ("parse", "body", "field", "expected"),
    [
        (Report.from_dict, report(identity=[]), "identity", "must be a JSON object, got list"),
        (Report.from_dict, report(identity="rank0"), "identity", "must be a JSON object, got str"),
        (Report.from_dict, report(identity=None), "identity", "must be a JSON object"),
        (Report.from_dict, report(progress=[1, 2]), "progress", "must be a JSON object"),
        (Report.from_dict, report(progress=5), "progress", "must be a JSON object, got int"),
        (Report.from_dict, report(metrics={"loss": 1.0}), "metrics", "must be a JSON array, got dict"),
        (Report.from_dict, report(metrics="loss"), "metrics", "must be a JSON array"),
        (Report.from_dict, report(metrics=None), "metrics", "must be a JSON array"),
        (Report.from_dict, report(metrics=[window(), []]), "metrics[1]", "must be a JSON object"),
        (Report.from_dict, report(metrics=["loss"]), "metrics[0]", "must be a JSON object"),
        (Report.from_dict, report(metrics=[None]), "metrics[0]", "must be a JSON object"),
        (Report.from_dict, report(acks="cmd-1"), "acks", "must be a JSON array"),
        (Report.from_dict, report(acks={"cmd-1": True}), "acks", "must be a JSON array"),
        (Report.from_dict, report(acks=[1]), "acks[0]", "must be a string"),
        (Report.from_dict, report(acks=[None]), "acks[0]", "must be a string"),
        (Report.from_dict, report(run_id=["r"]), "run_id", "must be a string"),
        (ReportResponse.from_dict, response(commands={}), "commands", "must be a JSON array"),
        (ReportResponse.from_dict, response(commands=None), "commands", "must be a JSON array"),
        (ReportResponse.from_dict, response(commands=["stop"]), "commands[0]", "must be a JSON object"),
        (ReportResponse.from_dict, response(commands=[command(reason=5)]), "commands[0].reason", "must be a string"),
        (ReportResponse.from_dict, response(commands=[command(id=5)]), "commands[0].id", "must be a string"),
        (TrainerStatus.from_body, {"trainerStatus": []}, "trainerStatus", "must be a JSON object"),
        (TrainerStatus.from_body, {"trainerStatus": None}, "trainerStatus", "must be a JSON object"),
        (TrainerStatus.from_body, {"trainerStatus": "ok"}, "trainerStatus", "must be a JSON object"),
        (TrainerStatus.from_body, status(metrics={}), "trainerStatus.metrics", "must be a JSON array"),
        (TrainerStatus.from_body, status(metrics=["loss"]), "trainerStatus.metrics[0]", "must be a JSON object"),
        (
            TrainerStatus.from_body,
            status(metrics=[{"name": "a", "value": "1"}, {"name": 5, "value": "1"}]),
            "trainerStatus.metrics[1].name",
            "must be a string",
        ),
        (
            TrainerStatus.from_body,
            status(metrics=[{"name": "loss", "value": 0.5}]),
            "trainerStatus.metrics[0].value",
            "must be a string",
        ),
        (
            TrainerStatus.from_body,
            status(metrics=[{"name": "loss", "value": None}]),
            "trainerStatus.metrics[0].value",
            "must be a string",
        ),
    ],
)
def test_wrong_types(parse: Callable[[Any], Any], body: Any, field: str, expected: str) -> None:
    data = wire(body)
    rejected(lambda: parse(data), field, expected)


def _without(body: dict[str, Any], *path: str | int) -> dict[str, Any]:
    body = copy.deepcopy(body)
    parent: Any = body
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return body


FULL_REPORT = report(metrics=[window("a"), window("b")])
FULL_RESPONSE = response(commands=[command()])
FULL_STATUS = status(metrics=[{"name": "loss", "value": "1"}])


@pytest.mark.parametrize(
    ("parse", "body", "field"),
    [
        (Report.from_dict, _without(FULL_REPORT, "run_id"), "run_id"),
        (Report.from_dict, _without(FULL_REPORT, "seq"), "seq"),
        (Report.from_dict, _without(FULL_REPORT, "sent_at"), "sent_at"),
        *[
            (Report.from_dict, _without(FULL_REPORT, "metrics", 1, key), f"metrics[1].{key}")
            for key in ("name", "last", "count", "first_step", "last_step")
        ],
        (ReportResponse.from_dict, _without(FULL_RESPONSE, "accepted_seq"), "accepted_seq"),
        (ReportResponse.from_dict, _without(FULL_RESPONSE, "commands", 0, "id"), "commands[0].id"),
        (ReportResponse.from_dict, _without(FULL_RESPONSE, "commands", 0, "kind"), "commands[0].kind"),
        (TrainerStatus.from_body, {}, "trainerStatus"),
        (TrainerStatus.from_body, {"status": {}}, "trainerStatus"),
        (
            TrainerStatus.from_body,
            _without(FULL_STATUS, "trainerStatus", "metrics", 0, "name"),
            "trainerStatus.metrics[0].name",
        ),
        (
            TrainerStatus.from_body,
            _without(FULL_STATUS, "trainerStatus", "metrics", 0, "value"),
            "trainerStatus.metrics[0].value",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_missing_required_fields(parse: Callable[[Any], Any], body: Any, field: str) -> None:
    rejected(lambda: parse(wire(body)), field, "is required")


def test_unknown_fields_are_ignored() -> None:
    extra = {"future_field": {"nested": [1, 2]}, "x-trace": "abc"}
    body = report(
        **extra,
        identity={"rank": 0, **extra},
        progress={"step": 3, **extra},
        metrics=[window("loss", **extra)],
    )
    assert Report.from_dict(wire(body)) == Report.from_dict(
        wire(report(progress={"step": 3}, metrics=[window("loss")]))
    )
    assert ReportResponse.from_dict(wire(response(**extra, commands=[command(**extra)]))) == ReportResponse(
        0, (Command("cmd-1", "stop"),)
    )
    kubeflow = {"trainerStatus": {"progressPercentage": 5, **extra, "metrics": [{"name": "a", "value": "1", **extra}]}}
    assert TrainerStatus.from_body(wire({**kubeflow, **extra})) == TrainerStatus(5, None, (KubeflowMetric("a", "1"),))


# Random mutation of valid bodies: every outcome is a message or a ProtocolError, never anything else.

JUNK: list[Any] = [None, True, False, 0, -1, 2**70, 1.5, -0.0, 1e308, NAN, INF, -INF, "", "x", "NaN", "a\n"]
JUNK += ["é" * 300, [], [1], [None], {}, {"a": 1}, {"name": "x"}]


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(obj, dict):
        for key, value in obj.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += _paths(value, (*prefix, i))
    return found


def _mutate(body: Any, rng: random.Random) -> Any:
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_paths(body)[1:])
        parent = body
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and rng.random() < 0.25:
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(JUNK))
        if not _paths(body)[1:]:
            break
    return body


@pytest.mark.parametrize(
    ("parse", "valid"),
    [
        (Report.from_dict, rich_report("failed", "oom").to_dict()),
        (
            ReportResponse.from_dict,
            ReportResponse(3, (Command("c1", "stop", "why"), Command("c2", "checkpoint"))).to_dict(),
        ),
        (TrainerStatus.from_body, TRAINER_STATUSES["full"].to_body()),
    ],
    ids=["report", "response", "trainer-status"],
)
def test_mutated_bodies_raise_only_protocol_error(parse: Callable[[Any], Any], valid: Any) -> None:
    rng = random.Random(2779)
    for _ in range(1500):
        body = _mutate(valid, rng)
        try:
            parse(body)
        except ProtocolError:
            pass
        except Exception as exc:  # pragma: no cover - only reached on a bug
            pytest.fail(f"{type(exc).__name__}: {exc} for body {body!r}")


# --------------------------------------------------------------------------------------------------
# 4. MetricWindow.merge
# --------------------------------------------------------------------------------------------------


def assert_window_equal(actual: MetricWindow, expected: MetricWindow) -> None:
    assert (actual.name, actual.count, actual.nonfinite) == (expected.name, expected.count, expected.nonfinite)
    assert (actual.first_step, actual.last_step) == (expected.first_step, expected.last_step)
    assert same(actual.last, expected.last)
    assert (actual.min, actual.max) == (expected.min, expected.max)
    if expected.mean is None:
        assert actual.mean is None
    else:
        assert expected.min is not None and expected.max is not None
        scale = max(abs(expected.min), abs(expected.max))
        assert actual.mean == pytest.approx(expected.mean, rel=1e-9, abs=1e-12 * scale)


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ([1.0, 2.0], [3.0]),
        ([5.0], [-5.0, 0.0, 10.0]),
        ([1.0, NAN], [2.0]),  # non-finite inside a side
        ([NAN, INF], [2.0, 4.0]),  # older all non-finite
        ([2.0, 4.0], [-INF]),  # newer all non-finite: last is the newer's
        ([NAN], [INF, -INF]),  # both all non-finite
        ([1.0], [NAN]),
        ([NAN], [1.0]),
    ],
)
def test_merge_cases(older: list[float], newer: list[float]) -> None:
    merged = window_of(older, first_step=10).merge(window_of(newer, first_step=10 + len(older)))
    assert_window_equal(merged, window_of(older + newer, first_step=10))


def test_merge_weights_the_mean_by_finite_counts() -> None:
    merged = window_of([0.0, NAN, NAN, NAN]).merge(window_of([3.0, 3.0, 3.0], first_step=4))
    assert merged.mean == pytest.approx(2.25)
    assert (merged.count, merged.nonfinite) == (7, 3)


def test_merge_takes_the_union_of_step_ranges() -> None:
    older = window_of([1.0, 2.0], first_step=50)  # steps 50..51
    newer = window_of([3.0], first_step=20)  # an earlier step, e.g. after a restart from a checkpoint
    merged = older.merge(newer)
    assert (merged.first_step, merged.last_step) == (20, 51)
    assert merged.last == 3.0


def _random_values(rng: random.Random, n: int) -> list[float]:
    all_nonfinite = rng.random() < 0.15
    values = []
    for _ in range(n):
        if all_nonfinite or rng.random() < 0.2:
            values.append(rng.choice([NAN, INF, -INF]))
        else:
            values.append(rng.uniform(-1e3, 1e3) * 10 ** rng.randint(-6, 6))
    return values


@pytest.mark.parametrize("seed", range(5))
def test_merge_matches_the_window_of_concatenated_values(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        chunks = [_random_values(rng, rng.randint(1, 6)) for _ in range(rng.randint(2, 5))]
        start = rng.randint(0, 10_000)
        merged = None
        step = start
        for chunk in chunks:
            part = window_of(chunk, first_step=step)
            merged = part if merged is None else merged.merge(part)
            step += len(chunk)
        assert merged is not None
        assert_window_equal(merged, window_of([v for c in chunks for v in c], first_step=start))


def test_merge_of_huge_values_does_not_overflow() -> None:
    huge = window_of([1e308])
    merged = huge.merge(window_of([1e308], first_step=1))
    assert merged.mean == 1e308


def test_merge_of_different_metrics_is_refused() -> None:
    with pytest.raises((ProtocolError, ValueError)):
        window_of([1.0], "loss").merge(window_of([2.0], "lr", first_step=1))


# --------------------------------------------------------------------------------------------------
# 5. Paths, 6. times
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("namespace", "job"), [("default", "my-job"), ("team-a", "llama-3-8b-sft"), ("a", "0")])
def test_paths(namespace: str, job: str) -> None:
    assert report_path(namespace, job) == f"/api/v1/namespaces/{namespace}/jobs/{job}/reports"
    assert kubeflow_status_path(namespace, job) == (
        f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{job}/status"
    )


@pytest.mark.parametrize(
    ("timestamp", "text"),
    [(0, "1970-01-01T00:00:00Z"), (1_796_223_845, "2026-12-02T15:04:05Z"), (T0, "2026-12-02T15:04:05Z")],
)
def test_format_rfc3339(timestamp: float, text: str) -> None:
    assert format_rfc3339(timestamp) == text
    assert parse_rfc3339(text) == math.floor(timestamp)


def test_rfc3339_round_trip_to_the_second() -> None:
    rng = random.Random(3339)
    for _ in range(1000):
        seconds = rng.randint(0, 4_102_444_800)  # 1970..2100
        text = format_rfc3339(seconds + rng.randrange(0, 999_000) / 1e6)
        assert parse_rfc3339(text) == seconds
        assert format_rfc3339(parse_rfc3339(text)) == text


@pytest.mark.parametrize(
    "text",
    ["2026-12-02T15:04:05Z", "2026-12-02T15:04:05+00:00", "2026-12-02T17:04:05+02:00", "2026-12-02T10:04:05-05:00"],
)
def test_parse_rfc3339_offsets_give_the_same_instant(text: str) -> None:
    assert parse_rfc3339(text) == 1_796_223_845


# --------------------------------------------------------------------------------------------------
# 7. Dependencies
# --------------------------------------------------------------------------------------------------


def test_protocol_imports_only_the_standard_library() -> None:
    """Every module of the package: the standard library, and the package's own modules (relative imports of
    one level, whose names exist in the package folder), nothing else of the project."""
    folder = Path(protocol.__file__).parent
    own = {path.stem for path in folder.glob("*.py")}
    sources = sorted(folder.glob("*.py"))
    assert {"__init__", "_report", "_window", "progression"} <= own  # the walk sees the package's parts
    modules: set[str] = set()
    for source in sources:
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            where = f"{source.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                modules |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    assert node.level == 1 and node.module in own, f"relative import of {node.module!r} at {where}"
                    continue
                assert node.module is not None
                modules.add(node.module)
            elif isinstance(node, ast.Name | ast.Attribute):
                name = node.id if isinstance(node, ast.Name) else node.attr
                assert name not in {"__import__", "import_module"}, f"dynamic import at {where}"
    top_level = {module.split(".")[0] for module in modules}
    assert {"json", "math", "re"} <= top_level  # the walk did see the imports
    assert not top_level - sys.stdlib_module_names
    assert "stepwatch" not in top_level


def test_the_package_exports_every_public_name_from_its_modules_and_each_module_is_small() -> None:
    """``__all__`` is sorted and complete: each public name a private module declares is exported, once, and
    is the module's own object; no module of the package passes 800 lines."""
    import importlib

    folder = Path(protocol.__file__).parent
    declared: dict[str, object] = {}
    for source in sorted(folder.glob("_*.py")):
        if source.stem == "__init__":
            continue
        module = importlib.import_module(f"stepwatch.protocol.{source.stem}")
        for name in module.__all__:
            assert name not in declared, f"{name} declared twice"
            declared[name] = getattr(module, name)
        assert len(source.read_text(encoding="utf-8").splitlines()) <= 800, source.name
    aliases = {"CommandKind", "Jitter", "ParamValue", "ReportState"}  # importable, not in __all__ (as before)
    assert protocol.__all__ == sorted(protocol.__all__, key=lambda n: (not n.isupper(), n))
    assert set(protocol.__all__) == set(declared) - aliases
    for name, value in declared.items():
        assert getattr(protocol, name) is value, name


@pytest.mark.parametrize(
    ("state", "percent", "text"),
    [
        ("finished", 49.75, "ended at 49.7%"),
        ("stopped", 2.3, "ended at 2.3%"),  # 2.3 * 10 is 22.999999999999996: not cut to 2.2
        ("failed", 20.0, "ended at 20.0%"),
        ("stopped", 9.39, "ended at 9.3%"),
        ("stopped", 99.99, "ended at 99.9%"),  # never rounded up to its total
        ("finished", 100.0, None),
        ("running", 49.75, None),
        ("stopped", None, None),
        ("failed", math.nan, None),
    ],
)
def test_ended_short_text(state: str, percent: float | None, text: str | None) -> None:
    assert protocol.ended_short_text(state, percent) == text


def test_the_phase_is_optional_and_backward_compatible() -> None:
    """``progress.phase``/``phase_seconds`` round-trip; a report without them trains; a reader that keeps only
    the fields it knows (an older server) reads the same progress without them; a bad phase is refused."""
    p = Progress(step=5, phase="eval", phase_seconds=12.5)
    assert Progress.from_dict(p.to_dict()) == p and p.evaluating == 12.5
    assert Progress(step=5).evaluating is None and "phase" not in Progress(step=5).to_dict()
    assert Progress(step=5, phase="train", phase_seconds=3.0).evaluating is None
    assert Progress(step=5, phase="eval").evaluating == 0.0  # said it evaluates, not for how long
    old = {k: v for k, v in p.to_dict().items() if not k.startswith("phase")}
    assert Progress.from_dict(old) == Progress(step=5)
    with pytest.raises(ProtocolError) as err:
        Progress.from_dict({"step": 5, "phase": "predict"})
    assert err.value.field == "progress.phase"
    with pytest.raises(ProtocolError):
        Progress.from_dict({"phase": "eval", "phase_seconds": "NaN"})


# Where a rank stands (issue 29): what the reading may say, and that nothing but it leaves the process.


def test_where_round_trips_with_its_frames_and_shares() -> None:
    body = report(where=where(frames=[frame(), frame(function="main", line=90)], samples=3))
    body["activity_shares"] = {"computing": 0.75, "communicating": 0.25}
    parsed = Report.from_dict(wire(body))
    assert parsed.where is not None
    assert parsed.where.activity == "communicating" and parsed.where.samples == 3
    assert [str(f) for f in parsed.where.frames] == ["train_step (train.py:31)", "main (train.py:90)"]
    assert Report.from_dict(wire(parsed.to_dict())) == parsed
    assert "where" not in Report(run_id="r", seq=0, sent_at=T0).to_dict()


@pytest.mark.parametrize(
    ("over", "field", "expected"),
    [
        ({"activity": "sleeping"}, "where.activity", "must be one of computing"),
        ({"stood_seconds": -1}, "where.stood_seconds", ">= 0"),
        ({"stood_seconds": "NaN"}, "where.stood_seconds", "must be a number"),
        ({"samples": 0}, "where.samples", ">= 1"),
        ({"detail": "torch\nsave"}, "where.detail", "printable"),
        ({"frames": [{"function": "f", "file": "a.py"}]}, "where.frames[0].line", "required"),
        ({"frames": [{"function": "f", "file": "a.py", "line": -3}]}, "where.frames[0].line", ">= 0"),
        ({"frames": [{"function": "", "file": "a.py", "line": 1}]}, "where.frames[0].function", "empty"),
        ({"frames": {"function": "f"}}, "where.frames", "JSON array"),
    ],
)
def test_where_rejects_what_is_not_a_reading(over: dict[str, Any], field: str, expected: str) -> None:
    rejected(lambda: Report.from_dict(wire(report(where=where(**over)))), field, expected)


@pytest.mark.parametrize(
    ("shares", "field", "expected"),
    [
        ({"thinking": 0.5}, "activity_shares", "keys must be one of"),
        ({"computing": 1.5}, "activity_shares.computing", "fraction <= 1"),
        ({"computing": -0.1}, "activity_shares.computing", ">= 0"),
        ([0.5], "activity_shares", "JSON object"),
    ],
)
def test_activity_shares_are_fractions_of_known_activities(shares: object, field: str, expected: str) -> None:
    rejected(lambda: Report.from_dict(wire({**report(), "activity_shares": shares})), field, expected)
