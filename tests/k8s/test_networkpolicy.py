"""The NetworkPolicy of poll mode (``networkpolicy.py``), against Red Hat's own tests of the one its controller
makes (``pkg/rhai/networkpolicy_test.go`` at c0df7487865d6e2ab90b14982ec7ae69ead41d30), with stepwatch's runner
where that one names Red Hat's controller. Each test names its upstream case; where stepwatch differs on
purpose the test says so (docs/kubernetes.md lists the differences with their reasons). The policy is made
only when ``STEPWATCH_K8S_NETWORK_POLICY`` is on, for TrainJobs that asked for tracking: against the FAKE API
server (``fakeapi.py``: no API server here; it follows the API's documented behaviour) through the runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubehelp import Clock, Cluster, trainjob, wait_for
from podhelp import poll_cluster, tracked

from stepwatch.protocol.progression import ANNOTATION_METRICS_PORT, ANNOTATION_TRACKING
from stepwatch.server.runners.kubernetes.networkpolicy import (
    RUNNER_LABELS,
    network_policy,
    network_policy_name,
    policy_port,
)
from stepwatch.server.runners.kubernetes.objects import TrainJob

JOBSET = "jobset.sigs.k8s.io/jobset-name"


def tj(name: str, namespace: str = "default", uid: str = "uid", **annotations: str) -> TrainJob:
    return TrainJob(namespace, name, uid, "1", 0.0, "running", annotations=annotations)


def rules(policy: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the pod isolation rule: no ports, the metrics rule: with ports), as upstream's test finds them."""
    isolation = metrics = None
    for rule in policy["spec"]["ingress"]:
        if rule.get("ports"):
            metrics = rule
        else:
            isolation = rule
    return isolation, metrics


@pytest.mark.parametrize(("name", "want"), [("my-training-job", "my-training-job"), ("job", "job")])
def test_get_network_policy_name(name: str, want: str) -> None:
    """networkpolicy_test.go TestGetNetworkPolicyName ("simple name", "short name"), a deliberate difference:
    stepwatch's is the TrainJob's name with ``-stepwatch``, so that it never rewrites Red Hat's own."""
    assert network_policy_name(name) == f"{want}-stepwatch"


@pytest.mark.parametrize(
    ("case", "trainjob", "port", "rule_count"),
    [
        (
            "progression enabled - default metrics port",
            tj("test-job", "user-namespace", "test-uid-123", **{ANNOTATION_TRACKING: "true"}),
            28080,
            2,
        ),
        (
            "progression enabled - custom metrics port",
            tj(
                "custom-port-job",
                "ml-workloads",
                "uid-456",
                **{ANNOTATION_TRACKING: "true", ANNOTATION_METRICS_PORT: "8080"},
            ),
            8080,
            2,
        ),
        ("progression disabled - only pod isolation rule", tj("no-progression-job", "default", "uid-no-prog"), None, 1),
    ],
)
def test_build_network_policy(case: str, trainjob: TrainJob, port: int | None, rule_count: int) -> None:
    """networkpolicy_test.go TestBuildNetworkPolicy, every case (``case``): metadata, labels, the owner
    reference, the pod selector, Ingress only, the rules; B23."""
    policy = network_policy(trainjob, "stepwatch")
    meta = policy["metadata"]
    assert (meta["name"], meta["namespace"]) == (f"{trainjob.name}-stepwatch", trainjob.namespace)
    assert meta["labels"] == {
        "trainer.kubeflow.org/trainjob-name": trainjob.name,
        "trainer.kubeflow.org/component": "network-policy",
    }
    [owner] = meta["ownerReferences"]
    assert (owner["name"], owner["kind"], owner["uid"], owner["controller"]) == (
        trainjob.name,
        "TrainJob",
        trainjob.uid,
        True,
    )
    assert owner["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert "blockOwnerDeletion" not in owner  # deliberate difference: it needs update on trainjobs/finalizers
    assert policy["spec"]["podSelector"] == {"matchLabels": {JOBSET: trainjob.name}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert len(policy["spec"]["ingress"]) == rule_count
    isolation, metrics = rules(policy)
    assert isolation == {"from": [{"podSelector": {"matchLabels": {JOBSET: trainjob.name}}}]}  # all ports, same ns
    if port is None:
        assert metrics is None
    else:
        assert metrics is not None
        [peer] = metrics["from"]
        assert metrics["ports"] == [{"protocol": "TCP", "port": port}]
        assert peer["podSelector"]["matchLabels"] == RUNNER_LABELS  # stepwatch's runner, not Red Hat's controller
        assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "stepwatch"}}


