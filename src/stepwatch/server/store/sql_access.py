"""The access half both SQL stores share: API tokens (by the hash of their secret) and the audit log.

:class:`SqlAccess` is a part of each store (:class:`~.sqlite.SQLiteStore`,
:class:`~.postgres.PostgresStore`), written once on :class:`~.sql_store.SqlStore`'s plumbing; the
records and their rows are :mod:`.access`'s. A token found is kept in memory where the store hears of
every revocation as it commits; see :meth:`SqlAccess.api_token`.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import ClassVar

from .access import AUDIT_COLUMNS, TOKEN_COLUMNS, ApiToken, AuditEntry, audit_from_row, audit_where, token_from_row
from .sql_store import SqlStore

__all__ = ["SqlAccess"]


class SqlAccess(SqlStore):
    """API tokens and the audit log of a SQL store (see the module docstring)."""

    _CACHES_TOKENS: ClassVar[bool] = True
    """API tokens found are kept in memory (a store whose revocations other processes make at any
    moment, PostgreSQL's, reads them at every request instead)."""

    def __init__(self) -> None:
        super().__init__()
        self._api_tokens: dict[str, ApiToken] | None = {} if self._CACHES_TOKENS else None
        """API tokens by hash, as found (cleared by every revocation); ``None``: never cached."""
        self._token_generation = 0
        """Raised by every revocation: a lookup that began before one does not cache what it read."""

    def create_token(self, token: ApiToken, token_hash: str, entry: AuditEntry) -> None:
        """Store a new API token (its hash) and the audit entry of its creation."""
        row = (
            token_hash, token.id, token.name, token.role, json.dumps(list(token.namespaces)), token.created_at,
            token.created_by, token.expires_at, token.revoked_at, token.revoked_by,
        )  # fmt: skip
        marks = ", ".join("?" for _ in row)
        with self._write() as conn:
            conn.execute(self._sql(f"INSERT INTO api_tokens (token_hash, {TOKEN_COLUMNS}) VALUES ({marks})"), row)
            self._audit(conn, entry)

    def cached_api_token(self, token_hash: str) -> ApiToken | None:
        """A found API token, from memory (never, where tokens are not cached: see :meth:`api_token`)."""
        if self._api_tokens is None:
            return None
        return self._api_tokens.get(token_hash)

    def api_token(self, token_hash: str) -> ApiToken | None:
        """The token with this hash; found ones are cached, where every revocation is this store's own
        (SQLite: one server process writes the file; another program's write makes it forget them all).

        PostgreSQL's replicas are told a moment after the commit (a notification arrives some
        milliseconds later: 5 of 80 rounds were accepted after the revoke answered), so there the token
        is read from the database at every request: a revocation answered by any replica is refused by
        every other from then on. The lookup is one indexed read, about 0.2 ms on a local database.
        """
        tokens = self._api_tokens
        if tokens is not None and (cached := tokens.get(token_hash)) is not None:
            return cached
        generation = self._token_generation
        rows = self._read(self._sql(f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE token_hash = ?"), (token_hash,))
        if not rows:
            return None
        token = token_from_row(rows[0])
        if tokens is not None and generation == self._token_generation:
            if len(tokens) >= 10_000:
                tokens.clear()
            tokens[token_hash] = token
        return token

    def api_tokens(self) -> list[ApiToken]:
        """Every API token, oldest first."""
        return [
            token_from_row(r) for r in self._read(f"SELECT {TOKEN_COLUMNS} FROM api_tokens ORDER BY created_at, id")
        ]

    def revoke_token(self, token_id: str, now: float, entry: AuditEntry) -> ApiToken | None:
        """Revoke a token; it is refused from the commit on (see :meth:`api_token`)."""
        with self._write(pipeline=False) as conn:
            row = conn.execute(
                self._sql(f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = ?{self.dialect.lock_row}"), (token_id,)
            ).fetchone()
            if row is None:
                return None
            token = token_from_row(row)
            if token.revoked_at is None:
                conn.execute(
                    self._sql("UPDATE api_tokens SET revoked_at = ?, revoked_by = ? WHERE id = ?"),
                    (now, entry.actor, token_id),
                )
                token = replace(token, revoked_at=now, revoked_by=entry.actor)
                self._audit(conn, entry)
                self._forget_tokens()
        self._forget_tokens()  # and once more after the commit: a lookup in between cached nothing
        return token

    def _forget_tokens(self) -> None:
        """Nothing cached of the tokens holds any more (a revocation, or another program wrote the file)."""
        self._token_generation += 1
        if self._api_tokens is not None:
            self._api_tokens.clear()

    def record_audit(self, entry: AuditEntry) -> AuditEntry:
        """Append an entry to the audit log."""
        with self._write(pipeline=False) as conn:
            return self._audit(conn, entry)

    def audit_log(
        self,
        *,
        namespaces: tuple[str, ...] | None = None,
        name: str | None = None,
        include_global: bool = True,
        after: int = 0,
        limit: int = 100,
    ) -> list[AuditEntry]:
        """Audit entries after an id, oldest first."""
        where, args = audit_where(namespaces, name, include_global, after)
        rows = self._read(
            self._sql(f"SELECT {AUDIT_COLUMNS} FROM audit WHERE {where} ORDER BY id LIMIT ?"), (*args, limit)
        )
        return [audit_from_row(r) for r in rows]
