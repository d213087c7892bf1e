"""Health of live jobs: one :class:`~.health.HealthTracker` per job, fed at ingest, swept for stalls.

The analysis is pure (:mod:`.health`); this module keeps a tracker per live job, feeds it
each report as it is stored (the primary metric's windows from rank 0, every rank's step), asks
it for a verdict, and records a change of health in the store (an event with the evidence) and on
the live stream. A stalled job sends nothing, so :meth:`HealthMonitor.sweep` asks every tracked
live job again every few seconds. After a restart, a job's tracker is rebuilt from its stored
history the first time the job is seen.

Memory is bounded: at most ``max_jobs`` trackers, the least recently reported going first, and a
job's tracker is dropped when the job ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from ...protocol import ENDED_STATES, GpuReading, MetricWindow, Where
from ..analysis.health import HealthParams, HealthTracker, Verdict
from ..live.broadcaster import Broadcaster
from ..live.publish import publish_events, publish_job
from ..store import Event, IngestResult, Job, JobFilter, SeriesColumns, Store
from ..store.offload import Offload

__all__ = [
    "EVAL_METRICS",
    "LR_METRICS",
    "PRIMARY_METRICS",
    "REPLAY_POINTS",
    "SWEEP_EVERY_S",
    "UNTRACKED_SILENCE_S",
    "HealthMonitor",
    "HealthUpdate",
    "assess",
    "final_judgement",
    "primary_metric",
    "record",
    "second_metrics",
    "sweep_forever",
    "track",
]

_log = logging.getLogger("stepwatch.server")

GPU_IDLE_PERCENT = 5.0
"""A rank whose GPUs all run kernels less than this share of the time is idle."""

UNTRACKED_SILENCE_S = 120.0
"""A running job that has no tracker is stalled after this much silence (see :meth:`HealthMonitor.silence`)."""

SWEEP_EVERY_S = 5.0
"""How often live jobs are judged again without a report (a stall is seen within this much)."""

REWRITE_BAD_S = 30.0
"""A bad verdict's evidence (stalled, not learning, diverging, straggling) is rewritten at most this often
while it holds: how long the step has stood, the latest value (issue 30: evidence follows the job)."""

REWRITE_CALM_S = 300.0
"""A calm verdict's evidence (healthy, unknown) at most this often: its words change with every block."""

REPLAY_POINTS = 2000
"""Stored windows (merged when more) replayed into a tracker after a restart."""


PRIMARY_METRICS = ("loss", "train_loss", "train/loss")
"""The metric health follows, the first of these a job logs (``loss`` unless the job names another)."""


def primary_metric(names: Iterable[str]) -> str | None:
    """The metric to follow among the names a job logs, or ``None`` (health is then unknown)."""
    found = set(names)
    return next((m for m in PRIMARY_METRICS if m in found), None)


LR_METRICS = ("learning_rate", "lr", "train/learning_rate", "train/lr")
"""The learning rate health reads beside the loss, the first of these a job logs (else the first
``lr-*`` name in order: Lightning's ``LearningRateMonitor``)."""

EVAL_METRICS = (
    "eval_loss",
    "val_loss",
    "eval/loss",
    "val/loss",
    "validation_loss",
    "eval_accuracy",
    "val_accuracy",
    "val_acc",
    "eval/accuracy",
)
"""The evaluation metric health reads beside the loss, the first of these a job logs."""


def second_metrics(names: Iterable[str]) -> tuple[str | None, str | None]:
    """The learning rate and the evaluation metric to read among the names a job logs (``None``: none)."""
    found = set(names)
    lr = next((m for m in LR_METRICS if m in found), None)
    if lr is None:
        lr = min((m for m in found if m.startswith("lr-")), default=None)
    return lr, next((m for m in EVAL_METRICS if m in found), None)


@lru_cache(maxsize=1024)
def _second_of(names: tuple[str, ...]) -> tuple[str | None, str | None]:
    """:func:`second_metrics` of a report's names, remembered: a job's reports bring the same names each time."""
    return second_metrics(names)


@dataclass(frozen=True)
class HealthUpdate:
    """A verdict that differs from what the store holds for the job: to be recorded."""

    job: Job
    verdict: Verdict


