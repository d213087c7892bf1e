"""``kubectl stepwatch``: the job table as a kubectl plugin (the installed executable ``kubectl-stepwatch``).

::

    kubectl stepwatch get [NAME] [-n NS | -A] [-o wide|json|yaml]      (also: kubectl stepwatch jobs ...)
    kubectl stepwatch stop NAME [-n NS] [--reason TEXT]

kubectl runs any executable named ``kubectl-NAME`` on the PATH as ``kubectl NAME``. Like kubectl's own
commands, the namespace is ``-n``, else the current context's namespace in the kubeconfig
(``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``; ``--context`` picks another context), else
``default``. The stepwatch server is ``--server``, else ``$STEPWATCH_SERVER`` or ``$STEPWATCH_URL``;
an API token (a server with ``--auth tokens``) comes from ``$STEPWATCH_API_TOKEN``.

Built on the SDK and on ``stepwatch jobs``' rows (:func:`.jobs.job_row`): the same figures, in kubectl's
columns.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .._version import __version__
from ..protocol import LIMITS
from ._format import Cell, missing_client, print_table
from .jobs import WIDE_HEADERS, job_row, sort_jobs
from .stop import default_reason

__all__ = ["COLUMNS", "WIDE_COLUMNS", "kubeconfig_namespace", "main"]

PROG = "kubectl stepwatch"
COLUMNS = ("NAME", "STATE", "HEALTH", "PROGRESS%", "ETA", "LOSS", "AGE")
WIDE_COLUMNS = (
    "NAME",
    "STATE",
    "HEALTH",
    "PROGRESS%",
    "STEP",
    "EPOCH",
    "ETA",
    "LOSS",
    "COST",
    "STEPS/S",
    "FINISH",
    "AGE",
)
"""``-o wide``; with ``-A`` a NAMESPACE column comes first, as in ``kubectl get -A``."""


# ----------------------------------------------------------------------------------- kubeconfig


def kubeconfig_namespace(
    kubeconfig: str | None = None, context: str | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """The namespace of the kubeconfig's current context (or of ``context``), as kubectl reads it; ``default``
    when there is no kubeconfig, no such context, or it names no namespace.

    ``kubeconfig`` is a file, else ``$KUBECONFIG`` (files separated by ``os.pathsep``), else
    ``~/.kube/config``. Several files merge by kubectl's rule: the first to set a value wins. (The
    ``kubernetes`` package's loader is not used: with several files it takes the last file's current
    context, kubectl the first's.) Read as YAML, or as JSON when PyYAML is missing.
    """
    env = os.environ if environ is None else environ
    paths = kubeconfig or env.get("KUBECONFIG") or str(Path(env.get("HOME") or "~").expanduser() / ".kube" / "config")
    return _namespace_by_reading(paths, context) or "default"


def _namespace_by_reading(paths: str, context: str | None) -> str | None:
    current: str | None = context
    contexts: dict[str, Any] = {}
    for path in (p for p in paths.split(os.pathsep) if p):
        data = _load(Path(path).expanduser())
        if not isinstance(data, dict):
            continue
        current = current or data.get("current-context") or None
        for entry in data.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name") not in contexts:
                contexts[str(entry.get("name"))] = entry.get("context") or {}
    namespace = (contexts.get(current or "") or {}).get("namespace") if current else None
    return str(namespace) if namespace else None


def _yaml() -> Any:
    """PyYAML, or ``None`` when it is not installed (it comes with the ``kubernetes`` package)."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        return None
    return yaml


