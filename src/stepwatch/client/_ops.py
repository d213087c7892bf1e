"""Every API call, written once as an operation (see ``_core``): the request, then the typed result.

The first parameter of each is the client's :class:`Config`; the rest is the public signature that
:class:`~stepwatch.client.Client` and :class:`~stepwatch.client.AsyncClient` both expose, so the two
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..protocol import COMMAND_KINDS, LIMITS, Command, jobs_path
from ._core import Config, Operation, Request, read_json
from ._errors import Conflict
from ._job import Columns, Job, JobList
from ._models import CommandSent, Costs, Event, History, JobPolicy, NamespacePolicy, Policy, command_from
from ._parse import as_dict, as_list, opt_int, req_str

__all__ = [
    "checkpoint",
    "command",
    "costs",
    "events",
    "history",
    "job",
    "jobs",
    "namespace_policy",
    "pending_commands",
    "ping",
    "policy",
    "register",
    "set_policy",
    "set_state",
    "stop",
]


def _csv(value: str | Sequence[str] | None) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    return ",".join(value) or None


def _job_path(config: Config, /, name: str, namespace: str | None) -> str:
    return f"{jobs_path(config.ns(namespace))}/{name}"


def ping(config: Config, /) -> Operation[dict[str, Any]]:
    """The server's version (``{"version", "api_version"}``); :class:`ServerUnreachable` when none answers."""
    response = yield Request("GET", "/api/v1/version")
    found = as_dict(read_json(response), "version")
    return dict(found)


def jobs(
    config: Config,
    /,
    namespace: str | None = None,
    *,
    state: str | Sequence[str] | None = None,
    health: str | Sequence[str] | None = None,
    text: str | None = None,
    sort: str | None = None,
    limit: int = 1000,
    offset: int = 0,
    all_attempts: bool = False,
) -> Operation[JobList]:
    """Jobs (their latest attempts), filtered and sorted by the server.

    ``namespace``: one namespace (default: every namespace). ``state``/``health``: one or several
    (``"running"``, ``["stalled", "diverging"]``). ``text``: a substring of the name. ``sort``:
    ``name``, ``namespace``, ``state``, ``progress``, ``step``, ``created``, ``updated`` or ``eta``,
    ``-`` first for descending (default ``-updated``). ``limit`` is at most 10,000; ``JobList.total``
    says how many matched.
    """
    params: dict[str, Any] = {"limit": limit}
    if offset:
        params["offset"] = offset
    for key, value in (
        ("namespace", namespace),
        ("state", _csv(state)),
        ("health", _csv(health)),
        ("text", text),
        ("sort", sort),
    ):
        if value:
            params[key] = value
    if all_attempts:
        params["all_attempts"] = "true"
    params["form"] = "columns"  # the same views, 40% of the bytes and several times quicker to decode
    response = yield Request("GET", "/api/v1/jobs", params=params)
    body = as_dict(read_json(response), "jobs")
    total = body.get("total")
    if "columns" in body:
        listed = _listed(Columns(body["columns"], "jobs.columns"))
    else:  # a server from before the column form answers with items
        items = as_list(body.get("items"), "jobs.items")
        listed = [Job(item, f"jobs.items[{i}]") for i, item in enumerate(items)]
    return JobList(listed, total if isinstance(total, int) else None)


def _listed(columns: Columns) -> list[Job]:
    """The jobs of a list in column form, their identities checked a column at a time."""
    n = columns.length
    identity = []
    for key in ("namespace", "name", "state"):
        column = columns.column(key)
        if column is None or not set(map(type, column)) <= {str}:  # the slow path raises, naming the job
            column = [req_str({key: v}, key, f"jobs.columns[{i}]") for i, v in enumerate(column or [None] * n)]
        identity.append(column)
    attempts = columns.column("attempt") or [None] * n
    if not set(map(type, attempts)) <= {int}:
        attempts = [opt_int({"attempt": v}, "attempt", f"jobs.columns[{i}]") or 1 for i, v in enumerate(attempts)]
    return [
        Job._listed(columns, i, namespace, name, state, attempt or 1)
        for i, (namespace, name, state, attempt) in enumerate(zip(*identity, attempts))
    ]


