"""How the PostgreSQL store writes reports: a batch of native ones in few round trips, and upstream statuses.

A report's rows (the report itself once by run, rank and seq; its rank's newest state when it is
the newest; its windows) are written by one statement, which answers whether the report was new and
the newest of its rank: :data:`BATCH_SQL` writes those of many reports at once (every column an array:
one statement to plan and run for the batch, not one per report), as long as no rank comes twice (a
rank's next report goes in the next statement, which sees the one before); :data:`INGEST_SQL` writes
one report. The store's write transactions run in psycopg's pipeline mode:
the statements of a whole batch are sent together and their answers read once; then, per report in
order, what follows from them is worked out in Python (progress, state, last metrics, acknowledged
commands) and its few writes (events, acknowledgements) queued, each job's row written once at the
end, with the commit. So a batch costs a handful of round trips, not several per report.

If a statement fails in a batch written that way, the whole transaction is rolled back and the
batch is written again report by report (:data:`INGEST_SQL`), each in a savepoint, so the failure
stays its own.

:class:`PostgresIngest` is the PostgreSQL store's ingest half; :class:`~.postgres.PostgresStore` adds
its connections, transactions and notifications.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from ...protocol import Command, TrainerStatus
from .base import Event, IngestResult, Job, MetricLimitError, PendingReport, StoreError
from .job_updates import check_metric_names, report_updates, upstream_status
from .rows import ROW_COLUMNS, column_value, job_from_row, spans_column
from .schema import TABLES, postgres_cast
from .sql_dialect import POSTGRES
from .sql_store import SqlStore

__all__ = [
    "BATCH_SQL",
    "CUSTOM_PLANS",
    "GENERIC_PLANS",
    "INGEST_SQL",
    "POINTS_SQL",
    "STATUS_SEQ_SQL",
    "STATUS_SQL",
    "PostgresIngest",
    "ReportFailed",
    "text_array",
]

Connection = psycopg.Connection[tuple[Any, ...]]
_Sent = tuple[list[list[PendingReport]], list[Any]]
"""A batch's waves of reports, and the cursors of their statements sent (answers not read yet)."""

_RANK_UPSERT = """
    ON CONFLICT (job_id, rank) DO UPDATE SET run_id = excluded.run_id, last_sent_at = excluded.last_sent_at,
        last_seen_at = excluded.last_seen_at, step = excluded.step, step_time = excluded.step_time,
        host = excluded.host, pid = excluded.pid, gpus = excluded.gpus
"""
"""How a report that is its rank's newest replaces the rank's row."""

INGEST_SQL = f"""
WITH prev AS (
    SELECT last_sent_at FROM ranks WHERE job_id = %(job)s AND rank = %(rank)s
), ins AS (
    INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step, newest)
    VALUES (%(job)s, %(run)s, %(rank)s, %(seq)s, %(now)s, %(sent)s, %(step)s,
            NOT EXISTS (SELECT 1 FROM prev WHERE prev.last_sent_at > %(sent)s))
    ON CONFLICT DO NOTHING
    RETURNING newest
), rank_row AS (
    INSERT INTO ranks (job_id, rank, run_id, last_sent_at, last_seen_at, step, step_time, host, pid, gpus)
    SELECT %(job)s, %(rank)s, %(run)s, %(sent)s::float8, %(now)s::float8, %(step)s::bigint,
           %(step_time)s::float8, %(host)s::text, %(pid)s::bigint, %(gpus)s::text
    FROM ins WHERE ins.newest{_RANK_UPSERT}), windows AS (
    INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite)
    SELECT %(job)s, w.metric, w.step, %(now)s::float8, w.last, w.min, w.max, w.mean, w.count, w.nonfinite
    FROM unnest(%(metrics)s::text[], %(steps)s::bigint[], %(lasts)s::float8[], %(mins)s::float8[],
                %(maxs)s::float8[], %(means)s::float8[], %(counts)s::bigint[], %(nonfinites)s::bigint[])
         AS w (metric, step, last, min, max, mean, count, nonfinite)
    WHERE EXISTS (SELECT 1 FROM ins)
)
SELECT newest FROM ins
"""
"""One report's rows in one statement; a row ``(newest,)`` when the report was new, none for a duplicate."""

