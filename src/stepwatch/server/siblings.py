"""Live updates across the worker processes of one server: what one publishes, every other one publishes too.

``stepwatch server --workers N`` runs N processes on one port and one database (:mod:`.workers`). A
report ingested by one worker must reach the dashboards and ``stepwatch watch`` streams connected to
the others, so each worker listens on a Unix socket of its own in a private directory (mode 0700,
made by the supervisor) and sends every update it publishes to each sibling's socket. Both ends are
the same program, started by the same supervisor as the same user, so the messages are pickles:
several times cheaper than JSON, and the relay costs every report twice (once sent, once received
by each sibling).

Sending never blocks the publisher: the updates of one turn of the event loop go as one frame
(a 4-byte length and a pickled list), written to a transport that buffers. Frames for a sibling that
is not listening yet (starting, restarting) wait for it; it is tried every :data:`RETRY_S`. Once more
than :data:`MAX_BUFFER` bytes wait for one sibling, its updates are dropped and its streams are told
to read the state again (a ``resync``), as a slow client is.

A worker is sent its siblings' updates only while it has live streams open: each tells the others
when its first stream opens and when its last one closes (a ``want`` message, and on every new
connection; until a worker has said, it is sent everything), so that a server whose
dashboards are closed, or open on one worker, does not pay for relaying to the others (7-9 % of the
workers' CPU in a py-spy profile under ``benchmarks/server_ingest.py``; the throughput it gained
there stayed within the run-to-run noise). A worker that starts wanting again
has missed updates meanwhile: a client resuming from before that is told to resync
(:meth:`.Broadcaster.resumed`), and a stream opened at that moment may miss what the siblings
published in the millisecond before they heard of it.

Each worker numbers its own stream (as replicas do): a client reconnecting to another worker with a
``Last-Event-ID`` is told to resync.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import struct
from dataclasses import dataclass
from typing import Any

from .live import Broadcaster, Update

__all__ = ["MAX_BUFFER", "RETRY_S", "SiblingRelay", "WorkerRole", "socket_path"]

_log = logging.getLogger("stepwatch.server")

MAX_BUFFER = 8 * 1024 * 1024
"""Bytes waiting for one sibling beyond which its updates are dropped (and its streams resynced)."""

RETRY_S = 0.5
"""How often a sibling that is not listening is tried again (while there are updates to send)."""

_FRAME = struct.Struct("!I")
_GAP = "gap"
_WANT = "want"


@dataclass(frozen=True)
class WorkerRole:
    """Which of a server's worker processes this one is (see :mod:`.workers`)."""

    index: int
    count: int
    directory: str
    """The private directory of the workers' sockets."""

    @property
    def primary(self) -> bool:
        """The worker that also does what must be done once: retention, the Kubernetes runner, the
        silence of jobs no worker tracks, the policies' reviews."""
        return self.index == 0


def socket_path(directory: str, index: int) -> str:
    """Where worker ``index`` listens for its siblings' updates."""
    return os.path.join(directory, f"worker-{index}.sock")


class _Inbound(asyncio.Protocol):
    """Frames from one sibling, published here as relayed updates."""

    def __init__(self, live: Broadcaster, relay: SiblingRelay) -> None:
        self._live = live
        self._relay = relay
        self._buffer = bytearray()
        self._sibling: _Sibling | None = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self._buffer)
            if len(self._buffer) < _FRAME.size + size:
                return
            frame = bytes(self._buffer[_FRAME.size : _FRAME.size + size])
            del self._buffer[: _FRAME.size + size]
            try:
                updates = pickle.loads(frame)
            except Exception:
                _log.exception("a live update from a sibling worker could not be read; its streams resync")
                self._live.mark_lost()
                continue
            for kind, namespace, name, payload in updates:
                if kind == _WANT:
                    self._sibling = self._relay.heard_want(int(namespace), bool(payload.get("wants")))
                elif kind == _GAP:
                    self._live.mark_lost()
                else:
                    self._relay.received += 1
                    self._live.publish(kind, namespace, name, payload, relayed=True)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._sibling is not None:  # it stopped: its next life says what it wants when it connects
            self._sibling.wants = True