def job(config: Config, /, name: str, namespace: str | None = None, *, attempt: int | None = None) -> Operation[Job]:
    """One job, with its metric names, pending commands, policy and ranks (``attempt``: an earlier one)."""
    params = {"attempt": attempt} if attempt else None
    response = yield Request("GET", _job_path(config, name, namespace), params=params)
    return Job(read_json(response))


def history(
    config: Config,
    /,
    name: str,
    namespace: str | None = None,
    *,
    metrics: str | Sequence[str] | None = None,
    max_points: int = 1000,
    attempt: int | None = None,
) -> Operation[History]:
    """A job's metric history, downsampled by the server to at most ``max_points`` per metric (extremes and
    NaN windows kept): ``history["loss"].values``, ``.rows()``, ``.to_pandas()``."""
    params: dict[str, Any] = {"max_points": max_points}
    if metrics:
        params["metrics"] = _csv(metrics)
    if attempt:
        params["attempt"] = attempt
    response = yield Request("GET", f"{_job_path(config, name, namespace)}/history", params=params)
    return History.from_dict(as_dict(read_json(response), "history"))


def events(
    config: Config,
    /,
    name: str,
    namespace: str | None = None,
    *,
    after: int = 0,
    limit: int = 100,
    attempt: int | None = None,
) -> Operation[list[Event]]:
    """A job's events (registered, started, commands, health changes, policy actions...), oldest first,
    those with an id over ``after``."""
    params: dict[str, Any] = {"after": after, "limit": limit}
    if attempt:
        params["attempt"] = attempt
    response = yield Request("GET", f"{_job_path(config, name, namespace)}/events", params=params)
    items = as_list(as_dict(read_json(response), "events").get("items"), "events.items")
    return [Event.from_dict(as_dict(e, f"events.items[{i}]"), f"events.items[{i}]") for i, e in enumerate(items)]


def register(config: Config, /, name: str, namespace: str | None = None, **fields: Any) -> Operation[tuple[Job, str]]:
    """Register a job (or its next attempt); returns the job and its write token (shown once).

    ``fields``: ``total_steps``, ``total_epochs``, ``gpus``, ``gpu_hour_cost``, ``gpu_type``, ``source``,
    ``supersede``, ``policy``, ``params``. Not retried: a second registration would be a second attempt.
    """
    if isinstance(fields.get("policy"), Policy):
        fields["policy"] = fields["policy"].to_dict()
    response = yield Request("POST", jobs_path(config.ns(namespace)), json={"name": name, **fields}, idempotent=False)
    body = as_dict(read_json(response), "register")
    return Job(body.get("job"), "register.job"), req_str(body, "token", "register")


def command(
    config: Config, /, name: str, kind: str, namespace: str | None = None, *, reason: str = ""
) -> Operation[CommandSent]:
    """Queue one command (``stop`` or ``checkpoint``) for a job's reporter; never retried."""
    if kind not in COMMAND_KINDS:
        raise ValueError(f"kind must be one of {', '.join(COMMAND_KINDS)}, got {kind!r}")
    response = yield Request(
        "POST",
        f"{_job_path(config, name, namespace)}/commands",
        json={"kind": kind, "reason": reason[: LIMITS.max_reason_length]},
        idempotent=False,
    )
    return CommandSent(config.ns(namespace), name, (command_from(read_json(response)),))


def stop(
    config: Config, /, name: str, namespace: str | None = None, *, checkpoint: bool = True, reason: str = ""
) -> Operation[CommandSent]:
    """Ask a job to stop at its next step boundary: with ``checkpoint`` (the default) a checkpoint command
    first, then the stop (as a ``checkpoint_stop`` policy does), so no work is lost.

    A job started with ``stepwatch run`` that does not obey is terminated after its grace period.
    :class:`Conflict` when the job has already ended.
    """
    sent: list[Command] = []
    if checkpoint:
        try:
            first = yield from command(config, name, "checkpoint", namespace, reason=reason)
            sent.extend(first.commands)
        except Conflict:
            pass  # it has ended: the stop below says so in its own words
    last = yield from command(config, name, "stop", namespace, reason=reason)
    return CommandSent(config.ns(namespace), name, (*sent, *last.commands))


