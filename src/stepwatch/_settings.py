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
from typing import Any, Final

from .protocol import LIMITS

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


@dataclass(frozen=True)
class Setting:
    """One setting: its name (the ``init`` argument), environment variables, default, type and help."""

    name: str
    env: tuple[str, ...]
    default: Any
    parse: Callable[[str], Any]
    help: str


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
        "autoinstrument",
        ("STEPWATCH_AUTOINSTRUMENT",),
        True,
        _flag,
        "Give framework trainers (transformers, Lightning, Keras, tqdm) stepwatch's callback when they are "
        "imported, with no code change: under `stepwatch run`, or with an endpoint set (the installed .pth "
        "hook). Read at interpreter start; 0 turns it off.",
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
    autoinstrument: bool
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
