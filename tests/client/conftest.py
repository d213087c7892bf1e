"""Fixtures of the SDK tests: a real stepwatch server (uvicorn on 127.0.0.1, a temporary SQLite file, one per
module), a namespace per test, a client, a cuttable proxy and a scripted HTTP server (see ``swtest``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from swtest import Proxy, Scripted, Server

from stepwatch.client import Client

_namespaces = itertools.count(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a real stepwatch server, for the whole module."""
    srv = Server(tmp_path_factory.mktemp("client") / "stepwatch.db").start()
    yield srv.url
    srv.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A server of this test's own, which it may stop and start again."""
    srv = Server(tmp_path / "own.db").start()
    yield srv
    try:
        srv.stop()
    except AssertionError:
        pass


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own."""
    return f"c{next(_namespaces)}"


@pytest.fixture
def client(server: str) -> Iterator[Client]:
    with Client(server) as c:
        yield c


@pytest.fixture
def proxy(server: str) -> Iterator[Proxy]:
    p = Proxy(int(server.rsplit(":", 1)[1]))
    yield p
    p.close()


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    s = Scripted()
    s.on("GET", "/api/v1/version", (200, {"version": "9.9", "api_version": "v1"}))
    yield s
    s.close()
