"""The SDK's ``Job.health`` of a verdict by where each rank stands (issue 29 item 6): the message, the hung
rank's place (:class:`StallPlace`) and the straggler (:class:`Straggler`) typed, and the notebook display
saying the message. A real server on loopback (its health knobs short: a hang after 1 s, a straggler after
2 s) fed real reports over HTTP, as the report core sends them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from swtest import Server, wait_for

from stepwatch.client import Client, Health, InvalidResponse, StallPlace, Straggler
from stepwatch.client._job import job_html, jobs_html
from stepwatch.protocol import Frame, Identity, MetricWindow, Progress, Report, Where

KNOBS = {
    "hang_floor_s": 1.0,
    "stall_floor_s": 2.0,
    "standstill_floor_s": 2.0,
    "straggler_hold_s": 2.0,
    "rank_check_s": 0.5,
}


@pytest.fixture
def quick(tmp_path: Path) -> Iterator[str]:
    srv = Server(tmp_path / "sw.db", health=KNOBS, health_sweep_s=0.5).start()
    yield srv.url
    srv.stop()


def _ranks(http: httpx.Client, name: str, world: int) -> Callable[..., None]:
    response = http.post("/api/v1/namespaces/default/jobs", json={"name": name, "total_steps": 1_000_000})
    assert response.status_code == 201, response.text
    token = response.json()["token"]
    seqs = [0] * world

    def report(rank: int, step: int, where: Where | None = None, shares: dict[str, float] | None = None) -> None:
        seqs[rank] += 1
        loss = 1.0 / (1 + step)
        window = MetricWindow("loss", loss, loss, loss, loss, 1, 0, step, step)
        body = Report(
            run_id=f"run-{name}",
            seq=seqs[rank],
            sent_at=time.time(),
            identity=Identity(rank=rank, world_size=world, host=f"node-{rank + 1}", pid=100 + rank),
            progress=Progress(step=step, total_steps=1_000_000),
            metrics=(window,) if rank == 0 else (),
            where=where,
            activity_shares=shares,
        )
        answer = http.post(
            f"/api/v1/namespaces/default/jobs/{name}/reports",
            json=body.to_dict(),
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 200, answer.text

    return report


def _until(client: Client, name: str, state: str, feed: Callable[[int], None]) -> Health:
    """Feed the job (call ``i`` at most every 0.2 s) until its health reads ``state``; that health."""
    calls = itertools.count()

    def fed_and_read() -> Health | None:
        feed(next(calls))
        health = client.job(name, "default").health
        return health if health.state == state else None

    try:
        health: Health = wait_for(fed_and_read, 30, f"{name} to read {state}", every=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its health: {client.job(name, 'default').health}") from None
    return health


def test_a_hung_rank_and_a_straggler_are_typed_on_job_health(quick: str) -> None:
    lock = Where("waiting", 5.0, "threading.Lock.acquire", (Frame("wait_for_lock", "train.py", 31),))
    reduce = Where("communicating", 5.0, "torch.distributed.all_reduce", (Frame("main", "train.py", 9),))
    waits = {"computing": 0.3, "communicating": 0.7}
    lags = {"computing": 0.3, "loading_data": 0.6, "communicating": 0.1}
    with httpx.Client(base_url=quick, timeout=10) as http, Client(quick) as client:
        hung, slow = _ranks(http, "hung", 2), _ranks(http, "slowrank", 3)
        for step in range(1, 21):
            hung(0, step)
            hung(1, step)

        def stand(i: int) -> None:
            hung(1, 20, where=lock)
            hung(0, 20, where=reduce)

        health = _until(client, "hung", "stalled", stand)
        assert health.message.startswith("rank 1 has stood") and "wait_for_lock (train.py:31)" in health.message
        assert health.rank == 1 and health.straggler is None
        place = health.place
        assert isinstance(place, StallPlace)
        assert (place.rank, place.step, place.kind, place.activity) == (1, 20, "hang", "waiting")
        assert place.detail == "threading.Lock.acquire" and place.frames == ("wait_for_lock (train.py:31)",)
        assert place.holding == (1,) and place.waiting == (0,)
        assert place.place in health.message
        job = client.job("hung", "default")
        assert health.message.replace("'", "&#x27;") in job_html(job)  # the notebook says why

        def step_together(i: int) -> None:
            for rank in range(3):
                slow(rank, 10 * (i + 1), shares=lags if rank == 2 else waits)

        health = _until(client, "slowrank", "straggling", step_together)
        straggler = health.straggler
        assert isinstance(straggler, Straggler) and health.place is None
        assert (straggler.rank, straggler.host) == (2, "node-3")
        assert straggler.ratio == pytest.approx(3.0, rel=0.05)
        assert straggler.speedup_without == pytest.approx(3.0, rel=0.05)
        assert straggler.activity_shares["loading_data"] == pytest.approx(0.6, abs=0.01)
        assert straggler.median_activity_shares["communicating"] == pytest.approx(0.7, abs=0.01)
        assert straggler.hint and straggler.hint in health.message
        jobs = client.jobs(namespace="default")
        table = jobs_html(list(jobs))
        assert 'title="rank 2 (host node-3) is 3.0x slower' in table  # the list's tooltip in the notebook


def test_malformed_verdict_fields_are_a_precise_error() -> None:
    with pytest.raises(InvalidResponse, match=r"health.evidence.ratio should be a number"):
        Health.from_dict({"state": "straggling", "evidence": {"metric": "rank_pace", "ratio": "fast"}})
    with pytest.raises(InvalidResponse, match=r"health.evidence.holding should be an array"):
        Health.from_dict({"state": "stalled", "evidence": {"kind": "hang", "holding": 1}})
    plain = Health.from_dict({"state": "not_learning", "evidence": {"metric": "loss", "message": "flat"}})
    assert plain.place is None and plain.straggler is None and plain.rank is None and plain.message == "flat"
