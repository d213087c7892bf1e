"""OpenShift AI progression, training side, in one process: what rank 0 serves, when, to whom, and how it holds up.

Every test talks to the real server over real loopback sockets, and every body is read with the port of
the controller's Go decoding (``stepwatch.testing.poll_progression`` -> ``decode_status``). Cases named
``A1``..``A14`` are those of ``../shared/reference/rhoai-progression.md``; the ones ported from Red Hat's SDK
name their upstream test (opendatahub-io/kubeflow-sdk ``release-3.4-GA`` @ 3fa50fe9,
``kubeflow/trainer/rhai/transformers_test.py``), whose callback the run stands in for: its
``on_train_begin`` / ``on_step_end`` / ``on_log`` / ``on_train_end`` are here ``init`` + ``update``,
``step``, ``log`` and ``finish``. Standard library only: this file runs in the bare environment too.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import stepwatch
from stepwatch import _setup, _status_server
from stepwatch._settings import SettingError, parse_metrics_port, resolve
from stepwatch._trainjob import trainjob_node
from stepwatch.protocol.progression import DEFAULT_METRICS_PORT, ProgressionStatus, decode_status
from stepwatch.testing import ReportSink, poll_progression, read_termination_message, wait_for

INTERVAL = 0.05
"""The sender's interval in these tests: a status is at most this old (plus a cycle)."""
KEYS = [
    "progressPercentage",
    "estimatedRemainingSeconds",
    "currentStep",
    "totalSteps",
    "currentEpoch",
    "totalEpochs",
    "trainMetrics",
    "evalMetrics",
]


@pytest.fixture
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "termination-log"
    monkeypatch.setenv("STEPWATCH_TERMINATION_LOG", str(path))
    return path


def _serve(**kwargs: Any) -> stepwatch.Run:
    kwargs.setdefault("job", "progression")
    run = stepwatch.init(metrics_port="127.0.0.1:0", interval=INTERVAL, **kwargs)
    assert run.metrics_address is not None
    return run


def _until(
    run: stepwatch.Run, predicate: Callable[[ProgressionStatus], bool], timeout: float = 10.0
) -> ProgressionStatus:
    """Poll (as the controller does) until the status served satisfies ``predicate``; that status."""
    address = run.metrics_address
    assert address is not None

    def satisfied() -> ProgressionStatus | None:
        status = poll_progression(address)
        return status if predicate(status) else None

    status: ProgressionStatus = wait_for(
        satisfied, timeout, "the status served to satisfy the predicate", every=INTERVAL / 2
    )
    return status


def _raw(address: tuple[str, int], request: bytes, timeout: float = 5.0) -> bytes:
    """Send ``request`` as it is and read the whole answer until the server closes."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def _head_of(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


# ------------------------------------------------------------------------------------- what is served


def test_any_path_answers_the_eight_keys_as_go_reads_them(termination_log: Path) -> None:
    """A1 (e2e ``wrapper-test-runtime.yaml``: 200 and the 8 keys on rank 0), A2 (integers, no NaN)."""
    run = _serve(total_steps=200)
    run.step(loss=0.5, learning_rate=1e-3)
    for path in ("/metrics", "/", "/anything/else?x=1"):
        status, headers, body = _head_of(_raw(run.metrics_address, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()))  # type: ignore[arg-type]
        assert status == 200
        assert headers["content-type"] == "application/json"
        assert headers["connection"] == "close"
        assert int(headers["content-length"]) == len(body)
        assert list(json.loads(body)) == KEYS
        decode_status(body)  # what Go takes
    head = _raw(run.metrics_address, b"HEAD /metrics HTTP/1.0\r\n\r\n")  # type: ignore[arg-type]
    status, headers, body = _head_of(head)
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


def test_nan_and_inf_come_out_null_and_the_poll_is_kept(termination_log: Path) -> None:
    """A2: Python's json.dumps would write NaN, which makes Go drop the whole poll (B11)."""
    run = _serve(total_steps=10)
    run.step(loss=math.nan, grad_norm=math.inf, eval_loss=-math.inf, learning_rate=0.1)
    status = _until(run, lambda s: s.current_step == 1)
    assert status.train_metrics == {"loss": None, "grad_norm": None, "learning_rate": 0.1}
    assert status.eval_metrics == {"eval_loss": None}
    run.step(loss=2.0)
    assert _until(run, lambda s: s.current_step == 2).train_metrics["loss"] == 2.0  # type: ignore[index]


