"""Failure behaviour of the report core: what a training loop sees when the server misbehaves.

Every scenario runs a real training-like loop (steps of ~2 ms, logging ``loss`` and ``lr``) against a
real loopback :class:`~stepwatch.testing.ReportSink` that goes down, answers errors, hangs, or hands
out commands; some run a real training script in a subprocess (signals, interpreter exit) or fork.
Each checks that the loop is not slowed (against a baseline loop measured in the same test), that no
exception escapes, that the final state arrives once the server is back, and that no accepted value
is lost or counted twice: with one ``loss`` per step, the stored ``loss`` windows of a run must cover
steps 1..N exactly once.

Strict ``xfail`` tests document bugs found while writing these tests (see their reasons).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

import stepwatch
from stepwatch import _run
from stepwatch._transport import HTTPTransport, Response, TransportError
from stepwatch.protocol import Report
from stepwatch.testing import MemoryTransport, Received, ReportSink, wait_for

STEPS = 300
"""Steps of the standard loop (about 0.65 s)."""
WORK_S = 0.002
"""The work of one step."""
INTERVAL = 0.05
"""Seconds between reports in these tests (the default is 2 s)."""
RATIO, SLACK_S = 1.5, 0.3
"""A loop may take at most RATIO times the baseline plus SLACK_S (two shared, noisy cores)."""

# ------------------------------------------------------------------------------------------ fixtures


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(autouse=True)
def fresh_stepwatch(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[None]:
    """No stepwatch variable leaks in; no run outlives its test, and tearing one down is quick.

    No exception escaped inside stepwatch either: the sender thread and the hot path swallow and
    log them ("a reporting cycle failed", "step() failed"), so the log is where they show.
    """
    for name in list(os.environ):
        if name.startswith(("STEPWATCH_", "KUBEFLOW_TRAINER_SERVER_")):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STEPWATCH_HANDLE_SIGTERM", "0")  # pytest's own process keeps its signals
    logger = logging.getLogger("stepwatch")
    warnings = _Warnings()
    logger.addHandler(warnings)
    try:
        yield
    finally:
        for run in list(_run._ACTIVE):
            run._flush_timeout = 0.5  # a test that failed half-way must not wait 5 s on a dead sink
            run.finish()
        stepwatch.finish()
        _run._ACTIVE.clear()
        _run._current = None
        logger.removeHandler(warnings)
    if request.node.get_closest_marker("xfail") is None:
        assert [m for m in warnings.messages if "cycle failed" in m or "() failed" in m] == []


@pytest.fixture
def sink() -> Iterator[ReportSink]:
    """The sink that misbehaves in a test; stopped quickly afterwards, even while it hangs."""
    server = ReportSink().start()
    try:
        yield server
    finally:
        server.delay = 0  # then stop() cuts the hanging requests at once
        server.stop()


@pytest.fixture(scope="module")
def healthy() -> Iterator[ReportSink]:
    """A well-behaved sink for the baseline loops (shared: its contents are never asserted)."""
    with ReportSink() as server:
        yield server


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """A real training script, for what only a separate process can show (signals, exit)."""
    path = tmp_path / "train.py"
    path.write_text(_SCRIPT)
    return path


# ------------------------------------------------------------------------------------------- helpers


def train(run: stepwatch.Run, steps: int = STEPS, at: Mapping[int, Callable[[], object]] | None = None) -> float:
    """A training-like loop; returns its wall time, not counting the faults injected ``at`` steps."""
    at = at or {}
    injected = 0.0
    weight, lr = 3.0, 0.05
    start = time.perf_counter()
    for i in range(1, steps + 1):
        time.sleep(WORK_S)
        grad = 2.0 * (weight - 1.0)
        weight -= lr * grad
        run.step(loss=(weight - 1.0) ** 2 + 1.0 / i, lr=lr)
        action = at.get(i)
        if action is not None:
            t0 = time.perf_counter()
            action()
            injected += time.perf_counter() - t0
    return time.perf_counter() - start - injected


def baseline(healthy: ReportSink, steps: int = STEPS) -> float:
    """The wall time of the same loop reporting to a healthy sink."""
    run = stepwatch.init(job="baseline", url=healthy.url, interval=INTERVAL, flush_timeout=15)
    elapsed = train(run, steps)
    assert run.finish()  # a healthy sink on loopback: the flush waits only on a loaded machine's scheduler
    return elapsed


def assert_not_slowed(elapsed: float, base: float) -> None:
    assert elapsed <= RATIO * base + SLACK_S, f"loop took {elapsed:.3f} s, baseline {base:.3f} s"


def report_requests(sink: ReportSink) -> list[Received]:
    """The report requests the sink answered (not the job's self-registration)."""
    return [r for r in list(sink.received) if r.path.endswith("/reports")]


def reports_of(sink: ReportSink, run: stepwatch.Run) -> list[Report]:
    return [r for r in list(sink.reports) if r.run_id == run.run_id]


def counted(reports: list[Report], name: str = "loss") -> int:
    return sum(m.count for r in reports for m in r.metrics if m.name == name)


def assert_complete(reports: list[Report], steps: int, name: str = "loss") -> None:
    """One value per step: the stored windows cover steps 1..steps, each exactly once."""
    windows = sorted((m for r in reports for m in r.metrics if m.name == name), key=lambda m: m.first_step)
    assert sum(m.count for m in windows) == steps, [(m.first_step, m.last_step, m.count) for m in windows]
    assert windows[0].first_step == 1
    assert windows[-1].last_step == steps
    for before, after in itertools.pairwise(windows):
        assert after.first_step == before.last_step + 1, (before, after)
    for m in windows:
        assert m.count == m.last_step - m.first_step + 1, m


def assert_complete_until_signal(reports: list[Report], final: Report) -> None:
    """Complete up to the final step, whose value may be missing: the signal can land inside step()."""
    last = max(m.last_step for r in reports for m in r.metrics if m.name == "loss")
    assert final.progress.step is not None
    assert last in (final.progress.step - 1, final.progress.step)
    assert_complete(reports, last)


def finish_delivered(
    run: stepwatch.Run, sink: ReportSink, state: str = "finished", expected: str | None = None
) -> None:
    """``finish()`` delivers the final state (``expected``: what a stop asked for turns it into), and the
    sender thread is gone afterwards."""
    sender = run._sender
    assert sender is not None
    assert run.finish(state) is True
    final = [r for r in reports_of(sink, run) if r.state != "running"]
    assert [r.state for r in final] == [expected or state]
    assert sender._thread is not None
    sender._thread.join(2)
    assert not sender.alive


def warnings_of(caplog: pytest.LogCaptureFixture, text: str = "") -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "stepwatch" and r.levelno >= logging.WARNING and text in r.getMessage()
    ]


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


