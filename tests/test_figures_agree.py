"""Every reader shows the same figures for the same job at the same moment (issue 30 item 2).

One real server on loopback (uvicorn, a real SQLite file) whose clock the test holds still, three jobs fed
real native reports over HTTP — one training (a live rate), one hung (stalled: no live rate, money wasted),
one that ended short of its total (no rate, no hourly cost) — then read, without the clock moving, through the
API's list (both forms), the job view, ``stepwatch jobs``, ``stepwatch describe``, ``stepwatch watch`` (one
frame), ``stepwatch top``'s rows, the SDK and Prometheus' ``/metrics``: the same percent, step, rate (or
none), cost and waste everywhere, and the health history's spans adding up to the job's elapsed time with
the cost block's waste their sum.
"""

from __future__ import annotations

import io
import itertools
import math
import re
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

import httpx

from stepwatch.cli import main
from stepwatch.cli._top_view import COLUMNS, job_cells
from stepwatch.cli.describe import describe
from stepwatch.cli.watch import bar_line, progress_line
from stepwatch.client import Client
from stepwatch.protocol import Identity, MetricWindow, Progress, Report
from stepwatch.server import ServerSettings, create_app
from stepwatch.testing import FakeClock
from stepwatch.testing.server import ServerThread

NS = "agree"
TOTAL = 10_000
RATE = 2 * 3.0  # 2 GPUs at 3 USD an hour


class _Feeder:
    """Native reports of one job, every 2 s of the server's clock, as the report core sends them."""

    def __init__(self, http: httpx.Client, url: str, clock: FakeClock, name: str) -> None:
        self.http, self.url, self.clock, self.name = http, url, clock, name
        answer = http.post(
            f"{url}/api/v1/namespaces/{NS}/jobs", json={"name": name, "gpus": 2, "gpu_hour_cost": 3.0}, timeout=10
        )
        assert answer.status_code == 201, answer.text
        self.token = answer.json()["token"]
        self.seq = 0
        self.step = 0

    def report(self, step: int, loss: float | None = None, state: str = "running") -> None:
        self.clock.advance(2)
        self.seq += 1
        self.step = step
        metrics = ()
        if loss is not None:
            values = [loss * 1.2, loss, loss * 0.8]  # a window of three batches: its mean is not its last
            metrics = (MetricWindow("loss", values[-1], min(values), max(values), sum(values) / 3, 3, 0, step, step),)
        report = Report(
            run_id="run-1",
            seq=self.seq,
            sent_at=self.clock.now,
            identity=Identity(rank=0, world_size=1, host="node-1", pid=4242),
            progress=Progress(step=step, total_steps=TOTAL),
            metrics=metrics,
            state=state,  # type: ignore[arg-type]
        )
        answer = self.http.post(
            f"{self.url}/api/v1/namespaces/{NS}/jobs/{self.name}/reports",
            json=report.to_dict(),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, FakeClock]]:
    """The server and its clock, with ``runs`` training, ``hangs`` stalled and ``short`` ended at 9.96 %."""
    clock = FakeClock()
    app = create_app(ServerSettings(db=str(tmp_path_factory.mktemp("agree") / "sw.db")), clock=clock)
    with ServerThread(app, log_level="critical") as served, httpx.Client() as http:  # keep-alive, as the sender
        runs, hangs, short = (_Feeder(http, served.url, clock, name) for name in ("runs", "hangs", "short"))
        for i in range(1, 21):  # 20 reports each, 6 s apart (three jobs, 2 s each), 8 steps a report
            for feeder in (runs, hangs, short):
                feeder.report(i * 8, 5.0 / (1 + i / 10))
        for _ in range(15):  # hangs stands for 90 s (its reporter still runs); the others go on
            runs.report(runs.step + 8, 5.0 / (1 + runs.step / 80))
            hangs.report(hangs.step)
            short.report(short.step + 16, 1.0)
        short.report(996, 0.9, state="finished")  # a script that stopped early: 9.96 % of its total
        yield served.url, clock


