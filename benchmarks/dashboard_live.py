"""The job list read live, counted for a base revision and for the working tree in the same run: six jobs
report to a real server (one hangs, one is stopped at 68.4 %) while headless Chromium at 1440 and 800 px reads
the list every 300 ms for 12 s (``tests/e2e/test_live_list.py``'s reading), and counts bars drawn more than 3
points away from the percentage beside them, reorders while nobody sorts, and cut cells or chips::

    .venv/bin/python benchmarks/dashboard_live.py --base 30b50a2   # the list before issue 30

The base revision's dashboard files are served in place of the working tree's by Playwright's request routing
(as ``benchmarks/dashboard_layout.py`` does); each reading gets a fresh server and fresh jobs. About 2 minutes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dashboard_layout import base_files  # noqa: E402
from test_live_list import Feed, mismatched_bars, read_live, reorders  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    files = base_files(args.base)
    results: dict[str, dict[str, int]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
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
