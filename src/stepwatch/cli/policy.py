"""``stepwatch policy``: show or set what happens when a job goes bad; the policy flags of ``stepwatch run``.

stepwatch policy get                         # the namespace's policy over the server's
stepwatch policy get train                   # a job's: its layer, the effective policy, what it did
stepwatch policy set --on diverging=stop --on not_learning=checkpoint_stop -n nlp
stepwatch policy set train --budget 250 --deadline +12h   # added to what stands
stepwatch policy set train --on stalled=none              # switch one trigger off
stepwatch policy set train --replace --on diverging=stop  # this layer instead of the one that stands
stepwatch policy set -n nlp --clear
stepwatch run --on not_learning=checkpoint_stop --budget 100 -- python train.py
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import datetime
from typing import Any

from ..protocol import POLICY_ACTIONS, POLICY_NOTIFY_ONLY, POLICY_TRIGGERS
from ._errors import ERROR, NO_SUCH_JOB
from ._format import add_server_flags, missing_client, unreachable

__all__ = ["add_policy_flags", "parse_deadline", "parse_trigger_action", "policy_from_args", "register", "run"]

_RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_trigger_action(text: str) -> tuple[str, str]:
    """``not_learning=checkpoint_stop`` → the pair; an argparse error names what is allowed."""
    trigger, sep, action = text.partition("=")
    trigger, action = trigger.strip().replace("-", "_"), action.strip().replace("-", "_")
    if not sep or trigger not in POLICY_TRIGGERS:
        raise argparse.ArgumentTypeError(f"give TRIGGER=ACTION with a trigger among {', '.join(POLICY_TRIGGERS)}")
    if action not in POLICY_ACTIONS:
        raise argparse.ArgumentTypeError(f"unknown action {action!r}: one of {', '.join(POLICY_ACTIONS)}")
    if trigger in POLICY_NOTIFY_ONLY and action not in ("none", "notify"):
        raise argparse.ArgumentTypeError(f"{trigger} can only be notified (none or notify)")
    return trigger, action


def parse_deadline(text: str, now: float | None = None) -> float:
    """An RFC 3339 time with a zone, or ``+8h`` / ``+90m`` / ``+2d`` from now; Unix seconds."""
    match = _RELATIVE.match(text.strip())
    if match:
        return (time.time() if now is None else now) + float(match[1]) * _UNIT_S[match[2]]
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (give 2026-12-07T09:00:00Z, 2026-12-07T10:00+01:00, or +12h)"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give a time zone (Z or +01:00): {text!r}")
    return when.timestamp()


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive amount, got {text}")
    return value


def add_policy_flags(parser: argparse.ArgumentParser, dry_run_flag: str = "--dry-run") -> None:
    """The flags that make a policy layer (``stepwatch run`` spells the dry run ``--policy-dry-run``)."""
    group = parser.add_argument_group("policy", "what happens when the job goes bad (see docs/policies.md)")
    group.add_argument(
        "--on",
        action="append",
        type=parse_trigger_action,
        default=[],
        metavar="TRIGGER=ACTION",
        help=(
            f"act on a trigger ({', '.join(POLICY_TRIGGERS)}) with an action ({', '.join(POLICY_ACTIONS)}); repeatable"
        ),
    )
    group.add_argument("--budget", type=_positive, metavar="USD", help="over_budget once the job has spent this")
    group.add_argument(
        "--deadline", type=parse_deadline, metavar="TIME", help="past_deadline at this time (RFC 3339, or +12h)"
    )
    group.add_argument(
        dry_run_flag,
        dest="policy_dry_run",
        action="store_true",
        default=None,
        help="record what the policy would do, do nothing",
    )
    group.add_argument(
        "--metric", dest="policy_metric", metavar="NAME", help="the metric health follows (default loss)"
    )
    group.add_argument(
        "--mode", dest="policy_mode", choices=["min", "max"], help="min: lower is better (default); max: higher"
    )
    group.add_argument(
        "--notify", dest="policy_notify", action="append", default=[], metavar="URL", help="also notify this target"
    )


def policy_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The policy layer the flags say (``None`` when they say nothing)."""
    policy: dict[str, Any] = {}
    if args.on:
        policy["on"] = dict(args.on)
    for key, value in (
        ("budget", args.budget),
        ("deadline", args.deadline),
        ("dry_run", args.policy_dry_run),
        ("metric", args.policy_metric),
        ("mode", args.policy_mode),
    ):
        if value is not None:
            policy[key] = value
    if args.policy_notify:
        policy["notify"] = list(args.policy_notify)
    return policy or None


