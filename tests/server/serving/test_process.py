"""The serving process's collector settings (``stepwatch server`` applies them before serving)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from stepwatch.server.serving.process import GC_THRESHOLDS, tune_for_serving


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_the_collector_is_tuned_and_what_was_loaded_is_frozen() -> None:
    tune_for_serving()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 1_000  # the modules, classes and functions loaded so far
    assert gc.isenabled()  # cycles are still collected


@pytest.mark.usefixtures("restored_gc")
def test_cycles_made_after_tuning_are_still_collected() -> None:
    tune_for_serving()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    ids = {id(a), id(b)}
    del a, b
    gc.collect()
    assert not ids & {id(o) for o in gc.get_objects() if isinstance(o, Node)}
