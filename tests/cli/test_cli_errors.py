"""What goes wrong on the command line reads as one line with a documented exit status, never a traceback.

A real stepwatch server (``ServerThread``, loopback) and a real HTTP server that is not stepwatch's
(``http.server`` from the standard library, answering 404 to every path) stand on each side; the
commands run in-process through ``stepwatch.cli.main`` and, where the process matters (a closed
pipe, ``stepwatch run``), as subprocesses.
"""

from __future__ import annotations

import http.server
import itertools
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from stepwatch.cli import _errors, main
from stepwatch.client import Client
from stepwatch.server import ServerSettings, create_app
from stepwatch.testing.server import ServerThread

ROOT = Path(__file__).parents[2]
_namespaces = itertools.count(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("cli-errors") / "stepwatch.db"
    with ServerThread(create_app(ServerSettings(db=str(db))), log_level="critical") as httpd:
        yield httpd.url


@pytest.fixture(scope="module")
def other() -> Iterator[str]:
    """A real HTTP server that is not stepwatch's: 404 (an HTML page) for every path."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    httpd.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def ns() -> str:
    return f"e{next(_namespaces)}"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_server_address_without_a_scheme_is_read_as_http(
    server: str, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(server) as client:
        client.register("plain", ns)
    code, out, err = _cli(capsys, "jobs", "--server", server.removeprefix("http://"), "-n", ns)
    assert (code, err) == (0, "")
    assert "plain" in out


@pytest.mark.parametrize("command", [["jobs"], ["describe", "x"], ["watch", "x"], ["stop", "x"], ["top"]])
def test_not_a_stepwatch_server_is_one_line(other: str, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, *command, "--server", other)
    assert (code, out) == (_errors.ERROR, "")
    assert err == f"stepwatch {command[0]}: {other} is not a stepwatch server: GET /api/v1/version answered HTTP 404\n"


def test_an_api_path_in_the_url_says_to_give_the_base(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "jobs", "--server", server + "/api")
    assert (code, out) == (_errors.ERROR, "")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"stepwatch jobs: {server}/api is not a stepwatch server: ")
    assert err.rstrip().endswith(f"(give the server's base URL, e.g. {server}, without /api)")


def test_run_at_a_non_stepwatch_server_fails_at_once(other: str, tmp_path: Path) -> None:
    """It says so and runs nothing: no background server tried (no log), the command never started."""
    marker = tmp_path / "ran"
    done = subprocess.run(
        [sys.executable, "-m", "stepwatch", "run", "--server", other, "--",
         sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "STEPWATCH_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == f"stepwatch run: {other} is not a stepwatch server: GET /api/v1/version answered HTTP 404\n"
    assert not marker.exists() and not (tmp_path / "home").exists()


def test_an_unknown_job_suggests_the_close_match_and_exits_3(
    server: str, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(server) as client:
        client.register("train-tiny", ns)
        client.register("eval-large", ns)
    for command in ("describe", "watch", "stop"):
        code, out, err = _cli(capsys, command, "trian-tiny", "--server", server, "-n", ns)
        assert (code, out) == (_errors.NO_SUCH_JOB, ""), command
        assert err == f"stepwatch {command}: no job {ns}/trian-tiny at {server} (did you mean train-tiny?)\n"
    code, _, err = _cli(capsys, "describe", "zzz", "--server", server, "-n", ns)
    assert code == _errors.NO_SUCH_JOB
    hint = f"`stepwatch jobs -A --server {server}` lists them"  # the user's --server kept: the hint pastes
    assert err == f"stepwatch describe: no job {ns}/zzz at {server} ({hint})\n"
    other_ns = f"{ns}-b"
    code, _, err = _cli(capsys, "watch", "train-tiny", "--server", server, "-n", other_ns)
    assert code == _errors.NO_SUCH_JOB  # the same name in another namespace is named with it
    assert err.rstrip().endswith(f"(did you mean {ns}/train-tiny?)")


def test_a_closed_pipe_is_no_traceback(server: str, ns: str) -> None:
    """``stepwatch jobs -o json | head -c 100``: the reader goes away; the command ends quietly with 141."""
    with Client(server) as client:
        for i in range(20):
            client.register(f"job-{i}", ns)
    read, write = os.pipe()
    os.close(read)  # the reader is already gone: the first write fails, whatever the timing
    try:
        done = subprocess.run(
            [sys.executable, "-m", "stepwatch", "jobs", "-o", "json", "--server", server, "-n", ns],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == _errors.PIPE_CLOSED


def test_the_documented_table_is_the_one_the_commands_use() -> None:
    """docs/cli.md's exit-status table lists exactly the statuses of cli/_errors.py."""
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text.split("## Exit status", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    used = {_errors.OK, _errors.ERROR, _errors.USAGE, _errors.NO_SUCH_JOB, _errors.INTERRUPTED, _errors.PIPE_CLOSED}
    assert documented == used
    from stepwatch.cli import watch

    assert set(watch.EXIT_CODES.values()) <= documented  # how a watched job ended is in the table too


_REPORTER_ONLY = (
    "import sys\n"
    "for name in ('httpx', 'rich', 'starlette', 'uvicorn', 'orjson', 'prometheus_client', 'plotly', 'numpy',\n"
    "             'textual', 'kubernetes', 'apprise'):\n"
    "    sys.modules[name] = None  # as after `pip install stepwatch`: none of the extras' packages\n"
    "from {module} import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.parametrize(
    ("module", "argv", "said"),
    [
        ("stepwatch.__main__", ["jobs"], "stepwatch jobs: needs the 'client' extra (httpx is not installed)"),
        ("stepwatch.__main__", ["run", "--", "true"], "stepwatch run: needs the 'client' extra"),
        ("stepwatch.__main__", ["describe", "x"], "stepwatch describe: needs the 'client' extra"),
        ("stepwatch.__main__", ["server"], "pip install 'stepwatch[server]'"),
        ("stepwatch.__main__", ["top"], "pip install 'stepwatch[tui]'"),
        ("stepwatch.cli.kubectl", ["get"], "kubectl stepwatch: needs the 'client' extra (httpx is not installed)"),
    ],
)
def test_the_reporter_only_install_names_the_extra_in_one_line(module: str, argv: list[str], said: str) -> None:
    """``pip install stepwatch`` installs the ``stepwatch`` and ``kubectl-stepwatch`` commands too; without the
    extras they answer one line naming the extra to install, never a traceback."""
    done = subprocess.run(
        [sys.executable, "-c", _REPORTER_ONLY.format(module=module), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "STEPWATCH_SERVER": "http://127.0.0.1:9"},
    )
    assert done.returncode == 1, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_chat_target_without_the_notify_extra_is_one_line(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['apprise'] = None  # the server extra without the notify one\n"
        "from stepwatch.__main__ import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "server", "--port", "0", "--db", str(tmp_path / "sw.db")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "STEPWATCH_NOTIFY": "slack://TokenA/TokenB/TokenC"},
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        "stepwatch server: notifications to slack://… need Apprise: pip install 'stepwatch[notify]'"
    )
