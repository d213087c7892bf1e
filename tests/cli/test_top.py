"""``stepwatch top`` headless, with Textual's test pilot, against a real server and real reporters: the table,
live updates, sort, filter, the job screen and stopping a job from it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from swtest import start_job, step_until

pytest.importorskip("textual")

from stepwatch.cli import build_parser
from stepwatch.cli.top import COLUMNS, bar, fit_columns, make_app, visible_jobs
from stepwatch.client import Client, Job


def _rows(app: Any) -> list[list[str]]:
    from textual.widgets import DataTable

    table = app.query_one(DataTable)
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


async def _until(pilot: Any, predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            app = pilot.app
            seen = f"screen {type(app.screen).__name__}, status {getattr(app, 'status', '')!r}, rows {_rows(app)}"
            raise AssertionError(f"timed out waiting for {predicate} ({seen})")
        await pilot.pause(0.05)


def test_bar_and_order() -> None:
    assert bar(50.0, 10) == "█████░░░░░  50.0%"
    assert bar(None, 4) == "         -"

    def job(ns: str, name: str, state: str, percent: float | None, health: str) -> Job:
        view = {"namespace": ns, "name": name, "state": state, "health": {"state": health}}
        return Job({**view, "progress": {"percent": percent}})

    jobs = [
        job("a", "x", "running", 10, "healthy"),
        job("a", "y", "running", 90, "diverging"),
        job("b", "z", "failed", None, "unknown"),
    ]
    assert [j.name for j in visible_jobs(jobs, "progress", reverse=True)] == ["y", "x", "z"]
    assert [j.name for j in visible_jobs(jobs, "health")] == ["y", "z", "x"]
    assert [j.name for j in visible_jobs(jobs, text="fail")] == ["z"]
    assert "top" in build_parser().format_help()


def test_top_shows_sorts_filters_opens_and_stops(server: str, ns: str) -> None:
    run = start_job(server, ns, "trainer", total_steps=100, gpus=4, gpu_hour_cost=2.0)
    run.step(loss=0.5)
    step_until(server, ns, "trainer", 1)
    with Client(server) as c:
        c.register("waiting", ns, total_steps=10)
        c.register("zz-evil", ns)  # a name shown as text, never as markup

    async def main() -> None:
        client = Client(server)
        app = make_app(client, ns)
        async with app.run_test(size=(160, 40)) as pilot:
            await _until(pilot, lambda: len(_rows(app)) == 3)
            rows = _rows(app)
            assert [r[0] for r in rows] == ["trainer", "waiting", "zz-evil"]
            trainer = rows[0]
            assert trainer[2] == "running" and "1/100" in trainer[5] and trainer[7] == "0.5" and trainer[10] == "4"
            assert "1.0%" in trainer[4]

            # live: a new step shows without a key press
            for _ in range(9):
                run.step(loss=0.25)
            await _until(pilot, lambda: "10/100" in _rows(app)[0][5])
            assert "10.0%" in _rows(app)[0][4]

            # sort by progress (s), reversed (r): the trainer first
            await pilot.press("s")
            assert app.sort == "progress"
            await pilot.press("r")
            await _until(pilot, lambda: _rows(app)[0][0] == "trainer")

            # filter
            await pilot.press("slash", "w", "a", "i", "t")
            await _until(pilot, lambda: [r[0] for r in _rows(app)] == ["waiting"])
            await pilot.press("escape")
            await _until(pilot, lambda: len(_rows(app)) == 3)

            # open the trainer and stop it from its screen (after a y)
            from textual.widgets import DataTable

            table = app.query_one(DataTable)
            table.move_cursor(row=[r[0] for r in _rows(app)].index("trainer"))
            await pilot.press("enter")
            await _until(pilot, lambda: type(app.screen).__name__ == "JobScreen")
            body = app.screen.body
            assert f"{ns}/trainer" in body and "cost" in body and "registered" in body
            await pilot.press("x")
            await _until(pilot, lambda: type(app.screen).__name__ == "Confirm")
            await pilot.press("y")
            await _until(
                pilot, lambda: "asked" in app.status, timeout=30
            )  # two POSTs from a worker thread: slow on a loaded machine
            assert f"asked {ns}/trainer for a checkpoint, then stop" in app.status
            await pilot.press("escape")
            await pilot.press("q")
        client.close()

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while not run.should_stop:
        run.step(loss=0.2)
        assert time.monotonic() < deadline, "the stop command did not reach the job"
        time.sleep(0.05)
    assert run.should_checkpoint and run.command_reason == "stepwatch top"
    run.finish("stopped", "stepwatch top")


def test_a_narrow_terminal_keeps_the_most_needed_columns() -> None:
    row = ["llama-3-8b-sft-lora", "nlp-research", "running", "healthy", "██░░░░  18.3%", "1834/10000", "22m47s",
           "0.01308", "32.80", "1.23", "8"]  # fmt: skip
    assert fit_columns([row], 200) == list(COLUMNS)
    at_80 = fit_columns([row], 78)
    assert at_80 == ["NAME", "STATE", "HEALTH", "PROGRESS", "ETA", "LOSS"]
    assert sum(max(len(c), len(row[COLUMNS.index(c)])) + 2 for c in at_80) <= 78
    # strictly by priority: a column that does not fit hides every less needed one, even a narrower one
    assert "$/H" not in fit_columns([row], 90) and "STEP" in fit_columns([row], 90)


def test_top_at_80_columns_shows_eta_and_loss(server: str, ns: str) -> None:
    """What a default terminal (80 x 24) shows: the name, state, health, progress, ETA and loss, all on screen
    (the rest of the columns were cut off the right side before)."""
    run = start_job(server, ns, "llama-3-8b-sft-lora", total_steps=10_000, gpus=8, gpu_hour_cost=4.1)
    for _ in range(3):
        run.step(loss=0.0130812)
    step_until(server, ns, "llama-3-8b-sft-lora", 3)

    async def main() -> None:
        client = Client(server)
        app = make_app(client, ns)
        async with app.run_test(size=(80, 24)) as pilot:
            from textual.widgets import DataTable

            await _until(pilot, lambda: len(_rows(app)) == 1)
            table = app.query_one(DataTable)
            headers = [str(column.label) for column in table.columns.values()]
            # these six always; a narrower column (STEP, when the ETA is still "-") may fit beside them
            assert {"NAME", "STATE", "HEALTH", "PROGRESS", "ETA", "LOSS"} <= set(headers), headers
            assert headers == [c for c in COLUMNS if c in headers], headers
            assert table.virtual_size.width <= 80, table.virtual_size
            row = dict(zip(headers, _rows(app)[0]))
            assert row["LOSS"] == "0.01308" and row["NAME"] == "llama-3-8b-sft-lora" and "0.0%" in row["PROGRESS"]
            # wider: every column comes back
            await pilot.resize_terminal(160, 24)
            await _until(pilot, lambda: len(table.columns) == len(COLUMNS))
            await pilot.press("q")
        client.close()

    asyncio.run(main())
    run.finish()


def test_the_job_screen_follows_the_job(server: str, ns: str) -> None:
    """Issue 30: ``top``'s job pane showed the job as it was when opened. It now follows the live updates, and
    an ended job reads no rate and no hourly cost ("—"), in the pane and in its row."""
    run = start_job(server, ns, "follower", total_steps=100, gpus=2, gpu_hour_cost=3.0)
    run.step(loss=0.5)
    step_until(server, ns, "follower", 1)

    async def main() -> None:
        client = Client(server)
        app = make_app(client, ns)
        async with app.run_test(size=(160, 40)) as pilot:
            await _until(pilot, lambda: len(_rows(app)) == 1)
            await pilot.press("enter")
            await _until(pilot, lambda: type(app.screen).__name__ == "JobScreen")
            assert "step      1 / 100" in app.screen.body
            for _ in range(4):
                run.step(loss=0.25)
            await _until(pilot, lambda: "step      5 / 100" in app.screen.body)  # no key pressed
            run.finish()
            await _until(pilot, lambda: "finished" in app.screen.body and "— steps/s (ended)" in app.screen.body)
            assert "— USD/h" in app.screen.body
            await pilot.press("escape")
            # the list's row follows the same update, maybe a refresh after the pane: wait for it, not a race
            await _until(pilot, lambda: dict(zip(COLUMNS, _rows(app)[0]))["$/H"] == "—")
            row = dict(zip(COLUMNS, _rows(app)[0]))
            assert row["$/H"] == "—" and row["STATE"] == "finished"
            await pilot.press("q")
        client.close()

    asyncio.run(main())
