"""The storage interface of the server, and the records it stores.

One interface, two implementations: the embedded default (:mod:`.sqlite`) and PostgreSQL
(:mod:`.postgres`, for several replicas; imported only when used, psycopg being an extra). Every
method is synchronous and thread-safe; the ASGI app calls them from a worker thread. Records are
plain frozen dataclasses: what the store gives out cannot change behind it.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, ParamSpec, TypeVar

from ...protocol import (
    HEALTH_STATES,
    JOB_SORT_KEYS,
    JOB_STATES,
    Command,
    GpuReading,
    MetricWindow,
    Report,
    TrainerStatus,
)
from .access import ApiToken, AuditEntry

__all__ = [
    "HEALTH_STATES",
    "JOB_STATES",
    "SORT_KEYS",
    "ChangeListener",
    "Compaction",
    "Event",
    "IngestResult",
    "Job",
    "JobFilter",
    "JobState",
    "MetricLimitError",
    "PendingReport",
    "ProgressSample",
    "RankState",
    "SeriesColumns",
    "SeriesPoint",
    "Store",
    "StoreError",
    "health_change_is_event",
]

SORT_KEYS: tuple[str, ...] = JOB_SORT_KEYS
JobState = Literal["pending", "running", "finished", "failed", "stopped"]
P = ParamSpec("P")
T = TypeVar("T")


def health_change_is_event(old: str, new: str) -> bool:
    """Whether a change of health goes on the job's events: every change but the first verdict
    ``healthy`` (``unknown`` to ``healthy`` is the normal start of every job, not news)."""
    return old != new and not (old == "unknown" and new == "healthy")


class StoreError(Exception):
    """The store cannot do what was asked (locked, full, corrupt database): not the caller's fault."""


class MetricLimitError(StoreError):
    """A report would give its job more distinct metric names than :attr:`Store.max_metric_names`:
    the caller's fault (a 422); nothing of the report is stored, what the job had is kept."""

    def __init__(self, message: str, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


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
    gpu_type: str = ""
    """The kind of GPU (``a100``, ``h100``...), for its default price; empty when not said."""
    world_size: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)
    """The last value of every metric (``loss``, ``eval_auc``...)."""
    metric_means: dict[str, float] = field(default_factory=dict)
    """The mean of every metric over its latest window (same keys as :attr:`last_metrics`): the value a
    list shows, steadier than the last batch; a window with no finite value gives its last (NaN or
    ±Inf). Empty for a job last written before schema version 9 (readers then show the last value)."""
    nonfinite_total: int = 0
    eta_seconds: float | None = None
    """Seconds left at ``eta_at``, from the robust recent rate (see ``analysis.eta``)."""
    eta_rate: float | None = None
    eta_at: float | None = None
    health: str = "unknown"
    """One of :data:`HEALTH_STATES`."""
    health_since: float | None = None
    health_evidence: dict[str, Any] = field(default_factory=dict)
    """Why: the metric, window, threshold and what was observed, and a sentence."""
    health_history: list[dict[str, Any]] = field(default_factory=list)
    """Every verdict the job had, oldest first, each with its span (see ``store.health_history``)."""
    policy: dict[str, Any] = field(default_factory=dict)
    """The job's own policy (what it sets over its namespace's; see ``server.policies``)."""
    policy_fired: dict[str, Any] = field(default_factory=dict)
    """Triggers its policy has acted on, each with when, what and why (acted on once per trigger)."""
    trainer_status: dict[str, Any] | None = None
    """The last upstream Kubeflow ``trainerStatus`` as its client posted it (its known fields; strings as
    sent), replaced whole by each accepted status; ``None`` when the job's last word was not one."""

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def changed(self, **updates: Any) -> Job:
        """This job with ``updates`` (field names) changed: ``dataclasses.replace``'s result, made by
        copying the fields rather than through ``__init__`` (a job checks nothing there, and every report
        changes its job once or twice: ``replace`` cost ~15 us a time)."""
        if not updates.keys() <= _JOB_FIELDS:
            return replace(self, **updates)  # its TypeError names the unknown field
        fresh = object.__new__(type(self))
        fresh.__dict__.update(self.__dict__)
        fresh.__dict__.update(updates)
        return fresh