def register(commands: Any) -> None:
    """Add the ``policy`` command group."""
    parser = commands.add_parser(
        "policy",
        help="show or set a job's or a namespace's policy (notify, checkpoint-then-stop, stop)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    get = actions.add_parser("get", help="show a job's policy, or the namespace's without NAME")
    get.add_argument("name", nargs="?", metavar="NAME", help="the job (default: the namespace)")
    add_server_flags(get)
    get.add_argument("-o", "--output", choices=["text", "json"], default="text")
    put = actions.add_parser(
        "set",
        help="add to a job's policy layer, or the namespace's without NAME (what is not named stays)",
        description="Merge into the layer that stands: each flag given replaces that setting (trigger by trigger "
        "for --on; --on TRIGGER=none switches one off), what is not named stays. --replace sets this layer "
        "instead of the one that stands; --clear removes it. The answer is the policy now in force.",
    )
    put.add_argument("name", nargs="?", metavar="NAME", help="the job (default: the namespace)")
    add_server_flags(put)
    add_policy_flags(put)
    put.add_argument(
        "--replace", action="store_true", help="set this layer instead of the one that stands (not merged into it)"
    )
    put.add_argument("--clear", action="store_true", help="remove the layer (what is under it applies)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Get or set, and show the result."""
    try:
        from ..client import ApiError, Client, NotFound, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("policy", exc)
    url = server_url(args.server)
    what = f"{args.namespace}/{args.name}" if args.name else f"namespace {args.namespace}"
    with Client(url, args.token) as client:
        try:
            if args.policy_command == "get":
                if args.name:
                    found = dict(client.policy(args.name, args.namespace).raw)
                else:
                    found = dict(client.namespace_policy(args.namespace).raw)
            else:
                layer = {} if args.clear else policy_from_args(args)
                if layer is None:
                    print("stepwatch policy set: say what to set (--on, --budget, ...) or --clear", file=sys.stderr)
                    return 2
                if args.replace and layer:
                    layer = {"replace": True, **layer}  # the server merges unless told (docs/policies.md)
                found = dict(client.set_policy(args.name, layer, args.namespace).raw)
        except NotFound:
            print(f"stepwatch policy: no {what} at {url}", file=sys.stderr)
            return NO_SUCH_JOB if args.name else ERROR
        except ServerUnreachable:
            print(unreachable(url), file=sys.stderr)
            return 1
        except ApiError as exc:
            print(f"stepwatch policy: {exc.message}", file=sys.stderr)
            return 1
    if getattr(args, "output", "text") == "json":
        print(json.dumps(found, indent=2))
        return 0
    print(describe_policy(found, what))
    return 0


def describe_policy(found: dict[str, Any], what: str) -> str:
    """The policy answer as lines: what is set here, what applies, and what it did."""
    own = found.get("job", found.get("policy")) or {}
    effective = found.get("effective") or {}
    set_by = found.get("set_by") or {}
    lines = [f"policy of {what}: " + (json.dumps(own) if own else "nothing set here")]
    on = effective.get("on") or {}
    if not on:
        lines.append("  no actions: health is shown, nothing is done")
    for trigger, action in on.items():
        by = f"  (set by the {set_by[trigger]})" if trigger in set_by else ""
        lines.append(f"  on {trigger:<14} {action}{by}")
    for key in ("budget", "deadline", "dry_run", "metric", "mode", "notify"):
        if key in effective:
            value = effective[key]
            if key == "deadline":
                value = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))
            lines.append(f"  {key:<17} {value}")
    for trigger, fired in (found.get("fired") or {}).items():
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(fired.get("t", 0)))
        dry = "dry run: would " if fired.get("dry_run") else ""
        lines.append(f"  acted on {trigger} at {when}: {dry}{fired.get('action')} ({fired.get('reason', '')})")
    return "\n".join(lines)
