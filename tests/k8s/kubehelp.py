"""Helpers of the Kubernetes tests: TrainJobs and runtimes as users write them (validated by Kubeflow
Trainer's own API models), a stepwatch server beside the FAKE Kubernetes API server (``fakeapi.py``), polling.

A module of its own rather than ``conftest.py``: ``tests/`` has two ``conftest.py`` and no packages, so
``from conftest import ...`` would be ambiguous.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fakeapi import FakeApi
from kubeflow_trainer_api import models as trainer_models

from stepwatch import testing
from stepwatch.protocol import format_rfc3339
from stepwatch.server.runners.kubernetes.api import KubeApi, load_api
from stepwatch.server.runners.kubernetes.reconcile import Config
from stepwatch.server.runners.kubernetes.runner import RunnerOptions, TrainJobRunner

if TYPE_CHECKING:
    from starlette.testclient import TestClient

__all__ = ["Clock", "Cluster", "PodServer", "cluster_runtime", "pod_status", "trainjob", "wait_for"]


def trainjob(
    name: str,
    namespace: str = "nlp",
    *,
    nodes: int | None = 2,
    gpus: int | None = 8,
    runtime: str = "torch-distributed",
    runtime_kind: str = "ClusterTrainingRuntime",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A TrainJob as a user writes it, validated by Kubeflow Trainer's own API models (kubeflow_trainer_api)."""
    trainer: dict[str, Any] = {}
    if nodes is not None:
        trainer["numNodes"] = nodes
    if gpus is not None:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "8"}}
    obj: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "runtimeRef": {"name": runtime, "kind": runtime_kind, "apiGroup": "trainer.kubeflow.org"},
            "trainer": trainer,
        },
    }
    trainer_models.TrainerV1alpha1TrainJob.from_dict(obj)  # the schema of the trainer API package
    return obj


def cluster_runtime(name: str, nodes: int, gpus: int, product: str = "NVIDIA-H100-80GB-HBM3") -> dict[str, Any]:
    """A ClusterTrainingRuntime with ``nodes`` nodes of ``gpus`` GPUs, validated by the trainer API package."""
    obj: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"numNodes": nodes, "torch": {"numProcPerNode": "auto"}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": 1,
                            "template": {
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "nodeSelector": {"nvidia.com/gpu.product": product},
                                            "containers": [
                                                {
                                                    "name": "node",
                                                    "image": "pytorch/pytorch",
                                                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                                                }
                                            ],
                                        }
                                    }
                                }
                            },
                        }
                    ]
                }
            },
        },
    }
    trainer_models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(obj)
    return obj


class Clock:
    """The server's clock, moved by the test (whole seconds, so that second-precision times agree)."""

    def __init__(self, now: float | None = None) -> None:
        self.now = float(int(time.time())) if now is None else now

    def __call__(self) -> float:
        return self.now


class PodServer:
    """A real HTTP server on 127.0.0.1 standing in for a training pod's metrics endpoint (what Red Hat's
    callback and stepwatch's report core serve): any path answers ``status`` with ``body`` after ``delay``
    seconds; ``on_get`` runs before it answers. Every request is counted, and how many were in flight at once."""

    def __init__(self, body: bytes = b"{}", status: int = 200, delay: float = 0.0) -> None:
        self.body, self.status, self.delay = body, status, delay
        self.on_get: Callable[[], None] | None = None
        self.requests: list[str] = []
        self.answered = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with server._lock:
                    server.requests.append(self.path)
                    server.in_flight += 1
                    server.most_in_flight = max(server.most_in_flight, server.in_flight)
                try:
                    if server.on_get is not None:
                        server.on_get()
                    time.sleep(server.delay)
                    body, status = server.body, server.status
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with server._lock:
                        server.in_flight -= 1
                        server.answered += 1

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True, name="fake-pod").start()

    @property
    def port(self) -> str:
        return str(self.httpd.server_address[1])

    def serve(self, body: bytes | str, status: int = 200, delay: float = 0.0) -> None:
        self.body = body.encode() if isinstance(body, str) else body
        self.status, self.delay = status, delay

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def wait_for(what: Callable[[], Any], timeout: float = 10.0, message: str = "") -> Any:
    """Poll until ``what()`` is truthy; its value (:func:`stepwatch.testing.wait_for`, as these tests name it)."""
    return testing.wait_for(what, timeout, message)


@dataclass
class Cluster:
    """A stepwatch server (in-process client) beside the FAKE API server, and the runner between them."""

    fake: FakeApi
    kubeconfig: Path
    client: TestClient
    app: Any
    runner: TrainJobRunner | None = None
    apis: list[KubeApi] = field(default_factory=list)

    def job(self, name: str, namespace: str = "nlp") -> dict[str, Any] | None:
        response = self.client.get(f"/api/v1/namespaces/{namespace}/jobs/{name}")
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text
        view: dict[str, Any] = response.json()
        return view

    def wait_job(self, name: str, namespace: str = "nlp", timeout: float = 10.0, **expect: Any) -> dict[str, Any]:
        """The job once it exists and its view has the ``expect`` values (``state="running"``...)."""

        def ready() -> dict[str, Any] | None:
            view = self.job(name, namespace)
            if view is None or any(view.get(k) != v for k, v in expect.items()):
                return None
            return view

        found: dict[str, Any] = wait_for(ready, timeout, f"job {namespace}/{name} with {expect}")
        return found

    def status_url(self, name: str, namespace: str = "nlp") -> str:
        return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"

    def post_status(self, name: str, token: str, body: dict[str, Any], namespace: str = "nlp") -> Any:
        return self.client.post(
            self.status_url(name, namespace), json=body, headers={"Authorization": f"Bearer {token}"}
        )

    def start_runner(self, **options: Any) -> TrainJobRunner:
        """A runner on the server's event loop, fast knobs for tests (``poll_s`` 0.05); ``config=`` and the
        other :class:`RunnerOptions` fields override."""
        api = load_api(str(self.kubeconfig))
        self.apis.append(api)
        options.setdefault("poll_s", 0.05)
        options.setdefault("watch_timeout_s", 30)
        options.setdefault("config", Config(grace_s=0.5, status_interval_s=0.3))
        runner = TrainJobRunner(api, self.app.state.services, RunnerOptions(**options))
        assert self.client.portal is not None
        self.client.portal.call(runner.start)
        self.runner = runner
        wait_for(runner.ready.is_set, 10, "the runner's first list")
        return runner

    def close(self) -> None:
        if self.runner is not None and self.client.portal is not None:
            self.client.portal.call(self.runner.aclose)
        for api in self.apis:
            api.api_client.close()


def pod_status(step: int, total: int = 100, loss: float = 1.0, when: str | None = None) -> dict[str, Any]:
    """A KEP-2779 body as a pod posts it (what KubeflowCallback sends at a step; ``lastUpdatedTime``, which
    upstream's CRD requires, is now unless ``when`` says otherwise)."""
    status: dict[str, Any] = {
        "progressPercentage": step * 100 // total,
        "metrics": [
            {"name": "loss", "value": str(loss)},
            {"name": "current_step", "value": str(step)},
            {"name": "total_steps", "value": str(total)},
        ],
    }
    status["lastUpdatedTime"] = when if when is not None else format_rfc3339(time.time())
    return {"trainerStatus": status}
