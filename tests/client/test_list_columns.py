"""``jobs()`` reads lists in the server's column form: every ``Job`` it gives is the job the item form gives,
field by field (non-finite metrics, health evidence, and the figures that move with the clock included), on a
real server whose clock the test holds still; and the client still reads the item form of older servers, and
turns malformed columns into :class:`InvalidResponse`."""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from swtest import Scripted

from stepwatch.client import Client, InvalidResponse, Job, JobList
from stepwatch.protocol import Identity, MetricWindow, Progress, Report
from stepwatch.server import create_app
from stepwatch.server.store import PendingReport, SQLiteStore
from stepwatch.testing.server import ServerThread

T0 = 1_800_000_000.0

PROPERTIES = (
    "namespace", "name", "state", "attempt", "key", "ended", "progress", "eta", "times", "health", "cost",
    "resources", "metrics", "params", "reason", "exit_code", "source", "loss", "percent", "eta_seconds",
    "trainer_status", "metric_names", "pending_commands", "policy", "ranks",
)  # fmt: skip
"""Everything a ``Job`` tells (``repr`` compares NaN with NaN, and 1 with 1.0 as different)."""
ONLY_ALONE = ("params", "metric_names", "pending_commands", "policy", "ranks")
"""What only a job read alone (``job()``) has."""


