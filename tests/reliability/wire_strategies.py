"""Hypothesis strategies for wire messages, shared by the protocol properties and the ingest fuzzing."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from stepwatch.protocol import (
    LIMITS,
    Command,
    GpuReading,
    Identity,
    KubeflowMetric,
    MetricWindow,
    Progress,
    Report,
    TrainerStatus,
    format_rfc3339,
)

ints = st.integers(min_value=0, max_value=LIMITS.max_integer)
finite = st.floats(allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
any_float = st.floats()
metric_names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=LIMITS.max_metric_name_length).filter(
    str.isprintable
)
run_ids = st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True)


@st.composite
def windows(draw: st.DrawFn, name: str | None = None) -> MetricWindow:
    values = draw(st.lists(any_float, min_size=1, max_size=8))
    good = [v for v in values if math.isfinite(v)]
    first = draw(ints)
    last = draw(st.integers(min_value=first, max_value=LIMITS.max_integer))
    return MetricWindow(
        name=draw(metric_names) if name is None else name,
        last=values[-1],
        min=min(good) if good else None,
        max=max(good) if good else None,
        mean=(draw(st.floats(min(good), max(good))) if good else None),
        count=len(values) + draw(st.integers(0, 1000)) * bool(good),
        nonfinite=len(values) - len(good),
        first_step=first,
        last_step=last,
    )


identities = st.integers(1, LIMITS.max_world_size).flatmap(
    lambda world: st.builds(
        Identity,
        rank=st.integers(0, world - 1),
        world_size=st.just(world),
        local_rank=st.integers(0, LIMITS.max_world_size),
        host=st.text(max_size=LIMITS.max_host_length),
        pid=ints,
    )
)
progresses = st.builds(
    Progress,
    step=st.none() | ints,
    total_steps=st.none() | st.integers(1, LIMITS.max_integer),
    epoch=st.none() | nonneg,
    total_epochs=st.none() | nonneg.filter(lambda x: x > 0),
    samples=st.none() | ints,
    steps_per_second=st.none() | nonneg,
    samples_per_second=st.none() | nonneg,
    step_time=st.none() | nonneg,
    eta_seconds=st.none() | nonneg,
)
gpus = st.builds(
    GpuReading,
    index=st.integers(0, 64),
    utilization=st.none() | st.floats(0, 100),
    memory_used=st.none() | ints,
    memory_total=st.none() | ints,
)
param_values = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | finite | st.text(max_size=256)
params = st.dictionaries(
    st.text(min_size=1, max_size=LIMITS.max_param_key_length).filter(str.isprintable), param_values, max_size=8
)


@st.composite
def reports(draw: st.DrawFn) -> Report:
    names = draw(st.lists(metric_names, unique=True, max_size=6))
    return Report(
        run_id=draw(run_ids),
        seq=draw(ints),
        sent_at=draw(nonneg),
        identity=draw(identities),
        progress=draw(progresses),
        metrics=tuple(draw(windows(name)) for name in names),
        params=draw(st.none() | params),
        acks=tuple(draw(st.lists(run_ids, max_size=4))),
        state=draw(st.sampled_from(["running", "finished", "failed", "stopped"])),
        reason=draw(st.text(max_size=LIMITS.max_reason_length)),
        gpus=tuple(draw(st.lists(gpus, max_size=4))),
    )


commands = st.builds(
    Command, id=run_ids, kind=st.sampled_from(["stop", "checkpoint"]), reason=st.text(max_size=LIMITS.max_reason_length)
)
short_text = st.text(min_size=1, max_size=64)
trainer_statuses = st.builds(
    TrainerStatus,
    progress_percentage=st.none() | st.integers(0, 100),
    estimated_remaining_seconds=st.none() | st.integers(0, 2**31 - 1),  # an int32, as upstream's CRD has it
    metrics=st.lists(st.builds(KubeflowMetric, name=metric_names, value=short_text), max_size=8).map(tuple),
    last_updated_time=st.integers(0, 4_000_000_000).map(float).map(format_rfc3339),  # required upstream
)

# Any JSON value, with the awkward ones: huge integers, deep nesting, the non-finite strings, odd keys.
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=80)
    | st.sampled_from(["NaN", "Infinity", "-Infinity", "", "0", "running", "stop"])
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30,
)


@st.composite
def mutated_reports(draw: st.DrawFn) -> dict[str, Any]:
    """A valid report body with one value somewhere replaced by any JSON value, or one key removed."""
    body = draw(reports()).to_dict()
    node: Any = body
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        assume(keys)
        key = draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, (dict, list)) and child and draw(st.booleans()):
            node = child
            continue
        if isinstance(node, dict) and draw(st.booleans()):
            del node[key]
        else:
            node[key] = draw(json_values)
        return body
