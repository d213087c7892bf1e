"""What ``stepwatch top`` shows: a job's row (cells fitted to the terminal's width), the order and filter of
the rows, and the text of a job's screen. Plain functions of client ``Job`` s: no Textual here, so they are
tested and reused without it (:mod:`._top_app` draws them)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._format import NO_RATE, clock_time, duration, evidence_lines, printable
from ._format import fit_columns as fit_table

if TYPE_CHECKING:
    from ..client import Job

__all__ = [
    "COLUMNS",
    "NARROW",
    "PRIORITY",
    "SORTS",
    "bar",
    "fit_columns",
    "job_cells",
    "job_details",
    "visible_jobs",
]

COLUMNS = ("NAME", "NAMESPACE", "STATE", "HEALTH", "PROGRESS", "STEP", "ETA", "LOSS", "$/H", "SPENT", "GPUS")
PRIORITY = ("NAME", "PROGRESS", "ETA", "LOSS", "STATE", "HEALTH", "STEP", "SPENT", "NAMESPACE", "$/H", "GPUS")
"""The columns a narrow terminal keeps, most needed first: an 80-column terminal still shows ETA and loss."""
NARROW = 120
"""Below this many columns the progress bar is half as long and long names are cut."""
SORTS = ("name", "progress", "eta", "health", "spent", "state")
"""What ``s`` cycles through."""
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


def shown_loss(job: Job) -> float | None:
    """The loss a row shows: the mean of its latest window where the server sends one, else the last value."""
    return job.loss_mean


def rate_words(job: Job) -> str:
    """Steps per second, or ``—`` with since when the job stands (stalled) or that it ended: no live rate."""
    rate = job.progress.steps_per_second
    if rate is not None:
        return f"{_number(rate)} steps/s"
    if job.ended:
        return f"{NO_RATE} steps/s (ended)"
    if job.health.state == "stalled":
        return f"{NO_RATE} steps/s (stalled since {clock_time(job.health.since)})"
    return "- steps/s"


def job_cells(job: Job, width: int = NARROW) -> list[tuple[str, str]]:
    """The cells of a job's row, each ``(text, rich style)``, for a terminal ``width`` columns wide."""
    p = job.progress
    step = "-" if p.step is None else (f"{p.step}/{p.total_steps}" if p.total_steps else str(p.step))
    loss = _number(shown_loss(job))
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
        (_money(job.cost.rate_per_hour) if not job.ended else NO_RATE, ""),
        (_money(job.cost.spent), ""),
        (f"{job.resources.gpus:g}" if job.resources.gpus else "-", ""),
    ]


def fit_columns(rows: Sequence[Sequence[str]], width: int, padding: int = 2) -> list[str]:
    """The columns that fit in ``width`` terminal cells, in table order: taken in ``PRIORITY`` order up to the
    first that does not fit (each as wide as its header or its widest cell, plus ``padding``): the one
    width-aware rule of ``jobs``, ``watch`` and ``top`` (:func:`._format.fit_columns`)."""
    keep = fit_table(COLUMNS, rows, width - padding, PRIORITY, gap=padding)  # n columns: n paddings, n - 1 gaps
    return [COLUMNS[i] for i in keep]


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


def job_details(job: Job, events: Sequence[Any]) -> str:
    """The text of the job screen (rich markup, every job string escaped)."""
    from rich.markup import escape as escape_markup

    def escape(text: str) -> str:  # markup and control characters alike are shown as text
        return escape_markup(printable(text))

    p, e, c, h = job.progress, job.eta, job.cost, job.health
    lines = [
        f"[b]{escape(job.key)}[/b]  attempt {job.attempt}  [{_STATE_STYLE.get(job.state, '')}]{job.state}[/]",
        f"progress  {bar(p.percent, 30)}",
        f"step      {p.step if p.step is not None else '-'} / {p.total_steps or '-'}"
        f"   epoch {_number(p.epoch)} / {_number(p.total_epochs)}   {rate_words(job)}",
        f"ETA       {duration(e.remaining_seconds)}"
        + (f"  (finishes {time.strftime('%a %H:%M', time.localtime(e.finish_time))})" if e.finish_time else ""),
        f"health    [{_HEALTH_STYLE.get(h.state, '')}]{h.state}[/]  {escape(h.message)}",
    ]
    # a verdict to act on gets its evidence, labelled as `describe` and the dashboard label it (the rank, where
    # it stands, the straggler's host and shares, in words)
    if h.state not in ("healthy", "unknown"):
        lines += [f"          [dim]{escape(label)}:[/dim] {escape(text)}" for label, text in evidence_lines(h.evidence)]
    lines += [
        f"cost      {_money(c.rate_per_hour) if c.rate_per_hour is not None else NO_RATE} {c.currency}/h"
        f"  spent {_money(c.spent)}  projected "
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
