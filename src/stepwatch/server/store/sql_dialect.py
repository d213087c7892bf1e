"""How SQLite and PostgreSQL differ in the SQL the two stores share: one small dialect object each.

The shared reads and writes (:mod:`.sql_store`), the roll-ups (:mod:`.rollups`) and retention
(:mod:`.retention`) are written once, with ``?`` placeholders, in the SQL both databases understand
(``ON CONFLICT ... DO UPDATE``, ``RETURNING``, recursive CTEs, window functions). What is left to
differ is small, and held here: the driver's placeholder, the name of a function or two, how a list
of values is passed, the clause that locks a row for the rest of a write transaction, how a
window's NaN is stored, and how rows' texts are joined in order into one list (a job's verdicts).
The schema's types are in :mod:`.schema`.

**Why not SQLAlchemy Core.** It would write these few differences for us, but it is not a
dependency today, and adding it to the ``server`` extra costs an install of several megabytes for
every server; each statement would be compiled by it (cached, still more work per call than a
dictionary lookup); and the hand-tuned ingest of each store (one statement per report in
PostgreSQL, sent in pipeline mode; SQLite's plain calls) would stay plain SQL anyway, so the stores
would be written two ways. The differences fit in the object below.

SQL given to :meth:`Dialect.sql` must not hold a ``?`` or a ``%`` of its own (in a string literal):
the first is read as a placeholder, the second is psycopg's escape character.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Protocol

__all__ = ["POSTGRES", "SQLITE", "Connection", "Dialect", "QmarkConnection"]


class _Cursor(Protocol):
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """A connection that takes ``?`` placeholders (``sqlite3`` has it; :class:`QmarkConnection` gives it
    to psycopg's): what the roll-ups and retention run their SQL on."""

    def execute(self, sql: str, parameters: Any = ..., /) -> _Cursor: ...

    def executemany(self, sql: str, parameters: Any, /) -> Any: ...


class _Driver(Protocol):
    def execute(self, query: Any, params: Any = ..., /) -> Any: ...

    def cursor(self) -> Any: ...


class QmarkConnection:
    """A connection of a ``%s`` driver (psycopg) that takes ``?`` placeholders."""

    def __init__(self, conn: _Driver) -> None:
        self.conn = conn

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        return self.conn.execute(_format_style(sql), parameters)

    def executemany(self, sql: str, parameters: Any, /) -> None:
        with self.conn.cursor() as cursor:
            cursor.executemany(_format_style(sql), parameters)


@lru_cache(maxsize=4096)
def _format_style(sql: str) -> str:
    return sql.replace("?", "%s")


@dataclass(frozen=True)
class Dialect:
    """What differs between the two databases in the SQL the stores share."""

    name: str
    """``sqlite`` or ``postgres`` (the key of the schema's types, :mod:`.schema`)."""
    param: str
    """The driver's placeholder: ``?`` (sqlite3) or ``%s`` (psycopg)."""
    least: str
    """The function of the smaller of two values: SQLite's ``MIN``, PostgreSQL's ``LEAST``."""
    position: str
    """The function of where a text is found in another (0: not found): ``instr``, ``strpos``."""
    lock_row: str
    """Appended to a ``SELECT`` of rows to lock them until the transaction ends (empty: a write
    transaction holds the whole database already, as SQLite's does)."""
    arrays: bool
    """A list of values is one parameter (``= ANY(?)``), not one placeholder per value."""
    nan_as_text: bool
    """A window's NaN ``last`` is stored as the text ``'NaN'`` (SQLite would store ``NULL``)."""
    ordered_aggregates: bool
    """An aggregate takes an ``ORDER BY`` of its own (PostgreSQL; SQLite only from 3.44, so there the rows are
    ordered by a subquery, whose order ``group_concat`` follows)."""

    def sql(self, text: str) -> str:
        """A statement written with ``?`` placeholders, in the driver's own."""
        return text if self.param == "?" else _format_style(text)

    def qmark(self, conn: Any) -> Connection:
        """A connection of the driver that takes ``?`` placeholders (the same one for sqlite3)."""
        return conn if self.param == "?" else QmarkConnection(conn)

    def in_list(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``column`` is one of ``values``, with ``?`` placeholders, and its arguments (no value: false)."""
        if self.arrays:
            return f"{column} = ANY(?)", [list(values)]
        if not values:
            return "1 = 0", []
        return f"{column} IN ({', '.join('?' for _ in values)})", list(values)

    def json_list(self, value: str, rows: str, order: str) -> str:
        """A scalar subquery: the JSON texts ``value`` of ``rows`` (``table WHERE ...``, which may refer to the
        outer query) joined in ``order`` into the text of one JSON list (``'[]'``: no rows)."""
        if self.ordered_aggregates:
            return f"(SELECT COALESCE('[' || string_agg({value}, ',' ORDER BY {order}) || ']', '[]') FROM {rows})"
        inner = f"(SELECT {value} AS value FROM {rows} ORDER BY {order})"
        return f"(SELECT COALESCE('[' || group_concat(value, ',') || ']', '[]') FROM {inner})"

    def contains(self, column: str) -> str:
        """``column`` contains the text of one ``?`` argument."""
        return f"{self.position}({column}, ?) > 0"

    @cached_property
    def progress(self) -> str:
        """A job's progress in percent (``NULL``: unknown): what lists filter and sort by."""
        return (
            "(CASE WHEN reported_progress IS NOT NULL THEN reported_progress "
            f"WHEN total_steps > 0 AND step IS NOT NULL THEN {self.least}(100.0, 100.0 * step / total_steps) "
            f"WHEN total_epochs > 0 AND epoch IS NOT NULL THEN {self.least}(100.0, 100.0 * epoch / total_epochs) "
            "WHEN state = 'finished' THEN 100.0 END)"
        )

    @cached_property
    def sort_keys(self) -> dict[str, str]:
        """The expression each job sort key (:data:`~.base.SORT_KEYS`) orders by."""
        return {
            "name": "name",
            "namespace": "namespace",
            "state": "state",
            "progress": self.progress,
            "step": "step",
            "created": "created_at",
            "updated": "updated_at",
            "eta": "(CASE WHEN state IN ('finished', 'failed', 'stopped') THEN NULL ELSE eta_at + eta_seconds END)",
        }


SQLITE = Dialect(
    name="sqlite",
    param="?",
    least="MIN",
    position="instr",
    lock_row="",
    arrays=False,
    nan_as_text=True,
    ordered_aggregates=False,
)
POSTGRES = Dialect(
    name="postgres",
    param="%s",
    least="LEAST",
    position="strpos",
    lock_row=" FOR NO KEY UPDATE",
    arrays=True,
    nan_as_text=False,
    ordered_aggregates=True,
)
