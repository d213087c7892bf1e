"""A loop over a DataLoader whose worker deadlocks at item ``WHERE_DEADLOCK_AT``.

The worker process takes a lock it already holds (a classic non-reentrant deadlock) for
``WHERE_DEADLOCK_S`` seconds (0: forever); the training loop waits on the loader (``run.track``).
Knobs: see README.md in this folder.
"""

import os
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

import stepwatch

STEPS = int(os.environ.get("WHERE_STEPS", "40"))
STEP_S = float(os.environ.get("WHERE_STEP_S", "0.2"))
DEADLOCK_AT = int(os.environ.get("WHERE_DEADLOCK_AT", "10"))
DEADLOCK_S = float(os.environ.get("WHERE_DEADLOCK_S", "0"))


class Batches(Dataset):
    """Random batches; item ``DEADLOCK_AT`` deadlocks in the worker that loads it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return STEPS

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == DEADLOCK_AT:
            with self.lock:  # ... and the code below takes it again
                self.lock.acquire(timeout=DEADLOCK_S if DEADLOCK_S > 0 else -1)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g)


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Batches(), batch_size=None, num_workers=1, prefetch_factor=1)
    run = stepwatch.init()
    print("WHERE_MARK loader", 0, flush=True)
    for x, y in run.track(loader):
        began = time.monotonic()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(max(0.0, STEP_S - (time.monotonic() - began)))
        run.log(loss=loss.detach())
        if run.should_stop:
            break
    run.finish()


if __name__ == "__main__":
    main()
