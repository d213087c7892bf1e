"""The app's collaborators (:class:`Services`), kept in ``app.state.services``.

The routes, the Kubernetes runner and the app factory take them from here; the ingest service below them reads
the ones it uses through its own :class:`~.ingest.service.Collaborators`, which this bag satisfies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .analysis.cost import PriceList
from .ingest.health_monitor import HealthMonitor
from .ingest.recent_progress import RecentProgress
from .ingest.writer import LINGER_GAP_S, LINGER_S, ReportWriter
from .live.broadcaster import Broadcaster
from .policies import PolicyBook, PolicyEngine
from .store import Store
from .store.offload import blocking
from .views.serialisers import CompactViews

__all__ = ["Services"]

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
    write_linger_s: float = LINGER_S
    """How long the writer's batches linger for more reports at a fleet's pace (``0``: never)."""

    def __post_init__(self) -> None:
        # on the loop when the store need not wait
        self.writer = ReportWriter(
            self.store.ingest_reports,
            blocking,
            write_now=self.store.ingest_reports_nowait,
            linger=self.write_linger_s,
            linger_gap=LINGER_GAP_S * self.write_linger_s / LINGER_S,
        )
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
