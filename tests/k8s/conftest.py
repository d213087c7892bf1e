"""Fixtures of the Kubernetes tests: a FAKE Kubernetes API server (there is none on these machines, see
``fakeapi.py``), a kubeconfig for it read by the official ``kubernetes`` client, and a stepwatch server
on a real SQLite file whose runner and pod-token checks talk to that fake. Helpers are in ``kubehelp.py``.
"""

from __future__ import annotations

import faulthandler
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="the Kubernetes tests need the client: pip install 'stepwatch[k8s]'")
sys.path.insert(0, str(Path(__file__).parent))  # fakeapi.py and kubehelp.py, next to this file

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Starlette's TestClient deprecation, see tests/server/conftest.py
    from starlette.testclient import TestClient

from fakeapi import FakeApi, RsaKey
from kubehelp import Cluster, PodServer

from stepwatch.server import ServerSettings, create_app
from stepwatch.server.store import SQLiteStore


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A test that hangs (threads, sockets and a fake server: a deadlock would hang CI silently) ends the
    run after 120 s with every thread's stack on stderr."""
    faulthandler.dump_traceback_later(120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def signing_key() -> RsaKey:
    """The fake cluster's ServiceAccount issuer key (made once: 0.1 s of pure-Python RSA)."""
    return RsaKey.generate()


@pytest.fixture
def fake(signing_key: RsaKey) -> Iterator[FakeApi]:
    """A FAKE Kubernetes API server on 127.0.0.1 (see fakeapi.py for what it does and does not do)."""
    api = FakeApi(key=signing_key).start()
    api.bookmark_every_s = 0.1
    yield api
    api.stop()


@pytest.fixture
def make_cluster(fake: FakeApi, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """``make_cluster(clock=None, **settings)``: a stepwatch server whose settings point at the fake (pod tokens
    on by default), on ``clock`` when given; its runner is started by :meth:`Cluster.start_runner`, or by
    ``k8s_runner=True``."""
    made: list[tuple[Cluster, TestClient, SQLiteStore]] = []

    def make(clock: Callable[[], float] | None = None, **settings: Any) -> Cluster:
        kubeconfig = fake.kubeconfig(tmp_path / f"kubeconfig-{len(made)}")
        settings.setdefault("k8s_pod_tokens", True)
        settings.setdefault("allowed_hosts", ("testserver",))  # the in-process client's Host
        the_settings = ServerSettings(kubeconfig=str(kubeconfig), **settings)
        store = SQLiteStore(tmp_path / f"sw-{len(made)}.db")
        app = (
            create_app(the_settings, store=store)
            if clock is None
            else create_app(the_settings, store=store, clock=clock)
        )
        client = TestClient(app, raise_server_exceptions=False)
        client.__enter__()
        cluster = Cluster(fake, kubeconfig, client, app)
        made.append((cluster, client, store))
        return cluster

    yield make
    for cluster, client, store in made:
        cluster.close()
        client.__exit__(None, None, None)
        store.close()


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster()


@pytest.fixture
def pods() -> Iterator[Callable[..., PodServer]]:
    """``pods(body, status, delay)``: real HTTP servers on loopback standing in for training pods' metrics
    endpoints (poll mode's tests), closed after the test."""
    made: list[PodServer] = []

    def make(body: str = "{}", status: int = 200, delay: float = 0.0) -> PodServer:
        server = PodServer(body.encode(), status, delay)
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()
