"""The Kubernetes API, thin: every call stepwatch makes, through the official ``kubernetes`` client.

Blocking calls (the client is synchronous): the runner and the pod-token checks run them in worker
threads. Errors come out as :class:`KubeError` (status code, reason, Retry-After), nothing else of the
client leaks. Objects are plain JSON dicts as the API server sends them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from .objects import GROUP, PLURAL, VERSION

__all__ = ["KubeApi", "KubeError", "load_api"]

_log = logging.getLogger("stepwatch.server.kubernetes")

INSTALL_HINT = "pip install 'stepwatch[k8s]'"


class KubeError(Exception):
    """The API server said no (``status``: its HTTP code; 0 when it could not be reached)."""

    def __init__(self, status: int, message: str, reason: str = "", retry_after: float | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def retriable(self) -> bool:
        """Worth trying again later: unreachable, 409 (look again first), 429, 5xx."""
        return self.status in (0, 409, 429) or self.status >= 500


def _translate(exc: BaseException) -> KubeError:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        message, reason = str(exc.reason or ""), str(exc.reason or "")
        try:
            body = json.loads(exc.body or "{}")
            message = str(body.get("message") or message)
            reason = str(body.get("reason") or reason)
        except (TypeError, ValueError):
            pass
        retry = None
        headers = exc.headers or {}
        if headers.get("Retry-After"):
            try:
                retry = float(headers["Retry-After"])
            except ValueError:
                retry = None
        return KubeError(int(exc.status or 0), message, reason, retry)
    return KubeError(0, f"{type(exc).__name__}: {exc}")


class KubeApi:
    """The calls, on one ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: Any, request_timeout_s: float = 30.0) -> None:
        from kubernetes import client

        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.auth = client.AuthenticationV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.timeout = request_timeout_s

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            response = fn(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
            data = response.data
            return json.loads(data) if data else {}
        except Exception as exc:
            raise _translate(exc) from None

    # ------------------------------------------------------------------ TrainJobs

    def list_trainjobs(self, namespace: str | None, page: int = 500) -> tuple[list[dict[str, Any]], str]:
        """Every TrainJob (of a namespace), page by page; and the list's resourceVersion to watch from."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        version = ""
        while True:
            extra: dict[str, Any] = {"limit": page}
            if token:
                extra["_continue"] = token
            if namespace is None:
                data = self._call(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, **extra)
            else:
                data = self._call(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, **extra)
            items.extend(data.get("items") or [])
            meta = data.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            token = meta.get("continue")
            if not token:
                return items, version

    def watch_trainjobs(
        self, namespace: str | None, resource_version: str, timeout_s: int = 300
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events after ``resource_version`` (``BOOKMARK`` ones included) until the server ends the watch;
        :class:`KubeError` 410 when that version is too old (list again)."""
        from kubernetes import watch

        kwargs: dict[str, Any] = {
            "resource_version": resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": timeout_s,
            "_request_timeout": (self.timeout, timeout_s + 30),
        }
        fn = self.custom.list_cluster_custom_object
        args: tuple[Any, ...] = (GROUP, VERSION, PLURAL)
        if namespace is not None:
            fn = self.custom.list_namespaced_custom_object
            args = (GROUP, VERSION, namespace, PLURAL)
        stream = watch.Watch()
        try:
            for event in stream.stream(fn, *args, **kwargs):
                obj = event.get("raw_object")
                if isinstance(obj, dict):
                    yield str(event.get("type")), obj
        except KubeError:
            raise
        except Exception as exc:
            raise _translate(exc) from None
        finally:
            stream.stop()

    def get_trainjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One TrainJob; ``None`` when it is gone."""
        try:
            found: dict[str, Any] = self._call(
                self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def get_runtime(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        """A ClusterTrainingRuntime, or a TrainingRuntime of the namespace; ``None`` when there is none."""
        try:
            if kind == "TrainingRuntime":
                found: dict[str, Any] = self._call(
                    self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, "trainingruntimes", name
                )
            else:
                found = self._call(
                    self.custom.get_cluster_custom_object, GROUP, VERSION, "clustertrainingruntimes", name
                )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def _apply(self, path: str, body: dict[str, Any], manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply of ``body`` at ``path`` under ``manager`` (``force``: a controller's fields are its
        own; without it, another manager's field with another value is a 409 conflict)."""
        try:
            response = self.api_client.call_api(
                path,
                "PATCH",
                query_params=[("fieldManager", manager), ("force", "true" if force else "false")],
                header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.timeout,
                _return_http_data_only=True,
            )
            found: dict[str, Any] = json.loads(response.data)
        except Exception as exc:
            raise _translate(exc) from None
        return found

    def apply_trainer_status(
        self, namespace: str, name: str, trainer_status: dict[str, Any], manager: str
    ) -> dict[str, Any]:
        """``status.trainerStatus`` by server-side apply on the status subresource."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"trainerStatus": trainer_status},
        }
        return self._apply(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status", body, manager)

    def apply_annotation(
        self, namespace: str, name: str, key: str, value: str, manager: str, force: bool = True
    ) -> dict[str, Any]:
        """One annotation by server-side apply (the manager owns that key only; nothing else of the object is
        touched). Without ``force``, 409 when another manager owns the key with another value."""
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace, "annotations": {key: value}},
        }
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
        return self._apply(path, body, manager, force)

    def suspend(self, namespace: str, name: str, resource_version: str, manager: str) -> dict[str, Any]:
        """``spec.suspend: true`` (merge patch), only if the object is still at ``resource_version`` (409 if not)."""
        body = {"metadata": {"resourceVersion": resource_version}, "spec": {"suspend": True}}
        found: dict[str, Any] = self._call(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            body,
            field_manager=manager,
        )
        return found

    def delete(self, namespace: str, name: str, uid: str) -> None:
        """Delete the TrainJob if it is still the object ``uid`` (409 if another took its name)."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid},
            "propagationPolicy": "Background",
        }
        self._call(self.custom.delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name, body=body)

    # ------------------------------------------------------------------ pods and their network

    def list_pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """The pods of a namespace with all these labels, in the API's order (by name)."""
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        data = self._call(self.core.list_namespaced_pod, namespace, label_selector=selector)
        items: list[dict[str, Any]] = data.get("items") or []
        return items

    def get_network_policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A NetworkPolicy; ``None`` when there is none."""
        try:
            found: dict[str, Any] = self._call(self.networking.read_namespaced_network_policy, name, namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def create_network_policy(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a NetworkPolicy (409 when one of that name appeared meanwhile)."""
        created: dict[str, Any] = self._call(self.networking.create_namespaced_network_policy, namespace, body)
        return created

    def replace_network_policy(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a NetworkPolicy (``body`` carries the ``resourceVersion`` read: 409 when it changed since)."""
        replaced: dict[str, Any] = self._call(self.networking.replace_namespaced_network_policy, name, namespace, body)
        return replaced

    # ------------------------------------------------------------------ tokens

    def token_review(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """A TokenReview's ``status`` (``authenticated``, ``user``, ``audiences``, ``error``)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
        data = self._call(self.auth.create_token_review, body)
        status: dict[str, Any] = data.get("status") or {}
        return status

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod; ``None`` when it is gone."""
        try:
            found: dict[str, Any] = self._call(self.core.read_namespaced_pod, name, namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def jwks(self) -> dict[str, Any]:
        """The service account issuer's public keys (``/openid/v1/jwks``)."""
        try:
            response = self.api_client.call_api(
                "/openid/v1/jwks",
                "GET",
                header_params={"Accept": "application/json, application/jwk-set+json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.timeout,
                _return_http_data_only=True,
            )
            found: dict[str, Any] = json.loads(response.data)
        except Exception as exc:
            raise _translate(exc) from None
        return found


def load_api(kubeconfig: str | None = None, context: str | None = None) -> KubeApi:
    """The API of the cluster stepwatch runs in (in-cluster ServiceAccount), else of a kubeconfig
    (``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``)."""
    try:
        from kubernetes import client, config
    except ImportError as exc:
        raise ImportError(
            f"the Kubernetes runner needs the kubernetes client ({exc.name} is missing): {INSTALL_HINT}"
        ) from None
    configuration = client.Configuration()
    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config(client_configuration=configuration)
            return KubeApi(client.ApiClient(configuration))
        except config.ConfigException:
            pass
    config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    return KubeApi(client.ApiClient(configuration))