@pytest.mark.parametrize(
    ("step", "total", "epoch", "epochs", "percent"),
    [
        (371, 375, 2.96, 3, 98),  # test_callback_completion_state_protection "honest progress - 371/375 steps (98%)"
        (121, 124, 1.98, 2, 97),  # test_honest_progress_reporting "float epoch precision - 1.98 epochs"
        (123, 124, 2.99, 3, 99),  # test_honest_progress_reporting "epoch-based training edge - 2.99/3 epochs"
        (999, 1000, 2.99, 3, 99),  # test_completion_detection_via_on_step_end "near completion - 999/1000 steps"
        (200, 200, 2.0, 2, 100),  # test_callback_completion_state_protection "exact completion - 200/200 steps"
        (1000, 1000, 3.0, 3, 100),  # test_completion_detection_via_on_step_end "completion at max_steps"
        (1001, 1000, 3.0, 3, 100),  # test_completion_detection_via_on_step_end "completion exceeded - 1001/1000"
        (0, 1000, 0.0, 1, 0),  # test_callback_completion_state_protection "None global_step handling"
    ],
)
def test_progress_is_rounded_down_and_the_epoch_kept_whole(
    termination_log: Path, step: int, total: int, epoch: float, epochs: int, percent: int
) -> None:
    """A3, A4, A7 (transformers_test.py, the cases named beside each): the status while the run trains."""
    run = _serve(total_steps=total, total_epochs=epochs)
    if step:
        run.step(step)
    run.epoch(epoch)
    status = _until(run, lambda s: s.current_epoch == epoch and s.current_step == step)
    assert (status.progress_percentage, status.current_step, status.total_steps) == (percent, step, total)
    assert (status.current_epoch, status.total_epochs) == (epoch, epochs)
    if step >= total:  # test_completion_detection_via_on_step_end: at the total, nothing remains
        assert status.estimated_remaining_seconds == 0


def test_the_remaining_seconds_come_from_the_recent_rate(termination_log: Path) -> None:
    """test_completion_detection_via_on_step_end "near completion": remaining computed, an integer >= 0."""
    run = _serve(total_steps=100_000)
    for step in range(1, 40):
        run.step(step)
        time.sleep(INTERVAL / 4)
    status = _until(run, lambda s: s.estimated_remaining_seconds is not None)
    assert isinstance(status.estimated_remaining_seconds, int) and status.estimated_remaining_seconds > 0


def test_the_remaining_seconds_are_not_zero_while_steps_remain(termination_log: Path) -> None:
    """The controller takes 0 s remaining as the final status (IsFinalStatusCaptured, B20) and would then not
    read the termination message: 10 steps left at a fast pace (a few ms) are served as 1 s, not 0."""
    run = _serve(total_steps=1000)
    for step in range(1, 991):
        run.step(step)
        if step % 100 == 0:
            time.sleep(INTERVAL)
    status = _until(run, lambda s: s.current_step == 990 and s.estimated_remaining_seconds is not None)
    assert status.estimated_remaining_seconds == 1
    run.step(1000)
    assert _until(run, lambda s: s.current_step == 1000).estimated_remaining_seconds == 0


@pytest.mark.parametrize(
    ("logs", "train", "evals"),
    [
        (  # test_callback_metrics_categorization "train metrics only"
            {"loss": 0.5, "learning_rate": 0.001, "grad_norm": 0.1},
            {"loss": 0.5, "learning_rate": 0.001, "grad_norm": 0.1},
            {},
        ),
        (  # "eval metrics only"
            {"eval_loss": 0.4, "eval_accuracy": 0.95},
            {},
            {"eval_loss": 0.4, "eval_accuracy": 0.95},
        ),
        (  # "mixed train and eval metrics" (A8)
            {
                "loss": 0.5,
                "learning_rate": 0.001,
                "grad_norm": 0.1,
                "eval_loss": 0.4,
                "eval_accuracy": 0.95,
                "train_samples_per_second": 10.0,
            },
            {"loss": 0.5, "learning_rate": 0.001, "grad_norm": 0.1, "throughput_samples_sec": 10.0},
            {"eval_loss": 0.4, "eval_accuracy": 0.95},
        ),
        (  # "throughput metric renaming"
            {"train_samples_per_second": 15.5},
            {"throughput_samples_sec": 15.5},
            {},
        ),
    ],
)
def test_metrics_split_between_train_and_eval(
    termination_log: Path, logs: dict[str, float], train: dict[str, float], evals: dict[str, float]
) -> None:
    """A8: transformers_test.py test_callback_metrics_categorization, its four cases."""
    run = _serve(total_steps=10)
    run.log(**logs)
    status = _until(run, lambda s: bool(s.train_metrics or s.eval_metrics))
    assert status.train_metrics == train
    assert status.eval_metrics == evals


