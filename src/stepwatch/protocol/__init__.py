"""The wire format between a training process and the stepwatch server, and its limits.

This package is the one place the format is defined. It imports nothing of the project and nothing
outside the standard library, so the report core, the server and the client can all share it. Its
private modules hold the parts, each named for what it holds (``_vocabulary``, ``_limits``, ``_errors``,
``_values``, ``_checks``, ``_window``, ``_progress``, ``_where``, ``_report``, ``_kubeflow``, ``_bodies``,
``_retry``); every public name is imported from here, the one place they are listed.

Two message families live here:

* the **native report** (``POST /api/v1/namespaces/{ns}/jobs/{name}/reports``): one rank's identity,
  progress, a window of metric aggregates since its previous report, hyperparameters (once), the
  acknowledgement of commands it has seen, and its lifecycle state; answered by a
  :class:`ReportResponse` that carries the commands pending for the job;
* the **Kubeflow Trainer** ``trainerStatus`` of KEP-2779
  (``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status``), so that
  upstream clients work unchanged.

Every ``from_dict`` validates completely and raises :class:`ProtocolError` whose ``field`` names the
JSON path of the first problem (``metrics[3].name``) and whose message says what was expected.
Non-finite floats are data (they mean divergence): on the wire they are the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"``, so that every body is standard JSON.

Whoever sends also waits the same way before trying again: :class:`Backoff` and
:func:`parse_retry_after` serve the report core's sender, the SDK and the server's notifier, each
with its own numbers.
"""

from __future__ import annotations

# The type aliases (``X as X``) are importable from here as before, and kept out of ``__all__`` as before.
from ._bodies import decode_body, encode_body, jobs_path, kubeflow_status_path, report_path
from ._checks import ParamValue as ParamValue
from ._checks import validate_params
from ._errors import BodyTooLarge, ProtocolError
from ._kubeflow import INT32_MAX, KubeflowMetric, TrainerStatus
from ._limits import LIMITS, Limits
from ._progress import Identity, Progress
from ._report import Command, GpuReading, Report, ReportResponse
from ._retry import Backoff, parse_retry_after
from ._retry import Jitter as Jitter
from ._values import (
    decode_float,
    encode_float,
    ended_short_text,
    format_rfc3339,
    is_valid_metric_name,
    is_valid_name,
    parse_rfc3339,
    sanitize_name,
    shown_percent,
    validate_metric_name,
    validate_name,
)
from ._vocabulary import (
    ACTIVITIES,
    API_VERSION,
    COMMAND_KINDS,
    ENDED_STATES,
    HEALTH_STATES,
    JOB_SORT_KEYS,
    JOB_STATES,
    PHASES,
    POLICY_ACTIONS,
    POLICY_HEALTH_TRIGGERS,
    POLICY_NOTIFY_ONLY,
    POLICY_TRIGGERS,
    REPORT_STATES,
)
from ._vocabulary import CommandKind as CommandKind
from ._vocabulary import ReportState as ReportState
from ._where import Frame, Where
from ._window import MetricWindow

__all__ = [
    "ACTIVITIES",
    "API_VERSION",
    "COMMAND_KINDS",
    "ENDED_STATES",
    "HEALTH_STATES",
    "INT32_MAX",
    "JOB_SORT_KEYS",
    "JOB_STATES",
    "LIMITS",
    "PHASES",
    "POLICY_ACTIONS",
    "POLICY_HEALTH_TRIGGERS",
    "POLICY_NOTIFY_ONLY",
    "POLICY_TRIGGERS",
    "REPORT_STATES",
    "Backoff",
    "BodyTooLarge",
    "Command",
    "Frame",
    "GpuReading",
    "Identity",
    "KubeflowMetric",
    "Limits",
    "MetricWindow",
    "Progress",
    "ProtocolError",
    "Report",
    "ReportResponse",
    "TrainerStatus",
    "Where",
    "decode_body",
    "decode_float",
    "encode_body",
    "encode_float",
    "ended_short_text",
    "format_rfc3339",
    "is_valid_metric_name",
    "is_valid_name",
    "jobs_path",
    "kubeflow_status_path",
    "parse_retry_after",
    "parse_rfc3339",
    "report_path",
    "sanitize_name",
    "shown_percent",
    "validate_metric_name",
    "validate_name",
    "validate_params",
]
