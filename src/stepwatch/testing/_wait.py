"""The one way stepwatch's tests (and a user's) wait for something that happens in another thread or process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_for"]

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "", *, every: float = 0.05) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    It is called at once, then again after waits that double from 1 ms to ``every`` seconds (a condition
    that holds soon is seen soon; a long wait costs little CPU), and once more when ``timeout`` seconds have
    passed, so that a slow machine that kept this thread waiting past the deadline still sees a condition
    that holds by then. After that it raises :class:`AssertionError` naming ``what`` (or the predicate)
    and the last value it returned; an exception the predicate raises goes through at once.

    ``timeout`` is a ceiling for a condition that never comes, never a measure: a test that needs to know
    *how fast* something happens compares it with a baseline measured in the same run."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(pause, left))
        pause = min(pause * 2, every)
    value = predicate()  # the last look, after the deadline
    if value:
        return value
    raise AssertionError(
        f"waited {timeout:g} s for {what or getattr(predicate, '__name__', repr(predicate))}; last seen: {value!r}"
    )