def test_eval_metrics_stay_when_train_metrics_follow(termination_log: Path) -> None:
    """A9: an eval log, then train logs: the last value of every metric is served, eval ones included."""
    run = _serve(total_steps=10)
    run.log(eval_loss=0.7, eval_accuracy=0.5)
    _until(run, lambda s: bool(s.eval_metrics))
    for step in range(1, 4):
        run.step(loss=1.0 / step)
    status = _until(run, lambda s: s.current_step == 3)
    assert status.eval_metrics == {"eval_loss": 0.7, "eval_accuracy": 0.5}
    assert status.train_metrics == {"loss": pytest.approx(1 / 3)}


def test_the_throughput_is_measured_when_the_batch_size_is_known(termination_log: Path) -> None:
    run = _serve(total_steps=100_000, batch_size=32)
    for step in range(1, 30):
        run.step(step, loss=1.0)
        time.sleep(INTERVAL / 4)
    status = _until(run, lambda s: bool(s.train_metrics and "throughput_samples_sec" in s.train_metrics))
    assert status.train_metrics is not None and status.train_metrics["throughput_samples_sec"] > 0


def test_the_status_follows_the_loop_within_a_sender_interval(termination_log: Path) -> None:
    """Real step numbers, promptly: what is served is the sender's last cycle, one interval old at most."""
    run = _serve(total_steps=1000)
    for target in (5, 50, 500):
        run.step(target)
        assert _until(run, lambda s, t=target: s.current_step == t, timeout=10.0).current_step == target  # type: ignore[misc]


# --------------------------------------------------------------------------- the end: A5, A6, A10, A13


@pytest.mark.parametrize(
    ("step", "total", "epoch", "epochs", "after", "percent"),
    [
        (371, 375, 2.96, 3, 100, 98),  # test_callback_completion_state_protection "honest progress"
        (200, 200, 2.0, 2, 50, 100),  # "exact completion - 200/200 steps (100%)"
        (500, 1000, 0.5, 1, 200, 50),  # "early stop - 500/1000 steps (50%)" (A5)
        (0, 1000, 0.0, 1, 200, 0),  # "None global_step handling"
    ],
)
def test_the_final_status_stays_when_steps_come_after_the_end(
    termination_log: Path, step: int, total: int, epoch: float, epochs: int, after: int, percent: int
) -> None:
    """A5, A10: transformers_test.py test_callback_completion_state_protection (its four cases): the final
    values are served after the end, remaining 0, and a step counted later (an evaluation's on_step_end after
    on_train_end) changes nothing. The termination message says the same."""
    run = _serve(total_steps=total, total_epochs=epochs)
    run.step(step, loss=0.25)
    run.epoch(epoch)
    run.finish()
    run.step(after, loss=9.0)
    run.epoch(0.1)
    time.sleep(4 * INTERVAL)
    status = poll_progression(run.metrics_address)  # type: ignore[arg-type]
    expected = (percent, 0, step, total, epoch, epochs)
    got = (
        status.progress_percentage,
        status.estimated_remaining_seconds,
        status.current_step,
        status.total_steps,
        status.current_epoch,
        status.total_epochs,
    )
    assert got == expected
    assert status.train_metrics == {"loss": 0.25}
    message = read_termination_message(termination_log)
    assert (message.progress_percentage, message.estimated_remaining_seconds, message.current_step) == expected[:3]


