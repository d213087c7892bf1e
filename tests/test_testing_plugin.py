"""The pytest plugin (entry point ``pytest11``: ``stepwatch = stepwatch.testing.plugin``) as a user's suite meets
it: real pytest runs (``pytester``) of small test files that use its fixtures, in a folder of their own with no
conftest of ours: pytest finds the plugin through the installed package's entry point, as it does for a user."""

from __future__ import annotations

import subprocess
import sys

import pytest

REPORTING = """
import os

import stepwatch


def test_a_loop_reports_to_the_sink(stepwatch_clean, stepwatch_sink):
    run = stepwatch.init(job="t", url=stepwatch_sink.url, interval=0.05)
    for i in range(100):
        run.step(loss=1 / (i + 1))
    assert run.finish()
    assert stepwatch_sink.final().progress.step == 100
    assert sum(stepwatch_sink.metric_values("loss", "count")) == 100


def test_the_sender_talks_to_memory(stepwatch_clean, stepwatch_transport):
    run = stepwatch.init(job="t", url="http://stepwatch.test", transport=stepwatch_transport, interval=0.05)
    run.step(loss=1.0)
    assert run.finish()
    assert stepwatch_transport.requests and stepwatch_transport.requests[-1].method == "POST"


def test_the_clock_moves_when_told(stepwatch_clock):
    start = stepwatch_clock()
    assert stepwatch_clock.advance(600) == stepwatch_clock() == start + 600


def test_webhooks_are_recorded(stepwatch_webhooks):
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(stepwatch_webhooks.url(), data=b'{"kind": "x"}'), timeout=5)
    assert stepwatch_webhooks.wait_for(1)[0].json() == {"kind": "x"}


def test_no_variable_of_the_machine_comes_in(stepwatch_clean):
    assert not [name for name in os.environ if name.startswith("STEPWATCH_") and name != "STEPWATCH_HANDLE_SIGTERM"]
"""


def test_the_fixtures_in_a_users_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPWATCH_URL", "http://127.0.0.1:9")  # a developer's own server: never reached
    pytester.makepyfile(test_mine=REPORTING)
    pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider").assert_outcomes(passed=5)


def test_the_server_fixture(pytester: pytest.Pytester) -> None:
    pytest.importorskip("uvicorn", reason="stepwatch_server needs the server extra")
    pytester.makepyfile(
        test_mine="""
        import httpx
        import stepwatch

        def test_a_job_on_the_real_server(stepwatch_clean, stepwatch_server, tmp_path):
            run = stepwatch.init(job="t", url=stepwatch_server.url, interval=0.05, total_steps=10)
            for i in range(10):
                run.step(loss=1 / (i + 1))
            assert run.finish()
            job = httpx.get(f"{stepwatch_server.url}/api/v1/namespaces/default/jobs/t").json()
            assert (job["state"], job["progress"]["step"]) == ("finished", 10)
            assert stepwatch_server.db == tmp_path / "stepwatch.db"
        """
    )
    pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_loading_the_plugin_costs_a_suite_that_uses_none_of_it_nothing(pytester: pytest.Pytester) -> None:
    """pytest loads the plugin in every run where stepwatch is installed (training images included): it imports
    no socket server, no HTTP client and nothing of the server (a fresh interpreter, after pytest itself), and
    offers its fixtures all the same."""
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pytest; before = set(sys.modules); import stepwatch.testing.plugin; "
            "print(' '.join(sorted(set(sys.modules) - before)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "stepwatch.testing.plugin" in imported
    heavy = ["stepwatch.testing._sink", "stepwatch.server", "stepwatch.client", "uvicorn", "http.server", "ssl"]
    assert [name for name in heavy if name in imported] == [], imported
    listed = pytester.runpytest_subprocess("--fixtures", "-p", "no:cacheprovider")
    listed.stdout.fnmatch_lines(["*fixtures defined from stepwatch.testing.plugin*"])
    for name in ("clean", "sink", "transport", "clock", "webhooks", "server"):
        listed.stdout.fnmatch_lines([f"stepwatch_{name}*"])
