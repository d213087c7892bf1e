"""``stepwatch jobs``, ``watch`` and ``stop`` against a real server on a loopback port, fed by real reporters.

The server is the real app served by uvicorn in a thread (one per module, on a temporary SQLite file);
each test works in its own namespace. Jobs are registered through the client and report through
``stepwatch.init`` exactly as a training loop would. The CLI runs in-process through
``stepwatch.cli.main`` (stdout captured, so it is the piped, plain-text mode), and once as a subprocess.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Without the client and server extras there is nothing to test here (CI keeps a run with no extras).
pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

import stepwatch
from stepwatch.cli import _format, build_parser, main
from stepwatch.cli import jobs as jobs_cli
from stepwatch.cli import watch as watch_cli
from stepwatch.client import Client
from stepwatch.server import ServerSettings, create_app
from stepwatch.testing import wait_for
from stepwatch.testing.server import ServerThread

DURATION = re.compile(r"^(\d+s|\d+m\d\ds|\d+h\d\dm|\d+d\d\dh)$")
_namespaces = itertools.count(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real stepwatch server on 127.0.0.1, for the whole module."""
    db = tmp_path_factory.mktemp("cli-jobs") / "stepwatch.db"
    # streams left open by the commands under test are cut after 1 s; their cut is no news: log_level critical
    with ServerThread(create_app(ServerSettings(db=str(db))), log_level="critical") as httpd:
        yield httpd.url


@pytest.fixture
def ns() -> str:
    """A namespace of this test's own."""
    return f"t{next(_namespaces)}"


def _job(url: str, ns: str, name: str) -> dict[str, Any]:
    with Client(url) as client:
        return client.job(name, ns).raw


def _register(url: str, ns: str, name: str, **fields: Any) -> str:
    with Client(url) as client:
        _, token = client.register(name, ns, **fields)
    return token


def _start(url: str, ns: str, name: str, **init: Any) -> stepwatch.Run:
    """Register a job and start reporting for it, as a training process does."""
    token = _register(url, ns, name)
    return stepwatch.init(job=name, namespace=ns, url=url, token=token, interval=0.05, **init)


def _reported(url: str, ns: str, name: str, step: int) -> dict[str, Any]:
    return wait_for(lambda: (v := _job(url, ns, name))["progress"]["step"] == step and v)


