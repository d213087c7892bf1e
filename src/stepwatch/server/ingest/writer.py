"""Group commit: the reports that arrive while one batch is being written go together in the next.

A report is answered only after the transaction that holds it has committed (an acknowledged report
is never lost), but one transaction serves every report that arrived meanwhile. At a low rate each
batch holds one report and nothing waits; under load the batches grow by themselves and the
per-report cost of the commit falls with them.

A store whose write needs no waiting (the embedded SQLite file, when no other thread or process holds
its lock) is written from the event loop itself (``write_now``): in a worker thread, each of the
twenty-odd SQLite calls of a batch gave up the GIL and then waited for the busy event loop to hand it
back, which stretched batches to 40-70 ms under load and the tail latency with them (paced at half
the capacity: p99 56-65 ms on the thread, 30-39 ms on the loop, A/B in the same session). When the lock
is taken the batch goes to a worker thread, which waits for it.

At a fleet's pace (hundreds of ranks, each every 2 s) the reports arrive spread out, and each would be a
batch of its own, paying a whole transaction (``BEGIN IMMEDIATE`` and ``COMMIT``, ~80 us of SQLite's
~100-170 for a heartbeat). So when a report finds the writer idle while reports are arriving often (the
recent gaps between them are short), its batch waits a short linger (:data:`LINGER_S`) for the reports
of those milliseconds; a lone report, such as a laptop's job sends, is written at once as before.

Under load on PostgreSQL the batches that form by themselves are small (what arrives during one write, ~5
reports), and the database spends its CPU per transaction. So a batch written from a task, right after the one
before it, waits a few lingers for the queue to fill (:data:`FILL_BATCH`, :data:`FILL_LINGERS`), and goes as soon
as it has: bigger batches, less CPU a report in the database and in the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..store import IngestResult, PendingReport, StoreError

__all__ = ["ReportWriter"]

WriteBatch = Callable[[Sequence[PendingReport]], list[IngestResult | StoreError]]
WriteNow = Callable[[Sequence[PendingReport]], "list[IngestResult | StoreError] | None"]
"""A batch written at once, or ``None`` (nothing written) when it would have to wait."""

LINGER_S = 0.002
"""How long a batch started by an idle writer waits for more reports, while reports arrive often.

