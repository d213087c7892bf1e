"""The ``stepwatch`` command line: one module per command group, dispatched from :func:`main`."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from .._version import __version__

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
    """Parse ``argv`` and run the command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    status: int = args.run(args)
    return status
