"""A loop of 0.5 s steps that saves a checkpoint with torch.save into a file object whose writes are slow.

The save lasts ``WHERE_SAVE_S`` seconds (75 by default): a healthy job in the middle of a long
checkpoint save, which must never read ``stalled``. Knobs: see README.md in this folder.
"""

import io
import os
import time

import torch

import stepwatch

STEPS = int(os.environ.get("WHERE_STEPS", "40"))
STEP_S = float(os.environ.get("WHERE_STEP_S", "0.5"))
SAVE_AT = int(os.environ.get("WHERE_SAVE_AT", "10"))
SAVE_S = float(os.environ.get("WHERE_SAVE_S", "75"))


class SlowFile(io.RawIOBase):
    """A file whose writes are slow (a network file system on a bad day): the save lasts ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, chunk) -> int:
        # the first write waits out the whole save (a stuck mount that comes back), the others are quick:
        # whatever number of writes torch makes, the save lasts `seconds`, all of it inside torch.save
        left = self.deadline - time.monotonic()
        if left > 0:
            time.sleep(left)
        self.data += bytes(chunk)
        return len(chunk)


def save_checkpoint(model: torch.nn.Module, seconds: float) -> int:
    out = SlowFile(seconds)
    torch.save(model.state_dict(), out)
    return len(out.data)


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(256, 16), torch.randn(256, 1)
    run = stepwatch.init(total_steps=STEPS)
    for step in range(1, STEPS + 1):
        began = time.monotonic()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(max(0.0, STEP_S - (time.monotonic() - began)))
        run.step(loss=loss.detach())
        if step == SAVE_AT:
            print("WHERE_MARK save", step, flush=True)
            save_checkpoint(model, SAVE_S)
        if run.should_stop:
            break
    run.finish()


if __name__ == "__main__":
    main()
