"""``stepwatch watch NAME``: follow one job live until it ends, then say how it ended.

Exit status: 0 finished, 1 failed (or no server), 2 stopped, 3 no such job, 130 interrupted. The
status is the job's state alone: a stopped job is 2 whatever its health, and a job that ended short of
its total keeps its state's status (its outcome line says "ended at X%").
"""

from __future__ import annotations

import argparse
import queue
import sys
import textwrap
import threading
import time
from typing import TYPE_CHECKING, Any, TextIO

from ..protocol import ended_short_text
from ._errors import INTERRUPTED, NO_SUCH_JOB, no_such_job
from ._format import (
    END_STATES,
    add_server_flags,
    duration,
    eta_text,
    is_terminal,
    loss_text,
    missing_client,
    printable,
    progress_text,
    rate_phrase,
    step_text,
    unreachable,
    view_loss,
)

if TYPE_CHECKING:
    from ..client import Client

__all__ = [
    "EXIT_CODES",
    "Feed",
    "bar_fields",
    "bar_line",
    "outcome",
    "progress_line",
    "register",
    "run",
    "verdict_lines",
]

EXIT_CODES = {"finished": 0, "failed": 1, "stopped": 2}
POLL_AFTER_S = 3.0
"""Read the job again when the stream has said nothing for this long (it may have ended unseen)."""
LINE_EVERY_S = 2.0
"""When piped, a progress line at most this often."""


def register(commands: Any) -> None:
    """Add the ``watch`` command."""
    parser = commands.add_parser(
        "watch",
        help="follow one job live until it ends",
        description=(
            "Follow a job live (a progress bar on a terminal, a line every 2 s when piped) until it ends, then "
            "print how it ended. Exit status: 0 finished, 1 failed, 2 stopped, 3 no such job."
        ),
    )
    parser.add_argument("name", metavar="NAME", help="the job")
    add_server_flags(parser)
    parser.set_defaults(run=run)


class Feed:
    """The server's live stream, read in a daemon thread into a queue, so that the reader can keep time.

    The stream iterator blocks in a socket read with no timeout, so it cannot be stopped from outside:
    :meth:`close` makes the thread drop what still arrives and end at the next update or when the
    connection ends; a command that returns leaves it behind, and the process exit takes it down. When
    the connection drops, the thread reconnects (backing off up to 10 s) and then sends a ``resync``,
    since what happened in between is not replayed.
    """

    def __init__(
        self, url: str, name: str | None = None, namespace: str | None = None, token: str | None = None
    ) -> None:
        self._url = url
        self._token = token
        self._name = name
        self._namespace = namespace
        self._queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="stepwatch-feed", daemon=True)

    def start(self) -> Feed:
        """Start reading."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop handing out updates."""
        self._stop.set()

    def get(self, timeout: float) -> tuple[str, dict[str, Any]] | None:
        """The next ``(kind, data)``, or ``None`` after ``timeout`` seconds; re-raises the reader's error."""
        try:
            kind, data = self._queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        if kind == "error":
            raise data["error"]
        return kind, data

    def _read(self) -> None:
        from ..client import Client, JobUpdate, Resync, ServerUnreachable

        client = Client(self._url, self._token)
        delay = 0.5
        reconnected = False
        try:
            while not self._stop.is_set():
                try:
                    for update in client.watch(self._name, self._namespace, reconnect=False):
                        if self._stop.is_set():
                            return
                        if reconnected:  # what changed while the stream was down is not replayed: re-read
                            self._queue.put(("resync", {"reason": "the live stream was reconnected"}))
                            reconnected, delay = False, 0.5
                        if isinstance(update, JobUpdate):
                            self._queue.put(("job", {"job": update.job.raw}))
                        elif isinstance(update, Resync):
                            self._queue.put(("resync", {"reason": update.reason}))
                except ServerUnreachable:
                    pass
                reconnected = True
                if self._stop.wait(delay):
                    return
                delay = min(delay * 2, 10.0)
        except Exception as exc:  # handed to the reader, which says what went wrong
            if not self._stop.is_set():
                self._queue.put(("error", {"error": exc}))
        finally:
            client.close()


# ----------------------------------------------------------------------------------- the text


def progress_line(view: dict[str, Any], remaining: float | None = None) -> str:
    """One line of progress: ``default/bert running 45.0% step 1350/3000 ETA 1m10s loss 0.123 4.50 steps/s``
    (``— steps/s (stalled since 14:05)`` for a job that stands)."""
    progress = view.get("progress") or {}
    if remaining is None:
        remaining = (view.get("eta") or {}).get("remaining_seconds")
    return (
        f"{view['namespace']}/{view['name']} {view['state']} {progress_text(view)} "
        f"step {step_text(progress)} ETA {eta_text(remaining)} loss {loss_text(view_loss(view))} " + rate_phrase(view)
    )


