"""Issue 29 item 6 in the dashboard: a verdict by where each rank stands shows the rank and its place in
words, in the side panel and in the list's tooltip — a rank hung in its own code (the others waiting in a
collective) and a straggler (host, how much slower, where its extra time goes, the elastic hint).

Real reports over HTTP to a real server, as the report core sends them (``where`` while a step stands,
``activity_shares`` always); the server's health knobs are shortened (a hang after 1 s, a straggler after
2 s) so that the browser sees in seconds what a real job shows after 45 s and 5 minutes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from stepwatch.protocol import Frame, Identity, MetricWindow, Progress, Report, Where

KNOBS = {
    "hang_floor_s": 1.0,
    "stall_floor_s": 2.0,
    "standstill_floor_s": 2.0,
    "straggler_hold_s": 2.0,
    "rank_check_s": 0.5,
}


@pytest.fixture
def quick_server(tmp_path: Path, start_server: Callable[..., Any]) -> Any:
    return start_server(tmp_path / "sw.db", health=KNOBS)


class Ranks:
    """The ranks of one job, each reporting as its report core does."""

    def __init__(self, http: httpx.Client, name: str, world: int) -> None:
        response = http.post("/api/v1/namespaces/default/jobs", json={"name": name, "total_steps": 1_000_000})
        assert response.status_code == 201, response.text
        self.http, self.name, self.world = http, name, world
        self.token = response.json()["token"]
        self.seq = [0] * world

    def report(
        self, rank: int, step: int, *, where: Where | None = None, shares: dict[str, float] | None = None
    ) -> None:
        self.seq[rank] += 1
        report = Report(
            run_id=f"run-{self.name}",
            seq=self.seq[rank],
            sent_at=time.time(),
            identity=Identity(rank=rank, world_size=self.world, host=f"node-{rank + 1}", pid=4000 + rank),
            progress=Progress(step=step, total_steps=1_000_000),
            # rank 0 sends the loss (a finite one: the verdict is not "unknown" for want of data)
            metrics=(_loss(step),) if rank == 0 else (),
            where=where,
            activity_shares=shares,
        )
        response = self.http.post(
            f"/api/v1/namespaces/default/jobs/{self.name}/reports",
            json=report.to_dict(),
            headers={"Authorization": f"Bearer {self.token}"},
        )
        assert response.status_code == 200, response.text


def _loss(step: int) -> MetricWindow:
    value = 1.0 / (1 + step)
    return MetricWindow(
        name="loss", last=value, min=value, max=value, mean=value, count=1, nonfinite=0, first_step=step, last_step=step
    )


def health(http: httpx.Client, name: str) -> dict[str, Any]:
    response = http.get(f"/api/v1/namespaces/default/jobs/{name}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()["health"]
    return found


def until(http: httpx.Client, name: str, state: str, feed: Any, seconds: float = 30.0) -> dict[str, Any]:
    """Feed reports (``feed(i)``) until the job's health is ``state``; its health."""
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        feed(i)
        i += 1
        found = health(http, name)
        if found["state"] == state:
            return found
        time.sleep(0.25)
    raise AssertionError(f"{name} never read {state}: {health(http, name)}")


def test_a_hung_rank_and_a_straggler_show_rank_and_place_in_words(page: Any, quick_server: Any, shot: Any) -> None:
    http = httpx.Client(base_url=quick_server.url, timeout=10)
    hung, slow = Ranks(http, "hung", 2), Ranks(http, "slowrank", 3)
    for step in range(1, 21):  # a steady start: both ranks step together
        for rank in range(2):
            hung.report(rank, step, shares={"computing": 0.9, "communicating": 0.1})
    lock = Where(
        activity="waiting",
        stood_seconds=5.0,
        detail="threading.Lock.acquire",
        frames=(Frame("wait_for_lock", "hung_rank.py", 31), Frame("main", "hung_rank.py", 58)),
    )
    reduce = Where(
        activity="communicating",
        stood_seconds=5.0,
        detail="torch.distributed.all_reduce",
        frames=(Frame("main", "hung_rank.py", 49),),
    )

    def stand(i: int) -> None:
        hung.report(1, 20, where=lock)
        hung.report(0, 20, where=reduce)

    stalled = until(http, "hung", "stalled", stand)
    assert "rank 1" in stalled["evidence"]["message"], stalled

    # rank 2 computes and loads its data while ranks 0 and 1 wait for it in the collective
    waits = {"computing": 0.3, "communicating": 0.7}
    lags = {"computing": 0.3, "loading_data": 0.6, "communicating": 0.1}

    def step_together(i: int) -> None:
        for rank in range(3):
            slow.report(rank, 10 * (i + 1), shares=lags if rank == 2 else waits)

    straggling = until(http, "slowrank", "straggling", step_together)
    assert "rank 2 (host node-3)" in straggling["evidence"]["message"], straggling

    # both jobs go on reporting while the browser looks (a job whose reports stop reads stalled for that)
    done = threading.Event()
    failures: list[BaseException] = []

    def keep_reporting() -> None:
        i = 1000
        while not done.wait(0.3):
            try:
                stand(i)
                step_together(i)
            except BaseException as exc:  # said by the test, not lost in the thread
                failures.append(exc)
                return
            i += 1

    feeder = threading.Thread(target=keep_reporting, daemon=True)
    feeder.start()
    try:
        look(page, quick_server.url, shot)
    finally:
        done.set()
        feeder.join(10)
        http.close()
    assert not failures, failures


def scroll_to_evidence(page: Any) -> None:
    """For the screenshot (the panel rewrites its health section as the verdict's words change)."""
    page.evaluate("document.querySelector('#panel [data-testid=evidence]')?.scrollIntoView()")


def look(page: Any, url: str, shot: Any) -> None:
    page.goto(url + "/")
    # the list: the health badge's tooltip is the verdict's message, rank and place in words
    badge = page.locator("tr", has=page.locator("a.job-link:text-is('hung')")).locator("td.c-health .badge")
    title = badge.get_attribute("title") or ""
    assert "rank 1" in title and "wait_for_lock (hung_rank.py:31)" in title, title
    badge = page.locator("tr", has=page.locator("a.job-link:text-is('slowrank')")).locator("td.c-health .badge")
    title = badge.get_attribute("title") or ""
    assert "rank 2 (host node-3)" in title and "loading data" in title, title

    # the panel of the hung job: the message, then its pieces in words (no internal names, no bare lists)
    page.click("a.job-link:text-is('hung')")
    page.wait_for_selector("#panel [data-testid=evidence]")
    message = page.locator("#panel [data-testid=evidence]").inner_text()
    assert "rank 1" in message and "wait_for_lock (hung_rank.py:31)" in message, message
    facts = page.locator("#panel [data-testid=evidence-facts]").inner_text()
    assert "its own code, a lock or its loader" in facts, facts
    assert "wait_for_lock (hung_rank.py:31)" in facts and "rank 1" in facts, facts
    assert "hang" not in facts.lower().split(), facts
    scroll_to_evidence(page)
    shot("hung")

    page.click("a.job-link:text-is('slowrank')")
    page.wait_for_selector("#panel h2:text-is('slowrank')")
    page.wait_for_selector("#panel [data-testid=evidence]")
    facts = page.locator("#panel [data-testid=evidence-facts]").inner_text()
    assert "node-3" in facts, facts
    assert "3.0x" in facts and "1.5x" in facts, facts  # the ratio and the rule's threshold as "x", not bare
    assert "loading data 60%" in facts and "communicating 70%" in facts, facts  # shares as percentages
    assert "0.6" not in facts, facts
    scroll_to_evidence(page)
    shot("straggler")
