"""The NetworkPolicy of a polled TrainJob, as Red Hat's controller builds it, admitting stepwatch's runner. Pure.

Red Hat's fork of Kubeflow Trainer (``pkg/rhai/networkpolicy.go`` at c0df7487865d6e2ab90b14982ec7ae69ead41d30)
creates, for every TrainJob, a NetworkPolicy owned by it that selects its pods (``jobset-name``) for
ingress and admits (1) the pods of the same TrainJob, on every port (NCCL, MPI, gRPC between nodes), and
(2) when progression tracking is on, the controller's pods, from the controller's namespace, on the
metrics port (TCP; a port that is no integer is 28080).

stepwatch's ``poll`` mode does the controller's polling, so in a cluster whose namespaces deny ingress by
default its runner needs rule 2 for itself. But any NetworkPolicy that selects a pod makes that pod deny
all ingress it does not admit: creating one in a user's namespace closes the pods to everything but
their own TrainJob and the runner (a notebook, a TensorBoard or a Service reaching into a pod stops
working). So stepwatch builds the same two rules, with its runner in place of Red Hat's controller,
only for TrainJobs that asked for tracking and only when ``STEPWATCH_K8S_NETWORK_POLICY`` is on (off by
default; docs/kubernetes.md). It is named ``<trainjob>-stepwatch``, not after the TrainJob alone, so that
on a cluster where Red Hat's controller also runs the two never rewrite one another's policy; it is owned
by the TrainJob, so it goes with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ....protocol.progression import DEFAULT_METRICS_PORT
from .goparse import GoSyntaxError, atoi
from .progression import JOBSET_NAME, metrics_port, tracking_enabled

if TYPE_CHECKING:
    from .objects import TrainJob

__all__ = [
    "RUNNER_LABELS",
    "RUNNER_NAMESPACE",
    "network_policy",
    "network_policy_name",
    "policy_port",
]

RUNNER_NAMESPACE: Final = "stepwatch"
"""Where the runner runs when its ServiceAccount does not say (deploy/base's namespace)."""
RUNNER_LABELS: Final = {"app.kubernetes.io/name": "stepwatch", "app.kubernetes.io/component": "runner"}
"""The labels of the runner's pods in deploy/base (tests/deploy holds the two together)."""


def network_policy_name(trainjob: str) -> str:
    """The policy's name: the TrainJob's, with ``-stepwatch`` (Red Hat's own is named after the TrainJob)."""
    return f"{trainjob}-stepwatch"


def policy_port(annotations: Mapping[str, str]) -> int:
    """The metrics port for rule 2: the annotation's if ``strconv.Atoi`` reads it, else 28080 (Red Hat's
    fallback); a number outside 1..65535, which the API server would refuse, is 28080 too."""
    try:
        port = atoi(metrics_port(annotations))
    except GoSyntaxError:
        return DEFAULT_METRICS_PORT
    return port if 1 <= port <= 65535 else DEFAULT_METRICS_PORT


def network_policy(tj: TrainJob, runner_namespace: str = RUNNER_NAMESPACE) -> dict[str, Any]:
    """``buildNetworkPolicy`` with stepwatch's runner as the metrics port's peer: the policy's JSON."""
    same_job = {"podSelector": {"matchLabels": {JOBSET_NAME: tj.name}}}
    ingress: list[dict[str, Any]] = [{"from": [same_job]}]  # all ports: the nodes of one job talk freely
    if tracking_enabled(tj.annotations):
        ingress.append(
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": runner_namespace}},
                        "podSelector": {"matchLabels": dict(RUNNER_LABELS)},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": policy_port(tj.annotations)}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(tj.name),
            "namespace": tj.namespace,
            "labels": {
                "trainer.kubeflow.org/trainjob-name": tj.name,
                "trainer.kubeflow.org/component": "network-policy",
            },
            "ownerReferences": [
                {
                    "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "kind": "TrainJob",
                    "name": tj.name,
                    "uid": tj.uid,
                    "controller": True,
                    # (Red Hat's also sets blockOwnerDeletion: where the OwnerReferencesPermissionEnforcement
                    # admission plugin is on, as on OpenShift, that takes update on trainjobs/finalizers, a
                    # right the runner has no other use for; the garbage collector deletes it all the same)
                }
            ],
        },
        "spec": {
            "podSelector": {"matchLabels": {JOBSET_NAME: tj.name}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
