"""A tiny real training run that reports to stepwatch: an MLP learning y = sin(x) on CPU.

    STEPWATCH_URL=http://127.0.0.1:8642 python examples/train_tiny.py --steps 600 --lr 0.01

``--lr 0`` gives a job that does not learn, ``--lr 5`` one that diverges: the demo runs all three.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

import stepwatch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    eval_x = torch.linspace(-math.pi, math.pi, 256).unsqueeze(1)

    run = stepwatch.init(
        total_steps=args.steps,
        total_epochs=1,
        batch_size=args.batch_size,
        params={"lr": args.lr, "batch_size": args.batch_size, "model": "mlp-64x2", "optimizer": "sgd"},
    )
    with run:
        for step in range(1, args.steps + 1):
            x = (torch.rand(args.batch_size, 1) * 2 - 1) * math.pi
            loss = nn.functional.mse_loss(model(x), torch.sin(x))
            optimizer.zero_grad()
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            optimizer.step()
            scheduler.step()
            # tensors go in as they are: stepwatch reads them in its own thread, never here
            run.step(loss=loss.detach(), grad_norm=grad_norm, learning_rate=scheduler.get_last_lr()[0])
            run.epoch(step / args.steps)
            if step % args.eval_every == 0:
                with torch.no_grad():
                    run.log(eval_loss=nn.functional.mse_loss(model(eval_x), torch.sin(eval_x)))
            if run.should_stop:
                print(f"stopping at step {step}: {run.command_reason}")
                break


if __name__ == "__main__":
    main()
