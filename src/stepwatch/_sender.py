"""The sender: one daemon thread that closes windows, sends them, retries, and flushes at the end.

It sleeps on an ``Event`` between reports, so it costs nothing while waiting; every iteration is
guarded (an error is logged once and the thread goes on); if the thread cannot start, reporting is
switched off with one warning. Retries back off exponentially with jitter, honour ``429
Retry-After``, re-read a rotating token file after ``401``/``403``, and drop a report the server
will never accept (other ``4xx``). :meth:`Sender.flush` sends the final state and waits for it, bounded
by a timeout; it is what ``finish()``, interpreter exit and SIGTERM call.

A reporter that never gets through (a server answering 500, a wrong CA, nothing listening) says so:
one warning once ``warn_after`` seconds have passed without any report accepted, and at the flush
one line of what was not delivered. Never more than those two lines.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from ._rate import RateMeter
from ._transport import TokenSource, Transport, TransportError
from ._where import WhereSampler
from ._window import WindowBuffer
from ._wire import Snapshot, Wire
from .protocol import Backoff, Command, parse_retry_after

if TYPE_CHECKING:
    from ._progression import Progression

__all__ = ["Sender"]

_log = logging.getLogger("stepwatch")

_BACKOFF: Final = Backoff(base=1.0, cap=30.0, jitter="equal")
"""1, 2, 4 ... 30 s between retries, each somewhere between half of that and all of it."""
_RETRY_AFTER_CAP: Final = 600.0
"""The longest a ``Retry-After`` holds the sender back (a longer one is a server's mistake)."""
_FLUSH_RETRY: Final = 0.25
_FINAL_COLLECT_WAIT: Final = 1.0
"""How long ``flush`` waits for the thread's final collect before it ends the progression status itself."""
_MAX_SENDS_PER_CYCLE: Final = 16


class Sender:
    """Closes a window every ``interval`` seconds and delivers it through a wire mode."""

    def __init__(
        self,
        *,
        wire: Wire,
        transport: Transport,
        buffer: WindowBuffer | None,
        snapshot: Callable[[], Snapshot],
        on_command: Callable[[Command], None],
        token: TokenSource,
        interval: float,
        request_timeout: float,
        clock: Callable[[], float] = time.monotonic,
        random_fraction: Callable[[], float] = random.random,
        user_agent: str = "stepwatch",
        registration: Callable[[], tuple[str, bytes]] | None = None,
        min_gap: float = 0.0,
        warn_after: float = 30.0,
        progression: Progression | None = None,
        where: WhereSampler | None = None,
        standing_interval: float | None = None,
    ) -> None:
        self.wire = wire
        self.transport = transport
        self.buffer = buffer
        self.interval = interval
        self.request_timeout = request_timeout
        self.rate = RateMeter()
        self._snapshot = snapshot
        self._on_command = on_command
        self._token = token
        self._clock = clock
        self._random = random_fraction
        self._user_agent = user_agent
        self._registration = registration if token.missing else None
        self._min_gap = min_gap
        self._warn_after = warn_after
        self.progression = progression
        """Where each collected status also goes: OpenShift AI's progression endpoint (rank 0), if served."""
        self.where = where
        """Reads where the rank stands while its step stands, and the shares of its activities (:mod:`._where`)."""
        self._standing_interval = min(interval, standing_interval or interval)
        """How often a rank whose step stands reports (a heartbeating rank: as often as rank 0, not 5x less)."""
        self._collected_at = -1e18
        self._accepted_at: float | None = None
        """When a report was last accepted (``None``: since the start, none)."""
        self._started_at = 0.0
        self.failures = 0
        """Requests that failed (no answer, 5xx, 404, 408, 429, a refused token), for the summary."""
        self._last_request = -1e18
        self._posted_at = -1e18
        """When a cycle last sent (or tried to): the next waits ``min_gap`` after it."""
        self._not_before = 0.0
        """Set by Retry-After: no request before this, the final flush included."""
        self.rejected = 0
        """Reports the server refused for good (4xx other than auth and rate limits)."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_report = 0.0
        self._retry_at = 0.0
        self._failures = 0
        self._final_deadline: float | None = None
        self._final_snapshot: Snapshot | None = None
        self._warned: set[str] = set()
        self.sent = 0
        """Bodies the server accepted."""
        self.finished = False
        """The thread has ended (its final flush done or given up): a plain flag, read without a lock
        by the SIGTERM handler, which must not wait on an ``Event`` the code it interrupted may hold."""
        self.last_error: str | None = None
        """The last reason a request failed, for diagnostics."""

    # ------------------------------------------------------------------------------------ lifecycle

    def start(self) -> bool:
        """Start the daemon thread; ``False`` (with one warning) when it cannot be started."""
        self._thread = threading.Thread(target=self._loop, name="stepwatch-sender", daemon=True)
        try:
            self._thread.start()
        except RuntimeError as exc:  # e.g. "can't start new thread" under a thread limit
            _log.warning("stepwatch: cannot start the sender thread (%s); reporting is off", exc)
            self._thread = None
            return False
        return True

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def wake(self) -> None:
        """Ask for a cycle now (the hot path calls this when its queue is long)."""
        self._wake.set()

    def flush(self, final: Snapshot, timeout: float) -> bool:
        """Send ``final`` (and everything before it) and stop; ``True`` when it was delivered in time."""
        if not self.alive:
            if self.progression is not None:  # the thread is gone: the termination message is written here
                self.progression.collect([], final)
            return False
        self._final_deadline = self._clock() + timeout
        self._final_snapshot = final
        rejected_before = self.rejected
        self._stop.set()
        self._wake.set()
        progression = self.progression
        if progression is not None and not self._done.wait(min(timeout, _FINAL_COLLECT_WAIT)):
            # the thread is held up (a request to a server that does not answer): the final progression
            # status and its termination message go out from here, with the metrics last collected
            progression.collect([], final)
        delivered = self._done.wait(timeout + 0.5) and self.wire.pending() is None
        if not delivered or self.rejected:
            self._summary(delivered, timeout)
        return delivered and self.rejected == rejected_before

    def _summary(self, delivered: bool, timeout: float) -> None:
        """One line of what did not reach the server (said at the flush, when something did not)."""
        parts = [f"{self.sent} report(s) accepted"]
        if self.rejected:
            parts.append(f"{self.rejected} refused by the server and dropped")
        if self.failures:
            parts.append(f"{self.failures} failed request(s)")
        if not delivered:
            parts.append(f"the final report not delivered within {timeout:.1f} s")
        last = f" (last error: {self.last_error})" if self.last_error else ""
        _log.warning("stepwatch: not everything reached %s: %s%s", self.wire.url, ", ".join(parts), last)

    def abandon(self) -> None:
        """Stop without sending (a forked child, a disabled run)."""
        self._stop.set()
        self._final_deadline = self._clock()
        self._wake.set()

    # ----------------------------------------------------------------------------------------- loop

    def _loop(self) -> None:
        self._next_report = self._started_at = self._clock()  # the first report goes out at once: the job appears
        while True:
            now = self._clock()
            due = self._next_report
            if self._retry_at > now:
                due = min(due, self._retry_at)
            if self.where is not None and self.where.enabled:
                due = min(due, self.where.next_due())  # ~1 Hz: watch the step, read the stack while it stands
            wait = due - now
            if not self._stop.is_set() and wait > 0:
                self._wake.wait(wait)
            self._wake.clear()
            try:
                if self._stop.is_set():
                    self._final_cycle()
                    break
                self._cycle()
            except Exception as exc:  # never let one bad cycle end the thread
                self._warn_once("cycle", "stepwatch: a reporting cycle failed (%s); going on", exc)
        self.finished = True
        self._done.set()
        try:
            self.transport.close()
        except Exception:
            pass

    def _cycle(self) -> None:
        now = self._clock()
        where = self.where
        if where is not None and where.enabled:
            if where.tick(now):  # a step has just begun to stand: say where at once (the server has 45 s)
                self._next_report = now
            elif where.standing:
                self._next_report = min(self._next_report, self._collected_at + self._standing_interval)
        if now >= self._next_report:
            self._next_report = now + self.interval
            self._collect(now, None)
        elif self.buffer is not None:
            self.buffer.drain()  # woken early (a long queue, a retry): fold it, keep the window open
        # min_gap: a Kubeflow endpoint takes a status every 5 s at most, while the cycles (and the progression
        # status they serve) may come every 2 s; measured between cycles, so a 5 s interval posts every 5 s
        if now >= self._retry_at and now - self._posted_at >= self._min_gap:
            self._posted_at = now
            self._send_pending(deadline=None)

    def _final_cycle(self) -> None:
        deadline = self._final_deadline if self._final_deadline is not None else self._clock()
        if self._final_snapshot is None:
            return
        self._collect(self._clock(), self._final_snapshot)
        while self._clock() < deadline:
            early = self._not_before - self._clock()
            if early > 0:  # the server said when to come back
                time.sleep(min(early, max(deadline - self._clock(), 0.0)))
                continue
            if self._send_pending(deadline=deadline):
                return
            now = self._clock()
            pause = min(max(self._retry_at - now, 0.0), _FLUSH_RETRY)
            pause = min(max(pause, self._not_before - now), deadline - now)  # Retry-After holds here too
            if pause > 0:
                time.sleep(pause)

    def _collect(self, now: float, final: Snapshot | None) -> None:
        self._collected_at = now
        windows = self.buffer.take() if self.buffer is not None else []
        snapshot = final if final is not None else self._snapshot()
        where = self.where
        if where is not None and final is None and where.enabled:
            snapshot = dataclasses.replace(snapshot, where=where.reading(), activity_shares=where.take_shares())
        self.rate.add(now, snapshot.progress.step)
        snapshot = self._with_rates(snapshot)
        if self.progression is not None:  # first: at the end this writes the termination message, before any send
            self.progression.collect(windows, snapshot)
        self.wire.collect(windows, snapshot)

    def _with_rates(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with the recent pace: steps/s, samples/s, seconds per step, ETA."""
        rate = self.rate.steps_per_second()
        if not rate:
            return snapshot
        p = snapshot.progress
        progress = dataclasses.replace(
            p,
            steps_per_second=rate,
            samples_per_second=rate * p.samples / p.step if p.samples is not None and p.step else None,
            step_time=1.0 / rate,
            eta_seconds=self.rate.eta_seconds(p.step, p.total_steps),
        )
        return dataclasses.replace(snapshot, progress=progress)

    # ----------------------------------------------------------------------------------------- send

    def _send_pending(self, deadline: float | None) -> bool:
        """Send what is pending; ``True`` when nothing is left."""
        if self._registration is not None and not self._register(deadline):
            return False
        for _ in range(_MAX_SENDS_PER_CYCLE):
            body = self.wire.pending()
            if body is None:
                return True
            timeout = self.request_timeout
            if deadline is not None:
                timeout = min(timeout, max(deadline - self._clock(), 0.05))
            if not self._send(body, timeout):
                return False
        return self.wire.pending() is None

    def _register(self, deadline: float | None) -> bool:
        """A job nobody registered registers itself first and reports with the token it gets."""
        assert self._registration is not None
        url, body = self._registration()
        timeout = (
            self.request_timeout if deadline is None else min(self.request_timeout, max(deadline - self._clock(), 0.05))
        )
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": self._user_agent}
        try:
            self._last_request = self._clock()
            response = self.transport.request("POST", url, headers=headers, body=body, timeout=timeout)
        except TransportError as exc:
            self._failed(f"{url} unreachable: {exc}")
            return False
        if response.status == 201:
            try:
                token = json.loads(response.body)["token"]
            except (ValueError, KeyError, TypeError):
                token = None
            if isinstance(token, str) and token:
                self._token.set(token)
                self._registration = None
                return True
        if response.status == 429 or response.status >= 500:
            self._failed(f"registration answered {response.status}", retry_after=_retry_after(response.headers))
            return False
        self._registration = None  # the server does not register jobs this way: report without a token
        self._warn_once(
            "register",
            "stepwatch: the job could not register itself (%s)%s; set STEPWATCH_TOKEN or start it with `stepwatch run`",
            response.status,
            _detail(response.body),
        )
        return True

    def _send(self, body: bytes, timeout: float) -> bool:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": self._user_agent,
            **self._token.header(),
        }
        if self._token.error:
            self._warn_once("token", "stepwatch: %s", self._token.error)
        try:
            self._last_request = self._clock()
            response = self.transport.request("POST", self.wire.url, headers=headers, body=body, timeout=timeout)
        except TransportError as exc:
            self._failed(f"{self.wire.url} unreachable: {exc}")
            return False
        status = response.status
        if 200 <= status < 300:
            self._failures = 0
            self._retry_at = 0.0
            self.sent += 1
            self._accepted_at = self._clock()
            for command in self.wire.accepted(response.body):
                self._on_command(command)
            return True
        detail = _detail(response.body)
        if status == 429:
            self._failed(f"rate limited (429){detail}", retry_after=_retry_after(response.headers))
        elif status in (401, 403):
            self._token.invalidate()
            self._warn_once(
                "auth", "stepwatch: the server refused the token (%s)%s; retrying with backoff", status, detail
            )
            self._failed(f"token refused ({status}){detail}")
        elif status in (404, 408) or status >= 500:
            if status == 404:
                self._warn_once("404", "stepwatch: %s answered 404%s; retrying with backoff", self.wire.url, detail)
            self._failed(f"server answered {status}{detail}")
        else:
            self._warn_once(
                f"reject{status}", "stepwatch: the server rejected a report (%s)%s; it is dropped", status, detail
            )
            self.wire.rejected()
            self.rejected += 1
            self.last_error = f"report refused ({status}){detail}"
            self._warn_if_silent()
            return True
        return False

    def _failed(self, why: str, retry_after: float | None = None) -> None:
        self.last_error = why
        self._failures += 1
        self.failures += 1
        self._warn_if_silent()
        delay = _BACKOFF.delay(self._failures, self._random)
        now = self._clock()
        if retry_after is not None:  # the server's word is a floor: the backoff may still wait longer
            delay = max(delay, retry_after)
            self._not_before = now + retry_after
        delay = max(delay, self._last_request + self._min_gap - now)
        self._retry_at = now + delay
        if self._failures == 1:
            _log.info("stepwatch: %s; retrying in %.1f s", why, delay)

    def _warn_if_silent(self) -> None:
        """Warn once when nothing was accepted for ``warn_after`` seconds (since the start, or the last success)."""
        since = self._accepted_at if self._accepted_at is not None else self._started_at
        silent = self._clock() - since
        if silent >= self._warn_after:
            self._warn_once(
                "silent",
                "stepwatch: nothing sent to %s was accepted for %.0f s (last error: %s); training goes on, "
                "reports are kept and retried",
                self.wire.url,
                silent,
                self.last_error,
            )

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _log.warning(message, *args)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    return parse_retry_after(headers.get("retry-after"), cap=_RETRY_AFTER_CAP)


def _detail(body: bytes) -> str:
    text = body[:300].decode("utf-8", "replace").strip()
    return f": {text}" if text else ""
