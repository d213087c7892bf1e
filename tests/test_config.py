"""Settings precedence, rank detection and the `stepwatch config` command."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from stepwatch._env import detect_identity
from stepwatch._settings import SETTINGS, SettingError, resolve


@pytest.mark.parametrize(
    ("arguments", "env", "expected"),
    [
        ({}, {}, {"url": None, "namespace": "default", "interval": 2.0, "disabled": False, "url_source": ""}),
        ({}, {"STEPWATCH_URL": "http://a"}, {"url": "http://a", "url_source": "STEPWATCH_URL"}),
        ({"url": "http://arg"}, {"STEPWATCH_URL": "http://a"}, {"url": "http://arg", "url_source": "argument"}),
        (
            {},
            {"STEPWATCH_URL": "http://a", "KUBEFLOW_TRAINER_SERVER_URL": "http://kf"},
            {"url": "http://a", "url_source": "STEPWATCH_URL"},
        ),
        ({}, {"KUBEFLOW_TRAINER_SERVER_URL": "http://kf"}, {"url_source": "KUBEFLOW_TRAINER_SERVER_URL"}),
        ({}, {"STEPWATCH_URL": ""}, {"url": None}),  # an empty variable is unset
        (
            {},
            {"STEPWATCH_TOKEN_FILE": "/a", "KUBEFLOW_TRAINER_SERVER_TOKEN": "/b"},
            {"token_file": "/a"},
        ),
        ({}, {"KUBEFLOW_TRAINER_SERVER_CA_CERT": "/ca.crt"}, {"ca_cert": "/ca.crt"}),
        ({}, {"STEPWATCH_INTERVAL": "0.5", "STEPWATCH_DISABLED": "yes"}, {"interval": 0.5, "disabled": True}),
        ({"interval": 9.0}, {"STEPWATCH_INTERVAL": "0.5"}, {"interval": 9.0}),
        ({}, {"STEPWATCH_HANDLE_SIGTERM": "off"}, {"handle_sigterm": False}),
    ],
)
def test_precedence(arguments: dict[str, object], env: dict[str, str], expected: dict[str, object]) -> None:
    resolved = resolve(arguments, environ=env)
    for name, value in expected.items():
        assert getattr(resolved, name) == value, name


@pytest.mark.parametrize(
    ("var", "value", "message"),
    [
        ("STEPWATCH_INTERVAL", "0", "must be a positive number of seconds, got '0'"),
        ("STEPWATCH_INTERVAL", "nan", "must be a positive number of seconds"),
        ("STEPWATCH_FLUSH_TIMEOUT", "-1", "must be a positive number of seconds"),
        ("STEPWATCH_DISABLED", "maybe", "must be true/false, 1/0, yes/no or on/off, got 'maybe'"),
    ],
)
def test_bad_values_name_the_variable(var: str, value: str, message: str) -> None:
    with pytest.raises(SettingError, match=var) as info:
        resolve({}, environ={var: value})
    assert message in str(info.value)


def test_every_setting_is_documented_once() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names))
    assert all(s.help and s.env and s.env[0].startswith("STEPWATCH_") for s in SETTINGS)


@pytest.mark.parametrize(
    ("env", "rank", "size", "local"),
    [
        ({}, 0, 1, 0),
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, 3, 8, 1),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2"}, 5, 6, 2),
        ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, 1, 2, 0),
        ({"RANK": "2", "WORLD_SIZE": "4", "SLURM_PROCID": "9", "SLURM_NTASKS": "16"}, 2, 4, 0),
        ({"RANK": "x", "WORLD_SIZE": "4"}, 0, 1, 0),
        ({"RANK": "4", "WORLD_SIZE": "4"}, 0, 1, 0),  # inconsistent: treated as a single process
        ({"RANK": "1"}, 0, 1, 0),
    ],
)
def test_rank_from_the_environment(env: dict[str, str], rank: int, size: int, local: int) -> None:
    identity = detect_identity(env)
    assert (identity.rank, identity.world_size, identity.local_rank) == (rank, size, local)
    assert identity.host == socket.gethostname()[:253] and identity.pid > 0


def test_an_initialised_torch_process_group_wins_over_the_environment() -> None:
    code = """
import os, socket, json
import torch.distributed as dist
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
from stepwatch._env import detect_identity
i = detect_identity({"RANK": "5", "WORLD_SIZE": "8"})
print(json.dumps([i.rank, i.world_size]))
dist.destroy_process_group()
"""
    pytest.importorskip("torch.distributed")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [0, 1]


def test_config_command_shows_values_and_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"PATH": "/usr/bin:/bin", "STEPWATCH_URL": "http://127.0.0.1:8642", "STEPWATCH_TOKEN": "hunter2"}
    out = subprocess.run(
        [sys.executable, "-m", "stepwatch", "config", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["settings"]}
    assert rows["url"]["value"] == "http://127.0.0.1:8642" and rows["url"]["source"] == "STEPWATCH_URL"
    assert rows["token"]["value"] == "***"  # never printed
    assert rows["namespace"]["source"] == "default"
    assert rows["metrics_port"]["value"] == "auto"  # not in a TrainJob pod: off, but the environment decides
    for given, shown in (("127.0.0.1:9", "127.0.0.1:9"), ("28080", "0.0.0.0:28080"), ("off", "off")):
        said = subprocess.run(
            [sys.executable, "-m", "stepwatch", "config", "--json"],
            env={**env, "STEPWATCH_METRICS_PORT": given},
            capture_output=True,
            text=True,
            timeout=60,
        )
        rows = {r["name"]: r for r in json.loads(said.stdout)["settings"]}
        assert rows["metrics_port"]["value"] == shown, given
    table = subprocess.run(
        [sys.executable, "-m", "stepwatch", "config"], env=env, capture_output=True, text=True, timeout=60
    )
    assert "from STEPWATCH_URL" in table.stdout and "hunter2" not in table.stdout


def test_config_command_reports_a_bad_variable() -> None:
    env = {"PATH": "/usr/bin:/bin", "STEPWATCH_INTERVAL": "soon"}
    out = subprocess.run([sys.executable, "-m", "stepwatch", "config"], env=env, capture_output=True, text=True)
    assert out.returncode == 1
    assert "STEPWATCH_INTERVAL: must be a positive number of seconds, got 'soon'" in out.stderr


def test_cli_without_a_command_prints_help() -> None:
    out = subprocess.run([sys.executable, "-m", "stepwatch"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage: stepwatch" in out.stderr
    version = subprocess.run([sys.executable, "-m", "stepwatch", "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("stepwatch ")


def test_the_documented_limits_are_the_enforced_ones() -> None:
    from pathlib import Path

    from stepwatch.protocol import LIMITS

    doc = (Path(__file__).parents[1] / "docs" / "reporting.md").read_text()
    assert f"| request body | {LIMITS.max_body_bytes // 1024} KiB" in doc
    assert f"at most {LIMITS.max_name_length} |" in doc
    assert f"| metric names | 1–{LIMITS.max_metric_name_length} printable characters |" in doc
    assert f"| metrics per report | {LIMITS.max_metrics_per_report} " in doc
    assert f"| Kubeflow metric values | strings of 1–{LIMITS.max_metric_value_length} characters |" in doc
    assert f"| hyperparameters | {LIMITS.max_params} entries; keys up to {LIMITS.max_param_key_length}" in doc
    assert f"string values up to {LIMITS.max_param_value_length}" in doc
    assert f"| reasons | {LIMITS.max_reason_length} characters |" in doc
