"""The README tour's training job, with nothing to install: a real model trained in pure Python.

Logistic regression learns to tell two noisy clusters apart by minibatch SGD (the standard library's
``random`` and ``math`` only: no NumPy, no PyTorch), reporting loss, accuracy on held-out data and the
learning rate to stepwatch, and obeying ``stepwatch stop`` (it saves its weights, then stops)::

    stepwatch run -- python examples/tour.py                   # about a minute (3,000 steps)
    stepwatch run -- python examples/tour.py --steps 300 --step-delay 0
    stepwatch run --on diverging=stop -- python examples/tour.py --lr 1e6   # a job that blows up

``--lr 0`` gives a job that does not learn, a huge ``--lr`` one that diverges (its loss overflows
to ``inf``), as in ``stepwatch demo``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import tempfile
import time

import stepwatch

FEATURES = 8


def make_data(n: int, rng: random.Random) -> list[tuple[list[float], int]]:
    """Two Gaussian clusters, one per class, their centres one unit apart along every feature."""
    data = []
    for _ in range(n):
        label = rng.random() < 0.5
        centre = 0.5 if label else -0.5
        data.append(([rng.gauss(centre, 1.0) for _ in range(FEATURES)], int(label)))
    return data


def predict(weights: list[float], bias: float, x: list[float]) -> float:
    """The probability of class 1 (a sigmoid that neither overflows nor divides by zero)."""
    z = bias + sum(w * v for w, v in zip(weights, x))
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def log_loss(p: float, y: int) -> float:
    """Binary cross-entropy; ``inf`` once the model is certain and wrong (a diverged run says so)."""
    p = p if y else 1.0 - p
    return -math.log(p) if p > 0 else math.inf


def accuracy(weights: list[float], bias: float, data: list[tuple[list[float], int]]) -> float:
    return sum((predict(weights, bias, x) >= 0.5) == bool(y) for x, y in data) / len(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000, help="SGD steps (default 3000)")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate (default 0.1)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--step-delay", type=float, default=0.02, help="extra seconds per step, to watch it")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    train, held_out = make_data(4000, rng), make_data(1000, rng)
    weights, bias = [0.0] * FEATURES, 0.0
    run = stepwatch.init(
        total_steps=args.steps,
        total_epochs=round(args.steps * args.batch_size / len(train), 3),
        batch_size=args.batch_size,
        params={"lr": args.lr, "batch_size": args.batch_size, "model": "logistic regression", "seed": args.seed},
    )
    with run:  # an exception inside marks the job failed, with its reason
        for step in range(1, args.steps + 1):
            lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))  # cosine decay
            batch = rng.sample(train, args.batch_size)
            grad_w, grad_b, loss = [0.0] * FEATURES, 0.0, 0.0
            for x, y in batch:
                p = predict(weights, bias, x)
                loss += log_loss(p, y) / len(batch)
                for i, v in enumerate(x):
                    grad_w[i] += (p - y) * v / len(batch)
                grad_b += (p - y) / len(batch)
            weights = [w - lr * g for w, g in zip(weights, grad_w)]
            bias -= lr * grad_b
            run.step(loss=loss, learning_rate=lr)
            if step % 100 == 0 or step == args.steps:
                run.log(eval_accuracy=accuracy(weights, bias, held_out))
            if run.should_stop:  # `stepwatch stop`, or a policy: keep the work, then leave
                path = os.path.join(tempfile.gettempdir(), f"{run.job}-step{step}.json")
                with open(path, "w", encoding="utf-8") as out:
                    json.dump({"step": step, "weights": weights, "bias": bias}, out)
                print(f"stopping at step {step}: saved {path}", flush=True)
                break
            if args.step_delay > 0:
                time.sleep(args.step_delay)
    print(f"held-out accuracy {accuracy(weights, bias, held_out):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
