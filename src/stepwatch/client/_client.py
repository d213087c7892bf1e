"""The HTTP client: one class over httpx, shared by the CLI and the SDK."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from ..protocol import jobs_path
from ._errors import ServerUnreachable, error_for

__all__ = ["DEFAULT_SERVER", "Client", "server_url"]

DEFAULT_SERVER = "http://127.0.0.1:8642"


def server_url(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The server to talk to: the argument, ``STEPWATCH_SERVER``, ``STEPWATCH_URL``, then the local default."""
    env = os.environ if environ is None else environ
    url = explicit or env.get("STEPWATCH_SERVER") or env.get("STEPWATCH_URL") or DEFAULT_SERVER
    if "/apis/trainer.kubeflow.org/" in url:
        url = url.split("/apis/trainer.kubeflow.org/")[0]
    return url.rstrip("/")


class Client:
    """A stepwatch server seen from code. Every method raises a :class:`StepwatchError` subclass."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 10.0) -> None:
        self.url = server_url(url)
        headers = {"Accept": "application/json", "User-Agent": "stepwatch-client"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Release connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        try:
            response = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnreachable(
                f"no stepwatch server answers at {self.url} ({type(exc).__name__}: {exc})"
            ) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code >= 400:
            raise error_for(response.status_code, body)
        return body

    # ---------------------------------------------------------------------------------------- jobs

    def ping(self) -> dict[str, Any]:
        """The server's version; raises :class:`ServerUnreachable` when there is none."""
        found: dict[str, Any] = self._request("GET", "/api/v1/version")
        return found

    def jobs(
        self,
        namespace: str | None = None,
        *,
        state: str | None = None,
        text: str | None = None,
        sort: str | None = None,
        limit: int = 1000,
        all_attempts: bool = False,
    ) -> list[dict[str, Any]]:
        """Jobs (latest attempts), newest first unless ``sort`` says otherwise."""
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("namespace", namespace), ("state", state), ("text", text), ("sort", sort)):
            if value:
                params[key] = value
        if all_attempts:
            params["all_attempts"] = "true"
        found: list[dict[str, Any]] = self._request("GET", "/api/v1/jobs", params=params)["items"]
        return found

    def job(self, name: str, namespace: str = "default", attempt: int | None = None) -> dict[str, Any]:
        """One job."""
        params = {"attempt": attempt} if attempt else None
        found: dict[str, Any] = self._request("GET", f"{jobs_path(namespace)}/{name}", params=params)
        return found

    def history(
        self, name: str, namespace: str = "default", metrics: list[str] | None = None, max_points: int = 1000
    ) -> dict[str, list[dict[str, Any]]]:
        """Downsampled history of some (default: all) metrics of a job."""
        params: dict[str, Any] = {"max_points": max_points}
        if metrics:
            params["metrics"] = ",".join(metrics)
        found: dict[str, list[dict[str, Any]]] = self._request(
            "GET", f"{jobs_path(namespace)}/{name}/history", params=params
        )["metrics"]
        return found

    def events(self, name: str, namespace: str = "default", after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """Events of a job, oldest first."""
        found: list[dict[str, Any]] = self._request(
            "GET", f"{jobs_path(namespace)}/{name}/events", params={"after": after, "limit": limit}
        )["items"]
        return found

    def register(self, name: str, namespace: str = "default", **fields: Any) -> tuple[dict[str, Any], str]:
        """Register a job (or its next attempt); returns the job and its write token."""
        body = self._request("POST", jobs_path(namespace), json={"name": name, **fields})
        return body["job"], body["token"]

    def stop(self, name: str, namespace: str = "default", reason: str = "") -> dict[str, Any]:
        """Ask a job to save a checkpoint and stop."""
        return self.command(name, "stop", namespace, reason)

    def checkpoint(self, name: str, namespace: str = "default", reason: str = "") -> dict[str, Any]:
        """Ask a job to save a checkpoint."""
        return self.command(name, "checkpoint", namespace, reason)

    def command(self, name: str, kind: str, namespace: str = "default", reason: str = "") -> dict[str, Any]:
        """Queue a command for a job's reporter."""
        found: dict[str, Any] = self._request(
            "POST", f"{jobs_path(namespace)}/{name}/commands", json={"kind": kind, "reason": reason}
        )
        return found

    def pending_commands(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        """Commands the job has not acknowledged yet."""
        found: list[dict[str, Any]] = self._request("GET", f"{jobs_path(namespace)}/{name}/commands")["items"]
        return found

    def set_state(
        self,
        name: str,
        state: str,
        token: str,
        namespace: str = "default",
        exit_code: int | None = None,
        reason: str = "",
    ) -> dict[str, Any]:
        """Record how a job's process ended (needs the job's token)."""
        body: dict[str, Any] = {"state": state, "reason": reason}
        if exit_code is not None:
            body["exit_code"] = exit_code
        found: dict[str, Any] = self._request("POST", f"{jobs_path(namespace)}/{name}/state", token=token, json=body)
        return found

    # ---------------------------------------------------------------------------------------- live

    def stream(
        self, name: str | None = None, namespace: str | None = None, reconnect: bool = True
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Live updates as ``(kind, data)``.

        Kinds: ``job``, ``points``, ``event``, ``resync`` (state was missed: read it again; also
        after every reconnection) and ``heartbeat`` (the server's keep-alive, every 15 s: a chance
        for the caller to stop). A silent connection is given up after 45 s; with ``reconnect`` the
        stream comes back by itself, resuming from the last event id.
        """
        params = {k: v for k, v in (("job", name), ("namespace", namespace)) if v}
        last_id: str | None = None
        delay = 0.5
        connected_before = False
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                with self._http.stream(
                    "GET", "/api/v1/events", params=params, headers=headers, timeout=httpx.Timeout(10.0, read=45.0)
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise error_for(response.status_code, _json_or_none(response.content))
                    delay = 0.5
                    if connected_before:
                        yield "resync", {"reason": "reconnected"}
                    connected_before = True
                    kind, data, event_id = "message", "", None
                    for line in response.iter_lines():
                        if line == "":
                            if data:
                                if event_id:
                                    last_id = event_id
                                yield kind, json.loads(data)
                            kind, data, event_id = "message", "", None
                        elif line.startswith(":"):
                            yield "heartbeat", {}
                        elif line.startswith("event:"):
                            kind = line[6:].strip()
                        elif line.startswith("data:"):
                            data += line[5:].strip()
                        elif line.startswith("id:"):
                            event_id = line[3:].strip()
            except (httpx.TransportError, httpx.StreamError) as exc:
                if not reconnect:
                    raise ServerUnreachable(f"the live stream from {self.url} ended: {exc}") from None
            if not reconnect:
                return
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def _json_or_none(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return None
