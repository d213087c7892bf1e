"""Limits of the live stream (issue 21, items 2, 3 and 11), written as the attacks: many streams from
one client, many streams in all, a ring of recent updates filled with big updates, a job with
hundreds of metric names whose every update would carry them all. Streams are opened on a real
uvicorn socket (an in-process ASGI client buffers a streaming response)."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from stepwatch.server.app import create_app
from stepwatch.server.live.broadcaster import Broadcaster, TooManyStreams, Update
from stepwatch.server.settings import ServerSettings
from stepwatch.server.store import Store
from stepwatch.server.views.serialisers import COMPACT_METRICS

PER_CLIENT = 3


@pytest.fixture
def app(store: Store, clock: Any) -> Starlette:
    """The tests' server with a small limit of streams per client."""
    return create_app(
        ServerSettings(live_streams_per_client=PER_CLIENT, allowed_hosts=("testserver",)), store=store, clock=clock
    )


def _open(base: str) -> tuple[socket.socket, bytes]:
    """A raw stream connection; its answer's head (and what came with it)."""
    host, port = base.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), timeout=5)
    conn.sendall(f"GET /api/v1/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = conn.recv(4096)
        assert chunk, "the server closed the connection"
        received += chunk
    return conn, received


def test_streams_beyond_the_limit_per_client_get_429_with_retry_after(app: Starlette, serve: Any) -> None:
    with serve(app) as base:
        opened = [_open(base) for _ in range(PER_CLIENT)]
        try:
            assert all(head.startswith(b"HTTP/1.1 200") for _, head in opened)
            refused = httpx.get(f"{base}/api/v1/events", timeout=5)
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "10"
            assert "limit per client" in refused.json()["message"]
            assert httpx.get(f"{base}/healthz").json()["subscribers"] == PER_CLIENT
            # one closes: its place is free again
            opened.pop()[0].close()
            for _ in range(200):
                again = _open(base)
                if again[1].startswith(b"HTTP/1.1 200"):
                    opened.append(again)
                    break
                again[0].close()
                time.sleep(0.02)
            else:
                pytest.fail("a closed stream's place was never freed")
        finally:
            for conn, _ in opened:
                conn.close()


def test_the_limit_in_all_holds_across_clients_and_a_stream_never_read_is_counted_off() -> None:
    async def scenario() -> None:
        live = Broadcaster(max_streams=4, max_per_client=2)
        streams = [live.stream(client=f"token:{i}") for i in range(4)]
        assert live.subscribers == 4
        with pytest.raises(TooManyStreams) as refused:
            live.stream(client="token:new")
        assert refused.value.retry_after == 30 and "4 live streams" in refused.value.message
        del streams[:2]  # dropped before anyone read them (the client left at once)
        gc.collect()
        assert live.subscribers == 2
        again = live.stream(client="token:0")
        assert await again.__anext__() == "retry: 2000\n\n"
        await again.aclose()
        assert live.subscribers == 2

    asyncio.run(scenario())


def test_the_ring_of_recent_updates_is_bounded_in_bytes_and_resumes_say_what_fell_out() -> None:
    async def scenario() -> list[str]:
        live = Broadcaster(history=2048, ring_bytes=256 * 1024, first_id=1)
        big = {"blob": "x" * 10_000}
        for i in range(500):  # 5 MB published
            live.publish("job", "ns", f"j{i}", big)
        count, size = live.ring_size
        assert size <= 256 * 1024 and 20 <= count <= 26  # ~10 KB each: the bytes bound it, not the count
        stream = live.stream(last_event_id=10)
        messages = [await stream.__anext__() for _ in range(3)]
        await stream.aclose()
        return messages

    messages = asyncio.run(scenario())
    assert messages[1].startswith("event: resync\n")
    assert messages[2].startswith("id: ")


def test_every_subscriber_shares_one_text_of_an_update() -> None:
    async def scenario() -> None:
        live = Broadcaster(heartbeat=10)
        streams = [live.stream() for _ in range(3)]
        for s in streams:
            assert await s.__anext__() == "retry: 2000\n\n"
        live.publish("points", "ns", "j", {"points": {"loss": 1.0}})
        texts = [await s.__anext__() for s in streams]
        assert texts[0] is texts[1] is texts[2]  # written once, not once per subscriber
        for s in streams:
            await s.aclose()

    asyncio.run(scenario())


def test_a_job_update_does_not_carry_hundreds_of_metrics_each_time(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    published: list[Update] = []
    api.client.app.state.services.live.relays.append(published.append)
    token = api.register("wide")
    metrics = {f"layer{i:03d}/grad_norm": float(i) for i in range(200)} | {"loss": 0.5}
    api.report_ok("wide", token, make_report(0, 1, metrics))
    more = {f"layer{i:03d}/update_ratio": float(i) for i in range(100)}
    api.report_ok("wide", token, make_report(1, 2, more))
    job_update = [u for u in published if u.kind == "job" and u.name == "wide"][-1]
    shown = job_update.data["job"]["metrics"]
    assert len(shown) == COMPACT_METRICS and shown["loss"] == 0.5
    assert "params" not in job_update.data["job"] and "trainerStatus" not in job_update.data["job"]
    assert len(job_update.text) < 8_000
    assert [len(u.data["points"]) for u in published if u.kind == "points"] == [201, 100]  # each value once
    assert len(api.job("wide")["metrics"]) == 301  # and a GET of the job has them all
