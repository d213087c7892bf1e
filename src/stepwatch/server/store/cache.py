"""The latest view of live jobs, kept in memory by the store that writes them.

Every report needs its job (to check the token, merge the last metrics, move the state) and answers
with the job's new view. Reading the job's row back and decoding it cost more than the write itself;
a store that is the only writer of its database knows every job it wrote, so it keeps them here.

The writer puts every job it writes, after each commit and in commit order. A reader may only
*offer* what it read: taken when the cache holds nothing for that job, so a row read before a
commit never replaces what the commit put. Which attempt is a name's latest is set by registration
and by reads of the latest, never lowered. Lookups take no lock (a dict read is atomic) and may run
on the event loop. The cache is bounded: past ``capacity`` jobs the oldest entries go, and a miss
only costs a read.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from .base import Job

__all__ = ["MISS", "JobCache", "TransactionMemo"]

MISS: Any = object()
"""What :meth:`TransactionMemo.get` answers for what it does not know (``None`` is a value it may hold)."""


class JobCache:
    """Jobs by id and by name (the latest attempt), and write-token hashes by job id."""

    def __init__(self, capacity: int = 20_000) -> None:
        self.capacity = capacity
        self._by_id: dict[int, Job] = {}
        self._latest: dict[tuple[str, str], int] = {}
        self._tokens: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def by_id(self, job_id: int) -> Job | None:
        """The cached job with this id."""
        return self._by_id.get(job_id)

    def latest(self, namespace: str, name: str) -> Job | None:
        """The cached latest attempt of a job name."""
        job_id = self._latest.get((namespace, name))
        return None if job_id is None else self._by_id.get(job_id)

    def token_hash(self, job_id: int) -> str | None:
        """The cached hash of a job's write token."""
        return self._tokens.get(job_id)

    def put(self, job: Job, token_hash: str | None = None, latest: bool = False) -> None:
        """Remember a job just written (call under the store's write lock, after the commit).

        ``latest``: the job is its name's newest attempt (it was just registered).
        """
        if job.id not in self._by_id and len(self._by_id) >= self.capacity:
            self._evict()
        self._by_id[job.id] = job
        if latest:
            self._set_latest(job)
        if token_hash is not None:
            self._tokens[job.id] = token_hash

    def offer(self, job: Job, latest: bool = False) -> None:
        """Remember a job a reader read, unless the cache knows it already (maybe newer)."""
        if job.id not in self._by_id:
            if len(self._by_id) >= self.capacity:
                self._evict()
            self._by_id.setdefault(job.id, job)
        if latest:
            self._set_latest(job)

    def offer_token_hash(self, job_id: int, token_hash: str) -> None:
        """Remember a job's token hash (it never changes)."""
        self._tokens[job_id] = token_hash

    def _set_latest(self, job: Job) -> None:
        key = (job.namespace, job.name)
        current = self._by_id.get(self._latest.get(key, -1))
        if current is None or current.attempt <= job.attempt:
            self._latest[key] = job.id

    def forget(self, job_ids: Iterable[int] = (), names: Iterable[tuple[str, str]] = ()) -> None:
        """Drop some jobs, and which attempt is some names' latest (another replica changed them)."""
        for job_id in job_ids:
            job = self._by_id.pop(job_id, None)
            if job is not None and self._latest.get((job.namespace, job.name)) == job_id:
                del self._latest[(job.namespace, job.name)]
        for key in names:
            self._latest.pop(key, None)

    def clear(self) -> None:
        """Forget everything (another process wrote the database)."""
        self._by_id.clear()
        self._latest.clear()
        self._tokens.clear()

    def _evict(self) -> None:
        for job_id in list(self._by_id)[: max(1, self.capacity // 10)]:  # the oldest tenth, in insertion order
            job = self._by_id.pop(job_id)
            self._tokens.pop(job_id, None)
            key = (job.namespace, job.name)
            if self._latest.get(key) == job_id:
                del self._latest[key]


class TransactionMemo:
    """Small facts the single writer of a database knows from its own writes, by key, as of the last commit.

    What a write transaction learns or changes is kept apart (:meth:`put`, :meth:`forget`) until it
    commits (:meth:`commit`); a transaction rolled back (:meth:`rollback`) leaves what was committed.
    :meth:`forget` inside a transaction makes the key unknown from then on, committed or not (a
    savepoint rolled back: the database may hold either value). Readers are the writer only (under its
    lock). Bounded: past ``capacity`` keys everything is forgotten (a miss only costs a read).
    """

    def __init__(self, capacity: int = 200_000) -> None:
        self.capacity = capacity
        self._committed: dict[Hashable, Any] = {}
        self._open: dict[Hashable, Any] = {}

    def get(self, key: Hashable) -> Any:
        """The value as the open transaction sees it, or :data:`MISS`."""
        value = self._open.get(key, MISS)
        return self._committed.get(key, MISS) if value is MISS and key not in self._open else value

    def put(self, key: Hashable, value: Any) -> None:
        """What the open transaction read or wrote."""
        self._open[key] = value

    def forget(self, key: Hashable) -> None:
        """The key is unknown (the open transaction changed it, or may have)."""
        self._open[key] = MISS

    def commit(self) -> None:
        """The open transaction committed: what it knew is what is known."""
        if len(self._committed) + len(self._open) > self.capacity:
            self._committed.clear()
        for key, value in self._open.items():
            if value is MISS:
                self._committed.pop(key, None)
            else:
                self._committed[key] = value
        self._open.clear()

    def rollback(self) -> None:
        """The open transaction rolled back (or a new one begins): only what was committed is known."""
        self._open.clear()

    def clear(self) -> None:
        """Forget everything (another program wrote the database)."""
        self._committed.clear()
        self._open.clear()
