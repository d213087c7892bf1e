"""The retention task of a running server: compaction by age and by namespace quota, in bounded passes.

Every ``retention_sweep_s`` seconds the server runs passes of :meth:`~.base.Store.compact` (each
deletes at most :data:`PASS_BUDGET` rows in per-job transactions, in a worker thread) until there is
nothing left, with a short sleep between passes so ingest gets the writer in between. Ingest is
never refused for a quota: a namespace over it has its oldest raw windows compacted at the next
sweep (see docs/retention.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from .base import Compaction, Store
from .offload import Offload

# Compaction is what a run of passes returns: named here so that ``stepwatch db compact`` needs this module only
__all__ = ["DAY_S", "PASS_BUDGET", "Compaction", "compact_now", "start", "sweep_forever"]

_log = logging.getLogger("stepwatch.server.retention")  # its name from before it moved: log configs name it

DAY_S = 86_400.0
PASS_BUDGET = 20_000
"""Rows one pass deletes at most (a few hundred ms of the writer on SQLite)."""


async def compact_now(
    store: Store,
    offload: Offload,
    now: float,
    retention_days: float | None,
    quotas: Mapping[str, int] | None,
    pause_s: float = 0.05,
) -> Compaction:
    """Run passes until nothing is left to compact; what they deleted."""
    total = Compaction()
    before = None if retention_days is None else now - retention_days * DAY_S
    while True:
        done: Compaction = await offload(store.compact, before, quotas, PASS_BUDGET)
        total.add(done)
        if not done.more:
            return total
        await asyncio.sleep(pause_s)  # ingest takes the writer between passes


async def sweep_forever(
    store: Store,
    offload: Offload,
    clock: Callable[[], float],
    every: float,
    retention_days: float | None,
    quotas: Mapping[str, int] | None,
) -> None:
    """Apply retention every ``every`` seconds (until cancelled); one failure is logged, not fatal."""
    while True:
        await asyncio.sleep(every)
        try:
            done = await compact_now(store, offload, clock(), retention_days, quotas)
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("retention pass failed; the next one runs in %.0f s", every)
            continue
        if done.deleted:
            _log.info(
                "retention: %d windows, %d roll-up rows and %d reports compacted in %d series%s",
                done.windows,
                done.rollups,
                done.reports,
                done.series,
                f"; over quota: {', '.join(done.namespaces_over_quota)}" if done.namespaces_over_quota else "",
            )


def start(
    store: Store,
    offload: Offload,
    clock: Callable[[], float],
    every: float,
    retention_days: float | None,
    quotas: Mapping[str, int] | None,
) -> asyncio.Task[None] | None:
    """The server's retention task, when the settings ask for retention or quotas (the app passes them:
    the settings sit floors above the store)."""
    if retention_days is None and not quotas:
        return None
    return asyncio.create_task(sweep_forever(store, offload, clock, every, retention_days, quotas))
