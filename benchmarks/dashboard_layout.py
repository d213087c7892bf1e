"""What a user sees go wrong in the dashboard's layout, counted for a base revision and for the working tree in
the same run, in a real browser (Debian's headless Chromium) against one real server with the jobs of
``tests/e2e/test_layout.py`` (7-character losses, 10,000 / 10,000 steps, a stopped job, a run that diverged to
1e34 then NaN and was stopped by its policy, a Hugging Face-like run with total_flos and train_runtime)::

    .venv/bin/python benchmarks/dashboard_layout.py              # base: main
    .venv/bin/python benchmarks/dashboard_layout.py --base HEAD~3

The base revision's dashboard files (``src/stepwatch/server/web``, read with ``git show``) are served to the
page in place of the working tree's by Playwright's request routing; the server, its API and the data are
the same for both. Prints one table: each row a count (0 is right) or a figure, base against now.
"""

from __future__ import annotations

import argparse
import mimetypes
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WEB = "src/stepwatch/server/web"
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from test_layout import CLIPPED_CELLS, DIVERGED, FINISHED, HF, NEEDED, SAME_ROW, STOPPED, seed  # noqa: E402

from conftest import Fleet, Server, chromium_path  # noqa: E402

RAW = re.compile(r"\d\.\d{8,}")


def base_files(rev: str) -> dict[str, bytes]:
    """The dashboard's files at ``rev``: path under ``/ui/`` -> content."""
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, WEB], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    return {
        name[len(WEB) + 1 :]: subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        for name in names
    }


def measure(page: Any, url: str) -> dict[str, Any]:
    """The counts for the dashboard the page is served."""
    found: dict[str, Any] = {}
    for width in (1440, 800):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(url + "/")
        page.wait_for_function("document.querySelectorAll('a.job-link').length === 5")
        page.wait_for_timeout(600)
        found[f"list cells cut at {width} px"] = len(page.evaluate(CLIPPED_CELLS))
        found[f"needed columns off screen at {width} px"] = page.evaluate(
            f"{list(NEEDED)}.filter((c) => [...document.querySelectorAll('tr[data-key] td.' + c)].some((td) => "
            "{ const r = td.getBoundingClientRect(); return r.width === 0 || r.right > "
            "document.documentElement.clientWidth; })).length"
        )
        found[f"Sign out shown without authentication ({width} px)"] = int(page.locator("#signout").is_visible())
        bad_pairs = 0
        raw = 0
        for key in (f"nlp-research/{STOPPED}", f"default/{DIVERGED}"):
            page.goto(f"{url}/#/?job={key.replace('/', '%2F')}")
            page.wait_for_selector("#panel [data-testid=events] li")
            page.wait_for_timeout(800)
            bad_pairs += sum(1 for _, _, paired in page.evaluate(SAME_ROW) if not paired)
            for selector in ("section[aria-labelledby=p-health]", "[data-testid=events]", "[data-testid=policy]"):
                text = page.locator(f"#panel {selector}").inner_text()
                raw += text.count("{") + len(RAW.findall(text))
        found[f"panel labels not beside their value at {width} px"] = bad_pairs
        found[f"raw JSON braces and long floats in the panel at {width} px"] = raw
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{url}/#/compare/default/{DIVERGED},default/{HF},vision/{FINISHED}")
    page.wait_for_selector("table.compare")
    page.wait_for_function("(() => { const d = document.querySelector(\".chart[data-metric='loss']\"); "
                           "return d && d._fullLayout; })()")  # fmt: skip
    page.wait_for_timeout(800)
    layout = page.evaluate("document.querySelector(\".chart[data-metric='loss']\")._fullLayout.yaxis")
    high = 10 ** layout["range"][1] if layout["type"] == "log" else layout["range"][1]
    found["compare: top of the loss axis (others 0.05-2.5)"] = f"{high:.3g} ({layout['type']})"
    found["compare: legend on the step axis title"] = int(page.evaluate(
        "(() => { const d = document.querySelector(\".chart[data-metric='loss']\"); "
        "const a = d.querySelector('.xtitle').getBoundingClientRect(); "
        "const b = d.querySelector('.legend').getBoundingClientRect(); "
        "return !(a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top); })()"
    ))  # fmt: skip
    found["compare: one-point charts"] = page.evaluate(
        "[...document.querySelectorAll('.chart')].filter((d) => d.data && Math.max(...d.data.map((t) => "
        "(t.y || []).filter((v) => v !== null).length)) <= 1).length"
    )
    row = page.locator("table.compare tr", has=page.locator("th:text-is('loss (min)')"))
    found["compare: star for the run that went NaN"] = int("★" in row.locator("td:not(.mark)").first.inner_text())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    files = base_files(args.base)
    with tempfile.TemporaryDirectory() as folder:
        server = Server(Path(folder) / "sw.db")
        server.start()
        fleet = Fleet(server.url)
        seed(fleet)
        fleet.report(DIVERGED, 1100, {}, state="stopped")
        results = {}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
            for label, replace in ((args.base, True), ("now", False)):
                context = browser.new_context()
                page = context.new_page()
                page.set_default_timeout(15_000)
                if replace:

                    def serve(route: Any, name: str = "") -> None:
                        path = route.request.url.split("/ui/", 1)[1].split("?")[0]
                        if path not in files:
                            route.continue_()
                            return
                        kind = mimetypes.guess_type(path)[0] or "application/octet-stream"
                        route.fulfill(status=200, body=files[path], headers={"content-type": kind})

                    page.route("**/ui/**", serve)
                    page.route("**/", lambda route: route.fulfill(status=200, body=files["index.html"],
                                                                   headers={"content-type": "text/html"}))  # fmt: skip
                results[label] = measure(page, server.url)
                context.close()
            browser.close()
        server.stop()
    width = max(len(k) for k in results["now"])
    print(f"{'':<{width}}  {args.base:>18}  {'now':>18}")
    for key in results["now"]:
        print(f"{key:<{width}}  {results[args.base][key]!s:>18}  {results['now'][key]!s:>18}")


if __name__ == "__main__":
    main()
