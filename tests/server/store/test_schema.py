"""The schema declared once (``store/schema.py``) with one numbering of versions (``store/migrations.py``):
a database of either store upgraded from any version it ever had has exactly the schema a new one has,
as the database itself describes it (columns in order with their types, nulls and defaults, keys,
constraints, indexes); each store's newest old version gets only what came after it; a current one is
left as it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from legacy_schemas import OldDatabase, newest

from stepwatch.server.store import schema
from stepwatch.server.store.migrations import MIGRATIONS, POSTGRES_BEFORE, SCHEMA_VERSION, plan, postgres_version

pytestmark = pytest.mark.both_stores


@pytest.fixture
def databases(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[OldDatabase, OldDatabase]:
    """Two empty databases of the backend: one to build at an old version, one for this code to create."""
    if backend == "sqlite":
        return OldDatabase("sqlite", tmp_path / "old.db"), OldDatabase("sqlite", tmp_path / "new.db")
    schemas = request.getfixturevalue("postgres_schemas")
    if schemas.admin is None:
        pytest.skip(schemas.problem)
    old, new = (OldDatabase("postgres", tmp_path, str(schemas.url(schemas.fresh()))) for _ in range(2))
    return old, new


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6, 7, 8])
def test_a_database_upgraded_from_any_version_has_the_schema_of_a_new_one(
    databases: tuple[OldDatabase, OldDatabase], version: int
) -> None:
    old, new = databases
    if version > newest(old.backend):
        pytest.skip(f"{old.backend} had no schema version {version} of its own")
    old.migrate_to(version)
    old.open().close()
    new.open().close()
    upgraded, created = old.describe(), new.describe()
    assert upgraded.keys() == created.keys()
    for table in created:
        assert upgraded[table] == created[table], table


def test_the_newest_version_of_each_store_is_upgraded_to_the_current_one(
    databases: tuple[OldDatabase, OldDatabase],
) -> None:
    """SQLite's 8 is the shared 8; PostgreSQL's 5 holds all of the shared 8: each runs only what came
    after 8 (9: the metric means; 10: the index of windows by step dropped; 11: rank 0's reports alone indexed
    by arrival) and then says it is current."""
    old, new = databases
    old.migrate_to(newest(old.backend))
    assert (postgres_version(old.version()) if old.backend == "postgres" else old.version()) == 8
    old.open().close()
    assert old.version() == SCHEMA_VERSION
    new.open().close()
    assert new.version() == SCHEMA_VERSION and new.describe() == old.describe()
    before = old.describe()
    old.open().close()  # a current database is left as it is
    assert old.describe() == before and old.version() == SCHEMA_VERSION


def test_each_migration_is_declared_once_in_one_numbering() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))
    sinces = {t.since for t in schema.TABLES} | {i.since for i in schema.INDEXES}
    sinces |= {c.since for t in schema.TABLES for c in t.columns}
    assert sinces <= set(range(1, SCHEMA_VERSION + 1))
    for dialect in ("sqlite", "postgres"):
        assert plan(dialect, SCHEMA_VERSION) == []  # a current database runs nothing
        assert [v for v, _ in plan(dialect, 3)] == list(range(4, SCHEMA_VERSION + 1))
        assert plan(dialect, 0) == [(SCHEMA_VERSION, list(schema.create_statements(dialect)))]
    # PostgreSQL's own numbers map to the shared version each holds all of; later numbers are shared ones
    assert sorted(POSTGRES_BEFORE) == list(range(1, 6)) and POSTGRES_BEFORE[5] == 8  # the last before sharing
    assert postgres_version(SCHEMA_VERSION + 1) == SCHEMA_VERSION + 1
