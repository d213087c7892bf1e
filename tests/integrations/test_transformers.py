"""The Hugging Face Trainer callback: a tiny real BERT trains on CPU and reports to a real server."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the transformers integration tests need PyTorch")
pytest.importorskip("transformers", reason="the transformers integration is tested only where it is installed")

import hf_tiny
from transformers import TrainerCallback
from transformers.integrations.integration_utils import KubeflowCallback

import stepwatch
from stepwatch.integrations import transformers as integration
from stepwatch.integrations.transformers import StepwatchCallback

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _clean() -> Any:
    yield
    integration.uninstall()
    stepwatch.finish()


def test_trainer_reports_progress_metrics_and_hyperparameters(live_job: Any, tmp_path: Path) -> None:
    trainer = hf_tiny.trainer(
        str(tmp_path), callbacks=[StepwatchCallback()], max_steps=12, eval_strategy="steps", eval_steps=6
    )
    trainer.train()

    job = live_job.get()
    assert job["state"] == "finished"
    progress = job["progress"]
    assert (progress["step"], progress["total_steps"], progress["percent"]) == (12, 12, 100.0)
    assert progress["epoch"] == pytest.approx(12 * 4 / 64)
    assert progress["samples"] == 12 * 4  # 4 samples per optimizer step, one process
    assert {"loss", "grad_norm", "learning_rate", "eval_loss", "train_loss"} <= set(job["metrics"])
    params = job["params"]
    assert params["learning_rate"] == 1e-3
    assert params["per_device_train_batch_size"] == 4
    assert params["max_steps"] == 12
    assert params["seed"] == 0
    assert params["lr_scheduler_type"] == "linear"
    assert params["model_type"] == "bert"
    assert "output_dir" not in params

    history = live_job.history("loss", "eval_loss")
    assert sum(window["count"] for window in history["loss"]) == 12  # logging_steps=1: one loss per step
    evals = history["eval_loss"]  # two evaluations (steps 6 and 12), maybe in one report window
    assert sum(window["count"] for window in evals) == 2
    assert evals[-1]["step"] == 12


def test_checkpoint_then_stop_commands(live_job: Any, checkpoint_dir: Path) -> None:
    trainer = hf_tiny.trainer(str(checkpoint_dir), callbacks=[StepwatchCallback()], max_steps=5000)
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(out=trainer.train()), daemon=True)
    thread.start()
    live_job.wait(lambda job: job["progress"]["step"] >= 3)
    live_job.command("checkpoint", "before a risky change")
    live_job.wait(lambda job: any(checkpoint_dir.glob("checkpoint-*")))
    first = sorted(checkpoint_dir.glob("checkpoint-*"))
    live_job.command("stop", "not learning")
    thread.join(60)
    assert not thread.is_alive(), "a stop command must end the training"

    job = live_job.wait(lambda job: job["state"] != "running")
    assert job["state"] == "stopped"
    assert "not learning" in job["reason"]
    step = job["progress"]["step"]
    assert 3 <= step < 5000
    assert result["out"].global_step == step
    checkpoints = sorted(checkpoint_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert len(checkpoints) == len(first) + 1  # one for the checkpoint command, one before stopping
    assert checkpoints[-1].name == f"checkpoint-{step}"  # saved at the step it stopped at
    assert job["pending_commands"] == []


def test_a_failing_callback_never_stops_training(
    live_job: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(**kwargs: Any) -> stepwatch.Run:
        raise RuntimeError("reporting broke")

    monkeypatch.setattr(stepwatch, "init", broken)
    caplog.set_level(logging.WARNING, "stepwatch")
    trainer = hf_tiny.trainer(str(tmp_path), callbacks=[StepwatchCallback()], max_steps=3)
    assert trainer.train().global_step == 3
    failures = [r for r in caplog.records if "reporting broke" in r.getMessage()]
    assert len(failures) == 1
    assert "on_train_begin" in failures[0].getMessage()


def test_install_gives_every_trainer_one_callback_and_replaces_kubeflows(
    live_job: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text(live_job.token)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", live_job.url + "/unused")
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))

    def callbacks(trainer: Any) -> list[str]:
        return [type(cb).__name__ for cb in trainer.callback_handler.callbacks]

    # without stepwatch, transformers >= 5.4 switches its own Kubeflow reporter on
    assert "KubeflowCallback" in callbacks(hf_tiny.trainer(str(tmp_path)))

    assert integration.install() is True
    assert integration.install() is True  # idempotent
    plain = callbacks(hf_tiny.trainer(str(tmp_path)))
    assert plain.count("StepwatchCallback") == 1
    assert "KubeflowCallback" not in plain  # exactly one reporter per job
    own = StepwatchCallback()
    trainer = hf_tiny.trainer(str(tmp_path), callbacks=[own])
    assert callbacks(trainer).count("StepwatchCallback") == 1
    assert own in trainer.callback_handler.callbacks

    # reporting switched off: transformers' reporter is left alone
    monkeypatch.setenv("STEPWATCH_DISABLED", "1")
    assert "KubeflowCallback" in callbacks(hf_tiny.trainer(str(tmp_path)))

    assert integration.uninstall() is True
    monkeypatch.delenv("STEPWATCH_DISABLED")
    assert "StepwatchCallback" not in callbacks(hf_tiny.trainer(str(tmp_path)))
    assert KubeflowCallback is not None


class _SlowEvaluation(TrainerCallback):  # type: ignore[misc]
    """Makes each evaluation batch take 0.4 s: 16 batches, a 6.4 s evaluation with the step standing."""

    def on_prediction_step(self, *args: Any, **kwargs: Any) -> None:
        threading.Event().wait(0.4)


@pytest.mark.parametrize(("announced", "where"), [(True, "on"), (False, "off"), (False, "on")])
def test_an_evaluation_is_no_stall_because_the_callback_says_so(
    strict_job: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, announced: bool, where: str
) -> None:
    """A real Trainer whose evaluation stands the step for 6.4 s, on a server that calls a 3 s standstill a
    stall (what a 60 s evaluation is to the 30 s default): the callback's phase keeps the job healthy; the
    same run with the phase taken out (as before the callback sent it) and without the stack readings
    (``STEPWATCH_WHERE=off``, an older report core) is flagged stalled at it; with the readings, it is no
    stall either (issue 29)."""
    monkeypatch.setenv("STEPWATCH_WHERE", where)
    if not announced:
        monkeypatch.setattr(StepwatchCallback, "on_prediction_step", lambda self, *a, **k: None)
    trainer = hf_tiny.trainer(
        str(tmp_path),
        callbacks=[StepwatchCallback(), _SlowEvaluation()],
        max_steps=8,
        eval_strategy="steps",
        eval_steps=6,
        per_device_eval_batch_size=1,
    )
    trainer.train()
    job = strict_job.get()
    assert job["state"] == "finished" and job["progress"]["step"] == 8
    states = [span["state"] for span in job["health_history"]]
    if announced or where == "on":
        assert "stalled" not in states, job["health"]
    else:
        assert "stalled" in states, job["health"]
