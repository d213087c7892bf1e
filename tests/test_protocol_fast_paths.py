"""The protocol's one-pass readers (``_window_at_once``, ``_identity_at_once``, ``_progress_at_once``) take
exactly what the field-by-field readers take and build the same objects: for any JSON-like object, reading
it gives what the dataclass's own ``__init__`` gives (the same object, or the same error and field)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwatch.protocol import LIMITS, Identity, MetricWindow, Progress, ProtocolError, Report

# values near every boundary the checks have, of every JSON type
_INTS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([LIMITS.max_integer, LIMITS.max_integer + 1, 2**64, LIMITS.max_world_size]),
    st.integers(-(2**70), 2**70),
)
_FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.5, -1.0, 1e308]),
)
_ANY = st.one_of(_INTS, _FLOATS, st.none(), st.booleans(), st.sampled_from(["", "loss", "NaN", "x\n", "eval", "train"]))
_NAMES = st.sampled_from(["loss", "", "a" * 65, "bad\tname", "rewards/chosen", 3])


def _outcome(read: Any, *args: Any) -> Any:
    try:
        return ("ok", read(*args))
    except ProtocolError as exc:
        return ("error", exc.field, exc.message)


def _via_init(obj: dict[str, Any]) -> MetricWindow:
    return MetricWindow._field_by_field(obj)  # the slow path, which every other body takes


def _init_of(cls: Any, field: str) -> Any:
    """``cls(**obj)`` with its errors' fields under ``field``, as ``from_dict`` reads them."""
    from stepwatch.protocol._errors import _prefix

    def read(obj: dict[str, Any]) -> Any:
        with _prefix(field):
            return cls(**obj)

    return read


def _same(a: Any, b: Any) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "error":
        return bool(a == b)
    x, y = a[1], b[1]
    return all(
        (isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v))
        or (u == v and type(u) is type(v))
        for u, v in zip(vars(x).values(), vars(y).values(), strict=True)
    )


@settings(max_examples=600, deadline=None)
@given(
    name=_NAMES,
    last=_ANY,
    lo=_ANY,
    hi=_ANY,
    mean=_ANY,
    count=_INTS,
    nonfinite=_INTS,
    first=_INTS,
    last_step=_INTS,
    drop=st.sampled_from([None, "nonfinite", "mean", "name"]),
)
def test_a_window_reads_as_the_field_by_field_reader_reads_it(**parts: Any) -> None:
    obj = {
        "name": parts["name"],
        "last": parts["last"],
        "min": parts["lo"],
        "max": parts["hi"],
        "mean": parts["mean"],
        "count": parts["count"],
        "nonfinite": parts["nonfinite"],
        "first_step": parts["first"],
        "last_step": parts["last_step"],
    }
    if parts["drop"]:
        del obj[parts["drop"]]
    assert _same(_outcome(MetricWindow.from_dict, obj), _outcome(_via_init, obj))


@settings(max_examples=400, deadline=None)
@given(rank=_ANY | _INTS, world=_INTS, local=_INTS, host=st.sampled_from(["", "node-1", "h" * 254, 7]), pid=_INTS)
def test_an_identity_reads_as_its_init_reads_it(rank: Any, world: Any, local: Any, host: Any, pid: Any) -> None:
    obj = {"rank": rank, "world_size": world, "local_rank": local, "host": host, "pid": pid}
    assert _same(_outcome(Identity.from_dict, obj), _outcome(_init_of(Identity, "identity"), obj))


@settings(max_examples=600, deadline=None)
@given(
    values=st.fixed_dictionaries(
        {},
        optional=dict.fromkeys(
            (f.name for f in dataclasses.fields(Progress)),  # every field the wire may carry
            _ANY,
        ),
    )
)
def test_a_progress_reads_as_its_init_reads_it(values: dict[str, Any]) -> None:
    assert _same(_outcome(Progress.from_dict, values), _outcome(_init_of(Progress, "progress"), values))


def test_a_report_read_at_once_equals_the_one_written() -> None:
    body = {
        "api_version": "v1",
        "run_id": "r-1",
        "seq": 3,
        "sent_at": 1.5,
        "state": "running",
        "identity": {"rank": 1, "world_size": 2, "local_rank": 1, "host": "n", "pid": 9},
        "progress": {"step": 10, "total_steps": 100, "steps_per_second": 2.5, "phase": "eval", "phase_seconds": 3.0},
        "metrics": [
            {"name": "loss", "last": 0.5, "min": 0.25, "max": 1.0, "mean": 0.5, "count": 4, "nonfinite": 0,
             "first_step": 7, "last_step": 10},
            {"name": "gn", "last": "NaN", "min": None, "max": None, "mean": None, "count": 2, "nonfinite": 2,
             "first_step": 9, "last_step": 10},
        ],
    }  # fmt: skip
    report = Report.from_dict(body)
    assert report.to_dict() == body
    assert report == Report(**{**vars(report)})


_WINDOW = {"name": "loss", "last": 0.5, "min": 0.25, "max": 1.0, "mean": 0.5, "count": 4, "nonfinite": 0,
           "first_step": 7, "last_step": 10}  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(
    top=st.fixed_dictionaries(
        {},
        optional={
            "run_id": st.sampled_from(["r-1", "", "a" * 64, "a" * 65, "bad id", "r.1_x", 7, None]),
            "seq": _ANY,
            "sent_at": _ANY,
            "state": st.sampled_from(["running", "finished", "failed", "stopped", "lost", "", 1, None]),
            "reason": st.sampled_from(["", "done", "x" * 256, "x" * 257, 5, None]),
            "acks": st.sampled_from([[], ["c-1"], ["bad id"], [3], "c-1"]),
            "params": st.sampled_from([None, {}, {"lr": 0.1}, {"lr": float("nan")}, {"": 1}, []]),
            "activity_shares": st.sampled_from([None, {}, {"computing": 0.5}, {"computing": 2.0}, {"x": 0.1}]),
            "identity": st.sampled_from([{}, {"rank": 1, "world_size": 2}, {"rank": 2, "world_size": 2}]),
            "progress": st.sampled_from([{}, {"step": 3}, {"step": -1}]),
        },
    ),
    names=st.lists(st.sampled_from(["loss", "lr", "bad\tname"]), max_size=3),
)
def test_a_report_reads_as_its_init_checks_it(top: dict[str, Any], names: list[str]) -> None:
    """``Report.from_dict`` leaves ``__post_init__`` out for a report in the report core's shape: for any
    top-level fields and metric names (duplicates included), it gives what checking every report gives."""
    import stepwatch.protocol._report as module

    body = {"run_id": "r-1", "seq": 1, "sent_at": 2.0, **top, "metrics": [{**_WINDOW, "name": n} for n in names]}
    fast = _outcome(Report.from_dict, body)
    shortcut = module._plain_report
    module._plain_report = lambda report: False  # type: ignore[assignment]
    try:
        checked = _outcome(Report.from_dict, body)
    finally:
        module._plain_report = shortcut
    assert _same(fast, checked)
