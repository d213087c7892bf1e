"""What the live stream publishes: a job, its new points, its events — each in the shape the API reads
it back (:mod:`..views.serialisers`), so that a reader of the stream has nothing to patch in.

Every publisher goes through these: the ingest service, the health sweep, the policies, the routes
that register jobs, queue commands or record a state, and the Kubernetes runner.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...protocol import MetricWindow
from ..store import Event, Job
from ..views.serialisers import COMPACT_METRICS, event_view, job_view, window_view
from .broadcaster import Broadcaster

__all__ = ["publish_events", "publish_job", "publish_points"]


def publish_job(live: Broadcaster, job: Job, now: float) -> None:
    """The job changed: its compact view at ``now``, as a list of jobs reads it (the stream's readers
    read the job's full view, its params included, when they need it).

    Built when it is read (:meth:`.Broadcaster.publish_deferred`): every report changes its job, and
    with nobody following that job the view and its text were most of publishing (a ``Job`` is
    immutable: the view is the same whenever it is built). A job with more metric names than a compact
    view carries is written at once, so that the ring does not hold all its values meanwhile."""
    if len(job.last_metrics) > COMPACT_METRICS:
        live.publish("job", job.namespace, job.name, {"job": job_view(job, now, compact=True)})
        return
    live.publish_deferred(
        "job",
        job.namespace,
        job.name,
        lambda: {"job": job_view(job, now, compact=True)},
        _HELD_BYTES + _HELD_BYTES_PER_METRIC * len(job.last_metrics),
    )


_HELD_BYTES = 2400
"""What a deferred job update holds until it is read, about: its ``Job`` (a copy of its fields) and its closure
(the text of a compact view of 5 metrics is 1,100 bytes)..."""
_HELD_BYTES_PER_METRIC = 150
"""...and per metric name, its latest value and window mean (two dicts of them are new at each report)."""
_HELD_POINTS_BYTES = 300
"""What a deferred update of points holds until it is read, about: its closure (the text of 5 windows is
720 bytes)..."""
_HELD_BYTES_PER_WINDOW = 500
"""...and per window, the report's ``MetricWindow`` (the object, its dict and its floats)."""


def publish_points(live: Broadcaster, job: Job, windows: Sequence[MetricWindow], t: float) -> None:
    """The windows of ``job`` stored at ``t``, each as the job's history will read it back; built when it is
    read, as a job's update (:func:`publish_job`; a report's windows are immutable)."""
    if windows:
        attempt, windows = job.attempt, tuple(windows)  # a tuple stays itself: a list is copied, it might change
        live.publish_deferred(
            "points",
            job.namespace,
            job.name,
            lambda: {"attempt": attempt, "t": t, "points": {w.name: window_view(w, t) for w in windows}},
            _HELD_POINTS_BYTES + _HELD_BYTES_PER_WINDOW * len(windows),
        )


def publish_events(live: Broadcaster, events: Iterable[Event]) -> None:
    """Stored events, oldest first, each as the events API reads it back (its id and time included)."""
    for event in events:
        live.publish("event", event.namespace, event.name, event_view(event))
