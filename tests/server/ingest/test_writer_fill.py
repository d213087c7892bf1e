"""Group commit under load on a store written from a task (PostgreSQL): when a batch has committed and only a
few reports wait while reports arrive often, the next batch waits a few lingers for the queue to fill.

A transaction costs PostgreSQL the same whatever its size (its commit, its round trips), so batches of ~5
(what forms by itself during one write) cost it twice what batches of ~16 do (``postgres_db_cost.py
--store B``). The SQLite store written on the event loop never waits: its batches are what the loop took in.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

from test_writer import NowOrThread, Recorder, item, offload
from test_writer_linger import recording_timer

from stepwatch.server.ingest.writer import FILL_BATCH, FILL_LINGERS, ReportWriter
from stepwatch.server.store import IngestResult, PendingReport, StoreError


class Held(Recorder):
    """A store whose first batch is held in it until :attr:`gate` opens; :attr:`entered` says it is there."""

    def __init__(self) -> None:
        super().__init__()
        self.gate.clear()
        self.entered = threading.Event()

    def __call__(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError]:
        self.entered.set()
        return super().__call__(batch)


def never(batch: Sequence[PendingReport]) -> list[IngestResult | StoreError] | None:
    """A store's ``write_now`` that always has to wait (a network's): its batches go to a task."""
    return None


async def until(condition: object, seconds: float = 5.0) -> None:
    """Step the loop until ``condition()`` holds (at most ``seconds``)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while not condition():  # type: ignore[operator]
        assert loop.time() < end, "the writer never got there"
        await asyncio.sleep(0.001)


async def behind_one(writer: ReportWriter, store: Held, waiting: int) -> list[asyncio.Future[IngestResult]]:
    """Report 0's batch held in the store, ``waiting`` reports queued behind it, then the store let go: the
    reports, report 0's first."""
    first = asyncio.ensure_future(writer.write(item(0)))
    await until(store.entered.is_set)
    rest = [asyncio.ensure_future(writer.write(item(n))) for n in range(1, waiting + 1)]
    await until(lambda: len(writer._queue) == waiting)
    store.gate.set()
    return [first, *rest]


def test_a_task_written_batch_waits_for_the_queue_to_fill_then_goes_at_once() -> None:
    """The first batch is in the store (held there); three reports wait. Once it commits, the writer waits
    for more rather than writing three; the report that brings the queue to :data:`FILL_BATCH` starts the
    batch at once, long before the wait's end."""
    store = Held()

    async def main() -> tuple[ReportWriter, float]:
        writer = ReportWriter(store, offload, write_now=never, linger=0.5, linger_gap=10.0)
        loop = asyncio.get_running_loop()
        first, *waiting = await behind_one(writer, store, 3)
        await first
        await until(lambda: writer.fills == 1)
        assert store.batches == [[0.0]] and not any(w.done() for w in waiting)
        began = loop.time()
        more = [asyncio.ensure_future(writer.write(item(n))) for n in range(4, 4 + FILL_BATCH - 3)]
        await asyncio.gather(*waiting, *more)
        return writer, loop.time() - began

    writer, took = asyncio.run(main())
    assert store.batches == [[0.0], [float(n) for n in range(1, FILL_BATCH + 1)]], store.batches
    assert writer.fills == 1 and writer.batches == 2 and writer.written == FILL_BATCH + 1
    assert took < 0.5 * FILL_LINGERS / 4  # not the whole wait (2 s): a quarter of it, on a loaded machine


def test_a_queue_that_does_not_fill_is_written_after_a_few_lingers() -> None:
    """Three reports wait and no more come: their batch goes after :data:`FILL_LINGERS` lingers, no later."""
    store = Held()

    async def main() -> tuple[ReportWriter, list[float]]:
        delays = recording_timer(asyncio.get_running_loop())
        writer = ReportWriter(store, offload, write_now=never, linger=0.01, linger_gap=10.0)
        await asyncio.gather(*await behind_one(writer, store, 3))
        return writer, delays

    writer, delays = asyncio.run(main())
    assert store.batches == [[0.0], [1.0, 2.0, 3.0]] and writer.fills == 1
    assert 0.01 * FILL_LINGERS in delays


def test_no_wait_to_fill_when_reports_come_seldom_or_the_linger_is_off() -> None:
    """A writer whose reports come seldom (a laptop's job, a quiet fleet), or whose linger is off
    (``STEPWATCH_WRITE_LINGER_MS=0``), writes what waits at once, as before."""

    async def run(linger: float, linger_gap: float) -> tuple[list[list[float]], ReportWriter]:
        store = Held()
        writer = ReportWriter(store, offload, write_now=never, linger=linger, linger_gap=linger_gap)
        await asyncio.gather(*await behind_one(writer, store, 3))
        return store.batches, writer

    for linger, gap in ((0.0, 10.0), (0.5, 0.0)):  # the linger off; reports far apart (the gap is 1 s)
        batches, writer = asyncio.run(run(linger, gap))
        assert batches == [[0.0], [1.0, 2.0, 3.0]] and writer.fills == 0, (linger, gap)


def test_a_store_written_on_the_loop_never_waits_to_fill() -> None:
    """SQLite's batches are written on the event loop: a burst goes in the batches the loop took in, none
    waits for more."""
    store = Recorder()

    async def main() -> ReportWriter:
        writer = ReportWriter(store, offload, write_now=NowOrThread(store), linger=0.5, linger_gap=10.0)
        await asyncio.gather(*(writer.write(item(n)) for n in range(40)))
        await asyncio.gather(*(writer.write(item(n)) for n in range(40, 43)))
        return writer

    writer = asyncio.run(main())
    assert writer.fills == 0 and writer.written_now == 43 and sum(map(len, store.batches)) == 43


def test_a_writer_of_small_batches_waits_for_no_more_than_one() -> None:
    """With ``max_batch`` below :data:`FILL_BATCH`, a queue that holds a whole batch is written at once."""
    store = Held()

    async def main() -> ReportWriter:
        writer = ReportWriter(store, offload, write_now=never, max_batch=2, linger=0.5, linger_gap=10.0)
        await asyncio.wait_for(asyncio.gather(*await behind_one(writer, store, 2)), 1.5)  # a wait to fill: 2 s
        return writer

    writer = asyncio.run(main())
    assert store.batches == [[0.0], [1.0, 2.0]] and writer.fills == 0
