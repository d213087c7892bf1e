"""Automations, each a few lines on the client: copy them, or call them as they are.

::

    from stepwatch.client import Client
    from stepwatch.client.recipes import finishing_within, notify_if_late, stop_when, threshold

    client = Client()

    # early stop: checkpoint and stop the job once its eval loss goes over 2.5
    stop_when(client, "llama-sft", threshold("eval_loss", above=2.5))

    # tell someone when the ETA passes Tuesday's review (once; again if it comes back in time and slips)
    notify_if_late(client, "llama-sft", deadline=review_time, notify=lambda job, when: post_to_chat(...))

    # reallocate: which jobs end within 30 minutes, and how many GPUs they free
    soon = finishing_within(client, minutes=30)
    print(soon.gpus, [f.job.key for f in soon])

Each follows the live stream (``Client.watch``), so it reacts within a report of the job, and reads
the job again whenever the stream says updates were missed. They block: run one in a thread, a
process, or a pipeline step of its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ._client import Client
from ._job import Job
from ._live import JobUpdate, Resync, Update
from ._models import CommandSent

__all__ = ["Freeing", "Freeings", "finish_time", "finishing_within", "notify_if_late", "stop_when", "threshold"]

Condition = Callable[[Job], bool]


def threshold(
    metric: str, *, above: float | None = None, below: float | None = None, nonfinite: bool = True
) -> Condition:
    """A condition on a job's last value of ``metric``: over ``above``, under ``below``, or (``nonfinite``)
    NaN/Inf. A job that has not reported the metric yet does not meet it."""
    if above is None and below is None and not nonfinite:
        raise ValueError("say above=, below= or nonfinite=True")

    def holds(job: Job) -> bool:
        value = job.metrics.get(metric)
        if value is None:
            return False
        if not math.isfinite(value):
            return nonfinite
        return (above is not None and value > above) or (below is not None and value < below)

    parts = [f"> {above:g}" if above is not None else "", f"< {below:g}" if below is not None else ""]
    holds.__name__ = f"{metric} " + " or ".join(p for p in parts if p) + (" or NaN/Inf" if nonfinite else "")
    return holds


def finish_time(job: Job) -> float | None:
    """When a job should end (Unix s): the server's ETA, else what the job itself reported (Kubeflow's
    ``estimatedRemainingSeconds``) counted from its last report; ``None`` when neither is known."""
    if job.eta.finish_time is not None:
        return job.eta.finish_time
    reported, last = job.eta.reported_seconds, job.times.last_report
    if reported is not None and last is not None:
        return last + reported
    return None


def _job_views(client: Client, name: str, namespace: str | None, timeout: float | None) -> Iterator[Job]:
    """The job now, then each new view of it, until it ends (read again after a resync)."""
    job = client.job(name, namespace)
    yield job
    if job.ended:
        return
    update: Update
    for update in client.watch(name, namespace or client.namespace, timeout=timeout):
        if isinstance(update, Resync):
            job = client.job(name, namespace)
        elif isinstance(update, JobUpdate) and update.job.attempt >= job.attempt:
            job = update.job
        else:
            continue
        yield job
        if job.ended:
            return


def stop_when(
    client: Client,
    name: str,
    condition: Condition,
    namespace: str | None = None,
    *,
    checkpoint: bool = True,
    reason: str | None = None,
    timeout: float | None = None,
) -> CommandSent | None:
    """Stop a job (after a checkpoint) as soon as ``condition(job)`` holds; ``None`` if it ended first, or
    ``timeout`` seconds passed. The reason says which condition: it shows in the job's events."""
    for job in _job_views(client, name, namespace, timeout):
        if job.ended:
            return None
        if condition(job):
            said = reason or f"stop_when: {getattr(condition, '__name__', 'condition')} at step {job.progress.step}"
            return client.stop(name, namespace, checkpoint=checkpoint, reason=said)
    return None


def notify_if_late(
    client: Client,
    name: str,
    deadline: float,
    notify: Callable[[Job, float], object],
    namespace: str | None = None,
    *,
    timeout: float | None = None,
) -> int:
    """Call ``notify(job, finish_time)`` when the job's ETA passes ``deadline`` (Unix seconds); once, and
    again only after it came back in time and slipped again. Returns how often it notified, when the job
    ends (or ``timeout``). A job with no ETA yet is not late; a job still running at the deadline is. A view
    with no ETA between two that have one (the server withholds it while it is unsure, e.g. a stalled
    moment) changes nothing: only an ETA back before the deadline makes a later slip worth saying again."""
    late = False
    said = 0
    for job in _job_views(client, name, namespace, timeout):
        if job.ended:
            break
        finish = finish_time(job)
        if finish is None and time.time() > deadline:
            finish = time.time()
        if finish is None:
            continue
        now_late = finish > deadline
        if now_late and not late:
            notify(job, finish)
            said += 1
        late = now_late
    return said


@dataclass(frozen=True)
class Freeing:
    """A job that should end soon: when (Unix seconds) and the GPUs it holds."""

    job: Job
    finishes_at: float
    gpus: float


class Freeings(list[Freeing]):
    """Jobs that end soon, soonest first; ``gpus`` is how many GPUs they free in all."""

    @property
    def gpus(self) -> float:
        """GPUs freed when all of these have ended."""
        return sum(f.gpus for f in self)


def finishing_within(client: Client, minutes: float, namespace: str | None = None) -> Freeings:
    """Running jobs whose ETA ends within ``minutes``, soonest first, with the GPUs each frees.

    Only healthy-looking jobs count: a stalled or diverging job's ETA says nothing about when it ends.
    """
    now = time.time()
    horizon = now + minutes * 60
    found = Freeings()
    for job in client.jobs(namespace, state="running", sort="eta", limit=10_000):
        finish = finish_time(job)
        if finish is None or finish > horizon or job.health.state in ("stalled", "diverging"):
            continue
        found.append(Freeing(job, finish, job.resources.gpus))
    found.sort(key=lambda f: f.finishes_at)
    return found
