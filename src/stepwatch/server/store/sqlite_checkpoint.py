"""Copying SQLite's write-ahead log back into the database file, in a thread of its own.

By default SQLite does it inside a commit, whenever the log has grown past 1,000 pages: the commit
then copies every page the log holds and syncs both files twice, on the writer's thread and under
the write lock. Under the ingest benchmark that was about a third of the store's time per report (the
event loop that writes stood still meanwhile), and a larger threshold traded it for longer stalls:
8,192 pages gave 9 % more reports/s and a p99 of 42 ms at the production pace, against 15 ms.

:class:`WalCheckpointer` copies the log every half second from a connection of its own
(``PRAGMA wal_checkpoint(PASSIVE)``): it waits for nobody and nobody waits for it, since the writer
goes on appending while it copies. SQLite starts the log again from its beginning at the first write
after a copy that found nothing new, which a moment without writes allows. Under writes without such a
moment the log would grow for good, so once it is :data:`RESTART_FRAMES` long the copy is made with
``RESTART`` while the store's writer is paused (its write lock: SQLite's own wait for its write lock
is no match for a writer that takes it back at once): the frames left since the last copy (half a
second of them) are copied, and the log starts again. The writer keeps SQLite's own copy at
:data:`FALLBACK_PAGES` in case this thread is stopped or cannot keep up.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

__all__ = ["FALLBACK_PAGES", "RESTART_FRAMES", "WalCheckpointer"]

_log = logging.getLogger("stepwatch.server")

RESTART_FRAMES = 8192
"""Log length (pages of 4 KiB: 32 MiB) from which the copy makes new writes wait and starts the log again."""

FALLBACK_PAGES = 4 * RESTART_FRAMES
"""The writer's own ``wal_autocheckpoint``: reached only when this thread does not run or falls behind."""

RESTART_WAIT_MS = 100
"""How long a restarting copy waits for readers of older snapshots and the writer before it gives up
(it is tried again half a second later): new writes wait while it waits."""


class WalCheckpointer:
    """Copies a database's write-ahead log into its file every ``every_s`` (see the module docstring).

    ``connect`` opens a connection to the database (in WAL mode); ``pause_writers`` holds every writer
    off while the log is restarted. ``copies`` and ``restarts`` count the copies made and those made
    with ``RESTART``.
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        pause_writers: Callable[[], AbstractContextManager[object]] = nullcontext,
        every_s: float = 0.5,
        restart_frames: int = RESTART_FRAMES,
    ) -> None:
        self._connect = connect
        self._pause_writers = pause_writers
        self.every_s = every_s
        self.restart_frames = restart_frames
        self.copies = 0
        self.restarts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (a daemon); when it cannot start, SQLite's own copy in commits remains."""
        try:
            self._thread = threading.Thread(target=self._run, name="stepwatch-wal-checkpoint", daemon=True)
            self._thread.start()
        except RuntimeError as exc:
            self._thread = None
            _log.warning("the write-ahead log is copied in commits: no thread for it (%s)", exc)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread after the copy it is making, if any."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None

    def copy(self, conn: sqlite3.Connection) -> tuple[int, int, int]:
        """One copy: ``PASSIVE``, then ``RESTART`` when the log is long; SQLite's (busy, log, copied) frames."""
        busy, log, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        self.copies += 1
        if log >= self.restart_frames:
            with self._pause_writers():
                busy, log, copied = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            self.restarts += 1
        return int(busy), int(log), int(copied)

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        failing = False
        try:
            while not self._stop.wait(self.every_s):
                try:
                    if conn is None:
                        conn = self._connect()
                        conn.execute(f"PRAGMA busy_timeout={RESTART_WAIT_MS}")
                    self.copy(conn)
                    failing = False
                except sqlite3.Error as exc:  # the file went away, the disk is full...: tried again later
                    if not failing:  # said once, not every half second
                        _log.warning("copying the write-ahead log into the database failed (tried again): %s", exc)
                    failing = True
                    if conn is not None:
                        conn.close()
                        conn = None
        finally:
            if conn is not None:
                conn.close()
