"""Fixtures of the CLI tests that share the SDK tests' helpers (``tests/client/swtest.py``): a real stepwatch
server (uvicorn on 127.0.0.1, a temporary SQLite file, one per module) and a namespace per test. The other
CLI test files bring their own servers."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

sys.path.insert(0, str(Path(__file__).parent.parent / "client"))  # swtest, next to the SDK tests
from swtest import Server

_namespaces = itertools.count(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a real stepwatch server, for the whole module."""
    srv = Server(tmp_path_factory.mktemp("cli") / "stepwatch.db").start()
    yield srv.url
    srv.stop()


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own."""
    return f"cli{next(_namespaces)}"
