"""A server stop with live streams open is quick and quiet (``server.serving.stopping``,
:meth:`.Broadcaster.end_streams`), and two fixes of the broadcaster found beside it.

A live stream never ends by itself, and uvicorn runs the app's lifespan shutdown only after every connection
closed: ``stepwatch server`` stopped with a stream open took its whole ``timeout_graceful_shutdown`` (5 s),
then logged ``ERROR: Cancel 1 running task(s), timeout graceful shutdown exceeded`` and cut the stream (the
client read an incomplete chunked body). The server tests run the real command in a subprocess on loopback,
stop it with a real signal while an httpx client holds a stream open, and read its stderr; the last one
follows the clients of the stream across a stop and a restart.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from stepwatch.cli.watch import Feed
from stepwatch.client import Client, JobUpdate, Resync, Update
from stepwatch.server.live.broadcaster import Broadcaster
from stepwatch.testing import wait_for

QUICK_S = 1.5
"""The most a stop with a stream open may take (0.15-0.3 s here; uvicorn's own bound, the
``timeout_graceful_shutdown`` of ``stepwatch server``, is 5 s)."""

# ------------------------------------------------------------------------------------- the broadcaster


async def _next(stream: object, timeout: float = 1.0) -> str:
    return await asyncio.wait_for(stream.__anext__(), timeout)  # type: ignore[attr-defined]


async def _rest(stream: object, timeout: float = 1.0) -> list[str]:
    """What the stream still sends until it ends (``TimeoutError`` if it does not end within ``timeout``)."""
    got: list[str] = []

    async def read() -> None:
        async for text in stream:  # type: ignore[attr-defined]
            got.append(text)

    await asyncio.wait_for(read(), timeout)
    return got


def test_end_streams_ends_every_open_stream_after_what_it_holds() -> None:
    async def run() -> None:
        live = Broadcaster(first_id=1, heartbeat=30)
        streams = [live.stream(), live.stream("ns", "b")]
        for stream in streams:
            assert (await _next(stream)).startswith("retry:")
        live.publish("job", "ns", "a", {"x": 1})
        live.end_streams()
        assert [t.split("\n")[0] for t in await _rest(streams[0])] == ["id: 1"]  # sent, then the end
        assert await _rest(streams[1]) == []
        assert live.subscribers == 0

    asyncio.run(run())


def test_a_held_stream_ends_at_once_at_a_stop() -> None:
    async def run() -> None:
        live = Broadcaster(first_id=1)
        live.hold_s = 30.0  # (it would wait that long for the replicas' greeting)
        live.hold()
        stream = live.stream()
        first = asyncio.ensure_future(_next(stream, 5))
        await asyncio.sleep(0.01)
        live.end_streams()
        assert (await first).startswith("retry:")
        assert await _rest(stream) == []

    asyncio.run(run())


def test_a_stream_opened_after_the_stop_ends_after_what_it_missed() -> None:
    """A request that came in on a kept-alive connection during the stop ends too (the client goes on to the
    next server), with what it missed."""

    async def run() -> None:
        live = Broadcaster(first_id=1, heartbeat=30)
        live.publish("job", "ns", "a", {"x": 1})
        live.publish("job", "ns", "a", {"x": 2})
        live.end_streams()
        stream = live.stream(last_event_id=1)
        got = await _rest(stream)
        assert got[0].startswith("retry:") and [t.split("\n")[0] for t in got[1:]] == ["id: 2"]

    asyncio.run(run())


@pytest.mark.parametrize("held", [False, True], ids=["waiting for updates", "held"])
def test_a_cancel_that_comes_with_an_update_ends_the_stream(held: bool) -> None:
    """Python 3.11's ``asyncio.wait_for`` returned the result of an awaitable that completed as its task was
    cancelled, and dropped the cancel: a stream cancelled as an update woke it went on, sent the update and
    waited for the next one (for ever, heartbeats aside). The waits are ``asyncio.timeout`` now."""

    async def run() -> None:
        live = Broadcaster(first_id=1, heartbeat=30)
        if held:
            live.hold()
        stream = live.stream()
        got: list[str] = []

        async def read() -> None:
            async for text in stream:
                got.append(text)

        task = asyncio.ensure_future(read())
        for _ in range(3):
            await asyncio.sleep(0)
        if not held:
            assert got == ["retry: 2000\n\n"]
            live.publish("job", "ns", "a", {"x": 1})  # wakes the stream's wait ...
        else:
            live.release()  # wakes the held stream ...
        task.cancel()  # ... in the same turn of the loop as the cancel
        done, _ = await asyncio.wait([task], timeout=1)
        assert done and task.cancelled(), f"the cancelled stream went on and sent {got}"
        assert live.subscribers == 0

    asyncio.run(run())


def test_a_resync_drops_what_was_queued_before_it_and_keeps_what_follows() -> None:
    """What a stream holds at a ``resync`` (the replicas' handshake) was published before it, so it is in the
    database that the client reads again after the resync: sending it too was redundant. Nothing published after
    the resync point is lost."""

    async def run() -> None:
        live = Broadcaster(first_id=1, heartbeat=30)
        stream = live.stream()
        assert (await _next(stream)).startswith("retry:")
        live.publish("job", "ns", "a", {"x": 1})
        live.publish("points", "ns", "a", {"x": 2})
        live.resync("the others were not heard")
        live.publish("job", "ns", "a", {"x": 3})
        assert (await _next(stream)).startswith("event: resync\n")
        assert (await _next(stream)).startswith("id: 3\n")
        live.end_streams()
        assert await _rest(stream) == []

    asyncio.run(run())


def test_a_resync_while_a_stream_sends_drops_the_rest_it_held() -> None:
    async def run() -> None:
        live = Broadcaster(first_id=1, heartbeat=30)
        stream = live.stream()
        await _next(stream)
        for x in range(3):
            live.publish("job", "ns", "a", {"x": x})
        assert (await _next(stream)).startswith("id: 1\n")  # (suspended in the middle of what it holds)
        live.resync("gap")
        live.publish("job", "ns", "a", {"x": 9})
        assert (await _next(stream)).startswith("event: resync\n")
        assert (await _next(stream)).startswith("id: 4\n")

    asyncio.run(run())


# ------------------------------------------------------------------------------- a real server process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


PLAIN_UVICORN = """
import sys, uvicorn
from stepwatch.server import ServerSettings, create_app
app = create_app(ServerSettings(db=sys.argv[2]))
uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), timeout_graceful_shutdown=2)).run()
"""
"""What ``stepwatch server`` did before (``uvicorn.run``), with a bound of 2 s instead of 5."""


def _start(command: list[str], url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        wait_for(lambda: _answers(url) or server.poll() is not None, 30, "the server answers")
    except BaseException:
        server.kill()
        raise
    assert server.poll() is None, server.communicate()[1].decode()
    return server


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


class _Reader:
    """A live stream read in a thread as ``stepwatch watch`` reads it; ``ended``: how it ended."""

    def __init__(self, url: str) -> None:
        self.lines: list[str] = []
        self.ended: str | None = None
        self._open = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self._thread.start()
        assert self._open.wait(10), f"the stream did not open: {self.ended}"

    def _read(self, url: str) -> None:
        try:
            with httpx.stream("GET", url + "/api/v1/events", timeout=30) as response:
                for line in response.iter_lines():
                    self.lines.append(line)
                    self._open.set()
            self.ended = "ended"
        except Exception as exc:
            self.ended = f"{type(exc).__name__}: {exc}"
        self._open.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _stop_with_a_stream_open(command: list[str], sig: int) -> tuple[float, str, _Reader]:
    """Serve, open a stream, send ``sig``: seconds to the exit, stderr, and the stream."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start([*command[:1], *(a.format(port=port) for a in command[1:])], url)
    try:
        reader = _Reader(url)
        time.sleep(0.2)  # (the request's task is running, as a dashboard's is)
        began = time.monotonic()
        server.send_signal(sig)
        _, err = server.communicate(timeout=30)
        took = time.monotonic() - began
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    reader.join(5)
    return took, err.decode(errors="replace"), reader


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_stepwatch_server_stops_at_once_with_a_stream_open_and_ends_it(tmp_path: Path, sig: int) -> None:
    db = tmp_path / "sw.db"
    command = [sys.executable, "-m", "stepwatch", "server", "--port", "{port}", "--db", str(db)]
    took, err, reader = _stop_with_a_stream_open(command, sig)
    assert "ERROR" not in err, err
    assert "Finished server process" in err, err  # (the lifespan's shutdown ran: the store closed)
    assert took < QUICK_S, f"the stop took {took:.2f} s\n{err}"
    assert reader.ended == "ended", reader.ended  # a whole response, not a cut chunked body
    assert reader.lines[:1] == ["retry: 2000"]


