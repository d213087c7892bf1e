"""``stepwatch db stats|compact|backup|restore|copy``: look after the server's database directly.

Like ``stepwatch server``, these open the database itself (``--db PATH``, ``--database-url URL``,
else ``$STEPWATCH_DB`` / ``$STEPWATCH_DATABASE_URL``, else the embedded default), not the API.
``compact`` applies retention now (``--days``, ``--quota``, ``--all``; see docs/retention.md).
``backup`` copies a live SQLite database with its online backup API; for PostgreSQL it prints the
``pg_dump`` and ``pg_restore`` commands to run (pg_dump takes a consistent snapshot). ``restore``
copies a SQLite backup into an empty database, and refuses to overwrite one without ``--force``.
``copy SOURCE TARGET`` copies every job, point, event, verdict, token and policy from one database
into another (``sqlite:///PATH`` or ``postgresql://...``: a laptop's history to the replicas'
PostgreSQL), then compares them row for row; ``--resume`` goes on with a copy that stopped part-way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from ._format import plain_table

__all__ = ["register", "run"]


def register(commands: Any) -> None:
    """Add the ``db`` command group."""
    parser = commands.add_parser(
        "db",
        help="database stats, compaction (retention), backup, restore and copy",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    stats = actions.add_parser("stats", help="jobs, windows, roll-up rows and bytes per table and namespace")
    stats.add_argument("-o", "--output", choices=["table", "json"], default="table")
    _where(stats)
    stats.set_defaults(run=run)

    compact = actions.add_parser("compact", help="apply retention now: compact old raw windows into roll-ups")
    compact.add_argument(
        "--days", type=float, default=None, help="older than this (default: $STEPWATCH_RETENTION_DAYS)"
    )
    compact.add_argument(
        "--quota", default=None, help="raw windows per namespace: N or JSON (default: $STEPWATCH_QUOTA_POINTS)"
    )
    compact.add_argument("--all", action="store_true", help="every window already folded, whatever its age")
    _where(compact)
    compact.set_defaults(run=run)

    backup = actions.add_parser("backup", help="a consistent copy of the live database")
    backup.add_argument("file", metavar="FILE", help="where to write the copy")
    backup.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    _where(backup)
    backup.set_defaults(run=run)

    restore = actions.add_parser("restore", help="copy a backup into an empty database")
    restore.add_argument("file", metavar="FILE", help="the backup")
    restore.add_argument("--force", action="store_true", help="overwrite a database that is not empty")
    _where(restore)
    restore.set_defaults(run=run)

    copy = actions.add_parser(
        "copy",
        help="copy every job, point, event, token and policy into another database, verified row for row",
    )
    copy.add_argument("source", metavar="SOURCE", help="sqlite:///PATH (or PATH) or postgresql://USER@HOST/DB")
    copy.add_argument("target", metavar="TARGET", help="an empty database, same forms (created when missing)")
    copy.add_argument(
        "--resume", action="store_true", help="go on with a copy of this SOURCE into TARGET that stopped part-way"
    )
    copy.set_defaults(run=run, db=None, database_url=None)


def _where(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", metavar="PATH", default=None, help="SQLite file (env STEPWATCH_DB)")
    where.add_argument(
        "--database-url",
        metavar="URL",
        default=None,
        help="sqlite:///PATH or postgresql://USER@HOST/DB (env STEPWATCH_DATABASE_URL)",
    )


def run(args: argparse.Namespace) -> int:
    """Run one ``db`` action; 0 on success, 1 when the database refused, 2 on bad arguments."""
    try:
        from ..server.settings import ServerSettings
        from ..server.store import StoreError
    except ImportError as exc:
        print(f"stepwatch db needs the server extra ({exc.name} is missing): pip install 'stepwatch[server]'",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        settings = ServerSettings.resolve({"db": args.db, "database_url": args.database_url}, os.environ)
        action = {"stats": _stats, "compact": _compact, "backup": _backup, "restore": _restore, "copy": _copy}[
            args.action
        ]
        return action(args, settings)
    except ValueError as exc:
        print(f"stepwatch db {args.action}: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"stepwatch db {args.action}: {exc}", file=sys.stderr)
        return 1


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _stats(args: argparse.Namespace, settings: Any) -> int:
    from ..server.store.maintenance import postgres_stats, sqlite_stats

    url = settings.postgres_url()
    found = sqlite_stats(settings.database_path()) if url is None else postgres_stats(url, settings.database_shown())
    if args.output == "json":
        print(json.dumps(found.to_dict(), indent=2))
        return 0
    print(f"database: {found.where} ({found.backend}), {_size(found.bytes)}")
    note = (
        "" if found.schema_version == found.code_schema_version else f" (this stepwatch: {found.code_schema_version})"
    )
    print(f"schema version: {found.schema_version}{note}")
    print()
    print(plain_table(["TABLE", "ROWS", "BYTES"], [[t.name, f"{t.rows:,}", _size(t.bytes)] for t in found.tables]))
    if found.namespaces:
        print()
        rows = [
            [n.namespace, f"{n.jobs:,}", f"{n.windows:,}", f"{n.rollups:,}", f"{n.reports:,}", "~" + _size(n.bytes)]
            for n in found.namespaces
        ]
        print(plain_table(["NAMESPACE", "JOBS", "WINDOWS", "ROLL-UPS", "REPORTS", "BYTES"], rows))
    return 0


def _compact(args: argparse.Namespace, settings: Any) -> int:
    from ..server.app import open_store
    from ..server.settings import SERVER_SETTINGS
    from ..server.store.retention_task import DAY_S, PASS_BUDGET, Compaction

    days = args.days if args.days is not None else settings.retention_days
    if days is not None and not (math.isfinite(days) and days > 0):
        raise ValueError(f"--days is a number of days above 0, got {days}")
    quotas = settings.quota_points
    if args.quota is not None:
        quotas = next(s for s in SERVER_SETTINGS if s.name == "quota_points").parse(args.quota)
    if days is None and not quotas and not args.all:
        raise ValueError("nothing to compact by: give --days, --quota or --all (or set STEPWATCH_RETENTION_DAYS)")
    before = math.inf if args.all else (None if days is None else time.time() - days * DAY_S)
    store = open_store(settings)
    total = Compaction()
    started = time.monotonic()
    shown = False
    try:
        while True:
            done = store.compact(before, quotas, PASS_BUDGET)
            total.add(done)
            if not done.more:
                break
            if sys.stderr.isatty() or time.monotonic() - started > 2:  # progress on long work
                print(
                    f"\rcompacting: {total.windows:,} windows, {total.rollups:,} roll-up rows, "
                    f"{total.reports:,} reports so far ({time.monotonic() - started:.0f} s)",
                    end="",
                    file=sys.stderr,
                    flush=True,
                )
                shown = True
    finally:
        store.close()
    if shown:
        print(file=sys.stderr)
    print(
        f"compacted {total.windows:,} windows, {total.rollups:,} roll-up rows and {total.reports:,} reports "
        f"in {total.series:,} series ({time.monotonic() - started:.1f} s)"
    )
    if total.namespaces_over_quota:
        print(f"over quota: {', '.join(total.namespaces_over_quota)}")
    return 0


def _progress(verb: str) -> Any:
    def show(left: int, total: int) -> None:
        if total > 4096 or sys.stderr.isatty():
            print(f"\r{verb}: {100 * (total - left) // max(total, 1)} %", end="", file=sys.stderr, flush=True)
            if left == 0:
                print(file=sys.stderr)

    return show


def _backup(args: argparse.Namespace, settings: Any) -> int:
    from ..server.store.maintenance import backup_sqlite, pg_dump_commands

    url = settings.postgres_url()
    if url is not None:
        dump, restore = pg_dump_commands(url, args.file)
        print("PostgreSQL is backed up with pg_dump (a consistent snapshot while the server runs); run:")
        print(f"  {dump}")
        print("and to restore it into an empty database:")
        print(f"  {restore}")
        return 0
    path = settings.database_path()
    written = backup_sqlite(path, args.file, _progress("backing up"), force=args.force)
    print(f"backed up {path} to {args.file} ({_size(written)})")
    return 0


def _restore(args: argparse.Namespace, settings: Any) -> int:
    from ..server.store import SQLiteStore
    from ..server.store.maintenance import restore_sqlite

    if settings.postgres_url() is not None:
        raise ValueError("restore a PostgreSQL backup with pg_restore (see `stepwatch db backup`)")
    path = settings.database_path()
    version = restore_sqlite(args.file, path, _progress("restoring"), force=args.force)
    SQLiteStore(path).close()  # brings an older backup to this stepwatch's schema
    print(f"restored {args.file} into {path} (schema version {version}, upgraded if older)")
    return 0


def _copy(args: argparse.Namespace, settings: Any) -> int:
    from ..server.store.copy import copy_database, open_database

    if args.source == args.target:
        raise ValueError("SOURCE and TARGET are the same database")
    source = open_database(args.source, must_exist=True)
    try:
        target = open_database(args.target)
    except BaseException:
        source.close()
        raise
    shown = [False]
    stages: dict[str, tuple[float, int]] = {}  # each stage's start: its time and its rows done then

    def progress(what: str, done: int, total: int) -> None:
        if total > 4096 or sys.stderr.isatty():
            if not shown[0]:  # (not before the target is found fit: a refusal is one line)
                print(
                    f"copying {source.shown} ({source.dialect}) into {target.shown} ({target.dialect})", file=sys.stderr
                )
            elif what not in stages:
                print(file=sys.stderr)  # the last stage's line stays, with its final figure
            since, first = stages.setdefault(what, (time.monotonic(), done))
            rate = (done - first) / max(time.monotonic() - since, 1e-3)
            print(
                f"\r{what}: {100 * done // max(total, 1)} % ({done:,} of {total:,} rows, {rate:,.0f}/s)   ",
                end="",
                file=sys.stderr,
                flush=True,
            )
            shown[0] = True

    try:
        report = copy_database(source, target, resume=args.resume, progress=progress)
    finally:
        source.close()
        target.close()
    if shown[0]:
        print(file=sys.stderr)
    rows = [[t.name, f"{t.source_rows:,}", f"{t.copied:,}", f"{t.target_rows:,}"] for t in report.tables]
    print(plain_table(["TABLE", "SOURCE ROWS", "COPIED NOW", "TARGET ROWS"], rows))
    if not report.verified:
        for t in report.tables:
            for problem in t.mismatches[:3]:
                print(f"differs: {problem}", file=sys.stderr)
        print("stepwatch db copy: the target does not match the source (see above)", file=sys.stderr)
        return 1
    print(f"verified: {report.rows:,} rows in {len(report.tables)} tables match, row for row ({report.seconds:.1f} s)")
    return 0
