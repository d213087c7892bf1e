"""The live stream (server-sent events) through a real uvicorn socket: in-process ASGI clients buffer a
streaming response, so these tests read it the way a browser or ``stepwatch watch`` does."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from stepwatch.server.live.broadcaster import Broadcaster

START = 1_800_000_000.0
"""The fake clock's first reading (``conftest.START``)."""

MakeReport = Callable[..., dict[str, Any]]


def _strict_json(text: str) -> Any:
    def reject(constant: str) -> Any:
        raise ValueError(f"non-standard JSON token {constant} in an event")

    return json.loads(text, parse_constant=reject)


class Stream:
    """One SSE subscriber in a thread: connects, collects events, and stops at the next line after close()."""

    def __init__(self, base: str, params: dict[str, str] | None = None, headers: dict[str, str] | None = None):
        self.events: list[dict[str, Any]] = []
        self.status: int | None = None
        self.error: BaseException | None = None
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, args=(base, params or {}, headers or {}), daemon=True)
        self._thread.start()
        assert self._connected.wait(5), f"the stream did not open: {self.status} {self.error!r}"

    def _run(self, base: str, params: dict[str, str], headers: dict[str, str]) -> None:
        try:
            with (
                httpx.Client(base_url=base, timeout=httpx.Timeout(5.0)) as http,
                http.stream("GET", "/api/v1/events", params=params, headers=headers) as response,
            ):
                self.status = response.status_code
                assert response.headers["content-type"].startswith("text/event-stream")
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if self._stop.is_set():
                        return
                    if line.startswith("retry:"):
                        self._connected.set()
                    elif line.startswith(":"):
                        continue  # keep-alive comment
                    elif line:
                        key, _, value = line.partition(":")
                        fields[key] = value.removeprefix(" ")
                    elif fields:
                        event = {
                            "id": int(fields["id"]) if "id" in fields else None,
                            "event": fields.get("event", "message"),
                            "data": _strict_json(fields.get("data", "null")),
                        }
                        with self._lock:
                            self.events.append(event)
                        fields = {}
        except BaseException as exc:  # reported by wait_for / close
            self.error = exc
            self._connected.set()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def wait_for(self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 3.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            events = self.snapshot()
            if done(events):
                return events
            assert self.error is None, repr(self.error)
            assert time.monotonic() < deadline, f"timed out; received {[(e['event'], e['data']) for e in events]}"
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        assert not self._thread.is_alive()


@pytest.fixture
def live(app: Starlette, serve: Any) -> Iterator[str]:
    """The app on a real socket, with keep-alives every 0.05 s so that closed streams end promptly."""
    app.state.services.live.heartbeat = 0.05
    with serve(app) as base:
        yield base


@pytest.fixture
def http(live: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live, timeout=5) as client:
        yield client


def _register(http: httpx.Client, name: str, namespace: str = "default", **fields: Any) -> str:
    response = http.post(f"/api/v1/namespaces/{namespace}/jobs", json={"name": name, **fields})
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def _report(http: httpx.Client, name: str, token: str, body: dict[str, Any], namespace: str = "default") -> None:
    response = http.post(
        f"/api/v1/namespaces/{namespace}/jobs/{name}/reports", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text


def _points_at(events: list[dict[str, Any]], name: str, step: int) -> bool:
    return any(
        e["event"] == "points" and e["data"]["name"] == name and e["data"]["points"]["loss"]["step"] == step
        for e in events
    )


def test_a_subscriber_sees_jobs_and_points_as_they_happen(
    live: str, http: httpx.Client, make_report: MakeReport
) -> None:
    stream = Stream(live)
    try:
        assert stream.status == 200
        token = _register(http, "watched", total_steps=10)
        _report(http, "watched", token, make_report(1, 3, {"loss": [0.5, math.nan]}))
        events = stream.wait_for(lambda es: _points_at(es, "watched", 3), timeout=10)  # pushed: nobody asks again
        kinds = [(e["event"], e["data"]["namespace"], e["data"]["name"]) for e in events]
        assert kinds[0] == ("job", "default", "watched")
        assert ("points", "default", "watched") in kinds
        registered = events[0]["data"]["job"]
        assert (registered["state"], registered["progress"]["total_steps"]) == ("pending", 10)
        update = next(e for e in events[1:] if e["event"] == "job")["data"]["job"]
        assert (update["state"], update["progress"]["step"], update["metrics"]) == ("running", 3, {"loss": "NaN"})
        points = next(e for e in events if e["event"] == "points")["data"]
        assert points["attempt"] == 1
        assert points["points"]["loss"] == {
            "step": 3,
            "first_step": 3,
            "t": START,
            "last": "NaN",
            "min": 0.5,
            "max": 0.5,
            "mean": 0.5,
            "count": 2,
            "nonfinite": 1,
            "windows": 1,
        }
        ids = [e["id"] for e in events]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)

        _report(http, "watched", token, make_report(2, 10, {"loss": 0.1}, state="finished"))
        events = stream.wait_for(lambda es: any(e["event"] == "event" and e["data"]["kind"] == "finished" for e in es))
        changes = [(e["data"]["name"], e["data"]["kind"]) for e in events if e["event"] == "event"]
        assert changes == [("watched", "running"), ("watched", "health"), ("watched", "finished")]
        health = next(e["data"] for e in events if e["event"] == "event" and e["data"]["kind"] == "health")
        assert health["data"]["health"] == "diverging"  # the NaN loss of the first report
        assert health["data"]["evidence"]["metric"] == "loss"
    finally:
        stream.close()
    deadline = time.monotonic() + 3
    while http.get("/healthz").json()["subscribers"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert http.get("/healthz").json()["subscribers"] == 0, "a closed stream was not forgotten"


def test_subscribers_get_only_the_job_or_namespace_they_asked_for(
    live: str, http: httpx.Client, make_report: MakeReport
) -> None:
    by_job = Stream(live, params={"job": "a"})
    by_namespace = Stream(live, params={"namespace": "team-b"})
    both = Stream(live, params={"namespace": "team-a", "job": "a"})
    try:
        token_a = _register(http, "a", namespace="team-a")
        token_b = _register(http, "b", namespace="team-b")
        token_c = _register(http, "c", namespace="team-b")
        for step in (1, 2):
            _report(http, "b", token_b, make_report(step, step, {"loss": 1.0}), namespace="team-b")
            _report(http, "a", token_a, make_report(step, step, {"loss": 1.0}), namespace="team-a")
            _report(http, "c", token_c, make_report(step, step, {"loss": 1.0}), namespace="team-b")
        # updates reach each subscriber in publishing order: once the last one it wants is there, so is the rest
        seen_by_job = by_job.wait_for(lambda es: _points_at(es, "a", 2))
        seen_by_namespace = by_namespace.wait_for(lambda es: _points_at(es, "c", 2))
        seen_by_both = both.wait_for(lambda es: _points_at(es, "a", 2))
    finally:
        for stream in (by_job, by_namespace, both):
            stream.close()
    assert {(e["data"]["namespace"], e["data"]["name"]) for e in seen_by_job} == {("team-a", "a")}
    assert {(e["data"]["namespace"], e["data"]["name"]) for e in seen_by_namespace} == {
        ("team-b", "b"),
        ("team-b", "c"),
    }
    assert [e["id"] for e in seen_by_both] == [e["id"] for e in seen_by_job]
    # registered; a job and a points update per report; the event of the first report (pending -> running)
    assert [e["event"] for e in seen_by_job] == ["job", "job", "points", "event", "job", "points"]


def test_last_event_id_resumes_with_what_was_missed(live: str, http: httpx.Client, make_report: MakeReport) -> None:
    token = _register(http, "resume")
    first = Stream(live, params={"job": "resume"})
    try:
        _report(http, "resume", token, make_report(1, 1, {"loss": 1.0}))
        seen = first.wait_for(lambda es: any(e["event"] == "event" for e in es))  # published after the points
    finally:
        first.close()
    last_id = seen[-1]["id"]
    # while nobody listens: two more reports, and another job's
    _report(http, "resume", token, make_report(2, 2, {"loss": 0.5}))
    _report(http, "resume", token, make_report(3, 3, {"loss": 0.25}))
    _register(http, "someone-else")

    again = Stream(live, params={"job": "resume"}, headers={"Last-Event-ID": str(last_id)})
    by_query = Stream(live, params={"job": "resume", "last_event_id": str(last_id)})
    try:
        missed = again.wait_for(lambda es: _points_at(es, "resume", 3))
        assert by_query.wait_for(lambda es: _points_at(es, "resume", 3)) == missed
        assert all(e["id"] > last_id for e in missed) and "resync" not in {e["event"] for e in missed}
        assert [(e["event"], e["data"].get("points", {}).get("loss", {}).get("step")) for e in missed] == [
            ("job", None),
            ("points", 2),
            ("job", None),
            ("points", 3),
        ]
        # and then it goes on live
        _report(http, "resume", token, make_report(4, 4, {"loss": 0.125}))
        assert again.wait_for(lambda es: _points_at(es, "resume", 4))[-1]["id"] > missed[-1]["id"]
    finally:
        again.close()
        by_query.close()


@pytest.mark.both_stores
def test_points_and_events_on_the_stream_are_what_the_api_reads_back(
    live: str, http: httpx.Client, make_report: MakeReport, clock: Any, backend: str
) -> None:
    """One serialiser per thing on the wire: every point and every event the stream sent (from the report
    route, the health analysis, a command, an acknowledgement, a policy set, the runner's state) equals,
    key for key, the one the history and events endpoints read back, so no reader patches a field in."""
    stream = Stream(live, params={"job": "same"})
    try:
        token = _register(http, "same", total_steps=10)
        auth = {"Authorization": f"Bearer {token}"}
        _report(http, "same", token, make_report(1, 3, {"loss": [0.5, math.nan], "lr": 0.1}))  # running, diverging
        clock.advance(7.5)
        path = "/api/v1/namespaces/default/jobs/same"
        command = http.post(f"{path}/commands", json={"kind": "checkpoint", "reason": "now"}).json()
        assert http.put(f"{path}/policy", json={"on": {"stalled": "notify"}}).status_code == 200
        clock.advance(2.25)
        _report(http, "same", token, make_report(2, 6, {"loss": 0.25}, acks=[command["id"]]))
        clock.advance(1.0)
        response = http.post(f"{path}/state", json={"state": "failed", "exit_code": 3, "reason": "oom"}, headers=auth)
        assert response.status_code == 200, response.text
        seen = stream.wait_for(lambda es: any(e["event"] == "event" and e["data"]["kind"] == "failed" for e in es))
    finally:
        stream.close()

    history = http.get(f"{path}/history", params={"max_points": 1000}).json()["metrics"]
    live_points: dict[str, list[dict[str, Any]]] = {}
    for message in (e["data"] for e in seen if e["event"] == "points"):
        for name, point in message["points"].items():
            assert point["t"] == message["t"]
            live_points.setdefault(name, []).append(point)
    assert live_points == history
    assert history["loss"][0] == {
        "step": 3,
        "first_step": 3,
        "t": START,
        "last": "NaN",
        "min": 0.5,
        "max": 0.5,
        "mean": 0.5,
        "count": 2,
        "nonfinite": 1,
        "windows": 1,
    }

    stored = http.get(f"{path}/events", params={"limit": 1000}).json()["items"]
    sent = [e["data"] for e in seen if e["event"] == "event"]
    assert sent == [e for e in stored if e["kind"] != "registered"]  # registering publishes the job only
    assert [e["kind"] for e in sent] == ["running", "health", "command", "policy_set", "command_acked", "failed"]
    failed = sent[-1]
    assert failed["id"] == stored[-1]["id"] and failed["t"] == START + 10.75
    assert failed["data"] == {"exit_code": 3}


def test_a_resume_from_beyond_the_ring_is_told_to_resync() -> None:
    async def scenario() -> list[str]:
        live = Broadcaster(history=4, queue_size=8, heartbeat=0.01, first_id=1)
        for i in range(10):
            live.publish("job", "ns", f"j{i}", {"i": i})
        stream = live.stream(last_event_id=2)  # ids 3..6 fell out of the ring of 4
        messages = [await stream.__anext__() for _ in range(6)]
        await stream.aclose()
        assert live.subscribers == 0
        return messages

    messages = asyncio.run(scenario())
    assert messages[0] == "retry: 2000\n\n"
    assert messages[1].startswith("event: resync\n")
    assert [m.split("\n")[0] for m in messages[2:]] == ["id: 7", "id: 8", "id: 9", "id: 10"]


def test_a_slow_subscriber_loses_its_oldest_updates_and_is_told_to_resync() -> None:
    async def scenario() -> list[str]:
        live = Broadcaster(queue_size=4, heartbeat=0.01, first_id=1)
        stream = live.stream()
        assert await stream.__anext__() == "retry: 2000\n\n"  # subscribed; now it does not read
        for i in range(10):
            live.publish("points", "ns", "j", {"i": i})
        messages = [await stream.__anext__() for _ in range(5)]
        await stream.aclose()
        return messages

    messages = asyncio.run(scenario())
    assert messages[0].startswith("event: resync\n") and "too slow" in messages[0]
    assert [m.split("\n")[0] for m in messages[1:]] == ["id: 7", "id: 8", "id: 9", "id: 10"]


def test_the_resync_comes_before_the_updates_that_follow_a_gap() -> None:
    async def scenario() -> list[str]:
        live = Broadcaster(queue_size=4, heartbeat=10, first_id=1)
        stream = live.stream()
        assert await stream.__anext__() == "retry: 2000\n\n"
        live.publish("points", "ns", "j", {"i": 0})
        live.publish("points", "ns", "j", {"i": 1})
        first = await stream.__anext__()  # id 1 is being sent: the stream waits at its yield, as on a full socket
        for i in range(2, 12):
            live.publish("points", "ns", "j", {"i": i})  # ids 2..8 fall out of its queue of 4
        messages = [first] + [await stream.__anext__() for _ in range(2)]
        await stream.aclose()
        return messages

    messages = asyncio.run(scenario())
    assert messages[0].startswith("id: 1\n")
    assert messages[1].startswith("event: resync\n"), messages[1]


def test_a_subscriber_that_does_not_read_does_not_hold_up_ingest(
    app: Starlette, serve: Any, make_report: MakeReport
) -> None:
    # queues of 256 updates instead of 1,024, so that 500 reports overflow a stalled one with room to spare
    app.state.services.live = Broadcaster(queue_size=256, heartbeat=0.05)
    # small kernel send buffers: the server's writes to a stream nobody reads block after ~100 KB
    with serve(app, send_buffer=16384) as base, httpx.Client(base_url=base, timeout=5) as http:
        token = _register(http, "busy")
        host, port = base.removeprefix("http://").split(":")
        stalled = socket.create_connection((host, int(port)))
        stalled.sendall(f"GET /api/v1/events HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        try:
            deadline = time.monotonic() + 3
            while http.get("/healthz").json()["subscribers"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            metrics = {f"metric/{i}": float(i) for i in range(5)}
            for seq in range(1, 501):  # 1,000 updates: more than the stalled queue and the buffers hold
                _report(http, "busy", token, make_report(seq, seq, metrics))  # each within the client's 5 s
            assert http.get("/api/v1/namespaces/default/jobs/busy").json()["progress"]["step"] == 500
            assert http.get("/healthz").json()["subscribers"] == 1  # it is still there, just not reading
            # a new subscriber is served at once
            fresh = Stream(base, params={"job": "busy"})
            try:
                _report(http, "busy", token, make_report(501, 501, {"loss": 1.0}))
                fresh.wait_for(lambda es: _points_at(es, "busy", 501))
            finally:
                fresh.close()
            # when the stalled one reads at last, it gets the newest updates and is told that it missed some
            stalled.settimeout(5)
            received = b""
            while b'"step":501' not in received or b"event: resync" not in received:
                chunk = stalled.recv(1 << 16)
                assert chunk, "the stream ended"
                received += chunk
            assert received.count(b"event: points") < 500  # its oldest updates were dropped, not queued
        finally:
            stalled.close()


def test_a_resume_with_an_id_of_the_servers_earlier_life_is_told_to_resync() -> None:
    """A restarted server may publish more updates before a client reconnects than its earlier life had
    (a job reporting 50 times a second, a client waiting 2 s to retry): its ids must still not look like
    a continuation of the earlier ones, or the client would miss the updates below its old id silently."""

    async def scenario() -> tuple[list[str], list[str]]:
        earlier = Broadcaster(heartbeat=0.01)
        old_id = max(earlier.publish("job", "ns", "j", {"i": i}).id for i in range(5))
        await asyncio.sleep(0.001)
        restarted = Broadcaster(heartbeat=0.01)
        for i in range(50):
            restarted.publish("job", "ns", "j", {"i": i})
        resumed = restarted.stream(last_event_id=old_id)
        messages = [await resumed.__anext__() for _ in range(3)]
        await resumed.aclose()
        current = restarted.stream(last_event_id=restarted.first_id + 48)  # one update behind, this life
        same_life = [await current.__anext__() for _ in range(2)]
        await current.aclose()
        return messages, same_life

    messages, same_life = asyncio.run(scenario())
    assert messages[1] == 'event: resync\ndata: {"reason":"the server restarted; read the state again"}\n\n'
    assert messages[2].startswith("id: ")  # then this life's updates, from its first
    assert same_life[1].startswith("id: ")  # one update behind in this life: no resync, the update
