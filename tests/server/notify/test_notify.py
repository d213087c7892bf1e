"""Notifications: signed webhooks to a real HTTP receiver on 127.0.0.1, Apprise's ``json://`` to the same
receiver, retries, de-duplication, bounded queues, a ``notify()`` that never waits, and a draining shutdown.

The receiver is a real ``http.server`` in a thread that answers from a script (status, headers, a hold)
and records what arrived. The clock is faked only where a test is about time windows (de-duplication,
rate), with a ``sleep`` that moves the same clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from stepwatch.server import notify as notify_module
from stepwatch.server.notify import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    Notification,
    Notifier,
    NotifyTarget,
    RetryPolicy,
    check_target,
    parse_targets,
    signature_header,
    verify_signature,
)
from stepwatch.server.notify._delivery import retry_after
from stepwatch.testing.webhooks import WebhookReceived, WebhookReceiver, WebhookReply

FAST = RetryPolicy(attempts=8, backoff_s=0.02, max_backoff_s=0.1, timeout_s=5.0, apprise_attempts=2)
"""Retries in milliseconds: the tests are about whether and how often, not about production waits."""


# --- a real HTTP receiver ---------------------------------------------------------------------------------


Received = WebhookReceived
Reply = WebhookReply
Receiver = WebhookReceiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Clock:
    """A fake Unix clock, and a ``sleep`` that moves it (waits become instant and exact)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def note(key: str = "7:health:stalled", kind: str = "health", **data: Any) -> Notification:
    return Notification(
        kind=kind,  # type: ignore[arg-type]
        namespace="team-a",
        job="llama-ft",
        attempt=2,
        title="team-a/llama-ft is stalled",
        message="No step for 10 minutes while the process lives.",
        key=key,
        data={"state": "running", "health": "stalled", **data},
    )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --- webhooks ------------------------------------------------------------------------------------------------


def test_webhook_arrives_signed_and_verifiable(receiver: Receiver) -> None:
    target = NotifyTarget(receiver.url(), secret="s3cret")

    async def scenario() -> None:
        async with Notifier([target], retry=FAST) as notifier:
            notifier.notify(note(loss=float("nan"), url="http://dash/jobs/team-a/llama-ft"))
            assert await notifier.drain(5)
            assert notifier.stats.delivered == 1

    run(scenario())
    (got,) = receiver.wait_for(1)
    header = got.headers[SIGNATURE_HEADER.lower()]
    assert verify_signature("s3cret", header, got.body)
    assert not verify_signature("wrong", header, got.body)
    assert not verify_signature("s3cret", header, got.body + b" ")
    assert not verify_signature("s3cret", header, got.body, now=time.time() + 301)  # replayed later
    assert got.headers["content-type"] == "application/json"
    assert got.headers[EVENT_HEADER.lower()] == "health"
    body = got.json()
    assert body["id"] == got.headers[DELIVERY_HEADER.lower()]
    assert {k: body[k] for k in ("version", "kind", "namespace", "job", "attempt", "key")} == {
        "version": 1,
        "kind": "health",
        "namespace": "team-a",
        "job": "llama-ft",
        "attempt": 2,
        "key": "7:health:stalled",
    }
    assert body["data"] == {
        "state": "running",
        "health": "stalled",
        "loss": "NaN",  # the protocol's spelling: the body stays standard JSON
        "url": "http://dash/jobs/team-a/llama-ft",
    }
    assert body["time"].endswith("Z")


