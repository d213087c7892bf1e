"""Group commit: reports that arrive together are written together, and each gets its own answer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from stepwatch.server.ingest.writer import ReportWriter
from stepwatch.server.store import IngestResult, Job, PendingReport, StoreError

JOB = Job(id=1, namespace="ns", name="j", attempt=1, state="running", created_at=0.0, updated_at=0.0)


class Recorder:
    """A store's ``ingest_reports`` that records its batches; ``fail`` makes reports (or the batch) fail."""

    def __init__(self) -> None:
        self.batches: list[list[float]] = []
        self.fail_items: set[float] = set()
        self.fail_batch = False
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError]:
        self.gate.wait(5)
        if self.fail_batch:
            raise StoreError("database is locked")
        self.batches.append([item.now for item in batch])
        return [
            StoreError(f"bad {item.now}") if item.now in self.fail_items else IngestResult(job=JOB, duplicate=False)
            for item in batch
        ]


async def offload(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def item(now: float) -> PendingReport:
    return PendingReport(JOB, None, now)  # type: ignore[arg-type]  # the recorder never reads the report


def test_reports_that_arrive_while_a_batch_is_written_go_together() -> None:
    store = Recorder()

    async def main() -> list[IngestResult]:
        writer = ReportWriter(store, offload)
        store.gate.clear()  # the first batch waits in its thread while 49 more reports arrive
        first = asyncio.ensure_future(writer.write(item(0)))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(writer.write(item(n))) for n in range(1, 50)]
        await asyncio.sleep(0.05)
        store.gate.set()
        return [await first, *await asyncio.gather(*rest)]

    results = asyncio.run(main())
    assert len(results) == 50 and all(not r.duplicate for r in results)
    assert store.batches == [[0.0], [float(n) for n in range(1, 50)]]


def test_a_report_that_fails_fails_alone_and_a_failed_batch_fails_each() -> None:
    store = Recorder()
    store.fail_items = {2.0}

    async def main() -> tuple[list[Any], Any]:
        writer = ReportWriter(store, offload)
        outcomes = await asyncio.gather(*(writer.write(item(n)) for n in range(4)), return_exceptions=True)
        store.fail_batch = True
        failed = await asyncio.gather(writer.write(item(9)), writer.write(item(10)), return_exceptions=True)
        store.fail_batch = False
        after = await writer.write(item(11))  # the writer goes on after a failed batch
        return [*outcomes, *failed], after

    outcomes, after = asyncio.run(main())
    assert [type(o).__name__ for o in outcomes] == ["IngestResult"] * 2 + ["StoreError"] + ["IngestResult"] + [
        "StoreError"
    ] * 2
    assert "database is locked" in str(outcomes[-1]) and isinstance(after, IngestResult)


def test_a_client_that_hangs_up_does_not_cancel_the_batch() -> None:
    store = Recorder()

    async def main() -> IngestResult:
        writer = ReportWriter(store, offload, max_batch=8)
        store.gate.clear()
        gone = asyncio.ensure_future(writer.write(item(0)))
        stays = asyncio.ensure_future(writer.write(item(1)))
        await asyncio.sleep(0.05)
        gone.cancel()
        store.gate.set()
        return await stays

    assert isinstance(asyncio.run(main()), IngestResult)
    assert store.batches == [[0.0, 1.0]]  # the cancelled report was still stored


@pytest.mark.parametrize("max_batch", [1, 3])
def test_batches_are_bounded(max_batch: int) -> None:
    store = Recorder()

    async def main() -> None:
        writer = ReportWriter(store, offload, max_batch=max_batch)
        await asyncio.gather(*(writer.write(item(n)) for n in range(7)))

    asyncio.run(main())
    assert max(len(b) for b in store.batches) <= max_batch
    assert sorted(n for b in store.batches for n in b) == [float(n) for n in range(7)]


