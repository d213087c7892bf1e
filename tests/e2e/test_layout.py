"""The dashboard's layout at a desktop (1440 px) and a small laptop or split screen (800 px), in a real
browser (Debian's headless Chromium) against a real server fed through the real API with realistic values:
7-character losses, a job at 10,000 / 10,000 steps, a stopped job, a run that diverged (1e34, then NaN) and
was stopped by its policy, and a Hugging Face-like run with one-off metrics (total_flos, train_runtime).

What is asserted is what a user saw go wrong: no list cell is cut (its content wider than its box), the
side panel's labels sit beside their own values, no raw JSON or unrounded float reaches the screen, and the
compare view stays readable with a diverged run in it. Screenshots go to the test's temporary folder.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_dashboard import wait_js

WIDTHS = (1440, 800)

RUNNING = "llama-3-8b-sft-lora"
FINISHED = "resnet50-imagenet-baseline"
STOPPED = "bert-large-mlm"
DIVERGED = "gpt2-medium-lr-3e-3"
HF = "hf-distilbert-sst2"


def seed(fleet: Any) -> None:
    """Five jobs, reported through the API as the report core and the Hugging Face integration would."""
    now = time.time()
    fleet.register(RUNNING, "nlp-research", total_steps=10_000, gpus=8, gpu_hour_cost=4.1)
    for i in range(1, 31):  # ends at 1,834 / 10,000 (18.34 %), loss 0.0130812, one report every 10 s
        loss = 0.0130812 + (0.9 / i**2 if i < 30 else 0.0)
        fleet.report(RUNNING, 61 * i + (4 if i == 30 else 0), {"loss": loss}, "nlp-research",
                     total_steps=10_000, sent_at=now - 300 + 10 * i)  # fmt: skip

    fleet.register(FINISHED, "vision", total_steps=10_000, gpus=4, gpu_hour_cost=2.5)
    for i in range(1, 11):
        fleet.report(FINISHED, 1000 * i, {"loss": 0.07084809085767296 + 1.0 / i**3}, "vision", total_steps=10_000)
    fleet.report(FINISHED, 10_000, {"loss": 0.07084809085767296}, "vision", total_steps=10_000, state="finished")

    fleet.register(STOPPED, "nlp-research", total_steps=3000, gpus=2, gpu_hour_cost=3.0)
    for i in range(1, 13):
        fleet.report(STOPPED, 100 * i, {"loss": 1.2345678 / i}, "nlp-research", total_steps=3000)
    fleet.report(STOPPED, 1199, {"loss": 0.1028806}, "nlp-research", total_steps=3000, state="stopped")

    fleet.register(DIVERGED, total_steps=5000, gpus=1, gpu_hour_cost=2.0, params={"lr": 3e-3, "warmup": 0},
                   policy={"on": {"diverging": "stop"}})  # fmt: skip
    for i in range(1, 9):
        fleet.report(DIVERGED, 100 * i, {"loss": 2.5 / i, "eval_accuracy": 0.1 * i})
    fleet.report(DIVERGED, 900, {"loss": 1e34, "eval_accuracy": 0.05})
    fleet.report(DIVERGED, 1000, {"loss": 3.4e34, "eval_accuracy": 0.0})
    fleet.report(DIVERGED, 1050, {"loss": 0.0})  # what Hugging Face logs once the gradients are NaN
    fleet.report(DIVERGED, 1100, {"loss": float("nan"), "eval_accuracy": 0.0})

    fleet.register(HF, total_steps=2000, gpus=1, gpu_hour_cost=2.0, params={"lr": 5e-5, "warmup": 100})
    for i in range(1, 21):
        metrics: dict[str, float] = {"loss": 0.7 * math.exp(-i / 8) + 0.05, "learning_rate": 5e-5 * (1 - i / 20),
                                     "grad_norm": 3.0 / i, "epoch": i / 10}  # fmt: skip
        if i % 5 == 0:
            metrics |= {"eval_loss": 0.6 * math.exp(-i / 10) + 0.1, "eval_accuracy": 0.8 + i / 200}
        fleet.report(HF, 100 * i, metrics, total_steps=2000)
    fleet.report(HF, 2000, {"total_flos": 3.3e15, "train_runtime": 412.7093, "train_loss": 0.2154871},
                 total_steps=2000, state="finished")  # fmt: skip


@pytest.fixture
def seeded(fleet: Any) -> Any:
    seed(fleet)
    # the diverged run's policy stopped it (a stop command, then the job's end as the report core sends it)
    view = fleet.job(DIVERGED)
    assert view["health"]["state"] == "diverging", view["health"]
    fleet.report(DIVERGED, 1100, {}, state="stopped")
    return fleet


def _shot(page: Any, folder: Path, name: str) -> Path:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# a cell is cut when what it holds is wider than its box (the text ellipsis, or a child pushed out)
CLIPPED_CELLS = """
() => [...document.querySelectorAll('table.jobs thead th, table.jobs tbody tr[data-key] td')]
  .filter((td) => td.offsetParent !== null)
  .flatMap((td) => {
    const cut = [];
    if (td.scrollWidth > td.clientWidth) cut.push(`${td.className}: ${td.scrollWidth} > ${td.clientWidth}`);
    const box = td.getBoundingClientRect();
    for (const child of td.querySelectorAll('*:not(.sr)')) {  // .sr: text for screen readers only
      const r = child.getBoundingClientRect();
      if (r.width === 0 || getComputedStyle(child).display === 'none') continue;
      if (r.right > box.right + 0.5 || r.left < box.left - 0.5)
        cut.push(`${td.className} > ${child.tagName} ${child.getAttribute('class') || ''}`);
      if (child.scrollWidth > child.clientWidth && child.clientWidth > 0 && child.tagName !== 'svg')
        cut.push(`${td.className} > ${child.className}: ${child.scrollWidth} > ${child.clientWidth}`);
    }
    return cut.map((c) => `${td.closest('tr').dataset.key || 'header'} ${c}`);
  })