def _load(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    yaml = _yaml()
    try:
        return json.loads(text) if yaml is None else yaml.safe_load(text)
    except (ValueError, getattr(yaml, "YAMLError", ValueError)):
        return None


# -------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """``kubectl stepwatch`` and its two commands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help="the namespace (default: the kubeconfig's current context's, else default)",
    )
    common.add_argument(
        "--server",
        metavar="URL",
        help="stepwatch server (default: $STEPWATCH_SERVER, else $STEPWATCH_URL, else http://127.0.0.1:8642)",
    )
    common.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig to read the namespace from")
    common.add_argument("--context", metavar="NAME", help="kubeconfig context to read the namespace from")

    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "stepwatch's view of training jobs, for kubectl users: progress %, ETA, loss and health that "
            "`kubectl get trainjob` does not show; and a graceful stop (checkpoint, then stop)."
        ),
        epilog=(
            "The server: --server or $STEPWATCH_URL; in a cluster, for example "
            "`kubectl port-forward -n stepwatch svc/stepwatch 8642` and --server http://127.0.0.1:8642. "
            "With API tokens on the server, set $STEPWATCH_API_TOKEN."
        ),
    )
    parser.add_argument("--version", action="version", version=f"kubectl-stepwatch {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    get = commands.add_parser(
        "get",
        aliases=["jobs"],  # the name of the same table in the stepwatch CLI
        parents=[common],
        help="list jobs (or one) with state, health, progress, ETA, loss and age",
        description="List the jobs of a namespace (or of all, -A), or show one, with state, health, progress %, "
        "ETA, training loss and age.",
    )
    get.add_argument("name", metavar="NAME", nargs="?", help="one job (default: every job of the namespace)")
    get.add_argument("-A", "--all-namespaces", action="store_true", help="jobs of every namespace")
    get.add_argument(
        "-o",
        "--output",
        choices=("wide", "json", "yaml"),
        help="wide: also step, epoch, cost, steps/s and finish time; json or yaml: the API's job objects",
    )
    get.set_defaults(run=_get)

    stop = commands.add_parser(
        "stop",
        parents=[common],
        help="ask a job to save a checkpoint, then stop",
        description="Ask a job to save a checkpoint, then stop at its next step boundary. A TrainJob that does not "
        "obey is suspended by stepwatch's runner after its grace period.",
    )
    stop.add_argument("name", metavar="NAME", help="the job")
    stop.add_argument("--reason", metavar="TEXT", help="why (shown to the job and in its events)")
    stop.set_defaults(run=_stop)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``kubectl-stepwatch`` executable; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    if args.namespace is None:
        args.namespace = kubeconfig_namespace(args.kubeconfig, args.context)
    try:
        status: int = args.run(args)
    except KeyboardInterrupt:
        return 130
    except ImportError as exc:  # `pip install stepwatch` installs this command without the client
        from ._errors import missing_extra

        line = missing_extra(PROG, exc)
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1
    return status


# ------------------------------------------------------------------------------------ commands


def _error(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 1


def _unreachable(url: str) -> str:
    return (
        f"no stepwatch server at {url}: give --server or set STEPWATCH_URL (in a cluster, for example "
        "`kubectl port-forward -n stepwatch svc/stepwatch 8642` and --server http://127.0.0.1:8642)"
    )


def _api_error(exc: Any) -> int:
    from ..client import Unauthorized

    hint = " (set STEPWATCH_API_TOKEN to an API token of the server)" if isinstance(exc, Unauthorized) else ""
    return _error(f"{exc.message}{hint}")


def _get(args: argparse.Namespace) -> int:
    try:
        from ..client import ApiError, Client, NotFound, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("kubectl plugin", exc)
    url = server_url(args.server)
    namespace = None if args.all_namespaces else args.namespace
    with Client(url) as client:
        try:
            if args.name is not None:
                if args.all_namespaces:
                    return _error("a job NAME goes with one namespace (-n NS), not with -A")
                views = [client.job(args.name, namespace).raw]
            else:
                views = sort_jobs([job.raw for job in client.jobs(namespace, sort="name")], None)
        except NotFound:
            if args.name is None:  # an unknown namespace: no jobs there
                views = []
            else:
                return _error(f'job "{args.name}" not found in namespace "{args.namespace}" at {url}')
        except ServerUnreachable:
            return _error(_unreachable(url))
        except ApiError as exc:
            return _api_error(exc)
    if args.output in ("json", "yaml"):
        document: Any = views[0] if args.name is not None else {"apiVersion": "v1", "kind": "List", "items": views}
        return _dump(document, args.output)
    if not views:
        where = "" if namespace is None else f" in {namespace} namespace"
        print(f"No resources found{where}.", file=sys.stderr)
        return 0
    columns = WIDE_COLUMNS if args.output == "wide" else COLUMNS
    if args.all_namespaces:
        columns = ("NAMESPACE", *columns)
    rows: list[list[str | Cell]] = []
    for view in views:
        cells = dict(zip(WIDE_HEADERS, job_row(view, wide=True)))
        rows.append([cells[c] for c in columns])
    print_table(columns, rows)
    return 0


def _dump(document: Any, output: str) -> int:
    if output == "json":
        print(json.dumps(document, indent=4))
        return 0
    yaml = _yaml()
    if yaml is None:
        return _error("-o yaml needs PyYAML (pip install pyyaml); -o json needs nothing")
    print(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), end="")
    return 0


def _stop(args: argparse.Namespace) -> int:
    try:
        from ..client import ApiError, Client, Conflict, NotFound, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("kubectl plugin", exc)
    url = server_url(args.server)
    who = f"{args.namespace}/{args.name}"
    reason = (args.reason if args.reason is not None else default_reason())[: LIMITS.max_reason_length]
    with Client(url) as client:
        try:
            sent = client.stop(args.name, args.namespace, checkpoint=True, reason=reason)
        except NotFound:
            return _error(f'job "{args.name}" not found in namespace "{args.namespace}" at {url}')
        except Conflict as exc:  # it has already ended
            return _error(exc.message)
        except ServerUnreachable:
            return _error(_unreachable(url))
        except ApiError as exc:
            return _api_error(exc)
    because = f" ({sent.reason})" if sent.reason else ""
    print(f"asked {who} to save a checkpoint, then stop{because}; command {sent.id}")
    return 0