_JOB_FIELDS: frozenset[str] = frozenset(f.name for f in fields(Job))


@dataclass(frozen=True)
class JobFilter:
    """What to list: every field narrows; ``text`` matches a part of the name or namespace."""

    namespace: str | None = None
    namespaces: Sequence[str] | None = None
    """Only these namespaces (``None``: any); what the caller may read."""
    state: Sequence[str] = ()
    health: Sequence[str] = ()
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
    sample: ProgressSample | None = None
    """The progress sample the report added (rank 0's newest report with a step), for the ETA."""
    events: tuple[Event, ...] = ()
    """The events the report appended (the job started or ended, commands acknowledged), oldest first."""


@dataclass(frozen=True)
class PendingReport:
    """A native report waiting to be stored, with its arrival time and the ETA computed for it."""

    job: Job
    report: Report
    now: float
    estimate: tuple[float | None, float | None] | None = None


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
    """The windows of one metric as parallel lists (what charts and downsampling read).

    Entries may be buckets of windows already merged (roll-ups of long series): then
    ``first_steps`` holds each entry's first step and ``windows`` how many windows it merges.
    """

    steps: list[int]
    times: list[float]
    lasts: list[float]
    mins: list[float | None]
    maxs: list[float | None]
    means: list[float | None]
    counts: list[int]
    nonfinites: list[int]
    first_steps: list[int] | None = None
    windows: list[int] | None = None


@dataclass(frozen=True)
class ProgressSample:
    """The step rank 0 reported at a time (the ETA is computed from these)."""

    t: float
    step: int


@dataclass(frozen=True)
class RankState:
    """The newest report of one rank of a job: its step, step time, host and process."""

    rank: int
    run_id: str
    last_seen_at: float
    """Server time of the rank's newest report."""
    step: int | None
    step_time: float | None
    host: str
    pid: int
    gpus: tuple[GpuReading, ...] = ()
    """The GPUs the rank's process sees, as its newest report read them (empty: not read)."""


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


@dataclass
class Compaction:
    """What one retention pass (or a run of them) deleted (see :meth:`Store.compact`)."""

    windows: int = 0
    """Raw windows deleted."""
    rollups: int = 0
    """Level-1 roll-up rows deleted (level 2 keeps what they held)."""
    reports: int = 0
    """Progress reports deleted."""
    series: int = 0
    """Series compacted."""
    more: bool = False
    """The budget ran out: there is more to compact."""
    namespaces_over_quota: list[str] = field(default_factory=list)
    """Namespaces found over their quota of raw windows."""

    def add(self, other: Compaction) -> None:
        """Fold another pass's counts into this one."""
        self.windows += other.windows
        self.rollups += other.rollups
        self.reports += other.reports
        self.series += other.series
        self.more = other.more
        for ns in other.namespaces_over_quota:
            if ns not in self.namespaces_over_quota:
                self.namespaces_over_quota.append(ns)

    @property
    def deleted(self) -> int:
        """Rows deleted in all."""
        return self.windows + self.rollups + self.reports


ChangeListener = Callable[[frozenset[int] | None], None]
"""Told the ids of jobs another process changed in the database (``None``: any job may have changed).
Called in whatever thread heard the change; it must be quick and must not raise."""


