"""The PostgreSQL store: the same records and semantics as the SQLite one, for several replicas.

``PostgresStore("postgresql://user@host/db")`` opens a small pool of connections (``psycopg_pool``)
and migrates the schema (:mod:`.migrations`). Reads take a pooled connection in autocommit
mode; writes run one transaction at a time per process (as in SQLite: batches make that cheap) and
may run in several processes at once, so every write locks what it changes in the database:

- a job's row (``FOR NO KEY UPDATE``) before the job is read and written; a batch of reports locks
  the rows of all its jobs at once, in id order, so two replicas never deadlock over them;
- a registration takes an advisory lock on the job's name (two replicas cannot both create attempt 2);
- every transaction that adds events first takes an advisory lock, held to its commit, so event ids
  commit in order: a reader paging with ``after=id`` never skips one that commits late.

A report's writes (the report row, its rank, its windows) are one statement; the job's row is
written once per batch. Non-finite floats are PostgreSQL's own (NaN stays NaN, never NULL).

The names replicas share (notification channels, advisory locks: :func:`channel`, :func:`lock_key`)
are per schema: two stores on one database but in different schemas (tests, or two installations)
never hear each other's notifications nor wait on each other's locks.

**The cache.** Like the SQLite store, this one keeps recent jobs in memory (:class:`.JobCache`). Other
replicas write the same rows, so each write transaction also notifies (``pg_notify``, delivered at
commit) which jobs and names it changed; every store listens (:mod:`.postgres_notify`) and forgets
them. A job read or written is cached only if no notification about it arrived in between, and
nothing is served from the cache while the listening connection is down.

**Presence.** The listening connection holds a shared advisory lock (``lock_key(schema, "replica")``),
which PostgreSQL releases when that connection ends: :meth:`PostgresStore.others_present` counts the
other replicas from ``pg_locks``; while its replica wants the others' live updates (someone watches its
live stream: :meth:`PostgresStore.want_live`) that connection also holds a second one
(``lock_key(schema, "replica-wants")``, :meth:`PostgresStore.others_wanting`); and
:meth:`PostgresStore.send_presence` sends the hellos and acks by which the replica bridges agree on
relaying (``stepwatch.server.live.replicas``).

Every read and write both stores do with the same statements (jobs, history, commands, policies,
events, tokens, the audit log) is written once in :mod:`.sql_store`; how a batch of reports is
written, in :mod:`.postgres_ingest`; what a report changes in its job's row, once in :mod:`.job_updates`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import psycopg
from psycopg import conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from .base import StoreError
from .migrations import SCHEMA_VERSION, plan, postgres_version
from .postgres_ingest import PostgresIngest, text_array
from .postgres_notify import Listener
from .replica_cache import changes_payload
from .sql_access import SqlAccess
from .sql_dialect import POSTGRES, Connection, QmarkConnection
from .sql_history import SqlHistory

__all__ = ["PostgresStore", "channel", "lock_key", "redacted"]

_log = logging.getLogger("stepwatch.server")

_HELLO = ',"hello":'
_ACK = ',"ack":'
"""How :meth:`PostgresStore.send_presence`'s messages differ from a change's (``{"o":..,"j":..}``)."""

_NOTIFY_LIMIT = 7000
"""Bytes of a notification's payload this store sends at most (PostgreSQL's limit is 8,000)."""


def channel(schema: str, purpose: str) -> str:
    """The ``LISTEN`` channel of a schema for ``purpose`` (``jobs``, ``live``): short and quotable."""
    return f"stepwatch_{purpose}_{hashlib.blake2b(schema.encode(), digest_size=6).hexdigest()}"


def lock_key(schema: str, purpose: str) -> int:
    """A transaction advisory lock's key for ``purpose`` in a schema (a signed 64-bit integer)."""
    digest = hashlib.blake2b(f"stepwatch:{schema}:{purpose}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def redacted(url: str) -> str:
    """A connection URL without its password, to show in messages."""
    try:
        parts = conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "the PostgreSQL database"
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host', '')}{port}/{parts.get('dbname', '')}"


class PostgresStore(PostgresIngest, SqlHistory, SqlAccess):
    """The store of a PostgreSQL database, shareable by several server processes (see the module docstring)."""

    dialect = POSTGRES
    _CACHES_TOKENS = False  # another replica may revoke a token at any moment: see SqlAccess.api_token
    notify_limit = _NOTIFY_LIMIT
    """Bytes of a notification's payload at most; :meth:`send_live` spills longer ones into a table."""

    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout_s: float = 10.0) -> None:
        super().__init__()
        self.url = url
        self.where = redacted(url)
        self._connect_timeout = max(1, int(connect_timeout_s))
        try:
            with self._connect() as conn:
                row = conn.execute("SELECT current_schema()").fetchone()
                if row is None or row[0] is None:
                    raise StoreError(f"the database {self.where} has no schema to use (see its search_path)")
                self.schema = str(row[0])
                self._migrate(conn)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the database {self.where}: {_first_line(exc)}") from None
        self._jobs_channel = channel(self.schema, "jobs")
        self.live_channel = channel(self.schema, "live")
        self._pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]] = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "connect_timeout": self._connect_timeout},
            timeout=30.0,
            open=False,
            name=f"stepwatch-{self.origin}",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except PoolTimeout as exc:
            raise StoreError(f"cannot open the database {self.where}: {exc}") from None
        self._write_lock = threading.Lock()
        self._locked: set[str] = set()
        """The advisory locks the open transaction holds (see :meth:`_lock`)."""
        self._live_conn: psycopg.Connection[tuple[Any, ...]] | None = None
        """The connection :meth:`send_live` sends through (opened at its first call)."""
        self._live_lock = threading.Lock()
        self.live_handlers: list[Callable[[str], None]] = []
        """Callbacks of the live channel (the replica bridge's), called in the listening thread."""
        self.hello_handler: Callable[[str], None] | None = None
        """Called (in the listening thread) with the nonce of another replica's hello; it must answer it
        with :meth:`send_presence`. Without one, this store answers at once: it has no relay to put back."""
        self.ack_handlers: list[Callable[[str, int], None]] = []
        """Called (in the listening thread) with each ack heard: the hello's nonce, and the listening
        connection's process id of the replica that answered."""
        self.listening_handlers: list[Callable[[bool], None]] = []
        """Called (in the listening thread) when the listening connection comes up or goes down."""
        self._presence_key = lock_key(self.schema, "replica")
        self._wants_key = lock_key(self.schema, "replica-wants")
        self._wants = False
        """Whether this replica wants the others' live updates (:meth:`want_live`)."""
        self._wants_held = False
        """Whether the listening connection holds the lock of a replica that wants (its thread's)."""
        self._listener = Listener(
            self._connect,
            {
                self._jobs_channel: self._on_changed,
                self.live_channel: self._on_live,
            },
            self._on_listening,
            on_connect=self._be_present,
        )
        self._listener.start(connect_timeout_s)

    # ------------------------------------------------------------------------------- connections

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        return psycopg.connect(self.url, autocommit=True, connect_timeout=self._connect_timeout)

    def _migrate(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Bring the schema to :data:`.SCHEMA_VERSION` (see :mod:`.migrations`), one transaction, under a lock
        (replicas start together)."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.schema, "migrate"),))
            conn.execute("CREATE TABLE IF NOT EXISTS stepwatch_schema (version INTEGER NOT NULL)")
            row = conn.execute("SELECT version FROM stepwatch_schema").fetchone()
            version = 0 if row is None else postgres_version(int(row[0]))
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the database {self.where} has schema version {version}, newer than this server's "
                    f"{SCHEMA_VERSION}: upgrade stepwatch"
                )
            for _, statements in plan(self.dialect.name, version):
                for sql in statements:
                    conn.execute(sql)
            if row is None:
                conn.execute("INSERT INTO stepwatch_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
            elif version < SCHEMA_VERSION:  # (an old number of a current schema is left as it is)
                conn.execute("UPDATE stepwatch_schema SET version = %s", (SCHEMA_VERSION,))

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        for attempt in range(2):
            try:
                with self._pool.connection() as conn:
                    return conn.execute(sql, args).fetchall()
            except psycopg.OperationalError as exc:  # a connection the server closed: once more, on a new one
                if attempt:
                    raise StoreError(f"the database cannot be read: {_first_line(exc)}") from None
            except (psycopg.Error, PoolTimeout) as exc:
                raise StoreError(f"the database cannot be read: {_first_line(exc)}") from None
        raise AssertionError("unreachable")

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        try:
            with self._pool.connection() as conn:
                yield QmarkConnection(conn)
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(f"the database cannot be read: {_first_line(exc)}") from None

    @contextmanager
    def _write(self, *, pipeline: bool = True) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        """A write transaction, in pipeline mode: statements are sent without waiting for their answer
        until one is read, so ``BEGIN``, the writes, the notification and ``COMMIT`` share round trips."""
        with self._write_lock:
            epoch = self._cache.epoch
            self._remembered.clear()
            self._locked.clear()
            try:
                with (
                    self._pool.connection() as conn,
                    conn.pipeline() if pipeline else nullcontext(),
                    conn.transaction(),
                ):
                    yield conn
                    self._announce(conn)
                self._cache.written(self._remembered.values(), epoch)
            except (psycopg.Error, PoolTimeout) as exc:
                raise StoreError(f"the database cannot be written: {_first_line(exc)}") from None
            finally:
                self._remembered.clear()

    def _announce(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Tell the other replicas which jobs this transaction changed, and the names whose latest attempt
        it registered (delivered when it commits)."""
        if not self._remembered:
            return
        names = {(job.namespace, job.name) for job, _, latest in self._remembered.values() if latest}
        payload = changes_payload(self.origin, self._remembered, names, _NOTIFY_LIMIT)
        conn.execute("SELECT pg_notify(%s, %s)", (self._jobs_channel, payload))

    def _lock(self, conn: psycopg.Connection[tuple[Any, ...]], purpose: str) -> None:
        """A transaction advisory lock, once per transaction: a registration's on the job's name (two
        replicas cannot both create attempt 2), the events' (event ids commit in the order they are taken:
        a reader paging with ``after=id`` never skips one that commits late)."""
        if purpose not in self._locked:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key(self.schema, purpose),))
            self._locked.add(purpose)

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._listener.close()
        with self._live_lock:
            self._close_live()
        self._pool.close()

    # ------------------------------------------------------------------------------------ caching

    def _on_changed(self, payload: str) -> None:
        if _HELLO in payload or _ACK in payload:  # (a change's payload holds numbers and Kubernetes names only)
            self._on_presence(payload)
        else:
            self._cache.on_changed(payload)

    def _on_listening(self, listening: bool) -> None:
        self._cache.on_listening(listening)
        for handler in list(self.listening_handlers):
            handler(listening)

    def _on_live(self, payload: str) -> None:
        for handler in list(self.live_handlers):
            handler(payload)

    # ---------------------------------------------------------------------------------- replicas

    def _be_present(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """Hold the presence lock on the listening connection (shared: every replica holds it), just before
        its ``LISTEN`` (one round trip, during which a hello is not heard: its sender waits for the timeout,
        and this replica relays meanwhile)."""
        conn.execute("SELECT pg_advisory_lock_shared(%s)", (self._presence_key,))
        self._wants_held = False  # a new connection: it holds nothing yet
        self._hold_wants(conn)

    def _hold_wants(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        """The listening connection holds the lock of a replica that wants live updates while this store
        wants them (in the listening thread)."""
        wants = self._wants
        if wants and not self._wants_held:
            conn.execute("SELECT pg_advisory_lock_shared(%s)", (self._wants_key,))
            self._wants_held = True
        elif not wants and self._wants_held:
            conn.execute("SELECT pg_advisory_unlock_shared(%s)", (self._wants_key,))
            self._wants_held = False

    def want_live(self, wants: bool, timeout_s: float = 10.0) -> frozenset[int] | None:
        """Say whether this replica wants the other replicas' live updates: its listening connection holds
        the lock that :meth:`others_wanting` reads while it does (taken again by each new connection).
        Then, on that same connection, reads the listening connections of the other stores present (as
        :meth:`others_present`): the notifications committed before that read are handed over before this
        returns. ``None`` while the listening connection is down, or it did not answer in time (blocks:
        call from a worker thread)."""
        self._wants = wants
        found: list[frozenset[int]] = []

        def work(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
            self._hold_wants(conn)
            rows = conn.execute(_HOLDERS, _halves(self._presence_key)).fetchall()
            found.append(frozenset(int(pid) for (pid,) in rows if pid is not None and pid != conn.info.backend_pid))

        if not self._listener.call(work, timeout_s) or not found:
            return None
        return found[0]

    @property
    def listening(self) -> bool:
        """Whether the listening connection is up (notifications are heard)."""
        return self._listener.connected.is_set()

    def others_present(self) -> frozenset[int] | None:
        """The listening connections (backend process ids) of the other stores on this schema that hold
        the presence lock, or ``None`` while this store's own is down (it cannot tell)."""
        return self._holders(self._presence_key)

    def others_wanting(self) -> frozenset[int] | None:
        """The listening connections of the other stores on this schema that want live updates
        (:meth:`want_live`), or ``None`` while this store's own is down (it cannot tell)."""
        return self._holders(self._wants_key)

    def _holders(self, key: int) -> frozenset[int] | None:
        own = self._listener.pid
        if not self.listening:
            return None
        rows = self._read(_HOLDERS, _halves(key))
        return frozenset(int(pid) for (pid,) in rows if pid is not None and pid != own)

    def send_presence(self, kind: str, nonce: str) -> None:
        """Send a ``hello`` (a replica starts or listens again) or an ``ack`` of one (with this store's
        listening connection's process id) on the jobs channel, which every replica hears; a store before
        these reads either as a change of no job."""
        message: dict[str, Any] = {"o": self.origin, kind: nonce}
        if kind == "ack":
            message["p"] = self._listener.pid
        payload = json.dumps(message, separators=(",", ":"))
        with self._live_lock:
            try:
                self._live_connection().execute("SELECT pg_notify(%s, %s)", (self._jobs_channel, payload))
            except psycopg.Error as exc:
                self._close_live()
                raise StoreError(f"the database cannot be written: {_first_line(exc)}") from None

    def _on_presence(self, payload: str) -> None:
        """A hello or an ack heard (in the listening thread)."""
        message = json.loads(payload)
        if message.get("o") == self.origin:
            return  # this store's own
        if "hello" in message:
            handler = self.hello_handler
            if handler is not None:
                handler(str(message["hello"]))
                return
            try:
                self.send_presence("ack", str(message["hello"]))
            except StoreError as exc:
                _log.warning("a replica's hello could not be answered: %s", exc)
        elif "ack" in message:
            for ack in list(self.ack_handlers):
                ack(str(message["ack"]), int(message.get("p") or 0))

    def send_live(self, payloads: Sequence[str], now: float, origin: str = "", version: int | None = None) -> None:
        """Notify the other replicas of live updates (JSON texts), in order; large ones go through a table
        (the notification names the row, and ``origin``, so that the sender need not read it, and
        ``version`` when given, so that a replica that wants no update need not read it either).

        They go through a connection of their own, in autocommit mode and without waiting for the disk
        (``synchronous_commit`` off for its session: live updates are gone with the processes that hold
        them, and a ``NOTIFY`` gives its transaction an id, so a commit record): every notification of a
        call in one statement, one round trip. In a pooled connection they took four statements (``BEGIN``,
        ``SET LOCAL``, the notifications, ``COMMIT``), ~70 us of a replica's CPU each."""
        if not payloads:
            return
        with self._live_lock:
            try:
                conn = self._live_connection()
                sent: list[str] = []
                for payload in payloads:
                    if len(payload) <= _NOTIFY_LIMIT // 4 or len(payload.encode()) <= _NOTIFY_LIMIT:
                        sent.append(payload)
                        continue
                    # committed before the notification that names it is sent: there when it is heard
                    row = conn.execute(
                        "INSERT INTO live_spill (t, payload) VALUES (%s, %s) RETURNING id", (now, payload)
                    ).fetchone()
                    assert row is not None
                    notice: dict[str, Any] = {"o": origin} if version is None else {"o": origin, "v": version}
                    notice["spill"] = row[0]
                    sent.append(json.dumps(notice, separators=(",", ":")))
                # every notification in one statement (one transaction), not one each; unnest reads the
                # array in order
                conn.execute(
                    "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", (self.live_channel, text_array(sent))
                )
            except psycopg.Error as exc:
                self._close_live()  # a new connection at the next call
                raise StoreError(f"the database cannot be written: {_first_line(exc)}") from None

    def _live_connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        """The connection live updates and presence messages go through (under ``_live_lock``)."""
        conn = self._live_conn
        if conn is None or conn.closed:
            conn = self._live_conn = self._connect()
            conn.execute("SET synchronous_commit TO OFF")
        return conn

    def _close_live(self) -> None:
        conn, self._live_conn = self._live_conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

    def read_spill(self, spill_id: int) -> str | None:
        """A live update too large for a notification, by id."""
        rows = self._read("SELECT payload FROM live_spill WHERE id = %s", (spill_id,))
        return str(rows[0][0]) if rows else None

    def prune_spill(self, before: float) -> None:
        """Delete the large live updates sent before a time (every replica has read them by then)."""
        try:
            with self._pool.connection() as conn:
                conn.execute("DELETE FROM live_spill WHERE t < %s", (before,))
        except (psycopg.Error, PoolTimeout) as exc:
            raise StoreError(f"the database cannot be written: {_first_line(exc)}") from None


_HOLDERS = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    " AND classid = %s::bigint::oid AND objid = %s::bigint::oid"
)
"""The backends holding a shared advisory lock (its key's halves as arguments: :func:`_halves`)."""


def _halves(key: int) -> tuple[int, int]:
    """A bigint advisory lock's key as ``pg_locks`` shows it: its unsigned halves."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
