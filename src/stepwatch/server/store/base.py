"""The storage interface of the server, and the records it stores.

One interface, two implementations: the embedded default (:mod:`.sqlite`) and PostgreSQL (a later
milestone). Every method is synchronous and thread-safe; the ASGI app calls them from a worker
thread. Records are plain frozen dataclasses: what the store gives out cannot change behind it.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ...protocol import JOB_SORT_KEYS, JOB_STATES, Command, MetricWindow, Report, TrainerStatus

__all__ = [
    "JOB_STATES",
    "SORT_KEYS",
    "Event",
    "IngestResult",
    "Job",
    "JobFilter",
    "JobState",
    "ProgressSample",
    "SeriesColumns",
    "SeriesPoint",
    "Store",
    "StoreError",
]

SORT_KEYS: tuple[str, ...] = JOB_SORT_KEYS
JobState = Literal["pending", "running", "finished", "failed", "stopped"]
FINAL_STATES = frozenset({"finished", "failed", "stopped"})


class StoreError(Exception):
    """The store cannot do what was asked (locked, full, corrupt database): not the caller's fault."""


@dataclass(frozen=True)
class Job:
    """One attempt of a job, as stored (derived figures such as the ETA are computed on read)."""

    id: int
    namespace: str
    name: str
    attempt: int
    state: JobState
    created_at: float
    updated_at: float
    started_at: float | None = None
    finished_at: float | None = None
    last_report_at: float | None = None
    step: int | None = None
    total_steps: int | None = None
    epoch: float | None = None
    total_epochs: float | None = None
    samples: int | None = None
    steps_per_second: float | None = None
    samples_per_second: float | None = None
    reported_eta: float | None = None
    reported_progress: float | None = None
    reason: str = ""
    exit_code: int | None = None
    source: str = "native"
    gpus: float = 0.0
    gpu_hour_cost: float = 0.0
    world_size: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)
    """The last value of every metric (``loss``, ``eval_auc``...)."""
    nonfinite_total: int = 0
    eta_seconds: float | None = None
    """Seconds left at ``eta_at``, from the robust recent rate (see ``analysis.eta``)."""
    eta_rate: float | None = None
    eta_at: float | None = None

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class JobFilter:
    """What to list: every field narrows; ``text`` matches a part of the name or namespace."""

    namespace: str | None = None
    state: Sequence[str] = ()
    text: str | None = None
    min_progress: float | None = None
    """Percent, 0..100."""
    max_progress: float | None = None
    all_attempts: bool = False
    sort: str = "updated"
    """One of :data:`SORT_KEYS`."""
    descending: bool = True
    limit: int = 1000
    offset: int = 0


@dataclass(frozen=True)
class IngestResult:
    """What an ingest did: whether the report was new, and the commands pending for the job."""

    job: Job
    duplicate: bool
    commands: tuple[Command, ...] = ()
    new_points: tuple[MetricWindow, ...] = ()


@dataclass(frozen=True)
class SeriesPoint:
    """One stored window of one metric, with the time it arrived."""

    step: int
    t: float
    last: float
    min: float | None
    max: float | None
    mean: float | None
    count: int
    nonfinite: int


@dataclass(frozen=True)
class SeriesColumns:
    """The windows of one metric as parallel lists (what charts and downsampling read)."""

    steps: list[int]
    times: list[float]
    lasts: list[float]
    mins: list[float | None]
    maxs: list[float | None]
    means: list[float | None]
    counts: list[int]
    nonfinites: list[int]


@dataclass(frozen=True)
class ProgressSample:
    """The step rank 0 reported at a time (the ETA is computed from these)."""

    t: float
    step: int


@dataclass(frozen=True)
class Event:
    """Something that happened to a job: registered, started, finished, command sent..."""

    id: int
    job_id: int
    namespace: str
    name: str
    t: float
    kind: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)


class Store(abc.ABC):
    """Where jobs, their history and their events live."""

    @abc.abstractmethod
    def register(
        self,
        namespace: str,
        name: str,
        *,
        token_hash: str,
        now: float,
        total_steps: int | None = None,
        total_epochs: float | None = None,
        params: dict[str, Any] | None = None,
        gpus: float = 0.0,
        gpu_hour_cost: float = 0.0,
        source: str = "native",
        supersede: bool = False,
    ) -> Job:
        """Create a job, or a new attempt when the name's latest attempt has ended.

        Raises :class:`KeyError` when the latest attempt is still pending or running, unless
        ``supersede`` asks to mark it failed and start a new attempt.
        """

    @abc.abstractmethod
    def job(self, namespace: str, name: str, attempt: int | None = None) -> Job | None:
        """The latest attempt of a job (or a given attempt)."""

    @abc.abstractmethod
    def job_by_id(self, job_id: int) -> Job | None:
        """A job by its id."""

    @abc.abstractmethod
    def token_hash(self, job_id: int) -> str:
        """The hash of the write token of a job."""

    @abc.abstractmethod
    def jobs(self, where: JobFilter) -> list[Job]:
        """Jobs matching a filter, newest first."""

    @abc.abstractmethod
    def count_jobs(self, where: JobFilter) -> int:
        """How many jobs match a filter."""

    @abc.abstractmethod
    def ingest_report(
        self, job: Job, report: Report, now: float, estimate: tuple[float | None, float | None] | None = None
    ) -> IngestResult:
        """Store a native report once (by run, rank and seq) and update the job's state and ETA."""

    @abc.abstractmethod
    def ingest_status(self, job: Job, status: TrainerStatus, now: float) -> IngestResult:
        """Store an upstream Kubeflow status as progress and history."""

    @abc.abstractmethod
    def set_state(self, job: Job, state: JobState, now: float, reason: str = "", exit_code: int | None = None) -> Job:
        """Move a job to a state (the local runner records how its process ended)."""

    @abc.abstractmethod
    def set_estimate(self, job_id: int, eta_seconds: float | None, rate: float | None, now: float) -> None:
        """Keep the latest ETA of a job with the job."""

    @abc.abstractmethod
    def series_columns(self, job_id: int, metric: str) -> SeriesColumns:
        """Every stored window of a metric, in step order, as parallel columns."""

    @abc.abstractmethod
    def series(self, job_id: int, metric: str) -> list[SeriesPoint]:
        """Every stored window of a metric, in step order."""

    @abc.abstractmethod
    def metric_names(self, job_id: int) -> list[str]:
        """The metrics a job has reported."""

    @abc.abstractmethod
    def progress_samples(self, job_id: int, since: float | None = None) -> list[ProgressSample]:
        """Rank 0's (time, step) samples, oldest first."""

    @abc.abstractmethod
    def add_command(self, job: Job, kind: str, reason: str, now: float) -> Command:
        """Queue a command for the job's reporter."""

    @abc.abstractmethod
    def pending_commands(self, job_id: int) -> list[Command]:
        """Commands not acknowledged yet."""

    @abc.abstractmethod
    def events(
        self, *, job_id: int | None = None, namespace: str | None = None, after: int = 0, limit: int = 100
    ) -> list[Event]:
        """Events after an id, oldest first."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""
