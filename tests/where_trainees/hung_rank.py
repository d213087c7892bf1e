"""A 2-process torchrun (gloo) job whose rank 1 blocks in its own function at step ``WHERE_HANG_AT``.

``torchrun --nproc-per-node 2 hung_rank.py``: both ranks train a tiny model and average gradients
with ``all_reduce``. At step ``WHERE_HANG_AT`` rank 1 blocks in ``wait_for_lock`` (a lock nobody
releases) for ``WHERE_HANG_S`` seconds (0: forever), so rank 0 waits for it in ``all_reduce``.
Knobs: see README.md in this folder.
"""

import os
import threading
import time

import torch
import torch.distributed as dist

import stepwatch

STEPS = int(os.environ.get("WHERE_STEPS", "60"))
STEP_S = float(os.environ.get("WHERE_STEP_S", "0.5"))
HANG_AT = int(os.environ.get("WHERE_HANG_AT", "30"))
HANG_S = float(os.environ.get("WHERE_HANG_S", "0"))

held = threading.Lock()


def wait_for_lock(seconds: float) -> None:
    """The bug: a lock some other code took and never gave back."""
    held.acquire()  # taken elsewhere, long ago
    if seconds > 0:
        held.acquire(timeout=seconds)
    else:
        held.acquire()
    held.release()


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(128, 16), torch.randn(128, 1)
    run = stepwatch.init(total_steps=STEPS)
    for step in range(1, STEPS + 1):
        began = time.monotonic()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if rank == 1 and step == HANG_AT:
            print("WHERE_MARK hang", step, flush=True)
            wait_for_lock(HANG_S)
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        time.sleep(max(0.0, STEP_S - (time.monotonic() - began)))
        run.step(loss=loss.detach())
    run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
