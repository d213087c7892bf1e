"""Group commit: the reports that arrive while one batch is being written go together in the next.

A report is answered only after the transaction that holds it has committed (an acknowledged report
is never lost), but one transaction and one trip to a worker thread serve every report that arrived
meanwhile. At a low rate each batch holds one report and nothing waits; under load the batches grow
by themselves and the per-report cost of the commit and the thread hop falls with them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .store import IngestResult, PendingReport, StoreError

__all__ = ["ReportWriter"]

WriteBatch = Callable[[Sequence[PendingReport]], list[IngestResult | StoreError]]


class ReportWriter:
    """Writes reports in batches through ``write`` (run in a worker thread by ``offload``).

    ``write`` is the store's ``ingest_reports``; ``offload`` runs it away from the event loop and
    turns a store failure of the whole batch into an exception for every report in it.
    """

    def __init__(
        self,
        write: WriteBatch,
        offload: Callable[[WriteBatch, list[PendingReport]], Awaitable[Any]],
        max_batch: int = 256,
    ) -> None:
        self._write = write
        self._offload = offload
        self.max_batch = max_batch
        self._queue: list[tuple[PendingReport, asyncio.Future[IngestResult]]] = []
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.written = 0

    async def write(self, item: PendingReport) -> IngestResult:
        """Store one report with the others waiting; its result once the batch has committed."""
        future: asyncio.Future[IngestResult] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._task is None:
            self._task = asyncio.create_task(self._drain())
        return await future  # a client that hangs up cancels its future, not the batch

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                try:
                    results: list[IngestResult | StoreError] = await self._offload(
                        self._write, [item for item, _ in batch]
                    )
                except BaseException as exc:  # the whole batch failed (database locked, disk full...)
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                self.batches += 1
                self.written += len(batch)
                for (_, future), result in zip(batch, results):
                    if future.done():
                        continue
                    if isinstance(result, StoreError):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            self._task = None
