"""The dashboard across a restart of ``stepwatch server``: a page left open goes on by itself.

A real ``stepwatch server`` runs as a subprocess on a fixed port of 127.0.0.1 with a real SQLite file; a job
reports to it over HTTP; headless Chromium shows the list live. SIGTERM stops the server (its stop ends the
page's live stream at once, ``server.serving.stopping``): the process exits and the page says it is
reconnecting. The same command starts the server again on the same port and database; the page's
``EventSource`` reconnects by itself (no reload: a mark set on ``window`` before the stop is still there),
says live again, reads the list again and keeps following the job's progress.

(``tests/e2e/*`` is marked ``browser`` by its place: the full tier runs it, ``pytest --full``.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_dashboard import wait_js

from stepwatch.testing import wait_for

STOP_S = 20.0
"""A generous bound on a stop with the page's stream open (a few tenths of a second here; 5 s and more
without the stop's hook)."""

LIVE = "#live:text-is('● live')"
RECONNECTING = "#live:text-is('○ reconnecting…')"
ROW = "default/resnet"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


class ServerProcess:
    """``python -m stepwatch server`` on ``port`` and ``db``, its output in a log file; started and stopped
    again as a person would (a command, then SIGTERM)."""

    def __init__(self, port: int, db: Path, home: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.command = [sys.executable, "-m", "stepwatch", "server", "--port", str(port), "--db", str(db)]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "STEPWATCH_HOME": str(home)}
        self.home = home
        self.runs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self) -> None:
        log = self.home / f"server-{len(self.runs) + 1}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        self.runs.append(process)
        wait_for(lambda: _answers(self.url) or process.poll() is not None, 30, "the server answers")
        assert process.poll() is None, f"the server exited at its start:\n{self.log()}"

    def terminate(self) -> float:
        """SIGTERM the running server; the seconds it took to exit (it must exit within :data:`STOP_S`)."""
        process = self.runs[-1]
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not exit within {STOP_S} s of SIGTERM:\n{self.log()}")
        return time.monotonic() - began

    def log(self) -> str:
        return self.logs[-1].read_text(errors="replace") if self.logs else ""

    def kill_all(self) -> None:
        for process in self.runs:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerProcess]:
    home = tmp_path / "home"
    home.mkdir()
    the_server = ServerProcess(_free_port(), tmp_path / "sw.db", home)
    yield the_server
    the_server.kill_all()


def _row_shows(page: Any, text: str) -> None:
    wait_js(
        page,
        "const r = document.querySelector(`tr[data-key='${arg.key}']`); return r && r.innerText.includes(arg.text);",
        {"key": ROW, "text": text},
        timeout=20_000,
    )


def test_the_page_reconnects_by_itself_after_the_server_restarts(
    page: Any,
    served: ServerProcess,
    fleet_at: Callable[[str], Any],
    shot: Callable[[str], Path],
) -> None:
    served.start()
    fleet = fleet_at(served.url)
    fleet.register("resnet", total_steps=1000, gpus=1, gpu_hour_cost=2.0)
    for step in (100, 200, 300):
        fleet.report("resnet", step, {"loss": 1.0 / step}, total_steps=1000)

    page.goto(served.url + "/")
    page.wait_for_selector(LIVE)
    _row_shows(page, "300 / 1,000")
    page.evaluate("window.__marker = 1")
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    list_reads: list[str] = []
    page.on("request", lambda r: list_reads.append(r.url) if "/api/v1/jobs?" in r.url else None)

    # the stop: quick, and the page says it lost the server
    took = served.terminate()
    assert took < STOP_S, took
    assert "ERROR" not in served.log(), served.log()
    page.wait_for_selector(RECONNECTING, timeout=15_000)
    page.wait_for_selector("#banner:has-text('does not answer')")
    assert "300 / 1,000" in page.locator(f"tr[data-key='{ROW}']").inner_text()  # what it knew stays shown

    # the same command again, same port and database: the job goes on while the page is not yet back
    served.start()
    again = fleet_at(served.url)  # (the first client's kept-alive connection went with the old process)
    again.tokens, again.seqs = fleet.tokens, fleet.seqs
    again.report("resnet", 500, {"loss": 1.0 / 500}, total_steps=1000)

    page.wait_for_selector(LIVE, timeout=20_000)  # by itself: nothing here reloads or clicks
    page.wait_for_selector("#banner", state="hidden")
    _row_shows(page, "500 / 1,000")
    assert list_reads, "the page did not read the list again after the reconnect"

    # and it follows the job live again on the new stream
    again.report("resnet", 700, {"loss": 1.0 / 700}, total_steps=1000)
    _row_shows(page, "700 / 1,000")
    assert "70.0%" in page.locator(f"tr[data-key='{ROW}']").inner_text()

    assert page.evaluate("window.__marker") == 1, "the page was reloaded"
    assert navigations == [], navigations
    assert page.locator("#live").inner_text() == "● live"

    for width in (1440, 800):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_selector(f"tr[data-key='{ROW}']")
        shot(f"{width}px")
