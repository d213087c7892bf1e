"""Live views for notebooks: a job card or a job table that updates in place as the jobs report.

::

    from stepwatch.client import Client
    from stepwatch.client.notebook import live

    client = Client()
    client.job("llama-sft")          # a card with a progress bar (Job._repr_html_)
    client.jobs(state="running")     # a table with a bar per job (JobList._repr_html_)
    live(client, "llama-sft")        # the card, redrawn in place until the job ends; returns the job
    live(client, timeout=600)        # every job, for ten minutes (interrupt the cell to stop)

In Jupyter (or anything with IPython display handles) one output is updated in place; elsewhere a
line is printed per change, at most every ``refresh`` seconds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from ._client import Client
from ._job import Job, JobList, job_html, jobs_html
from ._live import JobUpdate, Resync

__all__ = ["Handle", "live"]


class Handle(Protocol):
    """What a display returns: something to update in place (IPython's ``DisplayHandle``)."""

    def update(self, obj: Any) -> None:
        """Replace what is shown."""


Display = Callable[[Any], Handle]
"""Shows an object and returns its handle (IPython: ``display(obj, display_id=True)``)."""


class _Html:
    """An HTML snapshot for IPython, with a text form for terminals."""

    def __init__(self, html: str, text: str) -> None:
        self.html = html
        self.text = text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


class _Lines:
    """The display of last resort: a line per update on stdout."""

    def update(self, obj: Any) -> None:
        print(repr(obj), file=sys.stdout, flush=True)


def _default_display() -> Display:
    import importlib

    try:  # imported by name: IPython is not a dependency, and has no type stubs here
        ipython: Any = importlib.import_module("IPython")
        shown: Any = importlib.import_module("IPython.display")
    except ImportError:
        pass
    else:
        if ipython.get_ipython() is not None:
            return lambda obj: shown.display(obj, display_id=True)

    def lines(obj: Any) -> Handle:
        handle = _Lines()
        handle.update(obj)
        return handle

    return lines


def _line(job: Job) -> str:
    percent = job.progress.percent
    eta = job.eta.remaining_seconds
    return (
        f"{job.key} {job.state} {job.health.state} {'-' if percent is None else f'{percent:.1f}%'} "
        f"step {job.progress.step if job.progress.step is not None else '-'} "
        f"ETA {'-' if eta is None else f'{eta:.0f}s'} loss {'-' if job.loss_mean is None else job.loss_mean}"
    )


def _snapshot_job(job: Job) -> _Html:
    return _Html(job_html(job), _line(job))


def _snapshot_jobs(jobs: dict[tuple[str, str], Job]) -> _Html:
    listed = JobList(sorted(jobs.values(), key=lambda j: (j.namespace, j.name)))
    return _Html(jobs_html(listed), "\n".join(_line(j) for j in listed) or "no jobs")


def live(
    client: Client,
    name: str | None = None,
    namespace: str | None = None,
    *,
    timeout: float | None = None,
    refresh: float = 0.5,
    display: Display | None = None,
) -> Job | JobList:
    """Show a job (``name``) or every job (of ``namespace``, or all) and redraw it as updates arrive.

    One job: until it ends (or ``timeout``), then the job as it ended is returned. Every job: until
    ``timeout`` (or Ctrl-C / interrupting the cell), then the list as shown. ``refresh``: at most one
    redraw per so many seconds (the last state is always drawn). ``display``: how to show (default:
    IPython's in-place display when in IPython, else a line per redraw).
    """
    show = display or _default_display()
    if name is not None:
        job = client.job(name, namespace)
        handle = show(_snapshot_job(job))
        drawn = time.monotonic()
        if job.ended:
            return job
        try:
            for update in client.watch(name, namespace or client.namespace, timeout=timeout):
                if isinstance(update, Resync):
                    job = client.job(name, namespace)
                elif isinstance(update, JobUpdate) and update.job.attempt >= job.attempt:
                    job = update.job
                else:
                    continue
                if job.ended or time.monotonic() - drawn >= refresh:
                    handle.update(_snapshot_job(job))
                    drawn = time.monotonic()
                if job.ended:
                    break
        except KeyboardInterrupt:
            handle.update(_snapshot_job(job))
        return job
    jobs = {(j.namespace, j.name): j for j in client.jobs(namespace)}
    handle = show(_snapshot_jobs(jobs))
    drawn, dirty = time.monotonic(), False
    try:
        for update in client.watch(None, namespace, timeout=timeout):
            if isinstance(update, Resync):
                jobs = {(j.namespace, j.name): j for j in client.jobs(namespace)}
            elif isinstance(update, JobUpdate):
                held = jobs.get((update.namespace, update.name))
                if held is not None and update.job.attempt < held.attempt:
                    continue
                jobs[(update.namespace, update.name)] = update.job
            else:
                continue
            dirty = True
            if time.monotonic() - drawn >= refresh:
                handle.update(_snapshot_jobs(jobs))
                drawn, dirty = time.monotonic(), False
    except KeyboardInterrupt:
        pass
    if dirty:
        handle.update(_snapshot_jobs(jobs))
    return JobList(sorted(jobs.values(), key=lambda j: (j.namespace, j.name)))
