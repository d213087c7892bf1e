"""``stepwatch describe NAME``: one job in full, as ``kubectl describe`` shows a resource.

State and health with its evidence, progress and ETA, cost (spent, projected, wasted), the last
value of every metric, the hyperparameters, pending commands, and the job's latest events.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from ..protocol import ENDED_STATES
from ..protocol.progression import SUMMARY_METRIC, is_eval_metric
from ._errors import NO_SUCH_JOB, no_such_job
from ._format import (
    add_server_flags,
    age,
    clock_time,
    duration,
    epoch_text,
    eta_text,
    evidence_lines,
    missing_client,
    printable,
    progress_text,
    rate_words,
    step_text,
    unreachable,
)

__all__ = ["describe", "register", "run"]

EVENTS = 20
"""The latest events shown."""


def register(commands: Any) -> None:
    """Add the ``describe`` command."""
    parser = commands.add_parser(
        "describe",
        help="show one job in full: health and its evidence, progress, cost, metrics, params, events",
        description=(
            "Show one job (its latest attempt, or --attempt N): state, health with the evidence for it, progress "
            f"and ETA, cost, the last value of every metric, hyperparameters, pending commands and the last {EVENTS} "
            "events."
        ),
    )
    parser.add_argument("name", metavar="NAME", help="the job")
    add_server_flags(parser)
    parser.add_argument("--attempt", type=int, metavar="N", help="an earlier attempt of the job")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read the job and its events, and print them."""
    try:
        from ..client import ApiError, Client, NotFound, ServerUnreachable, server_url
    except ImportError as exc:
        return missing_client("describe", exc)
    url = server_url(args.server)
    who = f"{args.namespace}/{args.name}"
    with Client(url, args.token) as client:
        try:
            view = client.job(args.name, args.namespace, attempt=args.attempt).raw
            events = [dict(event.raw) for event in client.events(args.name, args.namespace, limit=1000)]
        except NotFound:
            if args.attempt is not None:  # the job may be there without that attempt
                print(f"stepwatch describe: {who} has no attempt {args.attempt}", file=sys.stderr)
            else:
                print(no_such_job("describe", client, args.name, args.namespace, url, args), file=sys.stderr)
            return NO_SUCH_JOB
        except ServerUnreachable:
            print(unreachable(url), file=sys.stderr)
            return 1
        except ApiError as exc:
            print(f"stepwatch describe: {who}: {exc.message}", file=sys.stderr)
            return 1
    describe(view, events[-EVENTS:], sys.stdout)
    return 0


def describe(view: dict[str, Any], events: list[dict[str, Any]], out: TextIO, now: float | None = None) -> None:
    """Print a job view and its events, section by section."""
    now = time.time() if now is None else now
    progress = view.get("progress") or {}
    eta = view.get("eta") or {}
    times = view.get("times") or {}
    health = view.get("health") or {}
    cost = view.get("cost") or {}
    lines: list[tuple[str, str]] = [
        ("Name", str(view.get("name", ""))),
        ("Namespace", str(view.get("namespace", ""))),
        ("Attempt", str(view.get("attempt", "-"))),
        ("State", str(view.get("state", "")) + (f" ({view['reason']})" if view.get("reason") else "")),
        ("Created", f"{clock_time(times.get('created'), now)} ({age(times.get('created'), now)} ago)"),
        ("Last report", _ago(times.get("report_age_seconds"))),
        ("Source", str(view.get("source", "native"))),
    ]
    _section(out, None, lines)
    _section(out, "Health", _health_lines(health, now))
    history = view.get("health_history") or []
    # a job that was only ever healthy (or not yet judged, the "unknown" spans between verdicts): nothing to add
    if any(span.get("state") not in ("healthy", "unknown") for span in history):
        ended = view.get("state") in ENDED_STATES
        _section(out, "Health history", [_span_line(span, now, ended) for span in history])
    _section(
        out,
        "Progress",
        [
            ("Progress", progress_text(view)),
            ("Step", step_text(progress)),
            ("Epoch", epoch_text(progress)),
            ("Steps/s", rate_words(view, now, long=True)),
            ("ETA", _eta_line(eta)),
            ("Finishes", clock_time(eta.get("finish_time"), now)),
            ("Elapsed", duration(times.get("elapsed_seconds"))),
            ("World size", str(progress.get("world_size") or 1)),
            *_reported_end(view),
        ],
    )
    if cost.get("rate_per_hour") is not None or cost.get("spent") is not None:
        currency = str(cost.get("currency") or "USD")
        rate = cost.get("rate_per_hour")
        _section(
            out,
            "Cost",
            [
                ("Rate", f"{_money(rate)} {currency}/h" if rate is not None else "— (ended: it costs nothing now)"),
                ("Spent", _money(cost.get("spent"))),
                ("Projected", _money(cost.get("projected"))),
                ("Wasted", _money(cost.get("wasted"))),
                ("Saved", _money(cost.get("saved"))),
            ],
        )
    policy_lines = _policy_lines(view.get("policy") or {}, now)
    if policy_lines:
        _section(out, "Policy", policy_lines)
    _metric_sections(out, view.get("metrics") or {})
    params = view.get("params") or {}
    _section(out, "Params", [(k, str(v)) for k, v in sorted(params.items())])
    pending = view.get("pending_commands") or []
    _section(out, "Pending commands", [(c.get("kind", "?"), c.get("reason") or "-") for c in pending])
    _events_section(out, events, now)


