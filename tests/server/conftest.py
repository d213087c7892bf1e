"""Fixtures of the server tests: a real database, a controllable clock, the app, an in-process client,
a real uvicorn on 127.0.0.1, and a builder of valid native reports.

The database is a real SQLite file, or, for tests marked ``both_stores``, also a real PostgreSQL
schema of its own (``backend`` is parametrized over both): the server at ``STEPWATCH_TEST_POSTGRES_URL``
(default ``postgresql://root@127.0.0.1/test``, trust auth on this machine). Schemas are made once per
test session and emptied between tests (creating one costs ~0.3 s of DDL); each session has its
own, so sessions can run at once. Without a reachable server those tests skip, except under CI,
where they fail.

Helpers travel as fixtures (``api``, ``make_report``, ``serve``) rather than imports: ``tests/`` has two
``conftest.py`` and no packages, so ``from conftest import ...`` would be ambiguous.
"""

from __future__ import annotations

import itertools
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from stepwatch.protocol import Identity, MetricWindow, Progress, Report
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.store import SQLiteStore, Store
from stepwatch.testing import FakeClock
from stepwatch.testing._clock import START  # the fake clock's first reading: far from 0, so a 0 shows
from stepwatch.testing.server import ServerThread

with warnings.catch_warnings():
    # Starlette 1.x deprecates its httpx-based TestClient in favour of httpx2, which is not installed here;
    # the client still works and is what these tests are about.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


