"""Fixtures of the store suite (both stores: the ``database`` fixture of ``tests/server/conftest.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from stepwatch.protocol import Report


@pytest.fixture
def report(make_report: Callable[..., dict[str, Any]]) -> Callable[..., Report]:
    """``report(seq, step, {"loss": 0.5}, rank=1, ...)``: a protocol Report, as the ingest route hands it to the
    store (``make_report``'s body, read by :meth:`Report.from_dict`)."""

    def make(*args: Any, **kwargs: Any) -> Report:
        return Report.from_dict(make_report(*args, **kwargs))

    return make
