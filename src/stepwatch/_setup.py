"""Starting a run: settings, names, endpoint and wire mode, identity, the sender. Loaded by ``init``.

Kept apart from :mod:`stepwatch._run` so that ``import stepwatch`` stays cheap: this module and
what it imports (the protocol, the HTTP transport) load with the first run.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ._env import default_job_name, detect_identity
from ._sender import Sender
from ._settings import UPSTREAM_URL_ENV, ResolvedSettings, SettingError, resolve
from ._transport import HTTPTransport, TokenSource, Transport
from ._version import __version__
from ._window import WindowBuffer
from ._wire import KubeflowWire, NativeWire, Snapshot, Wire
from .protocol import (
    LIMITS,
    Command,
    Identity,
    ParamValue,
    encode_body,
    is_valid_name,
    jobs_path,
    report_path,
    sanitize_name,
)

__all__ = ["Plan", "clean_params", "make_sender", "plan_run"]

_log = logging.getLogger("stepwatch")
_said_off = False

Mode = Literal["native", "kubeflow", "off"]


@dataclass(frozen=True)
class Plan:
    """What a new run will be: its names, where and how it reports, and who it is."""

    settings: ResolvedSettings
    job: str
    namespace: str
    mode: Mode
    url: str | None
    identity: Identity


def plan_run(arguments: Mapping[str, Any]) -> Plan:
    """Resolve settings into a plan; never raises (an unusable setting switches reporting off)."""
    global _said_off
    try:
        settings = resolve(arguments)
        problem = ""
    except SettingError as exc:
        settings = resolve({**arguments, "disabled": True}, environ={})
        problem = str(exc)
    job = _checked_name(settings.job or default_job_name(), "job")
    namespace = _checked_name(settings.namespace, "namespace")
    mode, url = _endpoint(settings, namespace, job)
    if problem:
        _log.warning("stepwatch: %s; reporting is off", problem)
        mode, url = "off", None
    elif mode == "off" and not settings.disabled and not _said_off:
        _said_off = True
        _say_off("stepwatch: no endpoint set (STEPWATCH_URL or KUBEFLOW_TRAINER_SERVER_URL); reporting is off")
    identity = detect_identity()
    if mode == "kubeflow" and identity.rank != 0:
        mode, url = "off", None  # upstream takes one status per TrainJob: rank 0's
    return Plan(settings=settings, job=job, namespace=namespace, mode=mode, url=url, identity=identity)


def _say_off(line: str) -> None:
    """The one info line of a run without an endpoint: logged, or on stderr when logging is not set up.

    Python shows nothing below a warning until the program configures logging, so a first
    ``python train.py`` would say nothing at all; it gets the line on stderr instead, at once.
    """
    if _log.hasHandlers():
        _log.info(line)
        return
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:  # no stderr (a daemon, pythonw): nothing to say it on
        pass


def make_sender(
    plan: Plan,
    *,
    run_id: str,
    snapshot: Callable[[], Snapshot],
    on_command: Callable[[Command], None],
    total_steps: Callable[[], int | None],
    buffer: WindowBuffer | None,
    transport: Transport | None,
    params: Mapping[str, Any] | None,
) -> Sender:
    """The sender of a run, in the wire mode of its plan (not started).

    What it needs of the run comes as values and callables (its id, its snapshot, where commands
    go, its total steps when it registers), so that this module does not know :class:`~._run.Run`.
    """
    settings = plan.settings
    assert plan.url is not None
    wire: Wire
    interval = settings.interval
    registration = None
    if plan.mode == "native" and plan.identity.rank == 0:
        registration = _registration(plan, total_steps)
    if plan.mode == "kubeflow":
        wire = KubeflowWire(plan.url)
        interval = max(interval, LIMITS.min_kubeflow_interval_s)
    else:
        wire = NativeWire(plan.url, run_id, plan.identity, clean_params(params))
        if plan.identity.rank != 0:
            interval *= LIMITS.heartbeat_interval_factor
    return Sender(
        wire=wire,
        transport=transport or HTTPTransport(ca_cert=settings.ca_cert),
        buffer=buffer,
        snapshot=snapshot,
        on_command=on_command,
        token=TokenSource(settings.token, settings.token_file),
        interval=interval,
        request_timeout=settings.request_timeout,
        warn_after=settings.warn_after,
        user_agent=f"stepwatch/{__version__} python/{sys.version_info[0]}.{sys.version_info[1]}",
        registration=registration,
        min_gap=LIMITS.min_kubeflow_interval_s if plan.mode == "kubeflow" else 0.0,
    )


def _registration(plan: Plan, total_steps: Callable[[], int | None]) -> Callable[[], tuple[str, bytes]]:
    """How a job that nobody registered registers itself (used only when it has no token)."""
    assert plan.url is not None
    url = plan.url.removesuffix(report_path(plan.namespace, plan.job)) + jobs_path(plan.namespace)

    def request() -> tuple[str, bytes]:
        body: dict[str, Any] = {"name": plan.job, "source": "native", "supersede": True}
        total = total_steps()  # read when it registers: update(total_steps=...) may have come since init
        if total is not None:
            body["total_steps"] = total
        return url, encode_body(body)

    return request


def _checked_name(name: str, what: str) -> str:
    if is_valid_name(name):
        return name
    fixed = sanitize_name(name, fallback="default" if what == "namespace" else "job")
    _log.warning("stepwatch: %s name %r is not a Kubernetes name; using %r", what, name, fixed)
    return fixed


def _endpoint(settings: ResolvedSettings, namespace: str, job: str) -> tuple[Mode, str | None]:
    url = (settings.url or "").strip()
    if settings.disabled or not url:
        return "off", None
    if settings.url_source == UPSTREAM_URL_ENV or "/apis/trainer.kubeflow.org/" in url:
        return "kubeflow", url  # upstream clients post to the full status URL, as given
    return "native", url.rstrip("/") + report_path(namespace, job)


def clean_params(
    params: Mapping[str, Any] | None, warn: Callable[..., None] = _log.warning
) -> dict[str, ParamValue] | None:
    """Hyperparameters as the protocol takes them: flat (``optim.lr``), scalar, within the limits."""
    if not params:
        return None
    try:
        items = list(_flatten(params, ""))
    except Exception as exc:
        warn("stepwatch: params could not be read (%r); not sent", exc)
        return None
    flat: dict[str, ParamValue] = {}
    for long_key, value in items:
        if len(flat) >= LIMITS.max_params:
            warn("stepwatch: only the first %d params are sent", LIMITS.max_params)
            break
        key = long_key[: LIMITS.max_param_key_length]
        if key and key.isprintable():
            flat[key] = _param_value(value)
    return flat


def _flatten(params: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and prefix.count(".") < 3:
            yield from _flatten(value, name + ".")
        else:
            yield name, value


def _param_value(raw: Any) -> ParamValue:
    value: object = raw
    if value is not None and not isinstance(value, (str, bool, int, float)):
        try:
            value = value.item() if hasattr(value, "item") else repr(value)  # NumPy and torch scalars
        except Exception:
            value = repr(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        limit = LIMITS.max_param_value_length
        return value if len(value) <= limit else value[: limit - 1] + "\u2026"
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return _param_value(repr(value))
