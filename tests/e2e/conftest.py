"""Fixtures of the browser tests: Debian's headless Chromium driven by Playwright for Python, against a real
uvicorn on 127.0.0.1 with a real SQLite file, fed by real reports (HTTP, and the report core itself).

Without Playwright or Chromium the tests skip with the reason, except under CI (``CI`` set), where a
missing browser is a failure: ``scripts/test.sh`` installs both, so CI never skips them silently.
Screenshots go to ``tests/e2e/artifacts/`` (git-ignored) or ``$STEPWATCH_TEST_ARTIFACTS``.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwatch.protocol import Identity, MetricWindow, Progress, Report
from stepwatch.testing.server import LocalServer

ARTIFACTS = Path(os.environ.get("STEPWATCH_TEST_ARTIFACTS") or Path(__file__).parent / "artifacts")


def chromium_path() -> str | None:
    """Debian's Chromium (``apt-get install chromium``), or ``$STEPWATCH_CHROMIUM``."""
    for candidate in (os.environ.get("STEPWATCH_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    if chromium_path() is None:
        return "Chromium is not installed (apt-get install -y chromium; scripts/test.sh does it)"
    return None


@pytest.fixture(scope="module")  # not session: the sync API holds an event loop in this thread while it lives
def browser() -> Iterator[Any]:
    problem = _missing()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests cannot run under CI: {problem}")
        pytest.skip(problem)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        yield instance
        instance.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh page; JavaScript errors and alert() calls fail the test (an XSS would call them)."""
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    the_page = context.new_page()
    problems: list[str] = []
    the_page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    the_page.on("dialog", lambda d: (problems.append(f"a {d.type} dialog opened: {d.message}"), d.dismiss()))
    the_page.problems = problems
    the_page.set_default_timeout(10_000)
    yield the_page
    context.close()
    assert not problems, problems


@pytest.fixture
def shot(page: Any, request: pytest.FixtureRequest) -> Any:
    """``shot("name")``: a full-page screenshot under the artifacts folder."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)

    def take(name: str) -> Path:
        path = ARTIFACTS / f"{request.node.name}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take


class Server(LocalServer):
    """A real stepwatch server (uvicorn in a thread) on a SQLite file; it can be stopped and started again.
    Its health sweep runs every second; open event streams are cut at the stop (the dashboard's never ends)."""

    def __init__(self, db: Path, **settings: Any) -> None:
        super().__init__(db, force_exit=True, **{"health_sweep_s": 1.0, **settings})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    the_server = Server(tmp_path / "sw.db")
    the_server.start()
    yield the_server
    the_server.stop()


@dataclass
class Fleet:
    """Jobs that report through the HTTP API, as the report core would (real reports, real tokens)."""

    url: str
    http: httpx.Client = field(init=False)
    tokens: dict[tuple[str, str], str] = field(default_factory=dict)
    seqs: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def register(self, name: str, namespace: str = "default", **fields: Any) -> None:
        response = self.http.post(f"/api/v1/namespaces/{namespace}/jobs", json={"name": name, **fields})
        assert response.status_code == 201, response.text
        self.tokens[(namespace, name)] = response.json()["token"]

    def report(
        self,
        name: str,
        step: int,
        metrics: dict[str, float | Sequence[float]] | None = None,
        namespace: str = "default",
        *,
        total_steps: int | None = None,
        state: str = "running",
        sent_at: float | None = None,
        params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        key = (namespace, name)
        seq = self.seqs[key] = self.seqs.get(key, 0) + 1
        windows = tuple(
            _window(metric, [v] if isinstance(v, (int, float)) else list(v), step)
            for metric, v in (metrics or {}).items()
        )
        report = Report(
            run_id=f"run-{name}",
            seq=seq,
            sent_at=time.time() if sent_at is None else sent_at,
            identity=Identity(rank=0, world_size=1, host="node-1", pid=4242),
            progress=Progress(step=step, total_steps=total_steps),
            metrics=windows,
            params=params,
            state=state,  # type: ignore[arg-type]
        )
        response = self.http.post(
            f"/api/v1/namespaces/{namespace}/jobs/{name}/reports",
            json=report.to_dict(),
            headers={"Authorization": f"Bearer {self.tokens[key]}"},
        )
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def job(self, name: str, namespace: str = "default") -> dict[str, Any]:
        response = self.http.get(f"/api/v1/namespaces/{namespace}/jobs/{name}")
        assert response.status_code == 200, response.text
        view: dict[str, Any] = response.json()
        return view


def _window(name: str, values: list[float], step: int) -> MetricWindow:
    finite = [v for v in values if math.isfinite(v)]
    return MetricWindow(
        name=name,
        last=values[-1],
        min=min(finite) if finite else None,
        max=max(finite) if finite else None,
        mean=sum(finite) / len(finite) if finite else None,
        count=len(values),
        nonfinite=len(values) - len(finite),
        first_step=step,
        last_step=step,
    )


@pytest.fixture
def fleet(server: Server) -> Iterator[Fleet]:
    the_fleet = Fleet(server.url)
    yield the_fleet
    the_fleet.http.close()


@pytest.fixture
def start_server() -> Iterator[Callable[..., Server]]:
    """``start_server(db, auth="tokens")``: a server on ``db`` with these settings, stopped at the end."""
    started: list[Server] = []

    def start(db: Path, **settings: Any) -> Server:
        the_server = Server(db, **settings)
        the_server.start()
        started.append(the_server)
        return the_server

    yield start
    for the_server in started:
        the_server.stop()


@pytest.fixture
def fleet_at() -> Iterator[Callable[[str], Fleet]]:
    """``fleet_at(url)``: a :class:`Fleet` reporting to that server."""
    fleets: list[Fleet] = []

    def make(url: str) -> Fleet:
        fleets.append(Fleet(url))
        return fleets[-1]

    yield make
    for the_fleet in fleets:
        the_fleet.http.close()