@pytest.mark.parametrize(
    ("state", "epochs", "percent"),
    [("finished", None, 100), ("failed", None, None), ("finished", 2, 75), ("failed", 2, 75)],
)
def test_no_total_steps(termination_log: Path, state: str, epochs: int | None, percent: int | None) -> None:
    """A6: test_honest_progress_reporting "zero max_steps fallback" / "negative max_steps fallback": without a
    total, ``totalSteps`` is null and a finished run is at 100 %. Deliberate differences: with a number of
    epochs the percentage is the epochs' (1.5 of 2 is 75 %, Red Hat's callback says 100), and a run that failed
    with neither total says no percentage rather than 100."""
    run = _serve(total_epochs=epochs)
    run.step(100, loss=0.5)
    run.epoch(1.5)
    run.finish(state)  # type: ignore[arg-type]
    status = poll_progression(run.metrics_address)  # type: ignore[arg-type]
    assert (status.total_steps, status.current_step, status.current_epoch, status.total_epochs) == (
        None,
        100,
        1.5,
        epochs,
    )
    assert (status.progress_percentage, status.estimated_remaining_seconds) == (percent, 0)
    if percent is not None:
        assert read_termination_message(termination_log).progress_percentage == percent


def test_the_termination_message_is_written_before_a_slow_server_is_waited_for(
    termination_log: Path, sink: ReportSink
) -> None:
    """The final status goes to the file right after the final collect, before the final report's request:
    a push endpoint that hangs past the flush timeout cannot lose it."""
    sink.delay = 30.0
    run = stepwatch.init(
        job="slow", url=sink.url, metrics_port="127.0.0.1:0", interval=INTERVAL, flush_timeout=0.5, total_steps=40
    )
    run.step(30, loss=0.1)
    assert run.finish() is False  # not delivered in time
    message = read_termination_message(termination_log)
    assert (message.progress_percentage, message.current_step, message.estimated_remaining_seconds) == (75, 30, 0)


def test_with_a_push_endpoint_both_happen(termination_log: Path, sink: ReportSink) -> None:
    run = stepwatch.init(job="both", url=sink.url, metrics_port="127.0.0.1:0", interval=INTERVAL, total_steps=10)
    run.step(4, loss=0.5)
    assert _until(run, lambda s: s.current_step == 4).train_metrics == {"loss": 0.5}
    assert sink.wait_for(lambda s: any(r.progress.step == 4 for r in s.reports))
    assert run.finish() is True
    assert sink.final() is not None
    assert read_termination_message(termination_log).progress_percentage == 40


def test_with_a_kubeflow_endpoint_the_status_keeps_its_interval_and_posts_keep_5_s(
    termination_log: Path, sink: ReportSink
) -> None:
    """Upstream's status endpoint takes a post every 5 s at most; the status served follows the loop every
    interval all the same (the sender's cycles collect every interval, posts wait for their 5 s)."""
    began = time.monotonic()
    run = stepwatch.init(
        job="kf", url=sink.kubeflow_url(), metrics_port="127.0.0.1:0", interval=INTERVAL, total_steps=100
    )
    for target in (10, 20, 30):
        run.step(target, loss=0.5)
        assert _until(run, lambda s, t=target: s.current_step == t).current_step == target  # type: ignore[misc]
    assert 1 <= len(sink.statuses) <= 1 + (time.monotonic() - began) // 5
    assert run.finish() is True
    assert sink.statuses[-1].progress_percentage == 30
    assert read_termination_message(termination_log).progress_percentage == 30


def test_a_failed_write_is_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("STEPWATCH_TERMINATION_LOG", str(tmp_path / "no" / "such" / "dir"))
    caplog.set_level(logging.INFO, logger="stepwatch")
    run = _serve(total_steps=10)
    run.step(5)
    assert run.finish() is True
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "could not write the termination message" in warnings[0]


def test_the_termination_message_fits_the_kubelet_limit(termination_log: Path) -> None:
    run = _serve(total_steps=10)
    run.step(3, **{f"a_rather_long_metric_name_{i:03d}": i / 7 for i in range(200)})
    run.finish()
    assert len(termination_log.read_bytes()) <= 4096
    message = read_termination_message(termination_log)
    assert (message.progress_percentage, message.current_step) == (30, 3)


