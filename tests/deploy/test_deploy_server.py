"""The containers of deploy/base as written (command, arguments, environment) start a real stepwatch server
on a real PostgreSQL, and it answers the probes the manifests give it.

What differs from a cluster, and why: the Secret's database URL is a schema of this machine's PostgreSQL
(``STEPWATCH_TEST_POSTGRES_URL``, default ``postgresql://root@127.0.0.1/test``); the port is a free one;
HOME and STEPWATCH_HOME are a temporary directory (the pod's /tmp volume); and since there is no cluster
here, ``STEPWATCH_KUBECONFIG`` names a kubeconfig whose API server does not answer (in a pod the
in-cluster ServiceAccount is used). The process is the installed ``stepwatch`` executable, as in the image.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
httpx = pytest.importorskip("httpx")
psycopg = pytest.importorskip("psycopg")
pytest.importorskip("kubernetes")

ROOT = Path(__file__).resolve().parents[2]
POSTGRES_URL = os.environ.get("STEPWATCH_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1/test")
STEPWATCH = Path(sys.executable).parent / "stepwatch"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def schema_url() -> Iterator[str]:
    """A PostgreSQL schema of its own, dropped afterwards."""
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no PostgreSQL at {POSTGRES_URL} ({exc})")
    name = f"sw_deploy_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin.execute(f"CREATE SCHEMA {name}")
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{name}"
    finally:
        admin.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        admin.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _container(kind: str, name: str) -> dict[str, Any]:
    for path in sorted((ROOT / "deploy" / "base").glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj["kind"] == kind and obj["metadata"]["name"] == name:
                container: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
                return container
    raise AssertionError(f"no {kind}/{name} in deploy/base")


def _kubeconfig(path: Path) -> Path:
    unreachable = f"https://127.0.0.1:{_free_port()}"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": unreachable, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "none", "user": {"token": "not-a-token"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "current-context": "none",
            }
        )
    )
    return path


@pytest.mark.parametrize(("kind", "name"), [("Deployment", "stepwatch-server"), ("StatefulSet", "stepwatch-runner")])
def test_the_container_starts_and_answers_its_probes(kind: str, name: str, schema_url: str, tmp_path: Path) -> None:
    container = _container(kind, name)
    port = _free_port()
    args = list(container["args"])
    args[args.index("--port") + 1] = str(port)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBECONFIG"))}
    for item in container["env"]:
        if "valueFrom" in item:
            assert item["valueFrom"]["secretKeyRef"]["key"] == "url"
            env[item["name"]] = schema_url
        else:
            env[item["name"]] = item["value"]
    env["HOME"] = str(tmp_path)
    env["STEPWATCH_HOME"] = str(tmp_path / "stepwatch")
    env["STEPWATCH_KUBECONFIG"] = str(_kubeconfig(tmp_path / "kubeconfig"))
    assert container["command"] == ["stepwatch"]
    log = (tmp_path / "server.log").open("w+")
    proc = subprocess.Popen([str(STEPWATCH), *args], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        probes = [container[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
        deadline = time.monotonic() + 30
        answered = None
        while answered is None:
            assert proc.poll() is None, f"the server exited: {(tmp_path / 'server.log').read_text()}"
            assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            try:
                answered = httpx.get(f"http://127.0.0.1:{port}{probes[0]}", timeout=2)
            except httpx.TransportError:
                time.sleep(0.2)
        for path in probes:
            answer = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
            assert answer.status_code == 200, path
            assert answer.json()["status"] == "ok"
        log.seek(0)
        assert "postgresql://" in log.read(), "the server stores in PostgreSQL, as every replica must"
        # on PostgreSQL nothing is written to disk, not even in the pod's /tmp volume (HOME, STEPWATCH_HOME)
        written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")}
        assert written == {"kubeconfig", "server.log"}
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    assert proc.returncode in (0, -15), (tmp_path / "server.log").read_text()
