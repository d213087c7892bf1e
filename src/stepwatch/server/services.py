"""The app's collaborators (:class:`Services`) and the one way store calls leave the event loop (:func:`blocking`).

Routes, the ingest service, the Kubernetes runner and the app factory all import them from here; this
module imports none of them.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from .analysis.cost import PriceList
from .analysis.health_monitor import HealthMonitor
from .ingest.recent_progress import RecentProgress
from .ingest.writer import ReportWriter
from .live.broadcaster import Broadcaster
from .policies import PolicyBook, PolicyEngine
from .store import Store
from .views.serialisers import CompactViews

__all__ = ["STORE_THREADS", "Services", "blocking"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class Services:
    """The app's collaborators, kept in ``app.state.services``."""

    store: Store
    live: Broadcaster
    clock: Callable[[], float] = time.time
    stats: dict[str, int] = field(
        default_factory=lambda: {"reports": 0, "duplicates": 0, "statuses": 0, "over_limit": 0}
    )
    """Answers counted by kind (``/healthz``); ``over_limit``: reports refused for the limit on metric names."""
    over_limit_until: dict[int, float] = field(default_factory=dict)
    """Jobs whose last report was refused for the limit on metric names, and until when their next ones
    are answered 429 before their bodies are read (a client that floods refused reports costs little)."""
    progress: RecentProgress = field(default_factory=RecentProgress)
    """Recent progress samples of live jobs, for their ETA."""
    views: CompactViews = field(default_factory=CompactViews)
    """Compact job views for lists, kept per version of each job."""
    health: HealthMonitor = field(default_factory=HealthMonitor)
    """Health trackers of live jobs, fed at ingest and swept for stalls."""
    prices: PriceList = field(default_factory=PriceList)
    """Default prices of a GPU hour, for jobs registered without one."""
    policies: PolicyEngine = field(init=False)
    """The policy layers and the actions they take."""
    writer: ReportWriter = field(init=False)
    """Writes native reports in batches (group commit)."""

    def __post_init__(self) -> None:
        # on the loop when the store need not wait
        self.writer = ReportWriter(self.store.ingest_reports, blocking, write_now=self.store.ingest_reports_nowait)
        self.policies = PolicyEngine(PolicyBook(), self.store, self.live, blocking)
        self.health.metric_of = self.policies.book.metric_of
        self.store.follow_changes(self.forget)

    def forget(self, job_ids: frozenset[int] | None) -> None:
        """Drop what is kept in memory about jobs another process wrote (``None``: about every job): their
        health trackers and progress samples are rebuilt from the store at their next report, as after a
        restart. Called in whatever thread heard of the change (dict operations, atomic under the GIL)."""
        if job_ids is None:
            self.health.forget_all()
            self.progress.clear()
            return
        for job_id in job_ids:
            self.health.forget(job_id)
            self.progress.forget(job_id)


STORE_THREADS = 4
"""Worker threads for store calls: SQLite hands the GIL back on every row, so more threads only
trade it back and forth (measured: the default 40 threads cost 4x the CPU per report of 4)."""
_LIMITERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()


async def blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a store call in a worker thread. A store failure raises :class:`~.store.StoreError` as it is: under a
    route the app's exception handler answers it (503, or 422 for the limit on metric names), and the
    background tasks that call this catch and log it."""
    loop = asyncio.get_running_loop()
    limiter = _LIMITERS.get(loop)
    if limiter is None:
        limiter = _LIMITERS[loop] = anyio.CapacityLimiter(STORE_THREADS)
    call = functools.partial(fn, *args, **kwargs)
    return await anyio.to_thread.run_sync(call, limiter=limiter)