def _health_lines(health: dict[str, Any], now: float) -> list[tuple[str, str]]:
    """The Health section: the verdict, since when, why, and the evidence behind it."""
    evidence = health.get("evidence") or {}
    lines = [("State", str(health.get("state") or "unknown"))]
    if health.get("since") is not None:
        lines.append(("Since", f"{clock_time(health['since'], now)} ({age(health['since'], now)} ago)"))
    if evidence.get("message"):
        lines.append(("Why", str(evidence["message"])))
    return lines + evidence_lines(evidence)


def _policy_lines(policy: dict[str, Any], now: float) -> list[tuple[str, str]]:
    """The Policy section: the effective actions (and who set each), limits, deadline, and what fired."""
    effective = policy.get("effective") or {}
    set_by = policy.get("set_by") or {}
    lines = [
        (f"On {trigger}", f"{action}" + (f" (set by the {set_by[trigger]})" if trigger in set_by else ""))
        for trigger, action in (effective.get("on") or {}).items()
    ]
    lines += [(key.capitalize(), str(effective[key])) for key in ("budget", "dry_run", "metric") if key in effective]
    if "deadline" in effective:
        lines.append(("Deadline", clock_time(effective["deadline"], now)))
    for trigger, fired in (policy.get("fired") or {}).items():
        what = ("would " if fired.get("dry_run") else "") + str(fired.get("action"))
        lines.append((f"Acted on {trigger}", f"{what} at {clock_time(fired.get('t'), now)}"))
    return lines


def _events_section(out: TextIO, events: list[dict[str, Any]], now: float) -> None:
    """The Events section: one line per event, its time, kind and message (``<none>`` without any)."""
    out.write("Events:\n")
    if not events:
        out.write("  <none>\n")
    for event in events:
        kind, message = printable(str(event.get("kind", ""))), printable(str(event.get("message", "")))
        out.write(f"  {clock_time(event.get('t'), now):>12}  {kind:<14} {message}\n")


def _section(out: TextIO, title: str | None, lines: list[tuple[str, str]]) -> None:
    indent = "  " if title else ""
    if title:
        out.write(f"{title}:\n")
        if not lines:
            out.write("  <none>\n")
            return
    width = max((len(k) for k, _ in lines), default=0) + 1
    for key, value in lines:
        out.write(f"{indent}{printable(key) + ':':<{width}} {printable(value)}\n")


def _span_line(span: dict[str, Any], now: float, ended: bool) -> tuple[str, str]:
    """One verdict the job had: its state, from when, for how long (to the job's end, or still), and what
    that time cost."""
    start = span.get("start", span.get("since") if span.get("since") is not None else span.get("from"))
    cost = span.get("wasted") if span.get("wasted") else span.get("cost")
    money = f", {_money(cost)}{' wasted' if span.get('wasted') else ''}" if cost is not None else ""
    still = "" if span.get("to") is not None or ended else ", still"
    return str(span.get("state", "")), f"{clock_time(start, now)} for {duration(span.get('seconds'))}{money}{still}"


def _metric_sections(out: TextIO, metrics: dict[str, Any]) -> None:
    """The last value of every metric; where there are eval metrics, as OpenShift AI's drawer lists them:
    the train metrics, then the eval ones."""
    values = [(k, f"{v:.6g}" if isinstance(v, (int, float)) else str(v)) for k, v in metrics.items()]
    evals = [(k, v) for k, v in values if is_eval_metric(k)]
    if evals:
        _section(out, "Train metrics", [(k, v) for k, v in values if not is_eval_metric(k)])
        _section(out, "Eval metrics", evals)
    else:
        _section(out, "Metrics", values)


def _reported_end(view: dict[str, Any]) -> list[tuple[str, str]]:
    """How the job's end was summed up where OpenShift AI's controller tracked it (``complete (early stopped)``,
    ``failed at 60%``): said once the job has ended, as the annotation says it."""
    if view.get("state") not in ENDED_STATES:
        return []
    metrics = (view.get("trainerStatus") or {}).get("metrics") or []
    said = [str(m.get("value")) for m in metrics if isinstance(m, dict) and m.get("name") == SUMMARY_METRIC]
    return [("OpenShift AI summary", said[-1])] if said else []


def _ago(seconds: float | None) -> str:
    return "-" if seconds is None else f"{duration(seconds)} ago"


def _money(value: Any) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _eta_line(eta: dict[str, Any]) -> str:
    """The ETA readers are shown, saying when the job reported it itself, with stepwatch's own beside it."""
    remaining = eta.get("remaining_seconds")
    if eta.get("source") != "reported" or remaining is None:
        return eta_text(remaining)
    own = eta.get("estimate_seconds")
    beside = f"; stepwatch's estimate {eta_text(own)}" if own is not None else ""
    return f"{eta_text(remaining)} (reported by the job{beside})"