class NowOrThread:
    """A store's ``ingest_reports_nowait``: writes at once (recorded) unless ``busy``; then ``None``."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.busy = False
        self.calls = 0

    def __call__(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError] | None:
        self.calls += 1
        if self.busy:
            return None
        return self.recorder(batch)


def test_a_store_that_need_not_wait_is_written_on_the_loop_and_a_busy_one_in_a_thread() -> None:
    store = Recorder()
    now = NowOrThread(store)
    threads: list[str] = []

    async def traced_offload(fn: Callable[..., Any], *args: Any) -> Any:
        threads.append("thread")
        return await offload(fn, *args)

    async def main() -> tuple[ReportWriter, list[IngestResult]]:
        writer = ReportWriter(store, traced_offload, write_now=now)
        first = await asyncio.gather(*(writer.write(item(n)) for n in range(3)))
        now.busy = True  # another thread or process holds the lock: the batch goes to a thread, which waits
        second = await writer.write(item(3))
        return writer, [*first, second]

    writer, results = asyncio.run(main())
    assert len(results) == 4 and all(isinstance(r, IngestResult) for r in results)
    assert store.batches == [[0.0, 1.0, 2.0], [3.0]]
    assert threads == ["thread"]
    assert writer.written_now == 3 and writer.written == 4


def test_a_failure_on_the_loop_fails_each_report_of_its_batch() -> None:
    store = Recorder()
    store.fail_items = {1.0}

    async def main() -> list[Any]:
        writer = ReportWriter(store, offload, write_now=NowOrThread(store))
        outcomes = await asyncio.gather(*(writer.write(item(n)) for n in range(3)), return_exceptions=True)
        store.fail_batch = True
        failed = await asyncio.gather(writer.write(item(7)), writer.write(item(8)), return_exceptions=True)
        store.fail_batch = False
        return [*outcomes, *failed, await writer.write(item(9))]

    outcomes = asyncio.run(main())
    assert [type(o).__name__ for o in outcomes] == [
        "IngestResult",
        "StoreError",
        "IngestResult",
        "StoreError",
        "StoreError",
        "IngestResult",
    ]


def test_a_batch_written_on_the_loop_needs_no_task_and_a_busy_store_hands_the_rest_to_one() -> None:
    """A fleet's reports come one at a time: each is a batch of its own, written by a callback of the loop
    (a task made and stepped twice for it cost 8 us a report, the callback 1); once the store would wait,
    that batch and those queued behind it go to a task, which writes them in a thread, in order."""
    store = Recorder()
    now = NowOrThread(store)
    tasks: list[bool] = []

    def write_now(batch: Sequence[PendingReport]) -> list[IngestResult | StoreError] | None:
        tasks.append(asyncio.current_task() is not None)
        return now(batch)

    async def main() -> ReportWriter:
        writer = ReportWriter(store, offload, write_now=write_now)
        for n in range(3):
            await writer.write(item(n))
        now.busy = True
        store.gate.clear()  # the thread's batch waits while two more reports queue behind it
        first = asyncio.ensure_future(writer.write(item(3)))
        await asyncio.sleep(0.05)
        rest = asyncio.gather(writer.write(item(4)), writer.write(item(5)))
        await asyncio.sleep(0.05)
        now.busy = False
        store.gate.set()
        await first
        await rest
        await writer.write(item(6))
        return writer

    writer = asyncio.run(main())
    assert store.batches == [[0.0], [1.0], [2.0], [3.0], [4.0, 5.0], [6.0]]
    assert tasks == [False, False, False, False, True, False]  # the queued pair: tried on the loop, from the task
    assert writer.written_now == 6 and writer.written == 7 and writer.batches == 6


def test_a_store_that_always_waits_is_tried_from_a_task_after_its_first_answer() -> None:
    """A store on a network never writes at once (PostgreSQL's ``ingest_reports_nowait`` answers ``None``): once
    it has said so, each later batch starts in a task that tries it and hands the batch to a thread, as
    before callbacks; only the first went through a callback."""
    store = Recorder()
    in_task: list[bool] = []

    def never(batch: Sequence[PendingReport]) -> list[IngestResult | StoreError] | None:
        in_task.append(asyncio.current_task() is not None)
        return None

    async def main() -> ReportWriter:
        writer = ReportWriter(store, offload, write_now=never)
        for n in range(4):
            await writer.write(item(n))
        return writer

    writer = asyncio.run(main())
    assert store.batches == [[0.0], [1.0], [2.0], [3.0]]
    assert in_task == [False, True, True, True]
    assert writer.written_now == 0 and writer.written == 4
