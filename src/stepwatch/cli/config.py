"""``stepwatch config``: the reporter's settings as this process would resolve them, and where from."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .._env import default_job_name, detect_identity
from .._settings import SETTINGS, SettingError, resolve

__all__ = ["register", "run"]


def register(commands: Any) -> None:
    """Add the ``config`` command."""
    parser = commands.add_parser(
        "config",
        help="show the reporter's settings, their environment variables and current values",
        description=(
            "Show every setting of the report core: its environment variables, default and the value "
            "this environment gives it. Precedence: init() argument, STEPWATCH_*, KUBEFLOW_TRAINER_SERVER_*, "
            "default."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def _source(setting_env: tuple[str, ...]) -> str:
    for var in setting_env:
        if os.environ.get(var):
            return var
    return "default"


def run(args: argparse.Namespace) -> int:
    """Print the resolved settings."""
    try:
        resolved = resolve({})
    except SettingError as exc:
        print(f"stepwatch config: {exc}", file=sys.stderr)
        return 1
    identity = detect_identity()
    rows = []
    for setting in SETTINGS:
        value = getattr(resolved, setting.name)
        if setting.name == "token" and value:
            value = "***"
        if setting.name == "job" and value is None:
            value = default_job_name()
        if setting.name == "metrics_port":  # parsed to (host, port), False (off) or None (by the environment)
            value = f"{value[0]}:{value[1]}" if value else ("off" if value is False else "auto")
        rows.append(
            {
                "name": setting.name,
                "value": value,
                "source": _source(setting.env),
                "env": ", ".join(setting.env),
                "help": setting.help,
            }
        )
    if args.json:
        print(json.dumps({"settings": rows, "rank": identity.rank, "world_size": identity.world_size}, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['value']!s:<28} from {r['source']}")
        print(f"{'':<{width}}  {r['env']}: {r['help']}")
    print(f"\nrank {identity.rank} of {identity.world_size} on {identity.host}")
    return 0
