"""Upstream clients in a TrainJob's pod, unchanged, sending to stepwatch over TLS with the pod's projected
ServiceAccount token: ``kubeflow.trainer.update_trainjob_status`` (the Kubeflow SDK) and transformers'
``KubeflowCallback``. The token is issued and reviewed by a FAKE API server (``fakeapi.py``: there is no
Kubernetes API server on these machines); the stepwatch server is real (uvicorn, TLS, SQLite), and its
runner writes what the pods sent back onto the TrainJob, in the fake.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakeapi import FakeApi
from kubehelp import trainjob, wait_for

from stepwatch.cli.server import tls_files
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.runners.kubernetes.objects import ANNOTATION
from stepwatch.server.store import SQLiteStore
from stepwatch.testing.server import ServerThread


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (what cert-manager or the platform gives the Service)."""
    if shutil.which("openssl") is None:
        pytest.fail("the TLS tests need the openssl command to make a test certificate")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "tls.crt", where / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@contextmanager
def serving_tls(app: Any, cert: Path, key: Path) -> Iterator[str]:
    """The app on a real uvicorn with TLS, as ``stepwatch server --tls-certfile --tls-keyfile`` runs it."""
    files = tls_files(str(cert), str(key))  # checked as the CLI checks them
    with ServerThread(app, ssl_certfile=files["ssl_certfile"], ssl_keyfile=files["ssl_keyfile"]) as server:
        yield server.url


@pytest.fixture
def pod_env(
    fake: FakeApi, tmp_path: Path, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Any]]:
    """A stepwatch server (TLS, pod tokens, the runner) and the environment Kubeflow Trainer gives a pod of
    TrainJob nlp/llama: KUBEFLOW_TRAINER_SERVER_URL, _TOKEN (the projected token's file) and _CA_CERT."""
    cert, key = certificate
    fake.create_trainjob(trainjob("llama"))
    fake.add_pod("nlp", "llama-node-0-0", "llama")
    token = tmp_path / "token"
    token.write_text(fake.token("nlp", "llama-node-0-0"))
    settings = ServerSettings(
        kubeconfig=str(fake.kubeconfig(tmp_path / "kubeconfig")),
        k8s_pod_tokens=True,
        k8s_runner=True,
        k8s_namespaces=("nlp",),
        k8s_status_interval_s=0.2,
    )
    store = SQLiteStore(tmp_path / "sw.db")
    app = create_app(settings, store=store)
    with serving_tls(app, cert, key) as url:
        monkeypatch.setenv(
            "KUBEFLOW_TRAINER_SERVER_URL",
            f"{url}/apis/trainer.kubeflow.org/v1alpha1/namespaces/nlp/trainjobs/llama/status",
        )
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(cert))
        with httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=str(cert))) as client:
            yield {"url": url, "client": client, "fake": fake, "cert": cert}
    store.close()


def _job(env: dict[str, Any]) -> dict[str, Any] | None:
    response = env["client"].get("/api/v1/namespaces/nlp/jobs/llama")
    return response.json() if response.status_code == 200 else None


def _on_trainjob(env: dict[str, Any], step: int) -> dict[str, Any] | None:
    """The TrainJob in the fake once the runner wrote ``step`` onto it (status and annotation)."""
    obj: dict[str, Any] = env["fake"].trainjobs[("nlp", "llama")]
    metrics = {m["name"]: m["value"] for m in obj.get("status", {}).get("trainerStatus", {}).get("metrics", [])}
    note = json.loads(obj["metadata"].get("annotations", {}).get(ANNOTATION, "{}"))
    return obj if metrics.get("current_step") == str(step) and note.get("currentStep") == step else None