class HealthMonitor:
    """Trackers of live jobs (see the module docstring)."""

    def __init__(
        self,
        params: HealthParams | None = None,
        max_jobs: int = 5000,
        metric_of: Callable[[Job], tuple[str | None, str]] | None = None,
    ) -> None:
        self.params = params or HealthParams()
        self.max_jobs = max_jobs
        self.metric_of = metric_of or (lambda job: (None, "min"))
        """The metric a job's policy names for health, and its direction (``min``: lower is better)."""
        self._trackers: OrderedDict[int, tuple[str | None, HealthTracker]] = OrderedDict()
        self._failed: set[int] = set()
        self._gpus: dict[int, dict[int, float]] = {}
        """Per tracked job, per rank: the mean GPU utilisation of its newest report (percent)."""
        self._written: dict[int, float] = {}
        """Per tracked job: when its health or evidence was last handed to the store (server time)."""

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._trackers

    def __len__(self) -> int:
        return len(self._trackers)

    def start(
        self,
        job: Job,
        history: SeriesColumns | None,
        metric: str | None,
        direction: str = "min",
        second: dict[str, SeriesColumns] | None = None,
    ) -> None:
        """Track a job, replaying its stored windows of ``metric`` (``None``: it logs no primary metric yet)
        and of its learning rate and evaluation metric (``second``, by name), in the order they arrived."""
        tracker = HealthTracker(self.params, metric=metric or "loss", direction=direction)
        events: list[tuple[float, int, str, int]] = []  # (time, order within a report, series, index)
        if history is not None:
            events += [(t, 0, "", i) for i, t in enumerate(history.times)]
        for name, columns in (second or {}).items():
            events += [(t, 1, name, i) for i, t in enumerate(columns.times)]
        events.sort()
        for _, _, name, i in events:
            if not name:
                assert history is not None
                first_steps = history.first_steps or history.steps
                # each window also counts as a report of rank 0 at its step (as HealthTracker.replay): the
                # plan's pace, and so the plateau window, is learnt as it was live
                tracker.observe_progress(history.times[i], 0, history.steps[i], job.total_steps)
                tracker.observe_window(
                    history.times[i],
                    history.steps[i],
                    history.lasts[i],
                    history.mins[i],
                    history.maxs[i],
                    history.means[i],
                    history.counts[i],
                    history.nonfinites[i],
                    first_steps[i],
                )
            else:
                assert second is not None
                c = second[name]
                _observe_second(tracker, name, c.times[i], c.steps[i], c.lasts[i])
        if job.last_report_at is not None:
            tracker.observe_progress(job.last_report_at, 0, job.step, job.total_steps)
        self._trackers[job.id] = (metric, tracker)
        while len(self._trackers) > self.max_jobs:
            gone, _ = self._trackers.popitem(last=False)
            self._gpus.pop(gone, None)
            self._written.pop(gone, None)

    def observe(
        self,
        result: IngestResult,
        rank: int,
        step: int | None,
        now: float,
        total_steps: int | None = None,
        gpus: Sequence[GpuReading] = (),
        *,
        evaluating: float | None = None,
        where: Where | None = None,
        activity_shares: Mapping[str, float] | None = None,
        host: str = "",
    ) -> HealthUpdate | None:
        """Feed one stored report; the update to record when the job's health changed (``evaluating``:
        the seconds the rank says it has been evaluating, ``None`` while it trains; ``where`` and
        ``activity_shares``: where the rank stands, read from its stack, see :mod:`.stall`; ``host``: the
        host the rank reports from, to name a straggler's)."""
        job = result.job
        entry = self._trackers.get(job.id)
        if entry is None:
            return None
        busy = None
        if gpus:  # most reports carry none: no list built for them
            readings = [g.utilization for g in gpus if g.utilization is not None]
            if readings:
                busy = sum(readings) / len(readings)
                self._gpus.setdefault(job.id, {})[rank] = busy
        self._trackers.move_to_end(job.id)
        metric, tracker = entry
        points = result.new_points
        if rank == 0 and points:  # a heartbeat (every other rank's report) carries no windows
            if metric is None:
                metric = primary_metric(w.name for w in points)
                if metric is not None:
                    tracker = HealthTracker(self.params, metric=metric, direction=self.metric_of(job)[1])
                    self._trackers[job.id] = (metric, tracker)
            if metric is not None:
                self._observe_windows(tracker, metric, points, now)
        tracker.observe_progress(now, rank, step, total_steps, evaluating=evaluating)
        if activity_shares:
            tracker.observe_shares(rank, activity_shares, host)
        if where is not None:
            frames = [str(f) for f in where.frames]
            tracker.observe_where(now, rank, step, where.activity, where.stood_seconds, where.detail, frames)
        if busy is not None:
            tracker.observe_gpu(rank, busy)
        return self._judge(job, tracker, metric, now)

    @staticmethod
    def _observe_windows(tracker: HealthTracker, metric: str, points: Sequence[MetricWindow], now: float) -> None:
        """Rank 0's windows: the primary metric's, then its learning rate's and evaluation metric's (the
        order a replay gives them); the names of a report are looked at once."""
        names = tuple([w.name for w in points])
        for w in points:
            if w.name == metric:
                tracker.observe_window(
                    now, w.last_step, w.last, w.min, w.max, w.mean, w.count, w.nonfinite, w.first_step
                )
        lr, evaluation = _second_of(names)
        if lr is None and evaluation is None:
            return
        for w in points:  # after the loss, as a replay orders them
            if w.name in (lr, evaluation):
                _observe_second(tracker, w.name, now, w.last_step, w.last)

    def sweep(self, jobs: Iterable[Job], now: float) -> list[HealthUpdate]:
        """Ask every tracked job again (a stalled job sends nothing); the changes to record."""
        return [u for u in (self.judge(job, now) for job in jobs) if u is not None]

    def silence(self, job: Job, now: float) -> HealthUpdate | None:
        """A running job without a tracker (not heard from since this server started, or evicted): stalled
        once it has been silent for :data:`UNTRACKED_SILENCE_S` (its usual pace is not known, so the
        limit is generous); no replay of its history, so a restart with many silent jobs costs little.
        Its next report tracks it again, and judges it afresh."""
        if job.state != "running" or job.last_report_at is None or job.health == "stalled":
            return None
        limit = max(UNTRACKED_SILENCE_S, self.params.stall_floor_s)
        silent = now - job.last_report_at
        if silent < limit:
            return None
        evidence = {
            "metric": "reports",
            "window": {"seconds": round(silent)},
            "threshold": limit,
            "observed": round(silent),
            "since": job.last_report_at,
            "message": f"no report for {silent:.0f} s (more than {limit:.0f} s) while the job is running",
        }
        return HealthUpdate(job, Verdict("stalled", job.last_report_at, evidence))

    def judge(self, job: Job, now: float) -> HealthUpdate | None:
        """The update to record for a tracked job at ``now`` (``None``: no change, or not tracked)."""
        entry = self._trackers.get(job.id)
        return None if entry is None else self._judge(job, entry[1], entry[0], now)

    def _judge(self, job: Job, tracker: HealthTracker, metric: str | None, now: float) -> HealthUpdate | None:
        live = job.state not in ENDED_STATES
        # a job that ends stalled (a hung job the runner killed, a last report with the step still
        # standing) ended stalled: its stall is judged once more at its last report, and holds unless
        # the step moved; an ended job is never newly alarmed about its silence
        verdict = tracker.verdict(now, live=live or job.health in ("stalled", "straggling"))
        if metric is None and verdict.state in ("not_learning", "diverging"):
            return None  # no primary metric: never a false alarm about learning
        if not live:
            self.forget(job.id)
            verdict = final_judgement(verdict, job, tracker.metric)
        if verdict.state == "stalled":
            verdict = self._with_gpus(job.id, verdict)
        if verdict.state == job.health and not self._rewrite_due(job, verdict, now, live):
            return None  # the same health, and its evidence was written recently enough
        self._written[job.id] = now
        return HealthUpdate(job, verdict)

    def _rewrite_due(self, job: Job, verdict: Verdict, now: float, live: bool) -> bool:
        """Whether the evidence of an unchanged health is rewritten now: it follows the job (how long it
        has stood, the latest value, the final judgement at the end), at most every
        :data:`REWRITE_BAD_S` for a bad state and :data:`REWRITE_CALM_S` for a calm one, at once at the end."""
        said = job.health_evidence.get("message") if job.health_evidence else None
        if verdict.evidence.get("message") == said:
            return False
        if not live:
            return True
        every = REWRITE_CALM_S if verdict.state in ("healthy", "unknown") else REWRITE_BAD_S
        last = self._written.get(job.id)
        if last is None:
            self._written[job.id] = now  # first seen by this server: counted from now
            return False
        return now - last >= every

    def _with_gpus(self, job_id: int, verdict: Verdict) -> Verdict:
        """A stall's evidence, with what the GPUs were doing when the ranks last reported them."""
        by_rank = self._gpus.get(job_id)
        if not by_rank:
            return verdict
        mean = sum(by_rank.values()) / len(by_rank)
        idle = max(by_rank.values()) < GPU_IDLE_PERCENT
        evidence = {
            **verdict.evidence,
            "gpu_utilization": {str(r): round(u, 1) for r, u in sorted(by_rank.items())},
            "gpus_idle": idle,
        }
        said = str(verdict.evidence.get("message") or "stalled")
        if idle:
            evidence["message"] = f"{said}; its GPUs are idle ({mean:.0f}% utilisation)"
        else:
            evidence["message"] = (
                f"{said}; its GPUs are still busy ({mean:.0f}% utilisation: a slow step, or a hang in a kernel)"
            )
        return replace(verdict, evidence=evidence)

    def note_failure(self, job_id: int) -> bool:
        """Remember that judging a job failed; whether this is its first failure (worth a log line)."""
        first = job_id not in self._failed
        self._failed.add(job_id)
        if len(self._failed) > self.max_jobs:
            self._failed.clear()
        return first

    def forget(self, job_id: int) -> None:
        """Stop tracking a job."""
        self._trackers.pop(job_id, None)
        self._gpus.pop(job_id, None)
        self._written.pop(job_id, None)

    def forget_all(self) -> None:
        """Stop tracking every job (each is tracked again, from what is stored, at its next report)."""
        self._trackers.clear()
        self._gpus.clear()
        self._written.clear()