BATCH_SQL = f"""
WITH r AS (
    SELECT * FROM unnest(%(job)s::bigint[], %(run)s::text[], %(rank)s::int[], %(seq)s::bigint[], %(now)s::float8[],
                         %(sent)s::float8[], %(step)s::bigint[], %(step_time)s::float8[], %(host)s::text[],
                         %(pid)s::bigint[], %(gpus)s::text[])
         AS r (job_id, run_id, rank, seq, now, sent, step, step_time, host, pid, gpus)
), ins AS (
    INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step, newest)
    SELECT r.job_id, r.run_id, r.rank, r.seq, r.now, r.sent, r.step,
           NOT EXISTS (SELECT 1 FROM ranks p WHERE p.job_id = r.job_id AND p.rank = r.rank AND p.last_sent_at > r.sent)
    FROM r
    ON CONFLICT DO NOTHING
    RETURNING job_id, rank, newest
), rank_rows AS (
    INSERT INTO ranks (job_id, rank, run_id, last_sent_at, last_seen_at, step, step_time, host, pid, gpus)
    SELECT r.job_id, r.rank, r.run_id, r.sent, r.now, r.step, r.step_time, r.host, r.pid, r.gpus
    FROM r JOIN ins ON ins.job_id = r.job_id AND ins.rank = r.rank
    WHERE ins.newest{_RANK_UPSERT}), windows AS (
    INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite)
    SELECT w.job_id, w.metric, w.step, w.t, w.last, w.min, w.max, w.mean, w.count, w.nonfinite
    FROM unnest(%(w_job)s::bigint[], %(w_rank)s::int[], %(metrics)s::text[], %(steps)s::bigint[], %(ts)s::float8[],
                %(lasts)s::float8[], %(mins)s::float8[], %(maxs)s::float8[], %(means)s::float8[], %(counts)s::bigint[],
                %(nonfinites)s::bigint[])
         WITH ORDINALITY AS w (job_id, rank, metric, step, t, last, min, max, mean, count, nonfinite, n)
    WHERE EXISTS (SELECT 1 FROM ins WHERE ins.job_id = w.job_id AND ins.rank = w.rank)
    ORDER BY w.n
)
SELECT job_id, rank, newest FROM ins
"""
"""The rows of several reports, of distinct ranks, in one statement (as :data:`INGEST_SQL` each): a row
``(job, rank, newest)`` for each report that was new. The windows are inserted in the order given (their
``rowid`` is their order of arrival)."""

POINTS_SQL = (
    "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
    "SELECT %s, w.* FROM unnest(%s::text[], %s::bigint[], %s::float8[], %s::float8[], %s::float8[], "
    "%s::float8[], %s::float8[], %s::bigint[], %s::bigint[]) AS w"
)
"""Windows of one job, as columns (name, step, t, last, min, max, mean, count, nonfinite)."""


STATUS_SEQ_SQL = (
    "SELECT COALESCE((SELECT seq FROM reports WHERE job_id = %s AND run_id = 'kubeflow' AND rank = 0 "
    "ORDER BY seq DESC LIMIT 1), -1) + 1"
)
"""The next seq of a job's upstream statuses: its last one's, read backwards along the key (job_id, run_id,
rank, seq). Not ``MAX(seq)``: on a table without statistics the planner served that by the partial index of
rank 0's reports by time (it has job_id first, and costs the same), reading every rank-0 report of the job."""

STATUS_SQL = (
    "INSERT INTO reports (job_id, run_id, rank, seq, received_at, sent_at, step) "
    f"SELECT %s, 'kubeflow', 0, ({STATUS_SEQ_SQL.removeprefix('SELECT ')}), %s::float8, %s::float8, %s::bigint"
)
"""An upstream status's report row (job, job, arrival, sent, step), numbered after the job's last one."""


