"""Prometheus exposition of every job: ``GET /metrics`` for Grafana dashboards and Alertmanager rules.

Per live job (pending or running, latest attempt; labels ``job_namespace`` and ``job_name``): progress
ratio, step and total, ETA, steps per second, age of the last report, health (one series per state,
1 for the current one), where a verdict stands (the stalled rank and what it is doing, the straggler
and its host), cost rate and spent, and the last value of each metric. Per namespace, over
every job: how many are in each state and health, and the cost figures summed. Ended jobs leave the
per-job series (their totals stay in the namespace sums), so the series count follows the live jobs,
not the history.

The figures are computed at scrape time from the store's view of the jobs (no state of its own);
values are the same the API and the dashboard show.
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..analysis.cost import Cost, totals
from ..ingest.writer import ReportWriter
from ..notify import Notifier
from ..store import HEALTH_STATES, Job, JobFilter, Store
from ..views.figures import cost_of, eta_of, live_steps_per_second, progress_percent, remaining_seconds

__all__ = ["JOB_LABEL", "NAMESPACE_LABEL", "JobsCollector", "WriterCollector", "registry_for"]

JOB_LABEL = "job_name"
"""The training job's label. Not ``job``: Prometheus gives every scraped series ``job`` (the name of
its scrape job) and, with ``honor_labels`` off as by default, renames a ``job`` of ours to
``exported_job``, so ``{job="train"}`` finds nothing and alerts name the scrape job instead."""

NAMESPACE_LABEL = "job_namespace"
"""The job's namespace label. Not ``namespace``, for the same reason as :data:`JOB_LABEL`: Kubernetes
service discovery gives every series scraped in a cluster a ``namespace`` target label (the namespace of
the stepwatch pod), and Prometheus then renames ours to ``exported_namespace``."""

LIVE = ("pending", "running")
MAX_JOBS = 10_000
"""Jobs read per scrape (the most recently updated)."""
MAX_METRICS_PER_JOB = 64
"""Last values exported per job: enough for the loss, eval metrics, learning rate and friends,
without letting one job with hundreds of logged keys flood the time series database."""


class JobsCollector(Collector):
    """Collects the job gauges from a store at each scrape."""

    def __init__(
        self, store: Store, clock: Callable[[], float] = time.time, stats: dict[str, int] | None = None
    ) -> None:
        self.store = store
        self.clock = clock
        self.stats = stats if stats is not None else {}

    def collect(self) -> Iterator[Metric]:
        """Every metric family, built from the jobs of the store now."""
        now = self.clock()
        jobs = self.store.jobs(JobFilter(limit=MAX_JOBS))
        labels = [NAMESPACE_LABEL, JOB_LABEL]
        g: dict[str, GaugeMetricFamily] = {
            name: GaugeMetricFamily(f"stepwatch_job_{name}", text, labels=labels)
            for name, text in (
                ("progress_ratio", "Progress of the job, 0 to 1 (from steps, else epochs, else what it reported)."),
                ("step", "Last step rank 0 reported."),
                ("total_steps", "Steps the job will run."),
                ("eta_seconds", "Seconds left, from the recent step rate."),
                ("steps_per_second", "Recent step rate (absent while the job is stalled)."),
                ("last_report_age_seconds", "Seconds since the job last reported."),
                ("cost_rate_usd_per_hour", "What an hour of the job costs: GPUs x price of a GPU hour."),
                ("cost_spent_usd", "What the job has cost so far."),
            )
        }
        health = GaugeMetricFamily(
            "stepwatch_job_health", "1 for the job's current health, 0 for the others.", labels=[*labels, "health"]
        )
        metric = GaugeMetricFamily(
            "stepwatch_job_metric_last", "Last value of a metric the job logs.", labels=[*labels, "metric"]
        )
        stalled_rank = GaugeMetricFamily(
            "stepwatch_job_stalled_rank_seconds",
            "While a job is stalled: seconds the rank holding it has stood, by what it is doing (its stack).",
            labels=[*labels, "rank", "activity"],
        )
        straggler = GaugeMetricFamily(
            "stepwatch_job_straggler_ratio",
            "While a job is straggling: how many times slower than the median rank its slowest rank is.",
            labels=[*labels, "rank", "host"],
        )
        states: Counter[tuple[str, str]] = Counter()
        healths: Counter[tuple[str, str]] = Counter()
        costs: dict[str, list[Cost]] = defaultdict(list)
        live_costs: dict[str, list[Cost]] = defaultdict(list)
        for job in jobs:
            remaining = remaining_seconds(job, now)
            cost = cost_of(job, now, remaining)
            current = _health_of(job)
            states[job.namespace, job.state] += 1
            healths[job.namespace, current] += 1
            costs[job.namespace].append(cost)
            if job.state not in LIVE:
                continue
            live_costs[job.namespace].append(cost)
            key = [job.namespace, job.name]
            percent = progress_percent(job)
            _add(g["progress_ratio"], key, None if percent is None else percent / 100)
            _add(g["step"], key, job.step)
            _add(g["total_steps"], key, job.total_steps)
            _add(g["eta_seconds"], key, eta_of(job, now)[0])  # what every reader shows
            _add(g["steps_per_second"], key, live_steps_per_second(job))  # none for a stalled job, as everywhere
            _add(g["last_report_age_seconds"], key, None if job.last_report_at is None else now - job.last_report_at)
            _add(g["cost_rate_usd_per_hour"], key, cost.rate_per_hour)
            _add(g["cost_spent_usd"], key, cost.spent)
            for state in HEALTH_STATES:
                health.add_metric([*key, state], 1.0 if state == current else 0.0)
            _add_place(stalled_rank, straggler, job, key, now)
            for name, value in sorted(job.last_metrics.items())[:MAX_METRICS_PER_JOB]:
                metric.add_metric([*key, name], value)  # NaN and Inf are valid sample values
        yield from g.values()
        yield health
        yield stalled_rank
        yield straggler
        yield metric
        yield from _namespace_families(states, healths, costs, live_costs)
        reports = CounterMetricFamily(
            "stepwatch_reports", "Reports the server stored since it started.", labels=["kind"]
        )
        for kind in ("reports", "duplicates", "statuses"):
            reports.add_metric([kind], self.stats.get(kind, 0))
        yield reports


def _namespace_families(
    states: Counter[tuple[str, str]],
    healths: Counter[tuple[str, str]],
    costs: dict[str, list[Cost]],
    live_costs: dict[str, list[Cost]],
) -> Iterator[Metric]:
    """Per namespace: jobs by state and by health, and the cost figures summed."""
    count = GaugeMetricFamily("stepwatch_jobs", "Jobs (latest attempts) by state.", labels=[NAMESPACE_LABEL, "state"])
    for (namespace, state), n in sorted(states.items()):
        count.add_metric([namespace, state], n)
    yield count
    by_health = GaugeMetricFamily(
        "stepwatch_jobs_by_health", "Jobs (latest attempts) by health.", labels=[NAMESPACE_LABEL, "health"]
    )
    for (namespace, state), n in sorted(healths.items()):
        by_health.add_metric([namespace, state], n)
    yield by_health
    sums = {
        "rate_usd_per_hour": GaugeMetricFamily(
            "stepwatch_namespace_cost_rate_usd_per_hour",
            "Cost per hour of the namespace's live jobs.",
            labels=[NAMESPACE_LABEL],
        ),
        "spent_usd": GaugeMetricFamily(
            "stepwatch_namespace_cost_spent_usd",
            "Spent by the namespace's jobs (listed ones).",
            labels=[NAMESPACE_LABEL],
        ),
        "wasted_usd": GaugeMetricFamily(
            "stepwatch_namespace_cost_wasted_usd",
            "Spent after jobs stopped doing useful work.",
            labels=[NAMESPACE_LABEL],
        ),
    }
    for namespace, items in sorted(costs.items()):
        t = totals(items)
        sums["rate_usd_per_hour"].add_metric([namespace], totals(live_costs[namespace]).rate_per_hour)
        sums["spent_usd"].add_metric([namespace], t.spent)
        sums["wasted_usd"].add_metric([namespace], t.wasted)
    yield from sums.values()


def _add(family: GaugeMetricFamily, labels: list[str], value: Any) -> None:
    if value is not None and not (isinstance(value, float) and math.isnan(value)):
        family.add_metric(labels, float(value))


def _add_place(stalled: GaugeMetricFamily, straggler: GaugeMetricFamily, job: Job, key: list[str], now: float) -> None:
    """The rank a verdict names and where it stands, from the verdict's evidence (issue 29: every reader
    says where); nothing for a verdict that names no rank (an upstream client's job, a whole job silent)."""
    evidence = job.health_evidence or {}
    rank = evidence.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool):
        return
    if job.health == "stalled":
        since = evidence.get("since")
        stood = now - since if isinstance(since, (int, float)) and since <= now else evidence.get("observed")
        activity = evidence.get("activity")
        _add(stalled, [*key, str(rank), activity if isinstance(activity, str) else "unknown"], stood)
    elif job.health == "straggling":
        host = evidence.get("host")
        _add(straggler, [*key, str(rank), host if isinstance(host, str) else ""], evidence.get("ratio"))


