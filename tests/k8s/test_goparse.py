"""Go's ``time.ParseDuration`` and ``strconv.Atoi`` as ported for the poll interval (``goparse.py``), and
``GetMetricsPollInterval`` built on them, held to Go itself where ``go`` is installed (CI installs
Debian's ``golang-go``): ``tests/go/duration/main.go`` runs Go's own functions on every text below, and
the interval of ``GetMetricsPollInterval`` (pkg/rhai/progression/progression.go at
c0df7487865d6e2ab90b14982ec7ae69ead41d30) follows from their answers.
"""

from __future__ import annotations

import pytest

from gohelp import needs_go, run_go
from stepwatch.protocol.progression import ANNOTATION_POLL_INTERVAL
from stepwatch.server.runners.kubernetes.goparse import GoSyntaxError, atoi, parse_duration, seconds_duration
from stepwatch.server.runners.kubernetes.progression import poll_interval

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "nanoseconds"),
    [
        ("0", 0),
        ("+0", 0),
        ("-0", 0),
        ("5s", 5 * S),
        ("30s", 30 * S),
        ("1m", 60 * S),
        ("1.5h", 5400 * S),
        ("2h45m", 9900 * S),
        ("-1.5h", -5400 * S),
        ("300ms", 300_000_000),
        ("1µs", 1_000),  # U+00B5
        ("1μs", 1_000),  # U+03BC
        ("1us", 1_000),
        (".5s", S // 2),
        ("5.s", 5 * S),
        ("1h1m1s1ms1us1ns", 3661 * S + 1_001_001),
        ("9223372036854775807ns", 2**63 - 1),
        ("-9223372036854775808ns", -(2**63)),
        ("0.3333333333333333333h", 1_200_000_000_000),
    ],
)
def test_parse_duration(text: str, nanoseconds: int) -> None:
    """Go's own test table (src/time/time_test.go parseDurationTests), the cases that bear on the interval."""
    assert parse_duration(text) == nanoseconds


@pytest.mark.parametrize(
    "text",
    ["", "3", "-", "s", ".", "-.", ".s", "+.s", "1d", "1.5", "1 s", " 1s", "1s ", "9223372036854775808ns", "3000000h"],
)
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(GoSyntaxError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "value"), [("45", 45), ("+45", 45), ("-5", -5), ("0", 0), ("9223372036854775807", 2**63 - 1)]
)
def test_atoi(text: str, value: int) -> None:
    assert atoi(text) == value


@pytest.mark.parametrize("text", ["", "+", "4 5", " 45", "45s", "1_000", "٤٥", "9223372036854775808", "0x10"])
def test_atoi_refuses(text: str) -> None:
    with pytest.raises(GoSyntaxError):
        atoi(text)


def test_seconds_wrap_around_as_int64() -> None:
    """``time.Duration(seconds) * time.Second`` overflows int64 for more than ~292 years' worth of seconds."""
    assert seconds_duration(45) == 45 * S
    assert seconds_duration(10_000_000_000) < 0  # Go wraps; the controller then clamps it to 5 s


@pytest.mark.parametrize(
    ("name", "interval", "seconds"),
    [
        ("duration format seconds", "30s", 30),
        ("duration format minutes", "1m", 60),
        ("integer format", "45", 45),
        ("below minimum clamped to 5s", "3s", 5),
        ("above maximum clamped to 300s", "600s", 300),
        ("invalid format uses default", "invalid", 30),
        ("missing annotation uses default", "", 30),
    ],
)
def test_get_metrics_poll_interval(name: str, interval: str, seconds: float) -> None:
    """progression_test.go TestGetMetricsPollInterval, every case (``name``)."""
    assert poll_interval({ANNOTATION_POLL_INTERVAL: interval}) == seconds


def test_get_metrics_poll_interval_nil_annotations() -> None:
    """progression_test.go TestGetMetricsPollInterval "nil annotations uses default"."""
    assert poll_interval({}) == 30


@pytest.mark.parametrize(
    ("interval", "seconds"),
    [("2m30s", 150), ("4.5s", 5), ("7.5s", 7.5), ("-10s", 5), ("0", 5), ("-45", 5), ("10000000000", 5), ("1h", 300)],
)
def test_poll_interval_edges(interval: str, seconds: float) -> None:
    """Beyond upstream's table: fractions stay, negatives and Go's int64 wrap-around clamp to 5 s."""
    assert poll_interval({ANNOTATION_POLL_INTERVAL: interval}) == seconds


CORPUS = [
    *["0", "+0", "-0", "5s", "30s", "1m", "1.5h", "2h45m", "-1.5h", "300ms", "1µs", "1μs", "1us", ".5s", "5.s"],
    *["1h1m1s1ms1us1ns", "9223372036854775807ns", "-9223372036854775808ns", "9223372036854775808ns", "3000000h"],
    *["0.3333333333333333333h", "1.00000000000000000000000000000001s", "0.000000000000000000001h", "2562047h"],
    *["2562048h", "2562047h47m16.854775807s", "2562047h47m16.854775808s", "1.5µ", "1.5μ", "1\u00b5\u00b5s"],
    *["", "3", "-", "s", ".", "-.", ".s", "+.s", "1d", "1.5", "1 s", " 1s", "1s ", "1ss", "1S", "1sec", "١s"],
    *["45", "+45", "-5", "-45", "0", "007", "9223372036854775807", "9223372036854775808", "10000000000", "0x10"],
    *["1_000", "٤٥", "4 5", "invalid", "30", "300", "301", "4", "5", "299.9s", "5m0.000000001s", "-0s", "+5m"],
]


@needs_go
def test_port_agrees_with_go() -> None:
    """Every text of the corpus: Go's ParseDuration and Atoi exactly, and the controller's interval as its
    rule reads on Go's own answers (ParseDuration, else whole seconds by Atoi, else 30 s; 5..300 s)."""
    disagreements = []
    for text, go in zip(CORPUS, run_go("duration", CORPUS)):
        if go["atoiError"]:
            go["atoi"] = 0  # (Go returns the nearest int64 with a range error; no value is used then)
        try:
            ours_d, ours_de = parse_duration(text), False
        except GoSyntaxError:
            ours_d, ours_de = 0, True
        try:
            ours_a, ours_ae = atoi(text), False
        except GoSyntaxError:
            ours_a, ours_ae = 0, True
        ours = {"duration": ours_d, "durationError": ours_de, "atoi": ours_a, "atoiError": ours_ae}
        if ours != go:
            disagreements.append((text, ours, go))
        if text == "":
            expected = 30 * S
        elif not go["durationError"]:
            expected = go["duration"]
        elif not go["atoiError"]:
            expected = (go["atoi"] * S + 2**63) % 2**64 - 2**63  # Duration(n) * Second wraps as int64 does
        else:
            expected = 30 * S
        interval = round(poll_interval({ANNOTATION_POLL_INTERVAL: text}) * S)
        if interval != min(max(expected, 5 * S), 300 * S):
            disagreements.append((text, interval, expected))
    assert not disagreements
