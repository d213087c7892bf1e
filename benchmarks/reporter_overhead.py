"""Reporter overhead of stepwatch: hot path, peers, memory and import time, in one run.

Run it with the benchmark environment (peers installed) or the plain project one (peers then show
"unavailable")::

    .bench-venv/bin/python benchmarks/reporter_overhead.py --json benchmarks/results/overhead.json
    .bench-venv/bin/python benchmarks/reporter_overhead.py --unreachable-seconds 600   # the issue's 10 minutes

Sections (see docs/performance.md for what each figure means):

a. hot path: median cost per call of ``run.step(loss=..., lr=...)`` against a running loopback
   ReportSink, interleaved with an empty method of the same signature; float, torch and NumPy
   values; then the amortised cost of whole loops, sender thread included.
b. peers: the same per-step logging with mlflow (sync, async), TensorBoard, wandb (offline) and the
   Kubeflow SDK, each in a fresh subprocess.
c. memory: RSS growth over 1,000,000 steps (fresh subprocess), and RSS over time with the server
   unreachable.
d. ``import stepwatch``: wall time over fresh interpreters, ``-X importtime``, non-stdlib modules.
e. where a rank stands: the stack sampler on vs off in the same run (``init(where=...)``): the hot
   path per call, whole loops of Python-bound steps 40 frames deep, and the cost of one stack read.

Every figure is measured here, in this run; nothing is read back from an earlier run.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

# Targets of the issue, printed beside the figures.
TARGET_STEP_US = 1.5
TARGET_STEP_RATIO = 5.0
TARGET_TENSOR_US = 3.0
TARGET_MEMORY_MB = 5.0
TARGET_IMPORT_MS = 50.0

BATCH_CALLS = 100
"""Calls timed together: one perf_counter_ns pair per batch, straight-line code (no loop)."""


# ------------------------------------------------------------------------------------------ helpers


def rss_kb(field: str = "VmRSS") -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now; VmHWM: peak resident)."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def closed_port_url() -> str:
    """A loopback URL nobody listens on: bind a port, note it, close it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    n = len(ordered)
    return {
        "median": statistics.median(ordered),
        "p10": ordered[int(0.10 * (n - 1))],
        "p90": ordered[int(0.90 * (n - 1))],
        "min": ordered[0],
    }


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, in value per minute."""
    if len(points) < 2:
        return 0.0
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return 60.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def run_child(kind: str, args: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 300) -> dict:
    """Run this script as ``--child kind`` in a fresh interpreter; its last ``RESULT {json}`` line."""
    cmd = [sys.executable, str(HERE), "--child", kind, "--child-args", json.dumps(args)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, check=False
        )
    except subprocess.TimeoutExpired:
        return {"unavailable": f"timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"unavailable": f"child exited {proc.returncode}: {tail[:200]}"}


def emit(result: dict[str, Any]) -> None:
    """A child's answer to the parent: one line on stdout."""
    sys.stdout.flush()
    print("RESULT " + json.dumps(result), flush=True)


