"""OpenShift AI progression from a Hugging Face ``Trainer``: zero code in a TrainJob pod, and beside Red Hat's callback.

No stepwatch server anywhere. The zero-code job runs as a plain ``python finetune.py`` subprocess with a
TrainJob pod's variables, where the installed ``.pth`` activates auto-instrumentation; it is polled during
training the way Red Hat's controller polls (``tests/progression_trainee.py``). Red Hat's own callback
(opendatahub-io/kubeflow-sdk ``release-3.4-GA`` @ 3fa50fe9, ``kubeflow/trainer/rhai/transformers.py``,
``KubeflowProgressCallback``) is played by a stand-in of that name that does what it does; its code is
not copied.
"""

from __future__ import annotations

import http.server
import json
import logging
import site
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the transformers integration tests need PyTorch")
pytest.importorskip("transformers", reason="the transformers integration is tested only where it is installed")

import hf_tiny
from transformers import TrainerCallback

import stepwatch
from progression_trainee import environment, free_port, python, trainee
from stepwatch.cli.run import _SITE_DIR
from stepwatch.integrations import transformers as integration
from stepwatch.integrations.transformers import StepwatchCallback

pytestmark = pytest.mark.torch

HERE = Path(__file__).parent
STEPS = 120

FINETUNE = f"""
import sys, time
sys.path.insert(0, {str(HERE)!r})
import hf_tiny
from transformers import TrainerCallback


class Pace(TrainerCallback):  # a step of a real model takes longer than this tiny one's
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.02)


trainer = hf_tiny.trainer(sys.argv[1], callbacks=[Pace()], max_steps={STEPS}, eval_strategy="steps", eval_steps=40)
trainer.train()
"""
"""A fine-tuning script with nothing of stepwatch in it."""

POD = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "PET_NNODES": "1",
    "PET_NPROC_PER_NODE": "1",
    "PET_NODE_RANK": "0",
    "JOB_COMPLETION_INDEX": "0",
    "HOSTNAME": "finetune-node-0-0",
}
"""What Kubeflow Trainer's torch plugin, the Job controller and JobSet put in the first pod of a TrainJob."""


@pytest.fixture(autouse=True)
def _clean() -> Any:
    yield
    integration.uninstall()
    stepwatch.finish()


def test_zero_code_trainer_in_a_trainjob_pod_is_read_by_the_controller(tmp_path: Path) -> None:
    """A1, A2, A4, A8, A13 with transformers: the pod's variables switch auto-instrumentation and the endpoint
    on (the port is moved to a free loopback one for the test: 28080 in a real pod); every poll parses as Go
    parses it, the step moves, and the termination message is the real end with the last train and eval
    metrics and the run's throughput."""
    installed = [Path(p) / "stepwatch-autoinstrument.pth" for p in site.getsitepackages()]
    ours = _SITE_DIR / "stepwatch-autoinstrument.pth"
    assert any(p.is_file() and p.read_text() == ours.read_text() for p in installed), "pip install -e . again"
    script = tmp_path / "finetune.py"
    script.write_text(FINETUNE)
    assert "stepwatch" not in script.read_text()
    with trainee(python(script, str(tmp_path / "out")), tmp_path, environment(tmp_path, **POD)) as job:
        assert job.poll_until_exit() == 0
    assert not job.failures
    polls = job.polls
    assert len(polls) >= 5
    assert all(p.total_steps == STEPS and p.total_epochs == 8 for p in polls)
    assert any(0 < (p.current_step or 0) < STEPS for p in polls)
    assert any(p.current_epoch and 0 < p.current_epoch < p.total_epochs for p in polls)  # type: ignore[operator]
    assert any(p.train_metrics and {"loss", "grad_norm", "learning_rate"} <= set(p.train_metrics) for p in polls)
    message = job.termination_message()
    assert (message.progress_percentage, message.estimated_remaining_seconds) == (100, 0)
    assert (message.current_step, message.total_steps) == (STEPS, STEPS)
    assert message.current_epoch == pytest.approx(STEPS * 4 / 64)
    assert message.train_metrics and {"loss", "train_loss", "throughput_samples_sec"} <= set(message.train_metrics)
    assert message.eval_metrics and "eval_loss" in message.eval_metrics


# ------------------------------------------------------------------------------- Red Hat's callback


class KubeflowProgressCallback(TrainerCallback):  # type: ignore[misc]
    """A stand-in for Red Hat's callback of the same name (its SDK adds it to every Trainer of a job with
    progression tracking): at train begin, on world process zero, it serves its own JSON on the metrics
    port with ``http.server`` (which sets SO_REUSEADDR), a failed bind being only a message; at train end
    it writes its JSON to the termination log. What it does, not its code."""

    def __init__(self, port: int, termination_log: Path) -> None:
        self.port = port
        self.termination_log = termination_log
        self.server: http.server.HTTPServer | None = None
        self.bind_error: OSError | None = None
        self.step = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.server is not None:
            return
        callback = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"progressPercentage": 0, "currentStep": callback.step, "by": "red-hat"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        try:
            self.server = http.server.HTTPServer(("127.0.0.1", self.port), Handler)
        except OSError as exc:
            self.bind_error = exc
            return
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.termination_log.write_text(json.dumps({"progressPercentage": 100, "by": "red-hat"}))
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.mark.parametrize("order", ["theirs added last", "theirs first", "the user's run serves already"])
def test_beside_red_hats_callback_stepwatch_neither_serves_nor_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, order: str
) -> None:
    """Where a trainer carries Red Hat's callback, its endpoint and its termination message are the ones the
    controller reads: stepwatch leaves the port to it (in whatever order the callbacks run) and writes no
    message, with one info line; it still reports everything else."""
    caplog.set_level(logging.INFO, logger="stepwatch")
    port = free_port()
    ours = tmp_path / "stepwatch-termination-log"
    monkeypatch.setenv("STEPWATCH_METRICS_PORT", f"127.0.0.1:{port}")  # the same port as theirs
    monkeypatch.setenv("STEPWATCH_TERMINATION_LOG", str(ours))
    monkeypatch.setenv("STEPWATCH_INTERVAL", "0.05")
    red_hat = KubeflowProgressCallback(port, tmp_path / "red-hat-termination-log")
    seen: list[dict[str, Any]] = []

    class Poll(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step in (2, 8):
                with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                    sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    seen.append(json.loads(b"".join(iter(lambda: sock.recv(65536), b"")).partition(b"\r\n\r\n")[2]))

    if order == "theirs first":
        trainer = hf_tiny.trainer(str(tmp_path), callbacks=[red_hat, StepwatchCallback(), Poll()], max_steps=10)
    else:
        user_run = stepwatch.init(job="finetune", total_steps=10) if order.startswith("the user's") else None
        if user_run is not None:
            assert user_run.metrics_address == ("127.0.0.1", port)
        trainer = hf_tiny.trainer(str(tmp_path), callbacks=[StepwatchCallback(), Poll()], max_steps=10)
        trainer.add_callback(red_hat)  # as Red Hat's patch of Trainer.__init__ does, after the others
    trainer.train()
    stepwatch.finish()

    assert red_hat.bind_error is None
    assert [s["by"] for s in seen] == ["red-hat", "red-hat"]
    assert json.loads(red_hat.termination_log.read_text())["by"] == "red-hat"
    assert not ours.exists()
    said = [r.getMessage() for r in caplog.records if "KubeflowProgressCallback" in r.getMessage()]
    assert len(said) == 1 and "leaves OpenShift AI's progression endpoint to it" in said[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "stepwatch"]
