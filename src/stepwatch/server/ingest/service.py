"""A report's one trip on the server: write → estimates → health → policies → publish.

Every way in takes it: a native report (``POST .../reports``, :func:`ingest_report`), an upstream
Kubeflow status posted to the compatible endpoint, and a TrainJob's ``status.trainerStatus`` that the
Kubernetes runner observes (both :func:`ingest_status`). Once the store has the report, the same steps
follow: the ETA (from the recent progress samples kept in memory), the job's health, its policy
(:func:`review`), and what the live stream publishes (the job, its new points, the events the trip
appended: :mod:`.publish`). Routes parse, authorise and answer with what these return.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple, Protocol

from ...protocol import ENDED_STATES, Command, GpuReading, Report, TrainerStatus, Where
from ..live.broadcaster import Broadcaster
from ..live.publish import publish_events, publish_job, publish_points
from ..policies import PolicyEngine
from ..store import IngestResult, Job, PendingReport, Store
from ..store.job_updates import check_metric_names
from ..store.offload import blocking
from . import health_monitor
from .recent_progress import HORIZON_S, RecentProgress, estimate_due, estimate_from_samples
from .writer import ReportWriter

__all__ = ["Collaborators", "Ingested", "estimate", "ingest_report", "ingest_status", "review"]

_log = logging.getLogger("stepwatch.server")

EtaAndRate = tuple[float | None, float | None]
"""(seconds left, steps per second): what the trip stores of an ETA estimate (:class:`..analysis.eta.Estimate`
holds its reasons too)."""


class Collaborators(Protocol):
    """What a report's trip uses, each named for its step: the app's :class:`~..services.Services` has them
    all (a floor above this one, so it is read through this protocol rather than imported)."""

    @property
    def store(self) -> Store:
        """Where the report is written."""

    @property
    def writer(self) -> ReportWriter:
        """Writes native reports in batches (group commit)."""

    @property
    def progress(self) -> RecentProgress:
        """Recent progress samples of live jobs, for their ETA."""

    @property
    def health(self) -> health_monitor.HealthMonitor:
        """Health trackers of live jobs."""

    @property
    def policies(self) -> PolicyEngine:
        """The policies, reviewed after health."""

    @property
    def live(self) -> Broadcaster:
        """The live stream the trip publishes on."""

    @property
    def clock(self) -> Callable[[], float]:
        """The server's clock."""


class Ingested(NamedTuple):
    """What a native report's trip did: the job as it then stands, whether the report was a duplicate
    (stored before: nothing else happened), and the commands pending for the job, to answer it with (a
    tuple: one is made per report, as :class:`_Reporter`)."""

    job: Job
    duplicate: bool
    commands: tuple[Command, ...]


class _Reporter(NamedTuple):
    """What the health analysis reads of a report beyond what the store made of it (a tuple: one is made
    per report, 0.4 us where a frozen dataclass took 1.7)."""

    rank: int
    step: int | None
    total_steps: int | None
    gpus: Sequence[GpuReading] = ()
    evaluating: float | None = None
    """The seconds the rank says it has been evaluating, ``None`` while it trains."""
    where: Where | None = None
    """Where the rank stands, read from its stack while its step stands (report cores that sample)."""
    activity_shares: Mapping[str, float] | None = None
    host: str = ""


async def ingest_report(svc: Collaborators, job: Job, report: Report) -> Ingested:
    """Store one native report of ``job`` and let it take effect.

    Raises :class:`~..store.MetricLimitError` when the report would take the job over its limit on
    metric names: at once by the job as the caller found it (it may hold fewer names than the store,
    never more, so nothing the store would take is refused, and the writer is spared the rest), else
    by the store, which counts again under the job's lock (replicas, concurrent reports).
    """
    check_metric_names(job, job.last_metrics, (w.name for w in report.metrics), svc.store.max_metric_names)
    now = svc.clock()
    result = await svc.writer.write(PendingReport(job, report, now, await _estimate_for(svc, job, report, now)))
    if result.duplicate:
        return Ingested(result.job, True, result.commands)
    progress = report.progress
    reporter = _Reporter(
        report.identity.rank,
        progress.step,
        progress.total_steps,
        report.gpus,
        progress.evaluating,
        report.where,
        report.activity_shares,
        report.identity.host or "",
    )
    fresh = await _take_effect(svc, result, now, reporter)
    commands = result.commands
    if fresh.policy_fired != result.job.policy_fired:  # its policy queued commands: they go with this answer
        commands = tuple(await blocking(svc.store.pending_commands, job.id))
    return Ingested(fresh, False, commands)


