"""DeepSpeed's engine loop under torchrun (2 ranks, CPU accelerator) against a real server.

DeepSpeed is not part of the test extras (a large install that builds ops on first use), so these
tests skip unless it is installed. They were run in a separate virtual environment with
``torch==2.13.0`` and ``deepspeed`` (see docs/integrations.md, "DeepSpeed").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed)")

pytestmark = [pytest.mark.torch, pytest.mark.slow]

LiveJob = Any  # tests/integrations/conftest.py: LiveJob

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time

    import deepspeed
    import torch
    import torch.nn.functional as F

    import stepwatch
    from stepwatch.integrations.torch import agree

    steps, delay, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    config = {"train_micro_batch_size_per_gpu": 16, "optimizer": {"type": "SGD", "params": {"lr": 0.05}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    data = torch.Generator().manual_seed(engine.global_rank)

    run = stepwatch.init(total_steps=steps, params=config)   # the one line
    commands = None
    for step in range(1, steps + 1):
        x = torch.randn(16, 8, generator=data)
        loss = F.mse_loss(engine(x), x.sum(1, keepdim=True))
        engine.backward(loss)
        engine.step()
        run.step(loss=loss.detach())
        if step % 5 == 0:
            commands = agree(run)
            if commands.checkpoint or commands.stop:
                engine.save_checkpoint(os.path.join(out, "checkpoints"), tag=f"step{step}")   # every rank
                run.checkpoint_done()
            if commands.stop:
                break
        time.sleep(delay)
    stopped = commands is not None and commands.stop
    with open(os.path.join(out, f"rank{engine.global_rank}.json"), "w") as f:
        json.dump({"step": run.current_step, "stopped": stopped, "world": run.identity.world_size}, f)
    run.finish("stopped" if stopped else "finished", commands.reason if stopped else "")
    """
)


def _launch(tmp_path: Path, steps: int, delay: float) -> list[dict[str, Any]]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    done = subprocess.run(
        [*command, str(script), str(steps), str(delay), str(out)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _count(points: list[dict[str, Any]]) -> int:
    return sum(p["count"] for p in points)


def test_engine_loop_reports(live_job: LiveJob, tmp_path: Path) -> None:
    ranks = _launch(tmp_path, steps=30, delay=0.0)
    assert [r["world"] for r in ranks] == [2, 2]
    job = live_job.get()
    assert job["state"] == "finished"
    progress = job["progress"]
    assert (progress["step"], progress["total_steps"], progress["percent"], progress["world_size"]) == (30, 30, 100, 2)
    assert job["params"]["optimizer.params.lr"] == 0.05
    assert _count(live_job.history("loss")["loss"]) == 30


def test_engine_loop_stops_every_rank_after_a_checkpoint(live_job: LiveJob, tmp_path: Path) -> None:
    live_job.command("stop", "not learning")
    ranks = _launch(tmp_path, steps=5000, delay=0.005)
    assert ranks[0]["stopped"] and ranks[1]["stopped"]
    assert ranks[0]["step"] == ranks[1]["step"] < 5000
    assert (tmp_path / "out" / "checkpoints" / f"step{ranks[0]['step']}").is_dir()
    job = live_job.get()
    assert (job["state"], job["reason"], job["progress"]["step"]) == ("stopped", "not learning", ranks[0]["step"])