# ---------------------------------------------------------------------------- 1-3: down, back, 500s


def test_server_down_from_start_delivers_everything_at_finish(sink: ReportSink, healthy: ReportSink) -> None:
    base = baseline(healthy)
    sink.down()
    run = stepwatch.init(job="down-from-start", url=sink.url, interval=INTERVAL, flush_timeout=5)
    elapsed = train(run)
    assert run._sender is not None
    assert run._sender.sent == 0
    assert "unreachable" in (run._sender.last_error or "")
    sink.up()
    finish_delivered(run, sink)
    reports = reports_of(sink, run)
    assert len(reports) <= 3  # the report in flight since the start, then every window merged
    assert_complete(reports, STEPS)
    assert counted(reports, "lr") == STEPS
    assert sink.final() is not None and sink.final().progress.step == STEPS  # type: ignore[union-attr]
    assert_not_slowed(elapsed, base)


@pytest.mark.parametrize("outage", ["long", "blip"])
def test_server_down_mid_run_and_back(sink: ReportSink, healthy: ReportSink, outage: str) -> None:
    base = baseline(healthy)
    run = stepwatch.init(job="down-mid-run", url=sink.url, interval=INTERVAL, flush_timeout=5)
    faults = {100: sink.down, 200: sink.up}  # down for a third of the run: keep-alive connections are cut
    if outage == "blip":  # down and up between two reports: the kept-alive connection is stale
        faults = {150: lambda: (sink.down(), sink.up())}
    elapsed = train(run, at=faults)
    # reporting resumes by itself once the server is back, without waiting for finish(): after the backoff
    # (1 s doubling per failure, up to 30 s), which grows with the outage's length on a loaded machine
    assert sink.wait_for(lambda s: any(r.progress.step == STEPS for r in reports_of(s, run)), 35)
    finish_delivered(run, sink)
    reports = reports_of(sink, run)
    assert_complete(reports, STEPS)
    assert counted(reports, "lr") == STEPS
    assert_not_slowed(elapsed, base)


