"""Starting a run: settings, names, endpoint and wire mode, identity, the sender. Loaded by ``init``.

Kept apart from :mod:`stepwatch._run` so that ``import stepwatch`` stays cheap: this module and
what it imports (the protocol, the HTTP transport) load with the first run.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._env import default_job_name, detect_identity
from ._sender import Sender
from ._settings import UPSTREAM_URL_ENV, ResolvedSettings, SettingError, resolve
from ._trainjob import trainjob_node
from ._transport import HTTPTransport, TokenSource, Transport
from ._version import __version__
from ._where import WhereSampler
from ._window import WindowBuffer
from ._wire import KubeflowWire, NativeWire, NullWire, Snapshot, Wire
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
from .protocol.progression import DEFAULT_METRICS_PORT

if TYPE_CHECKING:
    from ._progression import Progression

__all__ = ["Plan", "clean_params", "make_sender", "plan_run", "start_progression"]

_log = logging.getLogger("stepwatch")
_said: set[str] = set()
"""The lines about where a run reports already said in this process (each is said once)."""
_NO_ENDPOINT = "stepwatch: no endpoint set (STEPWATCH_URL or KUBEFLOW_TRAINER_SERVER_URL)"
TERMINATION_LOG = "/dev/termination-log"
"""Where the kubelet reads a container's termination message (its default ``terminationMessagePath``)."""

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
    metrics_address: tuple[str, int] | None = None
    """Where this process serves OpenShift AI's progression status (rank 0 only); ``None``: it does not."""
    termination_log: str | None = None
    """Where it writes the final status when the run ends, if it serves one."""


def plan_run(arguments: Mapping[str, Any]) -> Plan:
    """Resolve settings into a plan; never raises (an unusable setting switches reporting off)."""
    try:
        settings = resolve(arguments)
        problem = ""
    except SettingError as exc:
        settings = resolve({**arguments, "disabled": True, "metrics_port": None}, environ={})
        problem = str(exc)
    job = _checked_name(settings.job or default_job_name(), "job")
    namespace = _checked_name(settings.namespace, "namespace")
    mode, url = _endpoint(settings, namespace, job)
    identity = detect_identity()
    address = _metrics_address(settings, identity)
    if problem:
        _log.warning("stepwatch: %s; reporting is off", problem)
        mode, url = "off", None
    elif mode == "off" and address is None and not settings.disabled:
        _say_once(f"{_NO_ENDPOINT}; reporting is off")
    if mode == "kubeflow" and identity.rank != 0:
        mode, url = "off", None  # upstream takes one status per TrainJob: rank 0's
    return Plan(
        settings=settings,
        job=job,
        namespace=namespace,
        mode=mode,
        url=url,
        identity=identity,
        metrics_address=address,
        termination_log=_termination_log(settings) if address is not None else None,
    )


def _metrics_address(settings: ResolvedSettings, identity: Identity) -> tuple[str, int] | None:
    """Where this process serves OpenShift AI's progression: global rank 0, when asked or in a TrainJob's pod.

    Only rank 0 of the whole job listens (Red Hat's controller polls the first pod, and other ranks'
    metrics are not the job's); unset, the endpoint is on in the first pod of a Kubeflow TrainJob
    (:func:`~._trainjob.trainjob_node`) and off elsewhere.
    """
    if settings.disabled or settings.metrics_port is False or identity.rank != 0:
        return None
    if settings.metrics_port is not None:
        return settings.metrics_port
    if trainjob_node() == 0:
        return ("0.0.0.0", DEFAULT_METRICS_PORT)
    return None


def _termination_log(settings: ResolvedSettings) -> str | None:
    if settings.termination_log is False:
        return None
    if settings.termination_log:
        return settings.termination_log
    return TERMINATION_LOG if os.path.exists(TERMINATION_LOG) else None


def start_progression(plan: Plan) -> Progression | None:
    """Listen where the plan says, and say so in one line; ``None`` (said once) when the port is taken.

    A taken port is not an error: in a pod of Red Hat's SDK its own callback serves the same status
    there, and stepwatch then leaves the endpoint and the termination message to it.
    """
    from ._progression import Progression

    assert plan.metrics_address is not None
    host, port = plan.metrics_address
    pushing = plan.mode != "off"
    try:
        progression = Progression.start(plan.metrics_address, plan.termination_log)
    except OSError as exc:
        why = "the port is taken (by Red Hat's progression callback?)" if exc.errno == errno.EADDRINUSE else exc
        rest = "" if pushing else f"; {_NO_ENDPOINT}, so reporting is off"
        _say_once(
            f"stepwatch: cannot listen on {_show(host, port)}: {why}; stepwatch neither serves OpenShift AI's "
            f"progression status nor writes the termination message{rest}"
        )
        return None
    where = f"http://{_show(*progression.address)}/metrics"
    if pushing:
        _say_once(f"stepwatch: serving OpenShift AI's progression status on {where}")
    else:
        _say_once(f"{_NO_ENDPOINT}; serving OpenShift AI's progression status on {where} (no server needed)")
    return progression


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _say_once(line: str) -> None:
    """An info line about where runs report, once per process: logged, or on stderr when logging is not set up.

    Python shows nothing below a warning until the program configures logging, so a first
    ``python train.py`` would say nothing at all; it gets the line on stderr instead, at once.
    """
    if line in _said:
        return
    _said.add(line)
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
    progression: Progression | None = None,
    current_step: Callable[[], int] | None = None,
    thread: Callable[[], int | None] | None = None,
) -> Sender:
    """The sender of a run, in the wire mode of its plan (not started).

    What it needs of the run comes as values and callables (its id, its snapshot, where commands
    go, its total steps when it registers, its step counter and training thread for the stack
    readings of :mod:`._where`), so that this module does not know :class:`~._run.Run`.
    A run without an endpoint that serves its progression gets a sender that sends nothing.
    """
    settings = plan.settings
    wire: Wire
    interval = settings.interval
    where: WhereSampler | None = None
    registration = None
    if plan.mode == "native" and plan.identity.rank == 0:
        registration = _registration(plan, total_steps)
    if plan.url is None:
        wire = NullWire()
    elif plan.mode == "kubeflow":
        wire = KubeflowWire(plan.url)
        if progression is None:  # else the status served keeps the interval; posts keep their 5 s (min_gap)
            interval = max(interval, LIMITS.min_kubeflow_interval_s)
    else:
        wire = NativeWire(plan.url, run_id, plan.identity, clean_params(params))
        if plan.identity.rank != 0:
            interval *= LIMITS.heartbeat_interval_factor
        if settings.where and current_step is not None and thread is not None:
            where = WhereSampler(current_step, thread)
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
        progression=progression,
        where=where,
        standing_interval=settings.interval,
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
