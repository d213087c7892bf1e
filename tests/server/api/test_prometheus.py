"""``GET /metrics``: what Grafana and Alertmanager read, parsed back with prometheus_client's own parser."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stepwatch.testing import wait_for


def scrape(api: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = api.client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_live_jobs_and_namespace_totals(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    token = api.register("train", namespace="nlp", total_steps=1000, gpus=8, gpu_hour_cost=4.0)
    api.clock.advance(10)
    api.report_ok("train", token, make_report(1, 250, {"loss": 0.5, "acc": math.nan}), namespace="nlp")
    api.clock.advance(3600)
    api.report_ok("train", token, make_report(2, 500, {"loss": 0.25}), namespace="nlp")
    done = api.register("done", namespace="nlp")
    api.report_ok("done", done, make_report(1, 5, {"loss": 1.0}, state="finished"), namespace="nlp")
    samples = scrape(api)
    job = (("job_name", "train"), ("job_namespace", "nlp"))
    assert samples["stepwatch_job_progress_ratio", job] == 0.5
    assert samples["stepwatch_job_step", job] == 500 and samples["stepwatch_job_total_steps", job] == 1000
    assert samples["stepwatch_job_last_report_age_seconds", job] == 0.0
    assert samples["stepwatch_job_cost_rate_usd_per_hour", job] == 32.0
    assert samples["stepwatch_job_cost_spent_usd", job] == 32.0  # an hour since the first report
    assert ("stepwatch_job_eta_seconds", job) not in samples  # two reports: no ETA yet, and none made up
    assert samples["stepwatch_job_metric_last", (*job, ("metric", "loss"))] == 0.25
    assert math.isnan(samples["stepwatch_job_metric_last", (*job, ("metric", "acc"))])
    health = api.job("train", namespace="nlp")["health"]["state"]
    assert samples["stepwatch_job_health", (("health", health), *job)] == 1.0
    assert sum(v for (name, labels), v in samples.items() if name == "stepwatch_job_health" and job[0] in labels) == 1
    # an ended job leaves the per-job series; it still counts in its namespace
    assert not any(key[0].startswith("stepwatch_job_") and ("job_name", "done") in key[1] for key in samples)
    assert samples["stepwatch_jobs", (("job_namespace", "nlp"), ("state", "finished"))] == 1
    assert samples["stepwatch_jobs", (("job_namespace", "nlp"), ("state", "running"))] == 1
    assert samples["stepwatch_namespace_cost_rate_usd_per_hour", (("job_namespace", "nlp"),)] == 32.0
    assert samples["stepwatch_reports_total", (("kind", "reports"),)] == 3


def test_an_empty_server_scrapes_cleanly(api: Any) -> None:
    samples = scrape(api)
    assert samples["stepwatch_reports_total", (("kind", "reports"),)] == 0
    assert not any(name.startswith("stepwatch_job_") for name, _ in samples)


def test_group_commits_counters(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    """The writer's transactions and the reports they held (one each here: every report is awaited before the
    next is sent), and the batches that waited, by why; a status posted to the Kubeflow endpoint is not a
    native report and goes its own way."""
    before = scrape(api)
    assert before["stepwatch_ingest_batches_total", ()] == 0
    assert before["stepwatch_ingest_batched_reports_total", ()] == 0
    token = api.register("train", total_steps=100)
    for n in range(1, 5):
        api.report_ok("train", token, make_report(n, n * 10, {"loss": 1.0 / n}))
    samples = scrape(api)
    assert samples["stepwatch_ingest_batches_total", ()] == 4
    assert samples["stepwatch_ingest_batched_reports_total", ()] == 4
    assert samples["stepwatch_reports_total", (("kind", "reports"),)] == 4
    waited = {labels: v for (name, labels), v in samples.items() if name == "stepwatch_ingest_batches_waited_total"}
    assert set(waited) == {(("why", "linger"),), (("why", "fill"),)}
    writer = api.client.app.state.services.writer
    assert waited[(("why", "linger"),)] == writer.lingered and waited[(("why", "fill"),)] == writer.fills == 0


# ------------------------------------------------------------------------- a real Prometheus


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape_config(tmp_path: Path, target: str) -> Path:
    """One scrape job; the target carries a ``namespace`` label as Kubernetes service discovery's usual
    relabelling (``__meta_kubernetes_namespace`` -> ``namespace``) gives it."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n  - job_name: stepwatch\n"
        f"    static_configs: [{{targets: ['{target}'], labels: {{namespace: stepwatch-system}}}}]\n"
    )
    return config