def test_server_answering_500s_for_a_while(sink: ReportSink, healthy: ReportSink) -> None:
    base = baseline(healthy)
    run = stepwatch.init(job="five-hundreds", url=sink.url, interval=INTERVAL, flush_timeout=5)
    elapsed = train(run, at={50: lambda: sink.fail(500, times=4)})
    finish_delivered(run, sink)
    assert [r.status for r in sink.received].count(500) == 4
    assert sink.duplicates == 0  # a 500 stored nothing; the retry is not a duplicate
    assert_complete(reports_of(sink, run), STEPS)
    assert_not_slowed(elapsed, base)


# ------------------------------------------------------------------------------------ 4: a hanging server


@pytest.mark.parametrize("request_timeout", ["0.3", None], ids=["short-request-timeout", "default-10s"])
def test_hanging_server_does_not_slow_the_loop_and_finish_is_bounded(
    sink: ReportSink, healthy: ReportSink, monkeypatch: pytest.MonkeyPatch, request_timeout: str | None
) -> None:
    base = baseline(healthy)
    if request_timeout is not None:
        monkeypatch.setenv("STEPWATCH_REQUEST_TIMEOUT", request_timeout)
    sink.delay = 30  # far longer than the loop and the flush: every request hangs
    flush_timeout = 1.0
    run = stepwatch.init(job="hanging", url=sink.url, interval=INTERVAL, flush_timeout=flush_timeout)
    elapsed = train(run)
    t0 = time.perf_counter()
    delivered = run.finish()
    finish_s = time.perf_counter() - t0
    assert delivered is False
    # finish() waits flush_timeout + 0.5 at most: twice that on a busy machine, never the hang's 30 s
    assert finish_s <= 2 * (flush_timeout + 0.5), finish_s
    assert reports_of(sink, run) == []
    assert_not_slowed(elapsed, base)


def test_exit_with_a_hanging_server_is_bounded(sink: ReportSink, healthy: ReportSink, script: Path) -> None:
    """At interpreter exit the final flush waits at most the flush timeout, then the process ends."""
    t0 = time.perf_counter()
    assert _spawn(script, "normal", healthy).wait(20) == 0
    base = time.perf_counter() - t0
    sink.delay = 30
    t0 = time.perf_counter()
    assert _spawn(script, "normal", sink, STEPWATCH_FLUSH_TIMEOUT="1").wait(20) == 0
    assert time.perf_counter() - t0 <= 2 * (base + 1.0 + 0.5)  # the flush timeout and its 0.5 s, not the hang


# ------------------------------------------------------------------------------------------- 5: 429


def test_429_retry_after_is_honoured(sink: ReportSink, healthy: ReportSink) -> None:
    steps = 700  # ~1.5 s: the retry after the 429 happens while the loop still runs
    base = baseline(healthy, steps)
    run = stepwatch.init(job="rate-limited", url=sink.url, interval=INTERVAL, flush_timeout=5)
    assert sink.wait_for(lambda s: len(reports_of(s, run)) >= 1, 5)
    sink.fail(429, times=1, headers={"Retry-After": "1"})
    elapsed = train(run, steps)
    statuses = [(r.time, r.status) for r in sink.received]
    limited = [t for t, status in statuses if status == 429]
    assert len(limited) == 1
    after = [t for t, _ in statuses if t > limited[0]]
    assert after, "no request after the 429 while the loop ran"
    assert after[0] - limited[0] >= 0.95, after[0] - limited[0]
    finish_delivered(run, sink)
    assert_complete(reports_of(sink, run), steps)
    assert_not_slowed(elapsed, base)


def test_429_retry_after_is_honoured_by_the_final_flush(sink: ReportSink) -> None:
    run = stepwatch.init(job="rate-limited-at-end", url=sink.url, interval=INTERVAL, flush_timeout=4)
    assert sink.wait_for(lambda s: len(reports_of(s, run)) >= 1, 5)
    sink.fail(429, times=1, headers={"Retry-After": "1"})
    train(run, 50)
    assert sink.wait_for(lambda s: any(r.status == 429 for r in s.received), 5)
    assert run.finish() is True  # a 4 s budget has room for a 1 s wait
    limited = next(r.time for r in sink.received if r.status == 429)
    after = [r.time for r in sink.received if r.time > limited]
    assert after[0] - limited >= 0.95, after[0] - limited


