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


def test_updates_reach_the_other_worker_once_and_wait_for_it_to_listen() -> None:
    async def scenario() -> None:
        with tempfile.TemporaryDirectory() as directory:
            a_live, b_live = Broadcaster(), Broadcaster()
            a = await SiblingRelay.start_for(a_live, WorkerRole(0, 2, directory))
            assert a is not None
            a_live.publish("job", "ns", "early", {"n": 0})  # worker 1 does not listen yet: kept for it
            b = await SiblingRelay.start_for(b_live, WorkerRole(1, 2, directory))
            assert b is not None
            b_stream = b_live.stream()
            assert (await _next(b_stream)).startswith("retry:")
            assert '"name":"early"' in await _next(b_stream, timeout=10)
            a_live.publish("points", "ns", "j", {"attempt": 1, "points": {"loss": {"step": 5}}})
            got = await _next(b_stream)
            assert got.startswith(f"id: {b_live.first_id + 1}\nevent: points\n") and '"step":5' in got
            a_stream = a_live.stream()
            await _next(a_stream)
            b_live.publish("job", "ns", "from-b", {})
            assert '"name":"from-b"' in await _next(a_stream)
            await asyncio.sleep(0.2)
            assert (a.received, b.received) == (1, 2)  # relayed updates are not sent back
            await b_stream.aclose()
            await a_stream.aclose()
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
            for i in range(50):  # worker 1 is away: more than MAX_BUFFER bytes wait for it, then are dropped
                a_live.publish("job", "ns", "j", {"blob": "x" * 200, "i": i})
                await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert a.dropped > 0
            b = await SiblingRelay.start_for(b_live, WorkerRole(1, 2, directory))
            assert b is not None
            b_stream = b_live.stream()
            await _next(b_stream)
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
