"""The recipes against a real server, driven by real reporters."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from swtest import start_job, step_until, wait_for

from stepwatch.client import Client, Job, recipes
from stepwatch.client.recipes import finishing_within, notify_if_late, stop_when, threshold


def test_threshold() -> None:
    job = Job({"namespace": "n", "name": "a", "state": "running", "metrics": {"loss": 3.0, "acc": "NaN"}})
    assert threshold("loss", above=2.5)(job) and not threshold("loss", below=2.5)(job)
    assert threshold("acc", below=0.1)(job) and not threshold("acc", below=0.1, nonfinite=False)(job)
    assert not threshold("missing", above=0)(job)
    assert threshold("loss", above=2.5).__name__ == "loss > 2.5 or NaN/Inf"


def test_stop_when_a_metric_crosses_a_line(server: str, ns: str, client: Client) -> None:
    run = start_job(server, ns, "blowup", total_steps=1000)
    result: list[object] = []
    watcher = threading.Thread(
        target=lambda: result.append(stop_when(client, "blowup", threshold("loss", above=2.0), ns, timeout=20)),
        daemon=True,
    )
    watcher.start()
    step = 0

    def train() -> bool:  # the loss climbs until the command arrives
        nonlocal step
        step += 1
        run.step(loss=0.5 * 1.2**step)
        time.sleep(0.02)
        return run.should_stop

    wait_for(train, timeout=20)
    watcher.join(10)
    sent = result[0]
    assert sent is not None and [c.kind for c in sent.commands] == ["checkpoint", "stop"]  # type: ignore[attr-defined]
    assert run.should_checkpoint and "loss > 2" in (run.command_reason or "")
    stopped_at = client.job("blowup", ns).progress.step or 0
    assert stopped_at <= 12  # 0.5 * 1.2**8 > 2: it stopped a few reports after the line, not at the end
    run.finish("stopped", run.command_reason or "")


def test_stop_when_returns_none_for_a_job_that_ends_first(server: str, ns: str, client: Client) -> None:
    run = start_job(server, ns, "fine")
    run.step(loss=0.1)
    threading.Timer(0.3, run.finish).start()
    assert stop_when(client, "fine", threshold("loss", above=5.0), ns, timeout=20) is None


def test_notify_if_late(server: str, ns: str, client: Client) -> None:
    run = start_job(server, ns, "slow", total_steps=200_000)
    calls: list[tuple[Job, float]] = []
    # the review in an hour; at ~20 steps/s the job needs ~2.8 hours: even a young, noisy rate (the first
    # seconds' few reports) stays far beyond the deadline, so it is said once (it was said twice when an
    # early estimate of the 80 minutes it needed before dipped under the hour)
    deadline = time.time() + 3600

    def train() -> None:
        for _ in range(40):
            run.step(loss=1.0)
            time.sleep(0.05)
        run.finish()

    threading.Thread(target=train, daemon=True).start()
    said = notify_if_late(client, "slow", deadline, lambda job, when: calls.append((job, when)), ns, timeout=30)
    assert said == 1 and len(calls) == 1
    job, when = calls[0]
    assert when > deadline and job.name == "slow"


def test_finishing_within_and_the_gpus_they_free(server: str, ns: str, client: Client) -> None:
    soon = start_job(server, ns, "almost", total_steps=60, gpus=8)
    for _ in range(50):  # 10 steps left at ~50 steps/s
        soon.step(loss=1.0)
        time.sleep(0.01)
    step_until(server, ns, "almost", 50)
    with Client(server) as c:
        wait_for(lambda: c.job("almost", ns).eta.remaining_seconds is not None)
        _, token = c.register("later", ns, gpus=4)
        c.register("idle", ns, gpus=2)  # pending: it frees nothing
    # "later" reports as Kubeflow's upstream clients do: a day to go
    status = {
        "trainerStatus": {
            "progressPercentage": 3,
            "estimatedRemainingSeconds": 86_400,
            "metrics": [],
            "lastUpdatedTime": "2026-01-01T00:00:00Z",  # required, as upstream's CRD has it
        }
    }
    answer = httpx.post(
        f"{server}/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/later/status",
        json=status,
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200, answer.text
    assert client.job("later", ns).state == "running"
    freeing = finishing_within(client, minutes=30, namespace=ns)
    assert [f.job.name for f in freeing] == ["almost"]
    assert freeing.gpus == 8 and freeing[0].finishes_at >= time.time() - 1
    assert [f.job.name for f in finishing_within(client, minutes=2 * 24 * 60, namespace=ns)] == ["almost", "later"]
    assert finishing_within(client, minutes=2 * 24 * 60, namespace=ns).gpus == 12
    soon.finish()


def test_notify_if_late_is_not_said_again_after_a_view_with_no_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    """Views in a row, read as the watch gives them (a scripted sequence, no server: the server withholds the
    ETA while it is unsure, e.g. a stalled moment, and the default suite saw a 2.8-hour job said late twice
    under load). Late, no ETA, late: said once; back in time, then late again: said a second time."""
    deadline = time.time() + 3600

    def view(finish: float | None) -> Job:
        eta = {} if finish is None else {"finish_time": finish}
        return Job({"namespace": "n", "name": "slow", "state": "running", "eta": eta})

    finishes = [deadline + 7200, None, deadline + 7000, None, deadline - 60, deadline + 600]
    monkeypatch.setattr(recipes, "_job_views", lambda *args: iter([view(f) for f in finishes]))
    calls: list[float] = []
    said = notify_if_late(Client("http://127.0.0.1:9"), "slow", deadline, lambda job, when: calls.append(when))
    assert said == 2 and calls == [deadline + 7200, deadline + 600]
