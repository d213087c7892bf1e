"""One server process serves a SQLite file, but other programs may write it now and then (``stepwatch db``,
``stepwatch token create --db``, a hand-made ``sqlite3`` session): at its next write the server's store
sees the file changed under it and forgets everything it kept in memory, and so do its listeners."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepwatch.protocol import Report
from stepwatch.server.store import SQLiteStore

Heard = list[frozenset[int] | None]


def test_a_write_by_another_program_is_seen_at_the_next_write(tmp_path: Path) -> None:
    server = SQLiteStore(tmp_path / "s.db")
    tool = SQLiteStore(tmp_path / "s.db")  # what `stepwatch db` opens
    heard: Heard = []
    server.follow_changes(heard.append)
    try:
        job = server.register("ns", "j", token_hash="h", now=1.0)
        other = server.register("ns", "other", token_hash="h", now=1.0)
        tool.set_state(tool.job_by_id(job.id), "stopped", 2.0)  # type: ignore[arg-type]
        assert server.job_by_id(job.id).state == "pending"  # type: ignore[union-attr]  # not noticed yet
        server.set_state(other, "running", 3.0)
        assert heard == [None]  # any job may have changed
        assert server.job_by_id(job.id).state == "stopped"  # type: ignore[union-attr]
        with sqlite3.connect(tmp_path / "s.db") as raw:
            raw.execute("UPDATE jobs SET reason = 'by hand' WHERE id = ?", (other.id,))
        server.set_estimate(job.id, 10.0, 1.0, 4.0)
        assert heard == [None, None]
        assert server.job_by_id(other.id).reason == "by hand"  # type: ignore[union-attr]
        server.set_estimate(job.id, 9.0, 1.0, 5.0)
        assert heard == [None, None]  # its own writes are no news
    finally:
        server.close()
        tool.close()


def test_the_server_forgets_its_trackers_and_samples_when_another_program_wrote(tmp_path: Path) -> None:
    from stepwatch.server.live.broadcaster import Broadcaster
    from stepwatch.server.services import Services

    server = SQLiteStore(tmp_path / "s.db")
    tool = SQLiteStore(tmp_path / "s.db")
    try:
        svc = Services(store=server, live=Broadcaster())
        jobs = [server.register("ns", name, token_hash="h", now=1.0) for name in ("a", "b")]
        for job in jobs:
            svc.health.start(job, None, "loss")
            svc.progress.load(job.id, [])
        tool.set_estimate(jobs[1].id, 10.0, 1.0, 2.0)
        assert jobs[1].id in svc.health  # nothing noticed before the server's next write
        server.set_estimate(jobs[0].id, 10.0, 1.0, 3.0)
        for job in jobs:  # rebuilt from the store at their next report, as after a restart
            assert job.id not in svc.health and job.id not in svc.progress
    finally:
        server.close()
        tool.close()


def test_what_the_writer_remembers_is_forgotten_when_another_program_wrote(
    tmp_path: Path, make_report: Callable[..., dict[str, Any]]
) -> None:
    """The server answers a report's pending commands, and decides whether a report is its rank's newest, from
    memory (``sqlite_ingest``): a command queued or a newer report stored by another program must still count."""

    def report(seq: int, step: int, sent_at: float, acks: tuple[str, ...] = ()) -> Report:
        return Report.from_dict(make_report(seq, step, {"loss": 0.5}, sent_at=sent_at, acks=list(acks)))

    server = SQLiteStore(tmp_path / "s.db")
    tool = SQLiteStore(tmp_path / "s.db")
    try:
        job = server.register("ns", "j", token_hash="h", now=1.0)
        first = server.ingest_report(job, report(1, 10, 100.0), 2.0)
        assert first.commands == () and first.job.step == 10
        stop = tool.add_command(job, "stop", "by hand", 3.0)  # `stepwatch stop --db`
        second = server.ingest_report(first.job, report(2, 20, 110.0), 4.0)
        assert second.commands == (stop,) and second.job.step == 20
        tool.ingest_report(tool.job_by_id(job.id), report(3, 40, 130.0, acks=(stop.id,)), 5.0)  # type: ignore[arg-type]
        late = server.ingest_report(server.job_by_id(job.id), report(4, 30, 120.0), 6.0)  # type: ignore[arg-type]
        assert late.commands == ()  # acknowledged by the other program's report
        assert late.job.step == 40  # sent before the other program's report: history only
        assert [p.step for p in server.series(job.id, "loss")] == [10, 20, 30, 40]
    finally:
        server.close()
        tool.close()