class Clock:
    """The server's clock, held still by the test (so two answers can be compared), moved when it says."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _report(seq: int, step: int, metrics: dict[str, float], t: float, **progress: Any) -> Report:
    windows = tuple(
        MetricWindow(k, v, v, v, v, 1, 0, step, step)
        if math.isfinite(v)
        else MetricWindow(k, v, None, None, None, 1, 1, step, step)  # every value non-finite: no min, max, mean
        for k, v in metrics.items()
    )
    return Report(
        run_id="r", seq=seq, sent_at=t, identity=Identity(rank=0, world_size=2, host="h", pid=1),
        progress=Progress(step=step, **progress), metrics=windows, state="running",
    )  # fmt: skip


def _fill(db: Path) -> None:
    """Jobs in every state the list shows differently: pending, running (priced or not, with and without an ETA),
    diverging with non-finite metrics, stalled (wasting), finished, failed, stopped, epochs only, a second attempt."""
    store = SQLiteStore(db)
    t = T0 - 3600

    def job(name: str, ns: str = "lc", **fields: Any) -> Any:
        return store.register(ns, name, token_hash="-", now=t, **fields)

    def report(j: Any, step: int, metrics: dict[str, float], at: float, **progress: Any) -> Any:
        store.ingest_reports([PendingReport(j, _report(step, step, metrics, at, **progress), at, None)])
        return store.job_by_id(j.id)

    job("pending", total_steps=100, gpus=1, gpu_hour_cost=2.0)
    priced = report(job("priced", total_steps=1000, gpus=8, gpu_hour_cost=4.1), 300, {"loss": 0.25}, T0 - 60,
                    total_steps=1000)  # fmt: skip
    store.set_estimate(priced.id, 1234.5, 0.61, T0 - 60)
    store.set_health(priced.id, "healthy", T0 - 1000, {"message": "loss falls", "since": T0 - 1000}, T0 - 60)
    report(job("unpriced", total_steps=1000), 10, {"loss": 1.5, "eval_acc": 0.1}, T0 - 5, total_steps=1000)
    nan = report(job("diverging", total_steps=500, gpus=2, gpu_hour_cost=3.0), 40,
                 {"loss": math.nan, "grad_norm": math.inf, "train/loss": -math.inf, "lr": 3e-4}, T0 - 20,
                 total_steps=500)  # fmt: skip
    store.set_health(nan.id, "diverging", T0 - 25, {"message": "loss is NaN", "metric": "loss", "observed": "NaN",
                                                    "window": [1, 2], "since": T0 - 25}, T0 - 20)  # fmt: skip
    stalled = report(job("stalled", total_steps=100, gpus=4, gpu_hour_cost=1.0), 5, {"loss": 0.9}, T0 - 900,
                     total_steps=100)  # fmt: skip
    store.set_health(stalled.id, "stalled", T0 - 900, {"message": "no step for 900 s"}, T0 - 10)
    done = report(job("finished", total_steps=50, gpus=1, gpu_hour_cost=2.0), 50, {"loss": 0.01}, T0 - 400,
                  total_steps=50)  # fmt: skip
    store.set_state(done, "finished", T0 - 300)
    failed = report(job("failed", total_steps=50), 7, {"loss": 0.5}, T0 - 200, total_steps=50)
    store.set_state(failed, "failed", T0 - 150, "exit 3", 3)
    stopped = report(job("stopped", gpus=1, gpu_hour_cost=1.0), 9, {"loss": 0.4}, T0 - 100)
    store.set_state(stopped, "stopped", T0 - 90, "asked to stop")
    report(job("epochs", total_epochs=3.0), 100, {"loss": 0.3}, T0 - 30, epoch=1.5, total_epochs=3.0)
    again = job("twice", ns="lc2")
    store.set_state(again, "failed", T0 - 500, "oom", 137)
    report(job("twice", ns="lc2", total_steps=10), 2, {"loss": 2.0}, T0 - 40, total_steps=10)
    store.close()


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Clock]]:
    """A real server (uvicorn in a thread) on the filled database, with a clock the test holds."""
    db = tmp_path_factory.mktemp("columns") / "sw.db"
    _fill(db)
    from stepwatch.server.settings import ServerSettings

    clock = Clock(T0)
    with ServerThread(create_app(ServerSettings(db=str(db)), clock=clock), log_level="critical") as server:
        yield server.url, clock


def _items(url: str, **params: Any) -> tuple[list[Job], int]:
    body = httpx.get(f"{url}/api/v1/jobs", params={"limit": 1000, **params}, timeout=10).json()
    return [Job(item) for item in body["items"]], body["total"]


def _same(a: Job, b: Job, properties: tuple[str, ...] = PROPERTIES) -> None:
    for prop in properties:
        assert repr(getattr(a, prop)) == repr(getattr(b, prop)), f"{a.key} {prop}"


def test_a_listed_job_is_the_item_form_field_by_field(listed: tuple[str, Clock]) -> None:
    url, clock = listed
    with Client(url) as client:
        clock.now = T0
        client.jobs(all_attempts=True)  # the server keeps each view (and its columns) from here
        for now in (T0 + 0.5, T0 + 7200.25):  # the kept views are counted to the time of each answer
            clock.now = now
            jobs = client.jobs(all_attempts=True, sort="name")
            items, total = _items(url, all_attempts="true", sort="name")
            assert isinstance(jobs, JobList) and jobs.total == total == len(items) == 11
            assert [j.key for j in jobs] == [j.key for j in items]
            for ours, theirs in zip(jobs, items):
                _same(ours, theirs)
                assert ours.raw == theirs.raw and list(ours.raw) == list(theirs.raw)  # same fields, same order
                assert ours == theirs
            by_name = {j.name: j for j in jobs if j.namespace == "lc"}
            # what moves with the clock moved (not the values of when the server kept the view)
            priced = by_name["priced"]
            assert priced.times.report_age_seconds == now - (T0 - 60)
            assert priced.eta.remaining_seconds == 1234.5 - (now - (T0 - 60)) or priced.eta.remaining_seconds == 0.0
            assert priced.cost.spent == pytest.approx((now - priced.times.started) / 3600 * 32.8)  # type: ignore[operator]
            assert by_name["stalled"].cost.wasted == pytest.approx((now - (T0 - 900)) / 3600 * 4.0)
            diverging = by_name["diverging"]
            assert math.isnan(diverging.metrics["loss"]) and diverging.metrics["grad_norm"] == math.inf
            assert diverging.metrics["train/loss"] == -math.inf and math.isnan(diverging.loss or 0.0)
            assert diverging.health.evidence["observed"] == "NaN" and diverging.health.message == "loss is NaN"


def test_a_listed_job_tells_what_the_job_read_alone_tells(listed: tuple[str, Clock]) -> None:
    """The full view (``job()``) has more; what both have is the same, the Kubeflow shape included."""
    url, clock = listed
    clock.now = T0 + 60
    with Client(url) as client:
        for job in client.jobs(all_attempts=False):
            alone = client.job(job.name, job.namespace)
            _same(job, alone, tuple(p for p in PROPERTIES if p not in ONLY_ALONE))
            assert {k: v for k, v in alone.raw.items() if k in job.raw} == job.raw


def test_filters_and_pages_are_the_item_forms(listed: tuple[str, Clock]) -> None:
    url, _ = listed
    with Client(url) as client:
        for params, call in (
            ({"namespace": "lc", "state": "running", "sort": "-progress"},
             {"namespace": "lc", "state": "running", "sort": "-progress"}),
            ({"limit": 3, "offset": 2, "sort": "name"}, {"limit": 3, "offset": 2, "sort": "name"}),
            ({"health": "diverging,stalled"}, {"health": ["diverging", "stalled"]}),
        ):  # fmt: skip
            jobs = client.jobs(**call)  # type: ignore[arg-type]
            items, total = _items(url, **params)
            assert [j.key for j in jobs] == [j.key for j in items] and jobs.total == total
        empty = client.jobs("nobody")
        assert empty == [] and empty.total == 0


def test_a_listed_job_pickles_alone(listed: tuple[str, Clock]) -> None:
    url, _ = listed
    with Client(url) as client:
        jobs = client.jobs("lc", limit=2)
    copy = pickle.loads(pickle.dumps(jobs[0]))
    assert copy == jobs[0] and len(pickle.dumps(jobs[0])) < len(pickle.dumps(list(jobs))) * 0.75


# ------------------------------------------------------------------- older servers and malformed columns


ITEM = {"namespace": "a", "name": "j", "attempt": 2, "state": "running", "progress": {"percent": 5.0},
        "metrics": {"loss": "NaN", "grad_norm": "Infinity", "lr": "-Infinity"}}  # fmt: skip


def test_an_older_server_answers_with_items(scripted: Scripted) -> None:
    scripted.on("GET", "/api/v1/jobs", (200, {"items": [ITEM], "total": 1}))
    with Client(scripted.url) as client:
        jobs = client.jobs()
    assert [j.key for j in jobs] == ["a/j"] and jobs[0].attempt == 2 and jobs[0].raw == ITEM
    assert jobs[0].progress.percent == 5.0 and math.isnan(jobs[0].metrics["loss"])
    # the server's spelling of the infinities (protocol.encode_float; the SDK refused it before 2026-12-04)
    assert jobs[0].metrics["grad_norm"] == math.inf and jobs[0].metrics["lr"] == -math.inf


def test_columns_a_client_does_not_know_are_kept(scripted: Scripted) -> None:
    columns = {"namespace": ["a"], "name": ["j"], "attempt": [2], "state": ["running"], "progress.percent": [5.0],
               "metrics": [ITEM["metrics"]], "shiny": [1], "new.part": ["x"]}  # fmt: skip
    scripted.on("GET", "/api/v1/jobs", (200, {"columns": columns, "total": 1}))
    with Client(scripted.url) as client:
        (job,) = client.jobs()
    assert job.raw == {**ITEM, "shiny": 1, "new": {"part": "x"}}
    assert job.progress.percent == 5.0 and job.eta.remaining_seconds is None and job.reason == ""
    assert job.trainer_status.progress_percentage == 5


@pytest.mark.parametrize(
    ("columns", "says"),
    [
        ({"namespace": ["a", "b"], "name": ["j"], "state": ["running", "running"]}, "jobs.columns.name has 1 values"),
        ({"namespace": ["a"], "name": [7], "state": ["running"]}, r"jobs.columns\[0\].name should be a string"),
        ({"namespace": ["a"], "state": ["running"]}, r"jobs.columns\[0\].name should be a string"),
        ({"namespace": ["a"], "name": ["j"], "state": ["running"], "attempt": ["2"]}, "attempt should be an integer"),
        ({"namespace": "a"}, "jobs.columns.namespace should be an array"),
        ([], "jobs.columns should be an object"),
        ({"namespace": ["a"], "name": ["j"], "state": ["x"], "progress": [{}], "progress.step": [1]}, "clashes"),
        ({"namespace": ["a"], "name": ["j"], "state": ["x"], "progress.step": [1], "progress": [{}]}, "clashes"),
    ],
)
def test_malformed_columns_are_invalid_responses(scripted: Scripted, columns: Any, says: str) -> None:
    scripted.on("GET", "/api/v1/jobs", (200, {"columns": columns, "total": 1}))
    with Client(scripted.url) as client, pytest.raises(InvalidResponse, match=says):
        client.jobs()


def test_a_malformed_part_is_an_invalid_response_when_read(scripted: Scripted) -> None:
    columns = {"namespace": ["a"], "name": ["j"], "state": ["running"], "progress.percent": ["lots"], "cost": [3]}
    scripted.on("GET", "/api/v1/jobs", (200, {"columns": columns, "total": 1}))
    with Client(scripted.url) as client:
        (job,) = client.jobs()
    with pytest.raises(InvalidResponse, match=r"progress\.percent should be a number"):
        job.progress  # noqa: B018
    with pytest.raises(InvalidResponse, match=r"job\.cost should be an object"):
        job.cost  # noqa: B018


def test_the_async_client_reads_columns_too(listed: tuple[str, Clock]) -> None:
    import asyncio

    from stepwatch.client import AsyncClient

    url, clock = listed
    clock.now = T0 + 3

    async def main() -> list[Job]:
        async with AsyncClient(url) as client:
            return list(await client.jobs("lc", sort="name"))

    jobs = asyncio.run(main())
    items, _ = _items(url, namespace="lc", sort="name")
    assert len(jobs) == len(items) == 9
    for ours, theirs in zip(jobs, items):
        _same(ours, theirs)
