"""Settings of the report core: each declared once, resolved from arguments, then the environment.

Order of precedence for every setting: the argument given to :func:`stepwatch.init`, then the
``STEPWATCH_*`` variable, then the upstream Kubeflow Trainer variable (``KUBEFLOW_TRAINER_SERVER_*``)
where one exists, then the default. Settings are read when a run starts, never at import.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from .protocol import LIMITS
from .protocol.progression import DEFAULT_METRICS_PORT

__all__ = ["SETTINGS", "ResolvedSettings", "Setting", "SettingError", "resolve"]


class SettingError(ValueError):
    """A setting has a value that cannot be used."""


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a positive number of seconds, got {text!r}")
    return value


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"must be true/false, 1/0, yes/no or on/off, got {text!r}")


_OFF_WORDS: Final = ("off", "false", "no", "0")
_ON_WORDS: Final = ("on", "true", "yes")


def parse_metrics_port(value: object) -> tuple[str, int] | Literal[False]:
    """Where to serve OpenShift AI's progression status: ``(host, port)``, or ``False`` for nowhere.

    ``off`` (or ``0``, ``false``, ``no``, ``False``) is nowhere; a port (``28080``) is that port on every
    address (``0.0.0.0``: the controller polls the pod's IP); ``HOST:PORT`` (``127.0.0.1:0``: a free
    port on loopback, as tests use; ``[::]:28080`` for IPv6) is that address; ``on``/``True`` is 28080
    on every address.
    """
    if value is False or value is None:
        return False
    if value is True:
        return ("0.0.0.0", DEFAULT_METRICS_PORT)
    text = str(value).strip() if isinstance(value, (str, int)) else ""
    if text.lower() in _OFF_WORDS:
        return False
    if text.lower() in _ON_WORDS:
        return ("0.0.0.0", DEFAULT_METRICS_PORT)
    host, colon, port_text = text.rpartition(":")
    if not colon:
        host = "0.0.0.0"
    elif host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # [::1]:28080
    elif ":" in host:
        host = ""  # an IPv6 address without its brackets: which colon ends it?
    if not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"must be a port, HOST:PORT or off, got {value!r}")
    return (host, int(port_text))


def _path_or_off(text: str) -> str | Literal[False]:
    return False if text.strip().lower() in _OFF_WORDS else text


@dataclass(frozen=True)
class Setting:
    """One setting: its name (the ``init`` argument), environment variables, default, type and help."""

    name: str
    env: tuple[str, ...]
    default: Any
    parse: Callable[[str], Any]
    help: str
    parse_argument: bool = False
    """The ``init`` argument is parsed like the variable (it may come as text, as a number or as a flag)."""


UPSTREAM_URL_ENV: Final = "KUBEFLOW_TRAINER_SERVER_URL"

SETTINGS: Final[tuple[Setting, ...]] = (
    Setting(
        "url",
        ("STEPWATCH_URL", UPSTREAM_URL_ENV),
        None,
        str,
        "Where to report: a stepwatch server (http://127.0.0.1:8642), or a Kubeflow Trainer status "
        "endpoint (.../apis/trainer.kubeflow.org/v1alpha1/namespaces/NS/trainjobs/NAME/status). "
        "Without one, reporting is off.",
    ),
    Setting("token", ("STEPWATCH_TOKEN",), None, str, "Bearer token of the job."),
    Setting(
        "token_file",
        ("STEPWATCH_TOKEN_FILE", "KUBEFLOW_TRAINER_SERVER_TOKEN"),
        None,
        str,
        "File holding the bearer token; re-read whenever it changes (rotating ServiceAccount tokens).",
    ),
    Setting(
        "ca_cert",
        ("STEPWATCH_CA_CERT", "KUBEFLOW_TRAINER_SERVER_CA_CERT"),
        None,
        str,
        "CA bundle (PEM file) that signs the server's certificate, for https endpoints.",
    ),
    Setting("job", ("STEPWATCH_JOB",), None, str, "Job name; defaults to the script's name."),
    Setting("namespace", ("STEPWATCH_NAMESPACE",), "default", str, "Namespace (team or project) of the job."),
    Setting(
        "interval",
        ("STEPWATCH_INTERVAL",),
        LIMITS.default_interval_s,
        _positive_float,
        "Seconds between reports (never below 5 to a Kubeflow endpoint).",
    ),
    Setting(
        "flush_timeout",
        ("STEPWATCH_FLUSH_TIMEOUT",),
        5.0,
        _positive_float,
        "Longest wait, at finish() and at exit, for the final report to be delivered.",
    ),
    Setting(
        "request_timeout",
        ("STEPWATCH_REQUEST_TIMEOUT",),
        10.0,
        _positive_float,
        "Timeout of one HTTP request of the sender thread.",
    ),
    Setting(
        "warn_after",
        ("STEPWATCH_WARN_AFTER",),
        30.0,
        _positive_float,
        "Seconds without any report accepted after which the sender warns once (nothing gets through).",
    ),
    Setting("disabled", ("STEPWATCH_DISABLED",), False, _flag, "Turn reporting off whatever else is set."),
    Setting(
        "handle_sigterm",
        ("STEPWATCH_HANDLE_SIGTERM",),
        True,
        _flag,
        "Send a final report when the process receives SIGTERM, then die as it would have.",
    ),
    Setting(
        "where",
        ("STEPWATCH_WHERE",),
        True,
        _flag,
        "Read the training thread's stack from the sender thread (about once a second) and send where a rank "
        "stands while its step has stood longer than usual: what it does, the library call, its own functions "
        "as function (file:line); never locals or arguments (docs/reporting.md). off: never read.",
    ),
    Setting(
        "autoinstrument",
        ("STEPWATCH_AUTOINSTRUMENT",),
        True,
        _flag,
        "Give framework trainers (transformers, Lightning, Keras, tqdm) stepwatch's callback when they are "
        "imported, with no code change: under `stepwatch run`, or with an endpoint set or in a Kubeflow TrainJob's "
        "pod (the installed .pth hook). Read at interpreter start; 0 turns it off.",
    ),
    Setting(
        "metrics_port",
        ("STEPWATCH_METRICS_PORT",),
        None,
        parse_metrics_port,
        "Where rank 0 serves OpenShift AI's progression status (GET on any path, JSON), with or without an "
        f"endpoint: a port, HOST:PORT, or off. Unset: {DEFAULT_METRICS_PORT} on rank 0 of a Kubeflow TrainJob's "
        "pod, off elsewhere. A port already taken (Red Hat's own callback) is left alone.",
        parse_argument=True,
    ),
    Setting(
        "termination_log",
        ("STEPWATCH_TERMINATION_LOG",),
        None,
        _path_or_off,
        "File rank 0 writes its final progression status to when the run ends, if it serves one. Unset: "
        "/dev/termination-log when it exists (the container's termination message); off: none.",
    ),
)


@dataclass(frozen=True)
class ResolvedSettings:
    """The settings of one run, with where the URL came from (it decides the wire mode)."""

    url: str | None
    token: str | None
    token_file: str | None
    ca_cert: str | None
    job: str | None
    namespace: str
    interval: float
    flush_timeout: float
    request_timeout: float
    warn_after: float
    disabled: bool
    handle_sigterm: bool
    where: bool
    """Read where a standing rank stands (its stack) and the shares of its activities."""
    autoinstrument: bool
    metrics_port: tuple[str, int] | Literal[False] | None
    """Where to serve OpenShift AI's progression status; ``None``: not said (on in a TrainJob's pod)."""
    termination_log: str | Literal[False] | None
    """Where to write the final status; ``None``: not said (``/dev/termination-log`` when it exists)."""
    url_source: str
    """``"argument"``, the environment variable's name, or ``""`` when no URL is set."""


def resolve(arguments: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> ResolvedSettings:
    """Resolve every setting: argument, then ``STEPWATCH_*``, then upstream variable, then default."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        given = arguments.get(setting.name)
        if given is not None:
            if setting.parse_argument:
                try:
                    given = setting.parse(given)
                except ValueError as exc:
                    raise SettingError(f"{setting.name}={given!r}: {exc}") from None
            values[setting.name] = given
            sources[setting.name] = "argument"
            continue
        values[setting.name] = setting.default
        sources[setting.name] = ""
        for var in setting.env:
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            try:
                values[setting.name] = setting.parse(raw)
            except ValueError as exc:
                raise SettingError(f"{var}: {exc}") from None
            sources[setting.name] = var
            break
    return ResolvedSettings(url_source=sources["url"], **values)
