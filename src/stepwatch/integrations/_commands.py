"""What the ``agree`` helpers of distributed loops return (torch, JAX): the commands every rank obeys.

Standard library only, so that :mod:`stepwatch.integrations.jax` does not import torch for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .._run import Run

__all__ = ["Commands", "local_commands"]


class Commands(NamedTuple):
    """The server's commands as every rank sees them after an ``agree``."""

    stop: bool
    """Some rank was asked to stop: every rank stops (after the checkpoint)."""
    checkpoint: bool
    """Some rank was asked for a checkpoint (a stop asks for one too)."""
    reason: str = ""
    """Why, as the server said it (for ``run.finish("stopped", reason)``)."""


def local_commands(run: Run | None) -> Commands:
    """What this rank's reporter was told (the current run's when ``run`` is ``None``): what ranks agree on."""
    import stepwatch

    if run is None:
        run = stepwatch.current()
    if run is None:
        return Commands(False, False)
    stop, checkpoint = run.should_stop, run.should_checkpoint
    return Commands(stop, stop or checkpoint, run.command_reason)