def test_kubeflow_sdk_update_trainjob_status_with_a_pod_token(
    pod_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("kubeflow.trainer", reason="the Kubeflow SDK (kubeflow) is not installed")
    from kubeflow.trainer import update_trainjob_status
    from kubeflow.trainer.backends.kubernetes import utils

    monkeypatch.setattr(utils, "_last_update_time", 0.0)
    monkeypatch.setattr(utils, "_cached_token", None)
    monkeypatch.setattr(utils, "_http_session", None)
    metrics: dict[str, float | int | str] = {"loss": 0.5, "current_step": 25, "total_steps": 100}
    assert update_trainjob_status(progress_percent=25, estimated_remaining_seconds=300, metrics=metrics) is True
    job = wait_for(lambda: _job(pod_env), 5, "the job")
    assert job["source"] == "kubeflow" and job["progress"]["step"] == 25
    assert job["resources"]["gpus"] == 16  # the runner registered it from the TrainJob (2 nodes x 8)
    assert job["metrics"]["loss"] == 0.5 and job["eta"]["reported_seconds"] == 300
    obj = wait_for(lambda: _on_trainjob(pod_env, 25), 10, "the status written back onto the TrainJob")
    assert obj["status"]["trainerStatus"]["progressPercentage"] == 25


@pytest.mark.slow
def test_transformers_kubeflow_callback_with_a_pod_token(pod_env: dict[str, Any]) -> None:
    pytest.importorskip("transformers", minversion="5.4", reason="KubeflowCallback is in transformers >= 5.4")
    from transformers.integrations.integration_utils import KubeflowCallback
    from transformers.trainer_callback import TrainerControl, TrainerState

    callback = KubeflowCallback()
    state = TrainerState(max_steps=200, is_world_process_zero=True)
    control = TrainerControl()
    callback.on_train_begin(None, state, control)
    for step in (100, 200):
        state.global_step, state.epoch = step, step / 100
        callback.on_log(None, state, control, logs={"loss": 2.0 - step / 200, "learning_rate": 1e-4})
        callback._last_update_time = 0.0  # its own 5 s throttle, skipped so that the test takes no 5 s
        callback.on_step_end(None, state, control)
        wait_for(lambda step=step: (_job(pod_env) or {}).get("progress", {}).get("step") == step, 5, f"step {step}")
        if step == 100:
            job = _job(pod_env)
            assert job is not None
            progress = job["progress"]
            assert (progress["percent"], progress["total_steps"], progress["epoch"]) == (50.0, 200, 1.0)
            assert job["metrics"] == {"loss": 1.5, "learning_rate": 1e-4}
    callback.on_train_end(None, state, control)  # 100 %, no time left, no step: it replaces the last status
    wait_for(lambda: (_job(pod_env) or {}).get("eta", {}).get("reported_seconds") == 0, 5, "the final status")
    job = _job(pod_env)
    assert job is not None and (job["progress"]["percent"], job["eta"]["remaining_seconds"]) == (100.0, 0.0)
    obj = wait_for(lambda: _final_on_trainjob(pod_env), 10, "the final status written back onto the TrainJob")
    status = obj["status"]["trainerStatus"]
    assert {m["name"] for m in status["metrics"]} == {"loss", "learning_rate"}  # as posted, no current_step


def _final_on_trainjob(env: dict[str, Any]) -> dict[str, Any] | None:
    """The TrainJob once the runner wrote the callback's final status onto it, as posted (100 %, ETA 0)."""
    obj: dict[str, Any] = env["fake"].trainjobs[("nlp", "llama")]
    status = obj.get("status", {}).get("trainerStatus", {})
    final = (status.get("progressPercentage"), status.get("estimatedRemainingSeconds")) == (100, 0)
    return obj if final else None


def test_the_clients_check_the_servers_certificate(
    pod_env: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clients verify the server against KUBEFLOW_TRAINER_SERVER_CA_CERT: another CA fails them."""
    from kubeflow.trainer.backends.kubernetes import utils

    other = tmp_path / "other-ca.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-keyout", str(tmp_path / "k"), "-out", str(other)],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setattr(utils, "_last_update_time", 0.0)
    monkeypatch.setattr(utils, "_http_session", None)
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(other))
    assert utils.update_trainjob_status(progress_percent=10) is False  # never raises: refused by TLS
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(pod_env["cert"]))
    monkeypatch.setattr(utils, "_http_session", None)
    assert utils.update_trainjob_status(progress_percent=10) is True
    job = _job(pod_env)
    assert job is not None and job["trainerStatus"]["progressPercentage"] == 10


def test_stepwatch_server_serves_https_with_the_tls_settings(
    certificate: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stepwatch.cli import main
    from stepwatch.server import serving

    cert, key = certificate
    served: list[dict[str, Any]] = []
    monkeypatch.setattr(serving, "serve", lambda app, **kwargs: served.append(kwargs) or True)  # (started)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    db = str(tmp_path / "sw.db")
    assert main(["server", "--port", port, "--db", db, "--tls-certfile", str(cert), "--tls-keyfile", str(key)]) == 0
    assert served[-1]["ssl_certfile"] == str(cert) and served[-1]["ssl_keyfile"] == str(key)
    assert f"https://127.0.0.1:{port}" in capsys.readouterr().out
    monkeypatch.setenv("STEPWATCH_TLS_CERTFILE", str(cert))
    monkeypatch.setenv("STEPWATCH_TLS_KEYFILE", str(key))
    assert main(["server", "--port", port, "--db", db]) == 0  # the same from the environment
    assert served[-1]["ssl_keyfile"] == str(key)
    monkeypatch.delenv("STEPWATCH_TLS_KEYFILE")
    assert main(["server", "--port", port, "--db", db]) == 2  # a certificate without its key
    assert "--tls-keyfile" in capsys.readouterr().err
    assert len(served) == 2
