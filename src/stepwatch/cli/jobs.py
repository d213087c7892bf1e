"""``stepwatch jobs``: every job's progress, ETA and loss as a table (``kubectl get`` style), once or live."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ._errors import INTERRUPTED
from ._format import (
    Cell,
    add_server_flags,
    age,
    clock_time,
    cost_text,
    epoch_text,
    eta_text,
    fitted,
    health_cell,
    is_terminal,
    loss_text,
    missing_client,
    plain_table,
    print_table,
    progress_text,
    rate_words,
    rich_table,
    state_style,
    step_text,
    terminal_width,
    unreachable,
    view_loss,
)

if TYPE_CHECKING:
    import threading

    from ..client import Client

__all__ = ["HEADERS", "PRIORITY", "WIDE_HEADERS", "job_row", "register", "run", "sort_jobs", "watch_table"]

HEADERS = ("NAME", "NAMESPACE", "STATE", "HEALTH", "PROGRESS%", "STEP", "EPOCH", "ETA", "LOSS", "COST", "AGE")
WIDE_HEADERS = (*HEADERS, "ATTEMPT", "STEPS/S", "FINISH", "LAST REPORT")
PRIORITY = ("NAME", "STATE", "PROGRESS%", "HEALTH", "ETA", "LOSS", "STEP", "COST", "NAMESPACE", "AGE", "EPOCH",
            "STEPS/S", "ATTEMPT", "FINISH", "LAST REPORT")  # fmt: skip
"""The columns a narrow terminal keeps, most needed first (a column is dropped whole, never cut): at 80 columns
a job's name, state, progress, health, ETA and loss."""
WIDE_PRIORITY = ("NAME", "STATE", "PROGRESS%", "HEALTH", "ETA", "LOSS", "STEPS/S", "STEP", "LAST REPORT", "FINISH",
                 "COST", "ATTEMPT", "NAMESPACE", "AGE", "EPOCH")  # fmt: skip
"""``-o wide``: what it adds comes before the rest of the default columns."""
REDRAW_EVERY_S = 1.0
"""When piped, a new table at most this often; on a terminal, ages and ETAs tick this often."""

_Key = tuple[str, str]


def register(commands: Any) -> None:
    """Add the ``jobs`` command."""
    parser = commands.add_parser(
        "jobs",
        help="list jobs with health, progress, step, epoch, ETA, loss and cost",
        description=(
            "List jobs (their latest attempts) with health, progress, step, epoch, ETA, loss, cost and age. "
            "With --watch the table is redrawn on every change until Ctrl-C."
        ),
    )
    add_server_flags(parser)
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="jobs of every namespace")
    parser.add_argument("--state", metavar="S", help="only jobs in these states (comma-separated: running,pending...)")
    parser.add_argument(
        "--sort",
        metavar="KEY",
        help="name, namespace, state, progress, step, created, updated or eta; -KEY for descending "
        "(write --sort=-KEY); default: namespace, then name",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("wide", "json"),
        help="wide: also attempt, steps/s, finish time, last report; json: the API's job objects "
        "(with --watch: one object per line and change)",
    )
    parser.add_argument("-w", "--watch", action="store_true", help="redraw on every change until Ctrl-C")
    parser.set_defaults(run=run)


# ----------------------------------------------------------------------------------- rows


