"""GPU readings through NVML. There is no GPU (and no NVIDIA driver) on the machines these tests run on,
so NVML is a fake here: it follows pynvml's documented calls and return shapes (nvmlInit,
nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex/ByUUID, nvmlDeviceGetIndex, nvmlDeviceGetUtilizationRates
-> .gpu in percent, nvmlDeviceGetMemoryInfo -> .used/.total in bytes). A device check with a real GPU is
in benchmarks/gpu_check.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from stepwatch._gpu import GpuReader


class FakeNvml:
    """pynvml's calls over a list of devices: (uuid, utilisation %, used bytes, total bytes)."""

    def __init__(self, devices: list[tuple[str, float | None, int, int]]) -> None:
        self.devices = devices
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return next(i for i, d in enumerate(self.devices) if d[0] == uuid)

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        util = self.devices[handle][1]
        if util is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(gpu=util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=self.devices[handle][2], total=self.devices[handle][3], free=0)


GIB = 1 << 30
EIGHT = [(f"GPU-{i}", 10.0 * i, i * GIB, 80 * GIB) for i in range(8)]


@pytest.mark.parametrize(
    ("environ", "indices"),
    [
        ({}, list(range(8))),
        ({"CUDA_VISIBLE_DEVICES": "2,3"}, [2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2,3", "LOCAL_RANK": "1"}, [3]),  # torchrun: rank 1 uses the second it sees
        ({"LOCAL_RANK": "5"}, [5]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-6,GPU-1"}, [6, 1]),
        ({"CUDA_VISIBLE_DEVICES": "4,x,5"}, [4]),  # CUDA stops at the first entry it cannot use
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
    ],
)
def test_the_gpus_this_process_uses(environ: dict[str, str], indices: list[int]) -> None:
    readings = GpuReader(environ, FakeNvml(EIGHT)).read()
    assert [r.index for r in readings] == indices
    for r in readings:
        assert (r.utilization, r.memory_used, r.memory_total) == (10.0 * r.index, r.index * GIB, 80 * GIB)


def test_nvml_opens_once_and_a_slice_without_a_utilisation_counter_reads_none() -> None:
    nvml = FakeNvml([("MIG-a", None, GIB, 10 * GIB)])
    reader = GpuReader({}, nvml)
    assert reader.read()[0].utilization is None
    reader.read()
    assert nvml.inits == 1


def test_without_nvml_or_on_a_failure_it_reads_nothing_and_never_raises() -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise OSError("NVML Shared Library Not Found")

    reader = GpuReader({}, Broken(EIGHT))
    assert reader.read() == () and reader.read() == ()
    real = GpuReader({})  # no pynvml here (or no driver): empty, quietly
    assert real.read() == ()


def test_reports_carry_the_readings(monkeypatch: pytest.MonkeyPatch, sink: Any) -> None:
    """End to end through the report core: the sender reads the (fake) NVML at each report, rank 0 sends it."""
    import sys

    import stepwatch

    nvml = FakeNvml(EIGHT[:2])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # what `import pynvml` finds
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    run = stepwatch.init(job="gpus", url=sink.url, interval=0.05)
    for step in range(5):
        run.step(loss=1.0 / (step + 1))
    run.finish()
    final = sink.final()
    assert final is not None
    assert [g.to_dict() for g in final.gpus] == [
        {"index": 1, "utilization": 10.0, "memory_used": GIB, "memory_total": 80 * GIB}
    ]
    assert nvml.inits == 1
