"""Plain PyTorch DDP and FSDP under ``torchrun --nproc-per-node 2`` (gloo, CPU), against real servers.

Each test writes a tiny training script, starts it with torchrun and reads what arrived. The script
uses stepwatch the one-line way (``stepwatch.init()``, ``run.step(loss=loss)``) plus
:func:`stepwatch.integrations.torch.agree` every few steps to obey commands on every rank.

The stepwatch server does not expose per-rank data (it keeps the latest heartbeat of each rank, but
no route reads it), so the heartbeats of every rank are checked with ``stepwatch.testing.ReportSink``,
which keeps each rank's reports; rank 0's metrics and progress are checked on the real server.
torchrun takes several seconds to start: three runs in all.
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

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
if not torch.distributed.is_available():
    pytest.skip("this PyTorch build has no torch.distributed", allow_module_level=True)

from stepwatch.testing import ReportSink  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]

LiveJob = Any  # tests/integrations/conftest.py: LiveJob

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import stepwatch
    from stepwatch.integrations.torch import agree

    mode, steps, delay, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)

    run = stepwatch.init(total_steps=steps, params={"lr": 0.05, "mode": mode})   # the one line
    commands = None
    for step in range(1, steps + 1):
        x = torch.randn(16, 8, generator=data)
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        run.step(loss=loss.detach())          # a tensor: read in stepwatch's thread, no .item() here
        if step % 5 == 0:
            commands = agree(run)             # the same answer on every rank
            if commands.checkpoint or commands.stop:
                if rank == 0:
                    state = model.module.state_dict() if mode == "ddp" else None
                    torch.save({"step": step, "model": state}, os.path.join(out, "checkpoint.pt"))
                run.checkpoint_done()
            if commands.stop:
                break
        time.sleep(delay)
    dist.barrier()
    stopped = commands is not None and commands.stop
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"step": run.current_step, "stopped": stopped, "world": run.identity.world_size}, f)
    run.finish("stopped" if stopped else "finished", commands.reason if stopped else "")
    dist.destroy_process_group()
    """
)


def _torchrun(tmp_path: Path, mode: str, steps: int, delay: float = 0.0) -> list[dict[str, Any]]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*command, str(script), mode, str(steps), str(delay), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _count(points: list[dict[str, Any]]) -> int:
    return sum(p["count"] for p in points)


def test_ddp_rank_zero_reports_metrics(live_job: LiveJob, tmp_path: Path) -> None:
    ranks = _torchrun(tmp_path, "ddp", steps=40)
    assert [r["world"] for r in ranks] == [2, 2]
    job = live_job.get()
    assert job["state"] == "finished"
    progress = job["progress"]
    assert (progress["step"], progress["total_steps"], progress["percent"]) == (40, 40, 100)
    assert progress["world_size"] == 2
    assert job["params"] == {"lr": 0.05, "mode": "ddp"}
    loss = live_job.history("loss")["loss"]
    assert _count(loss) == 40  # rank 0's: rank 1 sends no metrics
    assert loss[-1]["last"] < loss[0]["max"]


def test_fsdp_every_rank_heartbeats(sink: ReportSink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPWATCH_URL", sink.url)
    monkeypatch.setenv("STEPWATCH_TOKEN", "t")
    monkeypatch.setenv("STEPWATCH_JOB", "fsdp")
    monkeypatch.setenv("STEPWATCH_INTERVAL", "0.1")
    _torchrun(tmp_path, "fsdp", steps=30, delay=0.01)
    by_rank: dict[int, list[Any]] = {0: [], 1: []}
    for report in sink.reports:
        by_rank[report.identity.rank].append(report)
    assert all(r.identity.world_size == 2 for r in sink.reports)
    assert by_rank[0] and by_rank[1]
    assert not any(r.metrics for r in by_rank[1])  # heartbeats only
    assert by_rank[1][-1].progress.step == 30 and by_rank[1][-1].state == "finished"
    assert sum(m.count for r in by_rank[0] for m in r.metrics if m.name == "loss") == 30
    assert by_rank[0][-1].progress.step == 30 and by_rank[0][-1].state == "finished"


def test_ddp_stop_command_stops_every_rank_after_a_checkpoint(live_job: LiveJob, tmp_path: Path) -> None:
    live_job.command("stop", "not learning")  # whichever rank reports first receives it
    ranks = _torchrun(tmp_path, "ddp", steps=5000, delay=0.005)
    assert ranks[0]["stopped"] and ranks[1]["stopped"]
    assert ranks[0]["step"] == ranks[1]["step"] < 5000  # both left the loop at the same step
    checkpoint = torch.load(tmp_path / "out" / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == ranks[0]["step"]
    assert set(checkpoint["model"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    job = live_job.get()
    assert (job["state"], job["reason"]) == ("stopped", "not learning")
    assert job["progress"]["step"] == ranks[0]["step"]
    assert job["pending_commands"] == []