GENERIC_PLANS = "SET LOCAL plan_cache_mode = force_generic_plan"
"""Sent just before a batch's :data:`BATCH_SQL` statements (:data:`CUSTOM_PLANS` just after them, all in one
flush of the pipeline): they run the statement's generic plan, made once per connection (psycopg prepares a
statement from its fifth use on a connection), not a plan made for each batch.

Why: PostgreSQL kept making a custom plan of :data:`BATCH_SQL` for every batch, because it prices the
generic plan higher than the custom ones (it cannot tell how long the arrays are): ``pg_prepared_statements``
read 0 generic and 295 custom plans for 300 batches, and making the plan cost about as much of the
database's CPU as running it. The generic plan probes each table by its key for each report and window
(nested loops over index scans), which is what batches of one report to a few hundred want. Only for this
statement: the job rows' ``UPDATE ... FROM unnest(...)`` ran slower with its generic plan (batches of 10
jobs). ``SET LOCAL``: nothing outlives the transaction."""

CUSTOM_PLANS = "SET LOCAL plan_cache_mode TO DEFAULT"
"""Back to the connection's setting after the batch's statements (see :data:`GENERIC_PLANS`)."""


class ReportFailed(Exception):
    """A report of a batch failed where the batch had no savepoints: write it again with them."""