class Store(abc.ABC):
    """Where jobs, their history and their events live."""

    max_metric_names: int = 1024
    """Distinct metric names one job may have (the server sets it from ``STEPWATCH_MAX_METRIC_NAMES``):
    every name costs a series, an entry in the job's latest values and in each view of the job."""

    _sinks = threading.local()
    """Per thread, the list :meth:`with_events` gathers appended events into (none: not gathered). Shared
    by the stores of a process: a thread runs one store call at a time."""

    def with_events(self, write: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> tuple[T, list[Event]]:
        """``write(*args, **kwargs)`` (one of this store's writes, such as :meth:`set_state`), and the
        events it appended, oldest first, each as :meth:`events` reads it back: the live stream sends
        them so. Call it in the thread that writes (``blocking(store.with_events, store.set_state, ...)``)."""
        outer: list[Event] | None = getattr(self._sinks, "events", None)
        appended: list[Event] = []
        self._sinks.events = appended
        try:
            result = write(*args, **kwargs)
        finally:
            self._sinks.events = outer
        if outer is not None:  # an enclosing call gets them too (not after an error: they were rolled back)
            outer.extend(appended)
        return result, appended

    def _gathering(self) -> list[Event] | None:
        """Where the events this thread's write appends go (``None``: nobody asked)."""
        sink: list[Event] | None = getattr(self._sinks, "events", None)
        return sink

    def follow_changes(self, listener: ChangeListener) -> None:  # noqa: B027 - optional, not abstract
        """Tell ``listener`` which jobs other processes change (PostgreSQL replicas; on SQLite, another
        program that wrote the file), so that what was kept in memory about them is dropped. A store that
        is its database's only writer never calls it."""

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
        policy: dict[str, Any] | None = None,
        gpu_type: str = "",
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

    def cached_job(self, namespace: str, name: str) -> Job | None:
        """The latest attempt of a job if the store holds it in memory (no I/O: callable from the event loop)."""
        return None

    def cached_token_hash(self, job_id: int) -> str | None:
        """A job's token hash if the store holds it in memory (no I/O)."""
        return None

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

    def ingest_reports(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError]:
        """Store several reports, in order; each gets its result or its own error.

        Stores that can write a batch in one transaction override this (the server sends every
        report that arrived while the previous batch was being written).
        """
        results: list[IngestResult | StoreError] = []
        for item in batch:
            try:
                results.append(self.ingest_report(item.job, item.report, item.now, item.estimate))
            except StoreError as exc:
                results.append(exc)
        return results

    def ingest_reports_nowait(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError] | None:
        """``ingest_reports`` when it can be done at once, without waiting for a lock or the network;
        ``None`` (nothing written) when it cannot.

        The server calls it on its event loop before handing a batch to a worker thread: where a write
        is a few local file operations (the embedded SQLite store), the thread hop and the wait for the
        GIL after every statement cost more than the write. Stores that wait on a network never can:
        this default says so.
        """
        return None

    @abc.abstractmethod
    def ingest_status(self, job: Job, status: TrainerStatus, now: float) -> IngestResult:
        """Store an upstream Kubeflow status as progress and history."""

    @abc.abstractmethod
    def set_state(self, job: Job, state: JobState, now: float, reason: str = "", exit_code: int | None = None) -> Job:
        """Move a job to a state (the local runner records how its process ended)."""

    @abc.abstractmethod
    def set_health(self, job_id: int, health: str, since: float | None, evidence: dict[str, Any], now: float) -> Job:
        """Record a job's health (a change of health is also an event)."""

    @abc.abstractmethod
    def set_estimate(self, job_id: int, eta_seconds: float | None, rate: float | None, now: float) -> None:
        """Keep the latest ETA of a job with the job."""

    @abc.abstractmethod
    def series_columns(self, job_id: int, metric: str) -> SeriesColumns:
        """Every stored window of a metric, in step order, as parallel columns."""

    def history_columns(self, job_id: int, metric: str, max_points: int) -> SeriesColumns:
        """A series to downsample to ``max_points``: every window, or fewer rows that merge them.

        Stores that keep roll-ups of long series override this, so that a read touches
        O(``max_points``) rows whatever the length of the series.
        """
        return self.series_columns(job_id, metric)

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
    def ranks(self, job_id: int) -> list[RankState]:
        """The newest report of every rank of a job, by rank."""

    @abc.abstractmethod
    def add_command(self, job: Job, kind: str, reason: str, now: float, actor: str = "") -> Command:
        """Queue a command for the job's reporter (an event ``command``; when ``actor`` is given, who
        asked is in the event and an audit entry)."""

    @abc.abstractmethod
    def set_policy(self, job_id: int, policy: dict[str, Any], now: float, message: str, actor: str = "") -> Job:
        """Replace a job's own policy (an event ``policy_set`` with ``message``; ``actor`` as for commands)."""

    @abc.abstractmethod
    def act(
        self,
        job_id: int,
        trigger: str,
        fired: dict[str, Any],
        message: str,
        commands: tuple[tuple[str, str], ...],
        now: float,
    ) -> tuple[Job, list[Command]]:
        """Record that the job's policy acted on ``trigger``, atomically: ``fired`` under the trigger in
        ``policy_fired``, an event ``policy`` (``message``, ``fired`` as data), and the commands
        ``(kind, reason)`` queued in order. Returns the job and the queued commands."""

    @abc.abstractmethod
    def rearm(self, job_id: int, triggers: tuple[str, ...], now: float) -> Job:
        """Forget that the policy acted on these triggers (their condition ended: the next one acts again)."""

    @abc.abstractmethod
    def namespace_policies(self) -> dict[str, dict[str, Any]]:
        """Every namespace's policy, by namespace."""

    @abc.abstractmethod
    def set_namespace_policy(self, namespace: str, policy: dict[str, Any] | None, now: float, actor: str = "") -> None:
        """Replace (``None``: remove) a namespace's policy (an audit entry when ``actor`` is given)."""

    @abc.abstractmethod
    def pending_commands(self, job_id: int) -> list[Command]:
        """Commands not acknowledged yet."""

    @abc.abstractmethod
    def events(
        self, *, job_id: int | None = None, namespace: str | None = None, after: int = 0, limit: int = 100
    ) -> list[Event]:
        """Events after an id, oldest first."""

    # ------------------------------------------------------------------------ access (tokens, audit)

    @abc.abstractmethod
    def create_token(self, token: ApiToken, token_hash: str, entry: AuditEntry) -> None:
        """Store a new API token by the hash of its secret, with the audit entry of its creation."""

    @abc.abstractmethod
    def api_token(self, token_hash: str) -> ApiToken | None:
        """The API token with this secret's hash (revoked and expired ones too), cached where it can be:
        a revocation is seen at once, on every replica."""

    def cached_api_token(self, token_hash: str) -> ApiToken | None:
        """The API token with this hash when the store holds it in memory and trusts it (no I/O)."""
        return None

    @abc.abstractmethod
    def api_tokens(self) -> list[ApiToken]:
        """Every API token, oldest first."""

    @abc.abstractmethod
    def revoke_token(self, token_id: str, now: float, entry: AuditEntry) -> ApiToken | None:
        """Revoke a token (``None`` when there is none with that id); revoking twice changes nothing."""

    @abc.abstractmethod
    def record_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append an entry to the audit log; returns it with its id."""

    @abc.abstractmethod
    def audit_log(
        self,
        *,
        namespaces: tuple[str, ...] | None = None,
        name: str | None = None,
        include_global: bool = True,
        after: int = 0,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """Audit entries after an id, oldest first: of these namespaces (``None``: any), of job ``name``,
        with or without the server-wide ones."""

    @abc.abstractmethod
    def compact(
        self, before: float | None, quotas: Mapping[str, int] | None = None, budget: int = 20_000
    ) -> Compaction:
        """One bounded retention pass (see :mod:`.retention`): raw windows (and level-1 roll-up rows)
        whose roll-ups ended before ``before``, then the oldest raw windows of namespaces over their
        quota (``"*"``: every namespace), at most ``budget`` rows deleted; call again while ``more``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""
