"""``stepwatch top``: every job live in a full-screen terminal view (``pip install 'stepwatch[tui]'``).

A table of jobs (progress bar, health, step, ETA, loss, cost, GPUs), redrawn as the server's live stream
says jobs changed. Keys: ``s`` sort by the next column, ``r`` reverse, ``/`` filter (name, namespace,
state or health), ``enter`` open the job (details, health evidence, cost, recent events), ``x`` stop the
job under the cursor (after a checkpoint; asks first), ``c`` checkpoint it, ``q`` quit.

Built with Textual: a real widget toolkit (a scrolling table with a cursor, modal screens, key
bindings, a headless test pilot) rather than rich's ``Live``, which redraws a renderable but has no
input, focus or screens: sorting, filtering, opening and stopping jobs need those. Textual is imported
only when the command runs, so ``stepwatch --help`` stays fast and the other commands do not need it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._format import add_server_flags, duration, printable, unreachable

if TYPE_CHECKING:
    from ..client import Client, Job

__all__ = [
    "COLUMNS",
    "PRIORITY",
    "SORTS",
    "TUI_HINT",
    "bar",
    "fit_columns",
    "job_cells",
    "make_app",
    "register",
    "run",
    "visible_jobs",
]

TUI_HINT = "pip install 'stepwatch[tui]'"
COLUMNS = ("NAME", "NAMESPACE", "STATE", "HEALTH", "PROGRESS", "STEP", "ETA", "LOSS", "$/H", "SPENT", "GPUS")
PRIORITY = ("NAME", "PROGRESS", "ETA", "LOSS", "STATE", "HEALTH", "STEP", "SPENT", "NAMESPACE", "$/H", "GPUS")
"""The columns a narrow terminal keeps, most needed first: an 80-column terminal still shows ETA and loss."""
NARROW = 120
"""Below this many columns the progress bar is half as long and long names are cut."""
SORTS = ("name", "progress", "eta", "health", "spent", "state")
"""What ``s`` cycles through."""
FOLLOW_SLICE_S = 2.0
"""The live view reads the stream in watches this long, each resuming the last (see ``follow``)."""
_HEALTH_ORDER = {"diverging": 0, "stalled": 1, "not_learning": 2, "straggling": 3, "unknown": 4, "healthy": 5}
_HEALTH_STYLE = {
    "healthy": "green",
    "diverging": "bold red",
    "stalled": "yellow",
    "not_learning": "yellow",
    "straggling": "yellow",
    "unknown": "dim",
}
_STATE_STYLE = {"running": "cyan", "finished": "green", "failed": "bold red", "stopped": "yellow", "pending": "dim"}


def register(commands: Any) -> None:
    """Add the ``top`` command."""
    parser = commands.add_parser(
        "top",
        help="a live full-screen view of every job (sort, filter, open, stop)",
        description=(
            "Every job live: progress, health, ETA, loss and cost, redrawn as jobs report. Keys: s sort, r reverse, "
            "/ filter, enter open a job, x stop it (after a checkpoint), c checkpoint it, q quit."
        ),
    )
    add_server_flags(parser)
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="jobs of every namespace")
    parser.add_argument("--sort", choices=SORTS, default="name", help="the first sort (s cycles)")
    parser.add_argument("--filter", default="", metavar="TEXT", help="show only jobs whose name, state... has TEXT")
    parser.set_defaults(run=run)


# ------------------------------------------------------------------------- what the table shows


def bar(percent: float | None, width: int = 12) -> str:
    """``██████░░░░░░  50.0%``; blank with ``-`` when unknown."""
    if percent is None or not math.isfinite(percent):
        return " " * width + "     -"
    filled = round(max(0.0, min(100.0, percent)) / 100 * width)
    return "█" * filled + "░" * (width - filled) + f" {percent:5.1f}%"


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Inf" if value > 0 else "-Inf")
    return f"{value:.4g}"


def job_cells(job: Job, width: int = NARROW) -> list[tuple[str, str]]:
    """The cells of a job's row, each ``(text, rich style)``, for a terminal ``width`` columns wide."""
    p = job.progress
    step = "-" if p.step is None else (f"{p.step}/{p.total_steps}" if p.total_steps else str(p.step))
    loss = _number(job.loss)
    narrow = width < NARROW
    name = job.name if not narrow or len(job.name) <= 24 else job.name[:23] + "…"
    bar_style = _HEALTH_STYLE.get(job.health.state, "") if job.health.state != "unknown" else "cyan"
    return [
        (name, "bold"),
        (job.namespace, ""),
        (job.state, _STATE_STYLE.get(job.state, "")),
        (job.health.state, _HEALTH_STYLE.get(job.health.state, "")),
        (bar(p.percent, 6 if narrow else 12), bar_style),
        (step, ""),
        (duration(job.eta.remaining_seconds) if not job.ended else "-", ""),
        (loss, "bold red" if loss in ("NaN", "Inf", "-Inf") else ""),
        (_money(job.cost.rate_per_hour), ""),
        (_money(job.cost.spent), ""),
        (f"{job.resources.gpus:g}" if job.resources.gpus else "-", ""),
    ]