def outcome(view: dict[str, Any]) -> tuple[str, int]:
    """How an ended job ended, and the exit status that says it (its state's alone, see the module docstring)."""
    state = view["state"]
    who = f"{view['namespace']}/{view['name']}"
    progress = view.get("progress") or {}
    at_step = f"at step {step_text(progress)}" if progress.get("step") is not None else ""
    # short of its total: said whatever the state (a script that exits early is "finished" at 49.8 %)
    short = ended_short_text(state, progress.get("percent"))
    loss = view_loss(view)
    if state == "finished":
        elapsed = (view.get("times") or {}).get("elapsed_seconds")
        parts = [f"{who} finished"]
        if elapsed is not None:
            parts.append(f"in {duration(elapsed)}")
        if at_step:
            parts.append(at_step)
        if short:
            parts.append(f"({short})")
        text = " ".join(parts)
        if loss is not None:
            text += f", loss {loss_text(loss)}"
        return text, EXIT_CODES["finished"]
    reason = view.get("reason") or "no reason given"
    details = [f"exit code {view['exit_code']}"] if view.get("exit_code") is not None else []
    if at_step:
        details.append(at_step)
    if short:
        details.append(short)
    text = f"{who} {state}: {reason}" + (f" ({', '.join(details)})" if details else "")
    return text, EXIT_CODES.get(state, 1)


def verdict_lines(view: dict[str, Any], width: int | None = None) -> list[str]:
    """What the verdict says, for under the bar, when the job is not healthy: ``stalled: rank 1 has stood
    36 s after step 29 in wait_for_lock (train.py:31), ...``, wrapped at ``width`` cells between words (a
    number, a frame or a host is never cut; a word longer than the line stands alone on its line). Nothing
    for a healthy job, nor for ``unknown`` (no data yet: nothing to act on), nor without a message."""
    health = view.get("health") or {}
    state = str(health.get("state") or "")
    message = str((health.get("evidence") or {}).get("message") or "")
    if state in ("", "healthy", "unknown") or not message:
        return []
    text = printable(f"{state.replace('_', ' ')}: {message}")
    if width is None or width <= 0:
        return [text]
    return textwrap.wrap(
        text, width=max(width, 20), subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    ) or [text]


# -------------------------------------------------------------------------------- the displays


class _Lines:
    """Piped: a plain line when something changed, at most every :data:`LINE_EVERY_S` seconds."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._last_line = ""
        self._last_at = -LINE_EVERY_S
        self._last_verdict: list[str] = []

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def show(self, view: dict[str, Any], remaining: float | None) -> None:
        line = progress_line(view, remaining)
        now = time.monotonic()
        if line != self._last_line and now - self._last_at >= LINE_EVERY_S:
            print(line, file=self._out, flush=True)
            self._last_line, self._last_at = line, now
            # the verdict under it, once each time its words change (a log reader needs it once, not every 2 s)
            verdict = verdict_lines(view)
            if verdict and verdict != self._last_verdict:
                print("\n".join("  " + v for v in verdict), file=self._out, flush=True)
            self._last_verdict = verdict


BAR_MIN = 12
"""The fewest cells the bar keeps: the fields beside it go first, least needed first (issue 30: at 80 columns
the bar was lost)."""
BAR_MAX = 40


def bar_fields(view: dict[str, Any], remaining: float | None) -> list[tuple[str, str]]:
    """The fields beside the bar, ``(name, text)`` in the order they are dropped last to first: percent, step,
    ETA, rate (``—`` and since when it stands, for a stalled job), loss, state."""
    progress = view.get("progress") or {}
    return [
        ("percent", progress_text(view)),
        ("step", f"step {step_text(progress)}"),
        ("eta", f"ETA {eta_text(remaining)}"),
        ("rate", rate_phrase(view)),
        ("loss", f"loss {loss_text(view_loss(view))}"),
        ("state", str(view.get("state", ""))),
    ]


def bar_line(view: dict[str, Any], remaining: float | None, width: int, title: str = "") -> tuple[int, str, str]:
    """The live line at ``width`` cells: ``(bar cells, text before the bar, text after it)``. The title and the
    fields are kept while the bar still has :data:`BAR_MIN` cells; none is ever cut."""
    fields = bar_fields(view, remaining)
    kept: list[str] = []
    used = 0
    for _, text in fields:
        if used + 1 + len(text) + BAR_MIN > width:
            break
        kept.append(text)
        used += 1 + len(text)
    before = title if title and used + len(title) + 1 + BAR_MIN + 8 <= width else ""
    if before:
        used += len(before) + 1
    cells = max(min(width - used, BAR_MAX), min(BAR_MIN, max(width - used, 1)))
    return cells, before, " ".join(kept)


class _Bar:
    """On a terminal: a bar with percent, step/total, ETA, rate, loss and state, fitted to the terminal's width."""

    def __init__(self, out: TextIO, title: str) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=out)
        self._title = title
        self._live = Live(console=self._console, auto_refresh=False)
        self._titled = False

    def __enter__(self) -> _Bar:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def show(self, view: dict[str, Any], remaining: float | None) -> None:
        from rich.text import Text

        cells, before, after = bar_line(view, remaining, self._console.width, self._title)
        if not before and not self._titled:  # no room beside the bar: the job's name once, above it
            self._live.console.print(Text(self._title, style="bold"))
            self._titled = True
        value = (view.get("progress") or {}).get("percent")
        filled = round(max(0.0, min(100.0, value)) / 100 * cells) if value is not None else 0
        line = Text()
        if before:
            line.append(before + " ", style="bold")
        line.append("━" * filled, style="magenta" if value is not None else "")
        line.append("━" * (cells - filled), style="grey23")
        line.append(" " + after)
        # a job that is not healthy says why under its bar, in words that fit the terminal (never cut)
        verdict = verdict_lines(view, self._console.width)
        if verdict:
            from rich.console import Group

            style = "yellow" if (view.get("health") or {}).get("state") != "diverging" else "red"
            self._live.update(Group(line, *(Text(v, style=style, overflow="fold") for v in verdict)), refresh=True)
            return
        self._live.update(line, refresh=True)


