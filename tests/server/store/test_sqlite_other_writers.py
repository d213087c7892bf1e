"""One server process serves a SQLite file, but other programs may write it now and then (``stepwatch db``,
``stepwatch token create --db``, a hand-made ``sqlite3`` session): at its next write the server's store
sees the file changed under it and forgets everything it kept in memory, and so do its listeners."""

from __future__ import annotations

import sqlite3
from pathlib import Path

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
