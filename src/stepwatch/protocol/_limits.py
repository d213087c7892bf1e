"""The one table of limits: enforced by the server, respected by the report core."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["LIMITS", "Limits"]


@dataclass(frozen=True)
class Limits:
    """The one table of limits: enforced by the server, respected by the report core."""

    max_body_bytes: int = 64 * 1024
    """Largest request body, native or Kubeflow (upstream answers 413 above it)."""
    max_name_length: int = 63
    """Job and namespace names: Kubernetes DNS-1123 labels, so they can be TrainJob names."""
    max_metric_name_length: int = 64
    """Metric names are 1..64 printable characters (``train/loss``, ``rewards/chosen``)."""
    max_metrics_per_report: int = 256
    """Distinct metrics in one report (native windows or Kubeflow metrics)."""
    max_metric_value_length: int = 64
    """Kubeflow metric values are strings of 1..64 characters."""
    max_params: int = 128
    """Hyperparameters sent once per run."""
    max_param_key_length: int = 64
    max_param_value_length: int = 256
    """Longer string values are cut by the report core (with an ellipsis) rather than rejected."""
    max_reason_length: int = 256
    max_run_id_length: int = 64
    max_host_length: int = 253
    max_acks: int = 64
    max_commands: int = 16
    max_gpus_per_report: int = 64
    """GPU readings one rank sends (the GPUs its process sees)."""
    max_world_size: int = 1 << 20
    max_depth: int = 64
    """Deepest nesting of objects and arrays in a body (a report nests 3 deep): a deeper one, though
    parsed, could exhaust the stack later in any code that walks or prints it (that was a 500)."""
    max_integer: int = 2**53 - 1
    """Largest integer anywhere in a message (steps, counts, seq): what JavaScript reads exactly, and far
    inside the 64-bit integers the stores keep (a larger one was a 500 from the database driver)."""
    default_interval_s: float = 2.0
    """How often the report core sends to a stepwatch server."""
    min_kubeflow_interval_s: float = 5.0
    """Never send to an upstream Kubeflow endpoint more often than this (upstream's own pace)."""
    heartbeat_interval_factor: int = 5
    """Ranks other than 0 heartbeat this many times less often than rank 0 reports."""
    max_where_frames: int = 8
    """Frames of the user's own code in one :class:`Where` reading (innermost first)."""
    max_frame_function_length: int = 128
    max_frame_file_length: int = 256
    max_where_detail_length: int = 128


LIMITS: Final = Limits()
