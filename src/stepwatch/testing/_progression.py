"""What OpenShift AI's progression controller does with a training pod, as test helpers (standard library).

:func:`poll_progression` is one poll of the controller (``pkg/rhai/progression/progression.go``): a GET
of ``/metrics`` with a 2 s timeout, only a 200 accepted, the body read with the port of Go's
``encoding/json`` decoding (:func:`stepwatch.protocol.progression.decode_status`).
:func:`read_termination_message` reads a termination message the way the controller reads the one of
the container ``node`` at the end (``CaptureMetricsFromTerminationMessage``): refused when empty, not
JSON or without a ``progressPercentage`` (absent or ``null``), and the kubelet keeps only its first 4 KiB.
Both raise :class:`~stepwatch.protocol.progression.ProgressionError` where the controller would drop what
it read (``OSError`` for a connection it could not make)::

    run = stepwatch.init(total_steps=100, metrics_port="127.0.0.1:0")
    run.step(loss=0.5)
    status = poll_progression(run.metrics_address)
"""

from __future__ import annotations

import http.client
from pathlib import Path

from ..protocol.progression import (
    MAX_TERMINATION_MESSAGE,
    AnnotationStatus,
    ProgressionError,
    ProgressionStatus,
    decode_annotation,
    decode_status,
)

__all__ = ["CONTROLLER_TIMEOUT", "poll_progression", "read_termination_message"]

CONTROLLER_TIMEOUT = 2.0
"""The controller's timeout for one poll, in seconds."""


def poll_progression(
    address: tuple[str, int], *, path: str = "/metrics", timeout: float = CONTROLLER_TIMEOUT
) -> ProgressionStatus:
    """GET the status a pod serves at ``address`` (host, port) and read it as the controller does."""
    host, port = address
    connection = http.client.HTTPConnection("127.0.0.1" if host in ("0.0.0.0", "") else host, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    if response.status != 200:
        raise ProgressionError(f"the pod answered {response.status}, not 200")
    return decode_status(body)


def read_termination_message(path: str | Path) -> AnnotationStatus:
    """Read a termination message file as the controller reads the container's ``terminated.message``."""
    data = Path(path).read_bytes()[:MAX_TERMINATION_MESSAGE]  # what the kubelet keeps
    if not data.strip():
        raise ProgressionError("the termination message is empty")
    status = decode_annotation(data)
    if status.progress_percentage is None:  # Go: a nil pointer, whether absent or null
        raise ProgressionError("the termination message has no progressPercentage")
    return status
