"""The Job schema of ``/openapi.json`` against real job views: a job hung in a rank's own code, a straggler,
and a job that finished, each read from a real server (uvicorn on loopback, a real SQLite file, its health
knobs short so that a hang and a straggler show in seconds) fed real reports. Every view validates; every
piece of evidence these verdicts carry is described; and what the schema says of the figures holds (percent
rounded down to one decimal, no live rate when stalled or ended, no hourly rate once ended, the health
timeline without overlap or gap).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwatch.protocol import Frame, Identity, MetricWindow, Progress, Report, Where
from stepwatch.testing import wait_for
from stepwatch.testing.server import LocalServer

jsonschema = pytest.importorskip("jsonschema")

KNOBS = {
    "hang_floor_s": 1.0,
    "stall_floor_s": 2.0,
    "standstill_floor_s": 2.0,
    "straggler_hold_s": 2.0,
    "rank_check_s": 0.5,
}


@pytest.fixture
def http(tmp_path: Path) -> Iterator[httpx.Client]:
    server = LocalServer(tmp_path / "sw.db", log_level="critical", health=KNOBS, health_sweep_s=0.5)
    server.start()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client
    server.stop()


def _job(http: httpx.Client, name: str, world: int, total: int) -> Callable[..., None]:
    answer = http.post(
        "/api/v1/namespaces/default/jobs", json={"name": name, "total_steps": total, "gpus": 1, "gpu_hour_cost": 3.0}
    )
    assert answer.status_code == 201, answer.text
    token = answer.json()["token"]
    seqs = [0] * world

    def report(rank: int, step: int, *, where: Where | None = None, shares: Any = None, state: str = "running") -> None:
        seqs[rank] += 1
        loss = 1.0 / (1 + step)
        body = Report(
            run_id=f"run-{name}",
            seq=seqs[rank],
            sent_at=time.time(),
            identity=Identity(rank=rank, world_size=world, host=f"node-{rank + 1}", pid=100 + rank),
            progress=Progress(step=step, total_steps=total),
            metrics=(MetricWindow("loss", loss, loss, loss, loss, 1, 0, step, step),) if rank == 0 else (),
            where=where,
            activity_shares=shares,
            state=state,  # type: ignore[arg-type]
        )
        sent = http.post(
            f"/api/v1/namespaces/default/jobs/{name}/reports",
            json=body.to_dict(),
            headers={"Authorization": f"Bearer {token}"},
        )
        assert sent.status_code == 200, sent.text

    return report


def _view(http: httpx.Client, name: str) -> dict[str, Any]:
    answer = http.get(f"/api/v1/namespaces/default/jobs/{name}")
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


def _until(http: httpx.Client, name: str, state: str, feed: Callable[[int], None]) -> dict[str, Any]:
    """Feed the job (call ``i`` at most every 0.2 s) until its view reads ``state``; that view."""
    calls = itertools.count()

    def fed_and_read() -> dict[str, Any] | None:
        feed(next(calls))
        view = _view(http, name)
        return view if view["health"]["state"] == state else None

    try:
        view: dict[str, Any] = wait_for(fed_and_read, 30, f"{name} to read {state}", every=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its health: {_view(http, name)['health']}") from None
    return view


def _check_timeline(view: dict[str, Any]) -> None:
    spans = view["health_history"]
    assert spans
    for before, after in itertools.pairwise(spans):
        assert after["start"] == pytest.approx(before["end"]), spans  # no gap, no overlap
    for span in spans:
        assert span["seconds"] == pytest.approx(span["end"] - span["start"]) and span["seconds"] >= 0
    elapsed = view["times"]["elapsed_seconds"]
    assert sum(s["seconds"] for s in spans) == pytest.approx(elapsed, abs=1.0)


def test_real_views_match_the_job_schema_and_what_it_says(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    schema = document["components"]["schemas"]["Job"]
    described = set(schema["properties"]["health"]["properties"]["evidence"]["properties"])
    validator = jsonschema.Draft202012Validator(schema)

    hung = _job(http, "hung", 2, 1_000_000)
    for step in range(1, 21):
        hung(0, step)
        hung(1, step)
    lock = Where("waiting", 5.0, "threading.Lock.acquire", (Frame("wait_for_lock", "train.py", 31),))
    reduce = Where("communicating", 5.0, "torch.distributed.all_reduce", (Frame("main", "train.py", 9),))

    def stand(i: int) -> None:
        hung(1, 20, where=lock)
        hung(0, 20, where=reduce)

    stalled = _until(http, "hung", "stalled", stand)
    evidence = stalled["health"]["evidence"]
    assert (
        evidence["kind"] == "hang" and evidence["rank"] == 1 and evidence["frames"] == ["wait_for_lock (train.py:31)"]
    )
    assert stalled["progress"]["steps_per_second"] is None  # stalled: no live rate

    slow = _job(http, "slowrank", 3, 1_000_000)
    waits = {"computing": 0.3, "communicating": 0.7}
    lags = {"computing": 0.3, "loading_data": 0.6, "communicating": 0.1}

    def step_together(i: int) -> None:
        for rank in range(3):
            slow(rank, 10 * (i + 1), shares=lags if rank == 2 else waits)

    straggling = _until(http, "slowrank", "straggling", step_together)
    assert straggling["health"]["evidence"]["metric"] == "rank_pace"

    done = _job(http, "done", 1, 3000)
    for step in (100, 1000, 2999):
        done(0, step)
        time.sleep(0.05)
    done(0, 2999, state="finished")
    ended = _view(http, "done")

    for view in (stalled, straggling, ended):
        errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(view)]
        assert not errors, (view["name"], errors)
        assert set(view["health"]["evidence"]) <= described, set(view["health"]["evidence"]) - described
        _check_timeline(view)
    # the percent is the shown value: one decimal, rounded down (2999 of 3000 is 99.9, not 100)
    assert ended["state"] == "finished" and ended["progress"]["percent"] == 99.9
    assert math.floor(stalled["progress"]["percent"] * 10) / 10 == stalled["progress"]["percent"]
    assert ended["progress"]["steps_per_second"] is None and ended["cost"]["rate_per_hour"] is None
    assert stalled["cost"]["rate_per_hour"] == 3.0
    assert set(ended["metric_means"]) <= set(ended["metrics"])
