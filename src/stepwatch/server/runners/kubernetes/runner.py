"""The TrainJob runner at work: watch TrainJobs, decide (:func:`.reconcile.reconcile`), act.

One thread per watched scope (the whole cluster, or each selected namespace) lists the TrainJobs, then
watches from the list's resourceVersion (bookmarks keep that version fresh while nothing changes); a
dropped watch resumes from the last version seen, and one too old to resume from (410 Gone) lists
again. Decisions are level-based (each looks at the whole observed state), so an event seen twice is
harmless and a missed one is made up by the next list.

On the event loop, each TrainJob that changed (its object, its stepwatch job, a command for it, or a
deadline it asked for) is decided again. What it asks of stepwatch's store is done at once; what it
asks of the API server goes to a few writer tasks through one token bucket (``writes_per_s`` for all
writes together), the newest wish per TrainJob replacing an older one still waiting. A failed write
is not forgotten: the job is decided again after a backoff, and since "what was written" only moves
when a write succeeds, the next decision asks for it again (409: the TrainJob is read again first).

In ``poll`` mode, polls of pods (:mod:`.polling`) run as tasks of their own, at most
``max_concurrent_polls`` at once, one at a time per TrainJob; each writes OpenShift AI's annotation (server-side
apply without force, so that a field another manager owns is a conflict, never taken over) and stores what
it read as history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ....protocol import Backoff, parse_rfc3339
from ....protocol.progression import AnnotationStatus, encode_annotation
from ...ingest.service import ingest_status
from ...live.publish import publish_events, publish_job
from ...services import Services
from ...store import Event, Job, JobFilter
from ...store.access import hash_token
from ...store.offload import blocking
from .api import KubeApi, KubeError
from .networkpolicy import network_policy_name
from .objects import ANNOTATION, RuntimeSize, TrainJob, parse_trainjob, runtime_size
from .polling import Poller, PollError
from .progression import FINAL_RETRY_S, Poll, PollState, status_from_annotation
from .ratelimit import TokenBucket
from .reconcile import (
    Action,
    Config,
    Delete,
    EnsureNetworkPolicy,
    FetchRuntime,
    Mirror,
    Observed,
    QueueCommand,
    Register,
    Requeue,
    SetState,
    StopRequest,
    Suspend,
    WriteStatus,
    reconcile,
    stored_already,
)

__all__ = ["RunnerOptions", "TrainJobRunner"]

_log = logging.getLogger("stepwatch.server.kubernetes")

WATCH_BACKOFF = Backoff(base=0.5, cap=30.0, jitter="equal")
"""Before watching TrainJobs again after a failure: replicas that lost the API server together do not
come back in step (0.25-0.5 s, doubling to 15-30 s)."""
WRITE_BACKOFF = Backoff(base=0.5, cap=30.0, jitter="none")
"""Before deciding a TrainJob again after a failed write, unless the API server said when (Retry-After):
0.5 s doubling to 30 s, exactly, so that a job's writes keep their order of attempts."""

Key = tuple[str, str]


@dataclass(frozen=True)
class RunnerOptions:
    """How the runner runs (decisions' knobs are in ``config``)."""

    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty: every namespace."""
    config: Config = field(default_factory=Config)
    writes_per_s: float = 20.0
    """API writes per second, all TrainJobs together."""
    write_annotation: bool = True
    """Also write OpenShift AI's annotation for jobs that report to stepwatch."""
    watch_timeout_s: int = 300
    poll_s: float = 1.0
    """How often the store is read for changed jobs and new commands."""
    runtime_ttl_s: float = 300.0
    writers: int = 4
    max_concurrent_polls: int = 32
    """``poll`` mode: pods polled at once, all TrainJobs together (each poll takes at most 2 s of HTTP)."""


