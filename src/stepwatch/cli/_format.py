"""What the job commands share: how figures read (durations, percent, ETA, loss, age), the one table
renderer (rich on a terminal, plain aligned text when piped), and the flags and messages about the server.

Standard library only at import: ``rich`` is imported when a table is drawn on a terminal, so that
``stepwatch --help`` stays fast and a missing ``rich`` only costs the colours.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TextIO

from ..protocol import ended_short_text, shown_percent

__all__ = [
    "CLIENT_HINT",
    "END_STATES",
    "NO_RATE",
    "Cell",
    "add_server_flags",
    "add_token_flag",
    "again",
    "age",
    "clock_time",
    "duration",
    "epoch_text",
    "eta_text",
    "evidence_lines",
    "fit_columns",
    "fitted",
    "is_terminal",
    "loss_of",
    "loss_text",
    "missing_client",
    "number",
    "percent",
    "plain_table",
    "print_table",
    "progress_text",
    "rate_phrase",
    "rate_text",
    "rate_words",
    "rich_table",
    "state_style",
    "step_text",
    "terminal_width",
    "unreachable",
    "value_text",
    "view_loss",
    "window_text",
]

CLIENT_HINT = "pip install 'stepwatch[client]'"
END_STATES = frozenset({"finished", "failed", "stopped"})
LOSS_KEYS = ("loss", "train/loss", "train_loss")
"""Where the training loss is found: the first of these a job reports."""

_STATE_STYLES = {
    "pending": "dim",
    "running": "cyan",
    "finished": "green",
    "failed": "bold red",
    "stopped": "yellow",
}


# ------------------------------------------------------------------------------------ figures


def duration(seconds: float | None) -> str:
    """``45s``, ``3m12s``, ``1h02m``, ``2d03h``; ``-`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    total = max(round(seconds), 0)
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def percent(value: float | None) -> str:
    """``12.3%`` (rounded down, so a job at 99.96 % does not read as done), ``100%``; ``-`` when unknown."""
    if value is None or not math.isfinite(value):
        return "-"
    if value >= 100:
        return "100%"
    return f"{shown_percent(value):.1f}%"  # the one rule (2.3 is not cut to 2.2)


def progress_text(view: Mapping[str, Any]) -> str:
    """A job view's progress: ``45.0%``; ``ended at 49.8%`` for a job that ended short of its total."""
    value = (view.get("progress") or {}).get("percent")
    return ended_short_text(str(view.get("state", "")), value) or percent(value)


def number(value: float | None) -> str:
    """A count without trailing zeros: ``3``, ``1.5``, ``1.33``; ``-`` when unknown."""
    if value is None:
        return "-"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def step_text(progress: Mapping[str, Any]) -> str:
    """``1200/10000``, or ``1200`` without a total; ``-`` before the first step."""
    step, total = progress.get("step"), progress.get("total_steps")
    if step is None:
        return "-"
    return f"{step}/{total}" if total else str(step)


def epoch_text(progress: Mapping[str, Any]) -> str:
    """``1.5/3``, or ``1.5`` without a total; ``-`` when the job counts no epochs."""
    epoch, total = progress.get("epoch"), progress.get("total_epochs")
    if epoch is None:
        return "-"
    return f"{number(epoch)}/{number(total)}" if total else number(epoch)


def eta_text(remaining: float | None, source: str | None = None) -> str:
    """Time left: ``-`` when unknown (also for a job that failed or was stopped), ``0s`` when done; a ``*``
    after an ETA the job reported itself (its Kubeflow client's, or its own: ``eta.source`` is ``reported``)
    rather than stepwatch's estimate."""
    text = duration(remaining)
    return f"{text}*" if source == "reported" and remaining is not None else text


def loss_of(metrics: Mapping[str, Any], means: Mapping[str, Any] | None = None) -> float | str | None:
    """The training loss as the API gives it (a number, or ``"NaN"``/``"Infinity"``), if the job has one: the
    mean of its latest window (``means``: the view's ``metric_means``, smoother than one batch) where the
    server sends it, else the last value."""
    for key in LOSS_KEYS:
        if means and means.get(key) is not None:
            mean: float | str = means[key]
            return mean
        if metrics.get(key) is not None:
            value: float | str = metrics[key]
            return value
    return None


def view_loss(view: Mapping[str, Any]) -> float | str | None:
    """A job view's loss as readers show it (see :func:`loss_of`)."""
    return loss_of(view.get("metrics") or {}, view.get("metric_means") or {})


def loss_text(value: float | str | None) -> str:
    """``0.0123``, ``1.23e-05``, ``NaN``, ``Inf``, ``-Inf``; ``-`` when the job reports no loss."""
    if value is None:
        return "-"
    if isinstance(value, str):  # the API's spelling of non-finite values
        return {"NaN": "NaN", "Infinity": "Inf", "-Infinity": "-Inf"}.get(value, value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return f"{value:.4g}"


def value_text(value: Any, key: str = "") -> str:
    """Any value the server sends as data, for reading: numbers to 4 significant digits (``0.07085``, not
    ``0.07084809085767296``), a Unix time (a key ending ``since``, ``_at`` or ``t``) as a clock time, a mapping
    as ``key value, key value`` (never its Python or JSON spelling); ``-`` when absent."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if (key.endswith("since") or key.endswith("_at") or key == "t") and value > 1e9:
            return clock_time(float(value))
        return str(value) if isinstance(value, int) else loss_text(value)
    if isinstance(value, Mapping):
        return ", ".join(f"{str(k).replace('_', ' ')} {value_text(v, str(k))}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(value_text(v) for v in value)
    return str(value)


def window_text(window: Any) -> str:
    """The span a health verdict looked at: ``{'seconds': 30, 'steps': 574}`` reads ``30s, 574 steps``."""
    if not isinstance(window, Mapping):
        return value_text(window)
    parts = []
    if window.get("seconds") is not None:
        parts.append(duration(float(window["seconds"])))
    if window.get("steps") is not None:
        parts.append(f"{window['steps']:,} steps")
    if window.get("windows") is not None:
        parts.append(f"{window['windows']:,} report{'' if window['windows'] == 1 else 's'}")
    parts += [f"{str(k).replace('_', ' ')} {value_text(v, str(k))}" for k, v in window.items()
              if k not in ("seconds", "steps", "windows")]  # fmt: skip
    return ", ".join(parts) or "-"


_EVIDENCE_LABELS = {
    "metric": "Metric",
    "window": "Measured over",
    "observed": "Observed",
    "threshold": "Threshold",
    "level": "Level (recent mean)",
    "best": "Best smoothed level earlier",
    "best_step": "... at step",
    "gain": "Improvement per window",
    "noise": "Noise (standard error)",
    "noise_z": "Noise multiple needed",
    "learning_rate": "Learning rate",
    "eval_metric": "Evaluation metric",
    "eval_gain": "Evaluation improvement",
    "eval_noise": "Evaluation noise",
    "rank": "Rank",
    "step": "At step",
    "kind": "Standing in",
    "activity": "Doing",
    "detail": "In the call",
    "frames": "In your code",
    "place": "Where",
    "holding": "Ranks standing",
    "waiting": "Ranks waiting for them",
    "step_time": "Usual step time (p99)",
    "phase": "Phase",
    "eval_seconds": "Evaluating for",
    "recovered_from": "Recovered from",
    "ranks_standing": "Ranks standing",
    "host": "Host",
    "ratio": "Slower than the median rank by",
    "speedup_without": "Faster without it by",
    "activity_shares": "Its time goes to",
    "median_activity_shares": "The median rank's time goes to",
    "hint": "Without it",
}
"""What each piece of a health verdict's evidence is, in the order a person reads them (the dashboard's
``evidenceFacts`` in ``web/js/format.js`` says the same, label for label)."""

_STAND_KINDS = {
    "busy": "a training step",
    "patient": "a save or an evaluation",
    "hang": "its own code, a lock or its loader",
}
"""The stall checker's names for what a rank stands in, in words."""

_REPEATS_MESSAGE = ("hint", "place", "final")
"""Pieces of evidence that only say again what the message says (a straggler's hint, a stall's place) or
mark it (an ended job's final judgement): shown only when the message does not already hold them."""


def ranks_text(ranks: Any) -> str:
    """Ranks as a person reads them: ``rank 0``, ``ranks 0, 2``, ``none``."""
    if not isinstance(ranks, (list, tuple)):
        return value_text(ranks)
    if not ranks:
        return "none"
    return f"rank{'' if len(ranks) == 1 else 's'} " + ", ".join(str(r) for r in ranks)


def times_text(value: Any) -> str:
    """A ratio as a person reads it, with one decimal as the verdict's message says it (and the dashboard):
    ``2.4x``, ``3.0x``; ``-`` when unknown."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    return f"{value:.1f}x"


def shares_text(shares: Any) -> str:
    """Activity shares (``{"computing": 0.62, "loading_data": 0.3}``) as ``computing 62%, loading data 30%``,
    largest first."""
    if not isinstance(shares, Mapping):
        return value_text(shares)
    found = [(str(k), float(v)) for k, v in shares.items() if isinstance(v, (int, float)) and math.isfinite(v)]
    found.sort(key=lambda kv: -kv[1])
    return ", ".join(f"{k.replace('_', ' ')} {round(v * 100)}%" for k, v in found) or "-"


def _frame_text(frame: Any) -> str:
    if isinstance(frame, Mapping):
        return f"{frame.get('function')} ({frame.get('file')}:{frame.get('line')})"
    return str(frame)


def _evidence_text(key: str, value: Any, evidence: Mapping[str, Any]) -> str:
    metric = evidence.get("metric")
    timed = metric in ("step", "reports")  # a stall's observed and threshold are seconds
    paced = metric == "rank_pace"  # a straggler's are how many times slower than the median rank
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key == "window":
        return window_text(value)
    if key == "metric" and paced:
        return "each rank's pace"
    if (key in ("observed", "threshold") and paced) or key in ("ratio", "speedup_without"):
        return times_text(value)
    if key in ("observed", "threshold") and timed and number:
        return duration(value)
    if key in ("activity_shares", "median_activity_shares"):
        return shares_text(value)
    if (key == "step" or key.endswith("_step")) and isinstance(value, int):
        return f"{value:,}"
    if key == "step_time" and number:
        return f"{value:.3g} s"
    if key.endswith("_seconds") and number:
        return duration(value)
    if key == "kind":
        return _STAND_KINDS.get(str(value), str(value).replace("_", " "))
    if key in ("activity", "phase", "recovered_from"):
        return str(value).replace("_", " ")
    if key in ("holding", "waiting", "ranks_standing"):
        return ranks_text(value)
    if key == "frames" and isinstance(value, (list, tuple)):
        return "; ".join(_frame_text(f) for f in value) or "-"
    return value_text(value, key)


def evidence_lines(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A verdict's evidence as ``(label, text)`` lines, every value formatted as the dashboard formats it
    (durations with their unit, ratios as ``2.4x``, shares as percentages, ranks and frames in words); its
    message and its start (shown beside the state) aside, and what only repeats the message."""
    message = str(evidence.get("message") or "")

    def repeats(key: str, value: Any) -> bool:
        return key in _REPEATS_MESSAGE and (not isinstance(value, str) or not value or value in message)

    order = list(_EVIDENCE_LABELS)
    keys = sorted(
        (k for k, v in evidence.items() if k not in ("message", "since") and v is not None and not repeats(k, v)),
        key=lambda k: order.index(k) if k in order else len(order),
    )
    return [
        (_EVIDENCE_LABELS.get(key, key.replace("_", " ").capitalize()), _evidence_text(key, evidence[key], evidence))
        for key in keys
    ]


def rate_text(value: float | None) -> str:
    """Steps per second: ``0.85``, ``12.5``, ``240``; ``-`` when unknown."""
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) < 10:
        return f"{value:.2f}"
    if abs(value) < 100:
        return f"{value:.1f}"
    return f"{value:.0f}"


NO_RATE = "—"
"""What stands where a stalled or ended job's rate would be: it has no live rate."""


def rate_words(view: Mapping[str, Any], now: float | None = None, long: bool = False) -> str:
    """A job view's steps per second as a person reads it: the server's rate; ``—`` for a job with no live
    rate (stalled or ended: the server sends none), with ``stalled since 14:05`` after it when ``long``."""
    rate = (view.get("progress") or {}).get("steps_per_second")
    if rate is not None:
        return rate_text(rate)
    health = view.get("health") or {}
    if view.get("state") in END_STATES:
        return f"{NO_RATE} (ended)" if long else NO_RATE
    if health.get("state") == "stalled":
        since = health.get("since")
        return f"{NO_RATE} (stalled since {clock_time(since, now)})" if long and since is not None else NO_RATE
    return "-"


def rate_phrase(view: Mapping[str, Any], now: float | None = None) -> str:
    """The rate with its unit, for a line: ``18.1 steps/s``, ``— steps/s (stalled since 14:05)``,
    ``— steps/s (ended)``."""
    words = rate_words(view, now, long=True)
    if words.startswith(NO_RATE):
        return f"{NO_RATE} steps/s{words[len(NO_RATE) :]}"
    return f"{words} steps/s"


def age(since: float | None, now: float | None = None) -> str:
    """How long ago ``since`` (a Unix time) was, as a duration."""
    if since is None:
        return "-"
    return duration((time.time() if now is None else now) - since)


def clock_time(when: float | None, now: float | None = None) -> str:
    """A local clock time: ``14:05`` today, ``Tue 14:05`` within a week, else ``2025-03-01 14:05``."""
    if when is None or not math.isfinite(when):
        return "-"
    now = time.time() if now is None else now
    moment, today = time.localtime(when), time.localtime(now)
    if moment[:3] == today[:3]:
        return time.strftime("%H:%M", moment)
    if 0 <= when - now < 6 * 86400:
        return time.strftime("%a %H:%M", moment)
    return time.strftime("%Y-%m-%d %H:%M", moment)


def state_style(state: str) -> str:
    """The rich style of a job state."""
    return _STATE_STYLES.get(state, "")


_HEALTH_STYLES = {
    "healthy": "green",
    "stalled": "bold yellow",
    "not_learning": "yellow",
    "diverging": "bold red",
    "straggling": "yellow",
}


def health_cell(view: Mapping[str, Any]) -> Cell:
    """A job's health (``-`` while unknown), styled."""
    state = str((view.get("health") or {}).get("state") or "unknown")
    return Cell("-" if state == "unknown" else state, _HEALTH_STYLES.get(state, ""))


def cost_text(view: Mapping[str, Any], since: float = 0.0) -> str:
    """What a job has cost so far (``since``: seconds since the view was read, for a running job)."""
    cost = view.get("cost") or {}
    spent, rate = cost.get("spent"), cost.get("rate_per_hour")
    if spent is None:
        return "-"
    if rate and view.get("state") == "running":
        spent += rate * since / 3600
    return f"${spent:,.2f}"


# -------------------------------------------------------------------------------------- tables


class Cell(NamedTuple):
    """A table cell with a rich style (used on a terminal only)."""

    text: str
    style: str = ""


Row = Sequence["str | Cell"]


def printable(text: str) -> str:
    """``text`` with its control and format characters shown as escapes (``\\x1b``): what a job or a user
    wrote (reasons, params, event messages) must not drive the terminal (colours, title, clipboard, cursor)."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _text(cell: str | Cell) -> str:
    return printable(cell.text if isinstance(cell, Cell) else cell)


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (then rich draws; otherwise plain text)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def plain_table(headers: Sequence[str], rows: Sequence[Row]) -> str:
    """Left-aligned columns three spaces apart, like ``kubectl get``; no trailing spaces."""
    table = [list(headers), *([_text(c) for c in row] for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table)


def _table_width(headers: Sequence[str], rows: Sequence[Row], gap: int = 3) -> int:
    """The cells a table needs: rich cuts cells (``STA…``) when its console is narrower."""
    widths = [max([len(h), *(len(_text(row[i])) for row in rows)]) for i, h in enumerate(headers)]
    return sum(widths) + gap * max(len(widths) - 1, 0)


def rich_table(headers: Sequence[str], rows: Sequence[Row]) -> Any:
    """The same table as a rich renderable (borderless, like ``kubectl get``, with coloured cells)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, padding=(0, 0, 0, 3), header_style="bold")
    for header in headers:
        table.add_column(header, no_wrap=True)
    for row in rows:
        table.add_row(*(Text(_text(c), style=c.style) if isinstance(c, Cell) else Text(_text(c)) for c in row))
    return table


def terminal_width(out: TextIO | None = None) -> int | None:
    """How many columns a table may take: ``$COLUMNS`` when set, else the terminal's width; ``None`` (no
    limit) when piped, as ``kubectl get`` writes whole rows to a file."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if is_terminal(sys.stdout if out is None else out):
        return shutil.get_terminal_size().columns
    return None


def fit_columns(
    headers: Sequence[str], rows: Sequence[Row], width: int | None, priority: Sequence[str] = (), gap: int = 3
) -> list[int]:
    """The indexes of the columns that fit in ``width`` cells, in table order: taken in ``priority`` order (then
    the rest in table order) up to the first that does not fit, each as wide as its header or its widest cell,
    ``gap`` apart. A column is dropped whole rather than cut: no number or state word loses its end."""
    if width is None:
        return list(range(len(headers)))
    need = [max([len(h), *(len(_text(row[i])) for row in rows)]) for i, h in enumerate(headers)]
    order = [headers.index(h) for h in priority if h in headers]
    order += [i for i in range(len(headers)) if i not in order]
    chosen: list[int] = []
    used = -gap
    for i in order:
        if used + gap + need[i] > width:
            break
        chosen.append(i)
        used += gap + need[i]
    return sorted(chosen) or order[:1]


def fitted(
    headers: Sequence[str], rows: Sequence[Row], width: int | None, priority: Sequence[str] = ()
) -> tuple[list[str], list[list[str | Cell]]]:
    """The table with only the columns that fit in ``width`` (see :func:`fit_columns`)."""
    keep = fit_columns(headers, rows, width, priority)
    return [headers[i] for i in keep], [[row[i] for i in keep] for row in rows]


def print_table(
    headers: Sequence[str], rows: Sequence[Row], out: TextIO | None = None, priority: Sequence[str] | None = None
) -> None:
    """Print a table: rich on a terminal (plain when rich is missing), plain aligned text when piped. With a
    ``priority``, the columns that do not fit the terminal (or ``$COLUMNS``) are left out, least needed first."""
    out = sys.stdout if out is None else out
    if priority is not None:
        headers, rows = fitted(headers, rows, terminal_width(out), priority)
    if is_terminal(out):
        try:
            from rich.console import Console
        except ImportError:
            pass
        else:
            Console(file=out, width=max(terminal_width(out) or 0, _table_width(headers, rows))).print(
                rich_table(headers, rows)
            )
            return
    print(plain_table(headers, rows), file=out, flush=True)


# ------------------------------------------------------------------------ server flags, messages


def add_server_flags(parser: Any) -> None:
    """``--server URL`` and ``-n/--namespace NS``, the same on every job command."""
    parser.add_argument(
        "--server",
        metavar="URL",
        help="stepwatch server (default: $STEPWATCH_SERVER, $STEPWATCH_URL, else http://127.0.0.1:8642)",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        default=os.environ.get("STEPWATCH_NAMESPACE") or "default",
        help="namespace of the job(s) (default: $STEPWATCH_NAMESPACE, else default)",
    )
    add_token_flag(parser)


def add_token_flag(parser: Any) -> None:
    """``--token``: the API token of a server with authentication on."""
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        default=None,
        help="API token, for a server with authentication on (default: $STEPWATCH_API_TOKEN; see docs/auth.md)",
    )


def again(args: Any, command: str, *words: str) -> str:
    """A command to paste after this one, with the user's own ``-n``, ``--server`` and ``--token`` (issue 30:
    hints that dropped ``--server`` failed when pasted): ``stepwatch watch bert -n vision --server URL``.
    A token is repeated only when it was typed on this command line (one from the environment is there for
    the pasted command as well), so that no secret is shown that the user did not type."""
    import shlex

    parts = ["stepwatch", command, *words]
    namespace = getattr(args, "namespace", None)
    if namespace and namespace != (os.environ.get("STEPWATCH_NAMESPACE") or "default"):
        parts += ["-n", namespace]
    if getattr(args, "server", None):
        parts += ["--server", args.server]
    if getattr(args, "token", None) and args.token != os.environ.get("STEPWATCH_API_TOKEN"):
        parts += ["--token", args.token]
    return shlex.join(parts)


def unreachable(url: str) -> str:
    """The one line shown when no server answers."""
    return f"no stepwatch server at {url}: start one with `stepwatch server`, or run a job with `stepwatch run -- ...`"


def missing_client(command: str, exc: ImportError) -> int:
    """Say how to install what a command needs when the client cannot be imported; exit status 1."""
    print(f"stepwatch {command} needs the HTTP client ({exc}): {CLIENT_HINT}", file=sys.stderr)
    return 1