def test_webhook_without_a_secret_is_unsigned(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        with caplog.at_level(logging.WARNING, "stepwatch.server.notify"):
            notifier = Notifier([NotifyTarget(receiver.url())], retry=FAST)
        async with notifier:
            notifier.notify(note())

    run(scenario())
    (got,) = receiver.wait_for(1)
    assert SIGNATURE_HEADER.lower() not in got.headers
    assert "is not signed" in caplog.text


def test_receiver_down_then_up_is_delivered_after_retries() -> None:
    port = free_port()
    late: list[Receiver] = []

    async def scenario() -> Notifier:
        async with Notifier([NotifyTarget(f"http://127.0.0.1:{port}/hook", "k")], retry=FAST) as notifier:
            notifier.notify(note())
            await asyncio.sleep(0.15)  # a few connection refusals
            assert notifier.stats.delivered == 0
            late.append(Receiver(port))
            assert await notifier.drain(5)
            return notifier

    try:
        notifier = run(scenario())
        assert len(late[0].wait_for(1)) == 1
    finally:
        for r in late:
            r.close()
    stats = notifier.stats
    assert (stats.delivered, stats.failed) == (1, 0)
    assert stats.retried >= 1


def test_a_500_is_retried_with_the_same_delivery_id(receiver: Receiver) -> None:
    receiver.script.extend([Reply(500), Reply(503), Reply(200)])

    async def scenario() -> Notifier:
        async with Notifier([NotifyTarget(receiver.url(), "k")], retry=FAST) as notifier:
            notifier.notify(note())
            assert await notifier.drain(5)
            return notifier

    notifier = run(scenario())
    got = receiver.wait_for(3)
    assert len(got) == 3
    assert len({r.headers[DELIVERY_HEADER.lower()] for r in got}) == 1
    assert all(verify_signature("k", r.headers[SIGNATURE_HEADER.lower()], r.body) for r in got)
    assert (notifier.stats.delivered, notifier.stats.retried, notifier.stats.failed) == (1, 2, 0)


def test_a_400_is_not_retried_and_is_logged_without_credentials(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.script.append(Reply(400))
    url = receiver.url("/hook?token=do-not-log")

    async def scenario() -> Notifier:
        async with Notifier([NotifyTarget(url, "k")], retry=FAST) as notifier:
            notifier.notify(note())
            assert await notifier.drain(5)
            return notifier

    with caplog.at_level(logging.WARNING, "stepwatch.server.notify"):
        notifier = run(scenario())
    time.sleep(0.1)  # a retry, were there one, would have arrived
    assert len(receiver.requests) == 1
    assert (notifier.stats.delivered, notifier.stats.failed, notifier.stats.retried) == (0, 1, 0)
    assert "failed after 1 attempt(s): HTTP 400" in caplog.text
    assert "do-not-log" not in caplog.text


def test_429_waits_as_long_as_retry_after_says(receiver: Receiver) -> None:
    receiver.script.extend([Reply(429, {"Retry-After": "1"}), Reply(200)])

    async def scenario() -> None:
        async with Notifier([NotifyTarget(receiver.url())], retry=FAST) as notifier:
            notifier.notify(note())
            assert await notifier.drain(5)
            assert notifier.stats.delivered == 1

    run(scenario())
    first, second = receiver.wait_for(2)
    # the backoff alone would have waited at most 0.02 s
    assert second.at - first.at >= 0.9


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = 1_800_000_000.0
    assert retry_after("7", now) == 7.0
    assert retry_after(" 2.5 ", now) == 2.5
    assert retry_after("-3", now) == 0.0
    assert retry_after("Fri, 15 Jan 2027 08:00:30 GMT", now) == pytest.approx(30.0)
    assert retry_after("soon", now) is None
    assert retry_after(None, now) is None


def test_failures_are_logged_at_most_once_a_minute_per_target(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.default = Reply(404)
    clock = Clock()

    async def scenario() -> None:
        target = NotifyTarget(receiver.url(), "k")
        async with Notifier([target], retry=FAST, clock=clock, sleep=clock.sleep) as notifier:
            for i in range(5):
                notifier.notify(note(key=f"k{i}"))
            assert await notifier.drain(5)
            clock.now += 61
            notifier.notify(note(key="later"))
            assert await notifier.drain(5)
            assert notifier.stats.failed == 6

    with caplog.at_level(logging.WARNING, "stepwatch.server.notify"):
        run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "4 more failed since the last warning" in warnings[1]


# --- never a flood, never in the way ---------------------------------------------------------------------


def test_a_flood_of_one_state_change_is_one_message(receiver: Receiver) -> None:
    clock = Clock()

    async def scenario() -> Notifier:
        async with Notifier(
            [NotifyTarget(receiver.url())], retry=FAST, clock=clock, sleep=clock.sleep, dedup_window_s=600
        ) as notifier:
            for _ in range(1000):
                notifier.notify(note())
            assert await notifier.drain(5)
            clock.now += 599
            notifier.notify(note())  # still the same change
            assert await notifier.drain(5)
            clock.now += 2
            notifier.notify(note())  # the window is over: it may be said again
            assert await notifier.drain(5)
            return notifier

    notifier = run(scenario())
    assert len(receiver.wait_for(2)) == 2
    assert (notifier.stats.delivered, notifier.stats.deduplicated) == (2, 1000)


def test_the_same_key_goes_once_to_each_target(receiver: Receiver) -> None:
    a, b = NotifyTarget(receiver.url("/a")), NotifyTarget(receiver.url("/b"))

    async def scenario() -> None:
        async with Notifier([a], retry=FAST) as notifier:
            for _ in range(10):
                notifier.notify(note())
                notifier.notify(note(), [a, b])  # a policy's own targets, beside the defaults
            assert await notifier.drain(5)
            assert set(notifier.stats_by_target()) == {a.redacted, b.redacted}

    run(scenario())
    time.sleep(0.05)
    assert sorted(r.path for r in receiver.requests) == ["/a", "/b"]


def test_a_rate_limit_per_target_spaces_distinct_messages(receiver: Receiver) -> None:
    clock = Clock()

    async def scenario() -> None:
        async with Notifier(
            [NotifyTarget(receiver.url())], retry=FAST, clock=clock, sleep=clock.sleep, per_minute=60, burst=2
        ) as notifier:
            for i in range(5):
                notifier.notify(note(key=f"job{i}:failed"))
            assert await notifier.drain(5)
            assert notifier.stats.delivered == 5

    start = clock.now
    run(scenario())
    # two at once (the burst), then one a second
    assert clock.now - start == pytest.approx(3.0, abs=0.01)
    assert len(receiver.requests) == 5


def test_a_full_queue_drops_the_oldest_and_counts_it(receiver: Receiver) -> None:
    async def scenario() -> Notifier:
        notifier = Notifier([NotifyTarget(receiver.url())], retry=FAST, queue_size=3)
        for i in range(5):  # not started yet: everything waits in the queue
            notifier.notify(note(key=f"k{i}"))
        assert (notifier.stats.dropped, notifier.stats.pending) == (2, 3)
        async with notifier:
            assert await notifier.drain(5)
        return notifier

    notifier = run(scenario())
    assert [r.json()["key"] for r in receiver.wait_for(3)] == ["k2", "k3", "k4"]
    assert (notifier.stats.delivered, notifier.stats.dropped) == (3, 2)


@pytest.mark.perf
def test_notify_returns_at_once_while_the_receiver_hangs(receiver: Receiver) -> None:
    """``notify()`` while a delivery hangs costs what it costs with no delivery at all, and a tiny
    fraction of the time the hanging delivery takes (ratios measured in this run, no absolute time)."""
    release = threading.Event()
    receiver.script.append(Reply(hold=release))
    calls = 2000

    def per_call(notifier: Notifier, prefix: str) -> float:
        times = []
        for i in range(calls):
            n = note(key=f"{prefix}{i}")
            t0 = time.perf_counter()
            notifier.notify(n)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    async def scenario() -> tuple[float, float, float]:
        idle = Notifier([NotifyTarget(receiver.url())], queue_size=calls)
        baseline = per_call(idle, "idle")  # no worker: the enqueue alone
        async with Notifier([NotifyTarget(receiver.url())], retry=FAST, queue_size=calls) as notifier:
            notifier.notify(note(key="first"))
            while len(receiver.requests) < 1:  # the worker is now inside the hanging request
                await asyncio.sleep(0.005)
            hang_start = time.perf_counter()
            busy = per_call(notifier, "busy")
            await asyncio.sleep(0.3)
            release.set()
            while notifier.stats.delivered < 1:
                await asyncio.sleep(0.005)
            hang = time.perf_counter() - hang_start
            await notifier.aclose(timeout_s=0)  # the 2,000 queued ones are not the point
        return baseline, busy, hang

    baseline, busy, hang = run(scenario())
    assert busy < 5 * baseline, (busy, baseline)
    assert busy < hang / 10_000, (busy, hang)


def test_notify_from_another_thread_is_handed_to_the_loop(receiver: Receiver) -> None:
    async def scenario() -> None:
        async with Notifier([NotifyTarget(receiver.url())], retry=FAST) as notifier:
            thread = threading.Thread(target=notifier.notify, args=(note(key="from-a-thread"),))
            thread.start()
            await asyncio.to_thread(thread.join)
            await asyncio.sleep(0.01)
            assert await notifier.drain(5)
            assert notifier.stats.delivered == 1

    run(scenario())
    assert receiver.wait_for(1)[0].json()["key"] == "from-a-thread"


def test_shutdown_drains_what_is_queued(receiver: Receiver) -> None:
    receiver.default = Reply(delay_s=0.02)

    async def scenario() -> Notifier:
        notifier = Notifier([NotifyTarget(receiver.url())], retry=FAST)
        await notifier.start()
        for i in range(5):
            notifier.notify(note(key=f"k{i}"))
        await notifier.aclose(timeout_s=60)
        notifier.notify(note(key="after"))  # refused and counted, not raised
        return notifier

    notifier = run(scenario())
    # drained, not given up: every queued note delivered and none pending when aclose returned (an event; a
    # shutdown that gave up would leave some pending, see the next test)
    assert len(receiver.requests) == 5
    assert (notifier.stats.delivered, notifier.stats.dropped, notifier.stats.pending) == (5, 1, 0)


def test_shutdown_gives_up_after_its_timeout(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    """The receiver holds every request until ``release`` (or for its own 10 s); each request may take a
    minute. A shutdown that waited for the deliveries would see them delivered once the receiver let go;
    one that gives up after its 0.3 s leaves all three undelivered (an event, not a measure of time)."""
    release = threading.Event()
    receiver.default = Reply(hold=release)
    patient = dataclasses.replace(FAST, timeout_s=60.0)  # longer than any hold: only the shutdown can give up

    async def scenario() -> tuple[Notifier, float]:
        notifier = Notifier([NotifyTarget(receiver.url())], retry=patient)
        await notifier.start()
        for i in range(3):
            notifier.notify(note(key=f"k{i}"))
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        await notifier.aclose(timeout_s=0.3)
        return notifier, time.monotonic() - t0

    try:
        with caplog.at_level(logging.WARNING, "stepwatch.server.notify"):
            notifier, took = run(scenario())
    finally:
        release.set()
    # it gave up with every delivery still held by the receiver (none was delivered), after its 0.3 s
    assert (notifier.stats.delivered, notifier.stats.dropped, notifier.stats.pending) == (0, 3, 0)
    assert took >= 0.3, took  # a lower bound: a timer never fires early
    assert "3 notification(s) not sent" in caplog.text


def test_the_transport_is_a_seam() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    async def scenario() -> None:
        async with Notifier(
            [NotifyTarget("https://hooks.example.com/x", "k")], transport=httpx.MockTransport(handler)
        ) as notifier:
            notifier.notify(note())
            assert await notifier.drain(5)

    run(scenario())
    (request,) = seen
    assert request.url == "https://hooks.example.com/x"
    assert verify_signature("k", request.headers[SIGNATURE_HEADER], request.content)


# --- signatures ----------------------------------------------------------------------------------------------


def test_verify_signature_rejects_what_it_should() -> None:
    body = b'{"kind":"failed"}'
    now = 1_800_000_000
    good = signature_header("s", now, body)
    assert verify_signature("s", good, body, now=now)
    assert verify_signature(b"s", good, body.decode(), now=now + 300)
    assert not verify_signature("s", good, body, now=now + 301)
    assert not verify_signature("s", good, body, now=now - 301)
    for bad in ("", None, "garbage", "t=abc,v1=00", f"t={now}", good.replace("v1=", "v0="), "t=1,v1=é"):
        assert not verify_signature("s", bad, body, now=now)
    assert not verify_signature("", good, body, now=now)
    # during a secret rotation a sender may sign with both: either secret verifies
    rotating = f"{good},v1={signature_header('new', now, body).split('v1=')[1]}"
    assert verify_signature("s", rotating, body, now=now)
    assert verify_signature("new", rotating, body, now=now)


# --- configuration -------------------------------------------------------------------------------------------


def test_parse_targets() -> None:
    text = (
        "https://hooks.example.com/stepwatch?x=1, slack://TokenA/TokenB/TokenC\n"
        " mailto://user:pass@example.com?to=a@example.com,b@example.com , http://10.0.0.5:9000/h,"
        "https://hooks.example.com/stepwatch?x=1"
    )
    targets = parse_targets(text, secret="s3cret")
    assert [t.url for t in targets] == [
        "https://hooks.example.com/stepwatch?x=1",
        "slack://TokenA/TokenB/TokenC",
        "mailto://user:pass@example.com?to=a@example.com,b@example.com",
        "http://10.0.0.5:9000/h",
    ]
    assert [t.is_webhook for t in targets] == [True, False, False, True]
    assert [t.secret for t in targets] == ["s3cret", None, None, "s3cret"]
    assert parse_targets("") == parse_targets(None) == parse_targets(" , ") == ()
    assert parse_targets("https://h/x", "")[0].secret is None
    with pytest.raises(ValueError, match="with a scheme"):
        parse_targets("hooks.example.com/x")
    with pytest.raises(ValueError, match="needs a host"):
        parse_targets("https:///x")


def test_targets_never_show_their_credentials() -> None:
    webhook = NotifyTarget("https://user:pw@hooks.example.com:8443/h?token=t0k", secret="s3cret")
    chat = NotifyTarget("slack://TokenA/TokenB/TokenC")
    shown = f"{webhook!r} {webhook} {chat!r} {[webhook, chat]}"
    for secret in ("pw", "t0k", "s3cret", "TokenA"):
        assert secret not in shown
    assert webhook.redacted == "https://hooks.example.com:8443/h"
    assert chat.redacted == "slack://…"


def test_notifications_are_validated_at_creation() -> None:
    with pytest.raises(ValueError, match="kind is one of"):
        note(kind="exploded")
    with pytest.raises(ValueError, match="non-empty key"):
        Notification(kind="failed", namespace="a", job="b", title="t", message="m", key="")
    with pytest.raises(ValueError, match="attempt"):
        Notification(kind="failed", namespace="a", job="b", title="t", message="m", key="k", attempt=-1)
    assert note().url is None
    assert note(url="http://d/j").url == "http://d/j"


def test_the_public_surface_is_sorted_and_complete() -> None:
    names = notify_module.__all__
    # ruff's order (RUF022): CONSTANTS, then Classes, then functions
    assert names == sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    # (pytest rewrites the asserts of a package with a pytest11 plugin, stepwatch's: its helpers start with @)
    assert set(names) == {n for n in vars(notify_module) if not n.startswith(("_", "@"))}
    for name in names:
        value = getattr(notify_module, name)
        assert isinstance(value, (str, tuple)) or value.__doc__, f"{name} has no docstring"


# --- Apprise -------------------------------------------------------------------------------------------------

# Apprise 2.x imports the standard library's deprecated imghdr; not ours to fix
apprise_warnings = pytest.mark.filterwarnings("ignore:'imghdr' is deprecated:DeprecationWarning")


@apprise_warnings
def test_a_missing_apprise_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "apprise", None)  # what `import apprise` meets without the package
    with pytest.raises(ImportError, match=r"pip install 'stepwatch\[notify\]'"):
        Notifier([NotifyTarget("slack://TokenA/TokenB/TokenC")])
    check_target(NotifyTarget("https://hooks.example.com/x"))  # webhooks need nothing more


@apprise_warnings
def test_a_missing_apprise_at_delivery_is_a_logged_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "apprise", None)

    async def scenario() -> Notifier:
        async with Notifier(retry=FAST) as notifier:
            notifier.notify(note(), [NotifyTarget("slack://TokenA/TokenB/TokenC")])
            assert await notifier.drain(5)
            return notifier

    with caplog.at_level(logging.WARNING, "stepwatch.server.notify"):
        notifier = run(scenario())
    assert notifier.stats.failed == 1
    assert "pip install 'stepwatch[notify]'" in caplog.text


@apprise_warnings
def test_apprise_delivers_to_a_real_receiver(receiver: Receiver) -> None:
    pytest.importorskip("apprise", reason="Apprise is not installed (pip install 'stepwatch[notify]')")
    target = NotifyTarget(f"json://127.0.0.1:{receiver.port}/apprise")

    async def scenario() -> Notifier:
        async with Notifier([target], retry=FAST) as notifier:
            notifier.notify(note(kind="failed", key="7:failed:failed", url="http://dash/jobs/team-a/llama-ft"))
            assert await notifier.drain(10)
            return notifier

    notifier = run(scenario())
    (got,) = receiver.wait_for(1)
    assert got.path == "/apprise"
    body = got.json()
    assert body["title"] == "team-a/llama-ft is stalled"
    assert body["message"] == "No step for 10 minutes while the process lives.\nhttp://dash/jobs/team-a/llama-ft"
    assert body["type"] == "failure"
    assert notifier.stats.delivered == 1


@apprise_warnings
def test_apprise_failures_are_retried_then_counted(receiver: Receiver) -> None:
    pytest.importorskip("apprise", reason="Apprise is not installed (pip install 'stepwatch[notify]')")
    receiver.default = Reply(500)

    async def scenario() -> Notifier:
        async with Notifier([NotifyTarget(f"json://127.0.0.1:{receiver.port}/")], retry=FAST) as notifier:
            notifier.notify(note())
            assert await notifier.drain(10)
            return notifier

    notifier = run(scenario())
    assert len(receiver.wait_for(2)) == 2  # FAST.apprise_attempts
    assert (notifier.stats.delivered, notifier.stats.failed, notifier.stats.retried) == (0, 1, 1)


@apprise_warnings
def test_an_unknown_apprise_url_fails_at_start_up() -> None:
    pytest.importorskip("apprise", reason="Apprise is not installed (pip install 'stepwatch[notify]')")
    with pytest.raises(ValueError, match="Apprise does not understand"):
        Notifier([NotifyTarget("nosuchservice://x/y")])
