"""Upstream Kubeflow clients, unchanged, against stepwatch's Kubeflow-compatible status endpoint.

``kubeflow.trainer.update_trainjob_status`` (the Kubeflow SDK) and ``transformers``'
``KubeflowCallback`` post KEP-2779 ``trainerStatus`` bodies to
``/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status`` with the token read
from the file that ``KUBEFLOW_TRAINER_SERVER_TOKEN`` names, as in a TrainJob's pod. A real server
receives them; the tests read back what it made of them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from stepwatch.cli import main
from stepwatch.client import Client


@pytest.fixture
def kubeflow_env(live_job: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The variables Kubeflow Trainer injects into a pod, pointing at ``live_job`` on the live server."""
    token = tmp_path / "token"
    token.write_text(live_job.token + "\n")
    for var in ("STEPWATCH_URL", "STEPWATCH_TOKEN", "STEPWATCH_JOB"):
        monkeypatch.delenv(var)
    url = f"{live_job.url}/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/{live_job.name}/status"
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", url)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
    return live_job


def _fresh_sdk(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The SDK's module state: its 5 s throttle and its 5 min token cache, reset between posts of a test."""
    from kubeflow.trainer.backends.kubernetes import utils

    monkeypatch.setattr(utils, "_last_update_time", 0.0)
    monkeypatch.setattr(utils, "_cached_token", None)
    return utils


def test_kubeflow_sdk_update_trainjob_status(kubeflow_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("kubeflow.trainer", reason="the Kubeflow SDK (kubeflow) is not installed")
    from kubeflow.trainer import update_trainjob_status

    _fresh_sdk(monkeypatch)
    metrics: dict[str, float | int | str] = {"loss": 0.5, "current_step": 25, "total_steps": 100, "current_epoch": 0.25}
    assert update_trainjob_status(progress_percent=25, estimated_remaining_seconds=300, metrics=metrics) is True
    assert update_trainjob_status(progress_percent=26) is False  # upstream's own throttle: 5 s
    _fresh_sdk(monkeypatch)
    metrics = {"loss": 0.4, "eval_accuracy": "0.91", "current_step": 50, "total_steps": 100, "current_epoch": 0.5}
    assert update_trainjob_status(progress_percent=50, estimated_remaining_seconds=200, metrics=metrics) is True

    job = kubeflow_env.get()
    assert job["source"] == "kubeflow"
    progress = job["progress"]
    assert (progress["percent"], progress["step"], progress["total_steps"]) == (50.0, 50, 100)
    assert progress["epoch"] == 0.5
    assert job["eta"]["reported_seconds"] == 200
    assert job["metrics"]["loss"] == 0.4
    assert job["metrics"]["eval_accuracy"] == 0.91
    status = job["trainerStatus"]  # upstream semantics: the last status, echoed whole
    assert status["progressPercentage"] == 50
    assert {"name": "loss", "value": "0.4"} in status["metrics"]
    history = kubeflow_env.history("loss")["loss"]  # here every accepted status is history too
    assert [(w["step"], w["last"]) for w in history] == [(25, 0.5), (50, 0.4)]

    Path(os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"]).write_text("not-the-token")
    _fresh_sdk(monkeypatch)
    assert update_trainjob_status(progress_percent=99, metrics={"loss": 9.0}) is False  # 403: never raises
    assert kubeflow_env.get()["progress"]["percent"] == 50.0


def test_transformers_kubeflow_callback(kubeflow_env: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the transformers KubeflowCallback test needs PyTorch")
    pytest.importorskip("transformers", reason="transformers is not installed")
    import hf_tiny

    from stepwatch.integrations import transformers as integration

    integration.uninstall()  # upstream's callback alone: the Trainer as it is in a plain TrainJob pod
    trainer = hf_tiny.trainer(str(tmp_path), max_steps=12, eval_strategy="steps", eval_steps=6)
    names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    assert "KubeflowCallback" in names  # switched on by KUBEFLOW_TRAINER_SERVER_URL (transformers >= 5.4)
    assert "StepwatchCallback" not in names
    trainer.train()

    job = kubeflow_env.get()
    assert job["source"] == "kubeflow"
    assert job["progress"]["percent"] == 100.0  # its final status
    assert job["progress"]["total_steps"] == 12  # from its first status (the final one drops the steps)
    assert job["eta"]["reported_seconds"] == 0
    assert (job["eta"]["remaining_seconds"], job["eta"]["source"]) == (0.0, "reported")
    assert job["trainerStatus"]["progressPercentage"] == 100 and job["trainerStatus"]["estimatedRemainingSeconds"] == 0
    metrics = job["metrics"]
    assert {"loss", "grad_norm", "learning_rate", "eval_loss", "train_loss"} <= set(metrics)
    assert metrics["eval_loss"] == pytest.approx(float(_value(job, "eval_loss")))
    assert kubeflow_env.history("loss")["loss"]  # the final status became history


def _value(job: dict[str, Any], name: str) -> str:
    return next(m["value"] for m in job["trainerStatus"]["metrics"] if m["name"] == name)


def test_in_a_kubeflow_pod_stepwatch_replaces_transformers_reporter(kubeflow_env: Any, tmp_path: Path) -> None:
    """The same pod with stepwatch's hook: one reporter (stepwatch's, over the Kubeflow wire), with more in it."""
    pytest.importorskip("torch", reason="needs PyTorch")
    pytest.importorskip("transformers", reason="transformers is not installed")
    import hf_tiny

    from stepwatch.integrations import transformers as integration

    assert integration.install()
    try:
        trainer = hf_tiny.trainer(str(tmp_path), max_steps=12, eval_strategy="steps", eval_steps=6)
        names = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
        assert "KubeflowCallback" not in names and names.count("StepwatchCallback") == 1
        trainer.train()
    finally:
        integration.uninstall()

    job = kubeflow_env.get()
    progress = job["progress"]
    assert (progress["percent"], progress["step"], progress["total_steps"]) == (100.0, 12, 12)
    assert progress["epoch"] == 0.75 and progress["total_epochs"] == 1  # upstream's callback sends no totals
    assert {"loss", "eval_loss", "learning_rate"} <= set(job["metrics"])


# ------------------------------------------------------------------ every reader shows the last status as posted


def _readers(job: Any, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str, Any]:
    """What a person and a program read of the job: its row of ``stepwatch jobs``, ``stepwatch describe``, and
    the SDK's job."""
    capsys.readouterr()
    assert main(["jobs", "--server", job.url, "-n", "default"]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(job.name + " "))
    assert main(["describe", job.name, "--server", job.url, "-n", "default"]) == 0
    described = capsys.readouterr().out
    with Client(job.url) as client:
        return row, described, client.job(job.name, "default")


def test_an_eta_sent_without_step_metrics_is_shown_by_every_reader(
    kubeflow_env: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Kubeflow SDK's ETA alone (3600 s, then 0): stepwatch has no rate of its own, the ETA shown is the
    one sent, labelled as reported (``eta.source``; ``*`` in the CLI), never ``-``."""
    pytest.importorskip("kubeflow.trainer", reason="the Kubeflow SDK (kubeflow) is not installed")
    from kubeflow.trainer import update_trainjob_status

    _fresh_sdk(monkeypatch)
    assert update_trainjob_status(estimated_remaining_seconds=3600) is True
    job = kubeflow_env.get()
    assert (job["eta"]["reported_seconds"], job["eta"]["source"]) == (3600, "reported")
    assert 3000 < job["eta"]["remaining_seconds"] <= 3600  # counted down since it arrived
    assert job["trainerStatus"]["estimatedRemainingSeconds"] == 3600
    row, described, sdk = _readers(kubeflow_env, capsys)
    eta = next(cell for cell in row if cell.endswith("*"))
    assert eta == "1h00m*" or eta.startswith("59m"), row
    assert "(reported by the job)" in described
    assert sdk.eta.source == "reported" and 3000 < (sdk.eta.remaining_seconds or 0) <= 3600
    assert sdk.trainer_status.estimated_remaining_seconds == 3600

    _fresh_sdk(monkeypatch)
    assert update_trainjob_status(estimated_remaining_seconds=0) is True
    job = kubeflow_env.get()
    assert (job["eta"]["remaining_seconds"], job["eta"]["source"], job["eta"]["reported_seconds"]) == (
        0.0,
        "reported",
        0,
    )
    row, described, sdk = _readers(kubeflow_env, capsys)
    assert "0s*" in row and "-" not in row[row.index("0s*")]
    assert sdk.eta.remaining_seconds == 0.0 and sdk.trainer_status.estimated_remaining_seconds == 0


def test_the_transformers_callbacks_final_status_replaces_the_last_in_every_reader(
    kubeflow_env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers' KubeflowCallback (the real one) at step 136 of 200 (68 %), then its final status: 100 %,
    ETA 0, no ``current_step``. It replaces the last status whole: 100 % and ETA 0 in the API, the
    ``trainerStatus`` (as posted), ``stepwatch jobs``, ``stepwatch describe`` and the SDK."""
    pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers.integrations.integration_utils import KubeflowCallback
    from transformers.trainer_callback import TrainerControl, TrainerState

    callback = KubeflowCallback()
    state = TrainerState(max_steps=200, is_world_process_zero=True)
    control = TrainerControl()
    callback.on_train_begin(None, state, control)
    state.global_step, state.epoch = 136, 0.68
    callback.on_log(None, state, control, logs={"loss": 0.75, "learning_rate": 1e-4})
    callback._last_update_time = 0.0  # its own 5 s throttle, skipped so that the test takes no 5 s
    callback.on_step_end(None, state, control)
    job = kubeflow_env.get()
    assert (job["progress"]["percent"], job["progress"]["step"]) == (68.0, 136)
    callback.on_train_end(None, state, control)

    job = kubeflow_env.get()
    assert job["progress"]["percent"] == 100.0
    assert (job["eta"]["remaining_seconds"], job["eta"]["source"]) == (0.0, "reported")
    status = job["trainerStatus"]
    assert (status["progressPercentage"], status["estimatedRemainingSeconds"]) == (100, 0)
    assert {m["name"]: m["value"] for m in status["metrics"]} == {"loss": "0.75", "learning_rate": "0.0001"}
    row, described, sdk = _readers(kubeflow_env, capsys)
    assert "100%" in row and "0s*" in row, row
    assert "100%" in described and "0s (reported by the job" in described
    assert sdk.percent == 100.0 and sdk.eta.remaining_seconds == 0.0
    assert (sdk.trainer_status.progress_percentage, sdk.trainer_status.estimated_remaining_seconds) == (100, 0)