def test_plain_uvicorn_waits_for_the_stream_and_cuts_it(tmp_path: Path) -> None:
    """What the test above would see without :class:`stepwatch.server.serving.Server` (its canary: the stream
    and the signal above do hold a plain uvicorn for its whole bound)."""
    db = tmp_path / "sw.db"
    took, err, reader = _stop_with_a_stream_open(
        [sys.executable, "-c", PLAIN_UVICORN, "{port}", str(db)], signal.SIGTERM
    )
    assert "ERROR:    Cancel 1 running task(s), timeout graceful shutdown exceeded" in err, err
    assert took >= 2.0, f"{took:.2f} s"
    assert reader.ended is not None and "incomplete chunked read" in reader.ended, reader.ended


def test_a_stop_asked_by_a_program_ends_the_streams_too(tmp_path: Path) -> None:
    """``should_exit`` set from another thread (a test's server, uvicorn's request limit) is a stop as a
    signal is: :class:`~stepwatch.server.serving.Server` hooks uvicorn's shutdown, not its signal handler."""
    from stepwatch.server import ServerSettings, create_app
    from stepwatch.server.serving import Server

    app = create_app(ServerSettings(db=str(tmp_path / "sw.db")))
    port = _free_port()
    server = Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 15, "uvicorn started")
    reader = _Reader(f"http://127.0.0.1:{port}")
    began = time.monotonic()
    server.should_exit = True
    thread.join(10)
    took = time.monotonic() - began
    reader.join(5)
    assert took < QUICK_S and reader.ended == "ended", (took, reader.ended)