def job_row(view: dict[str, Any], *, wide: bool = False, now: float | None = None, since: float = 0.0) -> list[Any]:
    """The cells of a job; ``since`` is how many seconds ago the view was read (ETA and ages move on)."""
    now = time.time() if now is None else now
    progress = view.get("progress") or {}
    eta = view.get("eta") or {}
    times = view.get("times") or {}
    remaining = eta.get("remaining_seconds")
    if remaining is not None:
        remaining = max(remaining - since, 0.0)
    shown_loss = loss_text(view_loss(view))
    state = view.get("state", "")
    row: list[Any] = [
        view["name"],
        view["namespace"],
        Cell(state, state_style(state)),
        health_cell(view),
        progress_text(view),
        step_text(progress),
        epoch_text(progress),
        eta_text(remaining, eta.get("source")),
        Cell(shown_loss, "bold red" if shown_loss in ("NaN", "Inf", "-Inf") else ""),
        cost_text(view, since),
        age(times.get("created"), now),
    ]
    if wide:
        report_age = times.get("report_age_seconds")
        row += [
            str(view.get("attempt", "-")),
            rate_words(view),
            clock_time(eta.get("finish_time"), now),
            eta_text(report_age + since if report_age is not None else None),
        ]
    return row


def sort_jobs(views: Sequence[dict[str, Any]], key: str | None) -> list[dict[str, Any]]:
    """Sort as the server does for ``key`` (``-key`` descending; unknown values last); default namespace, name."""
    if not key:
        return sorted(views, key=lambda v: (v["namespace"], v["name"]))
    descending = key.startswith("-")
    getter = _SORT_VALUES.get(key.removeprefix("-"), _SORT_VALUES["name"])
    known = [v for v in views if getter(v) is not None]
    unknown = [v for v in views if getter(v) is None]
    known.sort(key=lambda v: (getter(v), v["namespace"], v["name"]), reverse=descending)
    return known + unknown


_SORT_VALUES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "name": lambda v: v["name"],
    "namespace": lambda v: v["namespace"],
    "state": lambda v: v["state"],
    "progress": lambda v: (v.get("progress") or {}).get("percent"),
    "step": lambda v: (v.get("progress") or {}).get("step"),
    "created": lambda v: (v.get("times") or {}).get("created"),
    "updated": lambda v: (v.get("times") or {}).get("updated"),
    "eta": lambda v: (v.get("eta") or {}).get("remaining_seconds"),
}


# ------------------------------------------------------------------------------------ command


