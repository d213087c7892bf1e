"""JAX (Flax, optax, any multi-process JAX loop): every process agreeing on the server's commands.

A JAX loop needs no integration to report: ``run = stepwatch.init()`` (after
``jax.distributed.initialize()`` in a multi-process job: the rank is ``jax.process_index()``), then
``run.step(loss=loss)`` with the loss as a ``jax.Array``. Arrays are kept by reference and read in
stepwatch's sender thread, all of a window in one ``jax.device_get``: no ``float()`` and no
``block_until_ready()`` in the loop.

With several processes, every process must obey a command at the same step: the server answers a
command to whichever process reports first, and a process that leaves the loop alone leaves the
others waiting in their next collective. :func:`agree` gathers the flags of every process::

    from stepwatch.integrations.jax import agree

    for step in range(1, steps + 1):
        state, loss = train_step(state, batch)
        run.step(loss=loss)
        if step % 50 == 0:                      # every N steps: it is a collective
            commands = agree(run)
            if commands.checkpoint or commands.stop:
                checkpoint_manager.save(step, state)   # orbax: every process
                run.checkpoint_done()
            if commands.stop:
                break

In a single process it returns the run's own flags and costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    import jax
    import numpy as np
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("stepwatch.integrations.jax needs JAX: pip install 'stepwatch[jax]'") from exc

from ._commands import Commands, local_commands
from ._guard import report_failure

if TYPE_CHECKING:
    from .._run import Run

__all__ = ["Commands", "agree"]

_REASON_BYTES = 256  # LIMITS.max_reason_length: reasons travel as fixed-size byte arrays


def agree(run: Run | None = None) -> Commands:
    """``stop`` and ``checkpoint`` OR-ed over every JAX process, the same in each.

    A collective (``multihost_utils.process_allgather``): every process must call it at the same
    point of the loop. Never raises (a failure is logged once and the local flags are returned).
    """
    local = local_commands(run)
    stop, checkpoint, reason = local
    try:
        if jax.process_count() < 2:
            return local
        from jax.experimental import multihost_utils

        flags = np.asarray(multihost_utils.process_allgather(np.array([stop, stop or checkpoint], dtype=np.int32)))
        agreed_stop, agreed_checkpoint = bool(flags[:, 0].any()), bool(flags[:, 1].any())
        if agreed_stop or agreed_checkpoint:  # rare: one more collective for the words
            mine = np.zeros(_REASON_BYTES, dtype=np.uint8)
            encoded = reason.encode("utf-8")[:_REASON_BYTES]
            mine[: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
            reasons = np.asarray(multihost_utils.process_allgather(mine))
            words = (bytes(row).rstrip(b"\0").decode("utf-8", "replace") for row in reasons)
            reason = next((w for w in words if w), reason)
        return Commands(agreed_stop, agreed_checkpoint, reason)
    except Exception as exc:
        report_failure("jax", "agree", exc)
        return local