# ------------------------------------------------------------------------------------------ the readers


class _Watch:
    """``Client.watch()`` of namespace ``ns`` in a thread, until its first ``Resync``."""

    def __init__(self, url: str) -> None:
        self.updates: list[Update] = []
        self.failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._follow, args=(url,), daemon=True)
        self._thread.start()

    def _follow(self, url: str) -> None:
        try:
            with Client(url) as client:
                for update in client.watch(None, "ns", timeout=60):
                    self.updates.append(update)
                    if isinstance(update, Resync):
                        return
        except BaseException as exc:  # said by the test
            self.failed.append(exc)

    def resynced(self) -> bool:
        return bool(self.failed) or isinstance(self.updates[-1:] and self.updates[-1], Resync)


class _Feed:
    """``stepwatch watch``'s feed of namespace ``ns``: what it handed out, by kind (``get`` raises an error)."""

    def __init__(self, url: str) -> None:
        self.feed = Feed(url, namespace="ns").start()
        self.kinds: list[str] = []

    def heard(self) -> list[str]:
        while (item := self.feed.get(timeout=0)) is not None:
            self.kinds.append(item[0])
        return self.kinds


def test_watchers_go_on_across_a_stop_and_a_restart(tmp_path: Path) -> None:
    """``Client.watch()`` and ``stepwatch watch``'s feed (``stepwatch jobs --watch`` and ``top`` read the same
    way) reconnect when the stop ends their stream, and go on with the restarted server, with no error. (The
    dashboard's ``EventSource`` does so by the standard: a stream that ends is opened again after the
    ``retry`` the server sent, 2 s, with ``Last-Event-ID``.)"""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "stepwatch", "server", "--port", str(port), "--db", str(tmp_path / "sw.db")]
    names = (f"j{i}" for i in itertools.count())
    first = _start(command, url)
    second = None
    try:
        watch, feed = _Watch(url), _Feed(url)
        with Client(url) as client:
            # both streams are open once both have heard a job registered (they open in their own time)
            wait_for(lambda: (watch.updates and feed.heard()) or (client.register(next(names), "ns") and False), 15)
        assert isinstance(watch.updates[0], JobUpdate)

        began = time.monotonic()
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=30)
        took = time.monotonic() - began
        assert took < QUICK_S and b"ERROR" not in err, (took, err.decode())

        second = _start(command, url)
        # Client.watch resumed with Last-Event-ID: the new server, whose ids start above the old one's, says resync
        wait_for(watch.resynced, 30, "the watch resumed")
        assert not watch.failed, watch.failed
        resync = watch.updates[-1]
        assert isinstance(resync, Resync) and "restarted" in resync.reason, resync
        # stepwatch watch's feed reconnected (in its own time: jobs are registered until it hears one), and said
        # resync before the first update it heard again (what changed meanwhile is not replayed: it re-reads)
        before = len(feed.heard())

        def fed_again() -> bool:
            after = feed.heard()[before:]
            return "resync" in after and "job" in after[after.index("resync") :]

        with Client(url) as client:
            wait_for(lambda: fed_again() or (client.register(next(names), "ns") and False), 30, every=0.2)
        assert feed.heard()[before] == "resync", feed.kinds
        feed.feed.close()
    finally:
        for server in (first, second):
            if server is not None and server.poll() is None:
                server.kill()
                server.wait()