def _views(url: str) -> dict[str, dict[str, Any]]:
    return {name: httpx.get(f"{url}/api/v1/namespaces/{NS}/jobs/{name}", timeout=10).json() for name in NAMES}


NAMES = ("runs", "hangs", "short")


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _shown_percent(view: dict[str, Any]) -> str:
    percent = view["progress"]["percent"]
    text = f"{percent:.1f}"
    assert float(text) == percent, "the server sends the shown value: one decimal"
    return text


def test_the_server_sends_the_shown_figures(board: tuple[str, FakeClock]) -> None:
    url, _ = board
    views = _views(url)
    runs, hangs, short = (views[n] for n in NAMES)
    # one decimal rounded down, 100 only when done
    assert short["state"] == "finished" and short["progress"]["percent"] == 9.9  # 9.96 -> 9.9, not 10.0
    assert hangs["health"]["state"] == "stalled" and runs["health"]["state"] == "healthy"
    # no live rate for a job that stands or has ended; a live one for the job that trains
    assert hangs["progress"]["steps_per_second"] is None and hangs["progress"]["samples_per_second"] is None
    assert short["progress"]["steps_per_second"] is None
    assert runs["progress"]["steps_per_second"] == pytest.approx(8 / 6, rel=0.2)  # 8 steps a report, 6 s apart
    # an ended job costs nothing an hour now; what it spent stays
    assert short["cost"]["rate_per_hour"] is None and short["cost"]["spent"] > 0
    assert hangs["cost"]["rate_per_hour"] == RATE
    # the LOSS the lists show: the mean of the latest window, beside the last batch
    assert runs["metric_means"]["loss"] == pytest.approx(runs["metrics"]["loss"] / 0.8)
    for view in views.values():  # health spans: no overlap, no gap, adding up to the job's elapsed time
        spans = view["health_history"]
        assert spans, view["name"]
        assert all(a["end"] == b["start"] for a, b in itertools.pairwise(spans))
        assert sum(s["seconds"] for s in spans) == pytest.approx(view["times"]["elapsed_seconds"], abs=1e-6)
        assert spans[0]["start"] == view["times"]["started"]
        wasted = sum(s["wasted"] for s in spans)
        assert wasted == pytest.approx(view["cost"]["wasted"], abs=1e-9)
    assert hangs["cost"]["wasted"] > 0 and [s["state"] for s in hangs["health_history"]][-1] == "stalled"


