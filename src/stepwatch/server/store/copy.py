"""Copy a whole stepwatch database into another: SQLite to PostgreSQL (a laptop's history to the
replicas' database), PostgreSQL to SQLite, or SQLite to SQLite.

Every table both databases have is copied row for row, ids included (jobs, their reports, ranks,
points and roll-ups, commands, events with the verdicts and policies kept in the job rows, namespace
policies, API tokens and the audit log); PostgreSQL's spill of live updates, which holds nothing
lasting, is not. Both databases are opened by their stores first, so each is at this stepwatch's
schema (an older one is upgraded, as a server start would). Tables go in the order they refer to each
other, each in chunks in the order of its key, one transaction a chunk; into PostgreSQL a chunk goes
by ``COPY``. So a copy that stopped part-way (Ctrl-C, a lost connection) goes on from the last chunk
that committed when it is run again with ``resume``: each table restarts after the greatest key the
target holds. At the end every table is read again on both sides, in key order, and compared row for
row (floats to the bit, ``NaN`` as ``NaN``).

A target that already holds jobs is refused unless the copy resumes, and then only when every job it
holds is the source's same job (id, namespace, name and attempt): two different histories cannot be
merged without renumbering every id, which this does not do.
"""

from __future__ import annotations

import itertools
import marshal
import math
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .base import StoreError
from .schema import BOOL, FLOAT, TABLES, TEXT, Table, postgres_cast

__all__ = ["CopyReport", "Database", "TableCopy", "copy_database", "open_database"]

Progress = Callable[[str, int, int], None]
"""Called with (what: ``copying TABLE`` or ``verifying TABLE``, rows done so far, rows the source
holds) as the copy goes."""

CHUNK_ROWS = 50_000


@dataclass
class TableCopy:
    """What the copy did to one table."""

    name: str
    source_rows: int = 0
    copied: int = 0
    """Rows written by this run (a resumed copy writes only what was missing)."""
    target_rows: int = 0
    mismatches: list[str] = field(default_factory=list)
    """The first differences found by the verification (none when the copy is exact)."""


@dataclass
class CopyReport:
    """The copy, table by table, and whether every row matched."""

    tables: list[TableCopy] = field(default_factory=list)
    seconds: float = 0.0
    verify_seconds: float = 0.0
    """Of :attr:`seconds`, those spent reading both sides again to compare them."""

    @property
    def verified(self) -> bool:
        """Every table holds the same rows on both sides."""
        return all(t.source_rows == t.target_rows and not t.mismatches for t in self.tables)

    @property
    def rows(self) -> int:
        """Rows in the source, all tables."""
        return sum(t.source_rows for t in self.tables)


