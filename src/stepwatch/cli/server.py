"""``stepwatch server``: serve the API (and, later, the dashboard) with uvicorn on the embedded database."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["register", "run"]


def register(commands: Any) -> None:
    """Add the ``server`` command."""
    parser = commands.add_parser(
        "server",
        help="run the stepwatch server (API, live updates) on the embedded database",
        description=(
            "Run the stepwatch server. It listens on 127.0.0.1:8642 and stores in SQLite under the user's data "
            "directory ($STEPWATCH_HOME, else $XDG_DATA_HOME/stepwatch) unless told otherwise."
        ),
    )
    parser.add_argument(
        "--host", default=None, help="address to listen on (default 127.0.0.1; env STEPWATCH_SERVER_HOST)"
    )
    parser.add_argument("--port", type=int, default=None, help="port (default 8642; env STEPWATCH_SERVER_PORT)")
    parser.add_argument("--workers", default=None, help=argparse.SUPPRESS)  # removed: refused with ONE_PROCESS
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--db", default=None, help="SQLite file (env STEPWATCH_DB)")
    where.add_argument(
        "--database-url",
        default=None,
        help="database URL: sqlite:///PATH or postgresql://USER@HOST/DB (env STEPWATCH_DATABASE_URL)",
    )
    parser.add_argument(
        "--tls-certfile", default=None, help="serve HTTPS with this certificate (PEM; env STEPWATCH_TLS_CERTFILE)"
    )
    parser.add_argument(
        "--tls-keyfile", default=None, help="the certificate's private key (PEM; env STEPWATCH_TLS_KEYFILE)"
    )
    parser.add_argument(
        "--auth",
        default=None,
        choices=["none", "tokens", "proxy"],
        help="who may do what (default none: loopback only; env STEPWATCH_AUTH; see docs/auth.md)",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow --auth none on an address other than loopback (env STEPWATCH_INSECURE)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "action",
        nargs="?",
        choices=["stop"],
        help="stop: end the background server that `stepwatch run` started (all of them, or the one on --port)",
    )
    parser.set_defaults(run=run)


ONE_PROCESS = "one process serves SQLite; for several, run replicas on PostgreSQL (docs/server.md)"
"""Why ``--workers`` and ``STEPWATCH_SERVER_WORKERS`` are refused: several server processes on one SQLite
file were removed (the way to more than one process is PostgreSQL with several replicas)."""


def removed_workers(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The one-line refusal of a server asked for several processes the removed way; ``None`` when not asked."""
    if getattr(args, "workers", None) is not None:
        return f"--workers: {ONE_PROCESS}"
    if environ.get("STEPWATCH_SERVER_WORKERS"):
        return f"STEPWATCH_SERVER_WORKERS: {ONE_PROCESS}"
    return None


def port_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on ``host:port``, in words; ``None`` when it can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (
                    f"port {port} on {host} is already in use (another stepwatch server? `stepwatch jobs` talks to "
                    f"it); choose another with --port"
                )
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def stop(port: int | None) -> int:
    """``stepwatch server stop``: end the background servers ``stepwatch run`` started; 1 when there is none."""
    from . import _background

    try:
        servers = _background.running(port)
    except ImportError as exc:
        print(f"stepwatch server stop needs its extra ({exc.name} is missing)", file=sys.stderr)
        return 1
    if not servers:
        where = f" on port {port}" if port is not None else ""
        print(
            f"stepwatch server stop: no background server{where} (one `stepwatch run` started, recorded in "
            f"{_background.home()}); a server started with `stepwatch server` ends with Ctrl-C",
            file=sys.stderr,
        )
        return 1
    status = 0
    for server in servers:
        if _background.stop(server):
            print(f"stopped the background server at {server.url} (pid {server.pid})")
        else:
            print(f"stepwatch server stop: the server at {server.url} (pid {server.pid}) did not end", file=sys.stderr)
            status = 1
    return status


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted (or, with ``stop``, end the background server)."""
    if getattr(args, "action", None) == "stop":
        return stop(args.port)
    refused = removed_workers(args, os.environ)
    if refused is not None:
        print(f"stepwatch server: {refused}", file=sys.stderr)
        return 2
    try:
        from ..server import ServerSettings, create_app
        from ..server.serving import protocol_class, serve, tune_for_serving
        from ..server.store import StoreError
    except ImportError as exc:
        print(
            f"stepwatch server needs its extra ({exc.name} is missing): pip install 'stepwatch[server]'",
            file=sys.stderr,
        )
        return 1
    try:
        settings = ServerSettings.resolve(
            {
                "host": args.host,
                "port": args.port,
                "db": args.db,
                "database_url": args.database_url,
                "auth": args.auth,
                "insecure": args.insecure,
                "tls_certfile": getattr(args, "tls_certfile", None),
                "tls_keyfile": getattr(args, "tls_keyfile", None),
            }
        )
        path = settings.database_shown()
        tls = tls_files(settings.tls_certfile, settings.tls_keyfile)
    except ValueError as exc:
        print(f"stepwatch server: {exc}", file=sys.stderr)
        return 2
    problem = port_problem(settings.host, settings.port)
    if problem:
        print(f"stepwatch server: {problem}", file=sys.stderr)
        return 1
    # keep-alive past the 10 s heartbeat of ranks other than 0, so they do not reconnect every time
    options: dict[str, Any] = {
        "log_level": args.log_level,
        "access_log": False,
        "timeout_keep_alive": 30,
        # live streams end as a stop begins (server.serving.stopping); a client that reads nothing is cut after 5 s
        "timeout_graceful_shutdown": 5,
        "http": protocol_class(settings.head_timeout_s),  # slow clients are cut off (uvicorn does not bound a head)
        "proxy_headers": False,  # the peer address stays the peer's: auth proxy trusts identity headers by it
        "ssl_certfile": tls.get("ssl_certfile"),
        "ssl_keyfile": tls.get("ssl_keyfile"),
    }
    shown = f"[{settings.host}]" if ":" in settings.host else settings.host
    scheme = "https" if tls else "http"
    where = f"{scheme}://{shown}:{settings.port} (database {path})"
    try:
        app = create_app(settings)
    except ValueError as exc:  # unsafe access settings
        print(f"stepwatch server: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # a chat target in STEPWATCH_NOTIFY without the notify extra: says which extra
        if "stepwatch[" not in str(exc):
            raise
        print(f"stepwatch server: {exc}", file=sys.stderr)
        return 1
    except StoreError as exc:
        print(f"stepwatch server: {exc}", file=sys.stderr)
        return 1
    print(f"stepwatch server on {where}; API docs at /docs", flush=True)
    tune_for_serving()  # flat tail latency: no full GC pause every few seconds (see server.serving.process)
    started = serve(app, host=settings.host, port=settings.port, **options)
    return 0 if started else 3  # (uvicorn's exit status for a failed startup, as uvicorn.run exits with)


def tls_files(certfile: str | None, keyfile: str | None) -> dict[str, str]:
    """uvicorn's TLS arguments (none: plain HTTP); ``ValueError`` when only one file is given or one is missing."""
    if certfile is None and keyfile is None:
        return {}
    if certfile is None or keyfile is None:
        raise ValueError("TLS needs both a certificate (--tls-certfile) and its key (--tls-keyfile)")
    for what, name in (("certificate", certfile), ("key", keyfile)):
        if not os.path.isfile(name):
            raise ValueError(f"TLS {what} {name} is not a readable file")
    return {"ssl_certfile": certfile, "ssl_keyfile": keyfile}