def test_every_reader_shows_the_same_figures(  # noqa: PLR0915 - one moment, every reader, in one place
    board: tuple[str, FakeClock], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = board  # the clock stands still: every read below is of the same moment
    views = _views(url)
    # the API's list, both forms
    listed = {
        v["name"]: v for v in httpx.get(f"{url}/api/v1/jobs", params={"namespace": NS}, timeout=10).json()["items"]
    }
    columns = httpx.get(f"{url}/api/v1/jobs", params={"namespace": NS, "form": "columns"}, timeout=10).json()["columns"]
    by_column = {name: i for i, name in enumerate(columns["name"])}
    # stepwatch jobs (wide: its STEPS/S too), at a width that shows every column
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["jobs", "--server", url, "-n", NS, "-o", "wide"]) == 0
    table = capsys.readouterr().out.splitlines()
    header = table[0]
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
    rows = {}
    for line in table[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
        rows[cells[0]] = dict(zip(names, cells))
    with Client(url) as client:
        sdk = {name: client.job(name, NS) for name in NAMES}
        top = {job.name: dict(zip(COLUMNS, (text for text, _ in job_cells(job, 200)))) for job in client.jobs(NS)}
    metrics = httpx.get(f"{url}/metrics", timeout=10).text

    for name in NAMES:
        view = views[name]
        shown = _shown_percent(view)
        step = f"{view['progress']['step']}/{view['progress']['total_steps']}"
        rate = view["progress"]["steps_per_second"]
        cost = view["cost"]
        # the list and its column form carry the view's figures
        item = listed[name]
        i = by_column[name]
        for field, sub in (("progress", "percent"), ("progress", "step"), ("progress", "steps_per_second")):
            assert item[field][sub] == view[field][sub] == columns[f"{field}.{sub}"][i], (name, sub)
        for sub in ("spent", "wasted", "rate_per_hour"):
            assert item["cost"][sub] == pytest.approx(cost[sub]) if cost[sub] is not None else item["cost"][sub] is None
        # stepwatch jobs
        row = rows[name]
        assert row["PROGRESS%"] in (f"{shown}%", f"ended at {shown}%"), row
        assert row["STEP"] == step and row["COST"] == f"${_money(cost['spent'])}"
        assert row["STEPS/S"] == ("—" if rate is None else f"{rate:.2f}" if rate < 10 else f"{rate:.1f}")
        # stepwatch describe
        out = io.StringIO()
        describe(view, [], out)
        text = out.getvalue()
        assert re.search(rf"Progress: +(ended at )?{re.escape(shown)}%\n", text), text
        assert f"Step:       {step}\n" in text
        assert f"Spent:     ${_money(cost['spent'])}" in text and f"Wasted:    ${_money(cost['wasted'])}" in text
        if rate is None:
            assert re.search(r"Steps/s: +— \((stalled since [^)]+|ended)\)", text), text
            assert "/h" not in text or cost["rate_per_hour"] is not None
        # stepwatch watch, one frame (piped line and the terminal bar's fields)
        line = progress_line(view)
        assert f" {shown}%" in line and f"step {step} " in line
        said = "— steps/s (" if rate is None else f"{rate:.2f} steps/s" if rate < 10 else f"{rate:.1f} steps/s"
        assert said in line, line
        _, _, after = bar_line(view, None, 200)
        assert f"{shown}%" in after and f"step {step}" in after
        # stepwatch top's row
        cells = top[name]
        assert cells["PROGRESS"].endswith(f"{shown:>5}%") and cells["STEP"] == step
        assert cells["SPENT"] == _money(cost["spent"])
        assert cells["$/H"] == (
            "—" if view["state"] in ("finished", "failed", "stopped") else _money(cost["rate_per_hour"])
        )
        # the SDK
        job = sdk[name]
        assert job.percent == view["progress"]["percent"] and job.progress.step == view["progress"]["step"]
        assert job.progress.steps_per_second == rate and job.cost.wasted == cost["wasted"]
        assert job.cost.spent == cost["spent"] and job.cost.rate_per_hour == cost["rate_per_hour"]
        spans = job.health_history or []
        assert [s.covers for s in spans] == [(s["start"], s["end"]) for s in view["health_history"]]
        assert sum(b - a for a, b in (s.covers or (0.0, 0.0) for s in spans)) == pytest.approx(
            view["times"]["elapsed_seconds"]
        )
        # Prometheus, for the jobs it lists (the live ones)
        if view["state"] == "running":
            ratio = _sample(metrics, "stepwatch_job_progress_ratio", name)
            assert ratio == pytest.approx(view["progress"]["percent"] / 100)
            assert _sample(metrics, "stepwatch_job_cost_spent_usd", name) == pytest.approx(cost["spent"])


def test_prometheus_has_no_rate_for_a_stalled_job(board: tuple[str, FakeClock]) -> None:
    url, _ = board
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert _sample(metrics, "stepwatch_job_steps_per_second", "hangs") is None  # views.figures' rate, as everywhere
    assert _sample(metrics, "stepwatch_job_steps_per_second", "runs") == pytest.approx(
        _views(url)["runs"]["progress"]["steps_per_second"]
    )


def _sample(text: str, metric: str, job: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(metric + "{") and f'job_name="{job}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_shown_percent_rule() -> None:
    from stepwatch.server.views.figures import shown_percent

    assert [shown_percent(v) for v in (9.96, 99.99, 100.0, 29.999999999999996, 0.04, -3.0)] == [
        9.9,
        99.9,
        99.9,  # not done: 100 only when finished
        30.0,
        0.0,
        0.0,
    ]
    assert shown_percent(100.0, ended=True) == 100.0 and shown_percent(99.96, ended=True) == 99.9
    assert not math.isnan(shown_percent(math.nan))
