"""A store's job cache (:class:`.JobCache`) kept true while other processes write the same database.

Other writers change the same rows: PostgreSQL replicas. Each write transaction says which jobs and
names it changed (a notification delivered at its commit); every store hears it and forgets them
here, and tells its :attr:`ReplicaCache.listeners` (the server's health trackers and ETA samples of
those jobs are stale too). The SQLite store, whose file one server process writes, hears of no change
by name: when another program wrote the file it forgets everything (:meth:`ReplicaCache.on_listening`).
Two races are closed with an **epoch**, a counter raised by every change heard:

- a reader that read a row before another replica's commit, and offers it after the notification
  was heard, would cache it stale forever: a read notes the epoch before it reads, and its job is
  cached only if no notification about that job came since;
- the same for a write of this store: its jobs are cached after its commit only if no notification
  about them came since its transaction started.

While the listening connection is down (PostgreSQL), notifications are lost: nothing is served nor
cached until it is back, and then the cache starts empty.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable

from .base import ChangeListener, Job
from .cache import JobCache

__all__ = ["ReplicaCache", "changes_payload"]


def changes_payload(origin: str, job_ids: Iterable[int], names: Iterable[tuple[str, str]], limit: int) -> str:
    """The notification of a write transaction: who wrote, the jobs and names it changed."""
    payload = json.dumps({"o": origin, "j": list(job_ids), "n": sorted(names)}, separators=(",", ":"))
    return payload if len(payload) <= limit else json.dumps({"o": origin, "all": True}, separators=(",", ":"))


class ReplicaCache:
    """Jobs by id and by name, trusted only while notifications are heard (see the module docstring)."""

    def __init__(self, origin: str, capacity: int = 20_000) -> None:
        self.origin = origin
        self._own = f'{{"o":"{origin}",'
        """How :func:`changes_payload` begins this store's own notifications, which come back to it too."""
        self._jobs = JobCache(capacity)
        self._lock = threading.Lock()
        self.epoch = 0
        self._changes: deque[tuple[int, frozenset[int] | None]] = deque(maxlen=4096)
        """Recent notifications (epoch, job ids; ``None``: everything)."""
        self.listening = False
        self.listeners: list[ChangeListener] = []

    def _tell(self, ids: frozenset[int] | None) -> None:
        for listener in self.listeners:
            listener(ids)

    def _raise_epoch(self, ids: frozenset[int] | None) -> None:
        self.epoch += 1
        self._changes.append((self.epoch, ids))

    def on_listening(self, listening: bool) -> None:
        """The listening connection came up or went down: what is cached may be stale either way."""
        with self._lock:
            self._raise_epoch(None)
            self._jobs.clear()
            self.listening = listening
        self._tell(None)

    def on_changed(self, payload: str) -> bool:
        """A notification of a store's write; whether it came from another store (this store's own are
        ignored, most without being decoded)."""
        if payload.startswith(self._own):
            return False
        message = json.loads(payload)
        if message.get("o") == self.origin:
            return False
        ids: frozenset[int] | None
        with self._lock:
            if message.get("all"):
                ids = None
                self._raise_epoch(None)
                self._jobs.clear()
            else:
                ids = frozenset(int(i) for i in message.get("j", ()))
                self._raise_epoch(ids)
                self._jobs.forget(ids, [(ns, name) for ns, name in message.get("n", ())])
        self._tell(ids)
        return True

    def _stale(self, since: int, job_id: int) -> bool:
        if self.epoch == since:
            return False
        changes = [c for c in self._changes if c[0] > since]
        if len(changes) < self.epoch - since:
            return True  # older than what is kept
        return any(ids is None or job_id in ids for _, ids in changes)

    def written(self, jobs: Iterable[tuple[Job, str | None, bool]], since: int) -> None:
        """Cache what a committed transaction wrote (job, token hash, just registered), unless stale."""
        with self._lock:
            if not self.listening:
                return
            for job, token_hash, latest in jobs:
                if self._stale(since, job.id):
                    self._jobs.forget([job.id])
                else:
                    self._jobs.put(job, token_hash, latest)

    def offer(self, job: Job, since: int, latest: bool = False) -> None:
        """Cache a job read from the database (when the epoch was ``since``), unless stale."""
        with self._lock:
            if self.listening and not self._stale(since, job.id):
                self._jobs.offer(job, latest)

    def latest(self, namespace: str, name: str) -> Job | None:
        """The cached latest attempt of a job name (no I/O)."""
        return self._jobs.latest(namespace, name) if self.listening else None

    def by_id(self, job_id: int) -> Job | None:
        """The cached job with this id (no I/O)."""
        return self._jobs.by_id(job_id) if self.listening else None

    def token_hash(self, job_id: int) -> str | None:
        """A cached token hash (it never changes: served even while not listening)."""
        return self._jobs.token_hash(job_id)

    def offer_token_hash(self, job_id: int, token_hash: str) -> None:
        """Remember a job's token hash."""
        self._jobs.offer_token_hash(job_id, token_hash)
