"""The write-ahead log is copied back into the database file by a thread of its own (``WalCheckpointer``),
not inside the writer's commits; under writes without a pause it is restarted at its limit, so it stays
bounded. Real SQLite files, real threads."""

from __future__ import annotations

import sqlite3
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepwatch.protocol import Report
from stepwatch.server.store import IngestResult, PendingReport, SQLiteStore
from stepwatch.server.store.sqlite_checkpoint import WalCheckpointer
from stepwatch.testing import wait_for

MakeReport = Callable[..., dict[str, Any]]


def test_the_store_copies_its_log_in_a_thread_and_the_writer_never_does(db_path: Path, make_report: MakeReport) -> None:
    store = SQLiteStore(db_path)
    store._checkpointer.close()  # held back while the log grows, so that no copy of it comes between
    job = store.register("ns", "a", token_hash="h", now=0.0)
    frame = 24 + store._writer.execute("PRAGMA page_size").fetchone()[0]
    wal = Path(f"{db_path}-wal")
    for seq in range(1, 201):
        metrics = {f"metric/{i}": seq + i / 100 for i in range(40)}
        report = Report.from_dict(make_report(seq, seq, metrics))
        (result,) = store.ingest_reports([PendingReport(job, report, float(seq))])
        assert isinstance(result, IngestResult)
    assert wal.stat().st_size // frame > 2 * 1000  # far past SQLite's own limit: no commit copied it back
    store._checkpointer = WalCheckpointer(store._open, pause_writers=lambda: store._write_lock, every_s=0.05)
    store._checkpointer.start()
    wait_for(lambda: store._checkpointer.copies > 0, what="the checkpointer's first copy")
    last = Report.from_dict(make_report(201, 201, {"loss": 1.0}))
    store.ingest_reports([PendingReport(job, last, 201.0)])
    with sqlite3.connect(db_path) as reader:  # the copy left nothing behind: the next write started the log again
        _, log, _ = reader.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert log < 50 and reader.execute("SELECT count(*) FROM points").fetchone() == (200 * 40 + 1,)
    store.close()
    assert store._checkpointer._thread is None


def write_without_a_pause(path: Path, seconds: float, restart_frames: int) -> tuple[int, int, WalCheckpointer]:
    """Commit one row after the other for ``seconds`` (and until 5 copies were made) while a checkpointer
    copies the log every 20 ms; the commits made, the log's longest length in frames, and the checkpointer."""
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")  # only the thread copies
    writer.execute("CREATE TABLE t (k INTEGER, v TEXT)")
    writer.execute("CREATE INDEX t_by_k ON t (k)")

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    lock = threading.Lock()  # the store's write lock
    checkpointer = WalCheckpointer(connect, pause_writers=lambda: lock, every_s=0.02, restart_frames=restart_frames)
    checkpointer.start()
    commits = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline or checkpointer.copies < 5:  # one commit after the other
            with lock:
                writer.execute("INSERT INTO t VALUES (?, ?)", (commits % 97, "x" * 300))
            commits += 1
    finally:
        checkpointer.close()
    longest = Path(f"{path}-wal").stat().st_size // (24 + 4096)  # the file keeps its longest size
    assert writer.execute("SELECT count(*) FROM t").fetchone() == (commits,)
    writer.close()
    return commits, longest, checkpointer


@pytest.mark.perf  # a same-run throughput ratio (median of three tries): it wants a quiet machine
def test_under_writes_without_a_pause_the_log_is_restarted_at_its_limit(tmp_path: Path) -> None:
    """Frames per commit at the log's longest, with the restart and without it (the baseline, in this run).

    Without the restart the log only grows (what the restart is for): every commit adds its frames. With it
    the log is started again every 200 frames or so, unless the copying thread is kept waiting (a loaded
    machine, the writer taking the lock back at once): one such wait makes the longest log, so the test takes
    the median of three tries, and half the baseline as its bound (measured: a tenth, a third at worst; CI on a
    loaded machine once read 0.26-0.45 of it, median 0.37: without the restart it is 1 or more)."""
    commits, longest, checkpointer = write_without_a_pause(tmp_path / "grows.db", 1.0, restart_frames=10**9)
    assert checkpointer.restarts == 0 and longest >= commits
    baseline = longest / commits
    ratios = []
    for attempt in range(3):
        commits, longest, checkpointer = write_without_a_pause(tmp_path / f"busy-{attempt}.db", 1.0, 200)
        assert checkpointer.restarts >= 1
        ratios.append(longest / commits)
    assert statistics.median(ratios) < baseline / 2, (ratios, baseline)


def test_close_stops_the_thread_at_once(tmp_path: Path) -> None:
    """The thread waits an hour between copies; close() ends it at once, not after that wait: close() is
    waited for with a ceiling of a hundredth of that wait (an event wait; a slow machine takes
    milliseconds longer, not half a minute)."""
    checkpointer = WalCheckpointer(lambda: sqlite3.connect(tmp_path / "x.db"), every_s=3600.0)
    checkpointer.start()
    thread = checkpointer._thread
    assert thread is not None and thread.is_alive()
    closing = threading.Thread(target=checkpointer.close, daemon=True)
    closing.start()
    closing.join(checkpointer.every_s / 100)
    assert not closing.is_alive(), "close() waits for the thread's hour-long wait"
    assert not thread.is_alive()
