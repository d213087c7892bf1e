"""Verdict history: every verdict a job had is kept with its span and what it cost, after the job
recovers and after it ends; the fleet's wasted cost never shrinks when jobs end. Real stores
(SQLite and PostgreSQL), the real app in process, the server's clock moved by the test."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from stepwatch.client import Job
from stepwatch.protocol import Report
from stepwatch.server.analysis.cost import wasted_seconds
from stepwatch.server.store import Store, health_history
from stepwatch.server.store.health_history import MAX_SPANS, next_history
from stepwatch.server.views.figures import cost_of
from stepwatch.server.views.serialisers import health_history_view

MakeReport = Callable[..., dict[str, Any]]
pytestmark = pytest.mark.both_stores

RATE = 2 * 3.0  # 2 GPUs at 3 USD an hour


def _hang(api: Any, make_report: MakeReport, name: str, token: str, seq: int, step: int, seconds: int) -> int:
    """Reports every 2 s for ``seconds`` with the step standing (a hung loop whose reporter still runs)."""
    for _ in range(seconds // 2):
        api.clock.advance(2)
        seq += 1
        api.report_ok(name, token, make_report(seq, step, total_steps=100_000))
    return seq


def _train(
    api: Any, make_report: MakeReport, name: str, token: str, seq: int, step: int, reports: int
) -> tuple[int, int]:
    """Reports every 2 s, 8 steps each, with a falling loss."""
    for _ in range(reports):
        api.clock.advance(2)
        seq += 1
        step += 8
        api.report_ok(name, token, make_report(seq, step, {"loss": 5.0 / (1 + step / 500)}, total_steps=100_000))
    return seq, step


def test_a_stall_that_recovers_keeps_its_span_and_its_cost(api: Any, make_report: MakeReport) -> None:
    token = api.register("hung", gpus=2, gpu_hour_cost=3.0)
    seq, step = _train(api, make_report, "hung", token, 0, 0, 30)
    stood_from = api.clock.now
    seq = _hang(api, make_report, "hung", token, seq, step, 60)
    assert api.job("hung")["health"]["state"] == "stalled"
    seq, step = _train(api, make_report, "hung", token, seq, step, 10)
    view = api.job("hung")
    assert view["health"]["state"] == "healthy" and view["health"]["evidence"]["recovered_from"] == "stalled"
    spans = view["health_history"]
    assert [s["state"] for s in spans] == ["healthy", "stalled", "healthy"]
    stalled = spans[1]
    # the stall stood from the last step change to the report that moved it again
    assert stalled["since"] == pytest.approx(stood_from, abs=2.1) and stalled["to"] is not None
    assert stalled["seconds"] == pytest.approx(62, abs=2.1) and stalled["rank"] == 0
    assert stalled["wasted"] > 0 and stalled["wasted"] == pytest.approx(stalled["seconds"] / 3600 * RATE)
    assert view["cost"]["wasted"] == pytest.approx(stalled["wasted"])  # recovered: the waste stays
    # the SDK reads the same spans (``from``/``to`` are ``start``/``end``)
    sdk = Job(view).health_history
    assert sdk is not None and [s.state for s in sdk] == ["healthy", "stalled", "healthy"]
    assert (sdk[1].start, sdk[1].end, sdk[1].since) == (stalled["from"], stalled["to"], stalled["since"])
    assert (sdk[1].seconds, sdk[1].wasted, sdk[1].rank) == (stalled["seconds"], stalled["wasted"], 0)
    assert sdk[1].message == stalled["message"] and "step" in sdk[1].message
    html = Job(view)._repr_html_()  # a notebook shows the spans too, the standing one "still"
    assert "health history" in html and html.count("<li>") == 3 and "wasted" in html and html.endswith("</div>")
    assert html.count("(still)") == 1

    # ended: the history and the waste stay as they were
    api.clock.advance(2)
    api.report_ok("hung", token, make_report(seq + 1, step + 8, {"loss": 1.0}, total_steps=100_000, state="finished"))
    ended = api.job("hung")
    assert ended["state"] == "finished" and [s["state"] for s in ended["health_history"]][:3] == [
        "healthy",
        "stalled",
        "healthy",
    ]
    assert ended["cost"]["wasted"] == pytest.approx(stalled["wasted"])


def test_a_job_that_ends_hung_ends_stalled_and_the_fleet_waste_does_not_shrink(
    api: Any, make_report: MakeReport
) -> None:
    token = api.register("hung", gpus=2, gpu_hour_cost=3.0)
    seq, step = _train(api, make_report, "hung", token, 0, 0, 30)
    seq = _hang(api, make_report, "hung", token, seq, step, 90)
    before = api.client.get("/api/v1/costs").json()["total"]["wasted"]
    assert before > 0
    # the runner kills the hung process: its last report, the step still standing
    api.clock.advance(2)
    api.report_ok("hung", token, make_report(seq + 1, step, total_steps=100_000, state="failed", reason="killed"))
    view = api.job("hung")
    assert view["state"] == "failed" and view["health"]["state"] == "stalled"  # not "recovered" by its end
    assert [e["data"]["health"] for e in api.events("hung") if e["kind"] == "health"] == ["stalled"]
    api.clock.advance(3600)  # long after: the waste stops at the end and stays
    after = api.client.get("/api/v1/costs").json()["total"]["wasted"]
    assert after >= before and after == pytest.approx(view["cost"]["wasted"])


def test_history_spans_and_waste_in_the_store(store: Store) -> None:
    job = store.register("ns", "a", token_hash="h", now=0.0, gpus=2.0, gpu_hour_cost=3.0)
    job = store.set_state(job, "running", 0.0)
    store.set_health(job.id, "healthy", 10.0, {"message": "fine"}, 10.0)
    store.set_health(job.id, "stalled", 50.0, {"message": "hung", "rank": 3}, 80.0)
    store.set_health(job.id, "healthy", 200.0, {"message": "moves"}, 200.0)
    store.set_health(job.id, "healthy", 200.0, {"message": "still"}, 250.0)  # same state: no span, new words
    store.set_health(job.id, "not_learning", 300.0, {"message": "flat"}, 400.0)
    job = store.set_state(store.job_by_id(job.id) or job, "stopped", 500.0, "plateau")
    spans = job.health_history
    assert [(s["state"], s["from"], s["since"], s["to"]) for s in spans] == [
        ("healthy", 10.0, 10.0, 80.0),
        ("stalled", 80.0, 50.0, 200.0),
        ("healthy", 200.0, 200.0, 400.0),
        ("not_learning", 400.0, 300.0, None),
    ]
    assert spans[1]["rank"] == 3 and spans[1]["message"] == "hung" and spans[2]["message"] == "still"
    # wasted: from each bad verdict's start (the analysis's since) to its end, or the job's end
    cost = cost_of(job, 10_000.0, None)
    assert cost.wasted == pytest.approx(((200 - 50) + (500 - 300)) / 3600 * RATE)
    view = health_history_view(job, 10_000.0)
    # the timeline adds up to the job's age (issue 30, views/figures.py): each span runs from where the
    # analysis says it began to where the next began, the first from the job's start, the last to its end
    assert [round(s["seconds"]) for s in view] == [50, 150, 100, 200]
    assert sum(s["seconds"] for s in view) == pytest.approx(500.0)
    assert view[3]["wasted"] == pytest.approx(200 / 3600 * RATE) and view[0]["wasted"] == 0.0
    reopened = store.job_by_id(job.id)
    assert reopened is not None and reopened.health_history == spans


def test_a_job_recorded_before_the_history_starts_it_from_its_stored_health() -> None:
    # a job of an older schema: stalled since 50, no spans yet; it recovers at 120
    spans = next_history([], ("stalled", 50.0, {"message": "hung"}), ("healthy", 120.0, {}), 120.0)
    assert [(s["state"], s["from"], s["to"]) for s in spans] == [("stalled", 50.0, 120.0), ("healthy", 120.0, None)]
    assert next_history(spans, ("healthy", 120.0, {}), ("healthy", 130.0, {}), 130.0) is spans


def test_the_open_span_takes_the_words_of_the_evidence_as_it_is_rewritten() -> None:
    """The evidence of a verdict that holds is rewritten (how long the rank has stood, where: issue 29);
    the open span says what the verdict now says, with its rank, and a closed span keeps its words."""
    stalled = ("stalled", 50.0, {"message": "rank 1 has stood 40 s in wait_for_lock (train.py:31)", "rank": 1})
    spans = next_history([], ("healthy", 0.0, {"message": "fine"}), stalled, 80.0)
    later = ("stalled", 50.0, {"message": "rank 1 has stood 3 min in wait_for_lock (train.py:31)", "rank": 1})
    reworded = next_history(spans, stalled, later, 230.0)
    assert reworded is not spans and reworded[-1]["message"].startswith("rank 1 has stood 3 min")
    assert [(s["state"], s["from"], s["to"], s.get("rank")) for s in reworded] == [
        ("healthy", 0.0, 80.0, None),
        ("stalled", 80.0, None, 1),
    ]
    assert spans[-1]["message"].startswith("rank 1 has stood 40 s")  # the list it was given is not changed
    assert next_history(reworded, later, later, 240.0) is reworded  # the same words: nothing to write
    nameless = next_history(reworded, later, ("stalled", 50.0, {"message": "no reports for 3 min"}), 250.0)
    assert "rank" not in nameless[-1] and nameless[-1]["message"] == "no reports for 3 min"
    recovered = next_history(nameless, ("stalled", 50.0, {}), ("healthy", 260.0, {"message": "moves"}), 260.0)
    assert recovered[1]["message"] == "no reports for 3 min" and recovered[1]["to"] == 260.0


def test_overlapping_bad_verdicts_count_once_and_the_history_is_bounded() -> None:
    assert wasted_seconds([(0.0, 100.0), (50.0, 150.0), (300.0, None)], 10.0, 400.0) == pytest.approx(240.0)
    spans: list[dict[str, Any]] = []
    old = ("unknown", None, {})
    for i in range(2 * MAX_SPANS):
        new = ("stalled" if i % 2 else "healthy", float(i), {})
        spans = next_history(spans, (old[0], old[1], {}), new, float(i))
        old = new
    assert len(spans) == MAX_SPANS and all(s["state"] == "stalled" for s in spans[:-1])


def _span_rows(store: Store, job_id: int) -> list[tuple[int, dict[str, Any]]]:
    """The job's rows of ``health_spans`` as stored: (seq, span), in order."""
    rows = store._read(store._sql("SELECT seq, span FROM health_spans WHERE job_id = ? ORDER BY seq"), (job_id,))  # type: ignore[attr-defined]
    return [(int(seq), json.loads(span)) for seq, span in rows]