def fit_columns(rows: Sequence[Sequence[str]], width: int, padding: int = 2) -> list[str]:
    """The columns that fit in ``width`` terminal cells, in table order: taken in ``PRIORITY`` order up to the
    first that does not fit (each as wide as its header or its widest cell, plus ``padding``)."""
    need = {column: max([len(column), *(len(row[i]) for row in rows)]) + padding for i, column in enumerate(COLUMNS)}
    chosen: set[str] = set()
    used = 0
    for column in PRIORITY:
        if used + need[column] > width:
            break
        chosen.add(column)
        used += need[column]
    return [column for column in COLUMNS if column in chosen]


def _sort_key(job: Job, key: str) -> tuple[Any, ...]:
    unknown = math.inf
    if key == "progress":
        return (job.progress.percent if job.progress.percent is not None else -1.0, job.key)
    if key == "eta":
        eta = job.eta.remaining_seconds
        return (eta if eta is not None and not job.ended else unknown, job.key)
    if key == "health":
        return (_HEALTH_ORDER.get(job.health.state, 9), job.key)
    if key == "spent":
        return (job.cost.spent if job.cost.spent is not None else -1.0, job.key)
    if key == "state":
        return (job.state, job.key)
    return (job.namespace, job.name)


def visible_jobs(jobs: Iterable[Job], sort: str = "name", reverse: bool = False, text: str = "") -> list[Job]:
    """The jobs to show: those whose namespace, name, state or health contains ``text``, sorted."""
    needle = text.strip().lower()
    chosen = [
        j
        for j in jobs
        if not needle or any(needle in field for field in (j.namespace, j.name, j.state, j.health.state))
    ]
    return sorted(chosen, key=lambda j: _sort_key(j, sort), reverse=reverse)


