"""The one retry helper in ``stepwatch.protocol``: ``Backoff`` and ``parse_retry_after``.

The report core's sender, the SDK's ``Retry`` and the notifier's ``RetryPolicy`` all wait through
these; their own tests (test_sender.py, tests/client/, tests/server/notify/test_notify.py) check the policies.
"""

from __future__ import annotations

import email.utils
import itertools
import math
import random
from collections.abc import Callable

import pytest

from stepwatch.protocol import Backoff, parse_retry_after

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def _fixed(value: float) -> Callable[[], float]:
    return lambda: value


# -------------------------------------------------------------------------------------- Retry-After


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("7", 7.0),
        ("0", 0.0),
        (" 2.5 ", 2.5),  # a fraction is read, surrounding space ignored
        ("+3", 3.0),
        ("-3", 0.0),  # never a negative wait
        ("120", 120.0),
        ("1" + "0" * 400, 86_400.0),  # a number past any float: clamped to the cap, not infinite
    ],
)
def test_delta_seconds(header: str, seconds: float) -> None:
    assert parse_retry_after(header, now=NOW) == seconds


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("Fri, 15 Jan 2027 08:00:30 GMT", 30.0),  # IMF-fixdate, the form servers send
        ("Friday, 15-Jan-27 08:01:00 GMT", 60.0),  # RFC 850, obsolete but to be read
        ("Fri Jan 15 08:00:45 2027", 45.0),  # asctime, obsolete too: no zone written, GMT as every HTTP-date
        ("Fri, 15 Jan 2027 09:00:30 +0100", 30.0),  # a numeric zone is the same instant
        ("Fri, 15 Jan 2027 07:59:00 GMT", 0.0),  # already past: go now
        ("Fri, 15 Jan 2027 08:00:30 UTC", 30.0),
    ],
)
def test_http_dates_count_from_now(header: str, seconds: float | None) -> None:
    found = parse_retry_after(header, now=NOW)
    assert found == (pytest.approx(seconds) if seconds is not None else None)


def test_an_http_date_counts_from_the_wall_clock_by_default() -> None:
    import time

    header = email.utils.formatdate(time.time() + 20, usegmt=True)
    found = parse_retry_after(header)
    assert found is not None and 18 <= found <= 20


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "   ",
        "soon",
        "NaN",
        "nan",
        "inf",
        "-Infinity",
        "1e3",  # delta-seconds are digits
        "1_000",  # what float() would take, a header does not
        "0x10",
        "12 seconds",
        "3,5",
        "Fri, 32 Jan 2027 08:00:30 GMT",  # no such day
        "Fri, 15 Foo 2027 08:00:30 GMT",
        "Fri, 15 Jan 99999999999 08:00:30 GMT",
        "\x00\x01",
        "Fri, 15 Jan 2027 08:00:30 GMT; extra",  # the e-mail parser would read it without a zone
        "Fri, 15 Jan 2027 08:00:30 XYZ",
        "Fri, 15 Jan 2027 08:00:30",
    ],
)
def test_garbage_is_ignored(header: str | None) -> None:
    assert parse_retry_after(header, now=NOW) is None


def test_every_value_is_clamped_to_the_cap() -> None:
    assert parse_retry_after("7200", cap=600.0) == 600.0
    assert parse_retry_after("Fri, 15 Jan 2027 10:00:00 GMT", now=NOW, cap=600.0) == 600.0
    assert parse_retry_after("599.5", cap=600.0) == 599.5


def test_random_headers_never_raise_and_stay_in_bounds() -> None:
    rng = random.Random(9110)
    alphabet = "0123456789 .,:+-GMTJanFriSun\t\x00é"
    for _ in range(3000):
        header = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        found = parse_retry_after(header, now=NOW, cap=300.0)
        assert found is None or 0.0 <= found <= 300.0, header


# ------------------------------------------------------------------------------------------ Backoff


def test_no_jitter_doubles_up_to_the_cap() -> None:
    backoff = Backoff(base=1.0, cap=30.0, jitter="none")
    assert [backoff.delay(n) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff.delay(10_000) == 30.0  # no overflow however long it failed
    assert backoff.delay(0) == 1.0  # a count below 1 reads as the first retry


def test_equal_jitter_stays_within_half_and_all_of_the_wait() -> None:
    backoff = Backoff(base=0.25, cap=5.0, jitter="equal")
    assert backoff.delay(1, _fixed(0.0)) == 0.125
    assert backoff.delay(3, _fixed(0.0)) == 0.5
    assert backoff.delay(3, _fixed(1.0)) == 1.0
    assert backoff.delay(20, _fixed(0.5)) == 3.75


def test_full_jitter_spreads_over_the_whole_wait() -> None:
    backoff = Backoff(base=1.0, cap=30.0, jitter="full")
    assert backoff.delay(3, _fixed(0.0)) == 0.0
    assert backoff.delay(3, _fixed(0.5)) == 2.0
    rng = random.Random(1)
    waits = [backoff.delay(6, rng.random) for _ in range(2000)]
    assert 0.0 <= min(waits) < 1.0 and 29.0 < max(waits) <= 30.0
    assert 13.0 < sum(waits) / len(waits) < 17.0  # uniform over [0, 30]


def test_decorrelated_jitter_grows_from_the_previous_wait_and_keeps_to_the_cap() -> None:
    backoff = Backoff(base=1.0, cap=20.0, jitter="decorrelated")
    assert backoff.delay(1, _fixed(0.0)) == 1.0  # never below base
    assert backoff.delay(1, _fixed(1.0)) == 3.0  # the first: up to three times base
    assert backoff.delay(2, _fixed(1.0), previous=3.0) == 9.0
    assert backoff.delay(3, _fixed(1.0), previous=9.0) == 20.0  # 27 capped
    assert backoff.delay(3, _fixed(0.5), previous=0.1) == 2.0  # a previous below base grows from base
    rng = random.Random(2)
    wait = None
    for _ in range(500):
        wait = backoff.delay(1, rng.random, previous=wait)
        assert 1.0 <= wait <= 20.0


def test_the_random_source_is_injected_not_global() -> None:
    backoff = Backoff(base=1.0, cap=60.0, jitter="full")
    first = [backoff.delay(n, random.Random(7).random) for n in range(1, 7)]
    random.seed(12345)  # the module's own generator has no say
    assert [backoff.delay(n, random.Random(7).random) for n in range(1, 7)] == first


@pytest.mark.parametrize("jitter", ["full", "equal", "decorrelated", "none"])
def test_waits_are_never_negative_nor_past_the_cap(jitter: str) -> None:
    backoff = Backoff(base=0.5, cap=7.0, jitter=jitter)  # type: ignore[arg-type]
    rng = random.Random(3)
    previous = None
    for n in itertools.chain(range(1, 70), [10**6]):
        previous = backoff.delay(n, rng.random, previous)
        assert 0.0 <= previous <= 7.0


def test_a_base_above_the_cap_waits_the_cap() -> None:
    assert Backoff(base=10.0, cap=5.0, jitter="none").delay(1) == 5.0
    assert Backoff(base=10.0, cap=5.0, jitter="decorrelated").delay(1, _fixed(0.5)) == 5.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": -1.0, "cap": 5.0},
        {"base": 1.0, "cap": -5.0},
        {"base": 1.0, "cap": math.inf},
        {"base": math.nan, "cap": 5.0},
        {"base": 1.0, "cap": 5.0, "jitter": "random"},
    ],
)
def test_a_policy_that_cannot_work_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)  # type: ignore[arg-type]
