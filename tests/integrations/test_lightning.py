"""PyTorch Lightning against a real server: steps, epochs, logged metrics, hparams, commands, install()."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'stepwatch[test-frameworks]')")
L = pytest.importorskip("lightning.pytorch", reason="Lightning is not installed (pip install 'stepwatch[lightning]')")

import stepwatch  # noqa: E402
import stepwatch.integrations.lightning as sw_lightning  # noqa: E402
from progression_trainee import polled_in_process  # noqa: E402
from stepwatch.integrations.lightning import StepwatchCallback  # noqa: E402
from stepwatch.protocol.progression import ProgressionStatus  # noqa: E402
from stepwatch.testing import read_termination_message  # noqa: E402

LiveJob = Any  # tests/integrations/conftest.py: LiveJob

BATCHES = 16  # per epoch: 256 samples in batches of 16


class TinyRegressor(L.LightningModule):  # type: ignore[misc]
    """An MLP on random data; ``pause`` slows each step, ``fail_at`` raises at that batch."""

    def __init__(self, lr: float = 0.05, hidden: int = 16, pause: float = 0.0, fail_at: int = -1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == self.hparams.fail_at:
            raise RuntimeError("the data is bad")
        if self.hparams.pause:
            time.sleep(self.hparams.pause)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class _Pause(L.Callback):  # type: ignore[misc]
    """Slows each step down while ``until()`` is false."""

    def __init__(self, seconds: float, until: Any) -> None:
        self.seconds = seconds
        self.until = until

    def on_train_batch_start(self, *args: Any) -> None:
        if not self.until():
            time.sleep(self.seconds)


def _loaders() -> tuple[Any, Any]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(320, 8, generator=generator)
    y = x[:, :1] * 2 - x[:, 1:2] + 0.1 * torch.randn(320, 1, generator=generator)
    data = torch.utils.data.TensorDataset(x, y)
    train, valid = torch.utils.data.random_split(data, [256, 64], generator=generator)
    return (
        torch.utils.data.DataLoader(train, batch_size=16, shuffle=True, generator=generator),
        torch.utils.data.DataLoader(valid, batch_size=32),
    )


def _trainer(root: Path, callbacks: list[Any] | None = None, **kwargs: Any) -> Any:
    options: dict[str, Any] = {
        "max_epochs": 2,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 1,
        "default_root_dir": str(root),
    }
    options.update(kwargs)
    if callbacks is not None:
        options["callbacks"] = callbacks
    return L.Trainer(**options)


def _count(points: list[dict[str, Any]]) -> int:
    return sum(p["count"] for p in points)


@pytest.fixture(autouse=True)
def _quiet_lightning() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


def test_fit_reports_steps_epochs_metrics_and_hparams(live_job: LiveJob, tmp_path: Path) -> None:
    train, valid = _loaders()
    callback = StepwatchCallback()
    trainer = _trainer(tmp_path, [callback])
    trainer.fit(TinyRegressor(), train, valid)
    assert trainer.global_step == 2 * BATCHES
    job = live_job.get()
    progress = job["progress"]
    assert job["state"] == "finished"
    assert (progress["step"], progress["total_steps"], progress["percent"]) == (32, 32, 100)
    assert (progress["epoch"], progress["total_epochs"]) == (2, 2)
    assert progress["samples"] == 32 * 16  # batch size 16 per optimizer step
    history = live_job.history("loss", "train_loss", "train_loss_epoch", "val_loss", "train_loss_step")
    counts = {name: _count(points) for name, points in history.items()}
    # one loss per step (the returned one and the logged one), one epoch mean per epoch, one
    # validation per epoch (not the sanity check's), and no duplicate `_step` copy
    assert counts == {"loss": 32, "train_loss": 32, "train_loss_epoch": 2, "val_loss": 2, "train_loss_step": 0}
    assert history["loss"][-1]["last"] < history["loss"][0]["max"]
    assert job["metrics"]["val_loss"] == pytest.approx(float(trainer.callback_metrics["val_loss"]))
    params = job["params"]
    assert (params["lr"], params["hidden"], params["trainer.max_epochs"]) == (0.05, 16, 2)
    assert params["model"] == "TinyRegressor"
    assert stepwatch.current() is None  # the callback's own run is finished


def test_stop_command_saves_a_checkpoint_then_stops(live_job: LiveJob, checkpoint_dir: Path, tmp_path: Path) -> None:
    train, _ = _loaders()
    callback = StepwatchCallback(checkpoint_dir=checkpoint_dir)
    trainer = _trainer(tmp_path, [callback], max_epochs=40, limit_val_batches=0)

    def stop_once_running() -> None:
        live_job.wait(lambda job: (job["progress"]["step"] or 0) >= 5)
        live_job.command("stop", "not learning")

    thread = threading.Thread(target=stop_once_running, daemon=True)
    thread.start()
    trainer.fit(TinyRegressor(pause=0.005), train)
    thread.join(5)
    steps = trainer.global_step
    assert 5 <= steps < 40 * BATCHES
    assert callback.last_checkpoint is not None
    saved = Path(callback.last_checkpoint)
    assert saved.parent == checkpoint_dir and saved.is_file()
    checkpoint = torch.load(saved, weights_only=False)
    assert checkpoint["global_step"] == steps  # saved at the step where training stopped
    job = live_job.get()
    assert (job["state"], job["reason"], job["progress"]["step"]) == ("stopped", "not learning", steps)
    assert job["progress"]["total_steps"] == 40 * BATCHES and job["pending_commands"] == []


def test_checkpoint_command_saves_and_training_goes_on(live_job: LiveJob, tmp_path: Path) -> None:
    train, _ = _loaders()
    live_job.command("checkpoint", "before the deadline")  # delivered with the answer to the first report
    callback = StepwatchCallback()
    pause = _Pause(0.05, until=lambda: callback.last_checkpoint is not None)  # 2.4 s at most
    trainer = _trainer(tmp_path, [pause, callback], max_epochs=3, limit_val_batches=0)
    trainer.fit(TinyRegressor(), train)
    assert trainer.global_step == 3 * BATCHES
    assert callback.last_checkpoint is not None
    saved = Path(callback.last_checkpoint)
    assert saved.parent == tmp_path / "checkpoints" and saved.is_file()  # the trainer's default root
    assert 0 < torch.load(saved, weights_only=False)["global_step"] < 3 * BATCHES
    job = live_job.get()
    assert (job["state"], job["progress"]["step"], job["pending_commands"]) == ("finished", 48, [])


@pytest.fixture
def unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both namespaces' ``Trainer.__init__`` restored after the test (``install()`` patches them)."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        module = sys.modules.get(name)
        if module is not None:
            monkeypatch.setattr(module.Trainer, "__init__", module.Trainer.__init__)


@pytest.mark.usefixtures("unpatched")
def test_install_gives_every_trainer_a_callback(live_job: LiveJob, tmp_path: Path) -> None:
    assert sw_lightning.install()
    assert not sw_lightning.install()  # idempotent
    explicit = StepwatchCallback()
    assert [c for c in _trainer(tmp_path, [explicit]).callbacks if isinstance(c, StepwatchCallback)] == [explicit]
    train, valid = _loaders()
    trainer = _trainer(tmp_path, max_epochs=1)
    assert sum(isinstance(c, StepwatchCallback) for c in trainer.callbacks) == 1
    trainer.fit(TinyRegressor(), train, valid)
    job = live_job.get()
    assert (job["state"], job["progress"]["step"], job["progress"]["total_steps"]) == ("finished", 16, 16)
    assert _count(live_job.history("train_loss")["train_loss"]) == 16


def test_pytorch_lightning_namespace(live_job: LiveJob, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ptl = pytest.importorskip("pytorch_lightning", reason="the standalone pytorch_lightning is not installed")
    for module in (L, ptl):
        monkeypatch.setattr(module.Trainer, "__init__", module.Trainer.__init__)
    assert sw_lightning.install()  # both namespaces are loaded: both are patched
    callback_class = sw_lightning.callback_class("pytorch_lightning")
    assert issubclass(callback_class, ptl.Callback) and callback_class is sw_lightning.callback_class(
        "pytorch_lightning"
    )
    assert sw_lightning.callback_class("lightning") is StepwatchCallback

    class Module(ptl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    trainer = ptl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    assert [type(c) for c in trainer.callbacks if isinstance(c, sw_lightning._Reporter)] == [callback_class]
    trainer.fit(Module(), _loaders()[0])
    job = live_job.get()
    assert (job["state"], job["progress"]["step"], job["progress"]["percent"]) == ("finished", BATCHES, 100)
    assert _count(live_job.history("loss")["loss"]) == BATCHES  # the loss the training step returned


def test_a_failing_callback_body_does_not_stop_training(
    live_job: LiveJob, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Any, metrics: Any, drop: str) -> dict[str, Any]:
        raise ValueError("a bug in the integration")

    monkeypatch.setattr(StepwatchCallback, "_fresh", broken)
    train, valid = _loaders()
    trainer = _trainer(tmp_path, [StepwatchCallback()], max_epochs=1)
    with caplog.at_level(logging.WARNING, logger="stepwatch"):
        trainer.fit(TinyRegressor(), train, valid)
    assert trainer.global_step == BATCHES  # training went on
    failures = [r for r in caplog.records if "integration failed" in r.getMessage()]
    assert sorted(r.getMessage().split(" (")[0] for r in failures) == [
        "stepwatch: the lightning integration failed in _Reporter.on_train_batch_end",
        "stepwatch: the lightning integration failed in _Reporter.on_train_epoch_end",
        "stepwatch: the lightning integration failed in _Reporter.on_validation_end",
    ]  # each logged once, not once per step
    job = live_job.get()
    assert (job["state"], job["progress"]["step"]) == ("finished", BATCHES)


def test_an_exception_in_training_fails_the_run(live_job: LiveJob, tmp_path: Path) -> None:
    train, _ = _loaders()
    trainer = _trainer(tmp_path, [StepwatchCallback()], limit_val_batches=0)
    with pytest.raises(RuntimeError, match="the data is bad"):
        trainer.fit(TinyRegressor(fail_at=5), train)
    job = live_job.get()
    assert job["state"] == "failed"
    assert job["reason"] == "RuntimeError: the data is bad"
    assert job["progress"]["step"] == 5


DDP_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time

    import lightning.pytorch as L
    import torch

    from stepwatch.integrations.lightning import StepwatchCallback

    out, max_epochs = sys.argv[1], int(sys.argv[2])


    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            time.sleep(0.005)
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)


    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=16)
    callback = StepwatchCallback(checkpoint_dir=out, command_every=5)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=max_epochs, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(Module(), loader)
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"step": trainer.global_step, "checkpoint": callback.last_checkpoint}, f)
    """
)


