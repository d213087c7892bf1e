"""The SDK against a real server fed by real reporters: reads, typed models, commands, policies, costs, wait,
and the parity of the blocking and the async client."""

from __future__ import annotations

import asyncio
import inspect
import math
import time

import pytest
from swtest import start_job, step_until, wait_for

import stepwatch
from stepwatch import client as sdk
from stepwatch.client import (
    AsyncClient,
    Client,
    CommandSent,
    Conflict,
    Forbidden,
    History,
    Job,
    JobList,
    NotFound,
    Policy,
    WaitTimeout,
)


def _train(server: str, ns: str, name: str = "train", steps: int = 20, **fields: object) -> stepwatch.Run:
    run = start_job(server, ns, name, total_steps=100, total_epochs=2, gpus=2, gpu_hour_cost=3.0, **fields)
    for step in range(1, steps + 1):
        run.step(loss=1.0 / step, eval_acc=step / 100)
        time.sleep(0.005)
    step_until(server, ns, name, steps)
    return run


def test_public_surface_is_sorted_and_complete() -> None:
    assert sdk.__all__ == sorted(sdk.__all__, key=lambda n: (not n.isupper(), n))
    exported = {n for n, v in vars(sdk).items() if not n.startswith("_") and not inspect.ismodule(v)}
    assert set(sdk.__all__) == exported


def test_both_clients_have_the_same_methods_and_signatures() -> None:
    """One implementation: every public method of Client exists on AsyncClient with the same parameters."""
    public = [n for n, v in vars(Client).items() if not n.startswith("_") and callable(v)]
    assert {"jobs", "job", "history", "events", "watch", "wait", "stop", "checkpoint", "set_policy", "costs"} <= set(
        public
    )
    for name in public:
        if name == "close":
            continue
        sync, aio = getattr(Client, name), getattr(AsyncClient, name)
        assert inspect.signature(sync).parameters.keys() == inspect.signature(aio).parameters.keys(), name
        assert sync.__doc__, name
    assert inspect.iscoroutinefunction(AsyncClient.jobs)


def test_jobs_and_job_are_typed(server: str, ns: str, client: Client) -> None:
    run = _train(server, ns, params={"lr": 0.001})
    client.register("queued", ns, total_steps=10)

    jobs = client.jobs(ns, sort="name")
    assert isinstance(jobs, JobList) and jobs.total == 2
    assert [j.name for j in jobs] == ["queued", "train"]
    job = client.job("train", ns)
    assert isinstance(job, Job)
    assert (job.namespace, job.name, job.state, job.attempt, job.key) == (ns, "train", "running", 1, f"{ns}/train")
    assert job.progress.step == 20 and job.progress.total_steps == 100
    assert job.progress.percent == pytest.approx(20.0)
    assert job.metrics["loss"] == pytest.approx(1 / 20) and job.loss == pytest.approx(1 / 20)
    assert job.health.state in ("healthy", "unknown")
    assert job.resources.gpus == 2.0 and job.cost.rate_per_hour == pytest.approx(6.0)
    assert job.cost.spent is not None and job.cost.spent >= 0
    assert job.params == {"lr": 0.001}
    assert job.metric_names is not None and set(job.metric_names) == {"loss", "eval_acc"}
    assert job.pending_commands == [] and job.ranks is not None and job.ranks[0].rank == 0
    assert job.policy is not None and job.policy.effective is not None
    assert not job.ended

    # Kubeflow's trainerStatus shape: from the server for one job, built alike for a job of a list
    ts = job.trainer_status
    assert ts.progress_percentage == 20
    assert dict(ts.metrics)["current_step"] == "20"
    assert ts.last_updated_time and ts.last_updated_time.endswith("Z")
    wire = ts.to_dict()
    assert set(wire) == {"progressPercentage", "metrics", "lastUpdatedTime"} | (
        {"estimatedRemainingSeconds"} if ts.estimated_remaining_seconds is not None else set()
    )
    listed = next(j for j in client.jobs(ns) if j.name == "train")
    assert listed.trainer_status.progress_percentage == 20
    assert dict(listed.trainer_status.metrics)["loss"] == dict(ts.metrics)["loss"]

    # filters go to the server
    assert [j.name for j in client.jobs(ns, state="pending")] == ["queued"]
    assert [j.name for j in client.jobs(ns, state=["pending", "running"], sort="-name")] == ["train", "queued"]
    assert client.jobs(ns, health="diverging") == []
    assert client.jobs(ns, text="que")[0].name == "queued"
    run.finish()


