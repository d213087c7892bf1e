"""The sender and its wire modes, driven cycle by cycle with a fake clock and an in-memory transport."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepwatch._sender import Sender
from stepwatch._transport import Response, TokenSource, TransportError
from stepwatch._window import WindowBuffer
from stepwatch._wire import KubeflowWire, NativeWire, Snapshot
from stepwatch.protocol import (
    LIMITS,
    Command,
    Identity,
    Progress,
    Report,
    ReportResponse,
    TrainerStatus,
    encode_body,
)
from stepwatch.testing import MemoryTransport


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A sender that is never started: each ``cycle()`` is one iteration of its loop."""

    def __init__(self, wire: NativeWire | KubeflowWire | None = None, token: TokenSource | None = None) -> None:
        self.clock = Clock()
        self.transport = MemoryTransport()
        self.buffer = WindowBuffer()
        self.step = 0
        self.state = "running"
        self.commands: list[Command] = []
        self.wire = wire or NativeWire("http://sw.test/r", "run1", Identity(), {"lr": 0.1})
        self.sender = Sender(
            wire=self.wire,
            transport=self.transport,
            buffer=self.buffer,
            snapshot=lambda: Snapshot(1.7e9, Progress(step=self.step, total_steps=100)),
            on_command=self.commands.append,
            token=token or TokenSource("secret"),
            interval=2.0,
            request_timeout=5.0,
            clock=self.clock,
            random_fraction=lambda: 1.0,  # no jitter: delays are exact
        )
        self.sender._next_report = self.clock.now

    def steps(self, n: int) -> None:
        for _ in range(n):
            self.step += 1
            self.buffer.add(self.step, {"loss": 1.0 / self.step})

    def cycle(self, advance: float = 0.0) -> None:
        self.clock.now += advance
        self.sender._cycle()

    def reports(self) -> list[Report]:
        return [Report.from_dict(json.loads(r.body)) for r in self.transport.requests]


def ok(*commands: Command, seq: int = 0) -> Response:
    return Response(200, {}, encode_body(ReportResponse(seq, commands).to_dict()))


def test_a_report_goes_out_every_interval_with_its_window() -> None:
    h = Harness()
    h.steps(5)
    h.cycle()
    h.steps(3)
    h.cycle(1.0)  # not due yet
    assert len(h.transport.requests) == 1
    h.cycle(1.0)
    reports = h.reports()
    assert [r.seq for r in reports] == [0, 1]
    assert [r.metrics[0].count for r in reports] == [5, 3]
    assert reports[0].params == {"lr": 0.1} and reports[1].params is None
    assert h.transport.requests[0].headers["Authorization"] == "Bearer secret"
    assert h.transport.requests[0].headers["Content-Type"] == "application/json"


def test_failures_back_off_exponentially_up_to_a_cap_and_retry_the_same_report() -> None:
    h = Harness()
    h.transport.script(*[Response(500, {}, b"oops")] * 8)
    h.steps(1)
    h.cycle()
    delays = []
    for _ in range(7):
        delays.append(round(h.sender._retry_at - h.clock.now, 3))
        h.steps(1)
        h.cycle(h.sender._retry_at - h.clock.now)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    bodies = {r.body for r in h.transport.requests}
    assert len(bodies) == 1  # the in-flight report is retried unchanged: same seq, stored once
    h.cycle(h.sender._retry_at - h.clock.now)  # the 8th failure
    h.cycle(h.sender._retry_at - h.clock.now)  # accepted, then the merged next report goes out at once
    reports = h.reports()
    assert [r.seq for r in reports[-2:]] == [0, 1]
    assert reports[-2].metrics[0].count + reports[-1].metrics[0].count == h.step


def test_jitter_spreads_retries() -> None:
    h = Harness()
    h.sender._random = lambda: 0.0
    h.transport.refuse()
    h.steps(1)
    h.cycle()
    assert h.sender._retry_at - h.clock.now == pytest.approx(0.5)
    assert "unreachable" in (h.sender.last_error or "")


