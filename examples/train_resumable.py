"""A tiny NumPy training loop that saves a checkpoint and resumes from it, reporting to stepwatch.

    stepwatch run --name reg -- python examples/train_resumable.py --steps 2000 --checkpoint /tmp/reg.json
    # kill it, run the same command again: it resumes at its checkpoint's step, as attempt 2

Linear regression by gradient descent; a checkpoint (the weights and the step, JSON) every
``--save-every`` steps. ``--step-seconds`` paces each step (a stand-in for a real model's step time).
It obeys ``stepwatch stop`` at the next step unless ``--ignore-stop``; ``--exit-at N`` exits at step N
without finishing the run (exit status ``--exit-code``), as a script that ends early does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import stepwatch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="total optimizer steps")
    parser.add_argument("--checkpoint", type=Path, required=True, help="the checkpoint file (JSON)")
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--step-seconds", type=float, default=0.01)
    parser.add_argument("--load-seconds", type=float, default=1.0, help="time to load a checkpoint")
    parser.add_argument("--ignore-stop", action="store_true", help="never look at run.should_stop")
    parser.add_argument("--exit-at", type=int, default=0, help="exit at this step without finish()")
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--pid-file", type=Path, help="write this process's id here")
    args = parser.parse_args()
    if args.pid_file:
        args.pid_file.write_text(str(os.getpid()))

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 8))
    y = x @ rng.normal(size=8) + 0.1 * rng.normal(size=256)
    weights, start = np.zeros(8), 0
    run = stepwatch.init(total_steps=args.steps, params={"lr": 0.01})  # its first report: step 0
    if args.checkpoint.exists():
        saved = json.loads(args.checkpoint.read_text())
        weights, start = np.array(saved["weights"]), int(saved["step"])
        time.sleep(args.load_seconds)
        print(f"resumed at step {start}", flush=True)
    for step in range(start + 1, args.steps + 1):
        error = x @ weights - y
        weights -= 0.01 * (x.T @ error) / len(x)
        time.sleep(args.step_seconds)
        run.step(step, loss=float(np.mean(error**2)))
        if step % args.save_every == 0:
            tmp = args.checkpoint.with_suffix(".tmp")
            tmp.write_text(json.dumps({"step": step, "weights": weights.tolist()}))
            tmp.replace(args.checkpoint)
        if step == args.exit_at:
            sys.exit(args.exit_code)  # no finish(): the report core ends the run at exit
        if not args.ignore_stop and run.should_stop:
            print(f"stopping at step {step}: {run.command_reason}", flush=True)
            break
    run.finish()  # "stopped" when a stop was asked for, whether the loop obeyed it or ran to its end
    return 0


if __name__ == "__main__":
    sys.exit(main())
