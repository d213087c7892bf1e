"""Shared fixtures (a clean stepwatch state and environment for every test, a loopback sink) and the tiers.

Tiers: ``pytest`` runs the default tier, the tests a person waits for; ``pytest --full`` runs every test.
A test is in the full tier only when it carries one of :data:`FULL_ONLY`. Those markers are declared in
pyproject.toml; here, in one place, :func:`pytest_collection_modifyitems` gives the ones that follow from
where a test is (:data:`BY_PLACE`) or what it runs on (a ``both_stores`` test's PostgreSQL run), and a test
file marks its own ``slow`` and ``perf`` tests. ``-m EXPRESSION`` picks tests by marker instead (``-m slow``:
that tier alone); a test named on the command line with its ``::`` id runs whatever its tier.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepwatch.testing import ReportSink

FULL_ONLY = ("slow", "frameworks", "perf", "bench", "browser", "reliability", "postgres")
"""The markers of the tests that only ``--full`` runs (their meaning: pyproject.toml)."""

BY_PLACE = {
    "tests/e2e/*": "browser",
    "tests/integrations/*": "frameworks",
    "tests/reliability/*": "reliability",
    "tests/*test_*bench*.py": "bench",
}
"""Markers given by path (relative to the repository, ``fnmatch`` patterns: ``*`` spans folders too)."""

ROOT = Path(__file__).parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        help=f"run every tier: also the tests marked {', '.join(FULL_ONLY)} (the default run leaves them out)",
    )


def _named(config: pytest.Config) -> list[str]:
    """The test ids given on the command line (``path::name``), relative to the repository."""
    ids = []
    for arg in config.args:
        if "::" in arg:
            path, rest = arg.split("::", 1)
            where = (Path(config.invocation_params.dir) / path).resolve()
            ids.append(f"{where.relative_to(ROOT).as_posix()}::{rest}" if where.is_relative_to(ROOT) else arg)
    return ids


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with the tiers its place gives; outside ``--full`` and ``-m``, leave the full tier out."""
    for item in items:
        where = item.path.relative_to(ROOT).as_posix() if item.path.is_relative_to(ROOT) else ""
        for pattern, marker in BY_PLACE.items():
            if fnmatch.fnmatch(where, pattern):
                item.add_marker(marker)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "postgres":
            item.add_marker("postgres")
    if config.getoption("full") or config.getoption("markexpr"):
        return
    named = _named(config)
    kept, left_out = [], []
    for item in items:
        full_only = any(item.get_closest_marker(marker) for marker in FULL_ONLY)
        if full_only and not any(item.nodeid == n or item.nodeid.startswith((f"{n}[", f"{n}::")) for n in named):
            left_out.append(item)
        else:
            kept.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
        counts = {m: sum(1 for item in left_out if item.get_closest_marker(m)) for m in FULL_ONLY}
        config.stash[_LEFT_OUT] = (len(left_out), counts)
        worker_output = getattr(config, "workeroutput", None)  # a pytest-xdist worker: tell the controller
        if worker_output is not None:
            worker_output["left_out"] = (len(left_out), counts)


_LEFT_OUT = pytest.StashKey[tuple[int, dict[str, int]]]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """Under pytest-xdist (``-n``) the workers collect: the controller takes what one of them left out."""
    found = getattr(node, "workeroutput", {}).get("left_out")
    config = getattr(node, "config", None)
    if found is not None and config is not None:
        config.stash[_LEFT_OUT] = tuple(found)


@pytest.hookimpl(wrapper=True, tryfirst=True)  # around pytest's own summary: this line comes after it
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> Iterator[None]:
    """Say, last before the counts, which tiers this run left out and how to run them."""
    yield
    total, counts = config.stash.get(_LEFT_OUT, (0, {}))
    if not total:
        return
    tiers = ", ".join(f"{marker} ({count})" for marker, count in counts.items() if count)
    terminalreporter.write_line(
        f"default tier: {total} tests left out, marked {tiers}; "
        "run them with `bash scripts/test.sh --full` (or `pytest --full`)",
        yellow=True,
    )


@pytest.fixture(autouse=True)
def clean_stepwatch(stepwatch_clean: None) -> None:
    """No stepwatch or rank variable leaks in from the machine, and no run outlives its test (the plugin's
    ``stepwatch_clean``, for every test of this suite)."""


@pytest.fixture(autouse=True)
def _no_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as written to a file, whatever the terminal that runs the tests: a ``$COLUMNS`` of the person's
    shell, or the 80 that pytest-xdist gives each worker, would drop columns the tests read (the CLI's tables
    read by tests of every folder: the frameworks' too). Tests of the width set their own."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def sink() -> Iterator[ReportSink]:
    """A real report sink on 127.0.0.1, stopped after the test."""
    with ReportSink() as server:
        yield server