@pytest.mark.parametrize(("header", "at_least"), [("7", 7.0), ("0.5", 1.0), ("not a date", 1.0)])
def test_429_honours_retry_after(header: str, at_least: float) -> None:
    h = Harness()
    h.transport.script(Response(429, {"retry-after": header}, b""))
    h.steps(1)
    h.cycle()
    assert h.sender._retry_at - h.clock.now == pytest.approx(at_least)


def test_retry_after_as_an_http_date() -> None:
    import email.utils
    import time

    h = Harness()
    when = email.utils.formatdate(time.time() + 20, usegmt=True)
    h.transport.script(Response(429, {"retry-after": when}, b""))
    h.steps(1)
    h.cycle()
    assert 18 <= h.sender._retry_at - h.clock.now <= 21


def test_auth_failures_reread_the_token_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old")
    h = Harness(token=TokenSource(path=str(token_file)))
    h.transport.script(Response(403, {}, b"forbidden"), Response(401, {}, b""))
    h.steps(1)
    h.cycle()
    token_file.write_text("new\n")
    h.cycle(h.sender._retry_at - h.clock.now)
    h.cycle(h.sender._retry_at - h.clock.now)
    auth = [r.headers.get("Authorization") for r in h.transport.requests]
    assert auth[:3] == ["Bearer old", "Bearer new", "Bearer new"]  # 403, 401, then accepted
    assert h.sender.sent >= 1
    assert caplog.text.count("refused the token") == 1


def test_a_missing_token_file_is_said_once_and_requests_go_without_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = Harness(token=TokenSource(path=str(tmp_path / "absent")))
    h.steps(1)
    h.cycle()
    h.steps(1)
    h.cycle(2.0)
    assert all("Authorization" not in r.headers for r in h.transport.requests)
    assert caplog.text.count("cannot read token file") == 1


@pytest.mark.parametrize("status", [400, 413, 422])
def test_a_rejected_report_is_dropped_not_retried_forever(status: int, caplog: pytest.LogCaptureFixture) -> None:
    h = Harness()
    h.transport.script(Response(status, {}, b'{"message":"bad"}'))
    h.steps(1)
    h.cycle()
    h.steps(1)
    h.cycle(2.0)
    assert [r.seq for r in h.reports()] == [0, 1]
    assert "rejected a report" in caplog.text and '{"message":"bad"}' in caplog.text


@pytest.mark.parametrize("status", [404, 408, 500, 502, 503])
def test_transient_statuses_are_retried(status: int) -> None:
    h = Harness()
    h.transport.script(Response(status, {}, b""))
    h.steps(1)
    h.cycle()
    h.cycle(h.sender._retry_at - h.clock.now)
    assert [r.seq for r in h.reports()] == [0, 0]


def test_unsent_windows_merge_while_the_server_is_away() -> None:
    h = Harness()
    h.transport.default = TransportError("refused")  # type: ignore[assignment]
    h.transport.script(*[TransportError("refused")] * 1000)
    for _ in range(300):  # ten minutes of 2 s intervals
        h.steps(10)
        h.cycle(2.0)
    assert len(h.wire._inflight) == 1
    assert len(h.wire._windows) == 1  # one merged window per metric, whatever the outage length
    h.transport._script.clear()
    h.transport.default = ok()
    h.cycle(h.sender._retry_at - h.clock.now)
    delivered = h.reports()
    accepted = {r.seq: r for r in delivered}
    assert sum(m.count for r in accepted.values() for m in r.metrics) == h.step


def test_large_reports_are_split_under_the_body_limit() -> None:
    params = {f"param_{i:03d}": "v" * LIMITS.max_param_value_length for i in range(LIMITS.max_params)}
    wire = NativeWire("http://sw.test/r", "run1", Identity(), params)
    h = Harness(wire=wire)
    names = [f"metric/{i:03d}/" + "x" * 50 for i in range(LIMITS.max_metrics_per_report)]
    h.buffer.add(1, dict.fromkeys(names, 1.0 / 3.0))
    h.cycle()
    bodies = [r.body for r in h.transport.requests]
    assert len(bodies) > 1
    assert all(len(b) <= LIMITS.max_body_bytes for b in bodies)
    reports = h.reports()
    assert reports[0].params == params and all(r.params is None for r in reports[1:])
    assert sorted(m.name for r in reports for m in r.metrics) == sorted(names)
    assert len({r.seq for r in reports}) == len(reports)


