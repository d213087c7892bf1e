"""A reporter that never gets through says so (issue 21, item 8): one warning once nothing was accepted
for ``STEPWATCH_WARN_AFTER`` seconds, and one line at ``finish()`` of what was not delivered; never
more. Against a real loopback server that answers 500 to everything, and against a port where
nothing listens."""

from __future__ import annotations

import logging
import socket
import time

import pytest

import stepwatch
from stepwatch.testing import ReportSink


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _train(url: str, seconds: float) -> bool:
    run = stepwatch.init(job="silent", url=url, token="t" * 32, interval=0.05, flush_timeout=0.6)
    end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < end:
        i += 1
        run.step(loss=1.0 / i)
        time.sleep(0.005)
    return run.finish()


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


@pytest.mark.slow  # waits out real retry backoffs (3.5 s)
@pytest.mark.parametrize("where", ["answers 500", "nothing listening"])
def test_a_reporter_that_never_gets_through_warns_once_then_sums_up(
    where: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPWATCH_WARN_AFTER", "0.5")
    caplog.set_level(logging.INFO, logger="stepwatch")
    with ReportSink() as sink:
        if where == "answers 500":
            sink.fail(500, times=10_000, body=b"database is locked")
            url = sink.url
        else:
            url = f"http://127.0.0.1:{_free_port()}"
        assert _train(url, 2.5) is False
    silent = _lines(caplog, "was accepted for")
    assert len(silent) == 1, silent
    assert url in silent[0] and "training goes on" in silent[0]
    summary = _lines(caplog, "not everything reached")
    assert len(summary) == 1, summary
    assert "0 report(s) accepted" in summary[0] and "the final report not delivered" in summary[0]
    assert ("500" in summary[0]) if where == "answers 500" else ("unreachable" in summary[0])
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) <= 3  # bounded, not one per retry


def test_a_reporter_that_gets_through_says_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPWATCH_WARN_AFTER", "0.5")
    caplog.set_level(logging.INFO, logger="stepwatch")
    with ReportSink() as sink:
        assert _train(sink.url, 1.0) is True
    assert not _lines(caplog, "was accepted for") and not _lines(caplog, "not everything reached")


@pytest.mark.slow  # waits out real retry backoffs (3.5 s)
def test_a_server_that_stops_answering_midway_is_told_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPWATCH_WARN_AFTER", "0.5")
    caplog.set_level(logging.INFO, logger="stepwatch")
    with ReportSink() as sink:
        run = stepwatch.init(job="midway", url=sink.url, token="t" * 32, interval=0.05, flush_timeout=0.6)
        assert sink.wait_for(lambda s: len(s.reports) >= 1, 10)
        sink.fail(503, times=10_000)
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            run.step(loss=1.0)
            time.sleep(0.005)
        assert run.finish() is False
    (silent,) = _lines(caplog, "was accepted for")
    (summary,) = _lines(caplog, "not everything reached")
    assert "503" in silent and "503" in summary and "report(s) accepted" in summary
