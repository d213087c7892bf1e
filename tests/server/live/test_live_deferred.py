"""A job update nobody reads when it is published is written only if a resume reads it (issue 31: with
nobody following a job, its view and the view's text were most of publishing each of its reports), and
then it is the very text that writing it at once gives."""

from __future__ import annotations

import asyncio
from typing import Any

from stepwatch.protocol import MetricWindow
from stepwatch.server.live.broadcaster import Broadcaster
from stepwatch.server.live.publish import publish_job, publish_points
from stepwatch.server.store import Job
from stepwatch.server.views.serialisers import COMPACT_METRICS, job_view

NOW = 1_800_000_000.0


def a_job(i: int, metrics: int = 5) -> Job:
    return Job(
        id=i, namespace="ns", name=f"j{i}", attempt=1, state="running", created_at=NOW - 100, updated_at=NOW - 1,
        started_at=NOW - 90, last_report_at=NOW - 1, step=100 + i, total_steps=1000, eta_seconds=50.0, eta_rate=2.0,
        eta_at=NOW - 2, last_metrics={f"m{k}": k + 0.5 for k in range(metrics)},
    )  # fmt: skip


def counted(calls: list[int]) -> Any:
    """``job_view`` counting its calls (as ``publish`` imports it)."""

    def view(job: Job, now: float, compact: bool = False) -> dict[str, Any]:
        calls.append(job.id)
        return job_view(job, now, compact)

    return view


def resume(live: Broadcaster, last_event_id: int, n: int) -> list[str]:
    async def read() -> list[str]:
        stream = live.stream(last_event_id=last_event_id)
        messages = [await stream.__anext__() for _ in range(n + 1)]
        await stream.aclose()
        return messages[1:]

    return asyncio.run(read())


def test_an_unread_job_update_is_not_built_and_a_resume_reads_what_publishing_at_once_wrote(monkeypatch: Any) -> None:
    calls: list[int] = []
    monkeypatch.setattr("stepwatch.server.live.publish.job_view", counted(calls))
    deferred, at_once = Broadcaster(first_id=1), Broadcaster(first_id=1)
    at_once.relays.append(lambda update: None)  # a relay reads every update: written at once
    for i in range(1, 4):
        publish_job(deferred, a_job(i), NOW + i)
        publish_job(at_once, a_job(i), NOW + i)
    assert calls == [1, 2, 3]  # the relayed ones only
    assert resume(deferred, 1, 2) == resume(at_once, 1, 2)  # ids 2 and 3, built now, as written then
    assert calls == [1, 2, 3, 2, 3]
    assert resume(deferred, 1, 2) == resume(at_once, 1, 2)
    assert calls == [1, 2, 3, 2, 3]  # written once


def test_a_subscriber_that_wants_the_job_gets_it_at_once_and_others_do_not_cost_it(monkeypatch: Any) -> None:
    calls: list[int] = []
    monkeypatch.setattr("stepwatch.server.live.publish.job_view", counted(calls))

    async def scenario() -> str:
        live = Broadcaster(first_id=1)
        stream = live.stream(namespace="ns", name="j2")
        assert await stream.__anext__() == "retry: 2000\n\n"
        publish_job(live, a_job(1), NOW)  # not followed
        publish_job(live, a_job(2), NOW)
        text = await stream.__anext__()
        await stream.aclose()
        return text

    text = asyncio.run(scenario())
    assert calls == [2]
    assert text.startswith("id: 2\nevent: job\n") and '"name":"j2"' in text


def test_the_ring_counts_a_deferred_update_by_what_it_holds_and_a_wide_job_is_written_at_once(
    monkeypatch: Any,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr("stepwatch.server.live.publish.job_view", counted(calls))
    live = Broadcaster(first_id=1, ring_bytes=64 * 1024)
    for i in range(1, 201):
        publish_job(live, a_job(i), NOW)
    count, size = live.ring_size
    assert size <= 64 * 1024 and 20 <= count <= 30  # ~3.2 KB each (5 metrics): the bytes bound them
    assert calls == []
    publish_job(live, a_job(500, metrics=COMPACT_METRICS + 1), NOW)
    assert calls == [500]


def test_points_nobody_reads_are_written_only_for_a_resume_and_as_at_once() -> None:
    windows = [
        MetricWindow(name="loss", last=2.5, min=2.0, max=3.0, mean=2.4, count=20, nonfinite=1, first_step=1,
                     last_step=20),
        MetricWindow(name="lr", last=3e-4, min=3e-4, max=3e-4, mean=3e-4, count=1, nonfinite=0, first_step=20,
                     last_step=20),
    ]  # fmt: skip
    deferred, at_once = Broadcaster(first_id=1), Broadcaster(first_id=1)
    at_once.relays.append(lambda update: None)
    for live in (deferred, at_once):
        publish_job(live, a_job(1), NOW)
        publish_points(live, a_job(1), windows, NOW)
    windows.clear()  # the caller's list changes after publishing: what was published does not
    texts = resume(deferred, 1, 1)  # the points, id 2
    assert texts == resume(at_once, 1, 1)
    assert texts[0].startswith("id: 2\nevent: points\n") and '"loss":' in texts[0] and '"lr":' in texts[0]