def test_a_nan_loss_is_a_float_and_a_diverging_filter_finds_it(server: str, ns: str, client: Client) -> None:
    run = start_job(server, ns, "boom")
    for _ in range(5):
        run.step(loss=float("nan"))
    step_until(server, ns, "boom", 5)
    job = client.job("boom", ns)
    assert math.isnan(job.metrics["loss"]) and math.isnan(job.loss or 0.0)
    assert job.trainer_status.to_dict()["metrics"][1] == {"name": "loss", "value": "NaN"}
    run.finish("failed", "loss is NaN")
    done = client.wait("boom", ns, timeout=10)
    assert done.state == "failed" and done.ended and done.reason == "loss is NaN"


def test_history_rows_and_dataframe(server: str, ns: str, client: Client) -> None:
    run = _train(server, ns, "hist", steps=30)
    history = client.history("hist", ns, metrics=["loss"], max_points=10)
    assert isinstance(history, History) and list(history) == ["loss"]
    series = history["loss"]
    assert 2 <= len(series) <= 10 and series.steps[-1] == 30
    assert series.last == pytest.approx(1 / 30)
    rows = history.rows()
    assert rows[0].metric == "loss" and rows[-1].step == 30
    full = client.history("hist", ns)
    assert set(full) == {"loss", "eval_acc"}
    wide = full.wide()
    assert wide[-1]["step"] == 30 and set(wide[-1]) == {"step", "loss", "eval_acc"}
    pd = pytest.importorskip("pandas")
    frame = full.to_pandas()
    assert isinstance(frame, pd.DataFrame) and set(frame["metric"]) == {"loss", "eval_acc"}
    assert full.to_pandas(wide=True).loc[30, "eval_acc"] == pytest.approx(0.3)
    assert client.jobs(ns).to_pandas().loc[0, "name"] == "hist"
    run.finish()


def test_stop_checkpoints_first_and_reaches_the_reporter(server: str, ns: str, client: Client) -> None:
    run = _train(server, ns, "stopme", steps=3)
    sent = client.stop("stopme", ns, reason="plateau")
    assert isinstance(sent, CommandSent)
    assert [c.kind for c in sent.commands] == ["checkpoint", "stop"] and sent.reason == "plateau"

    def obeyed() -> bool:
        run.step(loss=1.0)
        return run.should_stop and run.should_checkpoint

    wait_for(obeyed)
    assert run.command_reason == "plateau"
    events = client.events("stopme", ns, limit=100)
    commands = [e for e in events if e.kind == "command"]
    assert [e.data.get("kind") for e in commands] == ["checkpoint", "stop"]
    run.finish("stopped", "asked to stop")
    assert client.wait("stopme", ns, until="stopped", timeout=10).state == "stopped"
    with pytest.raises(Conflict, match="already stopped"):
        client.stop("stopme", ns)
    with pytest.raises(Conflict):
        client.checkpoint("stopme", ns)


def test_checkpoint_and_stop_without_checkpoint(server: str, ns: str, client: Client) -> None:
    # its first report goes at once, the next one at finish(): no report acknowledges the commands meanwhile
    # (with a report every 0.05 s they were at times acknowledged, and no longer pending, before the read)
    run = start_job(server, ns, "ck", interval=3600)
    run.step(loss=1.0)
    wait_for(lambda: client.job("ck", ns).state == "running")
    assert [c.kind for c in client.checkpoint("ck", ns, reason="nightly").commands] == ["checkpoint"]
    assert [c.kind for c in client.stop("ck", ns, checkpoint=False).commands] == ["stop"]
    pending = client.pending_commands("ck", ns)
    assert [c.kind for c in pending] == ["checkpoint", "stop"]
    run.finish()