With a linger ``L`` at ``r`` reports/s a batch holds about ``1 + rL`` reports more than it would; the
transaction's fixed cost (~80 us on SQLite) is shared by them, and each report waits up to ``L`` more
before its answer. Measured at a fleet's pace (``benchmarks/fleet.py --ranks 400 --seconds 15``, 200
reports/s, 6 alternating pairs against the writer without it): 1.22-1.39 -> 1.57-1.74 reports a
transaction, the store's ``write_now`` 208-254 -> 191-227 us of CPU a report, report latency p50
1.9-2.4 -> 4.1-4.5 ms (p99 5.8-17 and 7.9-19 ms, the machine's noise); the server's CPU a report moved
within the noise (0.94-1.14 and 0.91-1.25 ms). Issue 31 allows a p99 of 50 ms at half the capacity. Under
load the batches form by themselves (a commit outlasts the gap between two reports) and the writer is
seldom idle to linger.
"""

LINGER_GAP_S = 5 * LINGER_S
"""The writer lingers only while the recent gap between reports (:attr:`ReportWriter.gap`, a moving mean)
is at most this: then a linger expects at least 0.2 more reports. A laptop's job (a report every second
or two) never lingers, so its reports pay no added latency."""

FILL_BATCH = 16
"""Under load, a batch written from a task (PostgreSQL's store) waits for this many reports (:data:`FILL_LINGERS`).

A transaction costs PostgreSQL about the same whatever its size (its commit, two round trips, the executor's
start and end): the store alone in batches of 3 / 10 / 30 reports spent 0.28 / 0.12 / 0.07 ms of database CPU
and 0.34 / 0.13 / 0.07 ms of its writing thread a report (``postgres_db_cost.py --store B``). Under load the
batches that form by themselves hold what arrived during one write, ~5 reports (0.2 commits a report)."""

FILL_LINGERS = 4
"""How many lingers a batch written from a task waits at most for the queue to reach :data:`FILL_BATCH`, when its
writer has just committed the batch before and reports arrive often (the same test as the linger's): ``200``
reporters back to back on one PostgreSQL replica (``server_ingest.py --sections 6``, 3 alternating rounds):
1,876-2,133 -> 2,309-2,497 reports/s, server CPU 0.35-0.40 -> 0.29-0.32 ms and database CPU 0.13-0.15 -> 0.11-0.12
ms a report. A writer that went idle lingers once (:data:`LINGER_S`) and does not wait to fill; the SQLite store,
written on the event loop, does not wait either (its batches are what the loop took in meanwhile), except while
another program holds its lock and its batches go to a task."""

_GAP_WEIGHT = 0.125
"""The weight of each new gap in the moving mean (the last ~8 gaps count)."""

_GAP_MAX_S = 1.0
"""A gap counts as at most this, so that a fleet's pace after a quiet hour is seen within ~40 reports."""


class ReportWriter:
    """Writes reports in batches through ``write`` (run in a worker thread by ``offload``).

    ``write`` is the store's ``ingest_reports``; ``offload`` runs it away from the event loop and
    turns a store failure of the whole batch into an exception for every report in it. ``write_now``
    (the store's ``ingest_reports_nowait``), when given, is tried first on the event loop; its batches
    linger (``linger`` seconds, measured by ``clock``; ``0`` never) while reports arrive at most
    ``linger_gap`` apart on average.
    """

    def __init__(
        self,
        write: WriteBatch,
        offload: Callable[[WriteBatch, list[PendingReport]], Awaitable[Any]],
        max_batch: int = 256,
        write_now: WriteNow | None = None,
        linger: float = LINGER_S,
        linger_gap: float = LINGER_GAP_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self._offload = offload
        self._write_now = write_now
        self.written_now = 0
        """Reports written on the event loop (the others went to a worker thread)."""
        self.max_batch = max_batch
        self._queue: list[tuple[PendingReport, asyncio.Future[IngestResult]]] = []
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        """A batch is being written or is due (a callback or :attr:`_task`): new reports wait in the queue."""
        self._waits = False
        """The store's last ``write_now`` answered ``None``: the next batch goes straight to a task."""
        self.batches = 0
        self.written = 0
        self.linger = linger
        self.linger_gap = linger_gap
        self._clock = clock
        self._last = clock()
        self.gap = _GAP_MAX_S
        """The moving mean of the gaps between reports, in seconds (at most ``_GAP_MAX_S`` each)."""
        self.lingered = 0
        """Batches that waited :attr:`linger` before they were written."""
        self.fills = 0
        """Batches written from a task that waited for the queue to fill (:data:`FILL_BATCH`)."""
        self._filled: asyncio.Future[None] | None = None
        """Set while the writer's task waits for the queue to fill (:meth:`_fill`)."""

    async def write(self, item: PendingReport) -> IngestResult:
        """Store one report with the others waiting; its result once the batch has committed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[IngestResult] = loop.create_future()
        self._queue.append((item, future))
        now = self._clock()
        gap = now - self._last
        self._last = now
        self.gap += ((gap if gap < _GAP_MAX_S else _GAP_MAX_S) - self.gap) * _GAP_WEIGHT
        filled = self._filled
        if filled is not None and len(self._queue) >= self._fill_batch and not filled.done():
            filled.set_result(None)
        if not self._busy:
            self._busy = True
            linger = self.linger if self._often() else 0.0
            if linger:
                self.lingered += 1
            if self._write_now is not None and not self._waits:
                if linger:
                    loop.call_later(linger, self._write_soon)
                else:
                    loop.call_soon(self._write_soon)
            else:  # a store that waited last time (a network's always does) is tried from a task, as before
                self._task = asyncio.create_task(self._drain(linger=linger))
        return await future  # a client that hangs up cancels its future, not the batch

    def _short(self) -> bool:
        """Whether the queue holds fewer reports than a batch would take (:data:`FILL_BATCH`, at most
        :attr:`max_batch`) while reports arrive often."""
        return 0 < len(self._queue) < self._fill_batch and self._often()

    def _often(self) -> bool:
        """Whether reports arrive often enough to wait for more (the linger is on and the recent gap short)."""
        return self.linger > 0 and self.gap <= self.linger_gap

    @property
    def _fill_batch(self) -> int:
        return min(FILL_BATCH, self.max_batch)

    async def _fill(self) -> None:
        """Wait until the queue holds :data:`FILL_BATCH` reports (:meth:`write` says so), or :data:`FILL_LINGERS`
        lingers passed."""
        self.fills += 1
        loop = asyncio.get_running_loop()
        filled: asyncio.Future[None] = loop.create_future()
        self._filled = filled
        timer = loop.call_later(self.linger * FILL_LINGERS, _settle_once, filled)
        try:
            await filled
        finally:
            timer.cancel()
            self._filled = None

    def _take(self) -> list[tuple[PendingReport, asyncio.Future[IngestResult]]]:
        batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
        return batch

    def _write_soon(self) -> None:
        """The next batch written on the event loop, as a callback: a task for it (made, stepped, and stepped
        again after a yield to let waiting requests in) cost 8 us a report where each report is a batch of
        its own (a fleet's pace), this 1. The reports that arrive meanwhile join the next batch, written by
        the next callback; a batch the store cannot write without waiting goes to a task (:meth:`_drain`),
        which writes it in a worker thread and the rest after it."""
        assert self._write_now is not None
        handed = False
        try:
            batch = self._take()
            try:
                results = self._write_now([item for item, _ in batch])
            except BaseException as exc:  # the whole batch failed (disk full...)
                _fail(batch, exc)
                if not isinstance(exc, Exception):
                    raise
                results = []
            else:
                if results is None:  # the lock is taken: a thread waits for it
                    self._waits = True
                    self._task = asyncio.create_task(self._drain(batch))
                    handed = True
                    return
                self.written_now += len(batch)
                self._settle(batch, results)
            if self._queue:
                asyncio.get_running_loop().call_soon(self._write_soon)
                handed = True
        finally:
            if not handed:
                self._busy = False

    async def _drain(
        self, first: list[tuple[PendingReport, asyncio.Future[IngestResult]]] | None = None, linger: float = 0.0
    ) -> None:
        """Write the queue's batches in turn (``first``, if given, straight in a worker thread: the store
        could not write it at once); each tried on the loop first when the store can. ``linger``: how long
        the first batch waits for more reports (PostgreSQL's path: a transaction costs its database ~1.3 ms
        of CPU at a fleet's pace, and held 1.5-2 reports there without it)."""
        try:
            if linger:
                await asyncio.sleep(linger)
            while first is not None or self._queue:
                if first is None and self._waits and self._short():
                    await self._fill()
                batch, now = (first, False) if first is not None else (self._take(), True)
                first = None
                items = [item for item, _ in batch]
                try:
                    results = self._write_now(items) if now and self._write_now is not None else None
                    self._waits = results is None
                    if results is None:
                        results = await self._offload(self._write, items)
                    else:
                        self.written_now += len(items)
                        await asyncio.sleep(0)  # let waiting requests in: what they bring joins the next batch
                except BaseException as exc:  # the whole batch failed (database locked, disk full...)
                    _fail(batch, exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                self._settle(batch, results)
        finally:
            self._task = None
            self._busy = False

    def _settle(
        self,
        batch: list[tuple[PendingReport, asyncio.Future[IngestResult]]],
        results: list[IngestResult | StoreError],
    ) -> None:
        self.batches += 1
        self.written += len(batch)
        for (_, future), result in zip(batch, results):
            if future.done():
                continue
            if isinstance(result, StoreError):
                future.set_exception(result)
            else:
                future.set_result(result)


def _fail(batch: list[tuple[PendingReport, asyncio.Future[IngestResult]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)


def _settle_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
