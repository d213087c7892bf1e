"""The live stream's order when a job ends (issue 30): a reader of ``GET /api/v1/events`` on a real
server gets a job's final points before the update that says it finished, failed or stopped, on
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

MakeReport = Callable[..., dict[str, Any]]

pytestmark = pytest.mark.both_stores


class Reader:
    """Reads the live stream in a thread, every event in the order it came."""

    def __init__(self, base: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.error: BaseException | None = None
        self.opened = threading.Event()
        self.changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(base,), daemon=True)
        self._thread.start()
        assert self.opened.wait(5), f"the stream did not open: {self.error!r}"

    def _run(self, base: str) -> None:
        try:
            with (
                httpx.Client(base_url=base, timeout=5.0) as http,
                http.stream("GET", "/api/v1/events") as response,
            ):
                assert response.status_code == 200
                kind, data = "", ""
                for line in response.iter_lines():
                    if self._stop.is_set():
                        return
                    if line.startswith("retry:"):
                        self.opened.set()
                    elif line.startswith("event:"):
                        kind = line.partition(":")[2].strip()
                    elif line.startswith("data:"):
                        data = line.partition(":")[2].strip()
                    elif not line and data:
                        with self.changed:
                            self.events.append((kind, json.loads(data)))
                            self.changed.notify_all()
                        kind, data = "", ""
        except BaseException as exc:  # reported by wait_for
            self.error = exc
            self.opened.set()

    def wait_for(self, done: Callable[[list[tuple[str, dict[str, Any]]]], bool]) -> list[tuple[str, dict[str, Any]]]:
        with self.changed:
            ok = self.changed.wait_for(lambda: self.error is not None or done(self.events), timeout=10)
            assert self.error is None, repr(self.error)
            assert ok, f"timed out; read {[(k, d.get('name')) for k, d in self.events]}"
            return list(self.events)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def base(app: Starlette, serve: Any) -> Iterator[str]:
    app.state.services.live.heartbeat = 0.05  # a closed reader ends at the next keep-alive
    with serve(app) as url:
        yield url


def _ended(name: str, state: str) -> Callable[[list[tuple[str, dict[str, Any]]]], bool]:
    return lambda events: any(k == "job" and d["name"] == name and d["job"]["state"] == state for k, d in events)


@pytest.mark.parametrize("final", ["finished", "failed", "stopped"])
def test_a_jobs_final_points_come_before_the_update_that_ends_it(
    base: str, make_report: MakeReport, final: str, backend: str
) -> None:
    reader = Reader(base)
    try:
        with httpx.Client(base_url=base, timeout=5) as http:
            name = f"ends-{final}"
            token = http.post("/api/v1/namespaces/default/jobs", json={"name": name, "total_steps": 20}).json()["token"]
            path, auth = f"/api/v1/namespaces/default/jobs/{name}/reports", {"Authorization": f"Bearer {token}"}
            for seq, step in enumerate((5, 10, 15)):
                assert (
                    http.post(path, json=make_report(seq, step, {"loss": 1.0 / step}), headers=auth).status_code == 200
                )
            last = make_report(3, 20, {"loss": 0.01, "accuracy": 0.9}, state=final, reason="the end")
            assert http.post(path, json=last, headers=auth).status_code == 200
        events = reader.wait_for(_ended(name, final))
    finally:
        reader.close()
    mine = [(k, d) for k, d in events if d["name"] == name]
    ended_at = next(i for i, (k, d) in enumerate(mine) if k == "job" and d["job"]["state"] == final)
    final_points = [i for i, (k, d) in enumerate(mine) if k == "points" and d["points"]["loss"]["step"] == 20]
    assert final_points, f"the final points never came: {[k for k, _ in mine]}"
    assert final_points[0] < ended_at, f"the job ended (event {ended_at}) before its last points {final_points}"
    assert set(mine[final_points[0]][1]["points"]) == {"loss", "accuracy"}
    steps_seen = [d["points"]["loss"]["step"] for k, d in mine[:ended_at] if k == "points"]
    assert steps_seen == [5, 10, 15, 20]  # every window, in order, before the end