def _details(job: Job, events: Sequence[Any]) -> str:
    """The text of the job screen (rich markup, every job string escaped)."""
    from rich.markup import escape as escape_markup

    def escape(text: str) -> str:  # markup and control characters alike are shown as text
        return escape_markup(printable(text))

    p, e, c, h = job.progress, job.eta, job.cost, job.health
    lines = [
        f"[b]{escape(job.key)}[/b]  attempt {job.attempt}  [{_STATE_STYLE.get(job.state, '')}]{job.state}[/]",
        f"progress  {bar(p.percent, 30)}",
        f"step      {p.step if p.step is not None else '-'} / {p.total_steps or '-'}"
        f"   epoch {_number(p.epoch)} / {_number(p.total_epochs)}   {_number(p.steps_per_second)} steps/s",
        f"ETA       {duration(e.remaining_seconds)}"
        + (f"  (finishes {time.strftime('%a %H:%M', time.localtime(e.finish_time))})" if e.finish_time else ""),
        f"health    [{_HEALTH_STYLE.get(h.state, '')}]{h.state}[/]  {escape(h.message)}",
        f"cost      {_money(c.rate_per_hour)} {c.currency}/h  spent {_money(c.spent)}  projected "
        f"{_money(c.projected)}  wasted {_money(c.wasted)}  saved {_money(c.saved)}",
        f"GPUs      {job.resources.gpus:g} {escape(job.resources.gpu_type or '')}",
    ]
    if job.reason:
        lines.append(f"reason    {escape(job.reason)}")
    metrics = sorted(job.metrics.items())
    if metrics:
        lines.append("")
        lines.append("[b]metrics[/b]")
        lines += [f"  {escape(name):<28} {_number(value)}" for name, value in metrics[:24]]
    if events:
        lines.append("")
        lines.append("[b]recent events[/b]")
        for event in list(events)[-12:]:
            when = time.strftime("%H:%M:%S", time.localtime(event.t)) if event.t else "--:--:--"
            lines.append(f"  {when} {escape(event.kind):<12} {escape(event.message)}")
    lines.append("")
    lines.append("[dim]x stop (after a checkpoint)   c checkpoint   escape back[/dim]")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- the app


