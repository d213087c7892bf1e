"""``LISTEN`` in a thread: a PostgreSQL database's notifications handed to callbacks, reconnecting.

One connection per process, kept open: it listens on a few channels, waits on its socket (and on a
pipe that :meth:`Listener.close` writes to, so closing takes no timeout), and hands each payload to
the callback of its channel. A lost connection is reported (``on_state(False)``) and reopened with
backoff; notifications sent while it was away are lost, which is why the store stops trusting its
cache until ``on_state(True)``. ``on_connect`` runs on each new connection just before its ``LISTEN``
statements: the store takes its presence lock there (``stepwatch.server.live.replicas``), which
PostgreSQL releases when that connection ends; :meth:`Listener.call` runs other work on the listening
connection, in its thread (a psycopg connection is used by one thread at a time): the store takes and
gives back its lock of a replica that wants live updates there.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

__all__ = ["Listener"]

_log = logging.getLogger("stepwatch.server")

LINGER_S = 0.005
"""How long the thread rests after handing over what it read, before it reads again: notifications that
arrive meanwhile are read and handed over together. Woken for each one, the thread cost ~25 us of CPU a
notification (a wake-up, a read, the interpreter's lock taken back from a busy event loop), and with N
replicas every replica hears every batch of the N - 1 others (measured: 0.02 ms of a replica's CPU per
report with one replica, 0.09 with three); a change or a live update from another replica arrives at
most this much later. A wake-up reads until nothing more has come (one read takes only what the
driver's buffer holds, two or three large notifications: a thread resting after each read fell behind a
busy database's notifications)."""


class Listener:
    """Listens on ``channels`` (name to callback) through connections made by ``connect``."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[tuple[Any, ...]]],
        channels: dict[str, Callable[[str], None]],
        on_state: Callable[[bool], None],
        keepalive_s: float = 30.0,
        linger_s: float = LINGER_S,
        on_connect: Callable[[psycopg.Connection[tuple[Any, ...]]], None] | None = None,
    ) -> None:
        self._connect = connect
        self._channels = channels
        self._on_state = on_state
        self._on_connect = on_connect
        self.pid = 0
        """The listening connection's backend process id (that of the last one while none is up)."""
        self._keepalive_s = keepalive_s
        self._linger_s = linger_s
        self.wakeups = 0
        """How many times the thread woke up to read notifications (each wake-up reads all that came)."""
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self.connected = threading.Event()
        self._calls: deque[tuple[Callable[[psycopg.Connection[tuple[Any, ...]]], None], threading.Event, list[bool]]]
        self._calls = deque()
        """Work for the listening connection (:meth:`call`): the work, set when done, whether it ran."""
        self._thread = threading.Thread(target=self._run, name="stepwatch-listen", daemon=True)

    def start(self, wait_s: float = 10.0) -> bool:
        """Start listening; whether the first connection listens within ``wait_s``."""
        self._thread.start()
        return self.connected.wait(wait_s)

    def close(self) -> None:
        """Stop listening and close the connection (at once: the thread is woken)."""
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(10)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def call(self, work: Callable[[psycopg.Connection[tuple[Any, ...]]], None], timeout_s: float = 10.0) -> bool:
        """Run ``work`` with the listening connection, in the listening thread (between two reads: within
        :data:`LINGER_S` when idle), and wait for it; whether it ran (``False`` at once while no connection
        listens, or when it raised: the connection is then opened again). Call from another thread."""
        if not self.connected.is_set():
            return False
        done, ran = threading.Event(), [False]
        self._calls.append((work, done, ran))
        try:
            os.write(self._wake_w, b"c")
        except OSError:
            return False
        done.wait(timeout_s)
        return ran[0]

    def _run_calls(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        while self._calls:
            work, done, ran = self._calls.popleft()
            try:
                work(conn)
                ran[0] = True
            finally:
                done.set()

    def _drop_calls(self) -> None:
        """Calls that no connection will run (the one they were for went): their callers go on."""
        while self._calls:
            self._calls.popleft()[1].set()

    def _dispatch(self, notify: psycopg.Notify) -> None:
        callback = self._channels.get(notify.channel)
        if callback is None:
            return
        try:
            callback(notify.payload)
        except Exception:
            _log.exception("a notification on %s could not be handled", notify.channel)

    def _run(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            conn: psycopg.Connection[tuple[Any, ...]] | None = None
            try:
                conn = self._connect()
                conn.add_notify_handler(self._dispatch)  # those that arrive while a statement runs
                if self._on_connect is not None:
                    self._on_connect(conn)
                for channel in self._channels:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                self.pid = conn.info.backend_pid
                self._on_state(True)
                self.connected.set()
                delay = 0.1
                self._listen(conn)
            except Exception as exc:
                if not self._stop.is_set():
                    _log.warning("listening to the database failed (%s); retrying in %.1f s", exc, delay)
            finally:
                if self.connected.is_set():
                    self.connected.clear()
                    self._on_state(False)
                self._drop_calls()
                if conn is not None:
                    conn.close()
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, 5.0)

    def _listen(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        pgconn = conn.pgconn
        while not self._stop.is_set():
            self._run_calls(conn)
            readable, _, _ = select.select([pgconn.socket, self._wake_r], [], [], self._keepalive_s)
            if self._wake_r in readable:
                os.read(self._wake_r, 4096)  # (readable: it does not block)
                if self._stop.is_set():
                    return
                self._run_calls(conn)
                readable.remove(self._wake_r)
                if not readable:
                    continue
            if not readable:
                conn.execute("SELECT 1")  # a connection the server dropped shows here, not in select
                continue
            self.wakeups += 1
            socket = pgconn.socket
            while readable:  # all that came: one read takes what the driver's buffer holds (a few notifications)
                pgconn.consume_input()
                while (notify := pgconn.notifies()) is not None:
                    self._dispatch(psycopg.Notify(notify.relname.decode(), notify.extra.decode(), notify.be_pid))
                readable, _, _ = select.select([socket], [], [], 0)
            if self._linger_s > 0 and self._stop.wait(self._linger_s):
                return
