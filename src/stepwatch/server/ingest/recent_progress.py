"""The ETA of a job, estimated when rank 0 reports, from its recent progress samples.

The samples of live jobs are kept in memory (:class:`RecentProgress`): read from the store once per
job, then appended at each ingest, so an estimate reads no database row.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable

from ..analysis import estimate_eta
from ..store import Job, ProgressSample, Store

__all__ = [
    "ESTIMATE_EVERY_S",
    "HORIZON_S",
    "YOUNG_EVERY_S",
    "YOUNG_GAP_S",
    "YOUNG_S",
    "YOUNG_SAMPLES",
    "RecentProgress",
    "estimate_due",
    "estimate_for_report",
    "estimate_from_samples",
]

HORIZON_S = 1200.0
"""How much recent progress history the estimate reads: the estimator's 600 s of stepping, with room
for eval pauses (the ETA does not need more, and every report pays for what it reads)."""


ESTIMATE_EVERY_S = 10.0
"""How often a job's ETA is recomputed; in between, views count the last estimate down. Reading the
samples and estimating is most of an ingest's cost, and an ETA does not change much in 10 s."""


YOUNG_S = 120.0
"""In a job's first two minutes its ETA is recomputed every :data:`YOUNG_EVERY_S`..."""

YOUNG_SAMPLES = 64
"""...while it has few samples (estimating is cheap then, and each sample changes the estimate a lot)."""

YOUNG_EVERY_S = 2.0
"""A young job is re-estimated at every report that moved its step, and at least this often..."""

YOUNG_GAP_S = 1.0
"""...but not sooner than this after its last estimate: the samples are kept about 2 s apart
(:class:`RecentProgress`), so a report sooner than that changes only the newest one, and a job that
reports back to back (10 times a second, say) would pay for an estimate at each report. The report
core's default interval (2 s) gets one at each report, as before."""


def estimate_due(job: Job, now: float, step: int | None, samples: int = 0) -> bool:
    """Whether the ETA of a job should be recomputed at a report of ``step``.

    For a job's first reports (young, with fewer than :data:`YOUNG_SAMPLES` ``samples`` kept) at
    every report that moved the step (at most every :data:`YOUNG_GAP_S`), and every
    :data:`YOUNG_EVERY_S`; then every
    :data:`ESTIMATE_EVERY_S`; in between only when the estimate is incomplete (no rate, or no ETA
    although the total is known) and the step moved — a stalled job's heartbeats do not pay for an
    estimate each.
    """
    if job.eta_at is None or job.state == "pending" or now - job.eta_at >= ESTIMATE_EVERY_S:
        return True
    young = (job.started_at is None or now - job.started_at < YOUNG_S) and samples < YOUNG_SAMPLES
    if young and now - job.eta_at >= YOUNG_GAP_S and (step != job.step or now - job.eta_at >= YOUNG_EVERY_S):
        return True
    incomplete = job.eta_rate is None or (job.eta_seconds is None and job.total_steps is not None)
    return incomplete and step != job.step


def estimate_for_report(store: Store, job: Job, step: int, now: float) -> tuple[float | None, float | None]:
    """(seconds left, steps per second) once this report's step is counted, to store with the report.

    A job's own ETA is preferred when it sends one on the native API (it knows its schedule). An ETA
    from an upstream Kubeflow client is left out: this is stepwatch's own estimate, which readers show
    beside the one the client posted (``views.eta_of`` shows that one as posted, and any reported ETA
    while stepwatch has no rate of its own).
    """
    samples = [(s.t, s.step) for s in store.progress_samples(job.id, since=now - HORIZON_S)]
    return estimate_from_samples(job, samples, step, now)


def estimate_from_samples(
    job: Job, samples: list[tuple[float, int]], step: int, now: float
) -> tuple[float | None, float | None]:
    """(seconds left, steps per second) from rank 0's recent ``(time, step)`` samples and this report's step."""
    samples = [*samples, (now, step)]
    reported = job.reported_eta if job.source != "kubeflow" else None
    estimate = estimate_eta(samples, job.total_steps, now=now, reported_eta=reported, reported_at=job.last_report_at)
    return estimate.eta_seconds, estimate.rate


class RecentProgress:
    """Rank 0's recent ``(time, step)`` samples of live jobs, in memory, bounded.

    A job's samples are loaded from the store at its first estimate (:meth:`load`) and appended at
    each ingest (:meth:`add`). They are kept for :data:`HORIZON_S`, about ``min_gap_s`` apart (a
    faster reporter's newest sample replaces the one before, except the sample where a new step
    was first reached, so a plateau keeps its start and its end), in
    two flat arrays per job (16 bytes a sample, about 10 KB for a job reporting every 2 s). At most
    ``max_jobs`` jobs are kept; the least recently reported goes first, and a finished job at once.
    """

    def __init__(self, horizon_s: float = HORIZON_S, min_gap_s: float = 2.0, max_jobs: int = 2000) -> None:
        self.horizon_s = horizon_s
        self.min_gap_s = min_gap_s
        self.max_jobs = max_jobs
        self._jobs: OrderedDict[int, tuple[array[float], array[int]]] = OrderedDict()

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def count(self, job_id: int) -> int:
        """How many samples of a job are kept (0 when none are)."""
        entry = self._jobs.get(job_id)
        return 0 if entry is None else len(entry[0])

    def load(self, job_id: int, samples: Iterable[ProgressSample]) -> None:
        """Start keeping a job's samples, from what the store holds."""
        self._jobs[job_id] = (array("d"), array("q"))
        for sample in samples:
            self.add(job_id, sample)
        while len(self._jobs) > self.max_jobs:
            self._jobs.popitem(last=False)

    def add(self, job_id: int, sample: ProgressSample) -> None:
        """Append a sample of a job whose samples are kept (others wait for their first estimate)."""
        entry = self._jobs.get(job_id)
        if entry is None:
            return
        self._jobs.move_to_end(job_id)
        times, steps = entry
        if times and sample.t < times[-1]:
            return  # out of order: the estimate reads samples in time order
        first_arrival = len(times) >= 2 and steps[-1] != steps[-2] and sample.step == steps[-1]
        if len(times) >= 2 and sample.t - times[-2] < self.min_gap_s and not first_arrival:
            # replace the newest; never the time a step was first reached (the rate is measured from it)
            times[-1], steps[-1] = sample.t, sample.step
        else:
            times.append(sample.t)
            steps.append(sample.step)
        old = bisect_left(times, sample.t - self.horizon_s)
        if old > 64:  # trim in chunks: each trim moves the whole array
            del times[:old]
            del steps[:old]

    def samples(self, job_id: int, since: float) -> list[tuple[float, int]] | None:
        """The samples of a job at or after ``since``, or ``None`` when they are not kept."""
        entry = self._jobs.get(job_id)
        if entry is None:
            return None
        times, steps = entry
        start = bisect_left(times, since)
        return list(zip(times[start:], steps[start:]))

    def forget(self, job_id: int) -> None:
        """Stop keeping a job's samples (it ended, or another process wrote it: they are read again)."""
        self._jobs.pop(job_id, None)

    def clear(self) -> None:
        """Stop keeping any job's samples."""
        self._jobs.clear()
