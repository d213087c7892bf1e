"""The ``stepwatch`` command line: one module per command group, dispatched from :func:`main`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .._version import __version__
from . import _errors

__all__ = ["COMMANDS", "main"]

COMMANDS: tuple[str, ...] = (
    "config",
    "server",
    "run",
    "demo",
    "jobs",
    "describe",
    "watch",
    "top",
    "stop",
    "policy",
    "token",
    "db",
)
"""Command modules, in the order of ``stepwatch --help``; each has ``register(subparsers)``."""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command group."""
    parser = argparse.ArgumentParser(
        prog="stepwatch",
        description="Live progress, ETA, health and cost of training jobs.",
    )
    parser.add_argument("--version", action="version", version=f"stepwatch {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the command; returns the exit status (the table in :mod:`._errors`).

    What a command does not catch itself ends here as one line, never a traceback: a client error
    (a server that is not stepwatch's, an answer it cannot read), an extra this install lacks (``pip
    install stepwatch`` is the reporter only), Ctrl-C, a reader that went away.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return _errors.USAGE
    try:
        status: int = args.run(args)
        sys.stdout.flush()  # a closed pipe is found here, inside the handler, not at exit
    except BrokenPipeError:
        return _errors.output_closed()
    except KeyboardInterrupt:
        return _errors.INTERRUPTED
    except ImportError as exc:  # `pip install stepwatch` installs this command without its extras
        line = _errors.missing_extra(f"stepwatch {_command_of(args)}", exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return _errors.ERROR
    except Exception as exc:
        if not _is_client_error(exc):
            raise
        print(_errors.one_line(args.command, exc, _server_of(args)), file=sys.stderr)
        return _errors.ERROR
    return status


def _command_of(args: argparse.Namespace) -> str:
    """The command's name (``args.command`` is ``run``'s own command line once ``run`` parsed it)."""
    module: str = getattr(args.run, "__module__", "") or ""
    return module.rsplit(".", 1)[-1] if module.startswith(__name__ + ".") else str(args.command)


def _server_of(args: argparse.Namespace) -> str | None:
    """The server URL a command talked to, when it takes ``--server`` (read as the client reads it)."""
    core = sys.modules.get("stepwatch.client._core")
    if core is None or not hasattr(args, "server"):
        return None
    url: str = core.server_url(args.server)
    return url


def _is_client_error(exc: BaseException) -> bool:
    """One of the client's errors (:class:`stepwatch.client.StepwatchError`), known without importing httpx."""
    client = sys.modules.get("stepwatch.client._errors")
    return client is not None and isinstance(exc, client.StepwatchError)