def test_termination_log_off_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPWATCH_TERMINATION_LOG", "off")
    run = _serve(total_steps=10)
    run.finish()
    assert not list(tmp_path.iterdir())
    assert resolve({}, environ={"STEPWATCH_TERMINATION_LOG": "off"}).termination_log is False


# ---------------------------------------------------------------------------------------- who serves


def _taken_port() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server.HTTPServer does (Red Hat's)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock


def test_a_taken_port_is_left_alone_quietly(
    termination_log: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A12 (port already bound: training completes). Red Hat's callback, or anything else, holds the port:
    one info line, no warning, training goes on and no termination message is written (the other one's)."""
    caplog.set_level(logging.DEBUG, logger="stepwatch")
    monkeypatch.setattr(_setup, "_said", set())
    holder = _taken_port()
    try:
        port = holder.getsockname()[1]
        run = stepwatch.init(job="taken", metrics_port=f"127.0.0.1:{port}", interval=INTERVAL, total_steps=10)
        assert run.metrics_address is None
        for _ in range(10):
            run.step(loss=1.0)
        assert run.current_step == 10
        run.finish()
    finally:
        holder.close()
    assert not termination_log.exists()
    lines = [r for r in caplog.records if r.name == "stepwatch"]
    assert [r.levelno for r in lines] == [logging.INFO]
    assert "cannot listen on 127.0.0.1:" in lines[0].getMessage() and "reporting is off" in lines[0].getMessage()


def test_without_an_endpoint_the_one_line_says_what_is_served(
    termination_log: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="stepwatch")
    monkeypatch.setattr(_setup, "_said", set())  # as in a fresh process
    run = _serve(total_steps=10)
    assert run.mode == "off" and run.metrics_address is not None
    lines = [r.getMessage() for r in caplog.records if r.name == "stepwatch"]
    host, port = run.metrics_address
    assert lines == [
        "stepwatch: no endpoint set (STEPWATCH_URL or KUBEFLOW_TRAINER_SERVER_URL); serving OpenShift AI's "
        f"progression status on http://{host}:{port}/metrics (no server needed)"
    ]


@pytest.mark.parametrize(
    ("env", "node"),
    [
        ({}, None),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "0"}, None),  # not in Kubernetes
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, None),  # a pod, not a TrainJob's
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "PET_NNODES": "2", "PET_NODE_RANK": "0"}, 0),  # torch plugin
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "PET_NNODES": "2", "PET_NODE_RANK": "1"}, 1),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}, 1),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "DMLC_NUM_WORKER": "4", "DMLC_TASK_ID": "0"}, 0),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBEFLOW_TRAINER_SERVER_URL": "https://x"}, 0),
        ({"KUBERNETES_SERVICE_HOST": "h", "JOB_COMPLETION_INDEX": "0", "HOSTNAME": "llama-node-0-0"}, 0),  # no plugin
        ({"KUBERNETES_SERVICE_HOST": "h", "JOB_COMPLETION_INDEX": "2", "HOSTNAME": "llama-node-0-2"}, 2),
        ({"KUBERNETES_SERVICE_HOST": "h", "JOB_COMPLETION_INDEX": "0", "HOSTNAME": "web-7d4b9-x2"}, None),
        ({"KUBERNETES_SERVICE_HOST": "h", "JOB_COMPLETION_INDEX": "0", "HOSTNAME": "llama-initializer-0-0"}, None),
    ],
)
def test_a_trainjob_pod_is_told_by_its_environment(env: dict[str, str], node: int | None) -> None:
    assert trainjob_node(env) == node