def fmt_us(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 1000:
        return f"{value / 1000:,.2f} ms"
    return f"{value:,.3f} us" if value < 10 else f"{value:,.1f} us"


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# ------------------------------------------------------------------------------- a. the hot path


class EmptyStep:
    """The baseline: an empty method with the signature of ``Run.step``, called the same way."""

    def step(self, step: int | None = None, **metrics: Any) -> None:
        return None


def make_batch(call: str, calls: int = BATCH_CALLS) -> Callable[..., int]:
    """A function timing ``calls`` straight-line copies of ``call`` (no loop overhead per call)."""
    body = "".join(f"    {call}\n" for _ in range(calls))
    src = f"def batch(obj, a, b, clock):\n    t0 = clock()\n{body}    return clock() - t0\n"
    namespace: dict[str, Any] = {}
    exec(compile(src, f"<batch {call}>", "exec"), namespace)
    return namespace["batch"]


def interleaved(
    obj_a: Any,
    obj_b: Any,
    call: str,
    values: tuple[Any, Any],
    *,
    rounds: int,
    batches: int,
    between: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Per-call medians of ``call`` on obj_a (stepwatch) and obj_b (empty), alternated batch by batch.

    ``between`` (untimed) runs before every pair of batches.
    """
    batch = make_batch(call)
    a, b = values
    clock = time.perf_counter_ns
    for _ in range(200):  # warm-up, discarded
        batch(obj_a, a, b, clock)
        batch(obj_b, a, b, clock)
    times_a: list[float] = []
    times_b: list[float] = []
    round_ratios = []
    for r in range(rounds):
        ra: list[float] = []
        rb: list[float] = []
        for j in range(batches):
            if between is not None:
                between()
            if (j + r) & 1:
                ra.append(batch(obj_a, a, b, clock) / BATCH_CALLS / 1000)
                rb.append(batch(obj_b, a, b, clock) / BATCH_CALLS / 1000)
            else:
                rb.append(batch(obj_b, a, b, clock) / BATCH_CALLS / 1000)
                ra.append(batch(obj_a, a, b, clock) / BATCH_CALLS / 1000)
        round_ratios.append(statistics.median(ra) / statistics.median(rb))
        times_a += ra
        times_b += rb
    qa, qb = quantiles(times_a), quantiles(times_b)
    return {
        "call": call,
        "calls_per_side": rounds * batches * BATCH_CALLS,
        "rounds": rounds,
        "stepwatch_us": qa,
        "empty_us": qb,
        "ratio": qa["median"] / qb["median"],
        "round_ratios": round_ratios,
    }


def loop_fresh_floats(obj: Any, n: int) -> None:
    for i in range(n):
        obj.step(loss=1.0 / (i + 1), lr=0.001)


def loop_pool(obj: Any, n: int, pool: list[Any]) -> None:
    mask = len(pool) - 1
    for i in range(n):
        obj.step(loss=pool[i & mask], lr=0.001)


def full_gc_ms() -> tuple[float, int]:
    """What one full (generation 2) collection costs with the heap as it is now, and its tracked objects."""
    gc.collect()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - t0) * 1000)
    return min(times), len(gc.get_objects())


def amortised(
    sink: Any, label: str, n: int, pool: list[Any] | None, *, reps: int, gc_off: bool = False
) -> dict[str, Any]:
    """Wall and CPU time of whole loops (init excluded, finish() included) against the empty baseline."""
    import stepwatch

    def one(use_stepwatch: bool) -> tuple[float, float, int, bool]:
        gc.collect()
        obj: Any = EmptyStep()
        run = None
        if use_stepwatch:
            run = stepwatch.init(job="bench-amortised", url=sink.url, interval=2.0)
            obj = run
        if gc_off:
            gc.disable()
        full0 = gc.get_stats()[2]["collections"]
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            if pool is None:
                loop_fresh_floats(obj, n)
            else:
                loop_pool(obj, n, pool)
            delivered = run.finish() if run is not None else True
        finally:
            w1, c1 = time.perf_counter(), time.process_time()
            full = gc.get_stats()[2]["collections"] - full0
            gc.enable()
        if run is not None:
            counted = sum(
                m.count for r in sink.reports if r.run_id == run.run_id for m in r.metrics if m.name == "loss"
            )
            delivered = delivered and counted == n
        return (w1 - w0) * 1e6 / n, (c1 - c0) * 1e6 / n, full, delivered

    sw, base = [], []
    all_delivered = True
    for _ in range(reps):
        sw.append(one(True))
        all_delivered &= sw[-1][3]
        base.append(one(False))
    result = {
        "label": label + (", gc disabled" if gc_off else ""),
        "steps": n,
        "reps": reps,
        "stepwatch_wall_us": statistics.median(x[0] for x in sw),
        "empty_wall_us": statistics.median(x[0] for x in base),
        "stepwatch_cpu_us": statistics.median(x[1] for x in sw),
        "empty_cpu_us": statistics.median(x[1] for x in base),
        "stepwatch_full_gcs": statistics.median(x[2] for x in sw),
        "empty_full_gcs": statistics.median(x[2] for x in base),
        "all_values_counted": all_delivered,
    }
    result["net_wall_us"] = result["stepwatch_wall_us"] - result["empty_wall_us"]
    result["net_cpu_us"] = result["stepwatch_cpu_us"] - result["empty_cpu_us"]
    return result


def section_hot_path(sink: Any, scale: float) -> dict[str, Any]:
    import stepwatch

    rounds, batches = 7, max(50, int(1500 * scale))
    out: dict[str, Any] = {"rows": [], "amortised": []}
    empty = EmptyStep()
    kinds: list[tuple[str, Any, Any]] = [("float", 0.5, 0.001)]
    try:
        import numpy as np

        kinds.append(("numpy.float64", np.float64(0.5), np.float64(0.001)))
    except Exception as exc:
        out["rows"].append({"label": "numpy.float64", "unavailable": f"{type(exc).__name__}: {exc}"})
    torch: Any = None
    try:
        import torch

        kinds.append(("torch scalar tensor", torch.tensor(0.5), 0.001))
    except Exception as exc:
        out["rows"].append({"label": "torch scalar tensor", "unavailable": f"{type(exc).__name__}: {exc}"})
    for label, a, b in kinds:
        run = stepwatch.init(job="bench-hot", url=sink.url, interval=2.0)
        row = interleaved(run, empty, "obj.step(loss=a, lr=b)", (a, b), rounds=rounds, batches=batches)
        row["label"] = label
        run.finish()
        out["rows"].append(row)
    # A training loop slower than a few thousand steps/s, or one that releases the GIL in its own
    # work, never lets the queue pass the soft limit (1024 entries); a tight loop like the rows above
    # keeps it past 1024 most of the time, until the sender gets the GIL (switch interval 5 ms).
    # Here the queue is folded (untimed, as the sender would) before every pair of batches.
    run = stepwatch.init(job="bench-hot", url=sink.url, interval=2.0)
    row = interleaved(
        run, empty, "obj.step(loss=a, lr=b)", (0.5, 0.001), rounds=rounds, batches=batches, between=run._buffer.drain
    )
    row["label"] = "float, queue kept short"
    run.finish()
    out["rows"].append(row)
    run = stepwatch.init(job="bench-hot", url=sink.url, interval=2.0)
    row = interleaved(run, empty, "obj.step()", (None, None), rounds=rounds, batches=batches)
    row["label"] = "no metrics: run.step()"
    run.finish()
    out["rows"].append(row)

    n_float = max(20_000, int(1_000_000 * scale))
    out["amortised"].append(amortised(sink, "float (fresh each step)", n_float, None, reps=3))
    out["amortised"].append(amortised(sink, "float (fresh each step)", n_float, None, reps=2, gc_off=True))
    if torch is not None:
        pool = [torch.tensor(1.0 / (i + 1)) for i in range(4096)]
        n_tensor = max(20_000, int(300_000 * scale))
        out["amortised"].append(amortised(sink, "torch scalar tensor (4096 distinct)", n_tensor, pool, reps=3))
    out["full_gc_ms"], out["tracked_objects"] = full_gc_ms()
    out["torch_imported"] = torch is not None
    return out


# ------------------------------------------------------------------------------------- b. peers

PEERS: list[tuple[str, str, int, int]] = [
    # key, label, steps, steps per timed batch
    ("mlflow-sync", "mlflow log_metrics, file store, sync", 2_000, 10),
    ("mlflow-async", "mlflow log_metrics, file store, synchronous=False", 2_000, 10),
    ("tensorboard", "TensorBoard SummaryWriter.add_scalar x2", 20_000, 100),
    ("wandb", "wandb run.log, offline", 5_000, 10),
    ("kubeflow", "Kubeflow update_trainjob_status, 5 s throttle", 20_000, 100),
    ("kubeflow-nothrottle", "Kubeflow update_trainjob_status, throttle 0", 2_000, 10),
]


PeerCalls = tuple[Callable[[int, float, float], None], Callable[[], None]]


def _setup_mlflow(key: str, tmp: str, extra: dict[str, Any]) -> PeerCalls:
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # mlflow 3.17 refuses a file store without it
    import mlflow

    extra["version"] = mlflow.__version__
    mlflow.set_tracking_uri("file://" + tmp + "/mlruns")
    mlflow.set_experiment("stepwatch-bench")
    mlflow.start_run()
    sync = key == "mlflow-sync"

    def log(step: int, loss: float, lr: float) -> None:
        mlflow.log_metrics({"loss": loss, "lr": lr}, step=step, synchronous=sync)

    def close() -> None:
        if not sync:
            mlflow.flush_async_logging()
        mlflow.end_run()

    return log, close


def _setup_tensorboard(key: str, tmp: str, extra: dict[str, Any]) -> PeerCalls:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    extra["version"] = f"torch {torch.__version__}"
    writer = SummaryWriter(log_dir=tmp)  # defaults: max_queue=10, flush_secs=120

    def log(step: int, loss: float, lr: float) -> None:
        writer.add_scalar("loss", loss, global_step=step)
        writer.add_scalar("lr", lr, global_step=step)

    def close() -> None:
        writer.flush()
        writer.close()

    return log, close


def _setup_wandb(key: str, tmp: str, extra: dict[str, Any]) -> PeerCalls:
    os.environ.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
        WANDB_CONSOLE="off",
    )
    import wandb

    extra["version"] = wandb.__version__
    run = wandb.init(project="stepwatch-bench", dir=tmp, settings=wandb.Settings(x_disable_stats=True))

    def log(step: int, loss: float, lr: float) -> None:
        run.log({"loss": loss, "lr": lr}, step=step)

    def close() -> None:
        run.finish()

    return log, close


def _setup_kubeflow(key: str, tmp: str, extra: dict[str, Any]) -> PeerCalls:
    # KUBEFLOW_TRAINER_SERVER_URL (the full status URL) and KUBEFLOW_TRAINER_SERVER_TOKEN (a token
    # FILE) come from the parent; without a token file the SDK never posts.
    import kubeflow.trainer.backends.kubernetes.utils as kfu
    from kubeflow.trainer import update_trainjob_status

    try:
        from importlib.metadata import version

        extra["version"] = version("kubeflow")
    except Exception:
        pass
    if key == "kubeflow-nothrottle":
        kfu._MIN_UPDATE_INTERVAL_SECONDS = 0.0  # every call posts: the worst case
    returned: list[bool] = []
    append = returned.append

    def log(step: int, loss: float, lr: float) -> None:
        append(update_trainjob_status(metrics={"loss": loss, "lr": lr}))

    def close() -> None:
        extra["calls_that_posted"] = sum(returned)

    return log, close


PEER_SETUP: dict[str, Callable[[str, str, dict[str, Any]], PeerCalls]] = {
    "mlflow-sync": _setup_mlflow,
    "mlflow-async": _setup_mlflow,
    "tensorboard": _setup_tensorboard,
    "wandb": _setup_wandb,
    "kubeflow": _setup_kubeflow,
    "kubeflow-nothrottle": _setup_kubeflow,
}


def child_peer(args: dict[str, Any]) -> dict[str, Any]:
    """One peer, in this fresh interpreter: set up, time ``steps`` per-step logging calls, close."""
    key, steps, per_batch = args["key"], args["steps"], args["batch"]
    tmp = tempfile.mkdtemp(prefix=f"bench-{key}-")
    t_setup = time.perf_counter()
    extra: dict[str, Any] = {}
    try:
        log, close = PEER_SETUP[key](key, tmp, extra)
    except Exception as exc:  # not installed, or cannot run here
        return {"unavailable": f"{type(exc).__name__}: {exc}"[:200]}
    setup_s = time.perf_counter() - t_setup

    warm = min(50, steps // 10)
    for i in range(warm):
        log(i, 1.0 / (i + 1), 0.001)
    clock = time.perf_counter_ns
    per_step: list[float] = []
    step = warm
    t0 = time.perf_counter()
    for _ in range(steps // per_batch):
        b0 = clock()
        for _ in range(per_batch):
            log(step, 1.0 / (step + 1), 0.001)
            step += 1
        per_step.append((clock() - b0) / per_batch / 1000)
    loop_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    close()
    close_s = time.perf_counter() - t1
    timed = len(per_step) * per_batch
    return {
        "steps": timed,
        "calls_total": timed + warm,
        "batch": per_batch,
        "median_us": statistics.median(per_step),
        "p90_us": quantiles(per_step)["p90"],
        "mean_us": loop_s * 1e6 / timed,
        "mean_with_close_us": (loop_s + close_s) * 1e6 / timed,
        "setup_s": setup_s,
        "close_s": close_s,
        **extra,
    }


class StatusSink:
    """A minimal loopback status endpoint for the Kubeflow SDK rows: counts POSTs, answers 200.

    Its handler sets TCP_NODELAY. stepwatch.testing.ReportSink does not, and answers in two writes
    (headers, then body), so every request on a kept-alive connection waits ~40 ms for the client's
    delayed ACK (Nagle); a peer posting on a keep-alive session would be charged that wait.
    """

    def __init__(self) -> None:
        self.posts = 0
        self.bad = 0
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> StatusSink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = b'"trainerStatus"' in body
                if ok:
                    sink.posts += 1
                else:
                    sink.bad += 1
                payload = b"{}"
                self.send_response(200 if ok else 422)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="status-sink", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


_KF_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/bench/status"
_KF_BODY = json.dumps(
    {
        "trainerStatus": {
            "lastUpdatedTime": "2026-01-01T00:00:00.000000+00:00",
            "metrics": [{"name": "loss", "value": "0.5"}, {"name": "lr", "value": "0.001"}],
        }
    }
).encode()


def keepalive_post_ms(port: int, path: str, n: int = 20) -> tuple[float, int]:
    """Median latency of ``n`` POSTs on one kept-alive connection (http.client, one send per request)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    lat = []
    status = 0
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            conn.request("POST", path, body=_KF_BODY, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            status = response.status
            lat.append((time.perf_counter() - t0) * 1000)
    finally:
        conn.close()
    return statistics.median(lat), status


def section_peers(sink: Any, scale: float) -> dict[str, Any]:
    with StatusSink() as status_sink:
        return _peers(sink, status_sink, scale)


def _peers(sink: Any, status_sink: StatusSink, scale: float) -> dict[str, Any]:
    latency = {
        "reportsink_ms": keepalive_post_ms(sink.port, _KF_PATH),
        "minimal_sink_ms": keepalive_post_ms(status_sink.port, _KF_PATH),
    }
    fd, token_path = tempfile.mkstemp(prefix="bench-kf-token-")
    os.write(fd, b"bench-token")
    os.close(fd)
    env = {
        "KUBEFLOW_TRAINER_SERVER_URL": status_sink.url(_KF_PATH),
        "KUBEFLOW_TRAINER_SERVER_TOKEN": token_path,
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
    }
    rows = []
    try:
        for key, label, steps, per_batch in PEERS:
            n = max(per_batch * 20, int(steps * scale))
            before = status_sink.posts
            res = run_child("peer", {"key": key, "steps": n, "batch": per_batch}, env=env)
            res.update(key=key, label=label)
            if key.startswith("kubeflow") and "unavailable" not in res:
                res["posts_received"] = status_sink.posts - before
            rows.append(res)
    finally:
        os.unlink(token_path)
    return {"rows": rows, "loopback_post_latency": latency, "rejected_posts": status_sink.bad}


# ------------------------------------------------------------------------------------ c. memory

N_METRICS = 5


def child_memory(args: dict[str, Any]) -> dict[str, Any]:
    """RSS growth over ``steps`` steps of 5 fresh float metrics, reporting at the default interval."""
    import stepwatch

    steps = args["steps"]
    run = stepwatch.init(job="bench-memory", url=args["url"])  # default interval (2 s)
    for i in range(20_000):  # warm-up: lazy imports, the first report, the allocator's arenas
        run.step(m0=1.0 / (i + 1), m1=0.001, m2=i * 0.5, m3=-1.0 / (i + 1), m4=2.0)
    time.sleep(0.2)
    gc.collect()
    base = rss_kb()
    t0 = time.perf_counter()
    for i in range(20_000, 20_000 + steps):
        run.step(m0=1.0 / (i + 1), m1=0.001, m2=i * 0.5, m3=-1.0 / (i + 1), m4=2.0)
    loop_s = time.perf_counter() - t0
    gc.collect()
    after_loop = rss_kb()
    delivered = run.finish()
    gc.collect()
    after_finish = rss_kb()
    return {
        "steps": steps,
        "warmup_steps": 20_000,
        "run_id": run.run_id,
        "rss_base_kb": base,
        "rss_after_loop_kb": after_loop,
        "rss_after_finish_kb": after_finish,
        "rss_peak_kb": rss_kb("VmHWM"),
        "us_per_step": loop_s * 1e6 / steps,
        "final_delivered": delivered,
        "total_steps_stepped": steps + 20_000,
    }


def child_unreachable(args: dict[str, Any]) -> dict[str, Any]:
    """Step at ``rate`` steps/s for ``seconds`` with the server unreachable; RSS every few seconds."""
    import stepwatch

    seconds, rate, every = args["seconds"], args["rate"], args["sample_every"]
    run = stepwatch.init(job="bench-unreachable", url=args["url"], interval=args["interval"], flush_timeout=1.0)
    sender = run._sender
    wire = sender.wire if sender is not None else None
    samples: list[dict[str, Any]] = []
    start = time.perf_counter()
    next_sample = start
    i = 0
    chunk = max(1, rate // 100)
    while True:
        now = time.perf_counter()
        if now >= next_sample:
            gc.collect()
            samples.append(
                {
                    "t": round(now - start, 2),
                    "rss_kb": rss_kb(),
                    "step": i,
                    "queue": len(run._queue),
                    "windows_pending": len(getattr(wire, "_windows", ())),
                    "bodies_inflight": len(getattr(wire, "_inflight", ())),
                }
            )
            next_sample += every
            if now - start >= seconds:
                break
        for _ in range(chunk):
            i += 1
            run.step(m0=1.0 / i, m1=0.001, m2=i * 0.5, m3=-1.0 / i, m4=2.0)
        pause = start + i / rate - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    failures = sender._failures if sender is not None else None
    last_error = sender.last_error if sender is not None else None
    t_fin = time.perf_counter()
    delivered = run.finish()
    return {
        "seconds": seconds,
        "rate": rate,
        "interval": args["interval"],
        "steps": i,
        "samples": samples,
        "sender_failures": failures,
        "last_error": last_error,
        "finish_s": time.perf_counter() - t_fin,
        "final_delivered": delivered,
        "rss_peak_kb": rss_kb("VmHWM"),
    }


def summarise_series(samples: list[dict[str, Any]]) -> dict[str, Any]:
    rss = [(s["t"], s["rss_kb"] / 1024) for s in samples]
    half = [p for p in rss if p[0] >= rss[-1][0] / 2]
    return {
        "start_mb": rss[0][1],
        "max_mb": max(v for _, v in rss),
        "end_mb": rss[-1][1],
        "slope_second_half_mb_per_min": slope_per_minute(half),
        "max_queue": max(s["queue"] for s in samples),
        "max_windows_pending": max(s["windows_pending"] for s in samples),
        "max_bodies_inflight": max(s["bodies_inflight"] for s in samples),
    }


def section_memory(sink: Any, steps: int, unreachable_seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    res = run_child("memory", {"url": sink.url, "steps": steps}, timeout=600)
    if "unavailable" not in res:
        counts = {
            f"m{k}": sum(
                m.count for r in list(sink.reports) if r.run_id == res["run_id"] for m in r.metrics if m.name == f"m{k}"
            )
            for k in range(N_METRICS)
        }
        res["counted_at_sink"] = counts
        res["growth_mb"] = (res["rss_after_loop_kb"] - res["rss_base_kb"]) / 1024
        res["growth_after_finish_mb"] = (res["rss_after_finish_kb"] - res["rss_base_kb"]) / 1024
    out["steady"] = res
    if unreachable_seconds > 0:
        args = {
            "url": closed_port_url(),
            "seconds": unreachable_seconds,
            "rate": 2000,
            "interval": 0.1,
            "sample_every": 5.0 if unreachable_seconds >= 60 else 1.0,
        }
        res = run_child("unreachable", args, timeout=unreachable_seconds + 120)
        if "unavailable" not in res:
            res["summary"] = summarise_series(res["samples"])
        out["unreachable"] = res
    return out


# -------------------------------------------------------------------------------- d. import time

_LIST_NEW_MODULES = (
    "import sys; before = set(sys.modules); import stepwatch; new = sorted(set(sys.modules) - before); "
    "std = set(sys.stdlib_module_names); "
    "third = [m for m in new if m.partition('.')[0] not in std and m.partition('.')[0] != 'stepwatch']; "
    "print(repr((len(new), third)))"
)


def section_import(runs: int) -> dict[str, Any]:
    exe = sys.executable

    def wall(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([exe, "-c", code], check=True, capture_output=True)
        return (time.perf_counter() - t0) * 1000

    for _ in range(2):  # warm the page cache
        wall("import stepwatch")
        wall("pass")
    with_sw, bare = [], []
    for k in range(runs):
        if k & 1:
            with_sw.append(wall("import stepwatch"))
            bare.append(wall("pass"))
        else:
            bare.append(wall("pass"))
            with_sw.append(wall("import stepwatch"))
    diffs = [a - b for a, b in zip(with_sw, bare)]

    cumulative = []
    for _ in range(max(5, runs // 4)):
        proc = subprocess.run(
            [exe, "-X", "importtime", "-c", "import stepwatch"], capture_output=True, text=True, check=False
        )
        for line in proc.stderr.splitlines():
            m = re.match(r"import time:\s+(\d+)\s*\|\s*(\d+)\s*\|\s*(\S+)\s*$", line)
            if m and m.group(3) == "stepwatch":
                cumulative.append(int(m.group(2)) / 1000)
    proc = subprocess.run([exe, "-c", _LIST_NEW_MODULES], capture_output=True, text=True, check=True)
    n_new, third = eval(proc.stdout.strip())  # a (count, list) tuple printed by our own code
    return {
        "runs": runs,
        "with_import_ms": statistics.median(with_sw),
        "bare_ms": statistics.median(bare),
        "diff_median_ms": statistics.median(diffs),
        "importtime_cumulative_ms": statistics.median(cumulative) if cumulative else None,
        "new_modules": n_new,
        "third_party_modules": third,
    }


# --------------------------------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            models = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        info["cpu_model"] = models[0] if models else platform.processor()
    except OSError:
        info["cpu_model"] = platform.processor()
    for name in ("torch", "numpy"):
        try:
            from importlib.metadata import version

            info[name] = version(name)
        except Exception:
            info[name] = "not installed"
    from stepwatch import __version__

    info["stepwatch"] = __version__
    return info


def print_machine(info: dict[str, Any]) -> None:
    print("stepwatch reporter overhead benchmark")
    print(
        f"machine: {info['cpu_model']}, {info['cpu_count']} CPUs ({info['cpus_usable']} usable), "
        f"load avg {', '.join(f'{x:.2f}' for x in info['loadavg'] or ())}"
    )
    print(f"python {info['python']} ({info['implementation']}) on {info['platform']}")
    print(f"stepwatch {info['stepwatch']}, torch {info['torch']}, numpy {info['numpy']}")
    print(f"interpreter: {info['executable']}")


def print_hot(hot: dict[str, Any]) -> None:
    print("\n== a. hot path: run.step(loss=..., lr=...) against a running loopback ReportSink ==")
    print(
        f"   median per call over batches of {BATCH_CALLS} straight-line calls (perf_counter_ns), "
        "interleaved batch by batch with an empty method of the same signature"
    )
    print(
        f"   {'value':<24} {'calls/side':>10} {'stepwatch':>11} {'p10-p90':>17} {'empty':>10} {'ratio':>6}"
        f"  {'target':<26} verdict"
    )
    for row in hot["rows"]:
        if "unavailable" in row:
            print(f"   {row['label']:<24} unavailable: {row['unavailable']}")
            continue
        sw, em = row["stepwatch_us"], row["empty_us"]
        label = row["label"]
        if label == "torch scalar tensor":
            target = f"<= {TARGET_TENSOR_US} us"
            ok = sw["median"] <= TARGET_TENSOR_US
        elif label.startswith("no metrics"):
            target, ok = "(reference)", None
        else:
            target = f"<= {TARGET_STEP_US} us, <= {TARGET_STEP_RATIO:g}x empty"
            ok = sw["median"] <= TARGET_STEP_US and row["ratio"] <= TARGET_STEP_RATIO
        spread = f"{sw['p10']:.3f}-{sw['p90']:.3f}"
        print(
            f"   {label:<24} {row['calls_per_side']:>10,} {fmt_us(sw['median']):>11} {spread:>17} "
            f"{fmt_us(em['median']):>10} {row['ratio']:>5.2f}x  {target:<26} {'' if ok is None else verdict(ok)}"
        )
        rr = ", ".join(f"{x:.2f}" for x in row["round_ratios"])
        print(f"   {'':<24} ratio per round: {rr}")
    print("\n   amortised: wall (and CPU, all threads) of a loop of N steps incl. finish(), divided by N;")
    print("   the sender thread's folding runs during the loop and competes for the GIL")
    print(
        f"   {'values':<48} {'N':>9} {'stepwatch':>10} {'empty loop':>10} {'net wall':>10} {'net CPU':>10}"
        f" {'full GCs':>8}  all values at sink"
    )
    for row in hot["amortised"]:
        print(
            f"   {row['label']:<48} {row['steps']:>9,} {fmt_us(row['stepwatch_wall_us']):>10} "
            f"{fmt_us(row['empty_wall_us']):>10} {fmt_us(row['net_wall_us']):>10} {fmt_us(row['net_cpu_us']):>10}"
            f" {row['stepwatch_full_gcs']:>3g} / {row['empty_full_gcs']:<2g}  "
            f"{'yes' if row['all_values_counted'] else 'NO'}"
        )
    print(
        f"   full GCs: generation-2 collections during the loop (stepwatch / empty); one takes "
        f"{hot['full_gc_ms']:.1f} ms here ({hot['tracked_objects']:,} tracked objects, "
        f"torch {'imported' if hot['torch_imported'] else 'not imported'})"
    )


def print_peers(peers: dict[str, Any], sw_median: float | None) -> None:
    rows = peers["rows"]
    print("\n== b. peers: the same per-step logging (loss and lr), each in a fresh subprocess ==")
    ref = f"{sw_median:.3f} us" if sw_median else "n/a"
    print(f"   ratio = peer median / stepwatch median ({ref}, float row of section a, this run)")
    print(f"   {'peer':<50} {'steps':>7} {'median':>10} {'ratio':>9} {'mean':>10} {'close':>9} {'setup':>7}")
    for row in rows:
        label = row["label"]
        if "unavailable" in row:
            print(f"   {label:<50} unavailable: {row['unavailable']}")
            continue
        ratio = "-"
        if sw_median:
            r = row["median_us"] / sw_median
            ratio = f"{r:,.1f}x" if r < 100 else f"{r:,.0f}x"
        print(
            f"   {label:<50} {row['steps']:>7,} {fmt_us(row['median_us']):>10} {ratio:>9} "
            f"{fmt_us(row['mean_us']):>10} {row['close_s']:>8.2f}s {row['setup_s']:>6.2f}s"
        )
        if row["key"] == "kubeflow":
            print(
                f"   {'':<50} throttled: {row.get('calls_that_posted', '?')} of "
                f"{row['calls_total']:,} calls posted ({row.get('posts_received', '?')} received); "
                "the median is a throttled no-op"
            )
        elif row["key"] == "kubeflow-nothrottle":
            print(
                f"   {'':<50} {row.get('calls_that_posted', 0):,} calls posted, {row.get('posts_received', 0):,}"
                " received: one HTTP POST per step"
            )
        elif row["key"] == "mlflow-async":
            print(f"   {'':<50} mean incl. flush_async_logging+end_run: {fmt_us(row['mean_with_close_us'])} per step")
        elif row["key"] == "wandb":
            print(f"   {'':<50} the writing happens in the wandb-core process, not counted here")
    lat = peers["loopback_post_latency"]
    print(
        "   Kubeflow rows post to a minimal loopback sink (TCP_NODELAY). One POST on a kept-alive connection: "
        f"minimal sink {lat['minimal_sink_ms'][0]:.2f} ms, "
        f"stepwatch.testing.ReportSink {lat['reportsink_ms'][0]:.2f} ms"
    )
    if peers["rejected_posts"]:
        print(f"   WARNING: the minimal sink answered 422 to {peers['rejected_posts']} bodies without trainerStatus")


def print_memory(mem: dict[str, Any]) -> None:
    print("\n== c. memory (fresh subprocesses, VmRSS after gc.collect()) ==")
    st = mem["steady"]
    if "unavailable" in st:
        print(f"   steady: unavailable: {st['unavailable']}")
    else:
        counted = st["counted_at_sink"]
        ok_counts = all(v == st["total_steps_stepped"] for v in counted.values())
        print(
            f"   {st['steps']:,} steps x {N_METRICS} float metrics, loopback sink, default interval: "
            f"RSS {st['rss_base_kb'] / 1024:.1f} -> {st['rss_after_loop_kb'] / 1024:.1f} MB "
            f"(growth {st['growth_mb']:+.2f} MB; target < {TARGET_MEMORY_MB:g} MB: "
            f"{verdict(st['growth_mb'] < TARGET_MEMORY_MB)})"
        )
        print(
            f"   after finish(): {st['rss_after_finish_kb'] / 1024:.1f} MB ({st['growth_after_finish_mb']:+.2f} MB); "
            f"peak (VmHWM) {st['rss_peak_kb'] / 1024:.1f} MB; {st['us_per_step']:.2f} us/step in the loop"
        )
        print(
            f"   values counted at the sink: {'all' if ok_counts else 'NOT all'} "
            f"({min(counted.values()):,} of {st['total_steps_stepped']:,} per metric, warm-up included)"
        )
    un = mem.get("unreachable")
    if un is None:
        return
    if "unavailable" in un:
        print(f"   unreachable: unavailable: {un['unavailable']}")
        return
    s = un["summary"]
    print(
        f"   server unreachable (closed loopback port), {un['seconds']:.0f} s at {un['rate']:,} steps/s "
        f"x {N_METRICS} metrics, interval {un['interval']} s: {un['steps']:,} steps, "
        f"{len(un['samples'])} RSS samples"
    )
    print(
        f"   RSS start {s['start_mb']:.1f} MB, max {s['max_mb']:.1f} MB, end {s['end_mb']:.1f} MB, "
        f"slope over the second half {s['slope_second_half_mb_per_min']:+.3f} MB/min"
    )
    print(
        f"   max queued entries {s['max_queue']}, max windows pending {s['max_windows_pending']}, "
        f"max bodies in flight {s['max_bodies_inflight']}; sender failures {un['sender_failures']}; "
        f"finish() returned {un['final_delivered']} after {un['finish_s']:.1f} s"
    )


def print_import(imp: dict[str, Any]) -> None:
    print("\n== d. import stepwatch ==")
    print(
        f"   fresh interpreters x {imp['runs']}: python -c 'import stepwatch' {imp['with_import_ms']:.1f} ms, "
        f"python -c 'pass' {imp['bare_ms']:.1f} ms; median difference {imp['diff_median_ms']:.1f} ms "
        f"(target < {TARGET_IMPORT_MS:g} ms: {verdict(imp['diff_median_ms'] < TARGET_IMPORT_MS)})"
    )
    cum = imp["importtime_cumulative_ms"]
    print(f"   -X importtime cumulative for stepwatch: {cum:.1f} ms" if cum is not None else "   -X importtime: n/a")
    third = imp["third_party_modules"]
    print(
        f"   modules loaded by import stepwatch: {imp['new_modules']}, non-stdlib: "
        f"{', '.join(third) if third else 'none'}"
    )


# ------------------------------------------------------------- e. where a rank stands: sampler on vs off

TARGET_WHERE_RATIO = 1.02
"""The sampler may cost a loop at most 2 % per step (issue 29)."""


def python_work(n: int) -> float:
    """A step's own work in Python (the GIL held, as a data pipeline or a small model's host code holds it)."""
    x = 0.0
    for i in range(n):
        x += i * 0.5
    return x


def nested(depth: int, then: Callable[[], Any]) -> Any:
    """Call ``then`` ``depth`` frames deep: the stack a trainer, its callbacks and a model give the sampler."""
    return then() if depth <= 0 else nested(depth - 1, then)


def where_loop(sink: Any, where: bool, steps: int, work: int, depth: int) -> tuple[float, float, int]:
    """Wall and CPU µs per step of one loop with the sampler on or off, and the stacks it read."""
    import stepwatch

    run = stepwatch.init(job="bench-where", url=sink.url, interval=2.0, where=where)
    sampler = run._sender.where if run._sender is not None else None

    def loop() -> None:
        for i in range(steps):
            python_work(work)
            run.step(loss=1.0 / (i + 1))

    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    nested(depth, loop)
    w1, c1 = time.perf_counter(), time.process_time()
    run.finish()
    return (w1 - w0) * 1e6 / steps, (c1 - c0) * 1e6 / steps, sampler.reads if sampler is not None else 0


def chunked_where(sink: Any, chunks: int, steps: int, work: int, depth: int, period: float) -> dict[str, Any]:
    """One run whose sampler is switched on and off between short chunks of the same loop (wall µs per step).

    Whole loops minutes apart compare two moments of a shared machine; chunks of a quarter second,
    alternated many times, compare the sampler with its absence at nearly the same moment. The sampler
    reads every ``period`` seconds while on (faster than its 1 s, to make its cost visible).
    """
    import stepwatch

    run = stepwatch.init(job="bench-where-chunks", url=sink.url, interval=2.0, where=True)
    sampler = run._sender.where if run._sender is not None else None
    assert sampler is not None
    sampler.period = period
    times: dict[bool, list[float]] = {True: [], False: []}

    def chunk() -> float:
        t0 = time.perf_counter()
        for i in range(steps):
            python_work(work)
            run.step(loss=1.0 / (i + 1))
        return (time.perf_counter() - t0) * 1e6 / steps

    for c in range(chunks):
        on = (c // 2 + c) % 2 == 0  # on, off, off, on, on, off ...: neither side always goes first
        sampler.enabled = on
        times[on].append(nested(depth, chunk))
    reads = sampler.reads
    run.finish()
    on_us, off_us = statistics.median(times[True]), statistics.median(times[False])
    return {"period_s": period, "chunks": chunks, "steps_per_chunk": steps, "on_us": on_us, "off_us": off_us,
            "ratio": on_us / off_us, "reads": reads}  # fmt: skip


def sampler_read_cost(depth: int, reads: int = 2000) -> dict[str, float]:
    """µs of one stack read (activity only: the shares; full reading: a standing step) of a thread ``depth`` deep."""
    from stepwatch._where import StackReader

    release = threading.Event()
    thread = threading.Thread(target=nested, args=(depth, release.wait), daemon=True)
    thread.start()
    time.sleep(0.2)
    frame = sys._current_frames()[thread.ident or 0]
    reader = StackReader()
    t0 = time.perf_counter()
    reader.read(frame, 1.0)
    cold = (time.perf_counter() - t0) * 1e6
    activity, reading = [], []
    for _ in range(reads):
        t0 = time.perf_counter_ns()
        reader.activity(frame)
        t1 = time.perf_counter_ns()
        reader.read(frame, 1.0)
        reading.append((time.perf_counter_ns() - t1) / 1000)
        activity.append((t1 - t0) / 1000)
    release.set()
    return {"cold_us": cold, "activity_us": statistics.median(activity), "reading_us": statistics.median(reading)}


def section_where(sink: Any, scale: float, progress: Callable[[str], None]) -> dict[str, Any]:
    """The sampler on vs off in the same run: the hot path per call, whole loops per step, one read's cost."""
    progress("e. where a rank stands: the sampler on vs off")
    from stepwatch._run import Run
    from stepwatch._setup import plan_run

    out: dict[str, Any] = {}
    # two live runs side by side (init() would finish the first): the hot path with and without a sampler
    on = Run(plan_run({"job": "bench-where-on", "url": sink.url, "interval": 2.0, "where": True}))
    off = Run(plan_run({"job": "bench-where-off", "url": sink.url, "interval": 2.0, "where": False}))
    row = interleaved(on, off, "obj.step(loss=a, lr=b)", (0.5, 0.001), rounds=7, batches=max(50, int(1000 * scale)))
    on.finish()
    off.finish()
    out["hot_path"] = {
        "on_us": row["stepwatch_us"]["median"],
        "off_us": row["empty_us"]["median"],
        "ratio": row["ratio"],
    }
    # ~40 µs of Python per step, ~5 s per loop at scale 1: each loop sees a few ticks of the sampler
    depth, work = 40, 1000
    steps = max(10_000, int(120_000 * scale))
    reps = 7
    loops: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for r in range(reps):  # alternated, so that drift of a shared machine falls on both sides
        for where in (True, False) if r % 2 == 0 else (False, True):
            loops[where].append(where_loop(sink, where, steps, work, depth))
    for where, key in ((True, "on"), (False, "off")):
        out[f"loop_{key}_wall_us"] = statistics.median(x[0] for x in loops[where])
        out[f"loop_{key}_cpu_us"] = statistics.median(x[1] for x in loops[where])
        out[f"loop_{key}_reads"] = statistics.median(x[2] for x in loops[where])
    out["loop_ratio"] = out["loop_on_wall_us"] / out["loop_off_wall_us"]
    out["loop_cpu_ratio"] = out["loop_on_cpu_us"] / out["loop_off_cpu_us"]
    out["loop_round_ratios"] = [a[0] / b[0] for a, b in zip(loops[True], loops[False], strict=True)]
    out["loop"] = {"steps": steps, "reps": reps, "stack_depth": depth, "python_work_iterations": work}
    out["chunks"] = chunked_where(sink, max(20, int(120 * scale)), max(1_000, steps // 20), work, depth, 0.1)
    out["read"] = sampler_read_cost(depth)
    return out


def print_where(res: dict[str, Any]) -> None:
    def row(label: str, on: float, off: float, ratio: str, digits: int = 2) -> None:
        print(f"| {label:52} | {on:10.{digits}f} | {off:10.{digits}f} | {ratio:>7} |")

    print("\ne. where a rank stands: the sampler on vs off, same run (target: per step within 2 %)\n")
    print(f"| {'':52} | {'on':>10} | {'off':>10} | {'on/off':>7} |")
    print(f"|{'-' * 54}|{'-' * 12}|{'-' * 12}|{'-' * 9}|")
    hot = res["hot_path"]
    row("run.step(loss, lr), µs per call (median)", hot["on_us"], hot["off_us"], f"{hot['ratio']:.3f}", 3)
    loop = res["loop"]
    label = f"loop of {loop['steps']:,} steps {loop['stack_depth']} frames deep, µs per step"
    row(label, res["loop_on_wall_us"], res["loop_off_wall_us"], f"{res['loop_ratio']:.3f}")
    cpu = res["loop_cpu_ratio"]
    row("  CPU µs per step (process, all threads)", res["loop_on_cpu_us"], res["loop_off_cpu_us"], f"{cpu:.3f}")
    row("  stacks read per loop (median)", res["loop_on_reads"], res["loop_off_reads"], "", 0)
    ch = res["chunks"]
    label = f"{ch['chunks']} chunks switched on/off, {1 / ch['period_s']:.0f} reads/s, µs per step"
    row(label, ch["on_us"], ch["off_us"], f"{ch['ratio']:.3f}")
    ratios = ", ".join(f"{r:.3f}" for r in res["loop_round_ratios"])
    print(f"\nper-round wall ratios: {ratios}")
    # CPU time of the whole process is the judge: it counts the sampler's own work and, unlike wall
    # time, not what other tenants of a shared machine take
    # at 1 read/s (the sampler's pace) the chunks' extra wall time is a tenth of what 10 reads/s cost
    per_read_s = (ch["ratio"] - 1.0) * ch["period_s"]
    print(
        f"per-step CPU within 2 %: {verdict(cpu <= TARGET_WHERE_RATIO)}; chunks at {1 / ch['period_s']:.0f} reads/s: "
        f"{(ch['ratio'] - 1) * 100:+.2f} % wall, so {per_read_s * 100:+.3f} % at 1 read/s "
        f"({verdict(1 + per_read_s <= TARGET_WHERE_RATIO)})"
    )
    read = res["read"]
    print(
        f"one read of a {loop['stack_depth']}-frame stack: activity {read['activity_us']:.1f} µs, full reading "
        f"{read['reading_us']:.1f} µs (first, cold cache: {read['cold_us']:.0f} µs); at 1 read/s that is "
        f"{read['activity_us'] / 1e4:.4f} % of one core"
    )


# ----------------------------------------------------------------------------------------- main

CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "peer": child_peer,
    "memory": child_memory,
    "unreachable": child_unreachable,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write every figure to this JSON file")
    parser.add_argument(
        "--unreachable-seconds", type=float, default=60.0, help="duration of the unreachable-server run (0: skip)"
    )
    parser.add_argument("--memory-steps", type=int, default=1_000_000, help="steps of the RSS-growth run")
    parser.add_argument("--import-runs", type=int, default=20, help="fresh interpreters for the import time")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="scale the number of calls and peer steps (0.1 for a quick look)"
    )
    parser.add_argument(
        "--sections",
        default="abcde",
        help="which sections to run (letters a-e; b uses a's figure when both run; e: the sampler on vs off)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-args", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)

    if opts.child:
        emit(CHILDREN[opts.child](json.loads(opts.child_args)))
        return 0

    from stepwatch.testing import ReportSink

    started = time.perf_counter()
    results: dict[str, Any] = {"machine": machine_info()}
    print_machine(results["machine"])

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {what}", file=sys.stderr, flush=True)

    with ReportSink() as sink:
        if "a" in opts.sections:
            progress("a. hot path")
            results["hot_path"] = hot = section_hot_path(sink, opts.scale)
            print_hot(hot)
        if "b" in opts.sections:
            progress("b. peers")
            results["peers"] = peers = section_peers(sink, opts.scale)
            sw = None
            if "hot_path" in results:
                sw = next(r["stepwatch_us"]["median"] for r in results["hot_path"]["rows"] if r["label"] == "float")
            for row in peers["rows"]:
                if "median_us" in row and sw:
                    row["ratio_to_stepwatch"] = row["median_us"] / sw
            print_peers(peers, sw)
        # d runs before c (c's unreachable run is long and mostly idle) but is printed after it.
        if "d" in opts.sections:
            progress("d. import time")
            results["import"] = section_import(opts.import_runs)
        if "c" in opts.sections:
            progress(f"c. memory ({opts.unreachable_seconds:.0f} s with the server unreachable)")
            results["memory"] = mem = section_memory(sink, opts.memory_steps, opts.unreachable_seconds)
            print_memory(mem)
        if "e" in opts.sections:
            print_where(results.setdefault("where", section_where(sink, opts.scale, progress)))
    if "import" in results:
        print_import(results["import"])
    results["elapsed_s"] = time.perf_counter() - started
    print(f"\ntotal time {results['elapsed_s']:.0f} s")
    if opts.json:
        path = Path(opts.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1, default=str) + "\n", encoding="utf-8")
        print(f"figures written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
