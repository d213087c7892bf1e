"""Metric windows: aggregates against a reference, non-finite values, limits, device values."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from stepwatch._window import WindowBuffer
from stepwatch.protocol import MetricWindow


def reference(name: str, entries: list[tuple[int, float]]) -> MetricWindow:
    """The window of a metric computed the obvious way."""
    finite = [v for _, v in entries if math.isfinite(v)]
    steps = [s for s, _ in entries]
    return MetricWindow(
        name=name,
        last=entries[-1][1],
        min=min(finite) if finite else None,
        max=max(finite) if finite else None,
        mean=sum(finite) / len(finite) if finite else None,
        count=len(entries),
        nonfinite=len(entries) - len(finite),
        first_step=min(steps),
        last_step=max(steps),
    )


def same(a: MetricWindow, b: MetricWindow) -> bool:
    def eq(x: float | None, y: float | None) -> bool:
        if x is None or y is None:
            return x is y
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12)

    return (
        a.name == b.name
        and (a.count, a.nonfinite, a.first_step, a.last_step) == (b.count, b.nonfinite, b.first_step, b.last_step)
        and all(eq(getattr(a, f), getattr(b, f)) for f in ("last", "min", "max", "mean"))
    )


def feed(buffer: WindowBuffer, entries: list[tuple[int, dict[str, Any]]]) -> dict[str, MetricWindow]:
    for step, metrics in entries:
        buffer.add(step, metrics)
    return {w.name: w for w in buffer.take()}


@pytest.mark.parametrize("cap", [3, 7, 4096])
def test_aggregates_match_the_reference_whatever_the_reduction_size(cap: int) -> None:
    rng = random.Random(cap)
    special = [math.nan, math.inf, -math.inf]
    entries: list[tuple[int, dict[str, Any]]] = []
    values: dict[str, list[tuple[int, float]]] = {"loss": [], "lr": [], "eval": []}
    for step in range(1, 500):
        loss = rng.choice(special) if rng.random() < 0.05 else rng.gauss(2.0, 1.0)
        metrics: dict[str, Any] = {"loss": loss, "lr": 1e-3 * step}
        if step % 50 == 0:
            metrics["eval"] = rng.random()
        entries.append((step, metrics))
        for k, v in metrics.items():
            values[k].append((step, v))
    windows = feed(WindowBuffer(series_cap=cap), entries)
    for name, series in values.items():
        assert same(windows[name], reference(name, series)), name


def test_all_nonfinite_metric_has_no_min_max_mean() -> None:
    windows = feed(WindowBuffer(), [(1, {"loss": math.nan}), (2, {"loss": math.inf})])
    assert windows["loss"] == MetricWindow("loss", math.inf, None, None, None, 2, 2, 1, 2)


def test_numbers_of_every_kind_are_read_and_non_numbers_dropped_once(caplog: pytest.LogCaptureFixture) -> None:
    np = pytest.importorskip("numpy")
    buffer = WindowBuffer()
    entries = [
        (1, {"a": 1, "b": True, "c": np.float32(0.5), "d": np.int64(7), "e": np.array(2.5)}),
        (2, {"a": 10**400, "s": "abc", "n": None, "l": [1, 2]}),
        (3, {"s": "again"}),
    ]
    windows = feed(buffer, entries)
    assert windows["a"].count == 1  # 10**400 is not a float: dropped
    assert (windows["b"].last, windows["c"].last, windows["d"].last, windows["e"].last) == (1.0, 0.5, 7.0, 2.5)
    assert "s" not in windows and "n" not in windows and "l" not in windows
    assert buffer.dropped == 5
    assert caplog.text.count("dropped metric 's'") == 1


@pytest.mark.parametrize("name", ["", "x" * 65, "bad\nname", "tab\there", "\x00", 7])
def test_invalid_names_are_dropped(name: Any, caplog: pytest.LogCaptureFixture) -> None:
    buffer = WindowBuffer()
    windows = feed(buffer, [(1, {name: 1.0, "ok": 2.0})])
    assert list(windows) == ["ok"]
    assert buffer.dropped == 1
    assert "a metric name must be 1-64 printable characters" in caplog.text


def test_names_users_log_are_accepted() -> None:
    names = ["train/loss", "eval_accuracy", "rewards/chosen", "x" * 64, "loss (smoothed)", "précision"]
    windows = feed(WindowBuffer(), [(1, dict.fromkeys(names, 1.0))])
    assert sorted(windows) == sorted(names)


def test_at_most_max_metrics_distinct_names() -> None:
    buffer = WindowBuffer(max_metrics=4)
    windows = feed(buffer, [(1, {f"m{i}": 1.0 for i in range(6)}), (2, {"m0": 2.0, "m5": 1.0})])
    assert sorted(windows) == ["m0", "m1", "m2", "m3"]
    assert windows["m0"].count == 2
    assert buffer.dropped == 3


def test_a_window_closes_and_the_next_one_starts_empty() -> None:
    buffer = WindowBuffer()
    assert [w.count for w in buffer.take()] == []
    assert feed(buffer, [(1, {"loss": 1.0})])["loss"].count == 1
    assert feed(buffer, [(2, {"loss": 3.0})])["loss"] == MetricWindow("loss", 3.0, 3.0, 3.0, 3.0, 1, 0, 2, 2)


# ---------------------------------------------------------------------------------- device values


class FakeDeviceValue:
    """Stands for an accelerator tensor: its module says torch, and reading it is recorded."""

    __module__ = "torch.fake"

    def __init__(self, value: float, reads: list[float]) -> None:
        self.value = value
        self.reads = reads
        self.device = type("Device", (), {"type": "cuda"})()

    def __float__(self) -> float:
        self.reads.append(self.value)
        return self.value


def test_device_values_are_not_read_by_a_fold_on_the_training_thread() -> None:
    reads: list[float] = []
    buffer = WindowBuffer(series_cap=4)
    for i in range(10):
        buffer.add(i, {"loss": FakeDeviceValue(float(i), reads)})
    buffer.drain(on_training_thread=True)
    assert reads == []  # held by reference through two reductions
    window = {w.name: w for w in buffer.take()}["loss"]
    assert sorted(reads) == [float(i) for i in range(10)]
    assert (window.count, window.min, window.max) == (10, 0.0, 9.0)


def test_held_device_values_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    reads: list[float] = []
    buffer = WindowBuffer(series_cap=4, max_held=6)
    for i in range(20):
        buffer.add(i, {"loss": FakeDeviceValue(float(i), reads)})
    buffer.drain(on_training_thread=True)
    window = {w.name: w for w in buffer.take()}["loss"]
    assert window.count == 6 + (20 % 4)  # the newest six held plus the unreduced tail
    assert buffer.dropped >= 1
    assert "more accelerator values than fit in one window" in caplog.text


def test_torch_scalars_of_mixed_kinds_are_all_read() -> None:
    torch = pytest.importorskip("torch")
    buffer = WindowBuffer()
    w = torch.ones(3, requires_grad=True)
    values = {
        "f32": torch.tensor(1.5),
        "bf16": torch.tensor(2.0, dtype=torch.bfloat16),
        "i64": torch.tensor(3),
        "shape1": torch.tensor([4.0]),
        "grad": (w * 2).sum(),
        "nan": torch.tensor(float("nan")),
    }
    windows = feed(buffer, [(1, values), (2, {"vector": torch.ones(3)})])
    assert windows["f32"].last == 1.5
    assert windows["bf16"].last == 2.0
    assert windows["i64"].last == 3.0
    assert windows["shape1"].last == 4.0
    assert windows["grad"].last == 6.0
    assert windows["nan"].nonfinite == 1
    assert "vector" not in windows
    assert buffer.dropped == 1


def test_mixed_python_and_tensor_values_keep_their_order() -> None:
    torch = pytest.importorskip("torch")
    windows = feed(WindowBuffer(), [(1, {"loss": torch.tensor(5.0)}), (2, {"loss": 1.0}), (3, {"loss": 2.0})])
    assert windows["loss"].last == 2.0 and windows["loss"].max == 5.0


def test_the_hot_path_and_the_buffer_agree_on_where_the_step_travels() -> None:
    from stepwatch import _run, _window

    assert _run._STEP_KEY == _window.STEP_KEY and not isinstance(_window.STEP_KEY, str)