class PostgresIngest(SqlStore):
    """The PostgreSQL store's writes of reports (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._sent_early = False
        """The batch being written sent its statements with the rows' lock (see :meth:`ingest_reports`)."""
        self._written_rows: dict[int, tuple[str, Job]] = {}
        """Jobs as this store's batches last wrote their rows, by id: the row's version (``xmin``, the id of
        the transaction that wrote it) and the job. The next batch that locks a row still of that version
        takes the job from here instead of decoding the row (its JSON columns, ~45 us a job); any other
        write of the row (another replica's, or another write of this store's) makes a new version, which
        is decoded."""

    _ROW_MEMO = 20_000
    """Jobs kept in :attr:`_written_rows` at most (then it starts again empty)."""

    def ingest_reports(self, batch: Sequence[PendingReport]) -> list[IngestResult | StoreError]:
        """Store reports in one transaction, in few round trips; a report that fails fails alone."""
        versions: list[Any] = []
        self._sent_early = False
        try:
            with self._write() as conn:
                results = self._write_reports(conn, batch, isolate=False, versions=versions)
        except (ReportFailed, StoreError) as exc:
            if isinstance(exc, StoreError) and not self._sent_early:
                raise
            # a statement sent early can fail (a removed job's reports) with its error raised by the rollback,
            # depending on when its answer arrives: the batch is then rewritten report by report as well
            versions.clear()
            with self._write(pipeline=False) as conn:  # savepoints, one report at a time
                results = self._write_reports(conn, batch, isolate=True, versions=versions)
        self._note_versions(versions)
        return results

    def _note_versions(self, versions: list[Any]) -> None:
        """After a batch's commit: the versions of the rows it wrote (the ``UPDATE``s' answers, read now
        that the pipeline has read them), each with the job as the batch wrote it."""
        written = self._written_rows
        if len(written) > self._ROW_MEMO:
            written.clear()
        for cursor, jobs in versions:
            for job_id, xmin in cursor.fetchall():
                job = jobs.get(job_id)
                if job is not None:
                    written[job_id] = (xmin, job)

    def _write_reports(
        self, conn: Connection, batch: Sequence[PendingReport], isolate: bool, versions: list[Any]
    ) -> list[IngestResult | StoreError]:
        """Write a batch in the open transaction; each report gets its result or its own error.

        ``isolate``: a savepoint per report (else the first failure raises :class:`ReportFailed`).
        ``versions``: gets what :meth:`_note_versions` reads once the transaction has committed.
        """
        ids = sorted({item.job.id for item in batch})
        # the rows of every job of the batch, locked in id order: two replicas never deadlock over them
        # (the job's own columns: its spans are read below only for a row this store did not write last)
        locked = conn.execute(
            f"SELECT xmin::text, {ROW_COLUMNS} FROM jobs WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE", (ids,)
        )
        commands = conn.execute(
            "SELECT job_id, id, kind, reason FROM commands WHERE job_id = ANY(%s) AND acked_at IS NULL "
            "ORDER BY job_id, created_at",
            (ids,),
        )
        memo = self._written_rows
        early: tuple[list[PendingReport], dict[int, IngestResult | StoreError], _Sent] | None = None
        if not isolate and all(i in memo for i in ids):
            # every job as this store last wrote it: the batch's statements go out now, in the same flush as the
            # lock (one round trip less), admitted by those jobs; checked below against the rows as locked
            known, refused = self._admit(batch, {i: memo[i][1] for i in ids})
            self._sent_early = True  # (before: sending may read, and raise, an answer that has come already)
            early = (known, refused, self._send_batch(conn, known))
        try:
            rows, command_rows = locked.fetchall(), commands.fetchall()
        except psycopg.Error as exc:
            if early is None:
                raise
            raise ReportFailed from exc  # (a pipeline raises the first error of any statement sent: the batch's?)
        stale = []
        for row in rows:
            last = memo.get(row[1])  # as this store wrote it, if the row is still that version
            if last is not None and last[0] == row[0]:
                self._remember(last[1])
            else:
                stale.append(row)
        if stale:  # written elsewhere (another replica, a change of health): read with its spans
            spans: dict[int, str] = dict(
                conn.execute(
                    f"SELECT id, {spans_column(POSTGRES)} FROM jobs WHERE id = ANY(%s)", ([row[1] for row in stale],)
                ).fetchall()
            )
            for row in stale:
                self._remember(job_from_row((*row[1:], spans[row[1]])))
        pending: dict[int, list[Command]] = {i: [] for i in ids}
        for job_id, command_id, kind, reason in command_rows:
            pending[job_id].append(Command(id=command_id, kind=kind, reason=reason))
        changed: dict[int, dict[str, Any]] = {}
        known, results = self._admit(batch, {i: job for i, (job, _, _) in self._remembered.items()})
        if isolate:
            for item in known:
                results[id(item)] = self._isolated(conn, item, pending, changed)
        else:
            if early is not None and (
                [id(i) for i in early[0]] != [id(i) for i in known] or early[1].keys() != results.keys()
            ):
                # a job changed meanwhile so that another report is refused (its names) or gone: written again,
                # report by report (the statements sent are rolled back with the transaction)
                raise ReportFailed("a job of the batch changed since this store wrote it")
            try:
                waves, cursors = early[2] if early is not None else self._send_batch(conn, known)
                for wave, cursor in zip(waves, cursors):
                    answers = {(job, rank): (newest,) for job, rank, newest in cursor.fetchall()}  # one wait for all
                    for item in wave:
                        answer = answers.get((item.job.id, item.report.identity.rank))
                        results[id(item)] = self._apply(conn, item, answer, pending, changed)
            except psycopg.Error as exc:
                raise ReportFailed from exc
        cursors = _update_jobs(conn, changed)
        if cursors:
            jobs = {i: self._remembered[i][0] for i in changed if i in self._remembered}
            versions.extend((cursor, jobs) for cursor in cursors)
        return [
            results.get(id(item)) or StoreError(f"the report of job {item.job.key} is not in the database")
            for item in batch
        ]

    def _admit(
        self, batch: Sequence[PendingReport], jobs: dict[int, Job]
    ) -> tuple[list[PendingReport], dict[int, IngestResult | StoreError]]:
        """The reports of a batch to write, in order: those whose job is in ``jobs`` (the database has it)
        and that keep it within the limit on metric names, counting the batch's reports before them (the
        job's row is locked: no other replica adds names meanwhile); and the refusals, by ``id`` of report."""
        names: dict[int, set[str]] = {}
        refused: dict[int, IngestResult | StoreError] = {}
        known = []
        for item in batch:
            job = jobs.get(item.job.id)
            if job is None:
                continue
            seen = names.setdefault(job.id, set(job.last_metrics))
            reported = [w.name for w in item.report.metrics]
            try:
                check_metric_names(job, seen, reported, self.max_metric_names)
            except MetricLimitError as exc:
                refused[id(item)] = exc
                continue
            seen.update(reported)
            known.append(item)
        return known, refused

    def _send_batch(self, conn: Connection, known: list[PendingReport]) -> _Sent:
        """Send a batch's :data:`BATCH_SQL` statements (not waiting for their answers): its waves and their
        cursors."""
        waves = _waves(known)
        conn.execute(GENERIC_PLANS)  # planned once per connection, not for each batch (see GENERIC_PLANS)
        cursors = [conn.execute(BATCH_SQL, _batch_params(wave)) for wave in waves]  # sent together
        conn.execute(CUSTOM_PLANS)
        return waves, cursors

    def _isolated(
        self,
        conn: Connection,
        item: PendingReport,
        pending: dict[int, list[Command]],
        changed: dict[int, dict[str, Any]],
    ) -> IngestResult | StoreError:
        job_id = item.job.id
        before = (self._remembered[job_id], dict(changed.get(job_id, {})), list(pending[job_id]))
        try:
            with conn.transaction():
                answer = conn.execute(INGEST_SQL, _params(item)).fetchone()
                return self._apply(conn, item, answer, pending, changed)
        except psycopg.Error as exc:
            self._remembered[job_id], changed[job_id], pending[job_id] = before
            return StoreError(f"the report of job {item.job.key} could not be stored: {exc}")

    def _apply(
        self,
        conn: Connection,
        item: PendingReport,
        answer: tuple[Any, ...] | None,
        pending: dict[int, list[Command]],
        changed: dict[int, dict[str, Any]],
    ) -> IngestResult:
        """What a stored report changes (``answer``: :data:`INGEST_SQL`'s row, ``None`` for a duplicate)."""
        job = self._remembered[item.job.id][0]
        report, now, identity = item.report, item.now, item.report.identity
        if answer is None:
            return IngestResult(job=job, duplicate=True, commands=tuple(pending[job.id][:16]))
        newest = bool(answer[0])
        if report.metrics:
            self._count_windows(conn, job.id, [w.name for w in report.metrics])
        events: tuple[Event, ...] = ()
        if report.acks:
            acked = conn.execute(
                "UPDATE commands SET acked_at = %s WHERE job_id = %s AND acked_at IS NULL AND id = ANY(%s) "
                "RETURNING id, kind",
                (now, job.id, list(report.acks)),
            ).fetchall()
            events = tuple(
                self._event(conn, job, now, "command_acked", f"{kind} received by the job", {"id": command_id})
                for command_id, kind in acked
            )
            done = {command_id for command_id, _ in acked}
            pending[job.id] = [c for c in pending[job.id] if c.id not in done]
        updates, sample = report_updates(job, item, newest)
        events += self._transition(conn, job, updates, report.state, report.reason, now, rank0=identity.rank == 0)
        fresh = job.changed(**updates)
        self._remember(fresh)
        changed.setdefault(job.id, {}).update(updates)
        return IngestResult(
            job=fresh,
            duplicate=False,
            commands=tuple(pending[job.id][:16]),
            new_points=report.metrics,
            sample=sample,
            events=events,
        )

    def ingest_status(self, job: Job, status: TrainerStatus, now: float) -> IngestResult:
        """Store an upstream status: progress, ETA and every numeric metric as a one-value window."""
        with self._write() as conn:
            try:
                job = self._job_in(conn, job.id)
            except KeyError:  # deleted (retention, ``stepwatch db``) since the route found it
                raise StoreError(f"job {job.key} is not in the database") from None
            read = upstream_status(job, status, now)
            check_metric_names(job, job.last_metrics, (w.name for w in read.windows), self.max_metric_names)
            # each POST replaces the whole status upstream: every one is kept, none is a duplicate
            conn.execute(STATUS_SQL, (job.id, job.id, now, read.sent_at, read.step))
            if read.windows:
                self._count_windows(conn, job.id, [w.name for w in read.windows])
                columns = [
                    (w.name, w.last_step, now, w.last, w.min, w.max, w.mean, 1, w.nonfinite) for w in read.windows
                ]
                conn.execute(POINTS_SQL, (job.id, *(list(c) for c in zip(*columns))))
            updates = dict(read.updates)
            events = self._transition(conn, job, updates, "running", "", now, rank0=True)
            fresh = self._update(conn, job, updates)
        return IngestResult(job=fresh, duplicate=False, new_points=read.windows, sample=read.sample, events=events)


