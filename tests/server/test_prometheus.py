"""``GET /metrics``: what Grafana and Alertmanager read, parsed back with prometheus_client's own parser."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


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
    job = (("job_name", "train"), ("namespace", "nlp"))
    assert samples["stepwatch_job_progress_ratio", job] == 0.5
    assert samples["stepwatch_job_step", job] == 500 and samples["stepwatch_job_total_steps", job] == 1000
    assert samples["stepwatch_job_last_report_age_seconds", job] == 0.0
    assert samples["stepwatch_job_cost_rate_usd_per_hour", job] == 32.0
    assert samples["stepwatch_job_cost_spent_usd", job] == 32.0  # an hour since the first report
    assert ("stepwatch_job_eta_seconds", job) not in samples  # two reports: no ETA yet, and none made up
    assert samples["stepwatch_job_metric_last", (*job[:1], ("metric", "loss"), job[1])] == 0.25
    assert math.isnan(samples["stepwatch_job_metric_last", (*job[:1], ("metric", "acc"), job[1])])
    health = api.job("train", namespace="nlp")["health"]["state"]
    assert samples["stepwatch_job_health", (("health", health), *job)] == 1.0
    assert sum(v for (name, labels), v in samples.items() if name == "stepwatch_job_health" and job[0] in labels) == 1
    # an ended job leaves the per-job series; it still counts in its namespace
    assert not any(key[0].startswith("stepwatch_job_") and ("job_name", "done") in key[1] for key in samples)
    assert samples["stepwatch_jobs", (("namespace", "nlp"), ("state", "finished"))] == 1
    assert samples["stepwatch_jobs", (("namespace", "nlp"), ("state", "running"))] == 1
    assert samples["stepwatch_namespace_cost_rate_usd_per_hour", (("namespace", "nlp"),)] == 32.0
    assert samples["stepwatch_reports_total", (("kind", "reports"),)] == 3


def test_an_empty_server_scrapes_cleanly(api: Any) -> None:
    samples = scrape(api)
    assert samples["stepwatch_reports_total", (("kind", "reports"),)] == 0
    assert not any(name.startswith("stepwatch_job_") for name, _ in samples)