_STATE_WORDS = {"not_learning": "not learning"}


def final_judgement(verdict: Verdict, job: Job, metric: str) -> Verdict:
    """An ended job's verdict in words of an end (issue 30: a final judgement, not "too few windows yet"):
    'finished at step 2,000, healthy to its end: loss level 0.41, ...'."""
    evidence = dict(verdict.evidence)
    said = str(evidence.get("message") or "")
    if said.startswith(("finished", "failed", "stopped")):
        return verdict  # judged at its end already
    where = f" at step {job.step:,}" if job.step is not None else ""
    ended = f"{job.state}{where}"
    state = verdict.state
    if state == "unknown":
        message = f"{ended}; no value of {metric} arrived, so its learning was never judged"
    elif state == "healthy":
        if "too few windows" in said or "judged after the warm-up" in said:
            said = f"{metric} stayed finite; it ended before learning could be judged (after a warm-up and a window)"
        message = f"{ended}, healthy to its end: {said}"
    else:
        message = f"{ended}, {_STATE_WORDS.get(state, state)} at its end: {said}"
    evidence["message"] = message
    evidence["final"] = True
    return replace(verdict, evidence=evidence)


def _observe_second(tracker: HealthTracker, name: str, t: float, step: int, value: float) -> None:
    """Feed a learning rate or an evaluation metric's window (its newest value) to a tracker."""
    if name in EVAL_METRICS:
        tracker.observe_eval(t, step, value, name)
    else:
        tracker.observe_lr(t, step, value)