def _params(item: PendingReport) -> dict[str, Any]:
    report, windows = item.report, item.report.metrics
    return {
        "job": item.job.id,
        "rank": report.identity.rank,
        "run": report.run_id,
        "seq": report.seq,
        "now": item.now,
        "sent": report.sent_at,
        "step": report.progress.step,
        "step_time": report.progress.step_time,
        "host": report.identity.host,
        "pid": report.identity.pid,
        "gpus": json.dumps([g.to_dict() for g in report.gpus]),
        "metrics": _array(_quoted(w.name) for w in windows),
        "steps": _array(str(w.last_step) for w in windows),
        "lasts": _array(repr(w.last) for w in windows),
        "mins": _array(_float(w.min) for w in windows),
        "maxs": _array(_float(w.max) for w in windows),
        "means": _array(_float(w.mean) for w in windows),
        "counts": _array(str(w.count) for w in windows),
        "nonfinites": _array(str(w.nonfinite) for w in windows),
    }


def _update_jobs(conn: Connection, changed: dict[int, dict[str, Any]]) -> list[psycopg.Cursor[tuple[Any, ...]]]:
    """Write what a batch changed in its jobs' rows: one statement for the jobs whose changes are of the
    same columns (most batches: every job's), each column an array. Their cursors, whose rows (read once
    the pipeline has read them) are each job's id and its row's new version."""
    cursors = []
    groups: dict[tuple[str, ...], list[int]] = {}
    for job_id, updates in changed.items():
        if updates:
            groups.setdefault(tuple(sorted(updates)), []).append(job_id)
    for columns, ids in groups.items():
        if len(ids) == 1:
            updates = changed[ids[0]]
            sets = ", ".join(f"{k} = %s" for k in columns)
            cursors.append(
                conn.execute(
                    f"UPDATE jobs SET {sets} WHERE id = %s RETURNING id, xmin::text",
                    (*[column_value(k, updates[k]) for k in columns], ids[0]),
                )
            )
            continue
        sets = ", ".join(f"{k} = v.{k}::{_JOB_CASTS[k]}" for k in columns)
        arrays = [_array(str(i) for i in ids)]
        arrays += [_array(_literal(column_value(k, changed[i][k])) for i in ids) for k in columns]
        unnest = ", ".join("%s::text[]" for _ in arrays)
        cursors.append(
            conn.execute(
                f"UPDATE jobs SET {sets} FROM unnest({unnest}) AS v (id, {', '.join(columns)}) "
                "WHERE jobs.id = v.id::bigint RETURNING jobs.id, jobs.xmin::text",
                arrays,
            )
        )
    return cursors