@pytest.mark.slow
def test_ddp_ranks_agree_on_a_stop_command(live_job: LiveJob, tmp_path: Path) -> None:
    """Two processes under torchrun (gloo, CPU): whichever rank hears the stop, both save and stop together."""
    if not torch.distributed.is_available():
        pytest.skip("this PyTorch build has no torch.distributed")
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    live_job.command("stop", "budget spent")  # whichever rank reports first receives it
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*command, str(script), str(out), "100"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    steps = ranks[0]["step"]
    assert ranks[1]["step"] == steps and 5 <= steps < 100 * 8  # 8 batches per rank and epoch
    assert steps % 5 == 0  # at a batch where the ranks agreed
    assert ranks[0]["checkpoint"] == ranks[1]["checkpoint"]
    assert torch.load(ranks[0]["checkpoint"], weights_only=False)["global_step"] == steps
    job = live_job.get()
    assert (job["state"], job["reason"], job["progress"]["step"]) == ("stopped", "budget spent", steps)
    assert (job["progress"]["total_steps"], job["progress"]["world_size"]) == (800, 2)
    assert job["pending_commands"] == []
    assert _count(live_job.history("loss")["loss"]) == steps  # rank 0's losses only


def test_joins_the_users_run_and_leaves_it_open(live_job: LiveJob, tmp_path: Path) -> None:
    train, _ = _loaders()
    with stepwatch.init(params={"experiment": "two fits"}) as run:
        _trainer(tmp_path, [StepwatchCallback()], max_epochs=1, limit_val_batches=0).fit(TinyRegressor(), train)
        assert run.current_step == BATCHES and stepwatch.current() is run
        job = live_job.wait(lambda job: job["progress"]["step"] == BATCHES)
        assert job["state"] == "running"  # the user's run is the user's to finish
        # the user's params, and the module's hyperparameters added by the callback that joined
        assert job["params"]["experiment"] == "two fits" and job["params"]["model"] == "TinyRegressor"
    assert live_job.get()["state"] == "finished"