def _health_of(job: Job) -> str:
    return job.health if job.health in HEALTH_STATES else "unknown"


class WriterCollector(Collector):
    """Group commit's counters: how many transactions wrote native reports, how many reports they held (the
    ratio of the two is the mean batch, what a store's cost a report follows), and the batches that waited
    for more reports before they were written, by why."""

    def __init__(self, writer: ReportWriter) -> None:
        self.writer = writer

    def collect(self) -> Iterator[Metric]:
        """``stepwatch_ingest_batches_total``, ``stepwatch_ingest_batched_reports_total`` and
        ``stepwatch_ingest_batches_waited_total{why}`` (``linger``: an idle writer's batch, at a fleet's pace;
        ``fill``: a batch right after another, on PostgreSQL under load)."""
        writer = self.writer
        batches = CounterMetricFamily("stepwatch_ingest_batches", "Transactions that wrote native reports.")
        batches.add_metric([], writer.batches)
        reports = CounterMetricFamily("stepwatch_ingest_batched_reports", "Native reports those transactions held.")
        reports.add_metric([], writer.written)
        waited = CounterMetricFamily(
            "stepwatch_ingest_batches_waited", "Batches that waited for more reports, by why.", labels=["why"]
        )
        waited.add_metric(["linger"], writer.lingered)
        waited.add_metric(["fill"], writer.fills)
        yield batches
        yield reports
        yield waited


class NotificationsCollector(Collector):
    """The notifier's counters per target (redacted: no credentials in labels)."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier

    def collect(self) -> Iterator[Metric]:
        """``stepwatch_notifications_total{target, result}`` and the messages pending now."""
        total = CounterMetricFamily(
            "stepwatch_notifications", "Notifications by target and outcome.", labels=["target", "result"]
        )
        pending = GaugeMetricFamily("stepwatch_notifications_pending", "Notifications waiting.", labels=["target"])
        for target, stats in sorted(self.notifier.stats_by_target().items()):
            for result in ("delivered", "failed", "dropped", "deduplicated", "retried"):
                total.add_metric([target, result], getattr(stats, result))
            pending.add_metric([target], stats.pending)
        yield total
        yield pending


def registry_for(
    store: Store,
    clock: Callable[[], float] = time.time,
    stats: dict[str, int] | None = None,
    notifier: Notifier | None = None,
    writer: ReportWriter | None = None,
) -> CollectorRegistry:
    """A registry of its own per app (no global state): the jobs, and the report writer and the notifier when
    there are."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobsCollector(store, clock, stats))
    if writer is not None:
        registry.register(WriterCollector(writer))
    if notifier is not None:
        registry.register(NotificationsCollector(notifier))
    return registry
