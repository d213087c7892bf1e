"""How stored rows become records, the same for both stores: the job columns, JSON and float cells.

Both schemas keep a job's dicts as JSON text (``last_metrics`` and ``metric_means`` with non-finite values as strings,
which JSON has no numbers for) and a window's ``last`` as a float where ``NaN`` is not ``NULL``:
SQLite turns a NaN into ``NULL``, so it is stored there as the text ``'NaN'``, which PostgreSQL's
``double precision`` reads back as its own NaN.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ...protocol import decode_float, encode_float
from .base import Job

__all__ = ["JOB_COLUMNS", "column_value", "job_from_row", "load_float", "store_float"]

JOB_COLUMNS = (
    "id, namespace, name, attempt, state, created_at, updated_at, started_at, finished_at, last_report_at, "
    "step, total_steps, epoch, total_epochs, samples, steps_per_second, samples_per_second, reported_eta, "
    "reported_progress, reason, exit_code, source, gpus, gpu_hour_cost, world_size, params, last_metrics, "
    "nonfinite_total, eta_seconds, eta_rate, eta_at, health, health_since, health_evidence, policy, policy_fired, "
    "gpu_type, trainer_status, health_history, metric_means"
)


def store_float(value: float) -> float | str:
    """SQLite turns NaN into NULL: store it as the text 'NaN' (infinities are REAL)."""
    return "NaN" if math.isnan(value) else value


def load_float(value: Any) -> float:
    """A stored ``last`` back as a float (``NULL`` and ``'NaN'`` are NaN)."""
    return math.nan if value is None or value == "NaN" else float(value)


def job_from_row(row: tuple[Any, ...]) -> Job:
    """A job from a row of :data:`JOB_COLUMNS`."""
    (
        job_id,
        namespace,
        name,
        attempt,
        state,
        created_at,
        updated_at,
        started_at,
        finished_at,
        last_report_at,
        step,
        total_steps,
        epoch,
        total_epochs,
        samples,
        steps_per_second,
        samples_per_second,
        reported_eta,
        reported_progress,
        reason,
        exit_code,
        source,
        gpus,
        gpu_hour_cost,
        world_size,
        params,
        last_metrics,
        nonfinite_total,
        eta_seconds,
        eta_rate,
        eta_at,
        health,
        health_since,
        health_evidence,
        policy,
        policy_fired,
        gpu_type,
        trainer_status,
        health_history,
        metric_means,
    ) = row
    return Job(
        id=job_id,
        namespace=namespace,
        name=name,
        attempt=attempt,
        state=state,
        created_at=created_at,
        updated_at=updated_at,
        started_at=started_at,
        finished_at=finished_at,
        last_report_at=last_report_at,
        step=step,
        total_steps=total_steps,
        epoch=epoch,
        total_epochs=total_epochs,
        samples=samples,
        steps_per_second=steps_per_second,
        samples_per_second=samples_per_second,
        reported_eta=reported_eta,
        reported_progress=reported_progress,
        reason=reason,
        exit_code=exit_code,
        source=source,
        gpus=gpus,
        gpu_hour_cost=gpu_hour_cost,
        world_size=world_size,
        params=json.loads(params),
        last_metrics={k: decode_float(v, k) for k, v in json.loads(last_metrics).items()},
        nonfinite_total=nonfinite_total,
        eta_seconds=eta_seconds,
        eta_rate=eta_rate,
        eta_at=eta_at,
        health=health,
        health_since=health_since,
        health_evidence=json.loads(health_evidence),
        policy=json.loads(policy),
        policy_fired=json.loads(policy_fired),
        gpu_type=gpu_type,
        trainer_status=None if trainer_status is None else json.loads(trainer_status),
        health_history=json.loads(health_history),
        metric_means={k: decode_float(v, k) for k, v in json.loads(metric_means).items()},
    )


def column_value(name: str, value: Any) -> Any:
    """A job field as its column stores it (the dicts are JSON; non-finite metrics as strings)."""
    if name == "params":
        return json.dumps(value)
    if name in ("last_metrics", "metric_means"):
        return json.dumps({k: encode_float(v) for k, v in value.items()})
    if name in ("health_evidence", "policy", "policy_fired", "health_history"):
        return json.dumps(value, default=str)
    if name == "trainer_status":
        return None if value is None else json.dumps(value, ensure_ascii=False)
    return value
