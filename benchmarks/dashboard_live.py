"""The job list read live, counted for a base revision and for the working tree in the same run: six jobs
report to a real server (one hangs, one is stopped at 68.4 %) while headless Chromium at 1440 and 800 px reads
the list every 300 ms for 12 s (``tests/e2e/test_live_list.py``'s reading), and counts bars drawn more than 3
points away from the percentage beside them, reorders while nobody sorts, and cut cells or chips::

    .venv/bin/python benchmarks/dashboard_live.py --base 30b50a2          # the list before issue 30
    .venv/bin/python benchmarks/dashboard_live.py --base 30b50a2 --demo   # the same, on `stepwatch demo`

The base revision's dashboard files are served in place of the working tree's by Playwright's request routing
(as ``benchmarks/dashboard_layout.py`` does); each reading gets a fresh server and fresh jobs. About a minute.
With ``--demo`` the jobs are ``stepwatch demo``'s four real training runs (one demo per revision, both widths
read in turn; about 2 minutes).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dashboard_layout import base_files  # noqa: E402
from test_layout import CLIPPED_CELLS  # noqa: E402
from test_live_list import (  # noqa: E402
    READ,
    READ_EVERY_MS,
    READ_FOR_MS,
    WIDEST_CHIPS,
    Feed,
    mismatched_bars,
    read_live,
    reorders,
)

from conftest import Fleet, Server, chromium_path  # noqa: E402


def serve_files(page: Any, files: dict[str, bytes]) -> None:
    """Serve ``files`` (a revision's dashboard) to ``page`` in place of the server's own."""
    import mimetypes

    def serve(route: Any) -> None:
        path = route.request.url.split("/ui/", 1)[1].split("?")[0]
        if path not in files:
            route.continue_()
            return
        kind = mimetypes.guess_type(path)[0] or "application/octet-stream"
        route.fulfill(status=200, body=files[path], headers={"content-type": kind})

    page.route("**/ui/**", serve)
    page.route("**/", lambda route: route.fulfill(status=200, body=files["index.html"],
                                                   headers={"content-type": "text/html"}))  # fmt: skip


def measure(browser: Any, width: int, files: dict[str, bytes] | None) -> dict[str, int]:
    """One live reading of the list at ``width`` px: the three counts (0 is right) and the readings taken."""
    with tempfile.TemporaryDirectory() as folder:
        server = Server(Path(folder) / "sw.db")
        server.start()
        fleet = Fleet(server.url)
        context = browser.new_context(viewport={"width": width, "height": 900})
        page = context.new_page()
        page.set_default_timeout(15_000)
        if files is not None:
            serve_files(page, files)
        try:
            with Feed(fleet):
                time.sleep(1.0)
                readings, clipped = read_live(page, server.url)
        finally:
            context.close()
            fleet.http.close()
            server.stop()
    return {
        "readings": len(readings),
        "bars > 3 points from their percentage": len(mismatched_bars(readings)),
        "reorders while nobody sorts": len(reorders(readings)),
        "cut cells or chips": len(clipped),
    }


def measure_demo(browser: Any, files: dict[str, bytes] | None, port: int) -> dict[str, dict[str, int]]:
    """The reading at 1440 then 800 px of one ``stepwatch demo`` (ended by SIGTERM, as a closed terminal)."""
    url = f"http://127.0.0.1:{port}"
    demo = subprocess.Popen([sys.executable, "-m", "stepwatch", "demo", "--port", str(port), "--duration", "90"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    found: dict[str, dict[str, int]] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/api/v1/jobs", timeout=2).json()["total"] >= 4:
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.3)
        time.sleep(3)  # every run has reported
        for width in (1440, 800):
            context = browser.new_context(viewport={"width": width, "height": 900})
            page = context.new_page()
            if files is not None:
                serve_files(page, files)
            page.goto(url + "/")
            page.wait_for_function("() => document.querySelectorAll('tr[data-key]').length >= 4")
            readings: list[Any] = []
            clipped: list[str] = []
            end = time.monotonic() + READ_FOR_MS / 1000
            while time.monotonic() < end:
                tick = time.monotonic()
                readings.append(page.evaluate(READ))
                clipped += page.evaluate(CLIPPED_CELLS)
                page.wait_for_timeout(max(0.0, READ_EVERY_MS - 1000 * (time.monotonic() - tick)))
            clipped += page.evaluate(WIDEST_CHIPS)
            context.close()
            found[str(width)] = {
                "readings": len(readings),
                "bars > 3 points from their percentage": len(mismatched_bars(readings)),
                "reorders while nobody sorts": len(reorders(readings)),
                "cut cells or chips": len(clipped),
            }
    finally:
        os.killpg(demo.pid, signal.SIGTERM)
        demo.wait(30)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    parser.add_argument("--demo", action="store_true", help="read stepwatch demo's real training runs")
    parser.add_argument("--port", type=int, default=18642, help="the demo's port (with --demo)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    files = base_files(args.base)
    results: dict[str, dict[str, int]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        if args.demo:
            for label, served in ((args.base, files), ("now", None)):
                for width, counts in measure_demo(browser, served, args.port).items():
                    results[f"{width} px {label}"] = counts
        else:
            for width in (1440, 800):
                results[f"{width} px {args.base}"] = measure(browser, width, files)
                results[f"{width} px now"] = measure(browser, width, None)
        browser.close()
    columns = list(results)
    rows = list(results[columns[0]])
    width = max(len(r) for r in rows)
    print(f"| {'count':<{width}} | " + " | ".join(columns) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * (len(c) + 2) for c in columns) + "|")
    for row in rows:
        print(f"| {row:<{width}} | " + " | ".join(f"{results[c][row]:>{len(c)}}" for c in columns) + " |")


if __name__ == "__main__":
    main()
