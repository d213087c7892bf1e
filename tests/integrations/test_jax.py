"""JAX, Flax (nnx) and optax: the one-line way, jax arrays read only in the sender thread, a real server."""

from __future__ import annotations

import json
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'jax[cpu]')")
jnp = pytest.importorskip("jax.numpy")
np = pytest.importorskip("numpy")

import stepwatch  # noqa: E402
from stepwatch.protocol import Report  # noqa: E402
from stepwatch.testing import MemoryTransport  # noqa: E402

LiveJob = Any  # tests/integrations/conftest.py: LiveJob

# Every way a jax array can be turned into a host value (device_get uses __array__ after copy_to_host_async).
_READERS = (
    "__float__",
    "__int__",
    "__index__",
    "__bool__",
    "__array__",
    "item",
    "tolist",
    "block_until_ready",
    "copy_to_host_async",
)


def _reports(transport: MemoryTransport) -> list[Report]:
    return [Report.from_dict(json.loads(r.body)) for r in transport.requests if r.url.endswith("/reports")]


def test_jax_arrays_are_read_in_the_sender_thread_not_in_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    touched: list[tuple[str, str]] = []
    array_type = type(jnp.zeros(()))

    def recording(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: Any, *args: Any, **kwargs: Any) -> Any:
            touched.append((name, threading.current_thread().name))
            return original(self, *args, **kwargs)

        return read

    losses = [jnp.float32(i) * 2.0 for i in range(50)]  # computed before the recording starts
    accuracies = [jnp.asarray([0.5 + i / 100]) for i in range(50)]  # shape (1,) is a single number too
    for name in _READERS:
        monkeypatch.setattr(array_type, name, recording(name, getattr(array_type, name)))
    as_numpy = np.asarray  # reads a CPU array's buffer through the C buffer protocol, not __array__

    def asarray(value: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(value, array_type):
            touched.append(("numpy.asarray", threading.current_thread().name))
        return as_numpy(value, *args, **kwargs)

    monkeypatch.setattr(np, "asarray", asarray)
    transport = MemoryTransport()
    run = stepwatch.init(job="jax", url="http://sw.test", transport=transport, interval=60)
    for loss, accuracy in zip(losses, accuracies):
        run.step(loss=loss, accuracy=accuracy)
    assert touched == []  # the hot path kept references and nothing else: no sync, no copy
    run.finish()
    assert touched and {thread for _, thread in touched} == {"stepwatch-sender"}
    assert {name for name, _ in touched} == {"numpy.asarray"}  # CPU arrays: no copy to start, a view read
    windows = {m.name: m for r in _reports(transport) for m in r.metrics}
    assert (windows["loss"].count, windows["loss"].min, windows["loss"].max) == (50, 0.0, 98.0)
    assert windows["accuracy"].last == pytest.approx(0.99)


# ------------------------------------------------------------------------------------ flax + optax


nnx = pytest.importorskip("flax.nnx", reason="Flax is not installed (pip install flax)")
optax = pytest.importorskip("optax", reason="optax is not installed (pip install optax)")


class MLP(nnx.Module):  # type: ignore[misc]
    def __init__(self, rngs: Any) -> None:
        self.hidden = nnx.Linear(4, 16, rngs=rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.out(jax.nn.relu(self.hidden(x)))


@nnx.jit  # type: ignore[misc]
def train_step(model: Any, optimizer: Any, x: Any, y: Any) -> tuple[Any, Any]:
    def loss_fn(m: Any) -> Any:
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss, optax.tree.norm(grads)


def _setup(lr: float) -> tuple[Any, Any, Any, Any]:
    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)
    x = jax.random.normal(jax.random.key(1), (64, 4))
    return model, optimizer, x, x.sum(axis=1, keepdims=True)


def _count(points: list[dict[str, Any]]) -> int:
    return sum(p["count"] for p in points)


def test_flax_optax_loop_reports(live_job: LiveJob) -> None:
    lr, steps = 1e-2, 80
    model, optimizer, x, y = _setup(lr)
    run = stepwatch.init(total_steps=steps, params={"lr": lr, "optimizer": "adam", "hidden": 16})
    for _ in range(steps):
        loss, grad_norm = train_step(model, optimizer, x, y)
        run.step(loss=loss, grad_norm=grad_norm)  # jax arrays: no float(), no block_until_ready
        if run.current_step % 20 == 0:
            run.log(eval_loss=jnp.mean((model(x) - y) ** 2))
    assert run.finish()
    job = live_job.get()
    assert job["state"] == "finished"
    assert (job["progress"]["step"], job["progress"]["total_steps"], job["progress"]["percent"]) == (80, 80, 100)
    assert job["params"] == {"lr": lr, "optimizer": "adam", "hidden": 16}
    history = live_job.history("loss", "grad_norm", "eval_loss")
    assert (_count(history["loss"]), _count(history["grad_norm"]), _count(history["eval_loss"])) == (80, 80, 4)
    assert history["loss"][-1]["last"] < history["loss"][0]["max"] / 4  # it learned
    assert history["loss"][-1]["step"] == 80
    assert history["loss"][-1]["last"] == pytest.approx(float(loss), rel=1e-6)


def test_flax_loop_obeys_a_stop_command_after_a_checkpoint(live_job: LiveJob, checkpoint_dir: Path) -> None:
    model, optimizer, x, y = _setup(1e-3)
    live_job.command("stop", "plateau")  # delivered with the answer to the first report
    run = stepwatch.init(total_steps=100_000)
    for _ in range(100_000):
        loss, _ = train_step(model, optimizer, x, y)
        run.step(loss=loss)
        if run.should_stop:  # a plain attribute: no device sync
            state = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))
            (checkpoint_dir / "model.pkl").write_bytes(pickle.dumps({"step": run.current_step, "state": state}))
            run.finish("stopped", run.command_reason)
            break
    saved = pickle.loads((checkpoint_dir / "model.pkl").read_bytes())
    assert 1 <= saved["step"] < 100_000
    assert set(saved["state"]) == {"hidden", "out"}
    job = live_job.get()
    assert (job["state"], job["reason"], job["progress"]["step"]) == ("stopped", "plateau", saved["step"])
    assert job["pending_commands"] == []