# ------------------------------------------------------------------------------------------- 6: 403


def test_403_warns_once_however_many_and_training_goes_on(
    sink: ReportSink, healthy: ReportSink, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stepwatch")
    base = baseline(healthy)
    sink.token = "the-right-one"
    run = stepwatch.init(job="forbidden", url=sink.url, token="a-wrong-one", interval=INTERVAL, flush_timeout=1.5)
    elapsed = train(run)
    assert run.finish() is False  # never accepted
    refused = [r for r in sink.received if r.status == 403]
    assert len(refused) >= 3  # the start, the backoff retries, and the final flush's retries
    assert all(r.headers.get("authorization") == "Bearer a-wrong-one" for r in refused)
    assert len(warnings_of(caplog, "refused the token")) == 1
    assert sink.reports == []
    assert_not_slowed(elapsed, base)


@pytest.mark.parametrize("rotation", ["rewritten", "replaced"])
def test_rotating_token_file_is_reread_after_403(
    sink: ReportSink, healthy: ReportSink, tmp_path: Path, caplog: pytest.LogCaptureFixture, rotation: str
) -> None:
    caplog.set_level(logging.WARNING, logger="stepwatch")
    base = baseline(healthy)
    sink.token = "new"
    token_file = tmp_path / "token"
    token_file.write_text("old\n")

    def rotate() -> None:  # as the kubelet does, once the old token has been refused
        sink.wait_for(lambda s: any(r.status == 403 for r in s.received), 5)
        if rotation == "rewritten":
            token_file.write_text("new\n")
        else:
            (tmp_path / "token.next").write_text("new\n")
            os.replace(tmp_path / "token.next", token_file)

    rotator = threading.Thread(target=rotate)
    rotator.start()
    run = stepwatch.init(job="rotating", url=sink.url, token_file=str(token_file), interval=INTERVAL, flush_timeout=5)
    elapsed = train(run)
    rotator.join()
    finish_delivered(run, sink)
    auth = [(r.status, r.headers.get("authorization")) for r in sink.received]
    assert auth[0] == (403, "Bearer old")
    first_ok = next(i for i, (status, _) in enumerate(auth) if status == 200)
    assert all(a == (200, "Bearer new") for a in auth[first_ok:]), auth
    assert len(warnings_of(caplog, "refused the token")) == 1
    assert_complete(reports_of(sink, run), STEPS)
    assert_not_slowed(elapsed, base)


# ------------------------------------------------------------------------------------- 7: rejections


@pytest.mark.parametrize("status", [400, 422])
def test_rejected_report_is_dropped_once_and_later_reports_flow(
    sink: ReportSink, healthy: ReportSink, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    caplog.set_level(logging.WARNING, logger="stepwatch")
    base = baseline(healthy)
    run = stepwatch.init(job="rejected", url=sink.url, interval=INTERVAL, flush_timeout=5)
    elapsed = train(run, at={100: lambda: sink.fail(status, times=3, body=b'{"message": "invalid"}')})
    finish_delivered(run, sink)
    rejected = [r.json() for r in report_requests(sink) if r.status == status]
    assert len(rejected) == 3
    seqs = [body["seq"] for body in rejected]
    assert len(set(seqs)) == 3  # each rejected body was sent once: never retried
    retried = [r for r in report_requests(sink) if r.status != status and r.json()["seq"] in seqs]
    assert retried == []
    assert len(warnings_of(caplog, f"rejected a report ({status})")) == 1
    reports = reports_of(sink, run)
    assert reports[-1].state == "finished"
    assert max(r.seq for r in reports) > max(seqs)  # later reports flowed
    lost = sum(m["count"] for body in rejected for m in body["metrics"] if m["name"] == "loss")
    assert counted(reports) + lost == STEPS  # what was dropped is exactly what was rejected
    assert_not_slowed(elapsed, base)


def test_finish_reports_a_rejected_final_state_as_not_delivered() -> None:
    def refuse_final(request: object) -> Response:
        state = json.loads(request.body)["state"]  # type: ignore[attr-defined]
        return Response(422 if state != "running" else 200, {}, b"")

    transport = MemoryTransport()
    transport.script(*[refuse_final] * 1000)
    run = stepwatch.init(
        job="final-rejected", url="http://sink.invalid", token="t", interval=INTERVAL, transport=transport
    )
    train(run, 50)
    assert run.finish() is False


# ------------------------------------------------------------------------------ 8: duplicate delivery


class LosesAnswers:
    """The real HTTP transport, except that the answers to the chosen reports (1, 2...) never arrive."""

    def __init__(self, lose: set[int]) -> None:
        self.inner = HTTPTransport()
        self.lose = lose
        self.bodies: list[bytes] = []

    def request(self, method: str, url: str, *, headers: Mapping[str, str], body: bytes, timeout: float) -> Response:
        response = self.inner.request(method, url, headers=headers, body=body, timeout=timeout)
        if not url.endswith("/reports"):
            return response  # the job registering itself
        self.bodies.append(body)
        if len(self.bodies) in self.lose:  # stored by the server, then the connection broke
            raise TransportError("connection reset after the request was sent (test)")
        return response

    def close(self) -> None:
        self.inner.close()


def test_lost_answer_is_retried_with_the_same_seq_and_stored_once(sink: ReportSink, healthy: ReportSink) -> None:
    base = baseline(healthy)
    transport = LosesAnswers(lose={2, 3})
    run = stepwatch.init(job="lost-answers", url=sink.url, interval=INTERVAL, flush_timeout=5, transport=transport)
    elapsed = train(run)
    finish_delivered(run, sink)
    assert transport.bodies[1] == transport.bodies[2] == transport.bodies[3]  # retried unchanged
    assert sink.duplicates == 2
    reports = reports_of(sink, run)
    assert len({r.seq for r in reports}) == len(reports)
    assert_complete(reports, STEPS)
    assert_not_slowed(elapsed, base)


def test_lost_answer_in_memory_transport_keeps_the_seq() -> None:
    def answer_lost(request: object) -> Response:  # the server stored it; the answer broke
        raise TransportError("connection reset after the request was sent (test)")

    transport = MemoryTransport()
    transport.script(Response(200), answer_lost, answer_lost)
    run = stepwatch.init(
        job="lost-memory", url="http://sink.invalid", token="t", interval=INTERVAL, transport=transport
    )
    train(run, 100)
    assert run.finish() is True
    bodies = [json.loads(r.body) for r in transport.requests]
    assert bodies[1]["seq"] == bodies[2]["seq"] == bodies[3]["seq"]
    assert transport.requests[1].body == transport.requests[3].body
    stored = {b["seq"]: Report.from_dict(b) for b in bodies}  # a server keeps one per seq
    assert_complete(list(stored.values()), 100)


# -------------------------------------------------------------------------------- 9: bad metrics


def test_bad_metric_names_and_values_are_dropped_with_one_warning_each(
    sink: ReportSink, healthy: ReportSink, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stepwatch")
    base = baseline(healthy)
    bad: dict[str, object] = {
        "bad\nname": 1.0,
        "x" * 70: 2.0,
        "": 3.0,
        "text": "abc",
        "nothing": None,
        "pair": [1, 2],
        "mapping": {"a": 1},
    }
    run = stepwatch.init(job="bad-metrics", url=sink.url, interval=INTERVAL, flush_timeout=5)
    start = time.perf_counter()
    for i in range(1, STEPS + 1):
        time.sleep(WORK_S)
        run.step(loss=1.0 / i, lr=0.1, acc=0.5 if i % 2 else "n/a", **bad)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - start
    finish_delivered(run, sink)
    messages = warnings_of(caplog)
    for name in [*bad, "acc"]:
        assert sum(f"dropped metric {name!r}:" in m for m in messages) == 1, (name, messages)
    assert len(messages) == len(bad) + 1
    reports = reports_of(sink, run)
    names = {m.name for r in reports for m in r.metrics}
    assert names == {"loss", "lr", "acc"}
    assert_complete(reports, STEPS)
    assert counted(reports, "lr") == STEPS
    assert counted(reports, "acc") == STEPS // 2  # the good values of a half-bad metric are kept
    assert run._buffer.dropped == len(bad) * STEPS + STEPS // 2
    assert_not_slowed(elapsed, base)


def test_value_whose_float_raises_another_error_loses_only_itself(sink: ReportSink) -> None:
    class Lazy:  # e.g. a lazy value of a library stepwatch does not know, not materialised
        def __float__(self) -> float:
            raise RuntimeError("not materialised")

    run = stepwatch.init(job="lazy-metric", url=sink.url, interval=INTERVAL, flush_timeout=5)
    for i in range(1, 101):
        time.sleep(WORK_S)
        run.step(loss=1.0 / i, lazy=Lazy())
    assert run.finish() is True
    assert_complete(reports_of(sink, run), 100)


# ------------------------------------------------------------------------- 10-11: signals and exit


_SCRIPT = """
import os, signal, sys, time

mode = sys.argv[1]
if mode == "sigterm-user":  # the user's own handler, installed before stepwatch.init
    def on_term(signum, frame):
        with open(os.environ["MARK_FILE"], "w") as fh:
            fh.write("user handler ran")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)

import stepwatch

def train(run, steps):
    for i in range(1, steps + 1):
        time.sleep(0.002)
        run.step(loss=1.0 / i, lr=0.1)

if mode.startswith("with-"):
    with stepwatch.init(job="exits", interval=0.05) as run:
        train(run, 50)
        if mode == "with-raises":
            raise RuntimeError("diverged")
        sys.exit(3)
run = stepwatch.init(job="exits", interval=0.05)
if mode.startswith("sigterm"):
    while True:
        train(run, 10)
train(run, 50)
if mode == "raises":
    raise ValueError("bad batch")
if mode == "interrupted":
    raise KeyboardInterrupt
if mode == "exit-3":
    sys.exit(3)
"""


def _spawn(script: Path, mode: str, sink: ReportSink, **env: str) -> subprocess.Popen[bytes]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_TRAINER_"))}
    child_env.update(
        {"STEPWATCH_URL": sink.url, "STEPWATCH_FLUSH_TIMEOUT": "5", "STEPWATCH_HANDLE_SIGTERM": "1", **env}
    )
    return subprocess.Popen(
        [sys.executable, str(script), mode], env=child_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def test_sigterm_sends_stopped_and_dies_by_the_signal(sink: ReportSink, script: Path) -> None:
    proc = _spawn(script, "sigterm", sink)
    try:
        assert sink.wait_for(lambda s: any(r.metrics for r in s.reports), 15)  # the loop runs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM  # killed by the signal, as without stepwatch
    finally:
        proc.kill()
    final = sink.final()
    assert final is not None
    assert final.state == "stopped"
    assert "SIGTERM" in final.reason
    assert final.identity.pid == proc.pid
    assert_complete_until_signal(sink.reports, final)


def test_sigterm_runs_the_users_handler_too(sink: ReportSink, script: Path, tmp_path: Path) -> None:
    mark = tmp_path / "handled"
    proc = _spawn(script, "sigterm-user", sink, MARK_FILE=str(mark))
    try:
        assert sink.wait_for(lambda s: any(r.metrics for r in s.reports), 15)  # the loop runs
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0  # the user's handler exits 0
    finally:
        proc.kill()
    assert mark.read_text() == "user handler ran"
    final = sink.final()
    assert final is not None
    assert (final.state, final.reason) == ("stopped", "SIGTERM")
    assert len([r for r in sink.reports if r.state != "running"]) == 1
    assert_complete_until_signal(sink.reports, final)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("normal", (0, "finished", "")),
        ("raises", (1, "failed", "ValueError: bad batch")),
        ("with-raises", (1, "failed", "RuntimeError: diverged")),
        ("with-exit-3", (3, "failed", "SystemExit: 3")),
        ("interrupted", (-signal.SIGINT, "stopped", "KeyboardInterrupt")),
        pytest.param(
            "exit-3",
            (3, "failed", "SystemExit"),
            marks=pytest.mark.xfail(
                strict=True,
                reason="known limitation: Python gives atexit handlers no exit code, and SystemExit never "
                "reaches sys.excepthook, so sys.exit(3) outside a `with` block (or finish()) reads as "
                "'finished' at exit; the `with` path and the local runner (which sees the exit code) are right",
            ),
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else value[1],
)
def test_exit_paths_send_the_right_final_state(
    sink: ReportSink, script: Path, mode: str, expected: tuple[int, str, str]
) -> None:
    """Exit codes as without stepwatch; one final report with the state the exit means."""
    returncode, state, reason = expected
    proc = _spawn(script, mode, sink)
    try:
        assert proc.wait(20) == returncode
    finally:
        proc.kill()
    finals = [r for r in sink.reports if r.state != "running"]
    assert len(finals) == 1
    assert finals[0].state == state
    assert reason in finals[0].reason
    assert_complete(sink.reports, 50)


# ------------------------------------------------------------------------------------------ 12: fork


def _in_child(body: Callable[[], int]) -> int:
    """Fork; the child runs ``body`` and leaves with its code, skipping every exit handler."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 99
        try:
            code = body()
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # Python >= 3.12 warns on threads
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX (other tests) warns; the child never uses JAX
def test_forked_child_reports_nothing_and_parent_goes_on(sink: ReportSink, healthy: ReportSink) -> None:
    base = baseline(healthy)
    run = stepwatch.init(job="forking", url=sink.url, interval=INTERVAL, flush_timeout=5)
    elapsed = train(run, 100)

    def child() -> int:
        if stepwatch.current() is not None:
            return 2
        for i in range(3000):
            run.step(loss=float(i), lr=0.1)
            run.log(eval_loss=1.0)
        time.sleep(0.3)  # several intervals: a sender that survived the fork would report now
        return 0 if run.finish() is False else 3

    pid = _in_child(child)
    elapsed += train(run, STEPS - 100)
    assert _exit_code(pid) == 0
    finish_delivered(run, sink)
    assert {r.json()["identity"]["pid"] for r in report_requests(sink)} == {os.getpid()}
    assert "eval_loss" not in {m.name for r in sink.reports for m in r.metrics}
    assert run.current_step == STEPS
    assert_complete(reports_of(sink, run), STEPS)
    assert_not_slowed(elapsed, base)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_forked_child_can_start_its_own_run(sink: ReportSink) -> None:
    run = stepwatch.init(job="forking", url=sink.url, interval=INTERVAL, flush_timeout=5)
    train(run, 100)

    def child() -> int:
        own = stepwatch.init(job="forked-child", url=sink.url, interval=INTERVAL, flush_timeout=5)
        train(own, 50)
        return 0 if own.finish() else 3

    pid = _in_child(child)
    train(run, 100)
    assert _exit_code(pid) == 0
    finish_delivered(run, sink)
    mine = reports_of(sink, run)
    theirs = [r for r in sink.reports if r.identity.pid == pid]
    assert {r.identity.pid for r in mine} == {os.getpid()}
    assert theirs and {r.run_id for r in theirs} != {run.run_id}
    assert len({r.run_id for r in theirs}) == 1
    assert theirs[-1].state == "finished"
    assert_complete(theirs, 50)
    assert_complete(mine, 200)


# -------------------------------------------------------------------------------------- 13: commands


def test_commands_reach_the_loop_and_are_acknowledged(sink: ReportSink, healthy: ReportSink) -> None:
    base = baseline(healthy)
    run = stepwatch.init(job="commanded", url=sink.url, interval=INTERVAL, flush_timeout=5)
    issued: dict[str, int] = {}  # reports answered when the command was queued, and when the loop saw it
    seen: dict[str, int] = {}
    checkpoints = 0
    steps = 0
    start = time.perf_counter()
    for i in range(1, 3 * STEPS + 1):
        time.sleep(WORK_S)
        run.step(loss=1.0 / i, lr=0.1)
        steps = i
        if i == 50:
            sink.command("checkpoint", "plateau")
            issued["checkpoint"] = len(report_requests(sink))
        if run.should_checkpoint:  # a loop saves, then says so
            checkpoints += 1
            seen.setdefault("checkpoint", len(report_requests(sink)))
            assert run.command_reason == "plateau"
            run.checkpoint_done()
        if i == 200:
            sink.command("stop", "budget exceeded")
            issued["stop"] = len(report_requests(sink))
        if run.should_stop:
            seen["stop"] = len(report_requests(sink))
            break
    elapsed = time.perf_counter() - start
    assert "checkpoint" in seen and "stop" in seen, seen
    assert checkpoints == 1  # answered again until acknowledged, acted on once
    # counted in reports, not seconds: the answer to the next report carries the command (one report may be
    # on its way when it is queued), and the loop sees it at its next step (one more report at most meanwhile)
    assert 1 <= seen["checkpoint"] - issued["checkpoint"] <= 3, (issued, seen)
    assert 1 <= seen["stop"] - issued["stop"] <= 3, (issued, seen)
    assert run.command_reason == "budget exceeded"
    wait_for(lambda: not sink.pending_commands, what="the next reports to acknowledge both")
    finish_delivered(run, sink, expected="stopped")  # a loop that obeyed a stop ends stopped, not finished
    assert sink.pending_commands == []
    assert_complete(reports_of(sink, run), steps)
    assert_not_slowed(elapsed, base * steps / STEPS)


def test_sink_wait_for_accepts_predicates_that_use_the_sinks_accessors() -> None:
    server = ReportSink().start()
    returned = threading.Event()

    def wait() -> None:
        server.wait_for(lambda s: not s.pending_commands and s.final() is None, 0.2)
        returned.set()

    threading.Thread(target=wait, daemon=True).start()
    try:
        assert returned.wait(2)
    finally:
        if returned.is_set():
            server.stop()
        else:  # its lock stays held by the stuck waiter: close the listener without it
            assert server._server is not None
            server._server.shutdown()
            server._server.server_close()


# ---------------------------------------------------------------------------- 14: long outage, memory


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads VmRSS from /proc")
def test_long_outage_with_tiny_interval_stays_bounded(sink: ReportSink, healthy: ReportSink) -> None:
    base = baseline(healthy)
    steps = 1400  # ~3 s of a closed port with a report due every 10 ms
    sink.down()
    run = stepwatch.init(job="long-outage", url=sink.url, interval=0.01, flush_timeout=5)
    train(run, 100)  # warm up, then measure
    before = rss_kib()
    elapsed = train(run, steps - 100)
    grown = rss_kib() - before
    assert run._sender is not None and run._sender.sent == 0
    sink.up()
    finish_delivered(run, sink)
    reports = reports_of(sink, run)
    assert len(reports) <= 4  # not one per interval: one in flight, the rest merged
    assert_complete(reports, steps)
    assert counted(reports, "lr") == steps
    assert grown <= 8 * 1024, f"RSS grew {grown} KiB"
    assert_not_slowed(elapsed, base * (steps - 100) / STEPS)


# --------------------------------------------------------------------------------- 15: Kubeflow mode


@pytest.mark.slow
def test_kubeflow_mode_posts_at_most_every_5s_and_a_complete_final_status(
    sink: ReportSink, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token = tmp_path / "sa-token"
    token.write_text("kf-secret\n")
    sink.token = "kf-secret"
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", sink.kubeflow_url("team-a", "llm"))
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    total = 5000
    run = stepwatch.init(job="llm", total_steps=total, interval=0.1, flush_timeout=5)
    assert run.mode == "kubeflow"
    start = time.perf_counter()
    steps = 0
    while time.perf_counter() - start < 5.5:  # past the second status (at 5 s), well before the third
        time.sleep(WORK_S)
        steps += 1
        run.step(loss=1.0 / steps, learning_rate=1e-4)
    assert steps < total
    assert run.finish() is True
    posted = [r for r in sink.received if r.status == 200]
    assert len(posted) == len(sink.statuses) == 3
    assert all(r.headers.get("authorization") == "Bearer kf-secret" for r in posted)
    gap = posted[1].time - posted[0].time
    assert gap >= 4.9, gap  # interval=0.1 was raised to the upstream minimum of 5 s

    running, final = sink.statuses[1], sink.statuses[-1]
    values = {m.name: m.value for m in running.metrics}
    assert values["total_steps"] == str(total)
    assert running.progress_percentage == math.floor(100 * int(values["current_step"]) / total)
    assert running.estimated_remaining_seconds is not None

    values = {m.name: m.value for m in final.metrics}
    # it ended short of its total: its real progress, not 100 (issue 19)
    assert final.progress_percentage == math.floor(100 * int(values["current_step"]) / total) < 100
    assert final.estimated_remaining_seconds == 0
    assert values["current_step"] == str(steps)
    assert values["total_steps"] == str(total)
    assert float(values["loss"]) == pytest.approx(1.0 / steps)
