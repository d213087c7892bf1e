"""Exit statuses of every ``stepwatch`` command, and the one-line messages of what can go wrong.

The table (docs/cli.md shows it; ``tests/test_cli_errors.py`` holds each command to it):

====  ==========================================================================================
0     done (``watch``: the job finished)
1     an error: no server, not a stepwatch server, the server refused (``watch``: the job failed)
2     a usage error: bad arguments (``watch``: the job was stopped)
3     no such job (every command that names one)
130   interrupted (Ctrl-C)
141   the reader of the output went away (``stepwatch jobs -o json | head``)
====  ==========================================================================================

``stepwatch run`` exits with its command's status (127: it could not start; 128+N: signal N).

Standard library only: the client's errors are matched by name, so that this imports without httpx.
"""

from __future__ import annotations

import difflib
import os
import sys
from typing import Any

__all__ = [
    "ERROR",
    "INTERRUPTED",
    "NO_SUCH_JOB",
    "OK",
    "PIPE_CLOSED",
    "USAGE",
    "close_job_names",
    "missing_extra",
    "no_such_job",
    "one_line",
    "output_closed",
]

OK = 0
ERROR = 1
USAGE = 2
NO_SUCH_JOB = 3
INTERRUPTED = 130
PIPE_CLOSED = 141
"""128 + SIGPIPE, what a shell reports for a command whose reader went away."""

_CLOSE = 0.75
"""How alike a name must be to be suggested (difflib's ratio): a typo or two in ``train-tiny`` (0.9),
not ``short`` for ``ghost`` (0.6)."""


EXTRA_OF: dict[str, str] = {
    "httpx": "client",
    "rich": "client",
    "starlette": "server",
    "uvicorn": "server",
    "orjson": "server",
    "prometheus_client": "server",
    "plotly": "server",
    "swagger_ui_bundle": "server",
    "numpy": "server",
    "textual": "tui",
    "kubernetes": "k8s",
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "apprise": "notify",
    "pandas": "notebook",
}
"""The extra that installs each optional package a command may import (pyproject.toml's extras)."""


def missing_extra(command: str, exc: ImportError) -> str | None:
    """The one line for a command that needs an extra this install lacks (``pip install stepwatch`` gives
    the reporter only, yet installs the commands); ``None`` when ``exc`` is not about an optional package."""
    top = (exc.name or "").split(".", 1)[0]
    extra = EXTRA_OF.get(top)
    if extra is None:
        return None
    return f"{command}: needs the '{extra}' extra ({top} is not installed): pip install 'stepwatch[{extra}]'"


def one_line(command: str, exc: BaseException, url: str | None = None) -> str:
    """A client error as the one line a command prints (no traceback), saying what to do when it can."""
    name = type(exc).__name__
    if name in ("ServerUnreachable", "RequestTimeout") and url is not None:
        from ._format import unreachable

        return unreachable(url)
    message = getattr(exc, "message", None) or str(exc) or name
    return f"stepwatch {command}: {message}"


def close_job_names(client: Any, name: str, namespace: str) -> list[str]:
    """Jobs whose names are close to ``name``: in ``namespace`` as ``NAME``, elsewhere as ``NS/NAME``."""
    try:
        listed = client.jobs(limit=1000)
    except Exception:  # a suggestion is a courtesy: no answer, no suggestion
        return []
    here = sorted({job.name for job in listed if job.namespace == namespace})
    found = difflib.get_close_matches(name, here, n=3, cutoff=_CLOSE)
    if found:
        return found
    elsewhere = {job.name: job.namespace for job in listed if job.namespace != namespace}
    return [f"{elsewhere[n]}/{n}" for n in difflib.get_close_matches(name, sorted(elsewhere), n=3, cutoff=_CLOSE)]


def no_such_job(command: str, client: Any, name: str, namespace: str, url: str, args: Any = None) -> str:
    """The line for an unknown job: the close matches when there are some, else how to list the jobs (with
    the user's own ``--server`` and typed ``--token`` from ``args``, so that the hint pastes)."""
    from types import SimpleNamespace

    from ._format import again

    matches = close_job_names(client, name, namespace)
    server = SimpleNamespace(server=getattr(args, "server", None), token=getattr(args, "token", None))
    hint = f"did you mean {' or '.join(matches)}?" if matches else f"`{again(server, 'jobs', '-A')}` lists them"
    return f"stepwatch {command}: no job {namespace}/{name} at {url} ({hint})"


def output_closed() -> int:
    """The reader of stdout went away: no traceback, and none at exit when Python flushes stdout."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (captured): nothing will flush into the pipe
        pass
    return PIPE_CLOSED
