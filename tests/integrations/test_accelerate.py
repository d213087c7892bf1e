"""Accelerate: a real tiny ``accelerate`` loop on CPU, with gradient accumulation, against a real server."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the Accelerate integration tests need PyTorch")
pytest.importorskip("accelerate", reason="the Accelerate integration is tested only where it is installed")

from accelerate import Accelerator  # noqa: E402

import stepwatch  # noqa: E402
from stepwatch.integrations.accelerate import init_for, obey_commands, sync_step  # noqa: E402

pytestmark = pytest.mark.torch


def _setup(accumulation: int) -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def _train_step(accelerator: Any, model: Any, optimizer: Any, batch: Any) -> Any:
    with accelerator.accumulate(model):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    return loss.detach()


@pytest.fixture(autouse=True)
def _finish() -> Any:
    yield
    stepwatch.finish()


def test_accelerate_loop_counts_optimizer_steps(live_job: Any) -> None:
    accelerator, model, optimizer, loader = _setup(accumulation=2)
    epochs = 2
    run = init_for(accelerator, total_steps=len(loader) * epochs // 2, total_epochs=epochs, batch_size=4)
    for epoch in range(epochs):
        run.epoch(epoch)
        for batch in loader:
            sync_step(run, accelerator, loss=_train_step(accelerator, model, optimizer, batch))
    run.epoch(epochs)
    assert run.finish()

    job = live_job.get()
    assert job["state"] == "finished"
    progress = job["progress"]
    assert (progress["step"], progress["total_steps"], progress["percent"]) == (64, 64, 100.0)
    assert progress["samples"] == 64 * 4 * 2  # 4 per micro-batch, 2 micro-batches per optimizer step
    params = job["params"]
    assert (params["num_processes"], params["gradient_accumulation_steps"]) == (1, 2)
    assert params["mixed_precision"] == "no"
    windows = live_job.history("loss")["loss"]
    assert sum(w["count"] for w in windows) == 128  # every micro-batch's loss, at its optimizer step
    assert max(w["step"] for w in windows) == 64
    assert windows[-1]["last"] < windows[0]["max"] / 10  # it learned


def test_accelerate_loop_checkpoints_then_stops(live_job: Any, checkpoint_dir: Path) -> None:
    accelerator, model, optimizer, loader = _setup(accumulation=1)
    run = init_for(accelerator, total_steps=100_000)
    stopped = False
    for _ in range(2000):
        for batch in loader:
            sync_step(run, accelerator, loss=_train_step(accelerator, model, optimizer, batch))
            if run.current_step == 5:
                live_job.command("stop", "over budget")
            time.sleep(0.002)
            if obey_commands(run, accelerator, checkpoint_dir):
                stopped = True
                break
        if stopped:
            break
    assert stopped
    run.finish("stopped", run.command_reason)

    job = live_job.get()
    assert job["state"] == "stopped"
    assert job["reason"] == "over budget"
    step = job["progress"]["step"]
    assert 5 <= step < 1000  # 5 when the report in flight as the command was queued brought it back at once
    assert [p.name for p in checkpoint_dir.iterdir()] == [f"checkpoint-{step}"]
    assert any((checkpoint_dir / f"checkpoint-{step}").iterdir())