class _SlowValidation(TinyRegressor):
    """Each validation batch takes 2.5 s: a 5 s validation per epoch, the step standing."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if not self.trainer.sanity_checking:
            time.sleep(2.5)
        super().validation_step(batch, batch_idx)


@pytest.mark.parametrize(("announced", "where"), [(True, "on"), (False, "off"), (False, "on")])
def test_validation_is_announced_and_no_stall(
    strict_job: LiveJob, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, announced: bool, where: str
) -> None:
    """On a server that calls a 3 s standstill a stall, a fit with 5 s validations stays healthy: the
    callback says ``eval`` from on_validation_start to on_validation_end; without that hook and without the
    stack readings (``STEPWATCH_WHERE=off``, as an older report core), stalled; with the readings, an
    evaluation without the hook is no stall either (issue 29)."""
    monkeypatch.setenv("STEPWATCH_WHERE", where)
    if not announced:
        monkeypatch.setattr(StepwatchCallback, "on_validation_start", lambda self, trainer, pl_module: None)
    train, valid = _loaders()
    _trainer(tmp_path, callbacks=[StepwatchCallback()]).fit(_SlowValidation(), train, valid)
    job = strict_job.get()
    assert job["state"] == "finished" and job["progress"]["step"] == 2 * BATCHES
    states = [span["state"] for span in job["health_history"]]
    assert ("stalled" not in states) is (announced or where == "on"), job["health"]


def test_fit_serves_openshift_ai_progression_with_no_server(progression_env: Path, tmp_path: Path) -> None:
    """OpenShift AI's controller polls rank 0 while ``fit`` runs and reads the termination message at the end
    (docs/openshift-ai.md): no stepwatch server, no code beyond the callback (which auto-instrumentation adds)."""
    train, valid = _loaders()
    trainer = _trainer(tmp_path, [StepwatchCallback()])
    with polled_in_process() as polls:
        trainer.fit(TinyRegressor(pause=0.02), train, valid)
    assert polls and all(isinstance(p, ProgressionStatus) for p in polls), polls[:3]
    assert any(0 < (p.current_step or 0) < 2 * BATCHES for p in polls if isinstance(p, ProgressionStatus))
    message = read_termination_message(progression_env)
    assert (message.progress_percentage, message.estimated_remaining_seconds) == (100, 0)
    assert (message.current_step, message.total_steps, message.total_epochs) == (32, 32, 2)
    assert message.train_metrics and "train_loss" in message.train_metrics
    assert message.eval_metrics and "val_loss" in message.eval_metrics
