"""The live relay between the workers of one server: real Unix sockets, two broadcasters in one loop."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator

import pytest

from stepwatch.server import siblings
from stepwatch.server.live import Broadcaster
from stepwatch.server.siblings import SiblingRelay, WorkerRole


async def _next(stream: AsyncIterator[str], timeout: float = 5.0) -> str:
    return await asyncio.wait_for(stream.__anext__(), timeout)


async def _wait(condition: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_updates_reach_the_workers_that_have_streams_open_and_only_those() -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as directory:
            a_live, b_live = Broadcaster(), Broadcaster()
            a = await SiblingRelay.start_for(a_live, WorkerRole(0, 2, directory))
            b = await SiblingRelay.start_for(b_live, WorkerRole(1, 2, directory))
            assert a is not None and b is not None
            await asyncio.sleep(0.6)  # both connected, and each said it has no stream
            assert not a._siblings[1].wants
            a_live.publish("job", "ns", "unwatched", {})  # no stream on worker 1: not sent
            await asyncio.sleep(0.1)
            assert a.sent == 0
            b_stream = b_live.stream()
            assert (await _next(b_stream)).startswith("retry:")
            await _wait(lambda: a._siblings[1].wants)  # worker 1 said it has a stream now
            a_live.publish("points", "ns", "j", {"attempt": 1, "points": {"loss": {"step": 5}}})
            got = await _next(b_stream)
            assert "event: points\n" in got and '"step":5' in got
            b_live.publish("job", "ns", "from-b", {})  # worker 0 has no stream: not sent back
            await asyncio.sleep(0.2)
            assert (a.sent, a.received, b.sent, b.received) == (1, 0, 0, 1)
            await b_stream.aclose()
            await _wait(lambda: not a._siblings[1].wants)
            a_live.publish("job", "ns", "missed", {})
            resumed = b_live.stream(last_event_id=b_live.first_id)  # from before the pause: told to resync
            assert (await _next(resumed)).startswith("retry:")
            assert (await _next(resumed)).startswith("event: resync")
            await resumed.aclose()
            await a.aclose()
            await b.aclose()

    asyncio.run(scenario())


def test_a_sibling_that_does_not_read_loses_updates_and_its_streams_resync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(siblings, "MAX_BUFFER", 2_000)

    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as directory:
            a_live, b_live = Broadcaster(), Broadcaster()
            a = await SiblingRelay.start_for(a_live, WorkerRole(0, 2, directory))
            assert a is not None
            # worker 1 has not said what it wants (it is starting): updates are kept for it
            for i in range(50):  # more than MAX_BUFFER bytes wait for it, then are dropped
                a_live.publish("job", "ns", "j", {"blob": "x" * 200, "i": i})
                await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert a.dropped > 0
            b = await SiblingRelay.start_for(b_live, WorkerRole(1, 2, directory))
            assert b is not None
            b_stream = b_live.stream()
            await _next(b_stream)
            await asyncio.sleep(0.6)
            a_live.publish("job", "ns", "after", {})
            said = [await _next(b_stream, timeout=10)]
            while '"name":"after"' not in said[-1]:
                said.append(await _next(b_stream))
            assert any(s.startswith("event: resync") for s in said), said
            await b_stream.aclose()
            await a.aclose()
            await b.aclose()

    asyncio.run(scenario())


def test_a_server_of_one_process_has_no_relay() -> None:
    async def scenario() -> None:
        assert await SiblingRelay.start_for(Broadcaster(), None) is None
        assert await SiblingRelay.start_for(Broadcaster(), WorkerRole(0, 1, "/nonexistent")) is None

    asyncio.run(scenario())
