"""Bad answers and no answers: each a clear exception of the one tree, never an httpx error or a KeyError.

A real stepwatch server never answers with another API version, a 401 or a body that is not JSON; a
scripted HTTP server on 127.0.0.1 (``swtest.Scripted``) stands in for the servers and proxies that do.
"""

from __future__ import annotations

import socket
import time
import types

import pytest
from swtest import Scripted, free_port

from stepwatch.client import (
    AsyncClient,
    AuthError,
    Client,
    Conflict,
    IncompatibleServer,
    InvalidResponse,
    NotFound,
    RateLimited,
    RequestTimeout,
    Retry,
    ServerError,
    ServerUnreachable,
    StepwatchError,
    Unauthorized,
)
from stepwatch.client import _client as client_module

JOB = {"namespace": "default", "name": "a", "state": "running", "attempt": 1}


def test_no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens: ServerUnreachable (not a timeout: a refusal is known at once) after the one retry asked
    for, whose only wait is the backoff's. The client's waits are recorded rather than timed."""
    waits: list[float] = []
    monkeypatch.setattr(client_module, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=waits.append))
    url = f"http://127.0.0.1:{free_port()}"
    with (
        Client(url, retries=1) as client,
        pytest.raises(ServerUnreachable, match=f"no stepwatch server .* at {url}") as caught,
    ):
        client.jobs()
    assert type(caught.value) is ServerUnreachable
    assert len(waits) == 1 and 0 < waits[0] <= Retry().backoff, waits


def test_a_server_that_does_not_answer_in_time() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts (backlog) and never says a word
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with Client(url, timeout=0.3, retries=0) as client, pytest.raises(RequestTimeout, match="in time"):
            client.jobs()
    assert issubclass(RequestTimeout, ServerUnreachable)


def test_another_api_version(scripted: Scripted) -> None:
    scripted.on("GET", "/api/v1/version", (200, {"version": "3.0.0", "api_version": "v2"}))
    with Client(scripted.url) as client, pytest.raises(IncompatibleServer, match="speaks API 'v2'") as caught:
        client.jobs()
    assert caught.value.server_version == "3.0.0" and caught.value.api_version == "v2"
    assert ("GET", "/api/v1/jobs") not in scripted.seen  # nothing else was asked


def test_not_a_stepwatch_server(scripted: Scripted) -> None:
    scripted.on("GET", "/api/v1/version", (404, {}, b"<html>nginx</html>"))
    with (
        Client(scripted.url) as client,
        pytest.raises(IncompatibleServer, match=r"is not a stepwatch server: GET /api/v1/version answered HTTP 404$"),
    ):
        client.job("a")
    with Client(scripted.url, check_version=False) as client, pytest.raises(NotFound):
        client.job("a")


def test_an_expired_token(scripted: Scripted) -> None:
    scripted.on("GET", "/api/v1/jobs", (401, {"kind": "Status", "code": 401, "message": "token expired"}))
    with Client(scripted.url, token="old") as client, pytest.raises(Unauthorized, match="token expired") as caught:
        client.jobs()
    assert isinstance(caught.value, AuthError) and caught.value.status == 401
    scripted.on("GET", "/api/v1/jobs", (401, {}, b""))
    with Client(scripted.url) as client, pytest.raises(Unauthorized, match="missing or expired"):
        client.jobs()


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        ((200, {}, b"<html>a proxy's login page</html>"), "not JSON"),
        ((200, [1, 2]), r"jobs should be an object"),
        ((200, {"items": "nope"}), r"jobs.items should be an array"),
        ((200, {"items": [{"name": "a"}]}), r"jobs.items\[0\].namespace should be a string"),
        ((200, {"items": [{**JOB, "attempt": "x"}]}), r"attempt should be an integer"),
    ],
)
def test_malformed_lists(scripted: Scripted, reply: tuple, match: str) -> None:
    scripted.on("GET", "/api/v1/jobs", reply)
    with Client(scripted.url) as client, pytest.raises(InvalidResponse, match=match):
        client.jobs()


def test_malformed_parts_fail_when_read(scripted: Scripted) -> None:
    """A job's parts are read at first access: a wrong one is a clear error there, not a crash later."""
    scripted.on(
        "GET",
        "/api/v1/namespaces/default/jobs/a",
        (200, {**JOB, "progress": {"step": "ten"}, "metrics": {"loss": "lots"}, "health": []}),
    )
    with Client(scripted.url) as client:
        job = client.job("a")
        with pytest.raises(InvalidResponse, match=r"progress.step should be an integer, got 'ten'"):
            _ = job.progress
        with pytest.raises(InvalidResponse, match=r"job.metrics.loss should be a number"):
            _ = job.metrics
        with pytest.raises(InvalidResponse, match=r"job.health should be an object"):
            _ = job.health


