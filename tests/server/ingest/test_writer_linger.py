"""Group commit at a fleet's pace: an idle writer's batch lingers for the reports of the next milliseconds,
but only while reports arrive often; a lone report is written at once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from test_writer import NowOrThread, Recorder, item, offload

from stepwatch.server.ingest.writer import LINGER_GAP_S, LINGER_S, ReportWriter
from stepwatch.server.store import IngestResult, PendingReport, StoreError


class Clock:
    """The writer's clock: each reading moves on by ``step`` seconds (the gap between two reports)."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def recording_timer(loop: asyncio.AbstractEventLoop) -> list[float]:
    """The delays the loop is asked to wait before a callback (the loop still waits them)."""
    delays: list[float] = []
    call_later = loop.call_later

    def record(delay: float, callback: Callable[..., Any], *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        delays.append(delay)
        return call_later(delay, callback, *args, **kwargs)

    loop.call_later = record  # type: ignore[method-assign]
    return delays


async def pair(linger: float, on_loop: bool = True) -> tuple[list[list[float]], ReportWriter]:
    """Two reports written a few loop steps apart (``on_loop``: by a store that writes on the loop, else
    from a task, as PostgreSQL's); the batches the store got, and the writer."""
    store = Recorder()
    now = NowOrThread(store) if on_loop else None
    writer = ReportWriter(store, offload, write_now=now, linger=linger, linger_gap=10.0)
    first = asyncio.ensure_future(writer.write(item(0)))
    for _ in range(3):
        await asyncio.sleep(0)
    second = asyncio.ensure_future(writer.write(item(1)))
    assert all(isinstance(r, IngestResult) for r in await asyncio.gather(first, second))
    return store.batches, writer


def test_two_reports_within_the_linger_share_a_batch() -> None:
    """The second report comes a few loop steps after the first, when the first's batch would already have
    been written without the linger; with it, the two share one transaction."""
    batches, writer = asyncio.run(pair(0.5))  # far longer than three loop steps, even on a loaded machine
    assert batches == [[0.0, 1.0]] and writer.batches == 1 and writer.written == 2 and writer.lingered == 1
    batches, writer = asyncio.run(pair(0.0))  # no linger: as before, each report its own batch
    assert batches == [[0.0], [1.0]] and writer.lingered == 0


def test_a_lone_report_is_answered_within_the_linger_and_a_laptops_at_once() -> None:
    """At a fleet's pace (reports 1 ms apart) an idle writer waits at most ``LINGER_S`` before it writes; at a
    laptop's (2 s apart) it does not wait at all."""

    async def lone(step: float, primed: int) -> tuple[list[float], ReportWriter, Recorder]:
        store = Recorder()
        writer = ReportWriter(store, offload, write_now=NowOrThread(store), clock=Clock(step), linger=LINGER_S)
        writer.linger = 0.0  # the reports that set the pace are written without waiting
        for n in range(primed):
            await writer.write(item(n))
        writer.linger = LINGER_S
        delays = recording_timer(asyncio.get_running_loop())
        assert isinstance(await writer.write(item(99)), IngestResult)
        return delays, writer, store

    delays, writer, store = asyncio.run(lone(0.001, 40))
    assert delays == [LINGER_S] and LINGER_S <= 0.005  # answered once the linger is over, within 5 ms
    assert writer.lingered == 1 and store.batches[-1] == [99.0]
    delays, writer, store = asyncio.run(lone(2.0, 3))
    assert delays == [] and writer.lingered == 0 and store.batches[-1] == [99.0]


def test_the_linger_follows_the_recent_rate() -> None:
    """A fleet's pace is seen within 40 reports of a quiet spell (each gap counts at most 1 s in the moving
    mean), and a quiet spell at its first report."""
    clock = Clock(2.0)

    async def main() -> list[bool]:
        writer = ReportWriter(Recorder(), offload, write_now=NowOrThread(Recorder()), clock=clock, linger=0.0)
        fast = []
        for n, step in enumerate([2.0] * 3 + [0.001] * 40 + [2.0] * 2):
            clock.step = step
            await writer.write(item(n))
            fast.append(writer.gap <= LINGER_GAP_S)
        return fast

    fast = asyncio.run(main())
    first = fast.index(True)
    assert 3 + 30 <= first < 3 + 40 and fast[first:43] == [True] * (43 - first) and fast[43:] == [False] * 2


def test_reports_that_linger_together_keep_their_order_and_their_own_errors() -> None:
    store = Recorder()
    store.fail_items = {2.0}
    now = NowOrThread(store)

    async def main() -> tuple[list[Any], ReportWriter]:
        writer = ReportWriter(store, offload, write_now=now, linger=0.05, linger_gap=10.0)
        outcomes = await asyncio.gather(*(writer.write(item(n)) for n in range(4)), return_exceptions=True)
        now.busy = True  # the lock is taken when the linger ends: the batch goes to a thread, as before
        more = await asyncio.gather(*(writer.write(item(n)) for n in range(4, 6)), return_exceptions=True)
        return [*outcomes, *more], writer

    outcomes, writer = asyncio.run(main())
    assert [type(o).__name__ for o in outcomes] == ["IngestResult"] * 2 + ["StoreError"] + ["IngestResult"] * 3
    assert store.batches == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    assert writer.lingered == 2 and writer.written_now == 4 and writer.written == 6


def test_a_store_that_always_waits_lingers_from_its_task() -> None:
    """PostgreSQL's batches go through a task after the store's first ``None``; an idle writer's batch lingers
    there as on the loop (each report here waits for the one before: every batch starts idle)."""
    store = Recorder()

    def never(batch: Sequence[PendingReport]) -> list[IngestResult | StoreError] | None:
        return None

    async def main() -> ReportWriter:
        writer = ReportWriter(store, offload, write_now=never, linger=0.05, linger_gap=10.0)
        for n in range(4):
            await writer.write(item(n))
        return writer

    writer = asyncio.run(main())
    assert store.batches == [[0.0], [1.0], [2.0], [3.0]] and writer.lingered == 4


def test_the_server_setting_sets_the_linger_and_its_gap(tmp_path: Any) -> None:
    """``STEPWATCH_WRITE_LINGER_MS`` reaches the app's writer, its gap scaled with it; ``0`` never lingers; a
    value out of range is refused with the variable's name."""
    import pytest

    from stepwatch.server import ServerSettings, create_app

    def writer(environ: dict[str, str]) -> ReportWriter:
        settings = ServerSettings.resolve({"db": str(tmp_path / f"sw{len(environ)}.db")}, environ)
        return create_app(settings).state.services.writer  # type: ignore[no-any-return]

    default = writer({})
    assert (default.linger, default.linger_gap) == (LINGER_S, LINGER_GAP_S)
    longer = writer({"STEPWATCH_WRITE_LINGER_MS": "5"})
    assert longer.linger == pytest.approx(0.005) and longer.linger_gap == pytest.approx(LINGER_GAP_S * 2.5)
    assert writer({"STEPWATCH_WRITE_LINGER_MS": "0", "X": ""}).linger == 0
    with pytest.raises(ValueError, match="STEPWATCH_WRITE_LINGER_MS: milliseconds between 0 and 100, got 500"):
        writer({"STEPWATCH_WRITE_LINGER_MS": "500"})


def test_a_store_that_writes_from_a_task_lingers_too() -> None:
    """PostgreSQL's store has no ``write_now``: its batches go to a task and a worker thread. An idle writer's
    first batch there lingers as well (a transaction costs its database ~1.3 ms at a fleet's pace), so two
    reports a few loop steps apart share it; without the linger each is its own."""
    batches, writer = asyncio.run(pair(0.5, on_loop=False))
    assert batches == [[0.0, 1.0]] and writer.batches == 1 and writer.lingered == 1
    batches, writer = asyncio.run(pair(0.0, on_loop=False))
    assert batches == [[0.0], [1.0]] and writer.lingered == 0
