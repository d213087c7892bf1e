"""``poll`` mode at work: read a TrainJob's rank-0 pod as Red Hat's controller does. Thin I/O around
:mod:`.progression`'s rules.

One poll lists the TrainJob's pods (the API server), picks the pod (:func:`.progression.primary_pod`),
GETs ``http://<podIP>:<port>/metrics`` and reads the body as the controller does (Go's decoding, then
``cleanInvalidMetrics``); at the end of a TrainJob it reads the termination message of the trainer
container instead, or polls once more, or keeps what the annotation said, each with the summary of the end
(``PollAndUpdateFinalProgress``). What comes out is the annotation to write; the runner writes it and
stores it as history.

HTTP is asynchronous (``httpx``, no worker thread held while a pod is slow) with the controller's limits:
2 s for the whole request, only 200 taken, no proxy (Go's transport there has none: a pod IP is not for a
proxy). At most ``max_concurrent`` polls run at once, whatever the number of TrainJobs, so that many slow
pods cost each other nothing but a place in the queue, and the body is read up to 256 KiB (the most all
annotations of an object may hold: a bigger status could not be written anyway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import anyio
import httpx

from ....protocol.progression import (
    AnnotationStatus,
    ProgressionError,
    ProgressionStatus,
    clean_invalid,
    decode_status,
)
from .api import KubeApi, KubeError
from .progression import (
    JOBSET_NAME,
    LEGACY_JOB_NAME,
    POLL_TIMEOUT_S,
    Poll,
    final_pod,
    primary_pod,
    termination_status,
    to_annotation,
    update_final_status,
    with_final_summary,
)

if TYPE_CHECKING:
    from .objects import TrainJob

__all__ = ["MAX_BODY_BYTES", "PollError", "Poller"]

_log = logging.getLogger("stepwatch.server.kubernetes")

MAX_BODY_BYTES: Final = 256 * 1024
"""The most of a pod's answer read: Kubernetes keeps at most 256 KiB of annotations per object."""


class PollError(Exception):
    """A poll that gave nothing (no pod, refused, slow, not 200, not the JSON): the annotation stays."""


class Poller:
    """Polls pods for the runner: the HTTP client, the cap on polls at once, the pod listing."""

    def __init__(self, api: KubeApi, max_concurrent: int = 32, timeout_s: float = POLL_TIMEOUT_S) -> None:
        self.api = api
        self.timeout_s = timeout_s
        self.slots = asyncio.Semaphore(max_concurrent)
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                trust_env=False,  # no proxy from the environment, as the controller's transport
                timeout=httpx.Timeout(self.timeout_s),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=10, keepalive_expiry=30.0),
                # Go's client follows redirects; here a pod cannot send the runner to another address
                follow_redirects=False,
            )
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------ one GET

    async def fetch(self, pod_ip: str, port: str) -> ProgressionStatus:
        """``PollTrainingProgress``: the pod's status, cleaned; :class:`PollError` when there is none."""
        if not pod_ip:
            raise PollError("the pod has no IP address")
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        url = f"http://{host}:{port}/metrics"
        try:
            with anyio.fail_after(self.timeout_s):  # the whole request, body included, as Go's context deadline
                body = await self._get(url)
        except TimeoutError:
            raise PollError(f"no answer from {url} within {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise PollError(f"failed to fetch metrics from {url}: {exc}") from None
        try:
            return clean_invalid(decode_status(body))
        except ProgressionError as exc:
            raise PollError(f"failed to parse metrics JSON from {url}: {exc}") from None

    async def _get(self, url: str) -> bytes:
        async with self._http().stream("GET", url) as response:
            if response.status_code != 200:
                raise PollError(f"unexpected status code {response.status_code} from {url}")
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_raw():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    raise PollError(f"the answer of {url} is over {MAX_BODY_BYTES} bytes")
                chunks.append(chunk)
            return b"".join(chunks)

    # ------------------------------------------------------------------ pods

    async def _pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.api.list_pods, namespace, dict(selector))

    async def primary(self, tj: TrainJob) -> Mapping[str, Any]:
        """``GetPrimaryPod`` (its JobSet's pods first; the legacy label's only when none of those will do)."""
        pods = await self._pods(tj.namespace, {JOBSET_NAME: tj.name})
        pod = primary_pod(tj.name, pods)
        if pod is None:
            pod = primary_pod(tj.name, pods + await self._pods(tj.namespace, {LEGACY_JOB_NAME: tj.name}))
        if pod is None:
            raise PollError(f"no running and ready pod with an IP for TrainJob {tj.namespace}/{tj.name}")
        return pod

    # ------------------------------------------------------------------ a poll

    async def poll(self, tj: TrainJob, action: Poll, now: float) -> AnnotationStatus | None:
        """What to write onto the TrainJob after this poll (``None``: nothing); :class:`PollError` when a
        live poll gave nothing. Holds one of the ``max_concurrent`` places while it runs."""
        async with self.slots:
            if not action.final:
                pod = await self.primary(tj)
                status = await self.fetch(str((pod.get("status") or {}).get("podIP") or ""), action.port)
                return to_annotation(status, now)
            return await self._final(tj, action, now)

    async def _final(self, tj: TrainJob, action: Poll, now: float) -> AnnotationStatus | None:
        """``PollAndUpdateFinalProgress``: the termination message, else a last poll of a pod still running,
        else the annotation there is with the summary of the end."""
        try:
            pods = await self._pods(tj.namespace, {JOBSET_NAME: tj.name})
        except KubeError as exc:
            _log.info("could not list the pods of %s/%s for their end (%s)", tj.namespace, tj.name, exc)
            pods = []
        pod = final_pod(pods)
        if pod is not None:
            try:
                return with_final_summary(termination_status(pod, now), action.completed)
            except ProgressionError as exc:
                _log.debug("no termination message for %s/%s (%s); polling", tj.namespace, tj.name, exc)
            status = pod.get("status") or {}
            if status.get("phase") == "Running" and status.get("podIP"):
                try:
                    polled = await self.fetch(str(status["podIP"]), action.port)
                    return with_final_summary(to_annotation(polled, now), action.completed)
                except PollError as exc:
                    _log.debug("last poll of %s/%s failed (%s)", tj.namespace, tj.name, exc)
        try:
            return update_final_status(tj.annotation, action.completed, now)
        except ProgressionError as exc:
            _log.info("the annotation of %s/%s is not the JSON (%s): its end stays", tj.namespace, tj.name, exc)
            return None