class _Sibling:
    """The connection to one sibling's socket (made at start, and again after it is lost), and what waits
    for it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.transport: asyncio.WriteTransport | None = None
        self.backlog: list[bytes] = []
        """Frames waiting for it to listen."""
        self.waiting = 0
        """Bytes in the backlog."""
        self.gap = False
        """Updates for it were dropped: tell it before the next ones."""
        self.wants = True
        """It has live streams open, or has not said yet (a worker starting, or restarting): it is sent
        every update, kept for it while it does not listen."""
        self.hello: bytes | None = None
        """What it is told first on every new connection (whether this worker wants updates)."""

    @property
    def up(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send(self, frame: bytes) -> bool:
        """Write a frame, or keep it for later; whether it was sent (``False``: kept or dropped)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            if self.waiting + len(frame) > MAX_BUFFER:
                self.backlog.clear()
                self.waiting = 0
                self.gap = True
                return False
            self.backlog.append(frame)
            self.waiting += len(frame)
            return False
        if transport.get_write_buffer_size() > MAX_BUFFER:
            self.gap = True
            return False
        if self.gap:
            transport.write(_frame([(_GAP, "", "", {})]))
            self.gap = False
        transport.write(frame)
        return True

    def connected(self, transport: asyncio.WriteTransport) -> None:
        """The sibling listens: whether this worker wants updates, then what waited for it."""
        self.transport = transport
        if self.hello is not None:
            transport.write(self.hello)
        backlog, self.backlog, self.waiting = self.backlog, [], 0
        for frame in backlog:
            self.send(frame)


class SiblingRelay:
    """Relays live updates between this worker and the other workers of the same server."""

    def __init__(self, live: Broadcaster, directory: str, index: int, count: int) -> None:
        self._live = live
        self.directory = directory
        self.index = index
        self._siblings = {i: _Sibling(socket_path(directory, i)) for i in range(count) if i != index}
        self._pending: list[tuple[str, str, str, dict[str, Any]]] = []
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._keeper: asyncio.Task[None] | None = None
        self.sent = 0
        self.received = 0
        self.dropped = 0

    @classmethod
    async def start_for(cls, live: Broadcaster, worker: WorkerRole | None) -> SiblingRelay | None:
        """The started relay of a worker that has siblings (``None`` for a server of one process)."""
        if worker is None or worker.count < 2:
            return None
        relay = cls(live, worker.directory, worker.index, worker.count)
        await relay.start()
        return relay

    async def start(self) -> None:
        """Listen for the siblings' updates and pass on this worker's (call from the serving event loop)."""
        self._loop = asyncio.get_running_loop()
        path = socket_path(self.directory, self.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by this worker's previous life
        self._server = await self._loop.create_unix_server(lambda: _Inbound(self._live, self), path)
        self._live.relays.append(self._outgoing)
        self._live.watchers.append(self._streaming)
        self._say_want(False)
        self._keeper = self._loop.create_task(self._keep_connected())

    async def aclose(self) -> None:
        """Stop relaying; what is queued is written first."""
        with contextlib.suppress(ValueError):
            self._live.relays.remove(self._outgoing)
        with contextlib.suppress(ValueError):
            self._live.watchers.remove(self._streaming)
        self._flush()
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        for sibling in self._siblings.values():
            if sibling.transport is not None:
                sibling.transport.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def heard_want(self, index: int, wants: bool) -> _Sibling | None:
        """Sibling ``index`` said whether it has live streams open."""
        sibling = self._siblings.get(index)
        if sibling is not None:
            sibling.wants = wants
        return sibling

    def _streaming(self, streaming: bool) -> None:
        """This worker's first live stream opened (``True``) or its last one closed."""
        if streaming:
            self._live.resumed()  # what the siblings published while no one watched here never came
        self._say_want(streaming)

    def _say_want(self, wants: bool) -> None:
        frame = _frame([(_WANT, str(self.index), "", {"wants": wants})])
        for sibling in self._siblings.values():
            sibling.hello = frame
            if sibling.up:
                sibling.send(frame)

    def _outgoing(self, update: Update) -> None:
        """An update published here (on the event loop): sent to the siblings at the end of this turn."""
        if not any(sibling.wants for sibling in self._siblings.values()):
            return
        if not self._pending and self._loop is not None:
            self._loop.call_soon(self._flush)
        self._pending.append((update.kind, update.namespace, update.name, update.data))

    def _flush(self) -> None:
        if not self._pending:
            return
        updates, self._pending = self._pending, []
        frame: bytes | None = None
        for sibling in self._siblings.values():
            if not sibling.wants:
                continue  # no live stream there: nothing to relay
            frame = frame or _frame(updates)
            if sibling.send(frame):
                self.sent += len(updates)
            elif sibling.gap:
                self.dropped += len(updates)

    async def _keep_connected(self) -> None:
        """Connect to every sibling that does not listen yet (or any more), every :data:`RETRY_S`."""
        assert self._loop is not None
        while True:
            for sibling in self._siblings.values():
                if not sibling.up:
                    try:
                        transport, _ = await self._loop.create_unix_connection(asyncio.Protocol, sibling.path)
                    except OSError:
                        continue  # not listening yet (starting, restarting)
                    sibling.connected(transport)
            await asyncio.sleep(RETRY_S)


def _frame(updates: list[tuple[str, str, str, dict[str, Any]]]) -> bytes:
    body = pickle.dumps(updates, protocol=pickle.HIGHEST_PROTOCOL)
    return _FRAME.pack(len(body)) + body
