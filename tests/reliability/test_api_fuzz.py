"""Schema-driven fuzzing of every HTTP endpoint (Schemathesis, from the server's own ``/openapi.json``).

Each operation gets generated requests, valid and invalid (``STEPWATCH_FUZZ_EXAMPLES`` per operation,
read at import; default 25), against the ASGI app on a real temporary SQLite file. Each case is sent
twice: as generated (random names: mostly 404s and 422s), and aimed at a job that exists, with its
token, so that the generated bodies reach the deep code (ingest, the store, the analysis). No answer may
be a 5xx; an exception inside the app fails the test as well.

The live stream (``GET /api/v1/events``) never ends by design and is left out; ``tests/server/live/test_live.py``
covers it.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from wire_strategies import mutated_reports, reports, trainer_statuses

from stepwatch.protocol import Report, TrainerStatus
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.store import SQLiteStore

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

pytestmark = pytest.mark.reliability

EXAMPLES = int(os.environ.get("STEPWATCH_FUZZ_EXAMPLES", "25"))
JOB = "fuzz-job"
INGEST_JOB = "ingest-job"


class Target:
    def __init__(self, path: Path) -> None:
        self.store = SQLiteStore(path)
        self.app = create_app(ServerSettings(allowed_hosts=("testserver",)), store=self.store)
        self.client = TestClient(self.app, raise_server_exceptions=True)
        self.token = ""
        self.ingest_token = ""

    def open(self) -> None:
        """Start the app (its lifespan) and register the job the aimed cases write to."""
        self.client.__enter__()
        response = self.client.post("/api/v1/namespaces/default/jobs", json={"name": JOB})
        assert response.status_code == 201, response.text
        self.token = response.json()["token"]
        # the Hypothesis ingest tests write to a job of their own: the generated cases may end or
        # supersede the first one
        response = self.client.post("/api/v1/namespaces/default/jobs", json={"name": INGEST_JOB})
        assert response.status_code == 201, response.text
        self.ingest_token = response.json()["token"]

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        self.store.close()


# The app is made at import: Schemathesis reads its schema when the tests are collected (its
# ``from_fixture`` loader does not work with this pytest). The database is a real file, removed at the end.
_DIR = tempfile.TemporaryDirectory(prefix="stepwatch-fuzz-")
TARGET = Target(Path(_DIR.name) / "fuzz.db")
schema = schemathesis.openapi.from_asgi("/openapi.json", TARGET.app).exclude(path="/api/v1/events")


STATUSES: dict[str, Counter[int]] = {}
"""Answers per operation, shown at the end (``-s``): how deep the generated requests reached."""


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    TARGET.open()  # here, not at import: a deselected module must leave no app running
    yield TARGET
    for key, counts in sorted(STATUSES.items()):
        print(f"{key}: {dict(sorted(counts.items()))}")
    TARGET.close()
    _DIR.cleanup()


def _send(target: Target, case: Any, aimed: bool) -> None:
    headers = dict(case.headers or {})
    if aimed:
        if case.path_parameters:
            if "namespace" in case.path_parameters:
                case.path_parameters["namespace"] = "default"
            if "name" in case.path_parameters:
                case.path_parameters["name"] = JOB
        headers["Authorization"] = f"Bearer {target.token}"
    response = case.call(headers=headers)
    key = f"{case.operation.method.upper()} {case.operation.path}"
    STATUSES.setdefault(key, Counter())[response.status_code] += 1
    case.validate_response(response, checks=[not_a_server_error])


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture],
)
def test_no_endpoint_answers_5xx(case: Any, target: Target) -> None:
    _send(target, case, aimed=False)
    _send(target, case, aimed=True)


# The OpenAPI document describes report bodies loosely, so few generated ones are valid: the wire
# strategies of the protocol properties send valid and nearly valid reports through the real ingest
# path (the store, the ETA, the health analysis), and read the job back after each.


@given(report=reports())
@settings(max_examples=EXAMPLES * 2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_valid_reports_are_stored_and_read_back(target: Target, report: Report) -> None:
    client = target.client
    path = f"/api/v1/namespaces/default/jobs/{INGEST_JOB}"
    response = client.post(f"{path}/reports", json=report.to_dict(), headers=_ingest(target))
    assert response.status_code in (200, 409), response.text
    for read in ("", "/history", "/events"):
        answer = client.get(f"{path}{read}")
        assert answer.status_code == 200, answer.text


@given(body=mutated_reports())
@settings(max_examples=EXAMPLES * 2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_nearly_valid_reports_never_get_a_5xx(target: Target, body: dict[str, Any]) -> None:
    client = target.client
    path = f"/api/v1/namespaces/default/jobs/{INGEST_JOB}"
    response = client.post(f"{path}/reports", json=body, headers=_ingest(target))
    assert response.status_code < 500, response.text
    assert client.get(path).status_code == 200


@given(status=trainer_statuses)
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_kubeflow_statuses_are_stored_and_read_back(target: Target, status: TrainerStatus) -> None:
    client = target.client
    path = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/{INGEST_JOB}/status"
    response = client.post(path, json=status.to_body(), headers=_ingest(target))
    assert response.status_code in (200, 409), response.text
    assert client.get(f"/api/v1/namespaces/default/jobs/{INGEST_JOB}").status_code == 200


def _bearer(target: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.token}"}


def _ingest(target: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.ingest_token}"}


# Regressions: 5xx the fuzzing found, each now a 422.


@pytest.mark.parametrize(
    "fields",
    [
        {"gpus": 1e308, "gpu_hour_cost": 1e308},  # the cost overflowed to infinity: the answer could not be JSON
        {"gpus": 1e9 + 1},
        {"total_steps": 10**30},  # too large for the store's integers (OverflowError from the driver)
        {"gpus": 10**400},  # too large for a float (OverflowError in math.isfinite)
    ],
)
def test_register_refuses_numbers_beyond_the_limits(target: Target, fields: dict[str, Any]) -> None:
    response = target.client.post("/api/v1/namespaces/default/jobs", json={"name": "too-big", **fields})
    assert response.status_code == 422, response.text
    assert response.json()["details"]["field"] == next(iter(fields))


@pytest.mark.parametrize(
    "body",
    [
        '{"run_id":"r","seq":1,"sent_at":1%s}' % ("0" * 400),
        '{"run_id":"r","seq":1%s,"sent_at":1}' % ("0" * 30),
        '{"run_id":"r","seq":1,"sent_at":1,"progress":{"step":9223372036854775808}}',
        '{"trainerStatus":{"estimatedRemainingSeconds":1%s}}' % ("0" * 30),
    ],
)
def test_integers_beyond_the_limits_are_422(target: Target, body: str) -> None:
    path = (
        f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/{JOB}/status"
        if "trainerStatus" in body
        else f"/api/v1/namespaces/default/jobs/{JOB}/reports"
    )
    headers = {**_bearer(target), "Content-Type": "application/json"}
    response = target.client.post(path, content=body.encode(), headers=headers)
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("exit_code", [2**63, -(2**31) - 1, 2**31])
def test_an_exit_code_beyond_32_bits_is_422(target: Target, exit_code: int) -> None:
    """Found by the fuzzing: a 64-bit exit code was an OverflowError from the database driver (a 500)."""
    response = target.client.post(
        f"/api/v1/namespaces/default/jobs/{JOB}/state",
        json={"state": "running", "exit_code": exit_code},
        headers=_bearer(target),
    )
    assert response.status_code == 422, response.text
    assert response.json()["details"]["field"] == "exit_code"