def checkpoint(
    config: Config, /, name: str, namespace: str | None = None, *, reason: str = ""
) -> Operation[CommandSent]:
    """Ask a job to save a checkpoint at its next step boundary (it goes on)."""
    return (yield from command(config, name, "checkpoint", namespace, reason=reason))


def pending_commands(config: Config, /, name: str, namespace: str | None = None) -> Operation[list[Any]]:
    """Commands the job has not acknowledged yet (:class:`stepwatch.protocol.Command`)."""
    response = yield Request("GET", f"{_job_path(config, name, namespace)}/commands")
    items = as_list(as_dict(read_json(response), "commands").get("items"), "commands.items")
    return [command_from(c, f"commands.items[{i}]") for i, c in enumerate(items)]


def set_state(
    config: Config,
    /,
    name: str,
    state: str,
    token: str,
    namespace: str | None = None,
    *,
    exit_code: int | None = None,
    reason: str = "",
) -> Operation[Job]:
    """Record how a job's process ended (``finished``, ``failed``, ``stopped``); needs the job's token."""
    body: dict[str, Any] = {"state": state, "reason": reason}
    if exit_code is not None:
        body["exit_code"] = exit_code
    response = yield Request(
        "POST",
        f"{_job_path(config, name, namespace)}/state",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        idempotent=False,
    )
    return Job(read_json(response))


def _policy_path(config: Config, /, name: str | None, namespace: str | None) -> str:
    base = jobs_path(config.ns(namespace))
    return f"{base}/{name}/policy" if name else base.removesuffix("/jobs") + "/policy"


def policy(config: Config, /, name: str, namespace: str | None = None) -> Operation[JobPolicy]:
    """A job's policy: its own layer, the effective policy, who set each action, what it did."""
    response = yield Request("GET", _policy_path(config, name, namespace))
    return JobPolicy.from_dict(as_dict(read_json(response), "policy"))


def namespace_policy(config: Config, /, namespace: str | None = None) -> Operation[NamespacePolicy]:
    """A namespace's policy layer, the server's, and the effective one."""
    response = yield Request("GET", _policy_path(config, None, namespace))
    return NamespacePolicy.from_dict(as_dict(read_json(response), "policy"))


def set_policy(
    config: Config,
    /,
    name: str | None = None,
    policy: Policy | Mapping[str, Any] | None = None,
    namespace: str | None = None,
    *,
    replace: bool = False,
    **fields: Any,
) -> Operation[JobPolicy | NamespacePolicy]:
    """Set the policy of a job (``name``) or, without a name, of a namespace: merged into the layer that
    stands, key by key and trigger by trigger under ``on`` (what was set before and is not named here
    stays; ``None`` removes a key), or the whole layer replaced with ``replace=True``.

    What is set is ``policy`` (a :class:`Policy` or its JSON object) with ``fields`` over it:
    ``set_policy("llama", on={"not_learning": "checkpoint_stop"}, budget=250)``. ``{}`` (nothing)
    clears the layer. Safe to retry: the same PUT twice leaves the same layer. The answer is the layer
    and the policy in force.
    """
    layer = policy.to_dict() if isinstance(policy, Policy) else dict(policy or {})
    layer.update(Policy(**fields).to_dict() if fields else {})
    params = {"replace": "true"} if replace else None
    response = yield Request("PUT", _policy_path(config, name, namespace), params=params, json=layer)
    found = as_dict(read_json(response), "policy")
    return JobPolicy.from_dict(found) if name else NamespacePolicy.from_dict(found)


def costs(config: Config, /, namespace: str | None = None, *, since: float | None = None) -> Operation[Costs]:
    """Money: GPUs in use, $/h, spent, projected, wasted and saved, overall and per namespace, of the jobs
    live now and of those that ended after ``since`` (Unix seconds)."""
    params: dict[str, Any] = {}
    if namespace:
        params["namespace"] = namespace
    if since is not None:
        params["since"] = since
    response = yield Request("GET", "/api/v1/costs", params=params)
    return Costs.from_dict(as_dict(read_json(response), "costs"))
