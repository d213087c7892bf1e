"""Properties of the wire protocol (Hypothesis): round trips, errors, limits.

- every valid message survives ``to_dict`` -> standard JSON -> ``from_dict`` unchanged;
- any JSON at all (and any bytes as a body) is either read or refused with :class:`ProtocolError`, never
  another exception (which the server would answer with a 500);
- the limits of ``LIMITS`` hold exactly at their edges.

Example counts come from the Hypothesis profile (``STEPWATCH_HYPOTHESIS_PROFILE``, see ``conftest.py``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wire_strategies import (
    commands,
    json_values,
    mutated_reports,
    reports,
    trainer_statuses,
    windows,
)

from stepwatch.protocol import (
    LIMITS,
    BodyTooLarge,
    Command,
    GpuReading,
    Identity,
    MetricWindow,
    Progress,
    ProtocolError,
    Report,
    ReportResponse,
    TrainerStatus,
    decode_body,
    encode_body,
    format_rfc3339,
    parse_rfc3339,
)

pytestmark = pytest.mark.reliability


def wire(obj: Any) -> Any:
    """Through standard JSON and back, as on the wire."""
    return decode_body(encode_body(obj))


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


# ----------------------------------------------------------------------------------------- round trips


@given(reports())
def test_report_round_trips(report: Report) -> None:
    body = report.to_dict()
    again = Report.from_dict(wire(body))
    assert_same(again.to_dict(), body)
    assert again.metrics == report.metrics or any(math.isnan(m.last) for m in report.metrics)


@given(windows())
def test_window_round_trips(window: MetricWindow) -> None:
    assert_same(MetricWindow.from_dict(wire(window.to_dict())).to_dict(), window.to_dict())


@given(st.integers(0, LIMITS.max_integer), st.lists(commands, max_size=LIMITS.max_commands))
def test_response_round_trips(seq: int, cmds: list[Command]) -> None:
    response = ReportResponse(seq, tuple(cmds))
    assert ReportResponse.from_dict(wire(response.to_dict())) == response


@given(trainer_statuses)
def test_trainer_status_round_trips(status: TrainerStatus) -> None:
    assert TrainerStatus.from_body(wire(status.to_body())) == status


@given(st.floats(0, 4e9))
def test_rfc3339_round_trips_to_the_second(t: float) -> None:
    assert parse_rfc3339(format_rfc3339(t)) == math.floor(t)


# ---------------------------------------------------------------------------- invalid input: ProtocolError


@given(json_values)
def test_any_json_is_read_or_refused_with_a_protocol_error(data: Any) -> None:
    for read in (
        Report.from_dict,
        ReportResponse.from_dict,
        TrainerStatus.from_body,
        MetricWindow.from_dict,
        Identity.from_dict,
        Progress.from_dict,
        Command.from_dict,
        GpuReading.from_dict,
    ):
        try:
            read(data)
        except ProtocolError:
            pass


@given(mutated_reports())
def test_a_mutated_report_is_read_or_refused_with_a_protocol_error(body: dict[str, Any]) -> None:
    try:
        Report.from_dict(body)
    except ProtocolError:
        pass


@given(st.binary(max_size=512) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_body_decodes_or_raises_a_protocol_error(body: bytes) -> None:
    try:
        decode_body(body)
    except ProtocolError:
        pass


def test_deep_nesting_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        Report.from_dict(decode_body(b"[" * 50_000 + b"]" * 50_000))


@pytest.mark.parametrize(
    "body",
    [
        '{"run_id":"r","seq":1,"sent_at":1%s}' % ("0" * 400),
        '{"run_id":"r","seq":1%s,"sent_at":1}' % ("0" * 30),
        '{"run_id":"r","seq":1,"sent_at":1,"progress":{"step":9223372036854775808}}',
        '{"run_id":"r","seq":1,"sent_at":1,"metrics":[{"name":"x","last":1%s,"count":1,"first_step":0,'
        '"last_step":0}]}' % ("0" * 400),
    ],
)
def test_integers_beyond_the_limit_are_protocol_errors(body: str) -> None:
    """Found by the fuzzing: an integer too large for a float or for the store was an OverflowError (a 500)."""
    with pytest.raises(ProtocolError):
        Report.from_dict(decode_body(body.encode()))


# ------------------------------------------------------------------------------------------------ limits


def _report(**fields: Any) -> dict[str, Any]:
    return {"run_id": "r", "seq": 1, "sent_at": 1.0, **fields}


def _window(name: str) -> dict[str, Any]:
    return MetricWindow(name, 1.0, 1.0, 1.0, 1.0, 1, 0, 0, 0).to_dict()


@given(st.integers(0, 2 * LIMITS.max_metrics_per_report))
def test_metric_count_limit(n: int) -> None:
    body = _report(metrics=[_window(f"m{i}") for i in range(n)])
    if n <= LIMITS.max_metrics_per_report:
        assert len(Report.from_dict(body).metrics) == n
    else:
        with pytest.raises(ProtocolError):
            Report.from_dict(body)


@given(st.text(min_size=0, max_size=2 * LIMITS.max_metric_name_length))
def test_metric_name_limit(name: str) -> None:
    ok = 0 < len(name) <= LIMITS.max_metric_name_length and name.isprintable()
    try:
        Report.from_dict(_report(metrics=[_window("x") | {"name": name}]))
    except ProtocolError:
        assert not ok
    else:
        assert ok


@given(st.integers(0, 2 * LIMITS.max_body_bytes))
def test_body_size_limit(size: int) -> None:
    body = b'"' + b"x" * max(size - 2, 0) + b'"'
    if len(body) > LIMITS.max_body_bytes:
        with pytest.raises(BodyTooLarge):
            decode_body(body)
    else:
        decode_body(body)


@given(st.integers(-5, LIMITS.max_integer + 5))
def test_integer_limit(step: int) -> None:
    body = _report(progress={"step": step})
    if 0 <= step <= LIMITS.max_integer:
        assert Report.from_dict(body).progress.step == step
    else:
        with pytest.raises(ProtocolError):
            Report.from_dict(body)