_JOB_CASTS = {c.name: postgres_cast(c.type) for t in TABLES if t.name == "jobs" for c in t.columns}
"""Each column of ``jobs``: the type its values are cast to from text."""


def _literal(value: Any) -> str:
    """A value as an element of a text array's literal."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value) if isinstance(value, int) else _quoted(str(value))


def _waves(items: Sequence[PendingReport]) -> list[list[PendingReport]]:
    """A batch in runs of reports in order, each run with one report at most of each rank (a statement reads
    the database as it stood before it: a rank's next report must see its report before)."""
    waves: list[list[PendingReport]] = [[]]
    ranks: set[tuple[int, int]] = set()
    for item in items:
        key = (item.job.id, item.report.identity.rank)
        if key in ranks:
            waves.append([])
            ranks.clear()
        ranks.add(key)
        waves[-1].append(item)
    return waves if waves[0] else []


def _batch_params(items: Sequence[PendingReport]) -> dict[str, Any]:
    """:data:`BATCH_SQL`'s parameters: each column of the reports, and of their windows, as one array.

    The windows' columns are filled in one pass over each report's windows, what a report gives all its
    windows (job, rank, time) written once (a column a generator over every window cost ~2x)."""
    reports = [item.report for item in items]
    w_job: list[str] = []
    w_rank: list[str] = []
    ts: list[str] = []
    metrics: list[str] = []
    steps: list[str] = []
    lasts: list[str] = []
    mins: list[str] = []
    maxs: list[str] = []
    means: list[str] = []
    counts: list[str] = []
    nonfinites: list[str] = []
    quoted = _quoted_name
    for item in items:
        windows = item.report.metrics
        if not windows:
            continue
        n = len(windows)
        w_job += [str(item.job.id)] * n
        w_rank += [str(item.report.identity.rank)] * n
        ts += [repr(item.now)] * n
        for w in windows:
            metrics.append(quoted.get(w.name) or _quote_name(w.name))
            steps.append(str(w.last_step))
            lasts.append(repr(w.last))
            mins.append("NULL" if w.min is None else repr(w.min))
            maxs.append("NULL" if w.max is None else repr(w.max))
            means.append("NULL" if w.mean is None else repr(w.mean))
            counts.append(str(w.count))
            nonfinites.append(str(w.nonfinite))
    return {
        "job": _array(str(item.job.id) for item in items),
        "run": _array(_quoted(r.run_id) for r in reports),
        "rank": _array(str(r.identity.rank) for r in reports),
        "seq": _array(str(r.seq) for r in reports),
        "now": _array(repr(item.now) for item in items),
        "sent": _array(repr(r.sent_at) for r in reports),
        "step": _array(_int(r.progress.step) for r in reports),
        "step_time": _array(_float(r.progress.step_time) for r in reports),
        "host": _array(_text(r.identity.host) for r in reports),
        "pid": _array(_int(r.identity.pid) for r in reports),
        "gpus": _array(_quoted(json.dumps([g.to_dict() for g in r.gpus])) if r.gpus else '"[]"' for r in reports),
        "w_job": _array(w_job),
        "w_rank": _array(w_rank),
        "metrics": _array(metrics),
        "steps": _array(steps),
        "ts": _array(ts),
        "lasts": _array(lasts),
        "mins": _array(mins),
        "maxs": _array(maxs),
        "means": _array(means),
        "counts": _array(counts),
        "nonfinites": _array(nonfinites),
    }


_quoted_name: dict[str, str] = {}
"""Metric names as array elements (:func:`_quoted`), kept: a job's reports name the same metrics."""


def _quote_name(name: str) -> str:
    if len(_quoted_name) >= 4096:
        _quoted_name.clear()
    text = _quoted_name[name] = _quoted(name)
    return text


# Arrays as PostgreSQL's text literals: psycopg's list dumper inspects every element for its type,
# which cost more than the rest of a report's work; these values' types are known.


def _array(items: Iterable[str]) -> str:
    return "{" + ",".join(items) + "}"


def _float(value: float | None) -> str:
    return "NULL" if value is None else repr(value)  # repr: nan, inf and -inf, which PostgreSQL reads


def text_array(texts: Iterable[str]) -> str:
    """Texts as a ``text[]`` literal (psycopg's list dumper escapes each text with a regular expression
    and a template per quote: ~9 ms for a notification's 7,000 bytes of JSON; this, ~10 us)."""
    return _array(_quoted(text) for text in texts)


def _int(value: int | None) -> str:
    return "NULL" if value is None else str(value)


def _text(value: str | None) -> str:
    return "NULL" if value is None else _quoted(value)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
