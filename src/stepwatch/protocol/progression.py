"""OpenShift AI's progression status: the JSON a training pod serves, and the annotation it becomes.

Red Hat OpenShift AI 3.4 tracks a TrainJob's progress by pulling, not by pushes (its fork of Kubeflow
Trainer, ``pkg/rhai/progression/progression.go``, branch ``release/odh-3.4.0``). For a TrainJob annotated
``trainer.opendatahub.io/progression-tracking: "true"`` its controller GETs
``http://<rank-0 pod IP>:28080/metrics`` every 30 s, decodes the body with Go's ``encoding/json`` into its
``TrainerStatus`` struct, drops invalid values (``cleanInvalidMetrics``) and writes the JSON annotation
``trainer.opendatahub.io/trainerStatus`` (its ``AnnotationStatus``: the same fields, a time summary and
the time) that the OpenShift AI dashboard shows. At the end it reads the same JSON from the
termination message of the trainer container ``node``.

This module is that format, both ways, and nothing of the project:

* :class:`ProgressionStatus` and :func:`build_status`: what a pod serves, from a run's progress and
  latest metrics (progress rounded down, an ETA in whole seconds, train and eval metrics apart);
  :func:`encode_served` writes it so that Go's decoder takes it: every integer field a JSON integer,
  every non-finite value ``null`` (``45.0`` or a ``NaN`` anywhere makes the controller drop the poll);
* :func:`decode_status` and :func:`decode_annotation`: a port of how the controller reads the body and
  its own annotation, Go's ``json.Unmarshal`` into ``*int``, ``*float64``, ``string`` and
  ``map[string]interface{}`` fields (integer literals only in ``*int`` fields, keys matched without
  regard to case, a repeated key merged into a map, ``null`` at the top level an empty status); they
  raise :class:`ProgressionError` where Go returns an error;
* :func:`clean_invalid`: ``cleanInvalidMetrics``; :func:`format_duration_summary`:
  ``formatDurationSummary``;
* :class:`AnnotationStatus` and :func:`encode_annotation`: the annotation as Go's ``json.Marshal``
  writes it (field order, ``omitempty``, map keys sorted, Go's number format, HTML characters escaped).

The controller's decisions (which pod, how often, when the end is captured) live with stepwatch's
Kubernetes runner; this module only says what the bytes mean.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

__all__ = [
    "ANNOTATION_METRICS_PORT",
    "ANNOTATION_POLL_INTERVAL",
    "ANNOTATION_STATUS",
    "ANNOTATION_TRACKING",
    "DEFAULT_METRICS_PORT",
    "EVAL_PREFIXES",
    "MAX_TERMINATION_MESSAGE",
    "SUMMARY_METRIC",
    "TRAINER_CONTAINER",
    "AnnotationStatus",
    "ProgressionError",
    "ProgressionStatus",
    "build_status",
    "clean_invalid",
    "decode_annotation",
    "decode_status",
    "encode_annotation",
    "encode_served",
    "format_duration_summary",
    "is_eval_metric",
]

ANNOTATION_TRACKING: Final = "trainer.opendatahub.io/progression-tracking"
"""Exactly ``"true"`` switches tracking on (``constants.go``; the package README's ``"enabled"`` does not)."""
ANNOTATION_STATUS: Final = "trainer.opendatahub.io/trainerStatus"
"""The JSON annotation the controller writes and the OpenShift AI dashboard reads."""
ANNOTATION_METRICS_PORT: Final = "trainer.opendatahub.io/metrics-port"
ANNOTATION_POLL_INTERVAL: Final = "trainer.opendatahub.io/metrics-poll-interval"
DEFAULT_METRICS_PORT: Final = 28080
TRAINER_CONTAINER: Final = "node"
"""The container whose termination message the controller reads at the end."""
MAX_TERMINATION_MESSAGE: Final = 4096
"""The kubelet keeps at most this many bytes of a container's termination message."""
EVAL_PREFIXES: Final = ("eval_", "eval/", "eval.", "val_", "val/", "validation_", "validation/")
"""Metrics named with these prefixes are ``evalMetrics`` (Hugging Face's ``eval_*``, Keras' ``val_*``); the
others are ``trainMetrics``."""
SUMMARY_METRIC: Final = "estimatedRemainingTimeSummary"
"""Where stepwatch keeps an annotation's summary (``complete``, ``complete (early stopped)``, ``failed at 60%``):
a string metric of the job's ``trainerStatus`` as its API shows it (shown as written, never history)."""

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


class ProgressionError(ValueError):
    """A body the controller's decoder refuses: Go's ``json.Unmarshal`` returns an error for it."""


@dataclass(frozen=True)
class ProgressionStatus:
    """The controller's ``TrainerStatus``: what the pod serves on GET and writes as its termination message.

    ``None`` is a field the pod did not know (``null``). Metrics are name -> value as JSON gives them:
    numbers, strings, ``None`` (and, from a foreign pod, anything JSON holds).
    """

    progress_percentage: int | None = None
    estimated_remaining_seconds: int | None = None
    current_step: int | None = None
    total_steps: int | None = None
    current_epoch: float | None = None
    total_epochs: int | None = None
    train_metrics: Mapping[str, Any] | None = None
    eval_metrics: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class AnnotationStatus(ProgressionStatus):
    """The controller's ``AnnotationStatus``: a status with its time summary and the time it was written."""

    summary: str = ""
    """``estimatedRemainingTimeSummary``: ``"2 hours 44 minutes"``, ``"complete"``, ``"failed at 60%"``, or empty."""
    last_updated_time: str = ""
    """UTC RFC 3339 to the second (``2026-12-06T10:00:00Z``)."""


# ------------------------------------------------------------------------------------ the pod's side


def is_eval_metric(name: str) -> bool:
    """Whether a metric belongs in ``evalMetrics`` (``eval_loss``, ``eval/accuracy``, Keras' ``val_loss``)."""
    return name.startswith(EVAL_PREFIXES)


def build_status(
    *,
    step: int | None,
    total_steps: int | None,
    epoch: float | None = None,
    total_epochs: float | None = None,
    eta_seconds: float | None = None,
    metrics: Mapping[str, float] | None = None,
    ended: Literal["finished", "failed", "stopped"] | None = None,
) -> ProgressionStatus:
    """The status of a run as the controller wants it.

    Progress is the step over the total rounded down (371 of 375 is 98 %: 100 % only when done), else the
    epoch over the epochs; a run that ended ``finished`` without a total is at 100 %, and any other run
    without one has ``null`` (the dashboard then shows no bar rather than a guess). The remaining seconds
    are ``eta_seconds`` rounded, 0 once the run has ended (an early end keeps its real step and
    percentage, so the controller can say "complete (early stopped)" or "failed at N%"). A fractional
    number of epochs is rounded up (2.5 epochs are 3 started ones), since the field is an integer.
    ``eval_*``, ``val_*`` and ``validation_*`` metrics go to ``evalMetrics``, the others to
    ``trainMetrics``; non-finite values stay in the status and are written as ``null``.
    """
    percent: int | None = None
    if step is not None and total_steps:
        percent = _percent(step, total_steps)
    elif epoch is not None and total_epochs:
        percent = _percent(epoch, total_epochs)
    elif ended == "finished":
        percent = 100
    remaining: int | None = None
    if ended is not None:
        remaining = 0
    elif eta_seconds is not None and math.isfinite(eta_seconds):
        remaining = max(0, round(eta_seconds))
    train: dict[str, Any] = {}
    evals: dict[str, Any] = {}
    for name, value in (metrics or {}).items():
        (evals if is_eval_metric(name) else train)[name] = value
    return ProgressionStatus(
        progress_percentage=percent,
        estimated_remaining_seconds=remaining,
        current_step=step,
        total_steps=total_steps,
        current_epoch=float(epoch) if epoch is not None and math.isfinite(epoch) else None,
        total_epochs=math.ceil(total_epochs) if total_epochs is not None and math.isfinite(total_epochs) else None,
        train_metrics=train,
        eval_metrics=evals,
    )


def _percent(done: float, total: float) -> int:
    return min(100, max(0, math.floor(100 * done / total)))


def encode_served(status: ProgressionStatus, max_bytes: int | None = None) -> bytes:
    """The JSON a pod serves (and writes as its termination message): all eight keys, as Red Hat's callback.

    Integers are JSON integers, non-finite numbers ``null``. With ``max_bytes`` (the termination
    message's 4 KiB), metrics are left out from the end, eval metrics last, until the body fits; the
    progress fields always stay.
    """
    train = {k: _plain(v) for k, v in (status.train_metrics or {}).items()}
    evals = {k: _plain(v) for k, v in (status.eval_metrics or {}).items()}
    body = {
        "progressPercentage": _int_or_none(status.progress_percentage),
        "estimatedRemainingSeconds": _int_or_none(status.estimated_remaining_seconds),
        "currentStep": _int_or_none(status.current_step),
        "totalSteps": _int_or_none(status.total_steps),
        "currentEpoch": _plain(status.current_epoch),
        "totalEpochs": _int_or_none(status.total_epochs),
        "trainMetrics": train,
        "evalMetrics": evals,
    }
    data = _dumps(body)
    if max_bytes is None or len(data) <= max_bytes:
        return data
    for group in (train, evals):
        while group and len(data) > max_bytes:
            # drop about as many as the excess needs, at least one, then measure again
            excess = len(data) - max_bytes
            for name in list(group)[-max(1, excess // 48) :]:
                del group[name]
            data = _dumps(body)
    return data


def _dumps(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()


def _int_or_none(value: object) -> int | None:
    if value is None or value.__class__ is bool:
        return None
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _plain(value: object) -> Any:
    """A metric value as JSON can carry it to Go: finite numbers, strings, ``null``."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# ------------------------------------------------------------------------- the controller's decoder


class _Number(str):
    """A JSON number as its literal (Go converts each literal for the field it lands in)."""

    __slots__ = ()


_FIELDS: Final = {
    "progresspercentage": ("progress_percentage", "int"),
    "estimatedremainingseconds": ("estimated_remaining_seconds", "int"),
    "currentstep": ("current_step", "int"),
    "totalsteps": ("total_steps", "int"),
    "currentepoch": ("current_epoch", "float"),
    "totalepochs": ("total_epochs", "int"),
    "trainmetrics": ("train_metrics", "map"),
    "evalmetrics": ("eval_metrics", "map"),
}
_ANNOTATION_FIELDS: Final = {
    **_FIELDS,
    "estimatedremainingtimesummary": ("summary", "str"),
    "lastupdatedtime": ("last_updated_time", "str"),
}
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def decode_status(body: bytes | str) -> ProgressionStatus:
    """Read a polled body as the controller does (Go's ``json.Unmarshal`` into ``TrainerStatus``).

    Raises :class:`ProgressionError` where Go returns an error: not JSON (``NaN``, ``Infinity``, a
    trailing comma), a top level that is neither an object nor ``null``, a fraction, an exponent or a
    string in an integer field, a number beyond ``float64`` anywhere, a map field that is not an object.
    Unknown keys are ignored; keys match the fields whatever their case.
    """
    values = _unmarshal(body, _FIELDS)
    return ProgressionStatus(**values)


def decode_annotation(text: bytes | str) -> AnnotationStatus:
    """Read the annotation (or a termination message) as the controller does (``AnnotationStatus``)."""
    values = _unmarshal(text, _ANNOTATION_FIELDS)
    return AnnotationStatus(**values)


def _unmarshal(body: bytes | str, fields: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    # Go reads UTF-8 only; an invalid byte becomes U+FFFD inside a string and is a syntax error outside one
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text, object_pairs_hook=_Pairs, parse_float=_Number, parse_int=_Number, parse_constant=_nan)
    except (ValueError, RecursionError) as exc:
        raise ProgressionError(f"invalid JSON: {exc}") from None
    values: dict[str, Any] = {}
    if data is None:  # Go: null leaves the struct as it is
        return values
    if not isinstance(data, _Pairs):
        raise ProgressionError(f"cannot unmarshal {_kind(data)} into the status object")
    errors: list[str] = []
    for key, value in data:
        found = fields.get(_fold(key))
        if found is None:
            continue
        name, kind = found
        try:
            if kind == "map":
                values[name] = _map_into(values.get(name), value, key)
            elif value is None:
                if kind != "str":  # null into a plain string is a no-op in Go
                    values[name] = None
            elif kind == "int":
                values[name] = _go_int(value, key)
            elif kind == "float":
                values[name] = _go_float(value, key)
            elif isinstance(value, str) and not isinstance(value, _Number):
                values[name] = _clean_text(value)
            else:
                raise ProgressionError(f"cannot unmarshal {_kind(value)} into field {key} of type string")
        except ProgressionError as exc:
            errors.append(str(exc))  # Go goes on and returns the first type error at the end
    if errors:
        raise ProgressionError(errors[0])
    return values


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object as its key-value pairs in order (Go sees repeated keys one after the other)."""


def _nan(name: str) -> Any:
    raise ValueError(f"invalid character in {name!r}: not JSON")


def _fold(key: str) -> str:
    """A key as Go compares it with field names: ASCII case folded, and the Kelvin sign and long s as k and s."""
    return key.replace("\u212a", "k").replace("\u017f", "s").lower()


def _kind(value: object) -> str:
    if isinstance(value, _Number):
        return f"number {value}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, _Pairs):
        return "object"
    if isinstance(value, list):
        return "array"
    return "null"


def _go_int(value: object, key: str) -> int:
    if isinstance(value, _Number):
        literal = str(value)
        if re.fullmatch(r"-?\d+", literal):
            number = int(literal)
            if _INT64_MIN <= number <= _INT64_MAX:
                return number
    raise ProgressionError(f"cannot unmarshal {_kind(value)} into field {key} of type int")


def _go_float(value: object, key: str) -> float:
    if isinstance(value, _Number):
        number = float(str(value))
        if math.isfinite(number):
            return number
    raise ProgressionError(f"cannot unmarshal {_kind(value)} into field {key} of type float64")


def _map_into(current: dict[str, Any] | None, value: object, key: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, _Pairs):
        raise ProgressionError(f"cannot unmarshal {_kind(value)} into field {key} of type map[string]interface {{}}")
    merged = dict(current) if current is not None else {}  # Go fills a map it already made
    for name, item in value:
        merged[_clean_text(name)] = _any(item, key)
    return merged


def _any(value: object, key: str) -> Any:
    """A JSON value as ``interface{}``: numbers float64, objects maps (the last of a repeated key wins)."""
    if isinstance(value, _Number):
        number = float(str(value))
        if not math.isfinite(number):
            raise ProgressionError(f"cannot unmarshal number {value} into a value of field {key} of type float64")
        return number
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, _Pairs):
        return {_clean_text(k): _any(v, key) for k, v in value}
    if isinstance(value, list):
        return [_any(v, key) for v in value]
    return value


def _clean_text(text: str) -> str:
    """Go replaces an unpaired UTF-16 surrogate escape (``\\ud800``) with U+FFFD."""
    return _LONE_SURROGATE.sub("\ufffd", text) if _LONE_SURROGATE.search(text) else text


# ------------------------------------------------------------------------------ controller's output


def clean_invalid(status: ProgressionStatus) -> ProgressionStatus:
    """``cleanInvalidMetrics``: each field on its own, the others kept.

    A percentage outside 0..100, a negative ETA, total of steps or of epochs become ``null``; a
    negative step or epoch becomes 0. A total of 0 steps is kept.
    """
    changes: dict[str, Any] = {}
    p = status.progress_percentage
    if p is not None and not 0 <= p <= 100:
        changes["progress_percentage"] = None
    for name in ("estimated_remaining_seconds", "total_steps", "total_epochs"):
        value = getattr(status, name)
        if value is not None and value < 0:
            changes[name] = None
    if status.current_step is not None and status.current_step < 0:
        changes["current_step"] = 0
    if status.current_epoch is not None and status.current_epoch < 0:
        changes["current_epoch"] = 0.0
    return replace(status, **changes) if changes else status


def format_duration_summary(seconds: int | None) -> str:
    """``formatDurationSummary``: ``"2 hours 44 minutes"``, ``"1 day 1 hour"``, ``"less than a minute"``.

    Days, hours and minutes, at most two of them, minutes only when there are no days; empty for an
    unknown or non-positive number of seconds.
    """
    if seconds is None or seconds <= 0:
        return ""
    days, hours, minutes = seconds // 86400, seconds % 86400 // 3600, seconds % 3600 // 60
    parts = [f"{n} {unit}{'' if n == 1 else 's'}" for n, unit in ((days, "day"), (hours, "hour")) if n > 0]
    if minutes > 0 and days == 0:
        parts.append(f"{minutes} minute{'' if minutes == 1 else 's'}")
    return " ".join(parts[:2]) if parts else "less than a minute"


@dataclass(frozen=True)
class _GoField:
    key: str
    attr: str
    omitempty: bool


_ANNOTATION_LAYOUT: Final = (
    _GoField("progressPercentage", "progress_percentage", False),
    _GoField("estimatedRemainingSeconds", "estimated_remaining_seconds", True),
    _GoField("estimatedRemainingTimeSummary", "summary", True),
    _GoField("currentStep", "current_step", True),
    _GoField("totalSteps", "total_steps", True),
    _GoField("currentEpoch", "current_epoch", True),
    _GoField("totalEpochs", "total_epochs", True),
    _GoField("trainMetrics", "train_metrics", True),
    _GoField("evalMetrics", "eval_metrics", True),
    _GoField("lastUpdatedTime", "last_updated_time", False),
)


def encode_annotation(status: AnnotationStatus, nonfinite: Literal["null", "string"] = "null") -> str:
    """The annotation's JSON as the controller's ``json.Marshal`` writes it, byte for byte.

    Fields in the struct's order, ``omitempty`` ones left out when ``null`` or empty, map keys sorted,
    numbers as Go writes ``float64``, ``<``, ``>`` and ``&`` escaped. Go cannot write a non-finite
    number; ``nonfinite`` says what stepwatch writes instead: ``null``, or the strings ``"NaN"``,
    ``"Inf"``, ``"-Inf"``.
    """
    parts = []
    for f in _ANNOTATION_LAYOUT:
        value = getattr(status, f.attr)
        if f.omitempty and (value is None or value == "" or (isinstance(value, Mapping) and not value)):
            continue
        parts.append(_go_string(f.key) + ":" + _go_value(value, nonfinite))
    return "{" + ",".join(parts) + "}"


def _go_value(value: Any, nonfinite: str) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return _go_float_text(value, nonfinite)
    if isinstance(value, str):
        return _go_string(value)
    if isinstance(value, Mapping):
        items = sorted(((str(k), v) for k, v in value.items()), key=lambda kv: kv[0].encode("utf-8", "surrogatepass"))
        return "{" + ",".join(_go_string(k) + ":" + _go_value(v, nonfinite) for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_go_value(v, nonfinite) for v in value) + "]"
    return _go_value(_plain(value), nonfinite)


def _go_float_text(value: float, nonfinite: str) -> str:
    """A float64 as Go's encoder writes it: shortest digits, plain between 1e-6 and 1e21, else ``1e+21``, ``1e-7``."""
    if not math.isfinite(value):
        if nonfinite == "null":
            return "null"
        return _go_string("NaN" if math.isnan(value) else ("Inf" if value > 0 else "-Inf"))
    text = repr(value)
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):  # repr writes these with an exponent too
        mantissa, _, exponent = text.partition("e")
        if exponent.startswith("-0"):  # Go's clean-up: e-07 is e-7
            exponent = "-" + exponent[2:]
        return f"{mantissa.removesuffix('.0')}e{exponent}"
    if "e" in text:
        from decimal import Decimal

        text = format(Decimal(text), "f")
    return text.removesuffix(".0")


_GO_ESCAPES: Final = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def _go_string(text: str) -> str:
    """A string as Go's encoder writes it (HTML-safe: ``<``, ``>``, ``&``, U+2028 and U+2029 escaped)."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif code < 0x20 or ch in "<>&" or code in (0x2028, 0x2029):
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\ufffd")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