async def ingest_status(svc: Collaborators, job: Job, status: TrainerStatus, now: float) -> Job:
    """Store one upstream ``trainerStatus`` of ``job``, received at ``now``, and let it take effect; the
    job as it then stands.

    The status replaces the job's last one whole, as upstream's status server does (every reader shows
    it as posted); here it is also history (its numeric metrics), progress (``current_step``), and it
    refreshes stepwatch's own ETA, health and policy, and the live stream.
    """
    result = await blocking(svc.store.ingest_status, job, status, now)
    if result.duplicate:
        return result.job
    step = result.job.step
    if step is not None and estimate_due(job, now, step, svc.progress.count(job.id)):
        # the status is in the samples already: estimate from the ones before it, plus it
        eta = await estimate(svc, result.job, step, now, before=now)
        await blocking(svc.store.set_estimate, result.job.id, eta[0], eta[1], now)
        result = replace(result, job=result.job.changed(eta_seconds=eta[0], eta_rate=eta[1], eta_at=now))
    return await _take_effect(svc, result, now, _Reporter(0, step, result.job.total_steps))


async def estimate(svc: Collaborators, job: Job, step: int, now: float, before: float | None = None) -> EtaAndRate:
    """A job's ETA once ``step`` at ``now`` counts, from its recent samples (read from the store once);
    ``before``: only the samples older than that count."""
    since = now - HORIZON_S
    if job.id not in svc.progress:
        svc.progress.load(job.id, await blocking(svc.store.progress_samples, job.id, since))
    samples = svc.progress.samples(job.id, since) or []
    if before is not None:
        samples = [s for s in samples if s[0] < before]
    return estimate_from_samples(job, samples, step, now)


async def review(svc: Collaborators, job: Job, now: float) -> Job:
    """Let the job's policy act; a failure is logged and costs the caller nothing (its data is stored)."""
    try:
        return await svc.policies.review(job, now)
    except Exception:
        _log.exception("the policy review of %s failed; its data is stored all the same", job.key)
        return job


async def _estimate_for(svc: Collaborators, job: Job, report: Report, now: float) -> EtaAndRate | None:
    """The ETA to store with a report when one is due: rank 0's, with a step (its total counts)."""
    step, total = report.progress.step, report.progress.total_steps
    if report.identity.rank != 0 or step is None or not estimate_due(job, now, step, svc.progress.count(job.id)):
        return None
    return await estimate(svc, job if total is None else job.changed(total_steps=total), step, now)


async def _take_effect(svc: Collaborators, result: IngestResult, written_at: float, reporter: _Reporter) -> Job:
    """What follows a stored report: its progress sample, the job's health, its policy, then the live
    stream (the job, the report's points as stored at ``written_at``, the events the trip appended; for
    a report that ended the job its points go first, so that no reader sees the end before them);
    the job as it then stands."""
    job = result.job
    if result.sample is not None:
        svc.progress.add(job.id, result.sample)
    ended = job.state in ENDED_STATES
    if ended:
        svc.progress.forget(job.id)
        # its last points before any update that says it ended (its health's, its policy's, its own): a
        # reader that sees the end has every point already (issue 30)
        publish_points(svc.live, job, result.new_points, written_at)
    now = svc.clock()
    job, health_events = await health_monitor.assess(
        svc.health,
        svc.store,
        blocking,
        result,
        reporter.rank,
        reporter.step,
        reporter.total_steps,
        now,
        reporter.gpus,
        evaluating=reporter.evaluating,
        where=reporter.where,
        activity_shares=reporter.activity_shares,
        host=reporter.host,
    )
    job = await review(svc, job, now)  # its policy's events are published as it acts
    publish_job(svc.live, job, now)
    if not ended:
        publish_points(svc.live, job, result.new_points, written_at)
    publish_events(svc.live, (*result.events, *health_events))
    return job
