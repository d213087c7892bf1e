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
import sys
from typing import TYPE_CHECKING, Any

from ._format import add_server_flags, unreachable
from ._top_view import COLUMNS, PRIORITY, SORTS, bar, fit_columns, job_cells, visible_jobs

if TYPE_CHECKING:
    from ..client import Client

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


def make_app(client: Client, namespace: str | None, sort: str = "name", text: str = "") -> Any:
    """The Textual app of ``stepwatch top`` on ``client`` (``namespace`` ``None``: every namespace)."""
    from ._top_app import Top  # Textual only now: an extra, and slow to import

    return Top(client, namespace, sort, text)


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