def _display(out: TextIO, title: str) -> _Bar | _Lines:
    if is_terminal(out):
        try:
            return _Bar(out, title)
        except ImportError:
            pass
    return _Lines(out)


# ------------------------------------------------------------------------------------ the command


def run(args: argparse.Namespace) -> int:
    """Follow the job; print its outcome; the exit status says how it ended."""
    try:
        from ..client import ApiError, Client, NotFound, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("watch", exc)
    url = server_url(args.server)
    with Client(url, args.token) as client:
        try:
            view = client.job(args.name, args.namespace).raw
            if view["state"] not in END_STATES:
                view = follow(client, view, sys.stdout)
        except NotFound:
            print(no_such_job("watch", client, args.name, args.namespace, url, args), file=sys.stderr)
            return NO_SUCH_JOB
        except ServerUnreachable:
            print(unreachable(url), file=sys.stderr)
            return 1
        except ApiError as exc:
            print(f"stepwatch watch: {exc.message}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return INTERRUPTED
    text, status = outcome(view)
    print(text, flush=True)
    return status


def follow(client: Client, view: dict[str, Any], out: TextIO) -> dict[str, Any]:
    """Show the job's progress from the live stream until it ends; return its last view."""
    from ..client import ServerUnreachable

    feed = Feed(client.url, name=view["name"], namespace=view["namespace"], token=client.token).start()
    received = time.monotonic()
    heard = received
    said_lost = False
    try:
        with _display(out, f"{view['namespace']}/{view['name']}") as display:
            while view["state"] not in END_STATES:
                remaining = (view.get("eta") or {}).get("remaining_seconds")
                if remaining is not None:  # counted down here between updates, as the server does
                    remaining = max(remaining - (time.monotonic() - received), 0.0)
                display.show(view, remaining)
                item = feed.get(timeout=0.5)
                fresh: dict[str, Any] | None = None
                if item is not None and item[0] == "job":
                    heard = time.monotonic()
                    if item[1]["job"]["attempt"] >= view["attempt"]:
                        fresh = item[1]["job"]
                elif item is not None or time.monotonic() - heard >= POLL_AFTER_S:  # resync, or quiet too long
                    heard = time.monotonic()
                    try:
                        fresh = client.job(view["name"], view["namespace"]).raw
                        said_lost = False
                    except ServerUnreachable:
                        if not said_lost:
                            print(f"stepwatch watch: lost the server at {client.url}; retrying", file=sys.stderr)
                            said_lost = True
                if fresh is not None:
                    view, received = fresh, time.monotonic()
            display.show(view, (view.get("eta") or {}).get("remaining_seconds"))
    finally:
        feed.close()
    return view
