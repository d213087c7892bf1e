"""GPU readings for reports: utilisation and memory of the GPUs this process uses, through NVML.

Read in the sender thread, never on the training loop's path. NVML comes from ``nvidia-ml-py``
(``pip install 'stepwatch[gpu]'``), imported only when a reading is first asked for; without it, or
without a GPU, readings are empty and nothing is said beyond one debug line. NVML does not touch the
CUDA context, so a reading never synchronises the device.

Which GPUs: ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) names the ones the process sees; of those, a
process with a ``LOCAL_RANK`` uses the one at that position (one GPU per rank, as torchrun and
Accelerate lay them out); otherwise all it sees.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from .protocol import LIMITS, GpuReading

__all__ = ["GpuReader"]


def _log() -> logging.Logger:
    return logging.getLogger("stepwatch")


class GpuReader:
    """Reads this process's GPUs; :meth:`read` never raises (a failure turns the reader off)."""

    def __init__(self, environ: Mapping[str, str] | None = None, nvml: Any = None) -> None:
        self._environ = os.environ if environ is None else environ
        self._nvml = nvml
        self._handles: list[tuple[int, Any]] | None = None
        self._off = False

    def read(self) -> tuple[GpuReading, ...]:
        """The current readings (empty when NVML or a GPU is not there)."""
        if self._off:
            return ()
        try:
            if self._handles is None:
                self._handles = self._open()
            return tuple(self._reading(index, handle) for index, handle in self._handles)
        except Exception as exc:  # NVML errors are many and driver-specific: one line, then quiet
            self._off = True
            _log().debug("stepwatch: GPU readings are off (%s: %s)", type(exc).__name__, exc)
            return ()

    def _open(self) -> list[tuple[int, Any]]:
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml  # type: ignore[import-not-found,unused-ignore]
            except ImportError:
                self._off = True
                _log().debug("stepwatch: no GPU readings (pip install 'stepwatch[gpu]' for NVML)")
                return []
            nvml = self._nvml = pynvml
        nvml.nvmlInit()
        count = int(nvml.nvmlDeviceGetCount())
        visible = self._visible(count, nvml)
        local = self._environ.get("LOCAL_RANK", "")
        if local.isdigit() and int(local) < len(visible) and len(visible) > 1:
            visible = [visible[int(local)]]
        return [(index, handle) for index, handle in visible[: LIMITS.max_gpus_per_report]]

    def _visible(self, count: int, nvml: Any) -> list[tuple[int, Any]]:
        listed = self._environ.get("CUDA_VISIBLE_DEVICES")
        if listed is None:
            return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        found = []
        for item in (part.strip() for part in listed.split(",")):
            if item.isdigit() and int(item) < count:
                found.append((int(item), nvml.nvmlDeviceGetHandleByIndex(int(item))))
            elif item.startswith(("GPU-", "MIG-")):
                handle = nvml.nvmlDeviceGetHandleByUUID(item)
                found.append((int(nvml.nvmlDeviceGetIndex(handle)), handle))
            else:
                break  # CUDA stops at the first entry it cannot use
        return found

    def _reading(self, index: int, handle: Any) -> GpuReading:
        nvml = self._nvml
        utilization: float | None
        try:
            utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:  # MIG slices have no utilisation counter
            utilization = None
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return GpuReading(
            index=index,
            utilization=min(max(utilization, 0.0), 100.0) if utilization is not None else None,
            memory_used=int(memory.used),
            memory_total=int(memory.total),
        )