class Database:
    """One side of a copy: a DB-API connection to a SQLite file or a PostgreSQL database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = "postgres" if url.startswith(("postgresql://", "postgres://")) else "sqlite"
        self.conn: Any
        if self.dialect == "postgres":
            import psycopg

            self.conn = psycopg.connect(url)
        else:
            # (a copy reads the next chunk in a thread while this one is written: one thread at a time)
            self.conn = sqlite3.connect(_sqlite_path(url), isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA busy_timeout = 30000")

    @property
    def shown(self) -> str:
        """Where it is, to show (a PostgreSQL URL without its password)."""
        if self.dialect == "sqlite":
            return _sqlite_path(self.url)
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        host = parts.hostname or ""
        user = f"{parts.username}@" if parts.username else ""
        return f"postgresql://{user}{host}{f':{parts.port}' if parts.port else ''}{parts.path}"

    def sql(self, text: str) -> str:
        return text.replace("?", "%s") if self.dialect == "postgres" else text

    def rows(self, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.dialect == "sqlite":
            return list(self.conn.execute(text, params).fetchall())
        with self.conn.cursor(binary=True) as cur:  # binary: floats read without parsing text
            found: list[tuple[Any, ...]] = cur.execute(self.sql(text), params).fetchall()
        self.conn.commit()  # no transaction left open between reads (a long one holds back vacuum)
        return found

    def close(self) -> None:
        self.conn.close()


def open_database(url: str, *, must_exist: bool = False) -> Database:
    """The database ``url`` names (``sqlite:///PATH``, a plain path, or ``postgresql://...``), brought to
    this stepwatch's schema by its store (created when empty, upgraded when older); ``must_exist``: a
    SQLite file that is not there is an error, not a new empty database (a copy's source)."""
    if must_exist and not url.startswith(("postgresql://", "postgres://")):
        import os

        path = _sqlite_path(url)
        if not os.path.isfile(path):
            raise StoreError(f"no database at {path} (`stepwatch db stats` prints where the server keeps its own)")
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres import PostgresStore
        except ImportError as exc:
            raise StoreError(
                f"PostgreSQL needs its extra ({exc.name} is missing): pip install 'stepwatch[postgres]'"
            ) from None
        PostgresStore(url).close()
    else:
        from .sqlite import SQLiteStore

        SQLiteStore(_sqlite_path(url)).close()
    try:
        return Database(url)
    except Exception as exc:  # psycopg's or sqlite3's own error: one line for the user
        raise StoreError(f"cannot open {url}: {exc}") from None


def _sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url


def copied_tables(source: Database, target: Database) -> list[Table]:
    """The tables a copy carries: those both databases have, in creation order (a table after those
    it refers to)."""
    return [t for t in TABLES if t.has(source.dialect) and t.has(target.dialect)]


def _key(table: Table) -> tuple[str, ...]:
    """The columns a table's rows are ordered by, unique together: its primary key where it has one of
    several columns (points: PostgreSQL's, which SQLite's index by arrival also reads in order), else
    its id."""
    if table.key is not None:
        return table.key.columns
    for column in table.columns:
        if column.type.key or column.primary:
            return (column.name,)
    raise AssertionError(f"table {table.name} has no key")  # every declared table has one


def copy_database(
    source: Database,
    target: Database,
    *,
    resume: bool = False,
    progress: Progress | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> CopyReport:
    """Copy every row of ``source`` into ``target`` and verify it (see the module docstring).

    Raises :class:`StoreError` when the target holds jobs and ``resume`` is not set, or holds jobs
    that are not the source's.
    """
    import time

    started = time.monotonic()
    tables = copied_tables(source, target)
    _check_target(source, target, resume)
    report = CopyReport()
    for table in tables:
        done = TableCopy(table.name, source_rows=_count(source, table.name))
        done.copied = _copy_table(source, target, table, done.source_rows, progress, chunk_rows)
        report.tables.append(done)
    if target.dialect == "postgres":
        _reset_identities(target, tables)
    verifying = time.monotonic()
    for table, done in zip(tables, report.tables):
        done.target_rows = _count(target, table.name)
        done.mismatches = _compare(source, target, table, chunk_rows, done.source_rows, progress)
    report.seconds = time.monotonic() - started
    report.verify_seconds = time.monotonic() - verifying
    return report


def _count(db: Database, table: str) -> int:
    return int(db.rows(f"SELECT COUNT(*) FROM {table}")[0][0])


def _check_target(source: Database, target: Database, resume: bool) -> None:
    jobs = target.rows("SELECT id, namespace, name, attempt FROM jobs ORDER BY id")
    if not jobs:
        return
    if not resume:
        raise StoreError(
            f"{target.shown} already holds {len(jobs):,} jobs: copy into an empty database, or add --resume to "
            "go on with a copy of this same source that stopped part-way"
        )
    theirs = {row[0]: row for row in source.rows("SELECT id, namespace, name, attempt FROM jobs")}
    foreign = [row for row in jobs if theirs.get(row[0]) != row]
    if foreign:
        _, namespace, name, attempt = foreign[0]
        raise StoreError(
            f"{target.shown} holds {len(foreign):,} jobs the source does not have as they are there (the first: "
            f"{namespace}/{name} attempt {attempt}): it is not a part-way copy of this source, and two histories "
            "cannot be merged (their ids would clash); copy into an empty database"
        )


def _copy_table(
    source: Database, target: Database, table: Table, total: int, progress: Progress | None, chunk_rows: int
) -> int:
    key = _key(table)
    columns = [c.name for c in table.columns if c.type.sql(source.dialect) is not None or c.name == "rowid"]
    after = _last_key(target, table, key)
    already = _count(target, table.name) if after is not None else 0
    copied = 0
    if progress is not None:
        progress(f"copying {table.name}", already, total)
    convert = _converter(table, columns, source.dialect, target.dialect)
    for chunk in _ahead(_chunks(source, table, columns, key, after, chunk_rows)):
        rows = chunk if convert is None else [convert(row) for row in chunk]
        _write(target, table, columns, rows)
        copied += len(rows)
        if progress is not None:
            progress(f"copying {table.name}", already + copied, total)
    return copied


def _terms(db: Database, table: Table, key: tuple[str, ...]) -> list[str]:
    """The key's columns as ``ORDER BY`` terms that order alike in both databases: text by code point
    (PostgreSQL's default collation would sort ``run-a`` and ``runa`` as a language does)."""
    text = {c.name for c in table.columns if c.type is TEXT}  # (NAME columns are "C" already)
    return [f'{k} COLLATE "C"' if db.dialect == "postgres" and k in text else k for k in key]


def _last_key(db: Database, table: Table, key: tuple[str, ...]) -> tuple[Any, ...] | None:
    order = ", ".join(f"{term} DESC" for term in _terms(db, table, key))
    found = db.rows(f"SELECT {', '.join(key)} FROM {table.name} ORDER BY {order} LIMIT 1")
    return tuple(found[0]) if found else None


def _chunks(
    db: Database, table: Table, columns: list[str], key: tuple[str, ...], after: tuple[Any, ...] | None, size: int
) -> Iterator[list[tuple[Any, ...]]]:
    """A table's rows in key order, ``size`` at a time, after the key ``after`` (keyset pagination: each
    chunk is one indexed range read, however far into the table it is)."""
    picked = ", ".join(columns)
    order = ", ".join(_terms(db, table, key))
    name = table.name
    positions = [columns.index(k) for k in key]
    while True:
        if after is None:
            found = db.rows(f"SELECT {picked} FROM {name} ORDER BY {order} LIMIT {size}")
        else:
            marks = ", ".join("?" for _ in key)
            found = db.rows(
                f"SELECT {picked} FROM {name} WHERE ({order}) > ({marks}) ORDER BY {order} LIMIT {size}", after
            )
        if not found:
            return
        yield found
        last = found[-1]
        after = tuple(last[i] for i in positions)
        if len(found) < size:
            return


def _ahead(chunks: Iterator[list[tuple[Any, ...]]]) -> Iterator[list[tuple[Any, ...]]]:
    """The chunks of ``chunks``, each next one read in a thread while the caller works on the one before:
    reading one database overlaps writing (or reading) the other, both waiting outside the GIL."""
    with ThreadPoolExecutor(1, thread_name_prefix="stepwatch-copy") as pool:
        future = pool.submit(next, chunks, None)
        while (chunk := future.result()) is not None:
            future = pool.submit(next, chunks, None)
            yield chunk


def _converter(
    table: Table, columns: list[str], src: str, dst: str
) -> Callable[[tuple[Any, ...]], tuple[Any, ...]] | None:
    """How a row becomes what the target stores (``None``: as it is): booleans (SQLite's 0/1, PostgreSQL's
    bool) and NaN (SQLite keeps it as the text 'NaN', which it would otherwise turn into NULL). Worked out
    once a table: a copy calls it for every row."""
    types = {c.name: c.type for c in table.columns}
    bools = [i for i, name in enumerate(columns) if types[name] is BOOL]
    floats = [i for i, name in enumerate(columns) if types[name] is FLOAT]
    if src == dst or not (bools or floats):
        return None

    def convert(row: tuple[Any, ...]) -> tuple[Any, ...]:
        if not bools and dst == "postgres" and "NaN" not in row:  # most rows: one scan in C
            return row
        out = list(row)
        for i in bools:
            if out[i] is not None:
                out[i] = bool(out[i]) if dst == "postgres" else int(out[i])
        for i in floats:
            value = out[i]
            if dst == "postgres" and value == "NaN":
                out[i] = math.nan
            elif dst == "sqlite" and isinstance(value, float) and math.isnan(value):
                out[i] = "NaN"
        return tuple(out)

    return convert


def _write(target: Database, table: Table, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
    """One chunk in one transaction: ``COPY`` into PostgreSQL, one multi-row statement per 500 rows into
    SQLite (a key already there is left as it is: a resumed copy may write a chunk twice)."""
    names = ", ".join(columns)
    if target.dialect == "postgres":
        with (
            target.conn.transaction(),
            target.conn.cursor() as cur,
            cur.copy(f"COPY {table.name} ({names}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            # binary: no float written as text by Python and parsed back by the server (most of a point)
            copy.set_types([_binary_type(table, name) for name in columns])
            for row in rows:
                copy.write_row(row)
        return
    marks = "(" + ", ".join("?" for _ in columns) + ")"
    conn = target.conn
    conn.execute("BEGIN")
    try:
        for start in range(0, len(rows), 500):
            part = rows[start : start + 500]
            values = ", ".join(marks for _ in part)
            flat = [v for row in part for v in row]
            conn.execute(f"INSERT OR IGNORE INTO {table.name} ({names}) VALUES {values}", flat)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _binary_type(table: Table, column: str) -> str:
    """The PostgreSQL type a column's values are written as, in a binary ``COPY``."""
    return postgres_cast(next(c.type for c in table.columns if c.name == column))


def _reset_identities(target: Database, tables: list[Table]) -> None:
    """PostgreSQL's identity columns go on after the greatest id copied (ids were given, not drawn)."""
    for table in tables:
        for column in table.columns:
            if column.type.key:
                target.rows(
                    f"SELECT setval(pg_get_serial_sequence('{table.name}', '{column.name}'), "
                    f"GREATEST((SELECT MAX({column.name}) FROM {table.name}), 1))"
                )


def _compare(
    source: Database, target: Database, table: Table, size: int, total: int = 0, progress: Progress | None = None
) -> list[str]:
    """The first few rows that differ between the two sides of one table (empty when none do).

    Both sides are read in the same key order, in chunks; a chunk whose rows serialise to the same bytes
    (``marshal``: types and floats to the bit) on both sides is equal, at C speed; only a chunk that does
    not is compared row by row, where NaNs are equal whatever their bits."""
    key = _key(table)
    columns = [c.name for c in table.columns if c.type.sql(source.dialect) is not None or c.name == "rowid"]
    convert = _converter(table, columns, source.dialect, target.dialect)
    problems: list[str] = []
    theirs = _ahead(_chunks(target, table, columns, key, None, size))
    pending: list[tuple[Any, ...]] = []
    compared = 0
    for chunk in _ahead(_chunks(source, table, columns, key, None, size)):
        compared += len(chunk)
        if progress is not None:
            progress(f"verifying {table.name}", compared, total)
        mine = chunk if convert is None else [convert(row) for row in chunk]
        while len(pending) < len(mine) and (more := next(theirs, None)):
            pending = more if not pending else pending + more
        other, pending = pending[: len(mine)], pending[len(mine) :]
        if _same_bytes(mine, other):
            continue
        for row, their in itertools.zip_longest(mine, other):
            if their is None or _comparable(row) != _comparable(their):
                problems.append(f"{table.name} {dict(zip(columns, row))} != {their}")
                if len(problems) >= 5:
                    return problems
    if pending or next(theirs, []):
        problems.append(f"{table.name}: the target holds rows the source does not")
    return problems


def _same_bytes(mine: list[tuple[Any, ...]], other: list[tuple[Any, ...]]) -> bool:
    try:
        return marshal.dumps(mine, 2) == marshal.dumps(other, 2)  # version 2: no back-references
    except ValueError:  # a value marshal cannot write: row by row
        return False


def _comparable(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row whose NaNs compare equal (NaN != NaN) and whose floats compare to the bit."""
    return tuple(
        ("nan",) if isinstance(v, float) and math.isnan(v) else (v.hex() if isinstance(v, float) else v) for v in row
    )
