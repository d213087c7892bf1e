"""The embedded store: one SQLite file in WAL mode, one writer, many readers.

Writes go through one connection guarded by a lock (SQLite has one writer anyway; serialising them
here turns "database is locked" into waiting); each reading thread has its own connection, and WAL
lets reads proceed while a write is in progress. ``synchronous=NORMAL`` with WAL keeps every
committed transaction across a crash of the server process (SIGKILL included): an acknowledged
report is never lost. The schema carries its version in ``PRAGMA user_version`` (:mod:`.migrations`:
the schema and its versions are declared once for both stores); no upgrade loses data.

One server process serves the file (several processes scale out on PostgreSQL instead). Other
programs may still write it now and then (``stepwatch db`` commands, ``stepwatch token create --db``,
a hand-made ``sqlite3`` session): at its next write this store sees that the file changed under it
(``PRAGMA data_version``) and forgets everything it kept in memory, and tells its listeners
(:class:`.ReplicaCache`).

How a report is written is in :mod:`.sqlite_ingest`, and every read and write both stores do with the
same statements (jobs, history, commands, policies, events, tokens, the audit log) in :mod:`.sql_store`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .base import StoreError
from .migrations import SCHEMA_VERSION, plan
from .sql_access import SqlAccess
from .sql_dialect import SQLITE
from .sql_history import SqlHistory
from .sqlite_checkpoint import FALLBACK_PAGES, WalCheckpointer
from .sqlite_files import prepare_database_path
from .sqlite_ingest import SQLiteIngest, WouldWait

__all__ = ["SQLiteStore"]


BUSY_TIMEOUT_MS = 10_000
"""How long a write waits for another process's write lock before it fails ("database is locked")."""


class SQLiteStore(SQLiteIngest, SqlHistory, SqlAccess):
    """The embedded default store (see the module docstring)."""

    dialect = SQLITE

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            try:
                prepare_database_path(self.path)
            except OSError as exc:
                raise StoreError(f"cannot create the directory of the database {self.path}: {exc}") from None
        super().__init__()
        self._write_lock = threading.Lock()
        self._cache.on_listening(True)  # told of no other writer's changes: it forgets all instead
        self._data_version: int | None = None
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._in_use = _InUse()
        """Reads and writes under way: :meth:`close` waits for them (closing a connection another thread
        is reading from crashes the process: a server stopped while a worker thread still read)."""
        self._checkpointer = WalCheckpointer(self._open, pause_writers=lambda: self._write_lock)
        """Copies the write-ahead log into the file, away from the writer (``store.sqlite_checkpoint``);
        started once the database is open and up to date."""
        self._writer = self._connect()
        self._busy_ms = int(self._writer.execute("PRAGMA busy_timeout").fetchone()[0])
        """How long the writer waits for another process's lock (what a write that must not wait restores)."""
        self._migrate()
        self._writer.execute(f"PRAGMA wal_autocheckpoint={FALLBACK_PAGES}")  # copied back by a thread instead
        (self._data_version,) = self._writer.execute("PRAGMA data_version").fetchone()
        if self.path != ":memory:":
            self._checkpointer.start()

    # ------------------------------------------------------------------------------- connections

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = self._open()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the database {self.path}: {exc}") from None
        self._all.append(conn)
        return conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        return conn

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    @contextmanager
    def _write(self, wait: bool = True, *, pipeline: bool = True) -> Iterator[sqlite3.Connection]:
        """The writer's transaction; ``wait=False``: :class:`.WouldWait` rather than waiting for the lock
        of this store (another thread writes) or of the file (another program writes). (``pipeline``:
        each statement is a call into the library, answered at once.)"""
        if not self._write_lock.acquire(blocking=wait):
            raise WouldWait
        try:
            self._in_use.enter()
        except StoreError:
            self._write_lock.release()
            raise
        try:
            conn = self._writer
            self._begin(conn, wait)
            epoch = self._cache.epoch
            self._remembered.clear()
            self._memo.rollback()
            try:
                yield conn
                conn.execute("COMMIT")
                self._cache.written(self._remembered.values(), epoch)
                self._remembered.clear()
                self._memo.commit()
            except BaseException as exc:
                self._remembered.clear()
                self._memo.rollback()
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(exc, sqlite3.Error):  # disk full, I/O error, corruption...
                    raise StoreError(f"the database cannot be written: {exc}") from None
                raise
        finally:
            self._write_lock.release()
            self._in_use.exit()

    def _begin(self, conn: sqlite3.Connection, wait: bool) -> None:
        """Open the write transaction; when another program wrote the file since the last one, forget
        what was kept in memory."""
        try:
            if wait:
                conn.execute("BEGIN IMMEDIATE")
            else:
                conn.execute("PRAGMA busy_timeout=0")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                finally:
                    conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
            (version,) = conn.execute("PRAGMA data_version").fetchone()
        except sqlite3.OperationalError as exc:
            if not wait and not conn.in_transaction and "locked" in str(exc):
                raise WouldWait from None
            raise StoreError(f"the database cannot be written: {exc}") from None
        except sqlite3.Error as exc:
            raise StoreError(f"the database cannot be written: {exc}") from None
        if version != self._data_version:  # another program wrote the file: what we cached may be old
            self._forget_all()
            self._data_version = version

    def _forget_all(self) -> None:
        self._cache.on_listening(True)
        self._memo.clear()
        self._forget_tokens()

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._in_use:
                return self._reader().execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"the database cannot be read: {exc}") from None

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        try:
            with self._in_use:
                yield self._reader()
        except sqlite3.Error as exc:
            raise StoreError(f"the database cannot be read: {exc}") from None

    def _migrate(self) -> None:
        """Bring the schema to :data:`.SCHEMA_VERSION`, a transaction per version (see :mod:`.migrations`)."""
        (version,) = self._writer.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            self.close()
            raise StoreError(
                f"the database {self.path} has schema version {version}, newer than this stepwatch's "
                f"{SCHEMA_VERSION}: upgrade stepwatch (an older one cannot read it)"
            )
        with self._write_lock:
            for target, statements in plan(self.dialect.name, version):
                script = "".join(f"{sql};\n" for sql in statements)
                self._writer.executescript(f"BEGIN;\n{script}PRAGMA user_version = {target};\nCOMMIT;")

    def close(self) -> None:
        """Close every connection, once the reads and writes under way are done (at most 5 s)."""
        self._in_use.close(5.0)
        self._checkpointer.close()
        for conn in self._all:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._all.clear()


class _InUse:
    """Counts the store's uses under way (a context manager, or :meth:`enter`/:meth:`exit`); after
    :meth:`close`, a new use is a :class:`StoreError`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0
        self._closed = False

    def enter(self) -> None:
        with self._cond:
            if self._closed:
                raise StoreError("the store is closed")
            self._count += 1

    def exit(self) -> None:
        with self._cond:
            self._count -= 1
            if not self._count:
                self._cond.notify_all()

    def __enter__(self) -> None:
        self.enter()

    def __exit__(self, *exc: object) -> None:
        self.exit()

    def close(self, timeout: float) -> None:
        """No new use; wait up to ``timeout`` seconds for those under way."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._count == 0, timeout)