def test_commands_are_delivered_once_and_acknowledged() -> None:
    h = Harness()
    stop = Command(id="c1", kind="stop", reason="plateau")
    h.transport.script(ok(stop), ok(stop), ok())
    h.steps(1)
    h.cycle()
    assert h.commands == [stop]
    h.steps(1)
    h.cycle(2.0)  # the server repeats it (it has not seen the ack yet): not delivered twice
    h.cycle(2.0)
    assert h.commands == [stop]
    acks = [r.acks for r in h.reports()]
    assert acks[1] == ("c1",)


def test_a_garbage_answer_counts_as_delivered_without_commands() -> None:
    h = Harness()
    h.transport.script(Response(200, {}, b"<html>proxy</html>"))
    h.steps(1)
    h.cycle()
    assert h.sender.sent == 1 and h.commands == []


# --------------------------------------------------------------------------------------- kubeflow


def kubeflow(snapshot: Snapshot, metrics: dict[str, float] | None = None) -> TrainerStatus:
    wire = KubeflowWire("http://kf.test/status")
    buffer = WindowBuffer()
    if metrics:
        buffer.add(snapshot.progress.step or 0, metrics)
    wire.collect(buffer.take(), snapshot)
    body = wire.pending()
    assert body is not None and len(body) <= LIMITS.max_body_bytes
    return TrainerStatus.from_body(json.loads(body))


def test_kubeflow_status_while_running() -> None:
    status = kubeflow(
        Snapshot(1.7e9, Progress(step=333, total_steps=1000, epoch=1.25, total_epochs=3, eta_seconds=123.4)),
        {"loss": 0.25, "grad_norm": float("nan"), "learning_rate": 3e-5, "eval_loss": float("inf")},
    )
    assert status.progress_percentage == 33
    assert status.estimated_remaining_seconds == 123
    assert status.last_updated_time == "2023-11-14T22:13:20Z"
    values = {m.name: m.value for m in status.metrics}
    assert values == {
        "current_step": "333",
        "total_steps": "1000",
        "current_epoch": "1.25",
        "total_epochs": "3",
        "loss": "0.25",
        "grad_norm": "NaN",
        "learning_rate": "3e-05",
        "eval_loss": "Inf",
    }


def test_kubeflow_final_status_keeps_step_metrics() -> None:
    status = kubeflow(Snapshot(1.7e9, Progress(step=1000, total_steps=1000), state="finished"), {"loss": 0.1})
    assert (status.progress_percentage, status.estimated_remaining_seconds) == (100, 0)
    assert {m.name for m in status.metrics} >= {"current_step", "total_steps", "loss"}


def test_kubeflow_progress_from_epochs_and_unknown_totals() -> None:
    assert kubeflow(Snapshot(1.7e9, Progress(step=5, epoch=1.5, total_epochs=2))).progress_percentage == 75
    unknown = kubeflow(Snapshot(1.7e9, Progress(step=5)))
    assert (unknown.progress_percentage, unknown.estimated_remaining_seconds) == (None, None)


def test_kubeflow_keeps_the_latest_value_of_every_metric_within_the_limit() -> None:
    wire = KubeflowWire("http://kf.test/status")
    buffer = WindowBuffer()
    buffer.add(1, {f"m{i}": float(i) for i in range(300)})
    wire.collect(buffer.take(), Snapshot(1.7e9, Progress(step=1, total_steps=10)))
    buffer.add(2, {"m0": 42.0})
    wire.collect(buffer.take(), Snapshot(1.7e9, Progress(step=2, total_steps=10)))
    status = TrainerStatus.from_body(json.loads(wire.pending() or b""))
    assert len(status.metrics) <= LIMITS.max_metrics_per_report
    assert {m.name: m.value for m in status.metrics}["m0"] == "42"
