"""``stepwatch.testing.server``: the real server that the socket tests (CLI, SDK, dashboard, Kubernetes
clients) run against — it serves, stops, comes back on the same URL and database, and says when it
cannot start."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from stepwatch.client import Client
from stepwatch.testing.server import LocalServer, ServerThread


async def _hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


def test_a_server_thread_serves_until_stopped_and_refuses_a_second_start() -> None:
    server = ServerThread(Starlette(routes=[Route("/", _hello)]))
    with server:
        assert server.running and server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
        assert httpx.get(server.url, timeout=5).text == "hello"
        with pytest.raises(RuntimeError, match="running"):
            server.start()
    assert not server.running
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url, timeout=5)
    server.stop()  # again: nothing


def test_an_app_that_cannot_start_is_an_error_not_a_hang() -> None:
    @contextlib.asynccontextmanager
    async def broken(app: Starlette) -> AsyncIterator[None]:
        raise RuntimeError("no database")
        yield  # pragma: no cover

    server = ServerThread(Starlette(lifespan=broken), log_level="critical")
    with pytest.raises(RuntimeError, match=r"uvicorn did not start on 127\.0\.0\.1:[0-9]+: it exited with 3"):
        server.start(timeout=10)
    assert not server.running


def test_tls_needs_both_files() -> None:
    with pytest.raises(ValueError, match="both"):
        ServerThread(Starlette(), ssl_certfile="cert.pem")


def test_a_local_server_comes_back_on_the_same_url_and_database(tmp_path: Path) -> None:
    server = LocalServer(tmp_path / "sw.db", log_level="critical")
    with server:
        url = server.url
        with Client(url) as client:
            client.register("kept", "team")
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/healthz", timeout=5)
    with server:  # a restart: the same port, a new app on the same file
        assert server.url == url
        with Client(url) as client:
            assert client.job("kept", "team").name == "kept"