def run(args: argparse.Namespace) -> int:
    """List the jobs once, or follow them with ``--watch``."""
    try:
        from ..client import ApiError, Client, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("jobs", exc)
    url = server_url(args.server)
    namespace = None if args.all_namespaces else args.namespace
    with Client(url, args.token) as client:
        try:
            views = _list(client, namespace, args.state, args.sort)
            if args.watch:
                watch_table(client, namespace, args, views, sys.stdout)
                return 0
            if args.output == "json":
                print(json.dumps(views, indent=2))
            elif not views:
                where = "any namespace" if namespace is None else f"namespace {namespace}"
                state = f" {args.state}" if args.state else ""
                print(f"no{state} jobs in {where} at {url}", file=sys.stderr)
            else:
                wide = args.output == "wide"
                rows = [job_row(v, wide=wide) for v in views]
                print_table(WIDE_HEADERS if wide else HEADERS, rows, priority=WIDE_PRIORITY if wide else PRIORITY)
        except ServerUnreachable:
            print(unreachable(url), file=sys.stderr)
            return 1
        except ApiError as exc:
            print(f"stepwatch jobs: {exc.message}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:  # Ctrl-C ends --watch: 130, as for every command a signal interrupted
            return INTERRUPTED
    return 0


def _list(client: Client, namespace: str | None, state: str | None, sort: str | None) -> list[dict[str, Any]]:
    return sort_jobs([job.raw for job in client.jobs(namespace, state=state, sort=sort or "name")], sort)


def watch_table(
    client: Client,
    namespace: str | None,
    args: argparse.Namespace,
    views: list[dict[str, Any]],
    out: TextIO,
    stop: threading.Event | None = None,
) -> None:
    """Redraw the table on every job update of the live stream until Ctrl-C (or ``stop`` is set).

    On a terminal a rich Live table changes in place (and its ages and ETAs tick every second); piped,
    a new plain table follows the last one at most every :data:`REDRAW_EVERY_S` seconds, and only when
    something changed. ``-o json`` prints one job object per line: the current ones, then each change.
    """
    from .watch import Feed

    board = _Board(views, args)
    as_json = args.output == "json"
    feed = Feed(client.url, namespace=namespace, token=client.token).start()
    live: Any = None
    if is_terminal(out) and not as_json:
        try:
            from rich.console import Console
            from rich.live import Live
        except ImportError:
            pass
        else:
            live = Live(rich_table(*board.table(out)), console=Console(file=out), auto_refresh=False)
    try:
        if live is not None:
            live.start()
        elif as_json:
            for view in board.views():
                print(json.dumps(view), file=out, flush=True)
        else:
            print(plain_table(*board.table()), file=out, flush=True)
        drawn = time.monotonic()
        dirty = False
        while stop is None or not stop.is_set():
            item = feed.get(timeout=0.2)
            if item is not None:
                kind, data = item
                if kind == "job" and board.take(data["job"]):
                    dirty = True
                    if as_json:
                        print(json.dumps(data["job"]), file=out, flush=True)
                elif kind == "resync":
                    dirty = _relist(client, namespace, args, board)
            due = time.monotonic() - drawn >= REDRAW_EVERY_S
            if live is not None and (dirty or due):
                live.update(rich_table(*board.table(out)), refresh=True)
                drawn, dirty = time.monotonic(), False
            elif dirty and due and not as_json:
                print(file=out)
                print(plain_table(*board.table(out)), file=out, flush=True)
                drawn, dirty = time.monotonic(), False
    finally:
        feed.close()
        if live is not None:
            live.stop()


def _relist(client: Client, namespace: str | None, args: argparse.Namespace, board: _Board) -> bool:
    """Read every job again after updates were missed; keep the table as it is while the server is away."""
    from ..client import ServerUnreachable

    try:
        board.reset(_list(client, namespace, args.state, args.sort))
    except ServerUnreachable:
        print(f"stepwatch jobs: lost the server at {client.url}; retrying", file=sys.stderr)
        return False
    return True


class _Board:
    """The jobs on screen, each with the (wall) time its view was read."""

    def __init__(self, views: list[dict[str, Any]], args: argparse.Namespace) -> None:
        self._states = set(args.state.split(",")) if args.state else None
        self._sort: str | None = args.sort
        self._wide = args.output == "wide"
        self._jobs: dict[_Key, tuple[dict[str, Any], float]] = {}
        self.reset(views)

    def reset(self, views: list[dict[str, Any]]) -> None:
        """Start again from a fresh listing."""
        now = time.time()
        self._jobs = {(v["namespace"], v["name"]): (v, now) for v in views}

    def views(self) -> list[dict[str, Any]]:
        """The jobs, in table order."""
        return sort_jobs([view for view, _ in self._jobs.values()], self._sort)

    def take(self, view: dict[str, Any]) -> bool:
        """Apply an update; whether the table changed."""
        key = (view["namespace"], view["name"])
        held = self._jobs.get(key)
        if held is not None and view.get("attempt", 0) < held[0].get("attempt", 0):
            return False  # an update of an earlier attempt: the table shows the latest
        if self._states is not None and view["state"] not in self._states:
            return self._jobs.pop(key, None) is not None
        self._jobs[key] = (view, time.time())
        return True

    def table(self, out: TextIO | None = None) -> tuple[Sequence[str], list[list[Any]]]:
        """Headers and rows, with ETAs and ages moved on to now, the columns that fit ``out``'s width."""
        now = time.time()
        rows = [
            job_row(v, wide=self._wide, now=now, since=now - self._jobs[(v["namespace"], v["name"])][1])
            for v in self.views()
        ]
        if self._wide:
            return fitted(WIDE_HEADERS, rows, terminal_width(out), WIDE_PRIORITY)
        return fitted(HEADERS, rows, terminal_width(out), PRIORITY)
