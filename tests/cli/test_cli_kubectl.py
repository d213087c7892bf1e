"""``kubectl stepwatch`` (the installed ``kubectl-stepwatch`` executable) against a real server on loopback.

The server is the real app served by uvicorn in a thread (one per module, on a temporary SQLite file); jobs
are registered through the client and report through ``stepwatch.init`` as a training loop does. The
plugin runs as a subprocess, the executable pip installed from ``[project.scripts]``, with a kubeconfig of
the test's own (there is no cluster here: the plugin only reads the kubeconfig's namespace). Where
``kubectl`` is installed, one test goes through ``kubectl stepwatch`` itself.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

import stepwatch
from stepwatch.cli import kubectl
from stepwatch.client import Client
from stepwatch.server import ServerSettings, create_app
from stepwatch.testing import wait_for
from stepwatch.testing.server import ServerThread

PLUGIN = Path(sys.executable).parent / "kubectl-stepwatch"
_namespaces = itertools.count(1)

pytestmark = pytest.mark.skipif(
    not PLUGIN.exists(), reason="kubectl-stepwatch is not installed: pip install -e . (it is a [project.scripts] entry)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real stepwatch server on 127.0.0.1, for the whole module."""
    db = tmp_path_factory.mktemp("kubectl") / "stepwatch.db"
    # streams left open by the commands under test are cut after 1 s; their cut is no news: log_level critical
    with ServerThread(create_app(ServerSettings(db=str(db))), log_level="critical") as httpd:
        yield httpd.url


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own."""
    return f"kc{next(_namespaces)}"


def _kubeconfig(path: Path, namespace: str | None, context: str = "lab", others: dict[str, str] | None = None) -> Path:
    """A kubeconfig whose current context is ``context`` (in ``namespace``), as JSON (which is YAML too)."""
    contexts = [
        {"name": context, "context": {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}}
    ]
    contexts += [
        {"name": n, "context": {"cluster": "c", "user": "u", "namespace": v}} for n, v in (others or {}).items()
    ]
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": contexts,
                "current-context": context,
            }
        )
    )
    return path


def _plugin(
    *argv: str, kubeconfig: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBECONFIG"))}
    environ["HOME"] = str(kubeconfig.parent if kubeconfig else Path("/nonexistent"))  # never the machine's ~/.kube
    if kubeconfig is not None:
        environ["KUBECONFIG"] = str(kubeconfig)
    environ.update(env or {})
    return subprocess.run([str(PLUGIN), *argv], capture_output=True, text=True, env=environ, timeout=60)


def _table(text: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Headers and rows (by NAME) of a plain table, cut at the header's column starts."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
    rows = {}
    for line in lines[1:]:
        cells = dict(zip(names, (line[a:b].strip() for a, b in zip(starts, [*starts[1:], None]))))
        rows[cells["NAME"]] = cells
    return names, rows


def _register(url: str, ns: str, name: str, **fields: Any) -> str:
    with Client(url) as client:
        _, token = client.register(name, ns, **fields)
    return token


def _job(url: str, ns: str, name: str) -> dict[str, Any]:
    with Client(url) as client:
        return client.job(name, ns).raw


def _training(url: str, ns: str, name: str) -> stepwatch.Run:
    """A job that reports steps with a falling loss until it has a rate, hence an ETA."""
    token = _register(url, ns, name)
    run = stepwatch.init(job=name, namespace=ns, url=url, token=token, interval=0.05, total_steps=1000)
    for step in (100, 150, 200):
        run.step(step, loss=1.0 / step)
        wait_for(lambda s=step: _job(url, ns, name)["progress"]["step"] == s)
        time.sleep(0.1)
    wait_for(lambda: _job(url, ns, name)["eta"]["remaining_seconds"])
    return run


# ------------------------------------------------------------------------------------------- get


def test_get_lists_the_kubeconfig_namespace_like_kubectl(server: str, ns: str, tmp_path: Path) -> None:
    run = _training(server, ns, "llama-sft")
    _register(server, ns, "queued", total_steps=50)
    config = _kubeconfig(tmp_path / "config", ns)
    try:
        done = _plugin("get", "--server", server, kubeconfig=config)
        assert (done.returncode, done.stderr) == (0, "")
        headers, rows = _table(done.stdout)
        assert headers == list(kubectl.COLUMNS)
        assert list(rows) == ["llama-sft", "queued"]
        assert rows["llama-sft"]["STATE"] == "running"
        assert rows["llama-sft"]["PROGRESS%"] == "20.0%"
        assert re.fullmatch(r"\d+(s|m\d\ds|h\d\dm)", rows["llama-sft"]["ETA"])
        assert rows["llama-sft"]["LOSS"] == "0.005"
        assert re.fullmatch(r"\d+s", rows["llama-sft"]["AGE"])
        assert rows["queued"] | {"AGE": ""} == {
            "NAME": "queued",
            "STATE": "pending",
            "HEALTH": "-",
            "PROGRESS%": "-",
            "ETA": "-",
            "LOSS": "-",
            "AGE": "",
        }

        # STEPWATCH_URL instead of --server; -A adds the NAMESPACE column first
        done = _plugin("get", "-A", kubeconfig=config, env={"STEPWATCH_URL": server})
        assert done.returncode == 0, done.stderr
        headers, rows = _table(done.stdout)
        assert headers == ["NAMESPACE", *kubectl.COLUMNS]
        assert rows["llama-sft"]["NAMESPACE"] == ns

        # -n wins over the kubeconfig; an empty namespace says so as kubectl does, and is no error
        done = _plugin("get", "-n", f"{ns}-empty", "--server", server, kubeconfig=config)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", f"No resources found in {ns}-empty namespace.\n")

        # wide, and one job by name
        done = _plugin("get", "llama-sft", "-o", "wide", "--server", server, kubeconfig=config)
        assert done.returncode == 0, done.stderr
        headers, rows = _table(done.stdout)
        assert headers == list(kubectl.WIDE_COLUMNS)
        assert list(rows) == ["llama-sft"]
        assert rows["llama-sft"]["STEP"] == "200/1000"
    finally:
        run.finish()


def test_get_as_json_and_yaml(server: str, ns: str, tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    _register(server, ns, "a", total_steps=10)
    _register(server, ns, "b", total_steps=20)
    config = _kubeconfig(tmp_path / "config", ns)

    done = _plugin("get", "-o", "json", "--server", server, kubeconfig=config)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    assert [(j["namespace"], j["name"], j["state"]) for j in listed["items"]] == [
        (ns, "a", "pending"),
        (ns, "b", "pending"),
    ]

    done = _plugin("get", "b", "-o", "yaml", "--server", server, kubeconfig=config)
    assert done.returncode == 0, done.stderr
    one = yaml.safe_load(done.stdout)
    assert (one["name"], one["progress"]["total_steps"]) == ("b", 20)
    assert one == _job(server, ns, "b") | {"times": one["times"], "health": one["health"]}


def test_get_of_an_unknown_job_is_one_line_and_exit_1(server: str, ns: str, tmp_path: Path) -> None:
    done = _plugin("get", "ghost", "--server", server, kubeconfig=_kubeconfig(tmp_path / "config", ns))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f'kubectl stepwatch: job "ghost" not found in namespace "{ns}" at {server}\n'


# ------------------------------------------------------------------------------------------ stop


def test_stop_reaches_the_training_loop(server: str, ns: str, tmp_path: Path) -> None:
    run = _training(server, ns, "plateau")
    config = _kubeconfig(tmp_path / "config", ns)
    done = _plugin("stop", "plateau", "--reason", "not learning", "--server", server, kubeconfig=config)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"asked {ns}/plateau to save a checkpoint, then stop (not learning); command ")

    def obeyed() -> bool:
        run.step(loss=0.005)  # the loop goes on until its reporter reads the command
        return run.should_stop

    wait_for(obeyed)
    assert run.should_checkpoint
    run.finish("stopped", "asked to stop")
    wait_for(lambda: _job(server, ns, "plateau")["state"] == "stopped")

    done = _plugin("stop", "plateau", "-n", ns, "--server", server)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("kubectl stepwatch: job ") and "already stopped" in done.stderr
    done = _plugin("stop", "ghost", "-n", ns, "--server", server)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f'kubectl stepwatch: job "ghost" not found in namespace "{ns}" at {server}\n'


# --------------------------------------------------------------------------- errors, help, kubectl


@pytest.mark.parametrize("argv", [["get"], ["get", "-A", "-o", "json"], ["stop", "x"]])
def test_no_server_is_one_clear_line_and_exit_1(argv: list[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # bound, then closed: nobody listens there
    done = _plugin(*argv, "--server", url)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(
        f"kubectl stepwatch: no stepwatch server at {url}: give --server or set STEPWATCH_URL"
    )


def test_help_and_usage_errors() -> None:
    done = _plugin("--help")
    assert done.returncode == 0
    assert "get" in done.stdout and "stop" in done.stdout and "STEPWATCH_URL" in done.stdout
    done = _plugin("get", "--help")
    assert done.returncode == 0
    for flag in ("-A", "--namespace", "--output", "--server", "--kubeconfig", "--context"):
        assert flag in done.stdout
    done = _plugin()
    assert done.returncode == 2
    assert done.stderr.startswith("usage: kubectl stepwatch")
    done = _plugin("get", "-o", "table")
    assert done.returncode == 2
    assert "invalid choice" in done.stderr


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_through_kubectl_itself(server: str, ns: str, tmp_path: Path) -> None:
    _register(server, ns, "via-kubectl", total_steps=5)
    config = _kubeconfig(tmp_path / "config", ns)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
    environ |= {"PATH": f"{PLUGIN.parent}{os.pathsep}{environ.get('PATH', '')}", "KUBECONFIG": str(config)}
    environ["HOME"] = str(tmp_path)
    done = subprocess.run(
        ["kubectl", "stepwatch", "get", "--server", server], capture_output=True, text=True, env=environ, timeout=60
    )
    assert (done.returncode, done.stderr) == (0, "")
    headers, rows = _table(done.stdout)
    assert headers == list(kubectl.COLUMNS)
    assert rows["via-kubectl"]["STATE"] == "pending"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (apt-get install kubectl)")
def test_a_real_kubectl_finds_the_plugin_on_its_path_and_runs_it(server: str, ns: str, tmp_path: Path) -> None:
    """Debian's kubectl, the plugin alone in a directory of the PATH (not the virtualenv's bin), as a user
    installs it: ``kubectl plugin list`` names it, ``kubectl stepwatch jobs`` shows a training job."""
    run = _training(server, ns, "through-kubectl")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl-stepwatch").symlink_to(PLUGIN)
    kubectl_dir = str(Path(shutil.which("kubectl") or "kubectl").parent)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("STEPWATCH_", "KUBECONFIG"))}
    environ |= {"PATH": os.pathsep.join([str(bin_dir), kubectl_dir]), "HOME": str(tmp_path)}
    environ["KUBECONFIG"] = str(_kubeconfig(tmp_path / "config", ns))
    environ["STEPWATCH_URL"] = server
    try:
        listed = subprocess.run(["kubectl", "plugin", "list"], capture_output=True, text=True, env=environ, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert str(bin_dir / "kubectl-stepwatch") in listed.stdout.splitlines(), listed.stdout
        done = subprocess.run(["kubectl", "stepwatch", "jobs"], capture_output=True, text=True, env=environ, timeout=60)
        assert (done.returncode, done.stderr) == (0, "")
        headers, rows = _table(done.stdout)
        assert headers == list(kubectl.COLUMNS)
        row = rows["through-kubectl"]
        assert (row["STATE"], row["PROGRESS%"]) == ("running", "20.0%"), row
        assert row["ETA"] not in ("", "-") and float(row["LOSS"]) == pytest.approx(1 / 200, rel=1e-3)
    finally:
        run.finish()


# -------------------------------------------------------------------------------- the kubeconfig


@pytest.mark.parametrize("reader", ["yaml", "json"])
def test_kubeconfig_namespace(reader: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if reader == "json":
        monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed: JSON kubeconfigs still read
    else:
        pytest.importorskip("yaml")
    first = _kubeconfig(tmp_path / "first", "team-a", others={"prod": "team-p"})
    second = _kubeconfig(tmp_path / "second", None, context="second", others={"prod": "other", "staging": "team-s"})

    def namespace(kubeconfig: str | None = None, context: str | None = None, **env: str) -> str:
        return kubectl.kubeconfig_namespace(kubeconfig, context, environ={"HOME": str(tmp_path), **env})

    assert namespace(str(first)) == "team-a"
    assert namespace(str(first), "prod") == "team-p"
    assert namespace(str(first), "unknown") == "default"
    assert namespace(KUBECONFIG=str(first)) == "team-a"
    assert namespace(str(second)) == "default"  # its context names no namespace
    # several files: the first to set current-context, and each context's first definition, win
    merged = f"{first}{os.pathsep}{second}"
    assert namespace(KUBECONFIG=merged) == "team-a"
    assert namespace(KUBECONFIG=merged, context="prod") == "team-p"
    assert namespace(KUBECONFIG=merged, context="staging") == "team-s"
    assert namespace(KUBECONFIG=str(tmp_path / "missing")) == "default"
    (tmp_path / "broken").write_text("{ not: [a kubeconfig")
    assert namespace(str(tmp_path / "broken")) == "default"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubeconfig_namespace_is_kubectls(tmp_path: Path) -> None:
    """The same answers as ``kubectl config view --minify`` (the kubernetes package's loader differs on merges)."""
    first = _kubeconfig(tmp_path / "first", "team-a", others={"prod": "team-p"})
    second = _kubeconfig(tmp_path / "second", "team-b", context="second", others={"prod": "other", "staging": "team-s"})
    merged = f"{first}{os.pathsep}{second}"
    for paths, context in (
        (merged, None),
        (merged, "prod"),
        (merged, "staging"),
        (f"{second}{os.pathsep}{first}", None),
    ):
        argv = ["kubectl", "config", "view", "--minify", "-o", "jsonpath={..namespace}"]
        if context:
            argv.append(f"--context={context}")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": paths}
        theirs = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
        assert theirs.returncode == 0, theirs.stderr
        assert kubectl.kubeconfig_namespace(None, context, environ=env) == theirs.stdout.strip()
