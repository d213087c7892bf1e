"""Stragglers (issue 29 item 3): a rank persistently 1.5x slower than the median rank for 5 minutes is
named with its host, how much slower, where its extra time goes and what the job would gain without it;
no policy stops a job for it. Constructed reports, fed as the server feeds them."""

from __future__ import annotations

from dataclasses import replace

from stepwatch.server.analysis.cost import Cost
from stepwatch.server.analysis.health import HealthTracker
from stepwatch.server.policies import decide, parse_policy
from stepwatch.server.store import Job

FAST = {"computing": 0.4, "communicating": 0.6}
SLOW = {"computing": 0.7, "loading_data": 0.25, "communicating": 0.05}


def _sync_job(minutes: float, slow_from: float = 0.0) -> tuple[HealthTracker, list[str]]:
    """4 ranks in synchronous data parallelism, 1 step/s (every rank at the same step), 10,000 steps
    planned; from ``slow_from`` seconds on rank 3 is busy 0.95 of its time and the others wait for it."""
    tracker = HealthTracker()
    states = []
    t = 0.0
    while t < minutes * 60:
        t += 2.0
        step = int(t)
        for rank in range(4):
            tracker.observe_progress(t, rank, step, 10_000)
            shares = SLOW if rank == 3 and t >= slow_from else FAST
            tracker.observe_shares(rank, shares, host=f"gpu-node-{rank}")
        states.append(tracker.verdict(t).state)
    return tracker, states


def test_a_rank_the_others_wait_for_is_named_after_five_minutes_with_its_host_and_the_elastic_hint() -> None:
    tracker, states = _sync_job(8, slow_from=60)
    assert "straggling" not in states[: (60 + 290) // 2]  # not before 5 minutes of it
    verdict = tracker.verdict(8 * 60)
    assert verdict.state == "straggling"
    ev = verdict.evidence
    assert ev["rank"] == 3 and ev["host"] == "gpu-node-3"
    assert 2.0 <= ev["ratio"] <= 2.6  # busy 0.95 against 0.4
    message = ev["message"]
    assert message.startswith("rank 3 (host gpu-node-3) is 2.")
    assert "slower than the median rank, for " in message
    assert "its extra time goes to computing" in message or "its extra time goes to loading data" in message
    assert "without rank 3 the job would run 2." in message and "x faster, ETA " in message
    assert ev["speedup_without"] > 2.0 and ev["hint"] in message


def test_ranks_that_wait_alike_are_no_stragglers() -> None:
    _, states = _sync_job(10, slow_from=10**9)
    assert "straggling" not in states


def test_a_straggler_never_stops_a_job() -> None:
    tracker, _ = _sync_job(8, slow_from=60)
    verdict = tracker.verdict(8 * 60)
    base = Job(id=1, namespace="ns", name="j", attempt=1, state="running", created_at=0.0, updated_at=480.0)
    job = replace(base, started_at=0.0, health=verdict.state, health_evidence=verdict.evidence)
    policy = parse_policy({"on": {"stalled": "stop", "not_learning": "stop", "diverging": "stop"}})
    assert decide(policy, job, Cost(10.0, 1.0, 2.0, 0.0), 3600.0, 480.0) == []