class Api:
    """The in-process client with the few calls every test repeats."""

    def __init__(self, client: TestClient, clock: FakeClock, store: Store) -> None:
        self.client = client
        self.clock = clock
        self.store = store

    @staticmethod
    def job_path(name: str, namespace: str = "default") -> str:
        return f"/api/v1/namespaces/{namespace}/jobs/{name}"

    def register(self, name: str, namespace: str = "default", **fields: Any) -> str:
        """Register a job (or its next attempt) and return its write token."""
        response = self.client.post(f"/api/v1/namespaces/{namespace}/jobs", json={"name": name, **fields})
        assert response.status_code == 201, response.text
        token = response.json()["token"]
        assert isinstance(token, str) and len(token) >= 32
        return token

    def report(self, name: str, token: str, body: dict[str, Any], namespace: str = "default") -> httpx.Response:
        return self.client.post(f"{self.job_path(name, namespace)}/reports", json=body, headers=bearer(token))

    def report_ok(self, name: str, token: str, body: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
        response = self.report(name, token, body, namespace)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def kubeflow(self, name: str, token: str, body: dict[str, Any], namespace: str = "default") -> httpx.Response:
        path = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"
        return self.client.post(path, json=body, headers=bearer(token))

    def set_state(self, name: str, token: str, state: str, namespace: str = "default", **more: Any) -> dict[str, Any]:
        response = self.client.post(
            f"{self.job_path(name, namespace)}/state", json={"state": state, **more}, headers=bearer(token)
        )
        assert response.status_code == 200, response.text
        view: dict[str, Any] = response.json()
        return view

    def job(self, name: str, namespace: str = "default", **params: Any) -> dict[str, Any]:
        response = self.client.get(self.job_path(name, namespace), params=params)
        assert response.status_code == 200, response.text
        view: dict[str, Any] = response.json()
        return view

    def history(self, name: str, namespace: str = "default", **params: Any) -> dict[str, list[dict[str, Any]]]:
        response = self.client.get(f"{self.job_path(name, namespace)}/history", params=params)
        assert response.status_code == 200, response.text
        series: dict[str, list[dict[str, Any]]] = response.json()["metrics"]
        return series

    def events(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        response = self.client.get(f"{self.job_path(name, namespace)}/events", params={"limit": 1000})
        assert response.status_code == 200, response.text
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    def jobs(self, path: str = "/api/v1/jobs", **params: Any) -> dict[str, Any]:
        response = self.client.get(path, params=params)
        assert response.status_code == 200, response.text
        page: dict[str, Any] = response.json()
        return page


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def window(name: str, values: Sequence[float], step: int, first_step: int | None = None) -> MetricWindow:
    """The window the report core would send for ``values`` logged up to ``step``."""
    finite = [v for v in values if math.isfinite(v)]
    return MetricWindow(
        name=name,
        last=values[-1],
        min=min(finite) if finite else None,
        max=max(finite) if finite else None,
        mean=sum(finite) / len(finite) if finite else None,
        count=len(values),
        nonfinite=len(values) - len(finite),
        first_step=step if first_step is None else first_step,
        last_step=step,
    )


def build_report(
    seq: int,
    step: int | None = None,
    metrics: dict[str, float | Sequence[float]] | None = None,
    *,
    run_id: str = "run-1",
    rank: int = 0,
    world_size: int = 1,
    sent_at: float | None = None,
    total_steps: int | None = None,
    epoch: float | None = None,
    total_epochs: float | None = None,
    state: str = "running",
    reason: str = "",
    acks: Sequence[str] = (),
    params: dict[str, Any] | None = None,
) -> Report:
    """A valid native report (validated by the protocol itself, as the report core would send it)."""
    windows = tuple(
        window(name, [v] if isinstance(v, (int, float)) else list(v), step or 0) for name, v in (metrics or {}).items()
    )
    return Report(
        run_id=run_id,
        seq=seq,
        sent_at=START + seq if sent_at is None else sent_at,
        identity=Identity(rank=rank, world_size=world_size, host="node-1", pid=4242),
        progress=Progress(step=step, total_steps=total_steps, epoch=epoch, total_epochs=total_epochs),
        metrics=windows,
        params=params,
        acks=tuple(acks),
        state=state,  # type: ignore[arg-type]
        reason=reason,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sw.db"


POSTGRES_URL = os.environ.get("STEPWATCH_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1/test")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``backend`` is ``sqlite``, and also ``postgres`` for the tests marked ``both_stores``."""
    if "backend" in metafunc.fixturenames and metafunc.definition.get_closest_marker("both_stores"):
        metafunc.parametrize("backend", ["sqlite", "postgres"])


@pytest.fixture
def backend() -> str:
    return "sqlite"


def postgres_url(schema: str) -> str:
    """The test server's URL for one schema (commits not waiting for the disk: tests need no durability)."""
    sep = "&" if "?" in POSTGRES_URL else "?"
    return f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}%20-csynchronous_commit%3Doff"


class PostgresSchemas:
    """Migrated schemas of this test session, reused once emptied; dropped at the end of the session."""

    def __init__(self) -> None:
        import psycopg

        try:
            self.admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
            self.admin.execute("SET synchronous_commit = off")
        except psycopg.Error as exc:
            self.admin = None
            self.problem = f"no PostgreSQL at {POSTGRES_URL} ({exc})"
        self._names = (f"sw_test_{os.getpid()}_{n}" for n in itertools.count())
        self._free: list[str] = []
        self._all: list[str] = []

    @staticmethod
    def url(name: str) -> str:
        """The URL of a schema."""
        return postgres_url(name)

    def fresh(self) -> str:
        """A new, empty schema (no tables: for migration tests), dropped with the others."""
        assert self.admin is not None
        name = next(self._names)
        self.admin.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        self.admin.execute(f"CREATE SCHEMA {name}")
        self._all.append(name)
        return name

    def acquire(self) -> str:
        """A schema with the store's tables and no rows."""
        return self._free.pop() if self._free else self.fresh()

    def release(self, name: str) -> None:
        assert self.admin is not None
        tables = [
            r[0]
            for r in self.admin.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename <> 'stepwatch_schema' "
                "ORDER BY tablename = 'jobs'",  # the others refer to jobs: emptied first
                (name,),
            )
        ]
        sequences = [
            r[0] for r in self.admin.execute("SELECT sequencename FROM pg_sequences WHERE schemaname = %s", (name,))
        ]
        with self.admin.transaction():  # DELETE, not TRUNCATE: 6 ms instead of 170 ms for these few rows
            for table in tables:
                self.admin.execute(f"DELETE FROM {name}.{table}")
            for sequence in sequences:
                self.admin.execute(f"ALTER SEQUENCE {name}.{sequence} RESTART")
        self._free.append(name)

    def close(self) -> None:
        if self.admin is not None:
            for name in self._all:
                self.admin.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
            self.admin.close()


@pytest.fixture(scope="session")
def postgres_schemas() -> Iterator[PostgresSchemas]:
    schemas = PostgresSchemas()
    yield schemas
    schemas.close()


class Database:
    """The test's database: stores opened on it (closed at the end) and raw SQL with ``?`` placeholders."""

    def __init__(self, backend: str, path: Path, url: str = "") -> None:
        self.backend = backend
        self.path = path
        self.url = url
        self._stores: list[Store] = []

    def open(self) -> Store:
        """Another store on the same database (another process, or the same server restarted)."""
        if self.backend == "sqlite":
            store: Store = SQLiteStore(self.path)
        else:
            from stepwatch.server.store.postgres import PostgresStore

            store = PostgresStore(self.url)
        self._stores.append(store)
        return store

    def _sql(self, sql: str) -> str:
        return sql if self.backend == "sqlite" else sql.replace("?", "%s")

    def execute(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement outside any store (another tool writing the database); its rows."""
        if self.backend == "sqlite":
            import sqlite3

            with sqlite3.connect(self.path) as conn:
                return conn.execute(sql, args).fetchall()
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(self._sql(sql), args)
            return cur.fetchall() if cur.description else []

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement for many rows, in one transaction."""
        if self.backend == "sqlite":
            import sqlite3

            with sqlite3.connect(self.path) as conn:
                conn.executemany(sql, rows)
            return
        import psycopg

        with psycopg.connect(self.url) as conn:
            conn.cursor().executemany(self._sql(sql), rows)

    def close(self) -> None:
        for store in self._stores:
            store.close()


@pytest.fixture
def database(backend: str, db_path: Path, request: pytest.FixtureRequest) -> Iterator[Database]:
    if backend == "sqlite":
        db = Database("sqlite", db_path)
        yield db
        db.close()
        return
    schemas: PostgresSchemas = request.getfixturevalue("postgres_schemas")
    if schemas.admin is None:
        if os.environ.get("CI"):
            pytest.fail(f"{schemas.problem}: CI runs the store suite on PostgreSQL too")
        pytest.skip(schemas.problem)
    schema = schemas.acquire()
    db = Database("postgres", db_path, postgres_url(schema))
    try:
        yield db
    finally:
        db.close()
        schemas.release(schema)


@pytest.fixture
def store(database: Database) -> Store:
    return database.open()


@pytest.fixture
def app(store: Store, clock: FakeClock) -> Starlette:
    # the in-process client sends Host: testserver, a name the guard refuses unless allowed
    return create_app(ServerSettings(allowed_hosts=("testserver",)), store=store, clock=clock)


@pytest.fixture
def client(app: Starlette) -> Iterator[TestClient]:
    # A 500 stays a response (with its Status body) so that tests can say what they expected instead.
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture
def api(client: TestClient, clock: FakeClock, store: Store) -> Api:
    return Api(client, clock, store)


@pytest.fixture
def make_report() -> Callable[..., dict[str, Any]]:
    """``make_report(seq, step, {"loss": 0.5}, ...)``: the JSON body of a valid native report."""

    def make(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return build_report(*args, **kwargs).to_dict()

    return make


@contextmanager
def _serving(app: Starlette, send_buffer: int | None = None) -> Iterator[str]:
    """Serve ``app`` with a real uvicorn on 127.0.0.1 (a free port) in a thread; yield the base URL.
    ``send_buffer`` caps the kernel send buffer of every connection (see :class:`ServerThread`)."""
    with ServerThread(app, send_buffer=send_buffer) as server:
        yield server.url


@pytest.fixture
def serve() -> Callable[..., AbstractContextManager[str]]:
    """``with serve(app) as base_url:``: a real server on a real socket for the length of the block."""
    return _serving