"""

# the columns a user needs on any screen: visible, inside the window, not scrolled away
NEEDED = ("c-name", "c-state", "c-progress", "c-eta", "c-loss", "c-cost", "c-age")


@pytest.mark.parametrize("width", WIDTHS)
def test_no_list_cell_is_cut_and_the_needed_columns_are_on_screen(
    page: Any, seeded: Any, width: int, tmp_path: Path
) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(seeded.url + "/")
    wait_js(page, "return document.querySelectorAll('a.job-link').length === 5;")
    wait_js(page, "return document.querySelectorAll('.c-loss .spark svg').length >= 3;")
    _shot(page, tmp_path, f"list-{width}")
    rows = {key: page.locator(f"tr[data-key='{key}']").inner_text() for key in
            (f"nlp-research/{RUNNING}", f"vision/{FINISHED}", f"nlp-research/{STOPPED}")}  # fmt: skip
    assert "18.3%" in rows[f"nlp-research/{RUNNING}"] and "0.01308" in rows[f"nlp-research/{RUNNING}"]
    assert "10,000 / 10,000" in rows[f"vision/{FINISHED}"]
    assert "stopped" in rows[f"nlp-research/{STOPPED}"]
    assert page.evaluate(CLIPPED_CELLS) == []
    # nothing before a name but the checkbox (a stray mark read as a "." before every name)
    assert page.evaluate("[...document.querySelectorAll('td.c-name')].every((td) => "
                         "td.innerText.trim().startsWith(td.querySelector('a').innerText))")  # fmt: skip
    window = page.evaluate("document.documentElement.clientWidth")
    for column in NEEDED:
        boxes = page.evaluate(
            f"[...document.querySelectorAll('tr[data-key] td.{column}')].map((td) => td.getBoundingClientRect())"
            ".map((r) => [r.left, r.right, r.width])"
        )
        assert boxes, column
        for left, right, w in boxes:
            assert w > 0 and left >= 0 and right <= window + 0.5, (column, left, right, window)
    wrap = page.evaluate("(() => { const w = document.querySelector('.table-wrap'); "
                         "return [w.scrollWidth, w.clientWidth]; })()")  # fmt: skip
    assert wrap[0] <= wrap[1], f"the list scrolls sideways at {width} px: {wrap}"


# each label with its value: on the same row, the value right of the label, and no other label between them
SAME_ROW = """
() => [...document.querySelectorAll('#panel dl.facts')].flatMap((dl) => [...dl.querySelectorAll('dt')].map((dt) => {
  const dd = dt.nextElementSibling;
  const a = dt.getBoundingClientRect();
  const b = dd.getBoundingClientRect();
  const sameRow = a.top < b.bottom && b.top < a.bottom && b.left >= a.right - 1;
  const between = [...dl.querySelectorAll('dt')].some((x) => {
    const c = x.getBoundingClientRect();
    return x !== dt && c.top < a.bottom && a.top < c.bottom && c.left > a.left && c.left < b.left;
  });
  return [dt.textContent, dd.textContent, sameRow && !between];
}))
"""


def _visible_text(page: Any, selector: str) -> str:
    text: str = page.locator(selector).inner_text()
    return text


RAW_FLOAT = re.compile(r"\d\.\d{8,}")  # 0.07084809085767296: more digits than a person reads


@pytest.mark.parametrize("width", WIDTHS)
def test_the_panel_pairs_labels_with_their_values_and_shows_no_raw_internals(
    page: Any, seeded: Any, width: int, tmp_path: Path
) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    for key, name in ((f"nlp-research/{STOPPED}", STOPPED), (f"default/{DIVERGED}", DIVERGED)):
        page.goto(f"{seeded.url}/#/?job={key.replace('/', '%2F')}")
        page.wait_for_selector(f"#panel h2:text-is('{name}')")
        page.wait_for_selector("#panel [data-testid=events] li.ev")
        page.wait_for_selector("#panel [data-testid=policy] table")
        _shot(page, tmp_path, f"panel-{name}-{width}")
        page.locator("#panel section[aria-labelledby=p-health]").scroll_into_view_if_needed()
        _shot(page, tmp_path, f"panel-{name}-{width}-health")
        pairs = page.evaluate(SAME_ROW)
        assert pairs, "no facts in the panel"
        for label, value, paired in pairs:
            assert paired, f"{label!r} is not beside its value {value!r} at {width} px"
        facts = {label: value for label, value, _ in pairs}
        if name == STOPPED:
            assert facts["Completed steps"] == "1,199 / 3,000"
            assert facts["Estimated finish"] == "—"
        for selector in ("#panel section[aria-labelledby=p-health]", "#panel [data-testid=events]",
                         "#panel [data-testid=policy]"):  # fmt: skip
            text = _visible_text(page, selector)
            assert "{" not in text and "}" not in text, (selector, text)
            assert not RAW_FLOAT.search(text), (selector, text)
    # the run's own chart: its 1e34 does not flatten the rest of its curve either
    wait_js(page, "const d = document.querySelector(\"#panel .chart[data-metric='loss']\"); return d && d._fullLayout;")
    y = page.evaluate("document.querySelector(\"#panel .chart[data-metric='loss']\")._fullLayout.yaxis.range")
    assert y[1] < 100, y
    health = _visible_text(page, "#panel section[aria-labelledby=p-health]")
    assert "non-finite" in health
    policy = _visible_text(page, "#panel [data-testid=policy]")
    assert "Acted on" in policy and "diverging" in policy


def test_the_compare_view_stays_readable_with_a_diverged_run(page: Any, seeded: Any, tmp_path: Path) -> None:
    page.set_viewport_size({"width": 1440, "height": 900})
    keys = f"default/{DIVERGED},default/{HF},vision/{FINISHED}"
    page.goto(f"{seeded.url}/#/compare/{keys}")
    page.wait_for_selector("table.compare")
    wait_js(page, "const d = document.querySelector(\".chart[data-metric='loss']\"); return d && d._fullLayout;")
    page.wait_for_timeout(300)  # the other charts draw in the same frame
    _shot(page, tmp_path, "compare-1440")
    # the diverged run's 1e34 does not flatten the others: the loss chart is on a log scale (or a clipped range)
    axis = page.evaluate(
        "(() => { const l = document.querySelector(\".chart[data-metric='loss']\")._fullLayout.yaxis; "
        "return [l.type, l.range]; })()"
    )
    kind, (low, high) = axis
    if kind == "log":  # decades shown: the others' 0.05..2 are not squeezed into one pixel row
        assert high - low < 40, axis
    else:  # a range clipped to the other values (the diverged run's 1e34 runs off the chart)
        assert high < 100, axis
    note = page.locator(".chart[data-metric='loss'] + .chart-note, .chart[data-metric='loss'] .chart-note")
    assert note.count() == 1 and ("log" in note.inner_text() or "clipped" in note.inner_text())
    # the legend does not sit on the step axis title
    overlap = page.evaluate(
        "(() => { const d = document.querySelector(\".chart[data-metric='loss']\"); "
        "const t = d.querySelector('.xtitle'); const g = d.querySelector('.legend'); "
        "if (!t || !g) return null; const a = t.getBoundingClientRect(); const b = g.getBoundingClientRect(); "
        "return !(a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top); })()"
    )
    assert overlap is False
    # single-value metrics are table rows, not charts
    charted = page.evaluate("[...document.querySelectorAll('.chart')].map((d) => d.dataset.metric)")
    assert "total_flos" not in charted and "train_runtime" not in charted and "loss" in charted
    table = page.locator("table.compare")
    flos = table.locator("tr", has=page.locator("th:text-is('total_flos')"))
    assert flos.count() == 1 and "3.3e+15" in flos.inner_text()
    assert "total_flos" in page.locator("[data-testid=single-values]").inner_text()
    # no star for a run whose best is not a number it can stand on (its series went NaN/Inf)
    best_loss = table.locator("tr", has=page.locator("th:text-is('loss (min)')"))
    cells = best_loss.locator("td:not(.mark)").all_inner_texts()
    diverged_cell = cells[0]
    assert "★" not in diverged_cell, cells
    assert "★" in "".join(cells[1:]), cells
    final_loss = table.locator("tr", has=page.locator("th:text-is('loss')")).locator("td:not(.mark)").all_inner_texts()
    assert "★" not in final_loss[0] and "NaN" in final_loss[0], final_loss
    assert not RAW_FLOAT.search(table.inner_text())


def test_sign_out_is_hidden_without_authentication(page: Any, seeded: Any) -> None:
    page.goto(seeded.url + "/")
    page.wait_for_selector("a.job-link")
    wait_js(page, "return document.querySelector('#live').textContent.includes('live');")
    assert not page.locator("#signout").is_visible()
    assert not page.locator("#who").is_visible()
