"""The stores' side of access control: API tokens kept as hashes, revocation seen at once (on every
PostgreSQL replica: ``test_postgres.py``), the audit log, and the migration that adds them keeping
what was there (PostgreSQL's: ``test_postgres.py``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import legacy_schemas
import pytest

from stepwatch.server.api.auth import mint_token
from stepwatch.server.api.request import hash_token
from stepwatch.server.store import AuditEntry, SQLiteStore, Store
from stepwatch.server.store.migrations import SCHEMA_VERSION


def _made(store: Store, role: str = "viewer", namespaces: tuple[str, ...] = ("a",), name: str = "t") -> tuple[str, str]:
    token, secret = mint_token(role, namespaces, name, 100.0, by="test")
    store.create_token(token, hash_token(secret), AuditEntry(100.0, "test", "token_created", reason="why"))
    return token.id, secret


@pytest.mark.both_stores
def test_tokens_are_found_by_hash_listed_and_revoked(database: Any) -> None:
    store = database.open()
    token_id, secret = _made(store, "editor", ("b", "a"), "ci")
    found = store.api_token(hash_token(secret))
    assert found is not None and found.id == token_id and found.namespaces == ("a", "b") and found.role == "editor"
    assert store.cached_api_token(hash_token(secret)) in (found, None)  # PostgreSQL never answers from memory
    assert database.execute("SELECT COUNT(*) FROM api_tokens WHERE token_hash = ?", (secret,)) == [(0,)]
    assert [t.id for t in store.api_tokens()] == [token_id]
    revoked = store.revoke_token(token_id, 200.0, AuditEntry(200.0, "admin", "token_revoked", reason="left"))
    assert revoked is not None and revoked.revoked_at == 200.0 and revoked.revoked_by == "admin"
    assert store.cached_api_token(hash_token(secret)) is None
    again = store.api_token(hash_token(secret))
    assert again is not None and not again.valid_at(201.0)
    assert store.revoke_token(token_id, 300.0, AuditEntry(300.0, "admin", "token_revoked")).revoked_at == 200.0  # type: ignore[union-attr]
    assert store.revoke_token("nope", 300.0, AuditEntry(300.0, "admin", "token_revoked")) is None
    assert [(e.action, e.reason) for e in store.audit_log()] == [("token_created", "why"), ("token_revoked", "left")]


@pytest.mark.both_stores
def test_the_audit_log_filters_by_namespace_job_and_scope(database: Any) -> None:
    store = database.open()
    job = store.register("a", "one", token_hash="h", now=1.0)
    store.add_command(job, "stop", "plateau", 2.0, "user:ann")
    store.set_policy(job.id, {"on": {"diverging": "stop"}}, 3.0, "policy set", "user:ann")
    store.set_namespace_policy("b", {"on": {"stalled": "notify"}}, 4.0, "user:bob")
    store.record_audit(AuditEntry(5.0, "admin", "token_created"))
    store.add_command(job, "checkpoint", "", 6.0)  # the runner's own: no actor, no audit
    assert [e.action for e in store.audit_log()] == ["stop", "policy_set", "namespace_policy_set", "token_created"]
    assert [e.action for e in store.audit_log(namespaces=("a",), include_global=False)] == ["stop", "policy_set"]
    assert [e.action for e in store.audit_log(namespaces=("a",))] == ["stop", "policy_set", "token_created"]
    assert store.audit_log(namespaces=(), include_global=False) == []
    assert [e.actor for e in store.audit_log(name="one")] == ["user:ann", "user:ann"]
    first = store.audit_log()[0]
    assert store.audit_log(after=first.id)[0].action == "policy_set"
    assert first.data == {"id": store.events(job_id=job.id)[1].data["id"]}
    assert store.events(job_id=job.id)[1].data["by"] == "user:ann"


@pytest.mark.both_stores
def test_the_job_list_narrows_to_readable_namespaces(store: Store) -> None:
    from stepwatch.server.store import JobFilter

    for namespace in ("a", "b", "c"):
        store.register(namespace, "j", token_hash="h", now=1.0)
    assert sorted(j.namespace for j in store.jobs(JobFilter(namespaces=("a", "c")))) == ["a", "c"]
    assert store.jobs(JobFilter(namespaces=())) == []
    assert store.count_jobs(JobFilter(namespaces=("b",))) == 1


def test_a_version_3_sqlite_database_gains_tokens_and_audit_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    with sqlite3.connect(path) as conn:  # what the release before access control left behind
        for version in (1, 2, 3):
            conn.executescript(legacy_schemas.SQLITE[version])
        conn.execute("PRAGMA user_version = 3")
        conn.execute(
            "INSERT INTO jobs (namespace, name, attempt, token_hash, state, created_at, updated_at, step) "
            "VALUES ('ns', 'old', 1, 'h', 'running', 0, 5, 40)"
        )
        conn.execute("INSERT INTO events (job_id, t, kind, message) VALUES (1, 0, 'registered', 'attempt 1')")
        conn.execute('INSERT INTO namespace_policies VALUES (\'ns\', \'{"on": {"stalled": "notify"}}\', 1)')
    store = SQLiteStore(path)
    try:
        old = store.job("ns", "old")
        assert old is not None and old.step == 40 and store.token_hash(old.id) == "h"
        assert [e.kind for e in store.events(job_id=old.id)] == ["registered"]
        assert store.namespace_policies() == {"ns": {"on": {"stalled": "notify"}}}
        token_id, secret = _made(store)
        assert store.api_token(hash_token(secret)).id == token_id  # type: ignore[union-attr]
        store.add_command(old, "stop", "done", 6.0, "user:ann")
        assert [e.action for e in store.audit_log()] == ["token_created", "stop"]
    finally:
        store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
