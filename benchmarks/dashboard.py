"""The web dashboard's speed in a real browser (Debian's headless Chromium through Playwright), against a
real server (uvicorn on 127.0.0.1, in this process) on a fresh SQLite file::

    .venv/bin/python benchmarks/dashboard.py                 # 10,000 jobs, 5 x 100,000 points
    .venv/bin/python benchmarks/dashboard.py --quick         # 2,000 jobs, 5 x 20,000 points (a smoke run)

What is timed (each the median of ``--repeat`` fresh page loads; times are read from the page's own
clock, ``performance.now()``, from the start of the navigation or of the action):

1. first render of the job list: until the first rows are on screen (the page reads a first page of
   100 jobs, then the whole list);
2. the whole list usable: until all jobs are in the page (sort and filter over all of them);
3. scroll to the middle of the list, filter by text, sort by the loss column (sorted in the page);
4. the side panel of a job with 5 metrics of 100,000 windows each (downsampled by the server to
   1,000 points a chart): until its 5 charts are drawn, the first time (plotly.js loaded then) and again;
5. a reported point in the open chart: from the report's POST to the new point in the chart;
6. the size of the dashboard's own JavaScript and CSS (plotly.js comes from the plotly package).

The database is built beside the server with ``SQLiteStore.register`` and ``ingest_reports`` for the
jobs, and the long series written directly into the points table, then rolled up as ingest would
(``SQLiteStore.rebuild_rollups``).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

WEB = Path(__file__).resolve().parent.parent / "src" / "stepwatch" / "server" / "web"
METRICS = ("loss", "eval_loss", "learning_rate", "grad_norm", "train_samples_per_second")


def chromium() -> str:
    for candidate in (os.environ.get("STEPWATCH_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("benchmarks/dashboard.py needs Chromium: apt-get install -y chromium")


def build(db: Path, jobs: int, points: int) -> dict[str, Any]:
    from stepwatch.protocol import Identity, MetricWindow, Progress, Report
    from stepwatch.server.store import PendingReport, SQLiteStore

    t0 = time.perf_counter()
    store = SQLiteStore(db)
    now = time.time()
    registered = [
        store.register(f"team-{i % 7}", f"job-{i:05d}", token_hash="-", now=now - 7200, total_steps=100_000,
                       gpus=float(i % 8 + 1), gpu_hour_cost=2.5)
        for i in range(jobs - 1)  # and the long job below: `jobs` in all
    ]  # fmt: skip
    batch = []
    for i, job in enumerate(registered):
        loss = 0.1 + 2.0 / (1 + i % 97)
        window = MetricWindow("loss", loss, loss, loss, loss, 1, 0, 100 + i, 100 + i)
        report = Report(
            run_id="r", seq=1, sent_at=now - 30, identity=Identity(rank=0, world_size=1, host="h", pid=1),
            progress=Progress(step=100 + i, total_steps=100_000), metrics=(window,), state="running",
        )  # fmt: skip
        batch.append(PendingReport(job, report, now - 30, None))
    for start in range(0, len(batch), 1000):
        store.ingest_reports(batch[start : start + 1000])
    long = store.register("bench", "long", token_hash="-", now=now - 86400, total_steps=points * 10)
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO points (job_id, metric, step, t, last, min, max, mean, count, nonfinite) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _series(long.id, points, now - 86400),
        )
    folded = store.rebuild_rollups(long.id)
    store.close()
    return {"build_s": time.perf_counter() - t0, "folded": folded}


def _series(job_id: int, n: int, t0: float) -> Iterator[tuple[Any, ...]]:
    for metric_index, metric in enumerate(METRICS):
        for k in range(n):
            v = 0.2 + 2.0 * math.exp(-k / (n / 5)) + 0.05 * math.sin(k / 7) + metric_index
            last: float | str = v
            nonfinite = 0
            if metric == "loss" and k % (n // 3) == n // 6:
                last, nonfinite = "NaN", 1
            yield (job_id, metric, (k + 1) * 10, t0 + k * 0.5, last, v - 0.01, v + 0.01, v, 10, nonfinite)


WAIT = """async ([condition, timeout]) => {
  const test = new Function(condition);
  const start = performance.now();
  while (!test()) {
    if (performance.now() - start > timeout) throw new Error("timed out: " + condition);
    await new Promise((r) => requestAnimationFrame(r));
  }
  return performance.now();
}"""


def until(page: Any, condition: str, timeout_ms: float = 60_000) -> float:
    """The page's clock (ms since its navigation started) when ``condition`` first holds (checked every frame)."""
    value: float = page.evaluate(WAIT, [condition, timeout_ms])
    return value


