"""Turning the Kubernetes parts on from the server settings (called from the app's lifespan)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from ...services import Services
    from .reconcile import Mode

__all__ = ["KubernetesSettings", "runner_namespace", "start_kubernetes"]

_log = logging.getLogger("stepwatch.server.kubernetes")

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class KubernetesSettings(Protocol):
    """What the Kubernetes parts read from the server's settings (``ServerSettings`` has them all; the
    settings sit floors above the runners, so they are named here rather than imported)."""

    @property
    def k8s_runner(self) -> bool: ...
    @property
    def k8s_mode(self) -> str: ...
    @property
    def k8s_network_policy(self) -> bool: ...
    @property
    def k8s_namespaces(self) -> tuple[str, ...]: ...
    @property
    def k8s_grace_s(self) -> float: ...
    @property
    def k8s_delete_on_stop(self) -> bool: ...
    @property
    def k8s_status_interval_s(self) -> float: ...
    @property
    def k8s_writes_per_s(self) -> float: ...
    @property
    def k8s_pod_tokens(self) -> bool: ...
    @property
    def k8s_audience(self) -> str: ...
    @property
    def k8s_job_rate(self) -> float: ...
    @property
    def k8s_account_rate(self) -> float: ...
    @property
    def kubeconfig(self) -> str | None: ...


def runner_namespace(path: str = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The runner's namespace from its ServiceAccount's mount, else ``stepwatch`` (as Red Hat's controller
    finds its own, ``getControllerNamespace``): the NetworkPolicy of poll mode admits the runner from there."""
    from .networkpolicy import RUNNER_NAMESPACE

    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or RUNNER_NAMESPACE
    except OSError:
        return RUNNER_NAMESPACE


async def start_kubernetes(
    app: Any, settings: KubernetesSettings, services: Services
) -> Callable[[], Awaitable[None]] | None:
    """Start the TrainJob runner and the pod-token checks the settings ask for; what stops them (or ``None``).

    The pod-token checks are kept in ``app.state.pod_tokens`` for the Kubeflow status endpoint.
    """
    app.state.pod_tokens = None
    if not (settings.k8s_runner or settings.k8s_pod_tokens):
        return None
    from .api import load_api
    from .reconcile import Config
    from .runner import RunnerOptions, TrainJobRunner
    from .tokens import PodTokens

    api = await asyncio.to_thread(load_api, settings.kubeconfig)
    runner = None
    if settings.k8s_pod_tokens:
        app.state.pod_tokens = PodTokens(
            api,
            audience=settings.k8s_audience,
            job_rate=settings.k8s_job_rate,
            account_rate=settings.k8s_account_rate,
            clock=services.clock,
        )
    if settings.k8s_runner:
        options = RunnerOptions(
            namespaces=settings.k8s_namespaces,
            config=Config(
                grace_s=settings.k8s_grace_s,
                delete_on_stop=settings.k8s_delete_on_stop,
                status_interval_s=settings.k8s_status_interval_s,
                mode=cast("Mode", settings.k8s_mode),  # (one of K8S_MODES: the setting is checked when read)
                network_policy=settings.k8s_network_policy,
                runner_namespace=runner_namespace(),
            ),
            writes_per_s=settings.k8s_writes_per_s,
        )
        runner = TrainJobRunner(api, services, options)
        await runner.start()
        app.state.k8s_runner = runner
        where = ", ".join(settings.k8s_namespaces) or "every namespace"
        _log.info("watching TrainJobs in %s (%s mode)", where, settings.k8s_mode)

    async def stop() -> None:
        if runner is not None:
            await runner.aclose()
        await asyncio.to_thread(api.api_client.close)

    return stop