def _table(text: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """Headers and rows (by NAME) of a plain table, cut at the header's column starts."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
    rows = {}
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
        rows[cells[0]] = dict(zip(names, cells))
    return names, rows


def _run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------------------- jobs


def _board(url: str, ns: str) -> stepwatch.Run:
    """Three jobs: ``queued`` (registered, silent), ``boom`` (NaN loss, no total, failed), ``train`` (running)."""
    _register(url, ns, "queued", total_steps=500)
    boom = _start(url, ns, "boom")
    for _ in range(5):
        boom.step(loss=float("nan"))
    _reported(url, ns, "boom", 5)
    boom.finish("failed", "loss is NaN")
    train = _start(url, ns, "train", total_steps=10_000, total_epochs=3)
    train.epoch(1.5)
    for step in (1000, 1100):  # distinct steps at distinct times: a rate, hence an ETA
        train.step(step, loss=0.5)
        _reported(url, ns, "train", step)
        time.sleep(0.1)
    train.step(1200, loss=0.4)
    wait_for(lambda: (v := _reported(url, ns, "train", 1200))["eta"]["remaining_seconds"] and v)
    return train


def test_jobs_table_wide_and_json(server: str, ns: str, capsys: pytest.CaptureFixture[str]) -> None:
    trainer = _board(server, ns)

    code, out, err = _run_cli(capsys, "jobs", "--server", server, "-n", ns)
    assert (code, err) == (0, "")
    headers, rows = _table(out)
    assert headers == [
        "NAME",
        "NAMESPACE",
        "STATE",
        "HEALTH",
        "PROGRESS%",
        "STEP",
        "EPOCH",
        "ETA",
        "LOSS",
        "COST",
        "AGE",
    ]
    assert list(rows) == ["boom", "queued", "train"]  # by name
    train = rows["train"]
    assert train["NAMESPACE"] == ns
    assert train["STATE"] == "running"
    assert train["PROGRESS%"] == "12.0%"
    assert train["STEP"] == "1200/10000"
    assert train["EPOCH"] == "1.5/3"
    assert DURATION.match(train["ETA"]) and train["ETA"] != "0s", train
    assert train["LOSS"] == "0.4"
    assert DURATION.match(train["AGE"])
    boom = rows["boom"]
    assert (boom["STATE"], boom["PROGRESS%"], boom["STEP"], boom["EPOCH"], boom["ETA"], boom["LOSS"]) == (
        "failed",
        "-",
        "5",
        "-",
        "-",
        "NaN",
    )
    queued = rows["queued"]
    assert (queued["STATE"], queued["STEP"], queued["ETA"], queued["LOSS"]) == ("pending", "-", "-", "-")

    code, out, _ = _run_cli(capsys, "jobs", "--server", server, "-n", ns, "-o", "wide")
    headers, rows = _table(out)
    assert code == 0
    assert headers[-4:] == ["ATTEMPT", "STEPS/S", "FINISH", "LAST REPORT"]
    assert rows["train"]["ATTEMPT"] == "1"
    assert float(rows["train"]["STEPS/S"]) > 0
    assert re.match(r"^(\d\d:\d\d|\w{3} \d\d:\d\d)$", rows["train"]["FINISH"])
    assert DURATION.match(rows["train"]["LAST REPORT"])
    assert (rows["queued"]["STEPS/S"], rows["queued"]["FINISH"], rows["queued"]["LAST REPORT"]) == ("-", "-", "-")

    trainer.finish()  # nothing moves any more: the CLI's JSON and the API's can be compared
    wait_for(lambda: _job(server, ns, "train")["state"] == "finished")
    code, out, _ = _run_cli(capsys, "jobs", "--server", server, "-n", ns, "-o", "json")
    assert code == 0
    printed = json.loads(out)
    with Client(server) as client:
        api = {v.name: v.raw for v in client.jobs(ns)}
    assert [v["name"] for v in printed] == ["boom", "queued", "train"]
    for view in printed:
        same = api[view["name"]]
        assert view.keys() == same.keys()
        for key in view.keys() - {"eta", "times"}:  # those two are computed at read time
            assert view[key] == same[key], key
        for key in ("created", "started", "finished", "last_report"):
            assert view["times"][key] == same["times"][key]
    assert printed[0]["metrics"]["loss"] == "NaN"


def test_jobs_namespaces_state_and_sort(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = f"a{next(_namespaces)}", f"b{next(_namespaces)}"
    _register(server, first, "alpha")
    _register(server, second, "beta")
    _register(server, second, "gamma")

    code, out, _ = _run_cli(capsys, "jobs", "--server", server, "-A")
    _, rows = _table(out)
    assert code == 0
    assert (rows["alpha"]["NAMESPACE"], rows["beta"]["NAMESPACE"], rows["gamma"]["NAMESPACE"]) == (
        first,
        second,
        second,
    )
    code, out, _ = _run_cli(capsys, "jobs", "--server", server, "-n", first)
    assert list(_table(out)[1]) == ["alpha"]
    code, out, _ = _run_cli(capsys, "jobs", "--server", server, "-n", second, "--sort=-name", "--state", "pending")
    assert list(_table(out)[1]) == ["gamma", "beta"]

    code, out, err = _run_cli(capsys, "jobs", "--server", server, "-n", second, "--state", "running")
    assert (code, out) == (0, "")
    assert f"no running jobs in namespace {second}" in err
    code, out, err = _run_cli(capsys, "jobs", "--server", server, "--state", "sleeping")
    assert code == 1
    assert err.startswith("stepwatch jobs: state must be among")


def test_jobs_watch_redraws_when_piped(server: str, ns: str) -> None:
    """The --watch loop itself, stopped by an event instead of Ctrl-C, writing to a pipe-like buffer."""
    run = _start(server, ns, "live", total_steps=40)
    run.step(loss=1.0)
    _reported(server, ns, "live", 1)
    args = build_parser().parse_args(["jobs", "--watch", "--server", server, "-n", ns])
    out, stop = io.StringIO(), threading.Event()
    with Client(server) as client:
        views = [v.raw for v in client.jobs(ns)]
        watcher = threading.Thread(target=jobs_cli.watch_table, args=(client, ns, args, views, out, stop))
        started = time.monotonic()
        watcher.start()
        try:
            for _ in range(39):
                run.step(loss=0.5)
                time.sleep(0.03)
            run.finish()
            wait_for(lambda: "finished" in out.getvalue(), timeout=5)
        finally:
            stop.set()
            watcher.join(5)
        elapsed = time.monotonic() - started
    assert not watcher.is_alive()
    tables = [t for t in out.getvalue().split("\n\n") if t.strip()]
    assert _table(tables[0])[1]["live"]["STEP"] == "1/40"
    assert _table(tables[-1])[1]["live"]["STEP"] == "40/40"
    assert _table(tables[-1])[1]["live"]["ETA"] == "0s"
    assert 2 <= len(tables) <= elapsed / jobs_cli.REDRAW_EVERY_S + 2  # at most one table a second


def test_jobs_watch_ctrl_c_exits_130(
    server: str, ns: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _register(server, ns, "idle")

    def interrupted(self: watch_cli.Feed, timeout: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(watch_cli.Feed, "get", interrupted)
    code, out, err = _run_cli(capsys, "jobs", "--watch", "--server", server, "-n", ns)
    assert (code, err) == (130, "")  # as docs/cli.md says: interrupted, like every command Ctrl-C ends
    assert "idle" in _table(out)[1]


# -------------------------------------------------------------------------------------- watch


def test_watch_follows_a_job_until_it_finishes(server: str, ns: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = _start(server, ns, "short", total_steps=30)

    def train() -> None:
        for i in range(30):
            run.step(loss=1 / (i + 1))
            time.sleep(0.035)
        run.finish()

    run.step(0, loss=1.0)
    _reported(server, ns, "short", 0)
    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        code, out, err = _run_cli(capsys, "watch", "short", "--server", server, "-n", ns)
    finally:
        trainer.join(5)
    assert (code, err) == (0, "")
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"{ns}/short running ")  # it was followed while it ran
    found = re.fullmatch(rf"{ns}/short finished in \d+s at step 30/30, loss (0\.0\d+)", lines[-1])
    assert found, lines[-1]
    # the loss as every table shows it: its last window's mean (issue 30), not the last batch's 1/30
    assert float(found[1]) == pytest.approx(_job(server, ns, "short")["metric_means"]["loss"], rel=1e-3)


def test_watch_exit_codes_for_failed_stopped_and_unknown(
    server: str, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _start(server, ns, "oom", total_steps=100)
    run.step(20, loss=2.0)
    _reported(server, ns, "oom", 20)
    run.finish("failed", "CUDA out of memory")
    wait_for(lambda: _job(server, ns, "oom")["state"] == "failed")
    code, out, _ = _run_cli(capsys, "watch", "oom", "--server", server, "-n", ns)
    assert code == 1
    assert out.strip() == f"{ns}/oom failed: CUDA out of memory (at step 20/100, ended at 20.0%)"

    run = _start(server, ns, "halted")
    run.step(loss=1.0)
    run.finish("stopped", "KeyboardInterrupt")
    wait_for(lambda: _job(server, ns, "halted")["state"] == "stopped")
    code, out, _ = _run_cli(capsys, "watch", "halted", "--server", server, "-n", ns)
    assert code == 2
    assert out.startswith(f"{ns}/halted stopped: KeyboardInterrupt")

    code, out, err = _run_cli(capsys, "watch", "nosuch", "--server", server, "-n", ns)
    assert (code, out) == (3, "")
    hint = f"`stepwatch jobs -A --server {server}` lists them"  # with the user's --server: it pastes
    assert err.strip() == f"stepwatch watch: no job {ns}/nosuch at {server} ({hint})"


# --------------------------------------------------------------------------------------- stop


def test_stop_reaches_the_reporter(server: str, ns: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = _start(server, ns, "plateau", total_steps=1000)
    run.step(loss=1.0)
    _reported(server, ns, "plateau", 1)
    assert not run.should_stop

    code, out, err = _run_cli(capsys, "stop", "plateau", "--server", server, "-n", ns, "--reason", "not learning")
    assert (code, err) == (0, "")
    assert out.startswith(f"asked {ns}/plateau to save a checkpoint, then stop (not learning); command ")
    assert "next step boundary" in out

    def obeyed() -> bool:
        run.step(loss=1.0)  # the training loop goes on until it reads the command
        return run.should_stop

    wait_for(obeyed)
    assert run.command_reason == "not learning"
    run.finish("stopped", "asked to stop")
    wait_for(lambda: _job(server, ns, "plateau")["state"] == "stopped")

    code, out, err = _run_cli(capsys, "stop", "plateau", "--server", server, "-n", ns)
    assert (code, out) == (1, "")
    assert err.strip() == f"stepwatch stop: job {ns}/plateau has already stopped: there is nothing to stop"
    code, out, err = _run_cli(capsys, "stop", "ghost", "--server", server, "-n", ns)
    assert code == 3  # no such job: the same status for every command (cli/_errors.py, docs/cli.md)
    hint = f"`stepwatch jobs -A --server {server}` lists them"  # the hint keeps --server: it pastes
    assert err.strip() == f"stepwatch stop: no job {ns}/ghost at {server} ({hint})"


# ------------------------------------------------------------------------- no server, no client


@pytest.mark.parametrize("argv", [["jobs"], ["jobs", "--watch"], ["watch", "x"], ["stop", "x"]])
def test_no_server_is_one_line_and_exit_1(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # bound, then closed: nobody listens there
    code, out, err = _run_cli(capsys, *argv, "--server", url)
    assert (code, out) == (1, "")
    assert err == (
        f"no stepwatch server at {url}: start one with `stepwatch server`, or run a job with `stepwatch run -- ...`\n"
    )


def test_missing_client_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "stepwatch.client", None)  # as if httpx were not installed
    for argv in (["jobs"], ["watch", "x"], ["stop", "x"]):
        code, out, err = _run_cli(capsys, *argv)
        assert (code, out) == (1, "")
        assert err.strip().endswith("pip install 'stepwatch[client]'")


def test_as_a_real_command(server: str, ns: str) -> None:
    _register(server, ns, "proc", total_steps=10)
    env_python = [sys.executable, "-m", "stepwatch"]
    cwd = Path(__file__).parent
    done = subprocess.run([*env_python, "jobs", "--server", server, "-n", ns], capture_output=True, text=True, cwd=cwd)
    assert (done.returncode, done.stderr) == (0, "")
    headers, rows = _table(done.stdout)
    assert headers[:5] == ["NAME", "NAMESPACE", "STATE", "HEALTH", "PROGRESS%"]
    assert rows["proc"]["STATE"] == "pending"

    url = f"http://127.0.0.1:{_free_port()}"
    done = subprocess.run([*env_python, "jobs", "--server", url], capture_output=True, text=True, cwd=cwd)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(f"no stepwatch server at {url}: ")
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------------ formatting


def test_formatting() -> None:
    assert [_format.duration(s) for s in (None, math.nan, -3, 0, 59.4, 192, 3720, 90000)] == [
        "-",
        "-",
        "0s",
        "0s",
        "59s",
        "3m12s",
        "1h02m",
        "1d01h",
    ]
    assert [_format.percent(p) for p in (None, 0, 12.04, 99.96, 100)] == ["-", "0.0%", "12.0%", "99.9%", "100%"]
    assert [_format.loss_text(v) for v in (None, 0.0123, 1.5e-5, "NaN", "Infinity", "-Infinity", math.nan)] == [
        "-",
        "0.0123",
        "1.5e-05",
        "NaN",
        "Inf",
        "-Inf",
        "NaN",
    ]
    assert _format.loss_of({"train/loss": 2.0, "train_loss": 3.0}) == 2.0
    assert _format.loss_of({"loss": "NaN", "train/loss": 2.0}) == "NaN"
    assert _format.epoch_text({"epoch": 1.5, "total_epochs": 3.0}) == "1.5/3"
    assert _format.step_text({"step": 1200, "total_steps": None}) == "1200"
    assert _format.plain_table(["A", "LONG HEADER"], [["x", "1"], [_format.Cell("yyyy", "red"), "22"]]) == (
        "A      LONG HEADER\nx      1\nyyyy   22"
    )


# ------------------------------------------------------------------------------------ describe


def test_describe_shows_a_job_in_full(server: str, ns: str, capsys: pytest.CaptureFixture[str]) -> None:
    token = _register(server, ns, "desc", total_steps=100, gpus=2, gpu_hour_cost=3.5)
    run = stepwatch.init(
        job="desc", namespace=ns, url=server, token=token, interval=0.05, params={"lr": 0.001, "model": "tiny"}
    )
    for step in range(1, 11):
        run.step(loss=1.0 / step, grad_norm=0.0123)
    _reported(server, ns, "desc", 10)
    code, out, _ = _run_cli(capsys, "describe", "desc", "--server", server, "-n", ns)
    assert code == 0
    flat = re.sub(r" +", " ", out)
    assert "Name: desc" in flat and f"Namespace: {ns}" in flat
    assert "Health:\n State: healthy" in flat
    assert "Step: 10/100" in flat
    assert "Cost:\n Rate: $7.00 USD/h" in flat
    assert "loss: 0.1\n" in flat and "grad_norm: 0.0123" in flat
    assert "lr: 0.001" in flat and "model: tiny" in flat
    assert "Events:" in flat and " registered attempt 1 registered" in flat and " running first report" in flat
    run.finish()
    code, _, err = _run_cli(capsys, "describe", "nope", "--server", server, "-n", ns)
    assert code == 3 and "stepwatch jobs -A" in err


# ------------------------------------------------------------------------------ terminal width


def _long_views() -> list[dict[str, Any]]:
    """Views whose cells are as long as they get: a stopped job that ended short, a long name, big money."""
    base = {"attempt": 1, "times": {"created": time.time() - 4000}, "resources": {"gpus": 8}}
    return [
        {**base, "namespace": "fraud-team", "name": "fraud-detector-xl-sweep-17", "state": "stopped",
         "health": {"state": "not_learning"}, "progress": {"percent": 68.5, "step": 6857, "total_steps": 10000,
         "epoch": 2.05, "total_epochs": 3}, "eta": {"remaining_seconds": None},
         "metrics": {"loss": 1.234e-05}, "metric_means": {"loss": 1.5e-05},
         "cost": {"spent": 12345.67, "rate_per_hour": None}},
        {**base, "namespace": "default", "name": "bert", "state": "running",
         "health": {"state": "stalled", "since": time.time() - 100},
         "progress": {"percent": 9.9, "step": 996, "total_steps": 10000, "steps_per_second": None},
         "eta": {"remaining_seconds": 3725.0}, "metrics": {"loss": 0.5}, "cost": {"spent": 0.5, "rate_per_hour": 6.0}},
    ]  # fmt: skip


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("width", [80, 120])
def test_jobs_fits_the_terminal_and_never_cuts_a_cell(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: at 80 columns every cell was cut ("STA…", "$0…"), at 120 "ended at 68.…". Now columns are
    dropped whole, least needed first, on a terminal (rich) and piped alike."""
    pytest.importorskip("rich")
    monkeypatch.setenv("COLUMNS", str(width))
    rows = [jobs_cli.job_row(v) for v in _long_views()]
    whole = {_format._text(c) for row in rows for c in row}
    for out in (_Tty(), io.StringIO()):
        _format.print_table(jobs_cli.HEADERS, rows, out, priority=jobs_cli.PRIORITY)
        text = out.getvalue()
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in text.splitlines()]
        assert all(len(line) <= width for line in lines), lines
        assert "…" not in text
        headers = lines[0].split()
        for column in ("NAME", "STATE", "PROGRESS%", "HEALTH", "ETA"):  # the most needed stay
            assert column in headers, (width, lines[0])
        assert "ended at 68.5%" in text and "not_learning" in text and "fraud-detector-xl-sweep-17" in text
        cells = {cell for line in lines[1:] for cell in re.split(r" {3,}", line.strip())}
        assert cells <= whole, cells - whole  # every cell shown is a whole cell
    assert ("LOSS" in headers) == ("COST" in headers) == (width == 120)  # the long name leaves no room at 80


