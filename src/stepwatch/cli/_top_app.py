"""The Textual app of ``stepwatch top``: the job table, a job's screen and a yes-or-no question.

Imported only when the command runs (``top.make_app``): Textual is an extra (``stepwatch[tui]``), and
``stepwatch --help`` stays fast. What the table and the job screen show is :mod:`._top_view`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Header, Input, Static
from textual.worker import get_current_worker

from ..client import Client, Job, JobUpdate, Resync, StepwatchError
from ._top_view import COLUMNS, SORTS, fit_columns, job_cells, job_details, visible_jobs

__all__ = ["FOLLOW_SLICE_S", "Confirm", "JobScreen", "Top"]

FOLLOW_SLICE_S = 2.0
"""The live view reads the stream in watches this long, each resuming the last (see ``Top.follow``)."""


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

    def __init__(self, job: Job, body: str, events: Sequence[Any] = ()) -> None:
        super().__init__()
        self.job = job
        self.body = body
        self.events = list(events)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="job"):
            yield Static(self.body, id="details")

    def refresh_job(self, job: Job) -> None:
        """Show the job as its latest update has it (the pane follows the job, as the rows do)."""
        self.job = job
        self.body = job_details(job, self.events)
        self.query_one("#details", Static).update(self.body)


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

    def __init__(self, client: Client, namespace: str | None, sort: str = "name", text: str = "") -> None:
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
        where = "every namespace" if self.namespace is None else self.namespace
        self.sub_title = f"{self.client.url} · {where}"
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
        screen = self.screen
        if isinstance(screen, JobScreen) and screen.job.key == job.key and job.attempt >= screen.job.attempt:
            screen.refresh_job(job)

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
        self.call_from_thread(self.push_screen, JobScreen(fresh, job_details(fresh, events), events))

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