async def assess(
    monitor: HealthMonitor,
    store: Store,
    offload: Offload,
    result: IngestResult,
    rank: int,
    step: int | None,
    total_steps: int | None,
    now: float,
    gpus: Sequence[GpuReading] = (),
    *,
    evaluating: float | None = None,
    where: Where | None = None,
    activity_shares: Mapping[str, float] | None = None,
    host: str = "",
) -> tuple[Job, list[Event]]:
    """Judge a job after one of its reports was stored; the job as it now stands, and the event its
    change of health appended (none when its health did not change, or changed from nothing).

    A job seen for the first time (new, or after a restart) is tracked from what is stored, this report
    included. A failure of the analysis is logged (once per job) and costs the report nothing: it was
    stored already, and the job's tracker starts afresh on its next report.
    """
    job = result.job
    try:
        if job.id in monitor:
            update = monitor.observe(
                result,
                rank,
                step,
                now,
                total_steps,
                gpus,
                evaluating=evaluating,
                where=where,
                activity_shares=activity_shares,
                host=host,
            )
        elif job.state not in ENDED_STATES:
            await track(monitor, store, offload, job)
            update = monitor.judge(job, now)
        else:
            return job, []
        if update is None:
            return job, []
        v = update.verdict
        stored: tuple[Job, list[Event]] = await offload(
            store.with_events, store.set_health, job.id, v.state, v.since, v.evidence, now
        )
        return stored
    except Exception:
        monitor.forget(job.id)
        if monitor.note_failure(job.id):
            _log.exception("health analysis of %s failed; its reports are stored all the same", job.key)
        return job, []


