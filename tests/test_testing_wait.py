"""``stepwatch.testing.wait_for``: the one polling helper of the tests."""

from __future__ import annotations

import itertools
import threading

import pytest

from stepwatch.testing import wait_for


def test_it_returns_what_the_predicate_gave_once_another_thread_brings_it_about() -> None:
    box: list[str] = []
    timer = threading.Timer(0.05, box.append, ["done"])
    timer.start()
    assert wait_for(lambda: box[:], what="the timer") == ["done"]
    timer.join()


def test_a_condition_that_never_comes_fails_saying_what_and_the_last_value() -> None:
    calls = itertools.count()
    with pytest.raises(AssertionError, match=r"waited 0\.05 s for the job to stall; last seen: 0") as caught:
        wait_for(lambda: 0 * next(calls), 0.05, "the job to stall")
    assert isinstance(caught.value, AssertionError) and next(calls) >= 3  # polled, not once


def test_it_takes_one_last_look_after_the_deadline() -> None:
    """A thread kept waiting past the deadline (a loaded machine) still sees what holds by then."""
    calls = itertools.count(1)
    assert wait_for(lambda: next(calls) >= 2, timeout=0) is True


def test_an_error_of_the_predicate_goes_through_at_once() -> None:
    def broken() -> bool:
        raise KeyError("job")

    with pytest.raises(KeyError):
        wait_for(broken, timeout=60)