@pytest.mark.parametrize(
    ("env", "address"),
    [
        ({}, None),  # off outside a TrainJob
        ({"KUBERNETES_SERVICE_HOST": "h", "PET_NNODES": "1", "PET_NODE_RANK": "0"}, ("0.0.0.0", DEFAULT_METRICS_PORT)),
        ({"KUBERNETES_SERVICE_HOST": "h", "PET_NNODES": "2", "PET_NODE_RANK": "1"}, None),  # A11: another node
        (
            {"KUBERNETES_SERVICE_HOST": "h", "PET_NNODES": "1", "PET_NODE_RANK": "0", "RANK": "3", "WORLD_SIZE": "4"},
            None,
        ),
        ({"KUBERNETES_SERVICE_HOST": "h", "PET_NNODES": "1", "STEPWATCH_METRICS_PORT": "off"}, None),
        ({"KUBERNETES_SERVICE_HOST": "h", "PET_NNODES": "1", "STEPWATCH_DISABLED": "1"}, None),
        ({"KUBERNETES_SERVICE_HOST": "h", "PET_NNODES": "1", "STEPWATCH_METRICS_PORT": "9090"}, ("0.0.0.0", 9090)),
        ({"STEPWATCH_METRICS_PORT": "127.0.0.1:0"}, ("127.0.0.1", 0)),  # asked for, anywhere
        ({"STEPWATCH_METRICS_PORT": "127.0.0.1:0", "RANK": "1", "WORLD_SIZE": "2"}, None),  # A11: rank 0 only
    ],
)
def test_only_global_rank_zero_serves(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], address: tuple[str, int] | None
) -> None:
    """A11: only the first pod's rank 0 listens; on by default in a TrainJob's pod, off elsewhere."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _setup.plan_run({}).metrics_address == address


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("off", False),
        ("0", False),
        ("28080", ("0.0.0.0", 28080)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:28080", ("::1", 28080)),
        ("on", ("0.0.0.0", DEFAULT_METRICS_PORT)),
    ],
)
def test_the_metrics_port_setting(text: str, parsed: object) -> None:
    assert parse_metrics_port(text) == parsed
    assert resolve({}, environ={"STEPWATCH_METRICS_PORT": text}).metrics_port == parsed
    assert resolve({"metrics_port": text}, environ={}).metrics_port == parsed


@pytest.mark.parametrize("bad", ["x", "70000", "::1:28080", ":80", "-1"])
def test_a_bad_metrics_port_names_the_variable_and_init_goes_on(
    bad: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(SettingError, match="STEPWATCH_METRICS_PORT"):
        resolve({}, environ={"STEPWATCH_METRICS_PORT": bad})
    caplog.set_level(logging.WARNING, logger="stepwatch")
    run = stepwatch.init(job="bad-port", metrics_port=bad)  # never raises: reporting off, one warning
    assert run.metrics_address is None and run.mode == "off"
    assert any("metrics_port" in r.getMessage() for r in caplog.records)


def test_a_new_run_takes_over_the_address_with_its_own_status(termination_log: Path) -> None:
    first = _serve(total_steps=10)
    first.step(10)
    first.finish()
    second = _serve(total_steps=1000)
    assert second.metrics_address == first.metrics_address  # the same server, the same port
    second.step(7)
    assert _until(second, lambda s: s.current_step == 7).total_steps == 1000


def test_standing_aside_closes_the_port_and_writes_no_message(termination_log: Path) -> None:
    """Where Red Hat's callback serves the job (integrations call ``yield_progression``), the port is freed
    for it at once and the termination message is its own."""
    run = _serve(total_steps=10)
    address = run.metrics_address
    assert address is not None
    run.yield_progression("another reporter serves it")
    assert run.metrics_address is None
    with socket.socket() as other:  # the other reporter binds it now (HTTPServer sets SO_REUSEADDR)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.bind(address)
    run.step(5)
    run.finish()
    assert not termination_log.exists()


# ------------------------------------------------------------------------------------ hostile clients


@pytest.fixture
def served(termination_log: Path) -> Iterator[tuple[stepwatch.Run, _status_server.StatusServer]]:
    run = _serve(total_steps=100)
    run.step(42, loss=0.5)
    _until(run, lambda s: s.current_step == 42)
    assert run._progression is not None
    yield run, run._progression.server


def _good_poll(address: tuple[str, int]) -> float:
    """One controller poll; its time in seconds (the controller allows 2)."""
    start = time.monotonic()
    status = poll_progression(address)
    assert status.current_step == 42
    return time.monotonic() - start


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 405),
        (b"DELETE / HTTP/1.1\r\n\r\n", 405),
        (b"garbage\r\n\r\n", 400),
        (b"GET /\r\n\r\n", 400),  # HTTP/0.9
        (b"GET / HTTP/2.0\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"G\x00T / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 10_000 + b"\r\n\r\n", 431),
        (b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n", 414),
    ],
)
def test_other_methods_and_malformed_requests_are_refused(
    served: tuple[stepwatch.Run, _status_server.StatusServer], request_bytes: bytes, expected: int
) -> None:
    run, _ = served
    status, headers, _ = _head_of(_raw(run.metrics_address, request_bytes))  # type: ignore[arg-type]
    assert status == expected and headers["connection"] == "close"
    if expected == 405:
        assert headers["allow"] == "GET, HEAD"
    assert _good_poll(run.metrics_address) < 2.0  # type: ignore[arg-type]


def test_many_pollers_at_once_all_read_the_status(served: tuple[stepwatch.Run, _status_server.StatusServer]) -> None:
    """Well-behaved clients at once (20 threads, 10 polls each): every one reads a whole answer, none a reset."""
    run, _ = served
    address = run.metrics_address
    assert address is not None
    errors: list[BaseException] = []
    read: list[int] = []

    def poller() -> None:
        for _ in range(10):
            try:
                read.append(poll_progression(address).current_step or 0)
            except Exception as exc:
                errors.append(exc)

    threads = [threading.Thread(target=poller) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and read == [42] * 200


def test_a_flood_of_idle_connections_does_not_keep_a_poll_out(
    served: tuple[stepwatch.Run, _status_server.StatusServer],
) -> None:
    run, server = served
    address = run.metrics_address
    assert address is not None
    clients = []
    try:
        for _ in range(400):
            clients.append(socket.create_connection(address, timeout=5))
        for _ in range(5):
            assert _good_poll(address) < 2.0
        assert server.open_connections <= _status_server.MAX_CONNECTIONS
    finally:
        for client in clients:
            client.close()


def test_slowloris_clients_are_cut_off_and_the_poll_goes_through(
    served: tuple[stepwatch.Run, _status_server.StatusServer],
) -> None:
    """Clients that send a byte now and then, forever: each is closed at its deadline, none holds the server."""
    run, server = served
    address = run.metrics_address
    assert address is not None
    stop = threading.Event()
    cut = []

    def slow_client() -> None:
        try:
            with socket.create_connection(address, timeout=30) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\n")
                while not stop.is_set():
                    sock.sendall(b"X")
                    if stop.wait(0.2):
                        return
        except OSError:
            cut.append(1)  # the server closed it

    threads = [threading.Thread(target=slow_client, daemon=True) for _ in range(60)]
    for thread in threads:
        thread.start()
    try:
        polls = []
        deadline = time.monotonic() + _status_server.REQUEST_TIMEOUT + 2
        while time.monotonic() < deadline:
            polls.append(_good_poll(address))
            assert server.open_connections <= _status_server.MAX_CONNECTIONS
            time.sleep(0.2)
        assert max(polls) < 2.0
        assert len(cut) >= 30  # cut at their deadline (or pushed out by newer ones), not left to dribble
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)


def test_a_huge_request_is_cut_off(served: tuple[stepwatch.Run, _status_server.StatusServer]) -> None:
    run, server = served
    address = run.metrics_address
    assert address is not None
    outcome: list[object] = []

    def huge() -> None:
        try:
            with socket.create_connection(address, timeout=10) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nX-Huge: ")
                for _ in range(1024):  # 64 MiB, or as much as the server takes before it cuts
                    sock.sendall(b"h" * 65536)
                outcome.append("sent it all")
        except OSError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=huge, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert isinstance(outcome[0], OSError)  # reset or broken pipe: the server stopped reading
    assert _good_poll(address) < 2.0
    assert server.open_connections <= 1


def test_a_client_that_never_reads_is_closed_at_its_deadline(
    served: tuple[stepwatch.Run, _status_server.StatusServer],
) -> None:
    """Pipelined GETs it never reads: it gets one answer (``Connection: close``), the rest is read and dropped
    for a moment, or, when it came after the answer, refused with a reset; either way the server lets go."""
    run, server = served
    address = run.metrics_address
    assert address is not None
    with socket.create_connection(address) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        try:
            for _ in range(200):
                sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed by the server after its one answer
        assert _good_poll(address) < 2.0
        deadline = time.monotonic() + _status_server.REQUEST_TIMEOUT + 5
        while server.open_connections and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.open_connections == 0