# ------------------------------------------------------------------------------- two JAX processes

PROCESS = """
import json, sys, time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_cpu_collectives_implementation", "gloo")
pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)

import stepwatch
from stepwatch.integrations.jax import agree


@jax.jit
def train_step(w):
    loss = jnp.sum(w**2)
    return w - 0.002 * w, loss


run = stepwatch.init(total_steps=100_000)        # rank = jax.process_index()
w, commands = jnp.ones(4), None
for step in range(1, 100_001):
    w, loss = train_step(w)
    run.step(loss=loss)
    if step % 5 == 0:
        commands = agree(run)                      # the same answer in both processes
        if commands.checkpoint or commands.stop:
            if pid == 0:
                np.save(f"{out}/w.npy", np.asarray(w))
            run.checkpoint_done()
        if commands.stop:
            break
    time.sleep(0.002)
with open(f"{out}/process{pid}.json", "w") as f:
    json.dump({"step": run.current_step, "rank": run.identity.rank, "world": run.identity.world_size}, f)
run.finish("stopped", commands.reason)
"""


def test_two_processes_agree_on_a_stop(live_job: LiveJob, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PROCESS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    live_job.command("stop", "diverging")  # whichever process reports first receives it
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), str(pid), str(port), str(tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in (0, 1)
    ]
    try:
        errors = [p.communicate(timeout=120)[1] for p in processes]
    finally:
        for p in processes:
            p.kill()
    assert [p.returncode for p in processes] == [0, 0], [e[-2000:] for e in errors]
    ends = [json.loads((tmp_path / f"process{pid}.json").read_text()) for pid in (0, 1)]
    assert [(e["rank"], e["world"]) for e in ends] == [(0, 2), (1, 2)]  # ranks from jax.process_index()
    assert ends[0]["step"] == ends[1]["step"] < 100_000  # both left the loop at the same step
    assert (tmp_path / "w.npy").exists()
    job = live_job.get()
    assert (job["state"], job["reason"], job["progress"]["step"]) == ("stopped", "diverging", ends[0]["step"])
    assert job["progress"]["world_size"] == 2