def test_spans_are_rows_of_their_own_written_by_a_change_of_health_not_by_reports(
    store: Store, make_report: MakeReport
) -> None:
    """Schema 12 (store/health_history.py): the spans left the job's row, which a report rewrites (SQLite stores
    a row whole, so a long history was paid for at every report); a report writes none of them, a change of
    health its spans that changed."""
    job = store.set_state(store.register("ns", "rows", token_hash="h", now=0.0), "running", 0.0)
    store.set_health(job.id, "healthy", 10.0, {"message": "fine"}, 10.0)
    store.set_health(job.id, "stalled", 50.0, {"message": "rank 2 has stood 40 s", "rank": 2}, 80.0)
    before = _span_rows(store, job.id)
    assert [(seq, s["state"], s["to"]) for seq, s in before] == [(0, "healthy", 80.0), (1, "stalled", None)]
    for seq in range(1, 6):  # reports, metrics and all: the spans' rows are as they were
        job = store.ingest_report(job, Report.from_dict(make_report(seq, 8 * seq, {"loss": 1.0})), 80.0 + seq).job
    assert _span_rows(store, job.id) == before and job.health_history == [s for _, s in before]
    store.set_health(job.id, "stalled", 50.0, {"message": "rank 2 has stood 3 min", "rank": 2}, 200.0)
    assert _span_rows(store, job.id)[1][1]["message"] == "rank 2 has stood 3 min"  # the open span's new words
    assert _span_rows(store, job.id)[0] == before[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_spans_read_back_are_the_spans_written_after_every_change_past_the_cap_too(
    store: Store, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Random changes of health and of words, the cap lowered to 6 spans so that spans are dropped (their rows
    deleted, the others keeping theirs: gaps in ``seq``): after each change the job as read from the database
    (not from a cache) holds what ``next_history`` says, and so do its rows, in order."""
    monkeypatch.setattr(health_history, "MAX_SPANS", 6)
    rng = random.Random(seed)
    job = store.set_state(store.register("ns", f"cap-{seed}", token_hash="h", now=0.0), "running", 0.0)
    expected: list[dict[str, Any]] = []
    old: tuple[str, float | None, dict[str, Any]] = ("unknown", None, {})
    for i in range(60):
        t = 10.0 * (i + 1)
        state = rng.choice(["healthy", "stalled", "straggling", "not_learning", "unknown"])
        evidence: dict[str, Any] = {"message": f"words {rng.randrange(3)}"}
        if rng.random() < 0.5:
            evidence["rank"] = rng.randrange(4)
        new = (state, t - rng.choice([0.0, 5.0]), evidence)
        expected = health_history.next_history(expected, old, new, t)
        written = store.set_health(job.id, new[0], new[1], new[2], t)
        old = new
        read = store.job("ns", f"cap-{seed}", attempt=1)  # the row and its spans as the database holds them
        assert read is not None and read.health_history == expected == written.health_history, i
        assert [span for _, span in _span_rows(store, job.id)] == expected, i
    assert len(expected) == 6 and max(seq for seq, _ in _span_rows(store, job.id)) > 6  # rows were dropped