def test_build_network_policy_security_properties() -> None:
    """networkpolicy_test.go TestBuildNetworkPolicy_SecurityProperties, its four subtests: Ingress only; the
    metrics port only to the runner's pods (both labels) on one port; same-job pods from the same namespace
    only (no namespace selector); the owner reference that deletes it with the TrainJob."""
    trainjob = tj(
        "security-test",
        "user-namespace",
        "security-uid",
        **{ANNOTATION_TRACKING: "true", ANNOTATION_METRICS_PORT: "28080"},
    )
    policy = network_policy(trainjob, "stepwatch")
    isolation, metrics = rules(policy)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert metrics is not None and len(metrics["from"]) == 1 and len(metrics["ports"]) == 1
    labels = metrics["from"][0]["podSelector"]["matchLabels"]
    assert labels["app.kubernetes.io/name"] == "stepwatch" and labels["app.kubernetes.io/component"] == "runner"
    assert isolation is not None and "namespaceSelector" not in isolation["from"][0]
    [owner] = policy["metadata"]["ownerReferences"]
    assert owner["uid"] == "security-uid" and owner["controller"] is True


@pytest.mark.parametrize(
    ("value", "port"), [("abc", 28080), ("8080", 8080), ("+9090", 9090), ("0", 28080), ("70000", 28080), ("-1", 28080)]
)
def test_a_port_that_is_no_port_is_28080(value: str, port: int) -> None:
    """B23: a metrics port ``strconv.Atoi`` cannot read is 28080 (as upstream); one it reads but the API would
    refuse (0, beyond 65535, negative) is 28080 too (a deliberate difference: upstream's policy would fail)."""
    assert policy_port({ANNOTATION_METRICS_PORT: value}) == port


def test_the_runner_namespace_is_the_one_given() -> None:
    policy = network_policy(tj("x", **{ANNOTATION_TRACKING: "true"}), "monitoring")
    _, metrics = rules(policy)
    assert metrics is not None
    assert metrics["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}


# ------------------------------------------------------------------------------- through the runner


def test_reconcile_network_policy(make_cluster: Callable[..., Cluster]) -> None:
    """networkpolicy_test.go TestReconcileNetworkPolicy "creates new NetworkPolicy" and "updates existing
    NetworkPolicy" (the port changed to 9090): with the switch on, in poll mode, through the runner; a TrainJob
    without tracking gets none (a deliberate difference: Red Hat's controller isolates every TrainJob)."""
    clock = Clock()
    cluster, _ = poll_cluster(make_cluster, clock, network_policy=True)
    fake = cluster.fake
    fake.create_trainjob(tracked("new-job", None, "default"))
    fake.create_trainjob(trainjob("untracked", "default", nodes=1, gpus=1))
    wait_for(lambda: ("default", "new-job-stepwatch") in fake.network_policies, 10, "the policy created")
    created = fake.network_policies[("default", "new-job-stepwatch")]
    [owner] = created["metadata"]["ownerReferences"]
    assert owner["uid"] == fake.trainjobs[("default", "new-job")]["metadata"]["uid"]
    _, metrics = rules(created)
    assert metrics is not None and metrics["ports"] == [{"protocol": "TCP", "port": 28080}]
    fake.merge_patch("default", "new-job", {"metadata": {"annotations": {ANNOTATION_METRICS_PORT: "9090"}}}, "kubectl")
    wait_for(
        lambda: rules(fake.network_policies[("default", "new-job-stepwatch")])[1]["ports"][0]["port"] == 9090,  # type: ignore[index]
        10,
        "the policy updated",
    )
    cluster.wait_job("untracked", "default")
    time.sleep(0.3)
    assert set(fake.network_policies) == {("default", "new-job-stepwatch")}
    writes = [c for c in fake.calls() if "networkpolicies" in c[1] and c[0] in ("POST", "PUT")]
    assert [c[0] for c in writes] == ["POST", "PUT"]  # once each: not again at every decision


def test_no_network_policy_unless_switched_on(make_cluster: Callable[..., Cluster]) -> None:
    """Off by default: poll mode makes no NetworkPolicy and reads none."""
    cluster, _ = poll_cluster(make_cluster, Clock())
    cluster.fake.create_trainjob(tracked("llama", "1"))
    cluster.wait_job("llama")
    time.sleep(0.3)
    assert cluster.fake.network_policies == {} and not [c for c in cluster.fake.calls() if "networkpolicies" in c[1]]


def test_an_existing_policy_is_replaced_not_duplicated(make_cluster: Callable[..., Cluster]) -> None:
    """ReconcileNetworkPolicy's update: a policy of that name already there (an older runner's) has its spec and
    labels replaced, its other metadata kept."""
    clock = Clock()
    cluster, _ = poll_cluster(make_cluster, clock, network_policy=True)
    fake = cluster.fake
    meta = {
        "name": "llama-stepwatch",
        "namespace": "nlp",
        "annotations": {"note": "kept"},
        "resourceVersion": "5",
        "uid": "np",
    }
    fake.network_policies[("nlp", "llama-stepwatch")] = {"metadata": meta, "spec": {"podSelector": {}}}
    fake.create_trainjob(tracked("llama", "8080"))
    wait_for(lambda: fake.network_policies[("nlp", "llama-stepwatch")]["metadata"].get("labels"), 10, "replaced")
    policy = fake.network_policies[("nlp", "llama-stepwatch")]
    assert policy["metadata"]["annotations"] == {"note": "kept"} and policy["metadata"]["uid"] == "np"
    assert rules(policy)[1]["ports"] == [{"protocol": "TCP", "port": 8080}]  # type: ignore[index]
