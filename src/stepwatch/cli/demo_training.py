"""The demo's training program: a real small fraud-detection-like classifier, trained in NumPy, reporting to stepwatch.

    STEPWATCH_URL=http://127.0.0.1:8642 STEPWATCH_JOB=fraud-converge \\
        python -m stepwatch.cli.demo_training --scenario converge

The data are generated from the seed: 20,000 tabular samples with 30 features, 2 % positives, of which
a few features carry the signal (shifted means, one wider spread). The model is a one-hidden-layer MLP
(32 ReLU units) trained on binary cross-entropy with mini-batches; forward, backward, Adam and SGD are
written out below. Every step reports ``loss``, ``grad_norm`` and ``learning_rate``; every eval interval
``eval_loss``, ``eval_auc`` and ``eval_precision_at_recall`` (precision at 80 % recall) on a held-out
fifth of the data.

Scenarios, each one from its own training dynamics (only ``hang`` is staged):

``converge``
    Adam at 5e-3 with warm-up, cosine decay and gradient clipping: the loss falls from ~0.7 to ~0.03
    and the eval AUC climbs to ~0.97-0.98 (the best any model can do on these data is ~0.98).
``diverge``
    SGD with momentum, warming up over 300 steps to a learning rate of 20 (0.1 works well here), and
    no clipping: the loss first falls as in any run; once the rate is past what the model tolerates
    the weights grow every step until they overflow float32: the loss passes 1e6 near step 200 and is
    NaN from ~step 350 on. Like a job nobody watches, it carries on reporting NaN until its steps end.
``plateau``
    Adam at 5e-3 with a step decay written for epochs but stepped after every batch (x0.1 every 75
    steps): the learning rate is ~0 after a few hundred steps, and the loss stays flat (with batch
    noise) far from where ``converge`` gets; eval metrics stop moving at AUC ~0.8-0.9.
``hang``
    Trains as ``converge``, then at 40 % of its steps (``--hang-at``) blocks for good in a sleep loop, as a deadlocked
    collective or a stuck data loader would: alive, reporting (the sender thread still runs), but the
    step never moves again. It ignores server commands (its loop is stuck) and ends only on a signal.

A stop command from the server saves a checkpoint and ends the job cleanly (state ``stopped``, exit
code 0); a checkpoint command saves one (``np.savez``) and carries on. The job name comes from
``STEPWATCH_JOB``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

import stepwatch

__all__ = [
    "SCENARIOS",
    "Config",
    "Data",
    "Model",
    "config_for",
    "evaluate",
    "main",
    "make_data",
    "precision_at_recall",
    "roc_auc",
]

Array = npt.NDArray[np.float32]
SCENARIOS = ("converge", "diverge", "plateau", "hang")

N_SAMPLES = 20_000
N_FEATURES = 30
POSITIVE_RATE = 0.02
EVAL_FRACTION = 0.2
HIDDEN = 32
BATCH_SIZE = 128
RECALL_TARGET = 0.8
HANG_AT = 0.4


# ----------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Data:
    """Standardised train and eval splits (features float32, labels 0/1 as float32)."""

    x_train: Array
    y_train: Array
    x_eval: Array
    y_eval: Array


def make_data(seed: int, n: int = N_SAMPLES, features: int = N_FEATURES) -> Data:
    """Imbalanced tabular data, the same for the same seed.

    Negatives are standard normal. Positives (``POSITIVE_RATE`` of the rows) have five features with
    shifted means and one with three times the spread; the other features are noise. A transaction
    "amount" (feature 0) is log-normal, larger for positives. Features are standardised with the
    statistics of the training split.
    """
    rng = np.random.default_rng(seed)
    n_pos = max(2, round(n * POSITIVE_RATE))
    y = np.zeros(n, dtype=np.float32)
    y[:n_pos] = 1.0
    x = rng.standard_normal((n, features))
    pos = slice(0, n_pos)
    x[pos, 0] += 1.2  # the amount's log
    x[pos, 1] += 1.5
    x[pos, 2] -= 1.2
    x[pos, 3] += 1.0
    x[pos, 4] -= 1.0
    x[pos, 5] *= 3.0  # only a non-linear model sees this one
    x[:, 0] = np.exp(3.5 + 0.8 * x[:, 0])  # amount: log-normal, positive, heavy-tailed
    x[:, 0] = np.log1p(x[:, 0])  # what a feature pipeline would do
    order = rng.permutation(n)
    x, y = x[order], y[order]
    n_eval = int(n * EVAL_FRACTION)
    x_train, x_eval = x[n_eval:], x[:n_eval]
    mean = x_train.mean(axis=0)
    std = x_train.std(axis=0) + 1e-8
    return Data(
        x_train=((x_train - mean) / std).astype(np.float32),
        y_train=y[n_eval:],
        x_eval=((x_eval - mean) / std).astype(np.float32),
        y_eval=y[:n_eval],
    )


# ---------------------------------------------------------------------------------------- model


class Model:
    """``x -> ReLU(x W1 + b1) W2 + b2``: one logit per row, float32."""

    def __init__(self, features: int, hidden: int, rng: np.random.Generator) -> None:
        self.params: dict[str, Array] = {
            "w1": (rng.standard_normal((features, hidden)) * math.sqrt(2.0 / features)).astype(np.float32),
            "b1": np.zeros(hidden, dtype=np.float32),
            "w2": (rng.standard_normal((hidden, 1)) * math.sqrt(1.0 / hidden)).astype(np.float32),
            "b2": np.zeros(1, dtype=np.float32),
        }

    def logits(self, x: Array) -> Array:
        p = self.params
        hidden = np.maximum(x @ p["w1"] + p["b1"], 0.0)
        out: Array = (hidden @ p["w2"] + p["b2"])[:, 0]
        return out

    def loss_and_grads(self, x: Array, y: Array) -> tuple[float, dict[str, Array]]:
        """Mean binary cross-entropy on the logits, and its gradient for every parameter."""
        p = self.params
        pre = x @ p["w1"] + p["b1"]
        hidden = np.maximum(pre, 0.0)
        z = (hidden @ p["w2"] + p["b2"])[:, 0]
        loss = float(np.mean(bce_with_logits(z, y)))
        dz = ((sigmoid(z) - y) / len(y))[:, None]
        dhidden = (dz @ p["w2"].T) * (pre > 0)
        grads = {
            "w1": x.T @ dhidden,
            "b1": dhidden.sum(axis=0),
            "w2": hidden.T @ dz,
            "b2": dz.sum(axis=0),
        }
        return loss, grads


def sigmoid(z: Array) -> Array:
    out: Array = 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for large |z|
    return out


def bce_with_logits(z: Array, y: Array) -> Array:
    """``-y log(sigmoid(z)) - (1-y) log(1 - sigmoid(z))``, in a form that cannot overflow."""
    out: Array = np.maximum(z, 0.0) - z * y + np.log1p(np.exp(-np.abs(z)))
    return out


# ------------------------------------------------------------------------------------ optimizers


class Adam:
    def __init__(self, params: dict[str, Array], beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def update(self, params: dict[str, Array], grads: dict[str, Array], lr: float) -> None:
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        correction = math.sqrt(1 - b2**self.t) / (1 - b1**self.t)
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            params[k] -= (lr * correction) * self.m[k] / (np.sqrt(self.v[k]) + self.eps)


class SGD:
    """SGD with (heavy-ball) momentum."""

    def __init__(self, params: dict[str, Array], momentum: float = 0.9) -> None:
        self.momentum = momentum
        self.velocity = {k: np.zeros_like(v) for k, v in params.items()}

    def update(self, params: dict[str, Array], grads: dict[str, Array], lr: float) -> None:
        for k, g in grads.items():
            self.velocity[k] = self.momentum * self.velocity[k] + g
            params[k] -= lr * self.velocity[k]


# ------------------------------------------------------------------------------------- metrics


def roc_auc(y: Array, scores: Array) -> float:
    """Area under the ROC curve (the Mann-Whitney statistic, ties counted half); NaN if undefined."""
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0 or not np.all(np.isfinite(scores)):
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    _, inverse, counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    average_rank = (ends - counts + 1 + ends) / 2.0  # 1-based, averaged over each group of ties
    ranks = np.empty(len(scores))
    ranks[order] = average_rank[inverse]
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def precision_at_recall(y: Array, scores: Array, recall: float = RECALL_TARGET) -> float:
    """Precision at the highest threshold whose recall reaches ``recall``; NaN if undefined."""
    n_pos = int(y.sum())
    if n_pos == 0 or not np.all(np.isfinite(scores)):
        return float("nan")
    ranked = y[np.argsort(-scores, kind="mergesort")]
    true_pos = np.cumsum(ranked)
    k = int(np.searchsorted(true_pos, math.ceil(recall * n_pos)))  # first index reaching the recall
    return float(true_pos[k] / (k + 1))


def evaluate(model: Model, data: Data) -> dict[str, float]:
    z = model.logits(data.x_eval)
    return {
        "eval_loss": float(np.mean(bce_with_logits(z, data.y_eval))),
        "eval_auc": roc_auc(data.y_eval, z),
        "eval_precision_at_recall": precision_at_recall(data.y_eval, z),
    }


# ----------------------------------------------------------------------------------- scenarios


@dataclass(frozen=True)
class Config:
    """What a scenario sets: optimizer, learning-rate schedule and clipping."""

    scenario: str
    optimizer: str
    lr: float
    schedule: str
    clip: float | None
    decay_every: int = 75
    """Steps between two x0.1 decays of the ``step-per-batch`` schedule."""
    warmup: int = 300
    """Steps of linear warm-up of the ``warmup-constant`` schedule."""

    def learning_rate(self, step: int, total: int) -> float:
        """The learning rate of optimizer step ``step`` (1-based) of ``total``."""
        if self.schedule == "warmup-cosine":
            warmup = max(1, total // 20)
            if step <= warmup:
                return self.lr * step / warmup
            progress = (step - warmup) / max(1, total - warmup)
            return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        if self.schedule == "warmup-constant":
            return self.lr * min(1.0, step / self.warmup)
        if self.schedule == "step-per-batch":
            # StepLR(step_size=75, gamma=0.1) written for epochs, but stepped after every batch
            return self.lr * 0.1 ** ((step - 1) // self.decay_every)
        return self.lr


def config_for(scenario: str) -> Config:
    """The training recipe of a scenario: the same model and data, a different optimizer set-up."""
    if scenario == "diverge":
        # SGD with momentum learns these data well at 0.1 and stays stable up to ~2: the warm-up climbs
        # past that after a few dozen steps, and the weights grow without bound from there
        return Config(scenario, "sgd-momentum", 20.0, "warmup-constant", None)
    if scenario == "plateau":
        return Config(scenario, "adam", 5e-3, "step-per-batch", 5.0)
    return Config(scenario, "adam", 5e-3, "warmup-cosine", 5.0)


# ----------------------------------------------------------------------------------------- job


def save_checkpoint(model: Model, directory: str, job: str, step: int) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{job}-step{step:06d}.npz")
    p = model.params
    np.savez(path, step=np.array(step), w1=p["w1"], b1=p["b1"], w2=p["w2"], b2=p["b2"])
    return path


def hang_forever() -> None:
    """What a rank stuck in a collective looks like from outside: alive, and no step ever again."""
    while True:
        time.sleep(1.0)


def _hyperparameters(config: Config, seed: int) -> dict[str, object]:
    """The params a job reports at init: its scenario's recipe, the model, the data and the seed."""
    return {
        "lr": config.lr,
        "batch_size": BATCH_SIZE,
        "hidden": HIDDEN,
        "optimizer": config.optimizer,
        "schedule": config.schedule,
        "grad_clip": config.clip if config.clip is not None else "none",
        "scenario": config.scenario,
        "seed": seed,
        "samples": N_SAMPLES,
        "features": N_FEATURES,
        "positive_rate": POSITIVE_RATE,
        "eval_recall_target": RECALL_TARGET,
    }