@dataclass
class _Seen:
    """What the runner keeps per TrainJob between decisions."""

    trainjob: TrainJob | None = None
    last_write_at: float | None = None
    written: str | None = None
    mirrored: str | None = None
    due_at: float | None = None
    failures: int = 0
    retry_at: float = 0.0
    """After a failed write, no write before this (the backoff)."""
    changes: list[dict[str, Any]] = field(default_factory=list)
    """Each ``status.trainerStatus`` another manager wrote that the watch showed since the last mirror,
    oldest first: a status that changed twice between two decisions is history twice, not only its last value."""
    annotation_changes: list[str] = field(default_factory=list)
    """Likewise each OpenShift AI annotation another manager wrote."""
    poll: PollState = field(default_factory=PollState)
    network_policy: str | None = None
    """The fingerprint of the NetworkPolicy last made sure of (``poll`` mode)."""


MAX_CHANGES = 256
"""Unmirrored values of ``status.trainerStatus`` (and of the annotation) kept per TrainJob (the oldest go
first beyond it)."""


class TrainJobRunner:
    """Watches TrainJobs and keeps stepwatch and them in step (see the module docstring)."""

    def __init__(
        self,
        api: KubeApi,
        services: Services,
        options: RunnerOptions | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.api = api
        self.svc = services
        self.options = options or RunnerOptions()
        self.clock = clock or services.clock
        self.seen: dict[Key, _Seen] = {}
        self.jobs: dict[Key, Job] = {}
        self.stops: dict[int, StopRequest] = {}
        self.checkpoints: dict[int, float] = {}
        self.runtimes: dict[tuple[str, str, str], tuple[float, RuntimeSize]] = {}
        self.dirty: set[Key] = set()
        self.writes: dict[Key, list[Action]] = {}
        self.in_flight: set[Key] = set()
        """TrainJobs whose writes are being carried out: decided again when they end, not written twice at once."""
        self.write_order: asyncio.Queue[Key] | None = None
        self.bucket = TokenBucket(self.options.writes_per_s, 1.0)  # no saved-up burst: at most the rate in any second
        self.stats = {
            "decisions": 0,
            "writes": 0,
            "write_errors": 0,
            "lists": 0,
            "watch_events": 0,
            "mirrored": 0,
            "polls": 0,
            "polled": 0,
            "poll_errors": 0,
        }
        self.poller = Poller(api, self.options.max_concurrent_polls)
        self._polls: set[asyncio.Task[None]] = set()
        self._events_after = 0
        self._inbox: asyncio.Queue[tuple[str, Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._threads: list[threading.Thread] = []
        self._synced: set[str | None] = set()
        self.ready = asyncio.Event()
        """Set once every scope has been listed and the store read."""

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """Start watching and acting (returns at once)."""
        self._loop = asyncio.get_running_loop()
        self._inbox = asyncio.Queue()
        self.write_order = asyncio.Queue()
        scopes: Sequence[str | None] = self.options.namespaces or (None,)
        for scope in scopes:
            thread = threading.Thread(
                target=self._watch_forever, args=(scope,), daemon=True, name=f"trainjobs-{scope or 'all'}"
            )
            thread.start()
            self._threads.append(thread)
        self._tasks.append(asyncio.create_task(self._decide_forever()))
        self._tasks += [asyncio.create_task(self._write_forever()) for _ in range(self.options.writers)]

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Stop; the watch threads end with their current request.

        The loops also look at the stop flag: before Python 3.12, ``asyncio.wait_for`` can swallow a
        cancellation that arrives as its awaitable completes, and a loop that only waited to be
        cancelled would then run on (and this would wait for it for good)."""
        self._stop.set()
        tasks, self._tasks = self._tasks, []
        deadline = time.monotonic() + timeout_s
        while tasks and time.monotonic() < deadline:
            for task in tasks:
                task.cancel()
            _, pending = await asyncio.wait(tasks, timeout=0.5)
            tasks = list(pending)
        if tasks:
            _log.warning("%d TrainJob runner task(s) did not stop within %.0f s", len(tasks), timeout_s)
        polls = list(self._polls)
        for task in polls:
            task.cancel()
        if polls:
            await asyncio.wait(polls, timeout=max(deadline - time.monotonic(), 0.1))
        await self.poller.aclose()

    # ------------------------------------------------------------------ watching (threads)

    def _post(self, kind: str, payload: Any) -> None:
        loop, inbox = self._loop, self._inbox
        if loop is not None and inbox is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop is closing
                loop.call_soon_threadsafe(inbox.put_nowait, (kind, payload))

    def _watch_forever(self, namespace: str | None) -> None:
        version: str | None = None
        failures = 0
        while not self._stop.is_set():
            try:
                if version is None:
                    items, version = self.api.list_trainjobs(namespace)
                    self.stats["lists"] += 1
                    self._post("sync", (namespace, items))
                for kind, obj in self.api.watch_trainjobs(namespace, version, self.options.watch_timeout_s):
                    if self._stop.is_set():
                        return
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.stats["watch_events"] += 1
                        self._post(kind, obj)
                failures = 0
            except KubeError as exc:
                if exc.status == 410:  # too old to resume from: list again (the sync replaces what we knew)
                    _log.info("TrainJob watch of %s expired (410): listing again", namespace or "all namespaces")
                    version = None
                    continue
                failures += 1
                wait = exc.retry_after or WATCH_BACKOFF.delay(failures)
                _log.warning(
                    "TrainJob watch of %s failed (%s); again in %.1f s", namespace or "all namespaces", exc, wait
                )
                self._stop.wait(wait)
            except Exception:
                failures += 1
                wait = WATCH_BACKOFF.delay(failures)
                _log.exception("TrainJob watch of %s failed; again in %.1f s", namespace or "all namespaces", wait)
                self._stop.wait(wait)

    # ------------------------------------------------------------------ deciding (event loop)

    def _take(self, kind: str, payload: Any) -> None:
        if kind == "sync":
            scope, items = payload
            fresh = {}
            for obj in items:
                parsed = parse_trainjob(obj)
                fresh[parsed.key] = parsed
            for key, seen in self.seen.items():
                if (scope is None or key[0] == scope) and key not in fresh and seen.trainjob is not None:
                    seen.trainjob = None  # deleted while we were not watching
                    self.dirty.add(key)
            for parsed in fresh.values():
                self._observe(parsed)
            self._synced.add(scope)
            return
        parsed = parse_trainjob(payload)
        if kind == "DELETED":
            seen = self.seen.setdefault(parsed.key, _Seen())
            seen.trainjob = None
            self.dirty.add(parsed.key)
        else:
            self._observe(parsed)

    def _observe(self, parsed: TrainJob) -> None:
        seen = self.seen.setdefault(parsed.key, _Seen())
        old = seen.trainjob
        if old is not None and old.uid == parsed.uid and _newer(old.resource_version, parsed.resource_version):
            return  # an older copy (a write's answer raced the watch)
        if old is None or old != parsed:
            seen.trainjob = parsed
            self.dirty.add(parsed.key)
            manager = {self.options.config.field_manager}
            _keep_change(
                seen.changes,
                parsed.trainer_status,
                old.trainer_status if old is not None else None,
                bool(parsed.status_owners - manager),
            )
            _keep_change(
                seen.annotation_changes,
                parsed.annotation,
                old.annotation if old is not None else None,
                bool(parsed.annotation_owners - manager),
            )

    async def _read_store(self) -> None:
        store = self.svc.store
        while True:
            events = await blocking(store.events, after=self._events_after, limit=1000)
            for event in events:
                self._events_after = max(self._events_after, event.id)
                if event.kind != "command":
                    continue
                kind = event.data.get("kind")
                if kind == "stop" and event.job_id not in self.stops:
                    checkpoint = self.checkpoints.get(event.job_id)
                    self.stops[event.job_id] = StopRequest(
                        event.t,
                        str(event.data.get("reason") or ""),
                        checkpoint if checkpoint and checkpoint >= event.t - 60 else None,
                    )
                elif kind == "checkpoint":
                    self.checkpoints[event.job_id] = event.t
                    stop = self.stops.get(event.job_id)
                    if stop is not None and stop.checkpoint_at is None and event.t >= stop.at - 60:
                        self.stops[event.job_id] = replace(stop, checkpoint_at=event.t)
                self.dirty.add((event.namespace, event.name))
            if len(events) < 1000:
                break
        namespaces = self.options.namespaces or (None,)
        for namespace in namespaces:
            for job in await blocking(store.jobs, JobFilter(namespace=namespace, limit=100_000, sort="updated")):
                key = (job.namespace, job.name)
                if self.jobs.get(key) != job:
                    self.jobs[key] = job
                    self.dirty.add(key)

    async def _decide_forever(self) -> None:
        assert self._inbox is not None
        next_poll = 0.0
        while not self._stop.is_set():
            try:
                timeout = max(0.0, min(next_poll - time.monotonic(), self._next_due() - self.clock()))
                with contextlib.suppress(asyncio.TimeoutError):
                    kind, payload = await asyncio.wait_for(self._inbox.get(), timeout=min(timeout, self.options.poll_s))
                    self._take(kind, payload)
                while not self._inbox.empty():
                    kind, payload = self._inbox.get_nowait()
                    self._take(kind, payload)
                if time.monotonic() >= next_poll:
                    await self._read_store()
                    next_poll = time.monotonic() + self.options.poll_s
                    if len(self._synced) == len(self.options.namespaces or (None,)):
                        self.ready.set()
                now = self.clock()
                for key, seen in self.seen.items():
                    if seen.due_at is not None and seen.due_at <= now:
                        seen.due_at = None
                        self.dirty.add(key)
                dirty, self.dirty = self.dirty, set()
                for key in sorted(dirty):
                    await self._decide(key)
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("the TrainJob runner's decision loop failed; going on")
                await asyncio.sleep(1.0)

    def _next_due(self) -> float:
        dues = [s.due_at for s in self.seen.values() if s.due_at is not None]
        return min(dues) if dues else self.clock() + 3600

    def _observed(self, key: Key) -> Observed:
        seen = self.seen.setdefault(key, _Seen())
        tj = seen.trainjob
        job = self.jobs.get(key)
        size = None
        if tj is not None and tj.runtime_name:
            cached = self.runtimes.get(
                (tj.runtime_kind, tj.namespace if tj.runtime_kind == "TrainingRuntime" else "", tj.runtime_name)
            )
            if cached is not None and cached[0] > self.clock():
                size = cached[1]
        return Observed(
            now=self.clock(),
            trainjob=tj,
            job=job,
            config=self.options.config,
            size=size,
            stop=self.stops.get(job.id) if job is not None else None,
            last_write_at=seen.last_write_at,
            written=seen.written,
            mirrored=seen.mirrored,
            changes=tuple(seen.changes),
            annotation_changes=tuple(seen.annotation_changes),
            poll=seen.poll,
            network_policy=seen.network_policy,
        )

    async def _decide(self, key: Key, depth: int = 0) -> None:
        if key not in self.seen or (self.seen[key].trainjob is None and key not in self.jobs):
            return  # a stepwatch job that is no TrainJob of ours (local, native)
        if self.seen[key].trainjob is None and not self._synced_scope(key[0]):
            return  # not listed yet: cannot tell "gone" from "not seen yet"
        observed = self._observed(key)
        actions = reconcile(observed)
        self.stats["decisions"] += 1
        again = False
        mirrored_all = True
        api_actions: list[Action] = []
        for action in actions:
            if isinstance(action, Requeue):
                self._due(key, action.at)
            elif isinstance(action, (WriteStatus, Suspend, Delete, EnsureNetworkPolicy)):
                api_actions.append(action)
            elif isinstance(action, Poll):
                self._start_poll(key, observed, action)
            elif isinstance(action, Mirror):
                if mirrored_all:  # in order: after a failure, the rest waits for the next decision
                    await self._do(key, observed, action)
                    mirrored_all = self.seen[key].mirrored == action.fingerprint
            else:
                again |= await self._do(key, observed, action)
        seen = self.seen[key]
        if mirrored_all:  # (else kept: the next decision skips what was stored, by time and content)
            del seen.changes[: len(observed.changes)]
            del seen.annotation_changes[: len(observed.annotation_changes)]
        if api_actions and key not in self.in_flight and observed.now >= seen.retry_at:
            # (else decided again when those writes end, or when the backoff does)
            self._queue_writes(key, api_actions)
        if again and depth < 3:
            await self._decide(key, depth + 1)

    def _synced_scope(self, namespace: str) -> bool:
        return None in self._synced or namespace in self._synced

    def _due(self, key: Key, at: float) -> None:
        seen = self.seen.setdefault(key, _Seen())
        seen.due_at = at if seen.due_at is None else min(seen.due_at, at)

    # ------------------------------------------------------------------ store actions

    async def _do(self, key: Key, observed: Observed, action: Action) -> bool:
        """Carry out a store action; whether to decide again at once."""
        svc = self.svc
        now = self.clock()
        job = observed.job
        try:
            if isinstance(action, Register):
                return await self._register(key, action, now)
            if isinstance(action, FetchRuntime):
                await self._fetch_runtime(action)
                return True
            assert job is not None
            if isinstance(action, SetState):
                fresh, events = await blocking(
                    svc.store.with_events, svc.store.set_state, job, action.state, now, action.reason
                )
                fresh = await svc.policies.review(fresh, now)
                self._publish(fresh, now, events)
            elif isinstance(action, Mirror):
                fresh = await ingest_status(svc, job, action.status, action.at)  # as the endpoint, at its own time
                self.seen[key].mirrored = action.fingerprint
                self.stats["mirrored"] += 1
                self.jobs[key] = fresh
            elif isinstance(action, QueueCommand):
                _, events = await blocking(
                    svc.store.with_events, svc.store.add_command, job, action.command, action.reason, now
                )
                self.checkpoints[job.id] = now
                stop = self.stops.get(job.id)
                if stop is not None and action.command == "checkpoint":
                    self.stops[job.id] = replace(stop, checkpoint_at=now)
                publish_events(svc.live, events)
                return False
            else:
                return False
        except Exception:
            _log.exception("the runner could not %s for TrainJob %s/%s", action.kind, *key)
            self._due(key, now + 5.0)
            return False
        return False

    async def _register(self, key: Key, action: Register, now: float) -> bool:
        svc = self.svc
        price = svc.prices.price(action.namespace, action.gpu_type) if action.gpus else 0.0
        try:
            job = await blocking(
                svc.store.register,
                action.namespace,
                action.name,
                token_hash=hash_token(secrets.token_urlsafe(32)),  # pods write with their ServiceAccount tokens
                now=now,
                gpus=action.gpus,
                gpu_hour_cost=price,
                gpu_type=action.gpu_type,
                source="kubeflow",
            )
        except KeyError:  # a live attempt appeared meanwhile (a report registered it): take that one
            found = await blocking(svc.store.job, action.namespace, action.name)
            if found is None:
                return False
            job = found
        self.jobs[key] = job
        self._publish(job, now)
        return True

    async def _fetch_runtime(self, action: FetchRuntime) -> None:
        namespace = action.namespace if action.runtime_kind == "TrainingRuntime" else ""
        size = RuntimeSize()
        try:
            found = await asyncio.to_thread(self.api.get_runtime, action.runtime_kind, action.name, action.namespace)
            if found is not None:
                size = runtime_size(found)
            else:
                _log.warning("runtime %s %s not found: its jobs count no GPUs", action.runtime_kind, action.name)
        except KubeError as exc:
            _log.warning(
                "could not read runtime %s %s (%s): its jobs count no GPUs for now",
                action.runtime_kind,
                action.name,
                exc,
            )
            self.runtimes[(action.runtime_kind, namespace, action.name)] = (self.clock() + 30.0, size)
            return
        self.runtimes[(action.runtime_kind, namespace, action.name)] = (self.clock() + self.options.runtime_ttl_s, size)

    def _publish(self, job: Job, now: float, events: Sequence[Event] = ()) -> None:
        self.jobs[(job.namespace, job.name)] = job
        publish_job(self.svc.live, job, now)
        publish_events(self.svc.live, events)

    # ------------------------------------------------------------------ polls (poll mode)

    def _start_poll(self, key: Key, observed: Observed, action: Poll) -> None:
        """Poll in a task of its own (the decisions go on); one at a time per TrainJob."""
        seen = self.seen[key]
        if observed.trainjob is None or observed.job is None or seen.poll.polling:
            return
        seen.poll = replace(seen.poll, polling=True)
        task = asyncio.create_task(self._poll(key, observed.trainjob, action))
        self._polls.add(task)
        task.add_done_callback(self._polls.discard)

    async def _poll(self, key: Key, tj: TrainJob, action: Poll) -> None:
        """One poll, or the capture of the end: the annotation written and stored. A failure leaves the
        annotation as it is (the next poll comes after the interval, the next capture of the end after 5 s)."""
        self.stats["polls"] += 1
        done = failed = False
        try:
            annotation = await self.poller.poll(tj, action, self.clock())
            if annotation is not None:
                await self._write_poll(key, annotation)
            done = action.final
        except PollError as exc:
            failed = True
            self.stats["poll_errors"] += 1
            _log.debug("polling TrainJob %s/%s: %s", *key, exc)  # (the controller logs it at V(1))
        except KubeError as exc:
            failed = True
            self.stats["write_errors"] += 1
            _log.warning("writing the polled progress of TrainJob %s/%s failed (%s)", *key, exc)
            if exc.status == 409:  # another manager's annotation: read it again, only observe it from now on
                await self._refresh(key)
        except Exception:
            failed = True
            self.stats["poll_errors"] += 1
            _log.exception("polling TrainJob %s/%s failed", *key)
        finally:
            seen = self.seen.setdefault(key, _Seen())
            now = self.clock()
            seen.poll = replace(
                seen.poll,
                polling=False,
                last_poll_at=now,
                final_done=seen.poll.final_done or done,
                retry_at=now + FINAL_RETRY_S if action.final and failed else seen.poll.retry_at,
            )
            self.dirty.add(key)

    async def _write_poll(self, key: Key, annotation: AnnotationStatus) -> None:
        """Write the annotation as Red Hat's controller writes it, then store it as the job's progress and
        history at its own time (the same reading as a foreign annotation's, :func:`.status_from_annotation`)."""
        namespace, name = key
        text = encode_annotation(annotation)
        await self.bucket.take()
        obj = await asyncio.to_thread(
            self.api.apply_annotation, namespace, name, ANNOTATION, text, self.options.config.field_manager, False
        )
        self.stats["writes"] += 1
        self._observe(parse_trainjob(obj))
        status = status_from_annotation(text)
        job = self.jobs.get(key)
        if status is None or job is None or stored_already(job, status):
            return  # (stored already: a restarted runner's first poll within the second of the last one)
        at = min(parse_rfc3339(annotation.last_updated_time), self.clock())
        self.jobs[key] = await ingest_status(self.svc, job, status, at)
        self.stats["polled"] += 1

    # ------------------------------------------------------------------ API writes

    def _queue_writes(self, key: Key, actions: list[Action]) -> None:
        assert self.write_order is not None
        if key not in self.writes:
            self.write_order.put_nowait(key)
        self.writes[key] = actions  # the newest wish replaces one still waiting

    async def _write_forever(self) -> None:
        assert self.write_order is not None
        while not self._stop.is_set():
            key = await self.write_order.get()
            actions = self.writes.pop(key, None)
            if not actions:
                continue
            self.in_flight.add(key)
            try:
                await self._write_all(key, actions)
            finally:
                self.in_flight.discard(key)

    async def _write_all(self, key: Key, actions: list[Action]) -> None:
        """Carry out one TrainJob's writes in order; the first failure ends them (decided again after a backoff)."""
        for action in actions:
            try:
                await self._write(key, action)
                self.seen[key].failures = 0
            except KubeError as exc:
                self.stats["write_errors"] += 1
                seen = self.seen.setdefault(key, _Seen())
                seen.failures += 1
                wait = exc.retry_after or WRITE_BACKOFF.delay(seen.failures)
                _log.warning("%s of TrainJob %s/%s failed (%s); deciding again in %.1f s", action.kind, *key, exc, wait)
                if exc.status == 409:
                    await self._refresh(key)
                seen.retry_at = self.clock() + wait
                self._due(key, seen.retry_at)
                break
            except Exception:
                self.stats["write_errors"] += 1
                _log.exception("%s of TrainJob %s/%s failed", action.kind, *key)
                seen = self.seen.setdefault(key, _Seen())
                seen.retry_at = self.clock() + 5.0
                self._due(key, seen.retry_at)
                break

    async def _write(self, key: Key, action: Action) -> None:
        namespace, name = key
        manager = self.options.config.field_manager
        seen = self.seen.setdefault(key, _Seen())
        if isinstance(action, WriteStatus):
            await self.bucket.take()
            obj = await asyncio.to_thread(
                self.api.apply_trainer_status, namespace, name, action.trainer_status, manager
            )
            self.stats["writes"] += 1
            seen.last_write_at = self.clock()  # the throttle counts from the status write, whatever follows
            if self.options.write_annotation:
                await self.bucket.take()
                obj = await asyncio.to_thread(
                    self.api.apply_annotation, namespace, name, ANNOTATION, action.annotation, manager
                )
                self.stats["writes"] += 1
            seen.last_write_at = self.clock()
            seen.written = action.fingerprint
            self._observe(parse_trainjob(obj))
        elif isinstance(action, Suspend):
            await self.bucket.take()
            obj = await asyncio.to_thread(self.api.suspend, namespace, name, action.resource_version, manager)
            self.stats["writes"] += 1
            _log.info("TrainJob %s/%s suspended: %s", namespace, name, action.reason)
            self._observe(parse_trainjob(obj))
        elif isinstance(action, Delete):
            await self.bucket.take()
            await asyncio.to_thread(self.api.delete, namespace, name, action.uid)
            self.stats["writes"] += 1
            _log.info("TrainJob %s/%s deleted: %s", namespace, name, action.reason)
        elif isinstance(action, EnsureNetworkPolicy):
            await self._ensure_network_policy(key, action)
        self.dirty.add(key)

    async def _ensure_network_policy(self, key: Key, action: EnsureNetworkPolicy) -> None:
        """Create the policy, or replace its spec and labels when they differ (``ReconcileNetworkPolicy``)."""
        namespace, name = key
        wanted = action.policy
        found = await asyncio.to_thread(self.api.get_network_policy, namespace, network_policy_name(name))
        labels = wanted["metadata"]["labels"]
        if found is None:
            await self.bucket.take()
            await asyncio.to_thread(self.api.create_network_policy, namespace, wanted)
            self.stats["writes"] += 1
        elif found.get("spec") != wanted["spec"] or (found.get("metadata") or {}).get("labels") != labels:
            body = {**found, "spec": wanted["spec"], "metadata": {**found["metadata"], "labels": labels}}
            await self.bucket.take()
            await asyncio.to_thread(self.api.replace_network_policy, namespace, network_policy_name(name), body)
            self.stats["writes"] += 1
        self.seen.setdefault(key, _Seen()).network_policy = action.fingerprint

    async def _refresh(self, key: Key) -> None:
        """Read a TrainJob again after a conflict."""
        try:
            obj = await asyncio.to_thread(self.api.get_trainjob, *key)
        except KubeError:
            return
        if obj is None:
            self.seen.setdefault(key, _Seen()).trainjob = None
            self.dirty.add(key)
        else:
            self._observe(parse_trainjob(obj))


def _keep_change(changes: list[Any], value: Any, before: Any, foreign: bool) -> None:
    """Keep a new value of a progress field another manager writes, to be mirrored in order (at most
    :data:`MAX_CHANGES`, the oldest going first)."""
    if value and foreign and value != before and value not in changes[-1:]:
        changes.append(value)
        del changes[:-MAX_CHANGES]


def _newer(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is newer than ``b`` (they are opaque; etcd's are numbers, compared as such)."""
    try:
        return int(a) > int(b)
    except ValueError:
        return False