def make_app(client: Client, namespace: str | None, sort: str = "name", text: str = "") -> Any:
    """The Textual app of ``stepwatch top`` on ``client`` (``namespace`` ``None``: every namespace)."""
    from rich.text import Text
    from textual import work
    from textual.app import App, ComposeResult
    from textual.binding import Binding
    from textual.containers import Vertical, VerticalScroll
    from textual.screen import ModalScreen
    from textual.widgets import DataTable, Footer, Header, Input, Static
    from textual.worker import get_current_worker

    from ..client import JobUpdate, Resync, StepwatchError

    class Confirm(ModalScreen[bool]):
        """Yes or no."""

        BINDINGS = [Binding("y", "answer(True)", "yes"), Binding("n,escape", "answer(False)", "no")]
        DEFAULT_CSS = "Confirm { align: center middle; } #ask { width: 70; border: thick $warning; padding: 1 2; }"

        def __init__(self, question: str) -> None:
            super().__init__()
            self.question = question

        def compose(self) -> ComposeResult:
            yield Static(Text(self.question + "  [y/n]"), id="ask")

        def action_answer(self, yes: bool) -> None:
            self.dismiss(yes)

    class JobScreen(ModalScreen[None]):
        """One job in full."""

        BINDINGS = [
            Binding("escape,enter,q", "app.pop_screen", "back"),
            Binding("x", "app.stop_job", "stop"),
            Binding("c", "app.checkpoint_job", "checkpoint"),
        ]
        DEFAULT_CSS = "JobScreen { align: center middle; } #job { width: 100; height: 90%; border: thick $accent; }"

        def __init__(self, job: Job, body: str) -> None:
            super().__init__()
            self.job = job
            self.body = body

        def compose(self) -> ComposeResult:
            with VerticalScroll(id="job"):
                yield Static(self.body, id="details")

    class Top(App[None]):
        """Every job, live."""

        TITLE = "stepwatch top"
        BINDINGS = [
            Binding("q", "quit", "quit"),
            Binding("s", "next_sort", "sort"),
            Binding("r", "reverse", "reverse"),
            Binding("slash", "filter", "filter"),
            Binding("enter", "open_job", "open", priority=True),
            Binding("x", "stop_job", "stop"),
            Binding("c", "checkpoint_job", "checkpoint"),
            Binding("escape", "clear_filter", "clear filter", show=False),
        ]
        DEFAULT_CSS = "#filter { display: none; } #filter.shown { display: block; } #status { height: 1; }"

        def __init__(self) -> None:
            super().__init__()
            self.client = client
            self.namespace = namespace
            self.sort = sort
            self.reverse = False
            self.text = text
            self.jobs: dict[tuple[str, str], Job] = {}
            self.dirty = True
            self.status = ""
            self.summary = ""
            self.message = ""
            self.shown: list[Job] = []
            self.columns: list[str] = []

        def compose(self) -> ComposeResult:
            yield Header()
            with Vertical():
                yield DataTable(id="jobs", cursor_type="row", zebra_stripes=True)
                yield Input(placeholder="filter: name, namespace, state or health", id="filter")
                yield Static("", id="status")
            yield Footer()

        def on_mount(self) -> None:
            self.sub_title = f"{client.url} · {'every namespace' if namespace is None else namespace}"
            self.reload()
            self.follow()
            self.set_interval(0.25, self.redraw)

        # ------------------------------------------------------------------------- data

        @work(thread=True, group="reload")
        def reload(self) -> None:
            """Read every job (at the start, and when the stream says updates were missed)."""
            try:
                jobs = self.client.jobs(self.namespace, limit=10_000)
            except StepwatchError as exc:
                self.call_from_thread(self.say, f"cannot list the jobs: {exc}")
                return
            self.call_from_thread(self.take_all, list(jobs))

        @work(thread=True, group="follow")
        def follow(self) -> None:
            """The live stream, for as long as the app runs (it reconnects by itself).

            Read in short watches that resume one another (no update is lost between them): a thread
            blocked in a read cannot be cancelled, so each read is bounded and the worker sees, within
            ``FOLLOW_SLICE_S``, that the app has quit.
            """
            worker = get_current_worker()
            last: int | None = None
            try:
                while not worker.is_cancelled:
                    for update in self.client.watch(None, self.namespace, last_event_id=last, timeout=FOLLOW_SLICE_S):
                        last = update.id if update.id is not None else last
                        if isinstance(update, Resync):
                            self.call_from_thread(self.reload)
                        elif isinstance(update, JobUpdate):
                            self.call_from_thread(self.take, update.job)
            except StepwatchError as exc:
                self.call_from_thread(self.say, f"the live stream ended: {exc}")

        def take_all(self, jobs: list[Job]) -> None:
            self.jobs = {(j.namespace, j.name): j for j in jobs}
            self.dirty = True

        def take(self, job: Job) -> None:
            held = self.jobs.get((job.namespace, job.name))
            if held is not None and job.attempt < held.attempt:
                return
            self.jobs[(job.namespace, job.name)] = job
            self.dirty = True

        def say(self, text: str) -> None:
            """Show a message in the status line; it stays there, after the job count, until the next one."""
            self.message = text
            self.show_status()

        def show_status(self) -> None:
            self.status = "  ·  ".join(part for part in (self.summary, self.message) if part)
            self.query_one("#status", Static).update(Text(self.status))

        def on_resize(self) -> None:
            self.dirty = True

        def redraw(self) -> None:
            if not self.dirty:
                return
            self.dirty = False
            table = self.query_one(DataTable)
            current = self.selected()
            self.shown = visible_jobs(self.jobs.values(), self.sort, self.reverse, self.text)
            width = self.size.width - 2  # the table's vertical scroll bar
            rows = [job_cells(job, width) for job in self.shown]
            columns = fit_columns([[text for text, _ in cells] for cells in rows], width)
            if columns != self.columns:
                table.clear(columns=True)
                for column in columns:
                    table.add_column(column, key=column)
                self.columns = columns
            else:
                table.clear()
            keep = [COLUMNS.index(column) for column in columns]
            for job, cells in zip(self.shown, rows):
                table.add_row(*(Text(cells[i][0], style=cells[i][1]) for i in keep), key=job.key)
            if current is not None and any(j.key == current.key for j in self.shown):
                table.move_cursor(row=table.get_row_index(current.key))
            order = f"sorted by {self.sort}{' (reversed)' if self.reverse else ''}"
            shown = f"{len(self.shown)} of {len(self.jobs)} jobs" if self.text else f"{len(self.jobs)} jobs"
            self.summary = f"{shown}, {order}" + (f", filter {self.text!r}" if self.text else "")
            self.show_status()

        def selected(self) -> Job | None:
            table = self.query_one(DataTable)
            if not self.shown or table.cursor_row is None or not 0 <= table.cursor_row < len(self.shown):
                return None
            return self.shown[table.cursor_row]

        # ---------------------------------------------------------------------- actions

        def action_next_sort(self) -> None:
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
            self.dirty = True
            self.redraw()

        def action_reverse(self) -> None:
            self.reverse = not self.reverse
            self.dirty = True
            self.redraw()

        def action_filter(self) -> None:
            box = self.query_one("#filter", Input)
            box.add_class("shown")
            box.value = self.text
            box.focus()

        def on_input_changed(self, event: Input.Changed) -> None:
            self.text = event.value
            self.dirty = True
            self.redraw()

        def on_input_submitted(self, event: Input.Submitted) -> None:
            self.query_one(DataTable).focus()

        def action_clear_filter(self) -> None:
            box = self.query_one("#filter", Input)
            box.remove_class("shown")
            box.value = ""
            self.text = ""
            self.dirty = True
            self.query_one(DataTable).focus()

        def action_open_job(self) -> None:
            if self.focused is not None and isinstance(self.focused, Input):
                self.query_one(DataTable).focus()
                return
            job = self.selected()
            if job is not None:
                self.open_job(job)

        @work(thread=True, group="open")
        def open_job(self, job: Job) -> None:
            try:
                fresh = self.client.job(job.name, job.namespace)
                events = self.client.events(job.name, job.namespace, limit=1000)
            except StepwatchError as exc:
                self.call_from_thread(self.say, f"cannot read {job.key}: {exc}")
                return
            self.call_from_thread(self.push_screen, JobScreen(fresh, _details(fresh, events)))

        def target(self) -> Job | None:
            screen = self.screen
            if isinstance(screen, JobScreen):
                return self.jobs.get((screen.job.namespace, screen.job.name), screen.job)
            return self.selected()

        def action_stop_job(self) -> None:
            job = self.target()
            if job is None or job.ended:
                self.say("nothing to stop here" if job is None else f"{job.key} has already {job.state}")
                return

            def answered(yes: bool | None) -> None:
                if yes:
                    self.command(job, "stop")

            self.push_screen(Confirm(f"Stop {job.key} after a checkpoint?"), answered)

        def action_checkpoint_job(self) -> None:
            job = self.target()
            if job is not None and not job.ended:
                self.command(job, "checkpoint")

        @work(thread=True, group="command")
        def command(self, job: Job, kind: str) -> None:
            try:
                if kind == "stop":
                    sent = self.client.stop(job.name, job.namespace, reason="stepwatch top")
                else:
                    sent = self.client.checkpoint(job.name, job.namespace, reason="stepwatch top")
            except StepwatchError as exc:
                self.call_from_thread(self.say, f"{kind} {job.key}: {exc}")
                return
            said = "a checkpoint, then stop" if kind == "stop" else "a checkpoint"
            self.call_from_thread(self.say, f"asked {job.key} for {said} (command {sent.id})")

    return Top()


def run(args: argparse.Namespace) -> int:
    """Start the full-screen view."""
    try:
        import textual  # noqa: F401
    except ImportError as exc:
        print(f"stepwatch top needs Textual ({exc}): {TUI_HINT}", file=sys.stderr)
        return 1
    from ..client import Client, ServerUnreachable, StepwatchError, server_url

    url = server_url(args.server)
    namespace = None if args.all_namespaces else args.namespace
    with Client(url, args.token) as client:
        try:
            client.ping()
        except ServerUnreachable:
            print(unreachable(url), file=sys.stderr)
            return 1
        except StepwatchError as exc:
            print(f"stepwatch top: {exc}", file=sys.stderr)
            return 1
        make_app(client, namespace, args.sort, args.filter).run()
    return 0
