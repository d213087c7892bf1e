"""A loop that evaluates for ``WHERE_EVAL_S`` seconds at step ``WHERE_EVAL_AT`` without announcing it.

No ``run.evaluating()``: the report core must read from the stack that the rank evaluates (a user
function named ``evaluate``), so the job is not called stalled. Knobs: see README.md in this folder.
"""

import os
import time

import torch

import stepwatch

STEPS = int(os.environ.get("WHERE_STEPS", "40"))
STEP_S = float(os.environ.get("WHERE_STEP_S", "0.5"))
EVAL_AT = int(os.environ.get("WHERE_EVAL_AT", "10"))
EVAL_S = float(os.environ.get("WHERE_EVAL_S", "60"))


def evaluate(model: torch.nn.Module, seconds: float) -> float:
    """Real forward passes over held-out batches for ``seconds`` (a large validation set)."""
    model.eval()
    total, batches = 0.0, 0
    deadline = time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < deadline:
            x, y = torch.randn(512, 16), torch.randn(512, 1)
            total += float(torch.nn.functional.mse_loss(model(x), y))
            batches += 1
            time.sleep(0.01)
    model.train()
    return total / max(batches, 1)


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
        if step == EVAL_AT:
            print("WHERE_MARK eval", step, flush=True)
            run.log(val_loss=evaluate(model, EVAL_S))
        if run.should_stop:
            break
    run.finish()


if __name__ == "__main__":
    main()