def test_reads_are_retried_and_writes_are_not(scripted: Scripted) -> None:
    scripted.on(
        "GET",
        "/api/v1/jobs",
        (503, {"Retry-After": "0"}, b'{"message": "storage unavailable"}'),
        (502, {}, b""),
        (200, {"items": [JOB], "total": 1}),
    )
    scripted.on(
        "POST",
        "/api/v1/namespaces/default/jobs/a/commands",
        (503, {"message": "storage unavailable"}),
        (201, {"id": "c1", "kind": "stop", "reason": ""}),
    )
    with Client(scripted.url, retries=2) as client:
        assert [j.name for j in client.jobs()] == ["a"]
        assert scripted.seen.count(("GET", "/api/v1/jobs")) == 3
        with pytest.raises(ServerError, match="storage unavailable") as caught:
            client.stop("a", checkpoint=False)
        assert caught.value.status == 503
        assert scripted.seen.count(("POST", "/api/v1/namespaces/default/jobs/a/commands")) == 1


def test_retries_give_up(scripted: Scripted) -> None:
    scripted.on("GET", "/api/v1/jobs", (429, {"Retry-After": "0"}, b'{"message": "slow down"}'))
    with Client(scripted.url, retries=1) as client, pytest.raises(RateLimited, match="slow down") as caught:
        client.jobs()
    assert caught.value.retry_after == 0.0
    assert scripted.seen.count(("GET", "/api/v1/jobs")) == 2


def test_a_conflict_and_the_root(scripted: Scripted) -> None:
    scripted.on(
        "POST",
        "/api/v1/namespaces/default/jobs/a/commands",
        (409, {"message": "job default/a has already finished", "details": {"field": "kind"}}),
    )
    with Client(scripted.url) as client, pytest.raises(StepwatchError) as caught:
        client.stop("a")
    assert isinstance(caught.value, Conflict) and caught.value.field == "kind"


def test_a_malformed_live_stream(scripted: Scripted) -> None:
    sse = {"Content-Type": "text/event-stream"}
    scripted.on("GET", "/api/v1/events", (200, sse, b"id: 1\nevent: job\ndata: {oops\n\n"))
    with Client(scripted.url) as client, pytest.raises(InvalidResponse, match="not JSON"):
        next(iter(client.watch()))
    scripted.on(
        "GET", "/api/v1/events", (200, {"Content-Type": "text/event-stream"}, b"id: x\nevent: job\ndata: {}\n\n")
    )
    with Client(scripted.url) as client, pytest.raises(InvalidResponse, match="not an integer"):
        next(iter(client.watch()))


def test_a_live_stream_refused(scripted: Scripted) -> None:
    scripted.on("GET", "/api/v1/events", (404, {"message": "no job named 'A'"}))
    with Client(scripted.url) as client, pytest.raises(NotFound):
        next(iter(client.watch("A")))


def test_the_async_client_raises_the_same(scripted: Scripted) -> None:
    import asyncio

    scripted.on("GET", "/api/v1/namespaces/default/jobs/a", (200, {}, b"nope"))

    async def main() -> None:
        async with AsyncClient(scripted.url) as client:
            await client.job("a")

    with pytest.raises(InvalidResponse, match="not JSON"):
        asyncio.run(main())

    async def unreachable() -> None:
        async with AsyncClient(f"http://127.0.0.1:{free_port()}", retries=0) as client:
            await client.jobs()

    with pytest.raises(ServerUnreachable):
        asyncio.run(unreachable())
