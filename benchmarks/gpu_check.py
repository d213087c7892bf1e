"""GPU check: on a machine with an NVIDIA GPU, show that reporting adds no device sync and little time.

    .venv/bin/python benchmarks/gpu_check.py [--steps 3000]

1. **No sync on the hot path**: a CUDA training loop calls ``run.step(loss=loss)`` with the loss still
   on the device, under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any call that
   synchronises the device from this thread (``.item()``, ``float()``, a blocking copy). The sender
   thread turns tensors into floats off the loop's thread.
2. **Overhead**: the same loop with and without stepwatch, alternating runs, median steps/s, reporting
   to a real stepwatch server on loopback.
3. **NVML readings**: what :class:`stepwatch._gpu.GpuReader` reads (utilisation, memory), and the
   reports' ``gpus`` as the server stored them.

Prints a table; exits 1 when a check fails. Without CUDA it says so and exits 0 (nothing to check).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def loop(steps: int, report: bool, url: str | None) -> float:
    import torch

    import stepwatch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(256, 1024, device="cuda")
    run = stepwatch.init(job=f"gpu-check-{int(report)}", url=url, total_steps=steps) if report else None
    for _ in range(20):  # warm-up: kernels chosen, allocator settled
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    began = time.perf_counter()
    for _ in range(steps):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if run is not None:
            run.step(loss=loss)  # raises here if it synchronised the device
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - began
    if run is not None:
        run.finish()
    return steps / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed; nothing to check")
        return 0
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; nothing to check (run it on a GPU machine)")
        return 0
    from stepwatch._gpu import GpuReader

    readings = GpuReader().read()
    port = 18000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}"
    db = Path(tempfile.mkdtemp()) / "gpu.db"
    server = subprocess.Popen(
        [sys.executable, "-m", "stepwatch", "server", "--port", str(port), "--db", str(db)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        without, with_ = [], []
        failed = []
        for _ in range(args.pairs):
            without.append(loop(args.steps, False, None))
            try:
                with_.append(loop(args.steps, True, url))
            except RuntimeError as exc:  # set_sync_debug_mode("error") caught a sync in run.step
                failed.append(f"run.step synchronised the device: {exc}")
                break
        ranks = httpx.get(f"{url}/api/v1/namespaces/default/jobs/gpu-check-1", timeout=5).json().get("ranks", [])
    finally:
        server.terminate()
        server.wait(10)
    name = torch.cuda.get_device_name(0)
    print(f"device: {name}; torch {torch.__version__}")
    print(f"NVML readings: {[r.to_dict() for r in readings] or 'none (pip install nvidia-ml-py)'}")
    print(f"stored with the job's rank 0: {ranks[0].get('gpus') if ranks else 'no ranks'}")
    if with_:
        a, b = statistics.median(without), statistics.median(with_)
        print(f"{'loop':<12} {'steps/s':>10}\n{'without':<12} {a:>10.1f}\n{'with':<12} {b:>10.1f}")
        print(f"overhead {100 * (a - b) / a:+.2f} % (target < 1 %); no device sync in run.step: {not failed}")
    for problem in failed:
        print("FAILED:", problem)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