def test_policies_for_a_job_and_a_namespace(server: str, ns: str, client: Client) -> None:
    run = _train(server, ns, "pol", steps=2)
    view = client.set_policy("pol", namespace=ns, on={"not_learning": "checkpoint_stop"}, budget=250.0)
    assert view.own.on == {"not_learning": "checkpoint_stop"} and view.own.budget == 250.0
    assert client.policy("pol", ns).effective.on["not_learning"] == "checkpoint_stop"
    space = client.set_policy(namespace=ns, policy=Policy(on={"diverging": "stop"}, dry_run=True))
    assert space.own.on == {"diverging": "stop"} and space.own.dry_run is True
    assert client.namespace_policy(ns).effective.on["diverging"] == "stop"
    merged = client.policy("pol", ns)
    assert merged.effective.on == {"not_learning": "checkpoint_stop", "diverging": "stop"}
    assert merged.set_by == {"not_learning": "job", "diverging": "namespace"}
    # a later set merges into what stands (the budget set first stays), a replace only when asked
    later = client.set_policy("pol", namespace=ns, on={"diverging": "notify"})
    assert later.own.on == {"not_learning": "checkpoint_stop", "diverging": "notify"} and later.own.budget == 250.0
    replaced = client.set_policy("pol", namespace=ns, on={"stalled": "notify"}, replace=True)
    assert replaced.own.on == {"stalled": "notify"} and replaced.own.budget is None
    assert client.set_policy(namespace=ns).own.on == {}  # cleared
    run.finish()


def test_costs(server: str, ns: str, client: Client) -> None:
    run = _train(server, ns, "money", steps=2)
    costs = client.costs(ns)
    assert costs.currency == "USD" and set(costs.namespaces) == {ns}
    assert costs.total.jobs == 1 and costs.total.gpus_in_use == 2.0
    assert costs.total.rate_per_hour == pytest.approx(6.0)
    run.finish()


def test_wait_for_a_condition_and_time_out(server: str, ns: str, client: Client) -> None:
    run = _train(server, ns, "w", steps=2)

    def far_enough(job: Job) -> bool:
        return (job.progress.step or 0) >= 10

    with pytest.raises(WaitTimeout, match=r"waited within 0.3 s|waited within 0\.3 s") as caught:
        client.wait("w", ns, until=far_enough, timeout=0.3)
    assert caught.value.job is not None and caught.value.job.progress.step == 2

    def train_on() -> None:
        for _ in range(10):
            run.step(loss=0.1)
            time.sleep(0.02)

    import threading

    threading.Timer(0.2, train_on).start()
    job = client.wait("w", ns, until=far_enough, timeout=10)
    assert job.progress.step is not None and job.progress.step >= 10
    run.finish()


def test_errors_are_clear(server: str, ns: str, client: Client) -> None:
    with pytest.raises(NotFound, match=f"job {ns}/ghost not found"):
        client.job("ghost", ns)
    with pytest.raises(NotFound):
        client.stop("ghost", ns)
    run = _train(server, ns, "mine", steps=1)
    with pytest.raises(Forbidden, match="this token cannot write"):
        client.set_state("mine", "finished", "not-the-token", ns)
    run.finish()


def test_the_async_client(server: str, ns: str) -> None:
    run = _train(server, ns, "aio", steps=5)

    async def main() -> tuple[list[str], Job, str, Job]:
        async with AsyncClient(server, namespace=ns) as aio:
            names = [j.name for j in await aio.jobs(ns)]
            job = await aio.job("aio")
            history = await aio.history("aio", metrics="loss")
            sent = await aio.stop("aio", reason="async")
            first = None
            async for update in aio.watch("aio", timeout=10):
                if isinstance(update, (sdk.EventUpdate, sdk.JobUpdate)):
                    first = update
                    break
            assert first is not None
            loop = asyncio.get_running_loop()
            loop.call_later(0.1, run.finish, "stopped", "async")
            done = await aio.wait("aio", timeout=10)
            return names, job, f"{len(history['loss'])} {sent.commands[-1].kind}", done

    names, job, said, done = asyncio.run(main())
    assert names == ["aio"] and job.progress.step == 5 and said.endswith("stop")
    assert done.state == "stopped"


def test_html_escapes_what_jobs_say(server: str, ns: str, client: Client) -> None:
    run = start_job(server, ns, "xss")
    run.step(**{"<script>alert(1)</script>": 1.0, "loss": 0.5})
    step_until(server, ns, "xss", 1)
    run.finish("failed", '<img src=x onerror="alert(2)">')
    client.wait("xss", ns, timeout=10)
    job = client.job("xss", ns)
    html = job._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in html and "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in html
    assert "progress" not in html or "width:" in html  # a bar
    table = client.jobs(ns)._repr_html_()
    assert f"{ns}/xss" in table and "<script>" not in table
    assert JobList([])._repr_html_() == "<p>no jobs</p>"
