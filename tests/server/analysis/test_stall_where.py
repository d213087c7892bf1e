"""Stall rules by where each rank stands (issue 29 items 2, 4 and 6), with constructed reports.

The tracker is fed as the server feeds it: every report's progress (server arrival time), then its
``where`` and ``activity_shares``; a sweep asks for a verdict every 5 s. Real loops through
``stepwatch run`` are in ``tests/test_where_verdicts.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from stepwatch.server.analysis.cost import Cost
from stepwatch.server.analysis.health import HealthTracker, Verdict
from stepwatch.server.analysis.stall import Reading, duration, place_words, rank_list, straggler_words
from stepwatch.server.ingest.health_monitor import final_judgement
from stepwatch.server.policies import decide, parse_policy
from stepwatch.server.store import Job

INTERVAL = 2.0
SWEEP = 5.0

# where a rank stands, as the report core reads it
HUNG = ("waiting", "threading.Lock.acquire", ["wait_for_lock (hung_rank.py:31)", "main (hung_rank.py:58)"])
ALL_REDUCE = ("communicating", "torch.distributed.all_reduce", ["main (hung_rank.py:49)"])
SAVING = ("checkpointing", "torch.save", ["save (slow_save.py:40)"])
COMPUTING = ("computing", "torch.autograd.backward", ["main (train.py:12)"])
LOADING = ("loading_data", "torch.utils.data.DataLoader.__next__", ["main (loader_deadlock.py:44)"])
EVALUATING = ("evaluating", "", ["evaluate (eval_no_hook.py:20)", "main (eval_no_hook.py:51)"])

Place = tuple[str, str, list[str]]


def simulate(
    step_times: list[float],
    *,
    ranks: int = 1,
    where: Callable[[int, int, float], Place | None] | None = None,
    stand: float | None = None,
    sampling: bool = True,
    until: float | None = None,
    shares: dict[str, float] | None = None,
) -> tuple[Verdict | None, float, float]:
    """Run one job: each rank steps with ``step_times`` (synchronously) from t = 100; ``stand``: the time
    from which every rank's step stands (a hang: the others wait at the same step).
    ``where(rank, step, stood)``: what a rank's report says while its step stands longer than 3x its
    median step time (as the report core sends it). The first ``stalled`` verdict, its time and the
    time the standing began."""
    tracker = HealthTracker()
    ends = np.cumsum(step_times) + 100.0
    median = float(np.median(step_times))
    stand_t = stand if stand is not None else float("inf")
    stop_step = int(np.searchsorted(ends, stand_t))
    end_t = until if until is not None else float(ends[-1])
    t, k, next_sweep = 100.0, 0, 100.0 + SWEEP
    while t < end_t:
        t += INTERVAL
        done = int(np.searchsorted(ends, t))
        if t >= stand_t:
            done = min(done, stop_step)
        last_move = float(ends[done - 1]) if done else 100.0
        stood = t - last_move
        for rank in range(ranks):
            tracker.observe_progress(t, rank, done, len(ends))
            if sampling:
                tracker.observe_shares(rank, shares or {"computing": 0.9, "loading_data": 0.1})
                if where is not None and stood > max(3 * median, 3.0):
                    place = where(rank, done, stood)
                    if place is not None:
                        activity, detail, frames = place
                        tracker.observe_where(t, rank, done, activity, stood, detail, frames)
        k += 1
        while next_sweep <= t:
            verdict = tracker.verdict(next_sweep)
            if verdict.state == "stalled":
                return verdict, next_sweep, stand_t
            next_sweep += SWEEP
        verdict = tracker.verdict(t)
        if verdict.state == "stalled":
            return verdict, t, stand_t
    return None, t, stand_t


def heavy_tailed(n: int, spt: float, seed: int, slow_every: list[int] | None = None) -> list[float]:
    rng = np.random.default_rng(seed)
    times = spt * np.exp(rng.normal(0, 0.3, n) - 0.045)
    slow = rng.random(n) < 0.02
    times[slow] *= 3
    for i in slow_every or ():
        times[i] *= 3
    return [float(x) for x in times]


def test_a_rank_hung_in_its_own_code_is_named_with_its_place_within_45_s() -> None:
    def where(rank: int, step: int, stood: float) -> Place:
        return HUNG if rank == 1 else ALL_REDUCE

    verdict, at, began = simulate([0.5] * 400, ranks=2, where=where, stand=140.0)
    assert verdict is not None
    delay = at - began
    assert 30 <= delay <= 45
    ev = verdict.evidence
    assert ev["rank"] == 1 and ev["holding"] == [1] and ev["waiting"] == [0]
    assert ev["kind"] == "hang" and ev["activity"] == "waiting"
    assert ev["message"].startswith("rank 1 has stood ")
    assert "in wait_for_lock (hung_rank.py:31), waiting (threading.Lock.acquire)" in ev["message"]
    assert "rank 0 waits for it in torch.distributed.all_reduce" in ev["message"]


def test_four_ranks_the_one_in_its_loader_is_named_as_loading_data() -> None:
    def where(rank: int, step: int, stood: float) -> Place:
        return LOADING if rank == 2 else ALL_REDUCE

    verdict, _, _ = simulate([0.2] * 2000, ranks=4, where=where, stand=200.0)
    assert verdict is not None
    ev = verdict.evidence
    assert ev["rank"] == 2 and ev["waiting"] == [0, 1, 3]
    assert "loading data (torch.utils.data.DataLoader.__next__)" in ev["message"]
    assert "ranks 0, 1 and 3 wait for it in torch.distributed.all_reduce" in ev["message"]


def test_a_checkpoint_save_of_29_minutes_is_no_stall_and_one_past_the_cap_is_flagged_with_its_place() -> None:
    steps = [10.0] * 300

    def where(rank: int, step: int, stood: float) -> Place:
        return SAVING

    verdict, _, _ = simulate(steps, where=where, stand=700.0, until=700 + 29 * 60)
    assert verdict is None
    verdict, at, began = simulate(steps, where=where, stand=700.0, until=700 + 40 * 60)
    assert verdict is not None
    assert 30 * 60 <= at - began <= 32 * 60
    assert verdict.evidence["kind"] == "patient"
    assert "saving a checkpoint (torch.save)" in verdict.evidence["message"]
    assert "in save (slow_save.py:40)" in verdict.evidence["message"]


def test_the_allowance_of_a_save_is_four_times_the_longest_one_finished() -> None:
    tracker = HealthTracker()
    t = 0.0
    step = 0
    for _ in range(50):  # 10 s steps
        t += 10
        step += 1
        tracker.observe_progress(t, 0, step)
    tracker.observe_where(t + 30, 0, step, *SAVING[:1], 30.0, SAVING[1], SAVING[2])
    t += 40 * 60  # a save of 40 min (past the 30 min floor: flagged then; it finished all the same)
    step += 1
    tracker.observe_progress(t, 0, step)
    assert tracker.places.longest_patient(0) >= 40 * 60
    for _ in range(10):
        t += 10
        step += 1
        tracker.observe_progress(t, 0, step)
    began = t
    for k in range(1, 200):  # the next save: 2 h 30 min is under 4 x 40 min
        now = began + k * 60
        tracker.observe_progress(now, 0, step)
        tracker.observe_where(now, 0, step, SAVING[0], now - began, SAVING[1], SAVING[2])
        if tracker.verdict(now).state == "stalled":
            break
    assert now - began >= 4 * 40 * 60


@pytest.mark.parametrize("seed", range(6))
def test_heavy_tailed_slow_steps_while_computing_are_no_stall(seed: int) -> None:
    """10 s steps, 2 % of them 3x slower (and three in a row 3x slower): computing, never stalled."""
    steps = heavy_tailed(200, 10.0, seed, slow_every=[20, 80, 150])

    def where(rank: int, step: int, stood: float) -> Place:
        return COMPUTING

    verdict, _, _ = simulate(steps, where=where)
    assert verdict is None


def test_the_same_heavy_tail_without_where_keeps_the_earlier_rules() -> None:
    """A report core that cannot sample (no where, no shares): judged as before, slow steps flagged."""
    flagged = 0
    for seed in range(6):
        steps = heavy_tailed(200, 10.0, seed, slow_every=[20, 80, 150])
        verdict, _, _ = simulate(steps, sampling=False)
        flagged += verdict is not None
        if verdict is not None:
            assert "kind" not in verdict.evidence  # the earlier rule's evidence
    assert flagged >= 1


def test_an_evaluation_without_the_hook_reads_evaluating_not_stalled() -> None:
    def where(rank: int, step: int, stood: float) -> Place:
        return EVALUATING

    verdict, _, _ = simulate([0.5] * 400, where=where, stand=130.0, until=130 + 15 * 60)
    assert verdict is None


def test_a_hang_at_10_s_steps_waits_for_three_times_the_tail_not_the_floor() -> None:
    steps = heavy_tailed(300, 10.0, 3)

    def where(rank: int, step: int, stood: float) -> Place:
        return HUNG

    verdict, at, began = simulate(steps, where=where, stand=100 + sum(steps[:150]) + 0.01)
    assert verdict is not None
    p99 = float(np.quantile(steps[:150], 0.99))
    assert at - began <= max(45.0, 3 * p99)
    assert at - began >= 35.0


def test_the_words() -> None:
    assert rank_list([3]) == "rank 3"
    assert rank_list([2, 0]) == "ranks 0 and 2"
    assert rank_list([0, 1, 2, 3, 4, 5]) == "ranks 0, 1, 2 and 3 more"
    assert duration(45) == "45 s"
    assert duration(200) == "3 min 20 s"
    assert duration(3 * 3600 + 30 * 60) == "3 h 30 min"
    other = Reading(0.0, 1, "other", 5.0, "", ("spin (x.py:3)",))
    assert place_words(other) == "in spin (x.py:3)"
    assert place_words(Reading(0.0, 1, "computing", 5.0)) == "computing"
    slow = {"loading_data": 0.6, "computing": 0.4}
    typical = {"loading_data": 0.1, "computing": 0.9}
    assert straggler_words(slow, typical).startswith("its extra time goes to loading data (60% of its time")
    assert straggler_words(typical, typical) == ""


# ----------------------------------------------------------------------------------------------
# policies act only on what is sure

NOW = 1_000_000.0


def _job(**fields: Any) -> Job:
    base = Job(id=1, namespace="ns", name="j", attempt=1, state="running", created_at=NOW - 7200, updated_at=NOW)
    return replace(base, started_at=NOW - 7200, **fields)


PRICED = Cost(rate_per_hour=10.0, spent=20.0, projected=30.0, wasted=5.0)


@pytest.mark.parametrize(
    ("evidence", "action"),
    [
        ({"metric": "reports", "message": "no report from rank 0 for 2 min"}, "stop"),
        ({"metric": "heartbeats", "message": "rank 2 has sent no heartbeat"}, "stop"),
        ({"metric": "step", "kind": "hang", "activity": "waiting", "message": "rank 1 has stood"}, "stop"),
        ({"metric": "step", "kind": "busy", "activity": "communicating", "message": "in a collective"}, "stop"),
        ({"metric": "step", "kind": "patient", "activity": "checkpointing", "message": "saving"}, "notify"),
        ({"metric": "step", "phase": "eval", "message": "evaluating"}, "notify"),
        ({"metric": "step", "message": "step has not moved from 10 for 34 s"}, "notify"),  # no reading
        ({"metric": "step", "kind": "busy", "message": "the step has stood 3 min"}, "notify"),
    ],
)
def test_a_stop_for_stalled_needs_a_reading_or_reports_that_stopped(evidence: dict[str, Any], action: str) -> None:
    policy = parse_policy({"on": {"stalled": "stop"}})
    (decision,) = decide(policy, _job(health="stalled", health_evidence=evidence), PRICED, 3600.0, NOW)
    assert decision.action == action
    if action == "notify":
        assert "(not stopped: " in decision.reason
        assert decision.commands == ()


def test_an_ended_jobs_health_is_a_final_judgement_in_words() -> None:
    job = _job(state="finished", step=2000)
    early = Verdict("healthy", 5.0, {"message": "loss is finite; too few windows yet to judge learning"})
    final = final_judgement(early, job, "loss")
    assert final.evidence["message"].startswith("finished at step 2,000, healthy to its end: loss stayed finite")
    assert "too few windows" not in final.evidence["message"]
    assert final.evidence["final"] is True
    assert final_judgement(final, job, "loss") == final  # judged once
    stalled = Verdict("stalled", 5.0, {"message": "rank 1 has stood 3 min in f (a.py:1)"})
    words = final_judgement(stalled, replace(job, state="failed"), "loss").evidence["message"]
    assert words == "failed at step 2,000, stalled at its end: rank 1 has stood 3 min in f (a.py:1)"


def test_what_a_rank_does_after_a_save_within_the_same_stand_is_counted_from_the_saves_end() -> None:
    """slow_save.py's shape: a step, a 40 s save, then the next step's sleep of half a second: the last
    reading says ``waiting`` (time.sleep), and the whole stand is no hang of 40 s."""
    tracker = HealthTracker()
    t, step = 0.0, 0
    for _ in range(20):
        t += 0.5
        step += 1
        tracker.observe_progress(t, 0, step)
        tracker.observe_shares(0, {"computing": 1.0})
    began = t
    for k in range(1, 41):  # 40 s in torch.save
        tracker.observe_progress(began + k, 0, step)
        tracker.observe_where(began + k, 0, step, SAVING[0], float(k), SAVING[1], SAVING[2])
    now = began + 41
    tracker.observe_progress(now, 0, step)
    tracker.observe_where(now, 0, step, "waiting", 41.0, "time.sleep", ["main (slow_save.py:59)"])
    assert tracker.verdict(now).state != "stalled"
    for k in range(1, 41):  # it stays there, its reports arriving
        tracker.observe_progress(now + k, 0, step)
        tracker.observe_where(now + k, 0, step, "waiting", 41.0 + k, "time.sleep", ["main (slow_save.py:59)"])
        if k == 30:  # 30 s after the save: within the 35 s floor
            assert tracker.verdict(now + k).state != "stalled"
    hung = tracker.verdict(now + 40)  # still there 40 s after the save: hung
    assert hung.state == "stalled" and "in main (slow_save.py:59), waiting (time.sleep)" in hung.evidence["message"]
