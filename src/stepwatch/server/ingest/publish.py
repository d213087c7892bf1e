"""What the live stream publishes: a job, its new points, its events — each in the shape the API reads
it back (:mod:`..views.serialisers`), so that a reader of the stream has nothing to patch in.

Every publisher goes through these: the ingest service, the health sweep, the policies, the routes
that register jobs, queue commands or record a state, and the Kubernetes runner.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...protocol import MetricWindow
from ..live.broadcaster import Broadcaster
from ..store import Event, Job
from ..views.serialisers import event_view, job_view, window_view

__all__ = ["publish_events", "publish_job", "publish_points"]


def publish_job(live: Broadcaster, job: Job, now: float) -> None:
    """The job changed: its compact view at ``now``, as a list of jobs reads it (the stream's readers
    read the job's full view, its params included, when they need it)."""
    live.publish("job", job.namespace, job.name, {"job": job_view(job, now, compact=True)})


def publish_points(live: Broadcaster, job: Job, windows: Sequence[MetricWindow], t: float) -> None:
    """The windows of ``job`` stored at ``t``, each as the job's history will read it back."""
    if windows:
        points = {w.name: window_view(w, t) for w in windows}
        live.publish("points", job.namespace, job.name, {"attempt": job.attempt, "t": t, "points": points})


def publish_events(live: Broadcaster, events: Iterable[Event]) -> None:
    """Stored events, oldest first, each as the events API reads it back (its id and time included)."""
    for event in events:
        live.publish("event", event.namespace, event.name, event_view(event))
