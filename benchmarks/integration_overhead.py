"""What reporting costs a training loop, per framework: the same tiny loop with and without stepwatch.

For each framework a tiny model built here trains on the CPU at 100 steps/s or more (the measured
rate is printed): a plain PyTorch loop (``run.step(loss=loss.detach())``), the Hugging Face
``Trainer`` and the Lightning ``Trainer`` (their ``StepwatchCallback``), Keras ``fit`` on the torch
backend (its callback), a JAX/optax loop (``run.step(loss=loss)`` with the ``jax.Array``), XGBoost
and LightGBM (their callbacks) and a tqdm loop (``stepwatch.integrations.tqdm.install()``, the bar
unchanged).

Method (docs/integrations.md, "Overhead of the integrations", says what the figures mean):

* each framework runs in its own fresh interpreter (so one framework's threads, patches and caches
  never slow the next), and inside it the runs alternate without / with stepwatch, the order
  swapped every pair (A B, B A, ...): whatever drifts on a shared machine (other processes, CPU
  frequency, caches) hits both sides alike. A first pair is a discarded warm-up (imports, first
  compilations, the allocator). Only the training call is timed (``fit``, ``train``, the loop),
  not the building of the model or the trainer; with stepwatch it includes ``init`` (the job's
  registration) and ``finish`` (the last report), as in real use;
* with stepwatch the loop reports to a real ``stepwatch server`` (``python -m stepwatch server`` on
  a free loopback port with a fresh SQLite file, as ``server_ingest.py`` runs it) every 0.5 s, four
  times the default rate, so the sender thread's work shows. ``--sink reportsink`` uses the
  stdlib-only ``stepwatch.testing.ReportSink`` in its own process instead, to see how much of the
  figure is the server's CPU on a 2-core machine; the server's CPU during each run is printed either
  way;
* overhead = (median time with - median time without) / median time without; the spread is the
  interquartile range of the pairs' relative differences, so the noise stands next to the figure.
  Target (issue 4): under 1 % at 100 steps/s or more.

    .venv/bin/python benchmarks/integration_overhead.py --json benchmarks/results/integrations.json
    .venv/bin/python benchmarks/integration_overhead.py --quick --frameworks torch,xgboost   # < 60 s
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

from reporter_overhead import machine_info  # noqa: E402
from server_ingest import Server, emit, free_port, proc_cpu_s  # noqa: E402

TARGET = 0.01
"""Issue 4: under 1 % ..."""
MIN_STEPS_PER_S = 100.0
"""... at 100 steps/s or more."""
INTERVAL_S = 0.5

# steps (or boosting rounds) per run: about 2 s each on the 2-vCPU machine of the docs
STEPS = {
    "torch": 2000,
    "transformers": 600,
    "lightning": 2000,
    "keras": 2000,
    "jax": 2000,
    "xgboost": 2000,
    "lightgbm": 2000,
    "tqdm": 2000,
}
FRAMEWORKS = tuple(STEPS)
LABELS = {
    "torch": "PyTorch loop",
    "transformers": "HF Trainer",
    "lightning": "Lightning",
    "keras": "Keras (torch)",
    "jax": "JAX + optax",
    "xgboost": "XGBoost",
    "lightgbm": "LightGBM",
    "tqdm": "tqdm loop",
}
IMPORTS = {"tqdm": ("tqdm", "torch"), "transformers": ("transformers", "torch"), "jax": ("jax", "optax")}

Prepare = Callable[[bool], Callable[[], None]]
"""``prepare(with_stepwatch)`` builds a run (untimed) and returns the call that is timed."""


# ------------------------------------------------------------------------------------ the loops


def void(_: object) -> None:
    """Drop what a training call returns (a model, a history): only its time counts."""


def torch_loop(steps: int) -> Prepare:
    import torch

    import stepwatch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 256), torch.randn(256, 1)

    def prepare(with_stepwatch: bool) -> Callable[[], None]:
        def train() -> None:
            run = stepwatch.init(total_steps=steps) if with_stepwatch else None
            for _ in range(steps):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if run is not None:
                    run.step(loss=loss.detach())  # the tensor, no .item(): read in the sender thread
            if run is not None:
                run.finish()

        return train

    return prepare


def transformers_loop(steps: int) -> Prepare:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from stepwatch.integrations.transformers import StepwatchCallback

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    tokens = torch.randint(0, 100, (steps * 8, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": t, "labels": (t[0] > 50).long()} for t in tokens]
    output = tempfile.mkdtemp(prefix="stepwatch-bench-hf-")

    def prepare(with_stepwatch: bool) -> Callable[[], None]:
        args = TrainingArguments(
            output_dir=output,
            per_device_train_batch_size=8,
            max_steps=steps,
            learning_rate=1e-3,
            logging_steps=10,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        callbacks = [StepwatchCallback()] if with_stepwatch else []
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)  # type: ignore[arg-type]
        return lambda: void(trainer.train())

    return prepare


def lightning_loop(steps: int) -> Prepare:
    import lightning as L
    import torch

    from stepwatch.integrations.lightning import StepwatchCallback

    class Tiny(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(steps * 64, 128), torch.randn(steps * 64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=64)
    module = Tiny()

    def prepare(with_stepwatch: bool) -> Callable[[], None]:
        trainer = L.Trainer(
            max_epochs=1,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[StepwatchCallback()] if with_stepwatch else [],
        )
        return lambda: void(trainer.fit(module, loader))

    return prepare


def keras_loop(steps: int) -> Prepare:
    import keras
    import numpy as np

    from stepwatch.integrations.keras import StepwatchCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 32, 64)).astype("float32")
    y = rng.normal(size=(steps * 32, 1)).astype("float32")

    def prepare(with_stepwatch: bool) -> Callable[[], None]:
        model = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        callbacks = [StepwatchCallback(batch_size=32)] if with_stepwatch else []
        return lambda: void(model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=callbacks))

    return prepare


def jax_loop(steps: int) -> Prepare:
    import jax
    import jax.numpy as jnp
    import optax

    import stepwatch

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {
        "w1": jax.random.normal(k1, (256, 512)) * 0.05,
        "b1": jnp.zeros(512),
        "w2": jax.random.normal(k2, (512, 1)) * 0.05,
    }
    x = jax.random.normal(k3, (256, 256))
    y = x[:, :1] * 2 - x[:, 1:2]
    optimizer = optax.adam(1e-3)

    def loss_fn(p: Any) -> Any:
        hidden = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((hidden @ p["w2"] - y) ** 2)

    @jax.jit
    def train_step(p: Any, state: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    def prepare(with_stepwatch: bool) -> Callable[[], None]:
        def train() -> None:
            p, state = params, optimizer.init(params)
            run = stepwatch.init(total_steps=steps) if with_stepwatch else None
            for _ in range(steps):
                p, state, loss = train_step(p, state)
                if run is not None:
                    run.step(loss=loss)  # the jax.Array: no float(), no block_until_ready()
            jax.block_until_ready(p)  # asynchronous dispatch: the work is done when the last step is
            if run is not None:
                run.finish()

        return train

    return prepare


def _boosting_data() -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(10_000, 16))
    return x, (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype("float32")


def xgboost_loop(steps: int) -> Prepare:
    import xgboost as xgb

    from stepwatch.integrations.xgboost import StepwatchCallback

    x, y = _boosting_data()
    dtrain = xgb.DMatrix(x, label=y)
    params = {"objective": "binary:logistic", "max_depth": 4, "eta": 0.1, "nthread": 1}

    def prepare(with_stepwatch: bool) -> Callable[[], None]:
        callbacks = [StepwatchCallback()] if with_stepwatch else []
        return lambda: void(
            xgb.train(
                params,
                dtrain,
                num_boost_round=steps,
                evals=[(dtrain, "train")],
                verbose_eval=False,
                callbacks=callbacks,
            )
        )

    return prepare


def lightgbm_loop(steps: int) -> Prepare:
    import lightgbm as lgb

    from stepwatch.integrations.lightgbm import StepwatchCallback

    x, y = _boosting_data()
    train = lgb.Dataset(x, label=y, free_raw_data=False)
    params = {"objective": "binary", "num_leaves": 15, "verbose": -1, "num_threads": 1}

    def prepare(with_stepwatch: bool) -> Callable[[], None]:
        callbacks = [StepwatchCallback()] if with_stepwatch else []
        return lambda: void(lgb.train(params, train, num_boost_round=steps, valid_sets=[train], callbacks=callbacks))

    return prepare


def tqdm_loop(steps: int) -> Prepare:
    import torch
    from tqdm import tqdm

    import stepwatch
    from stepwatch.integrations import tqdm as integration

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 256), torch.randn(256, 1)
    screen = io.StringIO()  # a bar that draws, as on a terminal, but not onto this benchmark's output

    def prepare(with_stepwatch: bool) -> Callable[[], None]:
        def train() -> None:
            if with_stepwatch:
                integration.install()  # what `stepwatch run` does when the script imports tqdm
            try:
                for _ in (bar := tqdm(range(steps), file=screen)):  # unchanged user code
                    loss = torch.nn.functional.mse_loss(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    bar.set_postfix(loss=loss.item(), refresh=False)
            finally:
                if with_stepwatch:
                    stepwatch.finish()  # else at interpreter exit; the next run starts a new one
                    integration._uninstall()
                screen.seek(0)
                screen.truncate()

        return train

    return prepare


LOOPS: dict[str, Callable[[int], Prepare]] = {
    "torch": torch_loop,
    "transformers": transformers_loop,
    "lightning": lightning_loop,
    "keras": keras_loop,
    "jax": jax_loop,
    "xgboost": xgboost_loop,
    "lightgbm": lightgbm_loop,
    "tqdm": tqdm_loop,
}


# ---------------------------------------------------------------------------------- measurement


def iqr(values: list[float]) -> tuple[float, float]:
    """First and third quartiles (statistics.quantiles, inclusive: defined from 2 values on)."""
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def child_measure(args: dict[str, Any]) -> dict[str, Any]:
    """In a fresh interpreter: warm up, then alternate runs without and with stepwatch."""
    name, steps, pairs, server_pid = args["framework"], args["steps"], args["pairs"], args["server_pid"]
    if name in ("keras",):
        os.environ.setdefault("KERAS_BACKEND", "torch")
    os.environ["STEPWATCH_JOB"] = f"overhead-{name}"
    prepare = LOOPS[name](steps)
    info: dict[str, Any] = {}
    sender_cpu = _count_sender_cpu()
    if "torch" in sys.modules:
        info["torch_threads"] = sys.modules["torch"].get_num_threads()

    def one(with_stepwatch: bool) -> tuple[float, float, float, int, float]:
        call = prepare(with_stepwatch)
        sender_cpu.clear()
        server0 = proc_cpu_s(server_pid)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        c0, t0 = time.process_time(), time.perf_counter()
        call()
        t1, c1 = time.perf_counter(), time.process_time()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        return t1 - t0, c1 - c0, proc_cpu_s(server_pid) - server0, faults, sum(sender_cpu)

    one(False)  # warm-up pair, discarded
    one(True)
    rows: list[dict[str, float]] = []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {flag: one(flag) for flag in order}
        (w0, cpu0, _, f0, _), (w1, cpu1, srv1, f1, sender1) = got[False], got[True]
        rows.append(
            {
                "without_s": w0,
                "with_s": w1,
                "cpu_without_s": cpu0,
                "cpu_with_s": cpu1,
                "server_cpu_s": srv1,
                "faults_without": f0,
                "faults_with": f1,
                "sender_cpu_s": sender1,
            }
        )
    without = statistics.median(r["without_s"] for r in rows)
    with_ = statistics.median(r["with_s"] for r in rows)
    diffs = [(r["with_s"] - r["without_s"]) / r["without_s"] for r in rows]
    cpu0 = statistics.median(r["cpu_without_s"] for r in rows)
    cpu1 = statistics.median(r["cpu_with_s"] for r in rows)
    return {
        "framework": name,
        "steps": steps,
        "pairs": pairs,
        "steps_per_s_without": steps / without,
        "steps_per_s_with": steps / with_,
        "median_without_s": without,
        "median_with_s": with_,
        "overhead": (with_ - without) / without,
        "spread": iqr(diffs),
        "pair_differences": diffs,
        "process_cpu_overhead": (cpu1 - cpu0) / cpu0,
        "server_cpu_share": statistics.median(r["server_cpu_s"] / r["with_s"] for r in rows),
        "faults_per_step_without": statistics.median(r["faults_without"] for r in rows) / steps,
        "faults_per_step_with": statistics.median(r["faults_with"] for r in rows) / steps,
        "sender_cpu_share": statistics.median(r["sender_cpu_s"] / r["with_s"] for r in rows),
        "rows": rows,
        **info,
    }


def _count_sender_cpu() -> list[float]:
    """A list that receives the CPU time of every stepwatch sender thread as the thread ends.

    The sender's CPU is time the training thread may wait for the GIL: unlike the wall-clock
    difference it is hardly moved by the neighbours, so it bounds what the sender costs the loop.
    """
    from stepwatch import _sender

    spent: list[float] = []
    loop = _sender.Sender._loop

    def counted(self: Any) -> None:
        try:
            loop(self)
        finally:
            spent.append(time.thread_time())

    _sender.Sender._loop = counted  # type: ignore[method-assign]
    return spent


def run_child(args: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """This script as ``--child`` in a fresh interpreter; its last ``RESULT {json}`` line."""
    cmd = [sys.executable, str(HERE), "--child", json.dumps(args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"framework": args["framework"], "unavailable": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"framework": args["framework"], "unavailable": f"child exited {proc.returncode}: {tail[:200]}"}


class SinkProcess:
    """``stepwatch.testing.ReportSink`` in its own interpreter (stdlib HTTP, no database)."""

    def __init__(self) -> None:
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        code = (
            "import time; from stepwatch.testing import ReportSink\n"
            f"sink = ReportSink(port={port}).start(); print('ready', flush=True)\n"
            "while True: time.sleep(3600)\n"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        self.pid = self.proc.pid
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the ReportSink process did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def start_sink(kind: str, tmp: Path) -> Server | SinkProcess:
    if kind == "server":
        return Server(tmp / "overhead.db", tmp / "server.log")
    return SinkProcess()


def available(name: str) -> str | None:
    """None if the framework imports, else why not (checked in the parent: cheap, no child)."""
    import importlib.util

    for module in IMPORTS.get(name, (name,)):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


# ---------------------------------------------------------------------------------------- report


def verdict(r: dict[str, Any]) -> str:
    if r["steps_per_s_without"] < MIN_STEPS_PER_S:
        return "loop too slow"
    q1, _ = r["spread"]
    if r["overhead"] < TARGET:
        return "met"
    return "MISSED" if q1 >= TARGET else "unclear (noise)"


def print_table(results: list[dict[str, Any]]) -> None:
    header = (
        f"{'framework':<14}{'steps':>6}{'steps/s without':>17}{'steps/s with':>14}{'overhead':>10}"
        f"{'spread (IQR)':>20}{'server CPU':>12}{'sender CPU':>12}{'faults/step':>14}  verdict"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        label = LABELS.get(r["framework"], r["framework"])
        if "unavailable" in r:
            print(f"{label:<14}  unavailable: {r['unavailable']}")
            continue
        q1, q3 = r["spread"]
        faults = f"{r['faults_per_step_without']:.0f} / {r['faults_per_step_with']:.0f}"
        print(
            f"{label:<14}{r['steps']:>6}{r['steps_per_s_without']:>17,.0f}{r['steps_per_s_with']:>14,.0f}"
            f"{100 * r['overhead']:>9.2f}%{f'{100 * q1:+.2f}% .. {100 * q3:+.2f}%':>20}"
            f"{100 * r['server_cpu_share']:>11.1f}%{100 * r.get('sender_cpu_share', math.nan):>11.2f}%"
            f"{faults:>14}  {verdict(r)}"
        )


def print_report(results: list[dict[str, Any]], machine: dict[str, Any], pairs: int, args: argparse.Namespace) -> None:
    sink_label = (
        "a real stepwatch server (loopback, SQLite)"
        if args.sink == "server"
        else "stepwatch.testing.ReportSink (own process)"
    )
    print("stepwatch integration overhead" + (" (--quick: short runs, a smoke test)" if args.quick else ""))
    print(
        f"machine: {machine['cpu_model']}, {machine['cpu_count']} CPUs ({machine['cpus_usable']} usable), "
        f"load avg {', '.join(f'{x:.2f}' for x in machine['loadavg'] or ())}; python {machine['python']}, "
        f"torch {machine['torch']}"
    )
    print(
        f"method: {pairs} pairs per framework, without/with alternating (order swapped each pair) after a "
        f"warm-up pair, one fresh process per framework; reporting every {args.interval:g} s to {sink_label}"
    )
    print(
        "overhead = (median with - median without) / median without; spread = IQR of the pairs' "
        "relative differences; server CPU = the server's CPU time during a run with stepwatch / that "
        "run's wall time; sender CPU = the CPU time of stepwatch's sender thread / that run's wall time "
        "(GIL time the training thread may wait for: an upper bound of the reporting cost that the "
        "neighbours hardly move); faults/step = minor page faults of the training process per step, without / with"
    )
    print()
    print_table(results)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma-separated: " + ", ".join(FRAMEWORKS))
    parser.add_argument("--pairs", type=int, help="alternating pairs without/with stepwatch (default 6; --quick 2)")
    parser.add_argument("--scale", type=float, help="steps per run x this (default 1; --quick 0.2)")
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="report interval in s (default 0.5)")
    parser.add_argument(
        "--sink",
        choices=("server", "reportsink"),
        default="server",
        help="report to a real stepwatch server (default) or to stepwatch.testing.ReportSink in its own process",
    )
    parser.add_argument("--quick", action="store_true", help="2 pairs of short runs: a smoke run (< 60 s for two)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.child:
        emit(child_measure(json.loads(args.child)))
        return 0

    pairs = args.pairs or (2 if args.quick else 6)
    scale = args.scale or (0.2 if args.quick else 1.0)
    names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOOPS]
    if unknown:
        parser.error(f"unknown framework(s) {', '.join(unknown)}; choose among {', '.join(FRAMEWORKS)}")
    if pairs < 1:
        parser.error("--pairs must be at least 1")
    started = time.perf_counter()

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {what}", file=sys.stderr, flush=True)

    machine = machine_info()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stepwatch-bench-") as tmp:
        sink = start_sink(args.sink, Path(tmp))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBEFLOW_TRAINER_"))}
        env.update(
            STEPWATCH_URL=sink.base,
            STEPWATCH_INTERVAL=str(args.interval),
            STEPWATCH_HANDLE_SIGTERM="0",
            PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        try:
            for name in names:
                why = available(name)
                if why:
                    results.append({"framework": name, "unavailable": why})
                    progress(f"{name}: unavailable ({why})")
                    continue
                steps = max(20, int(STEPS[name] * scale))
                progress(f"{name}: {pairs} pairs of {steps} steps")
                child = {"framework": name, "steps": steps, "pairs": pairs, "server_pid": sink.pid}
                results.append(run_child(child, env, timeout=600))
        finally:
            sink.stop()

    print_report(results, machine, pairs, args)
    elapsed = time.perf_counter() - started
    print(f"\ntotal time {elapsed:.0f} s")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        out = {"machine": machine, "sink": args.sink, "interval_s": args.interval, "results": results}
        path.write_text(json.dumps(out, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"figures written to {path}")
    failed = [r for r in results if "unavailable" in r and "not installed" not in r["unavailable"]]
    measured = [r for r in results if "unavailable" not in r]
    return 0 if measured and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
