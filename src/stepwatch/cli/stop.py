"""``stepwatch stop NAME``: ask a job to save a checkpoint, then stop, at its next step boundary."""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from typing import Any

from ..protocol import LIMITS
from ._errors import NO_SUCH_JOB, no_such_job
from ._format import add_server_flags, again, missing_client, unreachable

__all__ = ["default_reason", "register", "run"]


def register(commands: Any) -> None:
    """Add the ``stop`` command."""
    parser = commands.add_parser(
        "stop",
        help="ask a job to save a checkpoint, then stop",
        description=(
            "Queue a stop command for a job: its reporter picks it up with its next report, and the training "
            "loop saves a checkpoint and stops at its next step boundary. A job started with `stepwatch run` is "
            "stopped by the runner after a grace period if it does not obey."
        ),
    )
    parser.add_argument("name", metavar="NAME", help="the job")
    add_server_flags(parser)
    parser.add_argument("--reason", metavar="TEXT", help="why (shown to the job and in its events)")
    parser.set_defaults(run=run)


def default_reason() -> str:
    """Who asked, for the job's events: ``stepwatch stop by alice@laptop``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name in some containers
        user = "someone"
    return f"stepwatch stop by {user}@{socket.gethostname()}"


def run(args: argparse.Namespace) -> int:
    """Queue the stop command and say what happens next."""
    try:
        from ..client import ApiError, Client, Conflict, NotFound, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("stop", exc)
    url = server_url(args.server)
    who = f"{args.namespace}/{args.name}"
    reason = (args.reason if args.reason is not None else default_reason())[: LIMITS.max_reason_length]
    with Client(url, args.token) as client:
        try:
            command = client.stop(args.name, args.namespace, checkpoint=True, reason=reason)
        except NotFound:
            print(no_such_job("stop", client, args.name, args.namespace, url, args), file=sys.stderr)
            return NO_SUCH_JOB
        except Conflict as exc:  # it has already ended
            print(f"stepwatch stop: {exc.message}", file=sys.stderr)
            return 1
        except ServerUnreachable:
            print(unreachable(url), file=sys.stderr)
            return 1
        except ApiError as exc:
            print(f"stepwatch stop: {exc.message}", file=sys.stderr)
            return 1
    because = f" ({command.reason})" if command.reason else ""
    print(f"asked {who} to save a checkpoint, then stop{because}; command {command.id}")
    print(
        "it stops at its next step boundary, once its reporter reads the command with its next report; "
        f"`{again(args, 'watch', args.name)}` follows it to the end"
    )
    return 0