def action(page: Any, code: str, condition: str) -> float:
    """Milliseconds from running ``code`` in the page to ``condition`` holding."""
    start: float = page.evaluate(f"() => {{ const t = performance.now(); {code}; return t; }}")
    return until(page, condition) - start


def measure(url: str, jobs: int, repeat: int) -> dict[str, list[float]]:
    import httpx
    from playwright.sync_api import sync_playwright

    out: dict[str, list[float]] = {
        k: [] for k in ("first", "full", "scroll", "filter", "sort", "panel_cold", "panel_first", "panel_warm", "live")
    }
    all_jobs = f"{jobs:,} of {jobs:,} jobs"
    charts_drawn = (
        "const d = [...document.querySelectorAll('#panel .chart')]; "
        f"return d.length === {len(METRICS)} && d.every((c) => c.querySelector('.main-svg') && c.data);"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        for _ in range(repeat):
            context = browser.new_context(viewport={"width": 1500, "height": 950})
            page = context.new_page()
            page.goto(url + "/", wait_until="commit")
            out["first"].append(until(page, "return document.querySelector('a.job-link') !== null;"))
            out["full"].append(
                until(
                    page, f"return document.querySelector('[data-testid=count]').textContent.startsWith('{all_jobs}');"
                )
            )
            out["scroll"].append(action(page, "document.querySelector('.table-wrap').scrollTop = 20000 * 40",
                                        f"return [...document.querySelectorAll('tr[data-index]')].some((r) "
                                        f"=> Number(r.dataset.index) > {min(jobs // 2, 19000)});"))  # fmt: skip
            out["filter"].append(action(
                page,
                "const i = document.querySelector('#f-text'); i.value = 'job-0099'; "
                "i.dispatchEvent(new Event('input'))",
                "return document.querySelector('[data-testid=count]').textContent.startsWith('10 of');",
            ))  # fmt: skip
            page.evaluate(
                "() => { const i = document.querySelector('#f-text'); i.value = ''; "
                "i.dispatchEvent(new Event('input')); }"
            )
            until(page, f"return document.querySelector('[data-testid=count]').textContent.startsWith('{all_jobs}');")
            sorted_by_loss = (
                "return document.querySelector('th.c-loss').getAttribute('aria-sort') === 'ascending' "
                "&& document.querySelector('tr[data-index=\"0\"]');"
            )
            out["sort"].append(action(page, "document.querySelector('th.c-loss button').click()", sorted_by_loss))
            out["panel_cold"].append(action(page, "location.hash = '#/?job=bench%2Flong'", charts_drawn))
            page.evaluate("() => { location.hash = '#/'; }")
            until(page, "return document.querySelector('#panel').hidden;")
            context.close()
            # the usual case: the page settled (plotly.js loaded in idle time) before a job is clicked
            context = browser.new_context(viewport={"width": 1500, "height": 950})
            page = context.new_page()
            page.goto(url + "/", wait_until="commit")
            until(
                page,
                f"return window.Plotly && "
                f"document.querySelector('[data-testid=count]').textContent.startsWith('{all_jobs}');",
            )
            out["panel_first"].append(action(page, "location.hash = '#/?job=bench%2Flong'", charts_drawn))
            page.evaluate("() => { location.hash = '#/'; }")
            until(page, "return document.querySelector('#panel').hidden;")
            out["panel_warm"].append(action(page, "location.hash = '#/?job=bench%2Flong'", charts_drawn))
            context.close()
        # a point reported while its chart is open
        with httpx.Client(base_url=url) as http:
            token = http.post("/api/v1/namespaces/bench/jobs", json={"name": "live", "total_steps": 10_000}).json()[
                "token"
            ]
            context = browser.new_context(viewport={"width": 1500, "height": 950})
            page = context.new_page()
            page.goto(url + "/#/?job=bench%2Flive")
            until(page, "return document.querySelector('#live').textContent.includes('live');")
            for seq in range(1, 8):
                body = {
                    "run_id": "live", "seq": seq, "sent_at": time.time(),
                    "identity": {"rank": 0, "world_size": 1, "host": "h", "pid": 1},
                    "progress": {"step": seq * 10, "total_steps": 10_000},
                    "metrics": [{"name": "loss", "last": 1 / seq, "min": 1 / seq, "max": 1 / seq, "mean": 1 / seq,
                                 "count": 1, "nonfinite": 0, "first_step": seq * 10, "last_step": seq * 10}],
                    "state": "running",
                }  # fmt: skip
                if seq == 1:
                    http.post(
                        "/api/v1/namespaces/bench/jobs/live/reports",
                        json=body,
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    until(page, "const d = document.querySelector(\".chart[data-metric='loss']\"); return d && d.data;")
                    continue
                t0 = time.perf_counter()
                response = http.post(
                    "/api/v1/namespaces/bench/jobs/live/reports",
                    json=body,
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert response.status_code == 200, response.text
                until(
                    page,
                    f"const d = document.querySelector(\".chart[data-metric='loss']\"); "
                    f"return d.data.some((t) => t.y.length === {seq});",
                )
                out["live"].append(1000 * (time.perf_counter() - t0))
            context.close()
        browser.close()
    return out


def own_bytes() -> int:
    return sum(f.stat().st_size for f in WEB.rglob("*") if f.is_file() and f.suffix in (".js", ".css", ".html"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--points", type=int, default=100_000, help="windows per metric of the long job (5 metrics)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 20,000 points, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.points, args.repeat = 2000, 20_000, 1
    with tempfile.TemporaryDirectory(prefix="stepwatch-dashboard-") as tmp:
        db = Path(tmp) / "bench.db"
        built = build(db, args.jobs, args.points)
        print(
            f"database: {args.jobs:,} jobs, one with {len(METRICS)} x {args.points:,} windows, built in "
            f"{built['build_s']:.1f} s"
        )
        from stepwatch.testing.server import LocalServer

        with LocalServer(db, log_level="error", force_exit=True) as serving:
            out = measure(serving.url, args.jobs, args.repeat)
    med = {k: statistics.median(v) for k, v in out.items() if v}
    size = own_bytes()
    charts = f"side panel, 5 charts over {args.points:,}-point histories"
    rows = [
        (f"first render of the list, {args.jobs:,} jobs", "< 1500 ms", med["first"], med["first"] < 1500),
        (f"whole list in the page (sort/filter over all), {args.jobs:,} jobs", "", med["full"], None),
        ("scroll to the middle of the list", "", med["scroll"], None),
        ("filter by text", "", med["filter"], None),
        ("sort by loss (in the page)", "", med["sort"], None),
        (f"{charts}, at once (plotly.js still loading)", "", med["panel_cold"], None),
        (f"{charts}, first (page settled)", "< 1000 ms", med["panel_first"], med["panel_first"] < 1000),
        (f"{charts}, again", "< 1000 ms", med["panel_warm"], med["panel_warm"] < 1000),
        ("reported point visible in the open chart (median of 6)", "< 1000 ms", med["live"], med["live"] < 1000),
    ]  # fmt: skip
    print(f"\n{'what':<82} {'target':>10} {'measured':>10}  verdict")
    for what, target, value, ok in rows:
        verdict = "" if ok is None else ("met" if ok else "MISSED")
        print(f"{what:<82} {target:>10} {value:>7.0f} ms  {verdict}")
    size_verdict = "met" if size < 200 * 1024 else "MISSED"
    print(f"{'our own JS, CSS and HTML':<82} {'< 200 KB':>10} {size / 1024:>7.1f} KB  {size_verdict}")
    print(f"\nmedian of {args.repeat} page loads; each figure from the page's own clock (performance.now()); "
          f"raw: { {k: [round(x) for x in v] for k, v in out.items()} }")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