def test_jobs_loss_is_the_window_mean_and_no_rate_reads_a_dash() -> None:
    stopped, stalled = (jobs_cli.job_row(v, wide=True) for v in _long_views())
    loss = jobs_cli.HEADERS.index("LOSS")
    assert stopped[loss].text == "1.5e-05" and stalled[loss].text == "0.5"  # the mean, else the last value
    rate = jobs_cli.WIDE_HEADERS.index("STEPS/S")
    assert stopped[rate] == "—" and stalled[rate] == "—"


@pytest.mark.parametrize("width", [80, 120])
def test_watch_keeps_its_bar(width: int) -> None:
    """Issue 30: at 80 columns ``watch`` lost its bar. The fields beside it go first, the bar stays."""
    pytest.importorskip("rich")
    from rich.console import Console

    view = {**_long_views()[1], "name": "fraud-detector-xl-sweep-17"}
    cells, before, after = watch_cli.bar_line(view, 3725.0, width, "default/fraud-detector-xl-sweep-17")
    assert cells >= watch_cli.BAR_MIN and len(before) + bool(before) + cells + 1 + len(after) <= width
    assert after.startswith("9.9% step 996/10000 ETA 1h02m")
    out = _Tty()
    bar = watch_cli._Bar(out, "default/bert")
    bar._console = Console(file=out, width=width, force_terminal=True)
    bar._live = type(bar._live)(console=bar._console, auto_refresh=False)
    with bar:
        bar.show(view, 3725.0)
    drawn = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())
    assert drawn.count("━") >= watch_cli.BAR_MIN and "9.9%" in drawn and "…" not in drawn
    assert "stalled since" in drawn or width < 120
    assert "default/bert" in drawn  # beside the bar, or once above it when there is no room


