"""The Kubernetes settings, read from the environment as a deployment sets them (and refused when wrong)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepwatch.server import ServerSettings


def test_kubernetes_settings_from_the_environment() -> None:
    env = {
        "STEPWATCH_K8S_RUNNER": "true",
        "STEPWATCH_K8S_NAMESPACES": "nlp, vision,,speech",
        "STEPWATCH_K8S_GRACE_S": "120",
        "STEPWATCH_K8S_DELETE_ON_STOP": "yes",
        "STEPWATCH_K8S_STATUS_INTERVAL_S": "10",
        "STEPWATCH_K8S_WRITES_PER_S": "5",
        "STEPWATCH_K8S_POD_TOKENS": "1",
        "STEPWATCH_K8S_AUDIENCE": "stepwatch",
        "STEPWATCH_K8S_JOB_RATE": "0.5",
        "STEPWATCH_K8S_ACCOUNT_RATE": "50",
        "STEPWATCH_KUBECONFIG": "/etc/kube/config",
        "STEPWATCH_TLS_CERTFILE": "/tls/tls.crt",
        "STEPWATCH_TLS_KEYFILE": "/tls/tls.key",
    }
    s = ServerSettings.resolve({}, env)
    assert (s.k8s_runner, s.k8s_namespaces, s.k8s_grace_s, s.k8s_delete_on_stop) == (
        True,
        ("nlp", "vision", "speech"),
        120.0,
        True,
    )
    assert (s.k8s_status_interval_s, s.k8s_writes_per_s, s.k8s_pod_tokens, s.k8s_audience) == (10, 5, True, "stepwatch")
    assert (s.k8s_job_rate, s.k8s_account_rate, s.kubeconfig) == (0.5, 50, "/etc/kube/config")
    assert (s.tls_certfile, s.tls_keyfile) == ("/tls/tls.crt", "/tls/tls.key")
    off = ServerSettings.resolve({}, {})
    assert not off.k8s_runner and not off.k8s_pod_tokens and off.k8s_namespaces == ()
    assert (off.k8s_status_interval_s, off.k8s_writes_per_s) == (5.0, 20.0)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("STEPWATCH_K8S_RUNNER", "maybe"),
        ("STEPWATCH_K8S_WRITES_PER_S", "0"),
        ("STEPWATCH_K8S_JOB_RATE", "-1"),
        ("STEPWATCH_K8S_GRACE_S", "0"),
        ("STEPWATCH_K8S_STATUS_INTERVAL_S", "nan"),
    ],
)
def test_wrong_kubernetes_settings_are_refused_by_name(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=variable):
        ServerSettings.resolve({}, {variable: value})


@pytest.mark.parametrize(("value", "mode"), [("poll", "poll"), (" POLL ", "poll"), ("observer", "observer")])
def test_poll_mode_and_its_network_policy_switch(value: str, mode: str) -> None:
    s = ServerSettings.resolve({}, {"STEPWATCH_K8S_MODE": value, "STEPWATCH_K8S_NETWORK_POLICY": "true"})
    assert (s.k8s_mode, s.k8s_network_policy) == (mode, True)
    assert not ServerSettings.resolve({}, {}).k8s_network_policy  # off unless asked for


def test_the_server_starts_its_runner_in_poll_mode(make_cluster: Any, tmp_path: Path) -> None:
    """The settings reach the runner (app lifespan, wiring.py), and the runner's namespace is read from its
    ServiceAccount's mount as Red Hat's controller reads its own (else ``stepwatch``)."""
    from stepwatch.server.runners.kubernetes.wiring import runner_namespace

    cluster = make_cluster(k8s_runner=True, k8s_mode="poll", k8s_network_policy=True, k8s_pod_tokens=False)
    config = cluster.app.state.k8s_runner.options.config
    assert (config.mode, config.network_policy, config.runner_namespace) == ("poll", True, "stepwatch")
    mounted = tmp_path / "namespace"
    mounted.write_text("observability\n")
    assert runner_namespace(str(mounted)) == "observability"
    assert runner_namespace(str(tmp_path / "none")) == "stepwatch"