async def track(monitor: HealthMonitor, store: Store, offload: Offload, job: Job) -> None:
    """Start tracking a job, replaying what it has stored of its primary metric."""
    named, direction = monitor.metric_of(job)
    metric = named or primary_metric(job.last_metrics)
    history = None
    second: dict[str, SeriesColumns] = {}
    if metric is not None:
        history = await offload(store.history_columns, job.id, metric, REPLAY_POINTS)
        for name in second_metrics(job.last_metrics):
            if name is not None:
                second[name] = await offload(store.history_columns, job.id, name, REPLAY_POINTS)
    if job.id not in monitor:  # another request may have started it meanwhile
        monitor.start(job, history, metric, direction, second)


async def record(update: HealthUpdate, store: Store, live: Broadcaster, offload: Offload, now: float) -> Job:
    """Store a change of health and publish it: the job, then its event (none for a job's first ``healthy``)."""
    v = update.verdict
    stored: tuple[Job, list[Event]] = await offload(
        store.with_events, store.set_health, update.job.id, v.state, v.since, v.evidence, now
    )
    job, events = stored
    publish_job(live, job, now)
    publish_events(live, events)
    return job


Review = Callable[[Job, float], Awaitable[Job]]
"""What else looks at every live job in a sweep (the policies): the job in, the job as it then stands out."""


async def sweep_forever(
    monitor: HealthMonitor,
    store: Store,
    live: Broadcaster,
    offload: Offload,
    clock: Callable[[], float],
    every: float = SWEEP_EVERY_S,
    review: Review | None = None,
) -> None:
    """Judge every live job again every ``every`` seconds (until cancelled); one failure is logged, not fatal."""
    while True:
        await asyncio.sleep(every)
        try:
            await sweep_once(monitor, store, live, offload, clock(), review)
        except asyncio.CancelledError:
            raise
        except Exception:
            _log.exception("health sweep failed; the next one runs in %.0f s", every)


async def sweep_once(
    monitor: HealthMonitor,
    store: Store,
    live: Broadcaster,
    offload: Offload,
    now: float,
    review: Review | None = None,
) -> int:
    """One sweep: judge every live job again (tracked ones by their tracker, the others by their silence
    alone), record the changes of health, then ``review`` every live job; how many changes of health."""
    jobs: list[Job] = await offload(store.jobs, JobFilter(state=("pending", "running"), limit=10_000))
    updates = monitor.sweep(jobs, now)
    updates += [u for u in (monitor.silence(job, now) for job in jobs if job.id not in monitor) if u is not None]
    changed = {}
    for update in updates:
        changed[update.job.id] = await record(update, store, live, offload, now)
    if review is not None:
        for job in jobs:
            try:
                await review(changed.get(job.id, job), now)
            except Exception:
                _log.exception("the review of %s failed; the sweep goes on", job.key)
    return len(updates)