def test_a_hint_keeps_the_users_server_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEPWATCH_NAMESPACE", raising=False)
    monkeypatch.delenv("STEPWATCH_API_TOKEN", raising=False)
    args = build_parser().parse_args(
        ["stop", "bert", "-n", "vision", "--server", "http://gpu-box:8642", "--token", "t0k"]
    )
    assert _format.again(args, "watch", "bert") == (
        "stepwatch watch bert -n vision --server http://gpu-box:8642 --token t0k"
    )
    monkeypatch.setenv("STEPWATCH_API_TOKEN", "t0k")  # from the environment: the pasted command has it too
    assert _format.again(args, "watch", "my job") == "stepwatch watch 'my job' -n vision --server http://gpu-box:8642"
    plain = build_parser().parse_args(["stop", "bert"])
    assert _format.again(plain, "watch", "bert") == "stepwatch watch bert"


def test_stop_hint_pastes(server: str, ns: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = _start(server, ns, "paste", total_steps=100)
    run.step(1, loss=1.0)
    _reported(server, ns, "paste", 1)
    code, out, _ = _run_cli(capsys, "stop", "paste", "-n", ns, "--server", server)
    assert code == 0 and f"`stepwatch watch paste -n {ns} --server {server}` follows it" in out
    run.finish()


def test_wide_keeps_what_it_adds_before_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    rows = [jobs_cli.job_row(v, wide=True) for v in _long_views()]
    out = io.StringIO()
    _format.print_table(jobs_cli.WIDE_HEADERS, rows, out, priority=jobs_cli.WIDE_PRIORITY)
    lines = out.getvalue().splitlines()
    assert "STEPS/S" in lines[0] and all(len(line) <= 120 for line in lines)
    assert "— " in lines[1] or lines[1].rstrip().endswith("—")  # the stopped job: no live rate