@pytest.mark.slow
def test_a_real_prometheus_finds_the_job_by_job_name(tmp_path: Path) -> None:
    """A real Prometheus scrapes a real stepwatch server fed by a real reporter; PromQL by ``job_name`` and
    ``job_namespace`` finds the job, and Prometheus' own ``job`` (the scrape job) and the ``namespace`` target
    label that Kubernetes service discovery adds (here from the scrape config, as its relabelling does: the
    namespace of the stepwatch pod) sit beside them untouched — no ``exported_*``. Skipped without
    ``prometheus`` (``apt-get install prometheus``)."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        pytest.skip("prometheus and promtool are not installed")
    import httpx

    import stepwatch
    from stepwatch.client import Client
    from stepwatch.server import ServerSettings, create_app
    from stepwatch.testing.server import ServerThread

    with ServerThread(create_app(ServerSettings(db=str(tmp_path / "sw.db"))), log_level="critical") as httpd:
        with Client(httpd.url) as client:
            _, token = client.register("prom-a", "vision", total_steps=100)
        run = stepwatch.init(job="prom-a", namespace="vision", url=httpd.url, token=token, interval=0.1)
        run.step(40, loss=0.5)
        with Client(httpd.url) as client:  # the report has landed
            wait_for(lambda: client.job("prom-a", "vision").progress.step == 40, 30, "the report to land")
        text = httpx.get(httpd.url + "/metrics", timeout=10).text
        checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert 'job_name="prom-a"' in text and 'job="prom-a"' not in text and 'job_namespace="vision"' in text
        assert ',namespace="' not in text and '{namespace="' not in text, "ours is job_namespace, never namespace"
        assert checked.returncode == 0, checked.stdout + checked.stderr

        port = _free_port()
        target = httpd.url.removeprefix("http://")
        config = _scrape_config(tmp_path, target)
        process = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            query = 'stepwatch_job_progress_ratio{job_name="prom-a", job_namespace="vision"}'
            deadline = time.monotonic() + 90
            result: list[dict[str, Any]] = []
            while not result and time.monotonic() < deadline and process.poll() is None:
                time.sleep(0.5)
                try:
                    answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": query}, timeout=5)
                    result = answer.json()["data"]["result"]
                except (httpx.TransportError, ValueError, KeyError):
                    continue
            assert result, f"Prometheus found no series for {query}"
            (series,) = result
            assert series["metric"]["job"] == "stepwatch"  # Prometheus' own label, its scrape job
            assert series["metric"]["job_name"] == "prom-a" and "exported_job" not in series["metric"]
            labels = series["metric"]  # the target label stands as in a cluster, ours beside it
            assert (labels["namespace"], labels["job_namespace"], "exported_namespace" in labels) == (
                "stepwatch-system",
                "vision",
                False,
            )
            assert float(series["value"][1]) == 0.4
        finally:
            process.terminate()
            process.wait(30)
            run.finish()


def test_a_stalled_jobs_rank_and_place_are_series(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    """Issue 29 item 6: where a verdict stands reaches Prometheus too. Two ranks train at 1 s a step, then
    rank 1 stands in its own ``wait_for_lock`` while rank 0 waits for it in all_reduce (their report cores'
    stack readings, as sent): the job is stalled, and the scrape names rank 1 and what it is doing."""
    token = api.register("ddp", namespace="nlp", total_steps=1000)
    seqs = {0: 0, 1: 0}

    def send(rank: int, step: int, where: dict[str, Any] | None = None) -> None:
        seqs[rank] += 1
        body = make_report(seqs[rank], step, {"loss": 1.0} if rank == 0 else None, rank=rank, world_size=2)
        body["sent_at"] = api.clock()
        body["activity_shares"] = {"computing": 0.9, "communicating": 0.1}
        if where is not None:
            body["where"] = where
        api.report_ok("ddp", token, body, namespace="nlp")

    for step in range(1, 41):
        api.clock.advance(1.0)
        send(0, step)
        send(1, step)
    held = {
        "activity": "waiting",
        "detail": "held.acquire",
        "frames": [{"function": "wait_for_lock", "file": "train.py", "line": 31}],
    }
    waits = {"activity": "communicating", "detail": "torch.distributed.all_reduce"}
    for stood in range(2, 92, 2):
        api.clock.advance(2.0)
        send(1, 40, {**held, "stood_seconds": float(stood)})
        send(0, 40, {**waits, "stood_seconds": float(stood)})
    health = api.job("ddp", namespace="nlp")["health"]
    assert health["state"] == "stalled", health
    assert health["evidence"]["rank"] == 1 and "wait_for_lock (train.py:31)" in health["evidence"]["message"]
    samples = scrape(api)
    key = (
        "stepwatch_job_stalled_rank_seconds",
        (("activity", "waiting"), ("job_name", "ddp"), ("job_namespace", "nlp"), ("rank", "1")),
    )
    assert key in samples and 35.0 <= samples[key] <= 95.0, [k for k in samples if "rank" in k[0]]
    assert not any(name == "stepwatch_job_straggler_ratio" for name, _ in samples)
