"""PyTorch (DDP, FSDP, any ``torch.distributed`` loop): every rank agreeing on the server's commands.

A custom loop needs no integration to report: ``run = stepwatch.init()`` after
``dist.init_process_group()`` finds the rank and world size, rank 0 sends metrics, the other ranks
send heartbeats, and ``run.step(loss=loss)`` keeps the tensor by reference (no ``.item()``, no GPU
synchronisation in the loop).

What a distributed loop does need is for **every rank to obey a command at the same step**. The
server answers a command to whichever rank reports first, so one rank may see ``stop`` while the
others do not; a rank that leaves the loop alone leaves the others waiting in their next
collective for ever. :func:`agree` is one small all-reduce of the flags of every rank::

    from stepwatch.integrations.torch import agree

    for step, batch in enumerate(loader, 1):
        ...
        run.step(loss=loss.detach())
        if step % 50 == 0:                      # every N steps: it is a collective
            commands = agree(run)
            if commands.checkpoint or commands.stop:
                save_checkpoint()               # DDP: rank 0 saves; FSDP: every rank (DCP)
                run.checkpoint_done()
            if commands.stop:
                break
    run.finish("stopped" if commands.stop else "finished", commands.reason)

The flags travel over the CPU (gloo): on an NCCL job :func:`agree` makes, once, a gloo group of the
same ranks, so it never touches the GPU stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    import torch
    import torch.distributed as dist
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("stepwatch.integrations.torch needs PyTorch: pip install 'stepwatch[torch]'") from exc

from ._commands import Commands, local_commands
from ._guard import report_failure

if TYPE_CHECKING:
    from .._run import Run

__all__ = ["Commands", "agree"]

_cpu_groups: dict[int, Any] = {}
"""A gloo group per process group that is not gloo (keyed by ``id``), made once."""


def agree(run: Run | None = None, *, group: Any = None) -> Commands:
    """``stop`` and ``checkpoint`` OR-ed over the ranks of ``group`` (default: all), the same on each.

    A collective: every rank of the group must call it at the same point of the loop. Without an
    initialised process group (or with one rank) it returns this process's own flags. Never raises
    (a failure is logged once and the local flags are returned).
    """
    local = local_commands(run)
    stop, checkpoint, reason = local
    try:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) < 2:
            return local
        cpu_group = _cpu_group(group)
        flags = torch.tensor([int(stop), int(stop or checkpoint)], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=cpu_group)
        agreed_stop, agreed_checkpoint = (bool(v) for v in flags.tolist())
        if agreed_stop or agreed_checkpoint:  # rare: one more collective for the words
            reasons: list[Any] = [None] * dist.get_world_size(cpu_group)
            dist.all_gather_object(reasons, reason, group=cpu_group)
            reason = next((r for r in reasons if r), reason)
        return Commands(agreed_stop, agreed_checkpoint, reason)
    except Exception as exc:
        report_failure("torch", "agree", exc)
        return local


def _cpu_group(group: Any) -> Any:
    """``group`` if its backend moves CPU tensors (gloo), else a gloo group of the same ranks."""
    backend = str(dist.get_backend(group)).lower()
    if "gloo" in backend:
        return group
    key = id(group)
    if key not in _cpu_groups:
        ranks = None if group is None else dist.get_process_group_ranks(group)
        _cpu_groups[key] = dist.new_group(ranks=ranks, backend="gloo")
    return _cpu_groups[key]
