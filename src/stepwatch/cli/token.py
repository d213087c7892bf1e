"""``stepwatch token create|list|revoke``: API tokens of a server with authentication on.

Through the API they need an admin token of every namespace. The first one cannot come that way: an
operator who can open the server's database makes it there, ``stepwatch token create --role admin
--all-namespaces --name root --db PATH`` (or ``--database-url`` for PostgreSQL, for example through
``kubectl exec`` into the server's pod). It is an ordinary token: hashed, listed, revocable and audited,
and nothing secret sits in the server's configuration.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from datetime import datetime, timezone
from typing import Any

from ._format import add_token_flag, missing_client, plain_table, unreachable

__all__ = ["parse_duration", "register", "run"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``1y`` (or plain seconds) in seconds; ``ValueError`` otherwise."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdwy]?)\s*", text)
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"give a duration such as 30d, 12h or 90m, got {text!r}")
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]


def register(commands: Any) -> None:
    """Add the ``token`` command group."""
    parser = commands.add_parser(
        "token",
        help="create, list and revoke API tokens (servers with authentication on)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = actions.add_parser("create", help="create a token and print its secret (shown once)")
    create.add_argument("--role", required=True, choices=["viewer", "editor", "admin"])
    where = create.add_mutually_exclusive_group(required=True)
    where.add_argument("-n", "--namespace", action="append", metavar="NS", help="a namespace (repeat for more)")
    where.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    create.add_argument("--name", default=None, help="what it is for, shown in lists and the audit log")
    create.add_argument("--expires", metavar="DURATION", type=_duration, help="valid for 30d, 12h... (default: ever)")
    create.add_argument("--reason", default="", help="why (in the audit log)")
    direct = create.add_mutually_exclusive_group()
    direct.add_argument("--db", metavar="PATH", help="write into this SQLite database directly (the first token)")
    direct.add_argument("--database-url", metavar="URL", help="the same for a sqlite:/// or postgresql:// URL")
    _server_flags(create)
    create.set_defaults(run=run_create)

    listing = actions.add_parser("list", help="list tokens (never their secrets)")
    listing.add_argument("-o", "--output", choices=["table", "json"], default="table")
    _server_flags(listing)
    listing.set_defaults(run=run_list)

    revoke = actions.add_parser("revoke", help="revoke a token: refused at once")
    revoke.add_argument("id", metavar="ID", help="the token's id (see `stepwatch token list`)")
    revoke.add_argument("--reason", default="", help="why (in the audit log)")
    _server_flags(revoke)
    revoke.set_defaults(run=run_revoke)


def _server_flags(parser: Any) -> None:
    parser.add_argument(
        "--server",
        metavar="URL",
        help="stepwatch server (default: $STEPWATCH_SERVER, $STEPWATCH_URL, else http://127.0.0.1:8642)",
    )
    add_token_flag(parser)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Dispatch (argparse sets ``run`` per action)."""
    status: int = args.run(args)
    return status


def _default_name(args: argparse.Namespace) -> str:
    scope = "all" if args.all_namespaces else "+".join(args.namespace)
    return f"{args.role}-{scope}"[:64]


def run_create(args: argparse.Namespace) -> int:
    """Create a token through the API, or in the database for the first one."""
    namespaces = ["*"] if args.all_namespaces else list(args.namespace)
    name = args.name or _default_name(args)
    if args.db or args.database_url:
        return _create_in_database(args, namespaces, name)
    try:
        from ..client import ApiError, Client, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("token", exc)
    url = server_url(args.server)
    with Client(url, args.token) as client:
        try:
            token, secret = client.create_token(
                args.role, namespaces, name, expires_in=args.expires, reason=args.reason
            )
        except ServerUnreachable:
            print(unreachable(url), file=sys.stderr)
            return 1
        except ApiError as exc:
            print(f"stepwatch token create: {exc.message}", file=sys.stderr)
            return 1
    _print_secret(token.id, token.role, token.namespaces, token.expires_at, secret)
    return 0


def _create_in_database(args: argparse.Namespace, namespaces: list[str], name: str) -> int:
    try:
        from ..server.api.auth import mint_token
        from ..server.app import open_store
        from ..server.settings import ServerSettings
        from ..server.store import AuditEntry, StoreError
        from ..server.store.access import hash_token
    except ImportError as exc:
        print(f"stepwatch token create --db needs the server extra ({exc.name} is missing)", file=sys.stderr)
        return 1
    now = time.time()
    expires_at = now + args.expires if args.expires else None
    try:
        settings = ServerSettings.resolve({"db": args.db, "database_url": args.database_url}, {})
        token, secret = mint_token(args.role, namespaces, name, now, expires_at=expires_at, by="stepwatch token --db")
        store = open_store(settings)
    except (ValueError, StoreError) as exc:
        print(f"stepwatch token create: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    try:
        entry = AuditEntry(now, token.created_by, "token_created", reason=args.reason, data={"id": token.id})
        store.create_token(token, hash_token(secret), entry)
    except StoreError as exc:
        print(f"stepwatch token create: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    _print_secret(token.id, token.role, token.namespaces, token.expires_at, secret)
    return 0


def _print_secret(token_id: str, role: str, namespaces: tuple[str, ...], expires_at: float | None, secret: str) -> None:
    scope = "every namespace" if "*" in namespaces else ", ".join(namespaces)
    until = f", until {_when(expires_at)}" if expires_at else ""
    print(f"token {token_id}: {role} of {scope}{until}", file=sys.stderr)
    print("the secret is shown this once; keep it (for example export STEPWATCH_API_TOKEN=...):", file=sys.stderr)
    print(secret, flush=True)


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def run_list(args: argparse.Namespace) -> int:
    """List the tokens."""
    try:
        from ..client import ApiError, Client, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("token", exc)
    url = server_url(args.server)
    with Client(url, args.token) as client:
        try:
            tokens = client.tokens()
        except ServerUnreachable:
            print(unreachable(url), file=sys.stderr)
            return 1
        except ApiError as exc:
            print(f"stepwatch token list: {exc.message}", file=sys.stderr)
            return 1
    if args.output == "json":
        import json

        print(json.dumps([t.__dict__ | {"namespaces": list(t.namespaces)} for t in tokens], indent=2))
        return 0
    rows = [
        [
            t.id,
            t.name,
            t.role,
            "*" if "*" in t.namespaces else ",".join(t.namespaces),
            _when(t.created_at),
            _when(t.expires_at),
            "revoked" if t.revoked_at else ("valid" if t.valid else "expired"),
        ]
        for t in tokens
    ]
    print(plain_table(["ID", "NAME", "ROLE", "NAMESPACES", "CREATED", "EXPIRES", "STATE"], rows))
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    """Revoke a token."""
    try:
        from ..client import ApiError, Client, NotFound, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("token", exc)
    url = server_url(args.server)
    with Client(url, args.token) as client:
        try:
            token = client.revoke_token(args.id, reason=args.reason)
        except NotFound:
            print(f"stepwatch token revoke: no token {args.id} (`stepwatch token list` shows them)", file=sys.stderr)
            return 1
        except ServerUnreachable:
            print(unreachable(url), file=sys.stderr)
            return 1
        except ApiError as exc:
            print(f"stepwatch token revoke: {exc.message}", file=sys.stderr)
            return 1
    print(f"revoked token {token.id} ({token.name}); the server refuses it from now on")
    return 0
