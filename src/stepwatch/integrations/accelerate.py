"""Hugging Face Accelerate: a run for a custom ``accelerate`` loop, counted in optimizer steps.

::

    from accelerate import Accelerator
    from stepwatch.integrations.accelerate import init_for, obey_commands, sync_step

    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    run = init_for(accelerator, total_steps=len(loader) * epochs // 4, batch_size=32)
    for epoch in range(epochs):
        run.epoch(epoch)
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step(); optimizer.zero_grad()
            sync_step(run, accelerator, loss=loss.detach())   # one step per optimizer step
            if obey_commands(run, accelerator, "checkpoints"):  # saves when asked; True: stop
                break
    run.finish()

A ``Trainer`` built on Accelerate (transformers, TRL) needs none of this: its callback reports.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    import accelerate  # type: ignore[import-untyped]  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "stepwatch.integrations.accelerate needs accelerate: pip install 'stepwatch[accelerate]'"
    ) from exc

import stepwatch

from ._guard import guarded

__all__ = ["init_for", "obey_commands", "sync_step"]


def init_for(
    accelerator: Any,
    *,
    batch_size: int | None = None,
    params: Mapping[str, Any] | None = None,
    **init_kwargs: Any,
) -> stepwatch.Run:
    """Start a run for ``accelerator``'s process: its rank, world size and gradient accumulation.

    ``batch_size`` is the batch of one forward pass on one process; the run's samples per step become
    ``batch_size * gradient_accumulation_steps * num_processes``. ``params`` are sent with the
    accelerator's own settings (processes, accumulation, mixed precision, distributed type). The
    other arguments go to :func:`stepwatch.init`. Never raises (a run that cannot report is a no-op).
    """
    _share_identity(accelerator)
    accumulation = _int(getattr(accelerator, "gradient_accumulation_steps", 1)) or 1
    processes = _int(getattr(accelerator, "num_processes", 1)) or 1
    settings: dict[str, Any] = {
        "num_processes": processes,
        "gradient_accumulation_steps": accumulation,
        "mixed_precision": str(getattr(accelerator, "mixed_precision", "")),
        "distributed_type": str(getattr(getattr(accelerator, "distributed_type", ""), "value", "")),
    }
    if batch_size:
        settings["per_device_batch_size"] = batch_size
    merged = {**settings, **(params or {})}
    total = batch_size * accumulation * processes if batch_size else None
    return stepwatch.init(params=merged, batch_size=total, **init_kwargs)


def sync_step(run: stepwatch.Run, accelerator: Any, **metrics: Any) -> None:
    """Count one step when the optimizer stepped (``accelerator.sync_gradients``); else keep the metrics.

    Inside ``accelerator.accumulate`` the gradients are synchronised, and the optimizer really steps,
    once every ``gradient_accumulation_steps`` micro-batches: that is the step stepwatch counts.
    Metrics of the other micro-batches are folded in at the current step. Never raises.
    """
    try:
        synced = bool(accelerator.sync_gradients)
    except Exception:
        synced = True
    if synced:
        run.step(**metrics)
    elif metrics:
        run.log(**metrics)


@guarded(fallback=False)
def obey_commands(run: stepwatch.Run, accelerator: Any, output_dir: str | os.PathLike[str]) -> bool:
    """Save ``accelerator.save_state`` when the server asks; returns ``True`` when the loop should stop.

    Call it at an optimizer-step boundary on every process: the decision is the same on all of them
    (the flags are combined across processes, one small collective when there are several). A stop
    saves a checkpoint first. The checkpoint goes to ``output_dir/checkpoint-<step>``.
    """
    stop, checkpoint = run.should_stop, run.should_checkpoint
    if (_int(getattr(accelerator, "num_processes", 1)) or 1) > 1:
        import torch

        flags = torch.tensor([int(stop), int(checkpoint)], device=accelerator.device)
        flags = accelerator.reduce(flags, reduction="sum")
        stop, checkpoint = bool(flags[0] > 0), bool(flags[1] > 0)
    if stop or checkpoint:
        accelerator.save_state(str(Path(output_dir) / f"checkpoint-{run.current_step}"))
        run.checkpoint_done()
    return stop


def _share_identity(accelerator: Any) -> None:
    """The report core reads the rank from torch.distributed or RANK/WORLD_SIZE: tell it Accelerate's.

    Only where they are missing: a launcher's own variables (torchrun's) are never overwritten.
    """
    rank = _int(getattr(accelerator, "process_index", None))
    size = _int(getattr(accelerator, "num_processes", None))
    if rank is None or size is None or size < 2 or "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(size)
    local = _int(getattr(accelerator, "local_process_index", None))
    if local is not None and "LOCAL_RANK" not in os.environ:
        os.environ["LOCAL_RANK"] = str(local)


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except Exception:
        return None
