"""What ``wait()`` waits for, without I/O: a condition on a job, and which job views count."""

from __future__ import annotations

from collections.abc import Callable, Collection

from ._job import Job

__all__ = ["Until", "Waiter"]

Until = str | Collection[str] | Callable[[Job], bool] | None
"""``None`` or ``"ended"``: the job has finished, failed or stopped; a state (``"running"``) or several;
or a predicate on the job (``lambda job: (job.progress.step or 0) >= 1000``)."""


class Waiter:
    """Decides, view after view of one job, whether ``wait()`` is over."""

    def __init__(self, until: Until) -> None:
        self.describe = _describe(until)
        if until is None or until == "ended":
            self._test: Callable[[Job], bool] = lambda job: job.ended
        elif isinstance(until, str):
            self._test = lambda job: job.state == until
        elif callable(until):
            self._test = until
        else:
            states = frozenset(until)
            self._test = lambda job: job.state in states
        self.job: Job | None = None

    def offer(self, job: Job) -> bool:
        """Take a view of the job (an older attempt's is ignored); whether the wait is over.

        Over when the condition holds, or when the job has ended (it will not change any more: the
        caller reads ``job.state``).
        """
        if self.job is not None and job.attempt < self.job.attempt:
            return False
        self.job = job
        return bool(self._test(job)) or job.ended


def _describe(until: Until) -> str:
    if until is None or until == "ended":
        return "to end"
    if isinstance(until, str):
        return f"to be {until}"
    if callable(until):
        return f"to meet {getattr(until, '__name__', 'a condition')}"
    return "to be " + " or ".join(sorted(until))