def _clip_gradients(grads: dict[str, Array], clip: float | None) -> tuple[float, dict[str, Array]]:
    """The global gradient norm (squares summed in float64) and the gradients, scaled down to norm ``clip`` when
    over it (unchanged without a clip: ``diverge`` has none)."""
    grad_norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values()))
    if clip is not None and grad_norm > clip:
        scale = np.float32(clip / grad_norm)
        grads = {k: g * scale for k, g in grads.items()}
    return grad_norm, grads


def train(args: argparse.Namespace) -> int:
    config = config_for(args.scenario)
    data = make_data(args.seed)
    rng = np.random.default_rng(args.seed + 1)
    model = Model(N_FEATURES, HIDDEN, rng)
    optimizer: Adam | SGD = Adam(model.params) if config.optimizer == "adam" else SGD(model.params)
    total = args.steps
    steps_per_epoch = len(data.y_train) // BATCH_SIZE
    eval_every = max(1, total // 30)
    print_every = max(1, total // 10)
    hang_at = max(1, int(total * args.hang_at)) if args.scenario == "hang" else None

    run = stepwatch.init(
        total_steps=total,
        total_epochs=round(total / steps_per_epoch, 3),
        batch_size=BATCH_SIZE,
        params=_hyperparameters(config, args.seed),
    )
    job = run.job
    checkpoint_dir: str | None = args.checkpoint_dir
    print(
        f"{job}: scenario {args.scenario}, {total} steps of {BATCH_SIZE} ({total / steps_per_epoch:.1f}"
        f" epochs), {config.optimizer} lr {config.lr:g} ({config.schedule})",
        flush=True,
    )
    recent: list[float] = []
    last_eval: dict[str, float] = {}
    with run, np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        order = rng.permutation(len(data.y_train))
        for step in range(1, total + 1):
            if hang_at is not None and step == hang_at:
                hang_forever()
            position = (step - 1) % steps_per_epoch
            if position == 0 and step > 1:
                order = rng.permutation(len(data.y_train))
            batch = order[position * BATCH_SIZE : (position + 1) * BATCH_SIZE]
            loss, grads = model.loss_and_grads(data.x_train[batch], data.y_train[batch])
            grad_norm, grads = _clip_gradients(grads, config.clip)
            lr = config.learning_rate(step, total)
            optimizer.update(model.params, grads, lr)
            run.step(loss=loss, grad_norm=grad_norm, learning_rate=lr)
            run.epoch(step / steps_per_epoch)
            recent.append(loss)
            if step % eval_every == 0 or step == total:
                last_eval = evaluate(model, data)
                run.log(**last_eval)
            if step % print_every == 0 or step == total:
                print(
                    f"{job}: step {step}/{total} ({100 * step // total}%) loss {np.mean(recent):.5g}"
                    f" eval_auc {last_eval.get('eval_auc', float('nan')):.4f} lr {lr:.3g}",
                    flush=True,
                )
                recent = []
            if run.should_checkpoint or run.should_stop:
                checkpoint_dir = checkpoint_dir or tempfile.mkdtemp(prefix="stepwatch-demo-")
                path = save_checkpoint(model, checkpoint_dir, job, step)
                if run.should_stop:
                    print(
                        f"{job}: stopping at step {step} ({run.command_reason or 'stop requested'}); checkpoint {path}",
                        flush=True,
                    )
                    run.finish("stopped", reason=run.command_reason)
                    return 0
                print(f"{job}: checkpoint at step {step}: {path}", flush=True)
                run.checkpoint_done()
            if args.step_delay > 0:
                time.sleep(args.step_delay)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m stepwatch.cli.demo_training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scenario", required=True, choices=SCENARIOS)
    parser.add_argument("--steps", type=_positive_int, default=3000, help="optimizer steps (default: 3000)")
    parser.add_argument("--seed", type=int, default=0, help="data and initialisation seed (default: 0)")
    parser.add_argument(
        "--step-delay", type=_non_negative, default=0.05, help="seconds slept after each step (default: 0.05)"
    )
    parser.add_argument(
        "--hang-at", type=float, default=HANG_AT, help=f"hang: share of the steps it hangs at (default: {HANG_AT})"
    )
    parser.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (default: a new temp dir)")
    return parser


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return train(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
