"""The HTTP API of the server, in process (Starlette's TestClient on a real SQLite file) and, where the
socket matters, through a real uvicorn with a real stepwatch reporter."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import stepwatch
from stepwatch.protocol import LIMITS, Report, format_rfc3339
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.api.errors import REASONS
from stepwatch.server.store import SORT_KEYS, IngestResult, PendingReport

pytestmark = pytest.mark.both_stores

REGISTER = "/api/v1/namespaces/default/jobs"
JOB_A = "/api/v1/namespaces/default/jobs/job-a"
JOB_B = "/api/v1/namespaces/default/jobs/job-b"
KF_A = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/job-a/status"
LIMIT = LIMITS.max_body_bytes

UPSTREAM_STATUS = {
    "trainerStatus": {
        "lastUpdatedTime": "2026-12-02T15:20:54.881286+00:00",
        "progressPercentage": 49,
        "estimatedRemainingSeconds": 5,
        "metrics": [
            {"name": "loss", "value": "0.25"},
            {"name": "current_step", "value": "49"},
            {"name": "total_steps", "value": "100"},
            {"name": "current_epoch", "value": "0.49"},
        ],
    }
}
"""A status as the upstream kubeflow SDK (``update_trainjob_status``) sends it."""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


POINT_FIELDS = ("step", "last", "min", "max", "mean", "count", "nonfinite")


def core(point: dict[str, Any] | None = None, **expected: Any) -> dict[str, Any]:
    """The fields of a history point these tests speak of (``core(point)``), or the expected ones (``core(step=..)``,
    the rest None, counts 0)."""
    if point is not None:
        return {k: point[k] for k in POINT_FIELDS}
    return {k: expected.get(k, 0 if k in ("count", "nonfinite") else None) for k in POINT_FIELDS}


def assert_status(response: httpx.Response, code: int, message: str, field: str | None = None) -> dict[str, Any]:
    """The response is the one error shape: a Kubernetes Status with this code and a message saying this."""
    assert response.status_code == code, f"{response.status_code} {response.text[:300]}"
    assert response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = response.json()
    assert set(body) <= {"kind", "apiVersion", "status", "code", "reason", "message", "details"}, body
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == code and body["reason"] == REASONS[code]
    assert message in body["message"], body["message"]
    if field is None:
        assert "details" not in body, body
    else:
        assert body["details"] == {"field": field}
    return body


def good_report(seq: int = 1, step: int = 1) -> dict[str, Any]:
    return Report.from_dict(
        {
            "run_id": "run-1",
            "seq": seq,
            "sent_at": 1_800_000_000.0 + seq,
            "progress": {"step": step, "total_steps": 100},
            "metrics": [
                {
                    "name": "loss",
                    "last": 0.5,
                    "min": 0.5,
                    "max": 0.5,
                    "mean": 0.5,
                    "count": 1,
                    "first_step": step,
                    "last_step": step,
                }
            ],
        }
    ).to_dict()


def report_with(**changes: Any) -> dict[str, Any]:
    body = good_report()
    body.update(changes)
    return body


def window_with(**changes: Any) -> dict[str, Any]:
    body = good_report()
    body["metrics"] = [{**body["metrics"][0], **changes}]
    return body


def many_windows(n: int) -> list[dict[str, Any]]:
    base = good_report()["metrics"][0]
    return [{**base, "name": f"m{i}"} for i in range(n)]


def status_with(**changes: Any) -> dict[str, Any]:
    return {"trainerStatus": {**UPSTREAM_STATUS["trainerStatus"], **changes}}


def padded(body: dict[str, Any], size: int) -> bytes:
    """``body`` as JSON, padded with trailing whitespace (still valid JSON) to exactly ``size`` bytes."""
    raw = json.dumps(body).encode()
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def chunks(data: bytes, size: int = 8192) -> Callable[[], Iterator[bytes]]:
    """A generator body: sent chunked, with no Content-Length."""

    def gen() -> Iterator[bytes]:
        for i in range(0, len(data), size):
            yield data[i : i + size]

    return gen


_UNSET: Any = object()


@dataclasses.dataclass(frozen=True)
class Case:
    """One failing request: what is sent, and the code, message and field of the Status expected."""

    method: str
    path: str
    code: int
    message: str
    field: str | None = None
    json: Any = _UNSET
    content: bytes | Callable[[], Iterator[bytes]] | None = None
    token: str | None = "a"
    """Whose token the request carries: ``a`` (job-a's), ``b`` (job-b's), ``wrong``, or none."""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    params: dict[str, str] = dataclasses.field(default_factory=dict)


JSON = {"Content-Type": "application/json"}
"""What every client sends with a body (the guard refuses other types: tests/server/api/test_guard.py)."""
BIG = padded({"name": "big"}, LIMIT + 1)
BIG_REPORT = padded(good_report(), LIMIT + 1)
BIG_STATUS = padded(UPSTREAM_STATUS, 2 * LIMIT)

ERROR_CASES = [
    # ---------------------------------------------------------------------------- register
    pytest.param(Case("POST", REGISTER, 422, "body is not valid JSON", content=b'{"name":'), id="register-malformed"),
    pytest.param(Case("POST", REGISTER, 422, "body is not valid JSON", content=b"\xff\xfe"), id="register-not-utf8"),
    pytest.param(
        Case("POST", REGISTER, 422, "body nests too deeply", content=b"[" * 50_000), id="register-deep-nesting"
    ),
    pytest.param(Case("POST", REGISTER, 422, "the body must be a JSON object, got list", json=[]), id="register-list"),
    pytest.param(Case("POST", REGISTER, 422, "name is required", "name", json={}), id="register-no-name"),
    pytest.param(
        Case("POST", REGISTER, 422, "(a Kubernetes name), got 5", "name", json={"name": 5}), id="register-name-type"
    ),
    pytest.param(
        Case(
            "POST",
            REGISTER,
            422,
            "total_steps must be an integer >= 1, got '10'",
            "total_steps",
            json={"name": "x", "total_steps": "10"},
        ),
        id="register-total-steps-type",
    ),
    pytest.param(
        Case(
            "POST",
            REGISTER,
            422,
            "total_steps must be an integer >= 1, got 0",
            "total_steps",
            json={"name": "x", "total_steps": 0},
        ),
        id="register-total-steps-zero",
    ),
    pytest.param(
        Case(
            "POST", REGISTER, 422, "gpus must be a finite number >= 0, got -1", "gpus", json={"name": "x", "gpus": -1}
        ),
        id="register-negative-gpus",
    ),
    pytest.param(
        Case(
            "POST",
            REGISTER,
            422,
            "total_epochs must be a finite number >= 0",
            "total_epochs",
            content=b'{"name": "x", "total_epochs": Infinity}',
        ),
        id="register-infinite-epochs",
    ),
    pytest.param(
        Case("POST", REGISTER, 422, "must be a JSON object, got list", "params", json={"name": "x", "params": [1]}),
        id="register-params-list",
    ),
    pytest.param(
        Case(
            "POST",
            REGISTER,
            422,
            "source must be one of native, runner, kubeflow, got 'slurm'",
            "source",
            json={"name": "x", "source": "slurm"},
        ),
        id="register-source",
    ),
    pytest.param(
        Case("POST", REGISTER, 409, "job default/job-a is pending (attempt 1)", "name", json={"name": "job-a"}),
        id="register-live-job",
    ),
    pytest.param(
        Case(
            "POST",
            REGISTER,
            422,
            "supersede must be true or false, got 'yes'",
            "supersede",
            json={"name": "x", "supersede": "yes"},
        ),
        id="register-supersede-type",
    ),
    pytest.param(
        Case("POST", "/api/v1/namespaces/Team_A/jobs", 404, "no namespace named 'Team_A'", json={"name": "x"}),
        id="register-bad-namespace",
    ),
    pytest.param(
        Case("POST", REGISTER, 422, "name", "name", json={"name": "Bad_Name"}),
        id="register-bad-name-in-body",
    ),
    pytest.param(
        Case("POST", REGISTER, 413, f"body is {LIMIT + 1} bytes; the limit is 65536 bytes (64 KiB)", content=BIG),
        id="register-too-large",
    ),
    pytest.param(
        Case("POST", REGISTER, 413, "body is over the limit of 65536 bytes (64 KiB)", content=chunks(BIG)),
        id="register-too-large-chunked",
    ),
    # ------------------------------------------------------------------------------ native report
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            403,
            "a bearer token is required to write to job default/job-a",
            json=good_report(),
            token=None,
        ),
        id="report-no-token",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            403,
            "a bearer token is required",
            json=good_report(),
            token=None,
            headers={"Authorization": "Basic dXNlcjpwdw=="},
        ),
        id="report-basic-auth",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            403,
            "a bearer token is required",
            json=good_report(),
            token=None,
            headers={"Authorization": "Bearer   "},
        ),
        id="report-empty-token",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            403,
            "this token cannot write to job default/job-a",
            json=good_report(),
            token="wrong",
        ),
        id="report-wrong-token",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            403,
            "this token cannot write to job default/job-a",
            json=good_report(),
            token="b",
        ),
        id="report-other-jobs-token",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/v1/namespaces/default/jobs/nope/reports",
            404,
            "job default/nope not found; register it first",
            json=good_report(),
        ),
        id="report-unknown-job",
    ),
    pytest.param(
        Case("POST", "/api/v1/namespaces/default/jobs/Job_A/reports", 404, "no job named 'Job_A'", json=good_report()),
        id="report-bad-job-name",
    ),
    pytest.param(
        Case(
            "POST", f"/api/v1/namespaces/{'n' * 64}/jobs/job-a/reports", 404, "no namespace named", json=good_report()
        ),
        id="report-namespace-too-long",
    ),
    pytest.param(
        Case("POST", f"{JOB_A}/reports", 422, "body is not valid JSON", content=b'{"run_id": "r", '),
        id="report-malformed",
    ),
    pytest.param(Case("POST", f"{JOB_A}/reports", 422, "must be a JSON object, got list", json=[1]), id="report-list"),
    pytest.param(
        Case("POST", f"{JOB_A}/reports", 422, "is required", "run_id", json={"seq": 1, "sent_at": 1.0}),
        id="report-no-run-id",
    ),
    pytest.param(
        Case("POST", f"{JOB_A}/reports", 422, "must be an integer, got '1'", "seq", json=report_with(seq="1")),
        id="report-seq-type",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "this server speaks 'v1', got 'v2'",
            "api_version",
            json=report_with(api_version="v2"),
        ),
        id="report-api-version",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "must be >= 0, got -1",
            "progress.step",
            json=report_with(progress={"step": -1}),
        ),
        id="report-negative-step",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "must be >= 0, got -5",
            "metrics[0].first_step",
            json=window_with(first_step=-5),
        ),
        id="report-negative-window-step",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "must be <= 0, got 1",
            "identity.rank",
            json=report_with(identity={"rank": 1, "world_size": 1}),
        ),
        id="report-rank-outside-world",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "at most 256 items, got 257",
            "metrics",
            json=report_with(metrics=many_windows(257)),
        ),
        id="report-257-metrics",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "a metric name must be 1-64 printable characters",
            "metrics[0].name",
            json=window_with(name="x" * 65),
        ),
        id="report-metric-name-too-long",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "(no control characters), got 'loss\\n'",
            "metrics[0].name",
            json=window_with(name="loss\n"),
        ),
        id="report-metric-name-newline",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "(no control characters)",
            "metrics[0].name",
            json=window_with(name="lo\x00ss"),
        ),
        id="report-metric-name-nul",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "a metric name must be 1-64 printable characters",
            "metrics[0].name",
            json=window_with(name=""),
        ),
        id="report-metric-name-empty",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "duplicate metric 'loss' in one report",
            "metrics[1].name",
            json=report_with(metrics=[good_report()["metrics"][0]] * 2),
        ),
        id="report-duplicate-metric",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            422,
            "must be a number or 'NaN', 'Infinity', '-Infinity', got 'nan'",
            "metrics[0].last",
            json=window_with(last="nan"),
        ),
        id="report-value-string",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            413,
            f"body is {LIMIT + 1} bytes; the limit is 65536 bytes (64 KiB)",
            content=BIG_REPORT,
        ),
        id="report-too-large",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            413,
            "body is over the limit of 65536 bytes (64 KiB)",
            content=chunks(BIG_REPORT),
        ),
        id="report-too-large-chunked",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            413,
            "body is over the limit of 65536 bytes (64 KiB)",
            content=BIG_REPORT,
            headers={"Content-Length": "100"},
        ),
        id="report-too-large-lying-length",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/reports",
            400,
            "Content-Length is not a number: 'abc'",
            content=b"{}",
            headers={"Content-Length": "abc"},
        ),
        id="report-content-length-not-a-number",
    ),
    pytest.param(
        Case("GET", f"{JOB_A}/reports", 405, "GET is not allowed on /api/v1/namespaces/default/jobs/job-a/reports"),
        id="report-wrong-method",
    ),
    # ------------------------------------------------------------------------------ kubeflow status
    pytest.param(
        Case(
            "POST",
            KF_A,
            403,
            "a bearer token is required to write to job default/job-a",
            json=UPSTREAM_STATUS,
            token=None,
        ),
        id="kubeflow-no-token",
    ),
    pytest.param(
        Case("POST", KF_A, 403, "this token cannot write to job default/job-a", json=UPSTREAM_STATUS, token="wrong"),
        id="kubeflow-wrong-token",
    ),
    pytest.param(
        Case("POST", KF_A, 403, "this token cannot write to job default/job-a", json=UPSTREAM_STATUS, token="b"),
        id="kubeflow-other-jobs-token",
    ),
    pytest.param(
        # upstream authorises before it looks the TrainJob up: no token tells which jobs exist
        Case(
            "POST",
            KF_A.replace("job-a", "nope"),
            403,
            "this token cannot write to job default/nope",
            json=UPSTREAM_STATUS,
        ),
        id="kubeflow-unknown-job",
    ),
    pytest.param(
        Case("POST", KF_A, 413, f"body is {2 * LIMIT} bytes; the limit is 65536 bytes", content=BIG_STATUS),
        id="kubeflow-too-large",
    ),
    pytest.param(
        Case("POST", KF_A, 413, "body is over the limit of 65536 bytes", content=chunks(BIG_STATUS)),
        id="kubeflow-too-large-chunked",
    ),
    pytest.param(Case("POST", KF_A, 422, "body is not valid JSON", content=b"{"), id="kubeflow-malformed"),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "is required when trainerStatus is present",
            "trainerStatus.lastUpdatedTime",
            json={"trainerStatus": {"progressPercentage": 5}},
        ),
        id="kubeflow-no-last-updated-time",
    ),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "must be <= 100, got 101",
            "trainerStatus.progressPercentage",
            json=status_with(progressPercentage=101),
        ),
        id="kubeflow-percent-over-100",
    ),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "must be an integer, got 49.5",
            "trainerStatus.progressPercentage",
            json=status_with(progressPercentage=49.5),
        ),
        id="kubeflow-percent-float",
    ),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "must be >= 0, got -1",
            "trainerStatus.estimatedRemainingSeconds",
            json=status_with(estimatedRemainingSeconds=-1),
        ),
        id="kubeflow-negative-eta",
    ),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "must be an RFC 3339 time",
            "trainerStatus.lastUpdatedTime",
            json=status_with(lastUpdatedTime="yesterday"),
        ),
        id="kubeflow-bad-time",
    ),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "must not be empty",
            "trainerStatus.metrics[0].value",
            json=status_with(metrics=[{"name": "loss", "value": ""}]),
        ),
        id="kubeflow-empty-value",
    ),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "must be at most 64 characters, got 65",
            "trainerStatus.metrics[0].value",
            json=status_with(metrics=[{"name": "loss", "value": "1" * 65}]),
        ),
        id="kubeflow-value-too-long",
    ),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "must be a string, got 0.5",
            "trainerStatus.metrics[0].value",
            json=status_with(metrics=[{"name": "loss", "value": 0.5}]),
        ),
        id="kubeflow-value-number",
    ),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "(no control characters)",
            "trainerStatus.metrics[0].name",
            json=status_with(metrics=[{"name": "loss\t", "value": "1"}]),
        ),
        id="kubeflow-name-control",
    ),
    pytest.param(
        Case(
            "POST",
            KF_A,
            422,
            "at most 256 items, got 257",
            "trainerStatus.metrics",
            json=status_with(metrics=[{"name": f"m{i}", "value": "1"} for i in range(257)]),
        ),
        id="kubeflow-257-metrics",
    ),
    pytest.param(Case("GET", KF_A, 405, f"GET is not allowed on {KF_A}"), id="kubeflow-wrong-method"),
    # ------------------------------------------------------------------------------ state
    pytest.param(
        Case("POST", f"{JOB_A}/state", 403, "a bearer token is required", json={"state": "finished"}, token=None),
        id="state-no-token",
    ),
    pytest.param(
        Case("POST", f"{JOB_A}/state", 403, "this token cannot write", json={"state": "finished"}, token="b"),
        id="state-other-jobs-token",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/state",
            422,
            "state must be one of running, finished, failed, stopped, got 'pending'",
            "state",
            json={"state": "pending"},
        ),
        id="state-pending",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/state",
            422,
            "exit_code must be an integer",
            "exit_code",
            json={"state": "failed", "exit_code": "1"},
        ),
        id="state-exit-code-type",
    ),
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/state",
            422,
            "reason must be a string of at most 256 characters",
            "reason",
            json={"state": "failed", "reason": "x" * 257},
        ),
        id="state-reason-too-long",
    ),
    # ------------------------------------------------------------------------------ commands
    pytest.param(
        Case(
            "POST",
            f"{JOB_A}/commands",
            422,
            "kind must be one of stop, checkpoint, got 'pause'",
            "kind",
            json={"kind": "pause"},
        ),
        id="command-kind",
    ),
    pytest.param(
        Case("POST", f"{JOB_A}/commands", 422, "kind is required: one of stop, checkpoint", "kind", json={}),
        id="command-no-kind",
    ),
    pytest.param(
        Case("POST", f"{JOB_A}/commands", 422, "reason must be a string", "reason", json={"kind": "stop", "reason": 5}),
        id="command-reason-type",
    ),
    pytest.param(
        Case("POST", f"{JOB_A}/commands", 422, "body is not valid JSON", content=b"stop"), id="command-malformed"
    ),
    pytest.param(
        Case(
            "POST",
            "/api/v1/namespaces/default/jobs/done/commands",
            409,
            "job default/done has already finished: there is nothing to stop",
            "kind",
            json={"kind": "stop"},
        ),
        id="command-finished-job",
    ),
    pytest.param(
        Case(
            "POST",
            "/api/v1/namespaces/default/jobs/nope/commands",
            404,
            "job default/nope not found",
            json={"kind": "stop"},
        ),
        id="command-unknown-job",
    ),
    # ------------------------------------------------------------------------------ reads
    pytest.param(
        Case("GET", "/api/v1/namespaces/default/jobs/nope", 404, "job default/nope not found"), id="get-unknown-job"
    ),
    pytest.param(Case("GET", "/api/v1/namespaces/default/jobs/-x", 404, "no job named '-x'"), id="get-bad-name"),
    pytest.param(
        Case("GET", JOB_A, 404, "job default/job-a has no attempt 5 (latest: 1)", "attempt", params={"attempt": "5"}),
        id="get-unknown-attempt",
    ),
    pytest.param(
        Case("GET", JOB_A, 400, "attempt must be between 1 and 1e+09, got '0'", "attempt", params={"attempt": "0"}),
        id="get-attempt-zero",
    ),
    pytest.param(
        Case("GET", JOB_A, 400, "attempt must be a number, got 'one'", "attempt", params={"attempt": "one"}),
        id="get-attempt-text",
    ),
    pytest.param(
        Case("GET", JOB_A, 400, "attempt", "attempt", params={"attempt": "1e300"}),
        id="get-attempt-huge",
    ),
    pytest.param(Case("DELETE", JOB_A, 405, f"DELETE is not allowed on {JOB_A}"), id="job-wrong-method"),
    pytest.param(
        Case(
            "GET",
            "/api/v1/jobs",
            400,
            "sort must be one of name, namespace, state, progress, step, created, "
            "updated, eta, '-' first for descending",
            "sort",
            params={"sort": "bogus"},
        ),
        id="list-sort-bogus",
    ),
    pytest.param(
        Case("GET", "/api/v1/jobs", 400, "sort must be one of", "sort", params={"sort": "--name"}),
        id="list-sort-double-minus",
    ),
    pytest.param(
        Case("GET", "/api/v1/jobs", 400, "limit must be between 1 and 10000, got '0'", "limit", params={"limit": "0"}),
        id="list-limit-zero",
    ),
    pytest.param(
        Case("GET", "/api/v1/jobs", 400, "limit must be a number, got 'abc'", "limit", params={"limit": "abc"}),
        id="list-limit-text",
    ),
    pytest.param(
        Case(
            "GET",
            "/api/v1/jobs",
            400,
            "limit must be between 1 and 10000, got '10001'",
            "limit",
            params={"limit": "10001"},
        ),
        id="list-limit-too-big",
    ),
    pytest.param(
        Case(
            "GET",
            "/api/v1/jobs",
            400,
            "offset must be between 0 and 1e+09, got '-1'",
            "offset",
            params={"offset": "-1"},
        ),
        id="list-offset-negative",
    ),
    pytest.param(
        Case("GET", "/api/v1/jobs", 400, "offset", "offset", params={"offset": "1e19"}),
        id="list-offset-huge",
    ),
    pytest.param(
        Case(
            "GET",
            "/api/v1/jobs",
            400,
            "state must be among pending, running, finished, failed, stopped, got 'bogus'",
            "state",
            params={"state": "running,bogus"},
        ),
        id="list-state-bogus",
    ),
    pytest.param(
        Case(
            "GET",
            "/api/v1/jobs",
            400,
            "min_progress must be between 0 and 100, got '101'",
            "min_progress",
            params={"min_progress": "101"},
        ),
        id="list-min-progress-101",
    ),
    pytest.param(
        Case(
            "GET",
            "/api/v1/jobs",
            400,
            "max_progress must be between 0 and 100, got 'nan'",
            "max_progress",
            params={"max_progress": "nan"},
        ),
        id="list-max-progress-nan",
    ),
    pytest.param(
        Case(
            "GET",
            "/api/v1/jobs",
            400,
            "health must be among healthy, stalled",
            "health",
            params={"health": "stalled,sick"},
        ),
        id="list-health",
    ),
    pytest.param(
        Case(
            "GET", "/api/v1/namespaces/default/jobs", 400, "limit must be a number", "limit", params={"limit": "1;drop"}
        ),
        id="list-namespace-limit-text",
    ),
    pytest.param(
        Case("GET", "/api/v1/namespaces/Team_A/jobs", 404, "no namespace named 'Team_A'"),
        id="list-bad-namespace",
    ),
    pytest.param(Case("PUT", "/api/v1/jobs", 405, "PUT is not allowed on /api/v1/jobs"), id="list-wrong-method"),
    pytest.param(
        Case(
            "GET",
            f"{JOB_A}/history",
            400,
            "max_points must be between 2 and 10000, got '1'",
            "max_points",
            params={"max_points": "1"},
        ),
        id="history-max-points-1",
    ),
    pytest.param(
        Case(
            "GET",
            f"{JOB_A}/history",
            400,
            "max_points must be a number, got 'all'",
            "max_points",
            params={"max_points": "all"},
        ),
        id="history-max-points-text",
    ),
    pytest.param(
        Case(
            "GET",
            f"{JOB_A}/history",
            400,
            "metric names are 1-64 printable characters, got 'lo\\nss'",
            "metrics",
            params={"metrics": "loss,lo\nss"},
        ),
        id="history-metric-control-char",
    ),
    pytest.param(
        Case(
            "GET",
            f"{JOB_A}/history",
            400,
            "metric names are 1-64 printable characters",
            "metrics",
            params={"metrics": "x" * 65},
        ),
        id="history-metric-too-long",
    ),
    pytest.param(
        Case("GET", "/api/v1/namespaces/default/jobs/nope/history", 404, "job default/nope not found"),
        id="history-unknown-job",
    ),
    pytest.param(
        Case(
            "GET",
            f"{JOB_A}/events",
            400,
            "after must be between 0 and 4.61169e+18, got '-1'",
            "after",
            params={"after": "-1"},
        ),
        id="events-after-negative",
    ),
    pytest.param(
        Case(
            "GET",
            f"{JOB_A}/events",
            400,
            "limit must be between 1 and 1000, got '1001'",
            "limit",
            params={"limit": "1001"},
        ),
        id="events-limit-too-big",
    ),
    pytest.param(
        Case("GET", f"{JOB_A}/events", 400, "after", "after", params={"after": "inf"}),
        id="events-after-inf",
    ),
    pytest.param(
        Case("GET", "/api/v1/namespaces/default/jobs/nope/commands", 404, "job default/nope not found"),
        id="commands-unknown-job",
    ),
    # ------------------------------------------------------------------------------ live, meta, unknown
    pytest.param(
        Case(
            "GET",
            "/api/v1/events",
            400,
            "Last-Event-ID must be an event id (an integer), got 'abc'",
            headers={"Last-Event-ID": "abc"},
        ),
        id="sse-last-event-id",
    ),
    pytest.param(
        Case("GET", "/api/v1/events", 400, "Last-Event-ID must be an event id", params={"last_event_id": "1.5"}),
        id="sse-last-event-id-query",
    ),
    pytest.param(
        Case("GET", "/api/v1/events", 404, "no namespace named 'Team_A'", params={"namespace": "Team_A"}),
        id="sse-bad-namespace",
    ),
    pytest.param(Case("GET", "/api/v1/events", 404, "no job named 'a_b'", params={"job": "a_b"}), id="sse-bad-job"),
    pytest.param(
        Case("POST", "/api/v1/events", 405, "POST is not allowed on /api/v1/events", headers=JSON), id="sse-post"
    ),
    pytest.param(
        Case(
            "POST",
            REGISTER,
            415,
            "a POST to this server must be JSON (Content-Type: application/json), got Content-Type 'text/plain'",
            content=b'{"name": "x"}',
            headers={"Content-Type": "text/plain"},
            token=None,  # a cross-site form's shape: no Authorization header (one would need a preflight)
        ),
        id="post-not-json",
    ),
    pytest.param(Case("GET", "/api/v2/jobs", 404, "no route for GET /api/v2/jobs"), id="unknown-route"),
    pytest.param(Case("GET", "/docs/assets/nope.js", 404, "no route for GET /docs/assets/nope.js"), id="unknown-asset"),
    pytest.param(Case("POST", "/healthz", 405, "POST is not allowed on /healthz"), id="healthz-post"),
]


@pytest.fixture
def seeded(api: Any) -> dict[str, str]:
    """Tokens of job-a and job-b (pending), and of ``done`` (finished)."""
    tokens = {"a": api.register("job-a"), "b": api.register("job-b"), "wrong": "not-a-token-" + "x" * 30}
    done = api.register("done")
    api.set_state("done", done, "finished")
    return tokens


@pytest.mark.parametrize("case", ERROR_CASES)
def test_every_error_is_a_status_object_with_the_documented_code(api: Any, seeded: dict[str, str], case: Case) -> None:
    headers = dict(case.headers)
    if case.token is not None and "Authorization" not in headers:
        headers.update(bearer(seeded[case.token]))
    if case.method == "POST":
        headers.setdefault("Content-Type", "application/json")  # what every client says; the body is at fault
    kwargs: dict[str, Any] = {"headers": headers, "params": case.params}
    if case.json is not _UNSET:
        kwargs["json"] = case.json
    elif case.content is not None:
        kwargs["content"] = case.content() if callable(case.content) else case.content
    response = api.client.request(case.method, case.path, **kwargs)
    assert_status(response, case.code, case.message, case.field)


def test_a_body_of_exactly_64_kib_is_accepted(api: Any) -> None:
    token = api.register("edge")
    body = padded(good_report(), LIMIT)
    response = api.client.post(f"{api.job_path('edge')}/reports", content=body, headers={**bearer(token), **JSON})
    assert response.status_code == 200, response.text
    chunked = padded(good_report(seq=2), LIMIT)
    response = api.client.post(
        f"{api.job_path('edge')}/reports", content=chunks(chunked)(), headers={**bearer(token), **JSON}
    )
    assert response.status_code == 200, response.text


def test_a_405_says_which_methods_are_allowed(api: Any) -> None:
    response = api.client.delete("/api/v1/jobs")
    assert_status(response, 405, "DELETE is not allowed")
    assert "GET" in response.headers.get("allow", "")


def test_a_token_of_another_job_writes_nothing(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    token_a = api.register("job-a")
    api.register("job-b")
    assert api.report("job-b", token_a, make_report(1, 5, {"loss": 1.0})).status_code == 403
    assert api.kubeflow("job-b", token_a, UPSTREAM_STATUS).status_code == 403
    response = api.client.post(f"{api.job_path('job-b')}/state", json={"state": "failed"}, headers=bearer(token_a))
    assert response.status_code == 403
    job_b = api.job("job-b")
    assert job_b["state"] == "pending" and job_b["progress"]["step"] is None
    assert job_b["metric_names"] == [] and job_b["times"]["last_report"] is None
    assert api.history("job-b") == {}
    assert [e["kind"] for e in api.events("job-b")] == ["registered"]
    stats = api.client.get("/healthz").json()["stats"]
    assert stats == {"reports": 0, "duplicates": 0, "statuses": 0, "over_limit": 0}


def test_non_finite_register_params_are_rejected_and_do_not_poison_reads(api: Any) -> None:
    response = api.client.post(
        REGISTER, content=b'{"name": "poison", "params": {"lr": NaN, "wd": Infinity}}', headers=JSON
    )
    assert response.status_code in (201, 422), response.text
    assert api.client.get("/api/v1/jobs").status_code == 200
    if response.status_code == 201:
        assert api.client.get(api.job_path("poison")).status_code == 200


# ------------------------------------------------------------------------------------------ non-finite values


def test_nan_and_infinities_are_kept_and_flagged(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    token = api.register("diverge", total_steps=100)
    api.report_ok("diverge", token, make_report(1, 10, {"loss": 0.5, "grad_norm": 1.0}))
    assert api.job("diverge")["nonfinite_total"] == 0
    api.report_ok(
        "diverge",
        token,
        make_report(2, 20, {"loss": [0.4, math.nan], "grad_norm": [math.inf], "lr": [-math.inf, 1e-3, -math.inf]}),
    )
    job = api.job("diverge")
    assert job["metrics"] == {"grad_norm": "Infinity", "loss": "NaN", "lr": "-Infinity"}
    assert job["nonfinite_total"] == 4
    kubeflow_view = {m["name"]: m["value"] for m in job["trainerStatus"]["metrics"]}
    assert kubeflow_view == {"current_step": "20", "grad_norm": "Inf", "loss": "NaN", "lr": "-Inf"}

    history = {name: [core(p) for p in points] for name, points in api.history("diverge").items()}
    assert history["loss"][-1] == core(step=20, last="NaN", min=0.4, max=0.4, mean=0.4, count=2, nonfinite=1)
    assert history["grad_norm"][-1] == core(step=20, last="Infinity", count=1, nonfinite=1)
    assert history["lr"] == [core(step=20, last="-Infinity", min=1e-3, max=1e-3, mean=1e-3, count=3, nonfinite=2)]
    assert api.history("diverge")["loss"][-1]["t"] == api.clock.now
    # bare NaN / Infinity tokens (what Python's json.dumps writes by default) are read the same way
    raw = json.dumps(make_report(3, 30, {"loss": [math.nan]}))
    assert '"last": "NaN"' in raw
    raw = raw.replace('"last": "NaN"', '"last": NaN')
    response = api.client.post(f"{api.job_path('diverge')}/reports", content=raw, headers={**bearer(token), **JSON})
    assert response.status_code == 200, response.text
    assert api.job("diverge")["nonfinite_total"] == 5
    assert core(api.history("diverge", metrics="loss")["loss"][-1]) == core(step=30, last="NaN", count=1, nonfinite=1)


# ------------------------------------------------------------------------------------------ order and repeats


def test_an_older_report_is_history_but_does_not_move_progress_back(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    token = api.register("late", total_steps=100)
    api.report_ok("late", token, make_report(2, 50, {"loss": 0.2}, sent_at=2000.0))
    api.clock.advance(1)
    api.report_ok("late", token, make_report(1, 40, {"loss": 0.3}, sent_at=1990.0))  # delivered late (a retry)
    job = api.job("late")
    assert job["progress"]["step"] == 50 and job["progress"]["percent"] == 50.0
    assert [(p["step"], p["last"]) for p in api.history("late")["loss"]] == [(40, 0.3), (50, 0.2)]
    # another rank's report does not move rank 0's progress either
    api.report_ok("late", token, make_report(1, 10, run_id="run-1", rank=1, world_size=2, sent_at=2100.0))
    assert api.job("late")["progress"]["step"] == 50


def test_an_older_report_does_not_change_the_latest_metric_values(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    token = api.register("late", total_steps=100)
    api.report_ok("late", token, make_report(2, 50, {"loss": 0.2}, sent_at=2000.0))
    api.report_ok("late", token, make_report(1, 40, {"loss": 0.3}, sent_at=1990.0))
    assert api.job("late")["metrics"] == {"loss": 0.2}


def test_negative_steps_are_rejected_without_a_trace(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    token = api.register("neg")
    body = make_report(1, 5, {"loss": 1.0})
    body["progress"]["step"] = -3
    assert_status(api.report("neg", token, body), 422, "must be >= 0, got -3", "progress.step")
    body = make_report(1, 5, {"loss": 1.0})
    body["metrics"][0]["first_step"] = body["metrics"][0]["last_step"] = -1
    assert_status(api.report("neg", token, body), 422, "must be >= 0, got -1", "metrics[0].first_step")
    assert api.job("neg")["state"] == "pending" and api.history("neg") == {}
    # the same seq, valid now, is accepted: a rejected report was not recorded as seen
    api.report_ok("neg", token, make_report(1, 5, {"loss": 1.0}))
    assert api.job("neg")["progress"]["step"] == 5


def test_a_repeated_report_is_stored_once_and_answered_again(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    token = api.register("retry")
    command = api.client.post(f"{api.job_path('retry')}/commands", json={"kind": "checkpoint", "reason": "hourly"})
    assert command.status_code == 201
    body = make_report(1, 10, {"loss": 0.5})
    first = api.report_ok("retry", token, body)
    api.clock.advance(5)
    again = api.report_ok("retry", token, body)
    assert first == again == {"accepted_seq": 1, "commands": [command.json()]}
    assert len(api.history("retry")["loss"]) == 1
    assert api.job("retry")["times"]["last_report"] == api.clock.now - 5
    assert [e["kind"] for e in api.events("retry")] == ["registered", "command", "running"]
    assert api.client.get("/healthz").json()["stats"] == {"reports": 1, "duplicates": 1, "statuses": 0, "over_limit": 0}
    # the same seq from another run (a restarted process) or another rank is a new report
    api.report_ok("retry", token, make_report(1, 11, {"loss": 0.4}, run_id="run-2", sent_at=1_800_000_100.0))
    assert len(api.history("retry")["loss"]) == 2


def test_metric_names_people_log_are_accepted(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    token = api.register("names")
    names = ["train/loss", "eval_accuracy", "rewards/chosen", "λ (weight)", "x" * 64]
    api.report_ok("names", token, make_report(1, 1, dict.fromkeys(names, 1.0)))
    assert api.job("names")["metric_names"] == sorted(names)
    assert list(api.history("names", metrics="rewards/chosen,train/loss")) == ["rewards/chosen", "train/loss"]


# ------------------------------------------------------------------------------------------ attempts


def test_a_live_job_cannot_be_registered_again_and_an_ended_one_gets_a_new_attempt(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    first = api.register("train", total_steps=100, gpus=8, gpu_hour_cost=2.5, params={"lr": 0.1})
    view = api.job("train")
    assert (view["attempt"], view["state"], view["params"]) == (1, "pending", {"lr": 0.1})
    assert view["resources"] == {"gpus": 8.0, "gpu_type": None, "gpu_hour_cost": 2.5}
    api.report_ok("train", first, make_report(1, 30, {"loss": 0.9}))
    response = api.client.post(REGISTER, json={"name": "train"})
    assert_status(
        response,
        409,
        "job default/train is running (attempt 1): stop it or pick another name; a new attempt starts once it has "
        "ended",
        "name",
    )
    # the same name in another namespace is another job
    assert api.register("train", namespace="other")
    api.set_state("train", first, "finished", exit_code=0)

    second = api.register("train", total_steps=200)
    assert second != first
    latest = api.job("train")
    assert (latest["attempt"], latest["state"], latest["progress"]["total_steps"]) == (2, "pending", 200)
    assert latest["metric_names"] == [] and latest["params"] == {}
    earlier = api.job("train", attempt=1)
    assert (earlier["attempt"], earlier["state"], earlier["exit_code"]) == (1, "finished", 0)
    assert earlier["progress"]["step"] == 30 and earlier["metric_names"] == ["loss"]

    # the old token cannot write to the new attempt; the new one does, and histories stay apart
    assert api.report("train", first, make_report(1, 1, {"loss": 5.0}, run_id="run-2")).status_code == 403
    api.report_ok("train", second, make_report(1, 7, {"loss": 2.0}, run_id="run-2"))
    assert [p["last"] for p in api.history("train")["loss"]] == [2.0]
    assert api.job("train", attempt=1)["progress"]["step"] == 30
    earlier_id = api.store.job("default", "train", 1).id
    assert [p.last for p in api.store.series(earlier_id, "loss")] == [0.9]
    assert [e["kind"] for e in api.events("train")] == ["registered", "running"]
    everything = api.jobs(all_attempts="true", sort="created")
    assert [(j["namespace"], j["name"], j["attempt"]) for j in everything["items"]] == [
        ("default", "train", 1),
        ("other", "train", 1),
        ("default", "train", 2),
    ]


def test_supersede_fails_the_live_attempt_and_starts_the_next(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    first = api.register("crashy")
    api.report_ok("crashy", first, make_report(1, 30, {"loss": 0.9}))
    response = api.client.post(REGISTER, json={"name": "crashy", "supersede": True})
    assert response.status_code == 201, response.text
    second = response.json()["token"]
    assert (response.json()["job"]["attempt"], response.json()["job"]["state"]) == (2, "pending")
    earlier = api.job("crashy", attempt=1)
    assert (earlier["state"], earlier["reason"]) == ("failed", "superseded by attempt 2")
    assert earlier["times"]["finished"] == api.clock.now
    assert api.report("crashy", first, make_report(2, 31, {"loss": 0.8})).status_code == 403
    api.report_ok("crashy", second, make_report(1, 1, {"loss": 2.0}, run_id="run-2"))
    # superseding nothing live simply registers
    response = api.client.post(REGISTER, json={"name": "fresh", "supersede": True})
    assert response.status_code == 201 and response.json()["job"]["attempt"] == 1


def test_the_history_of_an_earlier_attempt_can_be_read(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    first = api.register("train")
    api.report_ok("train", first, make_report(1, 30, {"loss": 0.9}))
    api.set_state("train", first, "finished")
    second = api.register("train")
    api.report_ok("train", second, make_report(1, 7, {"loss": 2.0}, run_id="run-2"))
    response = api.client.get(f"{api.job_path('train')}/history", params={"attempt": "1"})
    assert [p["last"] for p in response.json()["metrics"]["loss"]] == [0.9]


# ------------------------------------------------------------------------------------------ commands


def test_a_command_is_handed_out_until_a_report_acknowledges_it(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    token = api.register("cmd")
    api.report_ok("cmd", token, make_report(1, 1, {"loss": 1.0}))
    response = api.client.post(f"{api.job_path('cmd')}/commands", json={"kind": "stop", "reason": "plateau"})
    assert response.status_code == 201
    command = response.json()
    assert command["kind"] == "stop" and command["reason"] == "plateau" and re.fullmatch(r"[0-9a-f]{16}", command["id"])
    assert api.client.get(f"{api.job_path('cmd')}/commands").json() == {"items": [command]}
    assert api.job("cmd")["pending_commands"] == [command]

    assert api.report_ok("cmd", token, make_report(2, 2))["commands"] == [command]
    assert api.report_ok("cmd", token, make_report(3, 3))["commands"] == [command]  # until acknowledged
    assert api.report_ok("cmd", token, make_report(4, 4, acks=[command["id"]]))["commands"] == []
    assert api.report_ok("cmd", token, make_report(5, 5, acks=[command["id"]]))["commands"] == []
    assert api.client.get(f"{api.job_path('cmd')}/commands").json() == {"items": []}

    events = api.events("cmd")
    assert [e["kind"] for e in events] == ["registered", "running", "command", "command_acked"]
    assert events[2]["data"]["id"] == events[3]["data"]["id"] == command["id"]
    assert api.events("cmd")[2]["message"] == "stop requested: plateau"

    api.report_ok("cmd", token, make_report(6, 6, state="stopped", reason="asked to stop"))
    job = api.job("cmd")
    assert (job["state"], job["reason"]) == ("stopped", "asked to stop")
    response = api.client.post(f"{api.job_path('cmd')}/commands", json={"kind": "checkpoint"})
    assert_status(response, 409, "job default/cmd has already stopped: there is nothing to checkpoint", "kind")


# ------------------------------------------------------------------------------------------ kubeflow


def test_an_upstream_kubeflow_status_is_echoed_and_becomes_progress_and_history(api: Any) -> None:
    token = api.register("kf")
    response = api.kubeflow("kf", token, UPSTREAM_STATUS)
    assert response.status_code == 200, response.text
    assert response.json() == UPSTREAM_STATUS
    job = api.job("kf")
    assert job["state"] == "running" and job["source"] == "kubeflow"
    progress = job["progress"]
    assert (progress["step"], progress["total_steps"], progress["percent"], progress["epoch"]) == (49, 100, 49.0, 0.49)
    assert job["metrics"] == {"loss": 0.25}
    assert job["eta"]["reported_seconds"] == 5
    assert job["trainerStatus"]["progressPercentage"] == 49
    assert {"name": "loss", "value": "0.25"} in job["trainerStatus"]["metrics"]
    history = api.history("kf")
    assert list(history) == ["loss"]
    assert [core(p) for p in history["loss"]] == [core(step=49, last=0.25, min=0.25, max=0.25, mean=0.25, count=1)]
    assert api.client.get("/healthz").json()["stats"]["statuses"] == 1


def test_a_kubeflow_shaped_report_becomes_the_same_history_and_state_as_a_native_one(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    native = api.register("native")
    kubeflow = api.register("upstream")
    sequence = [(10, 2.0, 5.0), (25, 1.5, math.inf), (40, math.nan, 3.0), (49, 0.25, 1.0)]
    for seq, (step, loss, grad_norm) in enumerate(sequence, start=1):
        api.report_ok(
            "native",
            native,
            make_report(seq, step, {"loss": loss, "grad_norm": grad_norm}, total_steps=100, epoch=step / 100),
        )
        status = {
            "trainerStatus": {
                "progressPercentage": step,
                "lastUpdatedTime": format_rfc3339(api.clock.now),
                "metrics": [
                    {"name": "loss", "value": str(loss)},
                    {"name": "grad_norm", "value": str(grad_norm)},
                    {"name": "current_step", "value": str(step)},
                    {"name": "total_steps", "value": "100"},
                    {"name": "current_epoch", "value": str(step / 100)},
                ],
            }
        }
        assert api.kubeflow("upstream", kubeflow, status).status_code == 200
        api.clock.advance(10)

    one, other = api.job("native"), api.job("upstream")
    assert one["progress"] == other["progress"]
    assert one["progress"]["step"] == 49 and one["progress"]["percent"] == 49.0
    assert one["metrics"] == other["metrics"] == {"grad_norm": 1.0, "loss": 0.25}
    assert one["nonfinite_total"] == other["nonfinite_total"] == 2
    assert one["eta"] == other["eta"] and one["eta"]["remaining_seconds"] is not None
    assert api.history("native") == api.history("upstream")
    assert [p["last"] for p in api.history("native")["loss"]] == [2.0, 1.5, "NaN", 0.25]


def test_each_kubeflow_status_replaces_the_previous_one(api: Any) -> None:
    token = api.register("kf")
    first = status_with(lastUpdatedTime="2026-12-02T15:20:54Z")
    second = status_with(
        lastUpdatedTime="2026-12-02T15:20:54Z",
        metrics=[{"name": "current_step", "value": "50"}, {"name": "loss", "value": "0.2"}],
    )
    assert api.kubeflow("kf", token, first).status_code == 200
    assert api.kubeflow("kf", token, second).status_code == 200
    assert api.job("kf")["progress"]["step"] == 50


def test_kubeflow_metrics_that_are_not_numbers_are_echoed_but_not_history(api: Any) -> None:
    token = api.register("kf")
    body = status_with(metrics=[{"name": "loss", "value": "0.5"}, {"name": "phase", "value": "warmup"}])
    response = api.kubeflow("kf", token, body)
    assert response.status_code == 200 and response.json() == body
    assert list(api.history("kf")) == ["loss"]


# ------------------------------------------------------------------------------------------ listing


def _fleet(api: Any, make_report: Callable[..., dict[str, Any]]) -> dict[str, str]:
    """Six jobs, each with another namespace, state, progress, step, creation and update time."""
    plans = [
        ("team-a", "alpha", 100, (5, 10), None),
        ("team-b", "bravo", 2000, (100, 150), None),
        ("team-a", "charlie", 50, (10, 20), "finished"),
        ("team-c", "delta", None, (), None),
        ("team-b", "echo", 1000, (100, 300), "failed"),
        ("team-c", "foxtrot", 400, (40, 80), "stopped"),
    ]
    tokens = {}
    for namespace, name, total, _, _ in plans:
        tokens[name] = api.register(name, namespace=namespace, total_steps=total)
        api.clock.advance(1)
    for namespace, name, _, steps, _ in plans:
        for seq, step in enumerate(steps, start=1):
            api.report_ok(name, tokens[name], make_report(seq, step, {"loss": 1 / step}), namespace=namespace)
            api.clock.advance(10)
    for namespace, name, _, _, final in plans:
        if final:
            api.set_state(name, tokens[name], final, namespace=namespace)
            api.clock.advance(1)
    return tokens


def _names(page: dict[str, Any]) -> list[str]:
    return [j["name"] for j in page["items"]]


SORT_VALUE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "name": lambda j: j["name"],
    "namespace": lambda j: j["namespace"],
    "state": lambda j: j["state"],
    "progress": lambda j: j["progress"]["percent"],
    "step": lambda j: j["progress"]["step"],
    "created": lambda j: j["times"]["created"],
    "updated": lambda j: j["times"]["updated"],
    "eta": lambda j: j["eta"]["finish_time"],
}


def _expected_order(jobs: list[dict[str, Any]], key: str, descending: bool) -> list[str]:
    """Sorted by the key (ties by creation, same direction), jobs without a value last in both directions."""
    value = SORT_VALUE[key]
    known = sorted((j for j in jobs if value(j) is not None), key=lambda j: (value(j), j["times"]["created"]))
    unknown = sorted((j for j in jobs if value(j) is None), key=lambda j: j["times"]["created"])
    if descending:
        known.reverse()
        unknown.reverse()
    return [j["name"] for j in known + unknown]


def test_jobs_are_filtered_by_namespace_state_text_and_progress(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    _fleet(api, make_report)
    everything = api.jobs()
    assert everything["total"] == 6
    percent = {j["name"]: j["progress"]["percent"] for j in everything["items"]}
    assert percent == {"alpha": 10.0, "bravo": 7.5, "charlie": 40.0, "delta": None, "echo": 30.0, "foxtrot": 20.0}
    assert _names(everything) == ["foxtrot", "echo", "charlie", "bravo", "alpha", "delta"]  # -updated by default

    def names(path: str = "/api/v1/jobs", **params: Any) -> set[str]:
        page = api.jobs(path, **params)
        assert page["total"] == len(page["items"])
        return set(_names(page))

    assert names("/api/v1/namespaces/team-a/jobs") == {"alpha", "charlie"}
    assert names(namespace="team-c") == {"delta", "foxtrot"}
    assert names("/api/v1/namespaces/team-a/jobs", namespace="team-c") == {"alpha", "charlie"}  # the path wins
    assert names("/api/v1/namespaces/nobody/jobs") == set()
    assert names(state="running") == {"alpha", "bravo"}
    assert names(state="running,failed") == {"alpha", "bravo", "echo"}
    assert names(state="pending") == {"delta"}
    assert names(text="char") == {"charlie"}
    assert names(text="TEAM-B") == {"bravo", "echo"}  # names are lowercase: the search is too
    assert names(text="%") == set()  # not a LIKE pattern
    assert names(min_progress=20, max_progress=80) == {"charlie", "echo", "foxtrot"}  # charlie ended at 40 %
    assert names(min_progress=100) == set()
    assert names(max_progress=10) == {"alpha", "bravo"}
    assert names(min_progress=0) == {"alpha", "bravo", "charlie", "echo", "foxtrot"}  # unknown progress is no match
    assert names("/api/v1/namespaces/team-b/jobs", state="failed", text="ec", min_progress=30) == {"echo"}


@pytest.mark.parametrize("key", SORT_KEYS)
def test_jobs_sort_by_every_key_both_ways(api: Any, make_report: Callable[..., dict[str, Any]], key: str) -> None:
    _fleet(api, make_report)
    # an ended job keeps its last estimate in the store while the view shows none: compare ETAs of live jobs only
    params = {"state": "running,pending"} if key == "eta" else {}
    jobs = api.jobs(**params)["items"]
    for descending in (False, True):
        page = api.jobs(sort=("-" if descending else "") + key, **params)
        assert _names(page) == _expected_order(jobs, key, descending), (key, descending)
    if key == "eta":
        assert _names(api.jobs(sort="eta", **params)) == ["alpha", "bravo", "delta"]


def test_jobs_are_paged_with_limit_offset_and_total(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    _fleet(api, make_report)
    whole = _names(api.jobs(sort="name"))
    assert whole == ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    pages = [api.jobs(sort="name", limit=4, offset=offset) for offset in (0, 4, 8)]
    assert [_names(p) for p in pages] == [whole[:4], whole[4:], []]
    assert {p["total"] for p in pages} == {6}
    assert _names(api.jobs(sort="-name", limit=1)) == ["foxtrot"]
    page = api.jobs(sort="name", state="running,failed", limit=1, offset=1)
    assert _names(page) == ["bravo"] and page["total"] == 3


def test_only_the_latest_attempt_is_listed_unless_all_attempts(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    _fleet(api, make_report)
    api.register("charlie", namespace="team-a")  # attempt 2 of a finished job
    latest = api.jobs(sort="name")
    assert latest["total"] == 6
    assert [(j["name"], j["attempt"]) for j in latest["items"] if j["name"] == "charlie"] == [("charlie", 2)]
    assert api.jobs(state="finished")["total"] == 0  # charlie's finished attempt is not its latest
    every = api.jobs(sort="name", all_attempts="true")
    assert every["total"] == 7
    assert [(j["name"], j["attempt"], j["state"]) for j in every["items"] if j["name"] == "charlie"] == [
        ("charlie", 1, "finished"),
        ("charlie", 2, "pending"),
    ]  # ties (same name) in creation order
    assert _names(api.jobs(state="finished", all_attempts="1")) == ["charlie"]
    assert api.jobs(all_attempts="no")["total"] == 6


# ------------------------------------------------------------------------------------------ history


def test_a_long_history_is_downsampled_keeping_the_spike_and_the_nan(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    api.register("long", total_steps=5000)
    job = api.store.job("default", "long")
    spike, nan = 3210, 4321
    batch = []
    for i in range(1, 5001):
        value = 1e6 if i == spike else (math.nan if i == nan else 1.0 + 1.0 / i)
        batch.append(PendingReport(job, Report.from_dict(make_report(i, i, {"loss": value})), api.clock.advance(1)))
    for start in range(0, len(batch), 500):  # as the server's group commit would write them
        assert all(isinstance(r, IngestResult) for r in api.store.ingest_reports(batch[start : start + 500]))

    full = api.history("long", max_points=10000)["loss"]
    assert len(full) == 5000 and sum(p["count"] for p in full) == 5000

    points = api.history("long", max_points=100)["loss"]
    assert 2 <= len(points) <= 100
    steps = [p["step"] for p in points]
    assert steps == sorted(steps) and steps[-1] == 5000
    assert max(p["max"] for p in points if p["max"] is not None) == 1e6
    assert min(p["min"] for p in points if p["min"] is not None) == 1.0 + 1.0 / 5000
    assert sum(p["nonfinite"] for p in points) == 1
    assert api.history("long", max_points=2)["loss"][-1]["step"] == 5000
    assert api.history("long", metrics="other") == {"other": []}


# ------------------------------------------------------------------------------------------ description


def test_openapi_describes_every_route_of_the_app(app: Any, api: Any) -> None:
    response = api.client.get("/openapi.json")
    assert response.status_code == 200
    document = json.loads(response.text, parse_constant=lambda c: pytest.fail(f"non-standard JSON token {c}"))
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    served: dict[str, set[str]] = {}
    for route in app.routes:
        if hasattr(route, "methods") and route.methods:
            served.setdefault(route.path, set()).update(m.lower() for m in route.methods - {"HEAD"})
    # the description does not describe itself nor its viewer (FastAPI leaves these out of the schema too),
    # nor the dashboard's page (its files are under the /ui mount)
    undocumented = {"/openapi.json", "/docs", "/docs/init.js", "/"}
    assert set(served) - undocumented == set(paths)
    for path, methods in served.items():
        if path in undocumented:
            continue
        assert set(paths[path]) == methods, path
        for method, operation in paths[path].items():
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == set(re.findall(r"{(\w+)}", path)), (path, method)
            assert operation["responses"], (path, method)
            for code, answer in operation["responses"].items():
                if int(code) >= 400:
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Status"}, (path, method, code)
    schemas = document["components"]["schemas"]
    refs = set(re.findall(r'"#/components/schemas/(\w+)"', response.text))
    assert refs <= set(schemas)


def test_the_docs_page_loads_its_assets_from_this_server(api: Any) -> None:
    page = api.client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?://", page.text), "the docs page must work without internet access"
    assets = re.findall(r'(?:src|href)="(/[^"]+)"', page.text)
    assert "/docs/assets/swagger-ui-bundle.js" in assets and "/docs/assets/swagger-ui.css" in assets
    assert "/docs/init.js" in assets and not re.search(r"<script>", page.text), "no inline script (CSP)"
    for asset in assets:
        response = api.client.get(asset)
        assert response.status_code == 200, asset
        assert len(response.content) > (40 if asset == "/docs/init.js" else 1000), asset
    assert "/openapi.json" in api.client.get("/docs/init.js").text


def test_version_and_health(api: Any) -> None:
    version = api.client.get("/api/v1/version").json()
    assert version["api_version"] == "v1" and version["version"]
    health = api.client.get("/healthz").json()
    assert health["status"] == "ok" and health["api_version"] == "v1" and health["subscribers"] == 0


# ------------------------------------------------------------------------------------------ a real reporter


def test_a_real_reporter_over_a_real_socket(tmp_path: Path, serve: Any) -> None:
    app = create_app(ServerSettings(db=str(tmp_path / "sw.db")))
    with serve(app) as base, httpx.Client(base_url=base, timeout=5) as http:
        response = http.post(REGISTER, json={"name": "real", "total_steps": 200})
        assert response.status_code == 201
        token = response.json()["token"]
        run = stepwatch.init(job="real", url=base, token=token, interval=0.05, total_steps=200)
        assert run.mode == "native"
        for i in range(1, 201):
            run.step(loss=1.0 / i)
            time.sleep(0.003)
            if i == 100:
                view = _wait_for(http, lambda j: j["progress"]["step"] == 100 and j["eta"]["remaining_seconds"])
                assert view["state"] == "running"
                assert 0 < view["progress"]["percent"] < 100
                assert view["eta"]["remaining_seconds"] > 0 and view["eta"]["finish_time"] > time.time()
                assert view["progress"]["steps_per_second"] > 0
                command = http.post("/api/v1/namespaces/default/jobs/real/commands", json={"kind": "checkpoint"})
                assert command.status_code == 201
                _wait_until(lambda: run.should_checkpoint)
                run.checkpoint_done()
        assert run.finish()
        job = http.get("/api/v1/namespaces/default/jobs/real").json()
        assert job["state"] == "finished" and job["progress"]["step"] == 200 and job["progress"]["percent"] == 100
        assert job["metrics"] == {"loss": 1.0 / 200}
        assert job["pending_commands"] == []  # the reporter acknowledged the checkpoint
        loss = http.get("/api/v1/namespaces/default/jobs/real/history", params={"max_points": 10000}).json()
        points = loss["metrics"]["loss"]
        assert sum(p["count"] for p in points) == 200
        assert points[-1]["step"] == 200 and min(p["min"] for p in points) == 1.0 / 200
        kinds = [e["kind"] for e in http.get("/api/v1/namespaces/default/jobs/real/events").json()["items"]]
        assert kinds == ["registered", "running", "command", "command_acked", "finished"]


def _wait_for(http: httpx.Client, done: Callable[[dict[str, Any]], Any], timeout: float = 3.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view: dict[str, Any] = http.get("/api/v1/namespaces/default/jobs/real").json()
        if done(view) or time.monotonic() > deadline:
            return view
        time.sleep(0.02)


def _wait_until(done: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_health_is_shown_filtered_and_its_changes_are_events(
    api: Any, make_report: Callable[..., dict[str, Any]]
) -> None:
    token = api.register("plateau", total_steps=100)
    api.register("fine")
    api.report_ok("plateau", token, make_report(1, 10, {"loss": 0.5}))
    job = api.store.job("default", "plateau")
    evidence = {"metric": "loss", "message": "loss has not improved by 1% over the last 2,000 steps"}
    api.store.set_health(job.id, "not_learning", 1234.0, evidence, api.clock())
    view = api.job("plateau")
    assert view["health"] == {"state": "not_learning", "since": 1234.0, "evidence": evidence}
    assert [j["name"] for j in api.jobs(health="not_learning,stalled")["items"]] == ["plateau"]
    assert [j["name"] for j in api.jobs(health="unknown")["items"]] == ["fine"]
    assert api.jobs(health="not_learning")["items"][0]["health"]["state"] == "not_learning"  # compact views too
    events = [e for e in api.events("plateau") if e["kind"] == "health"]
    assert [e["message"] for e in events] == [evidence["message"]]
    api.store.set_health(job.id, "not_learning", 1234.0, evidence, api.clock())  # no change: no new event
    assert len([e for e in api.events("plateau") if e["kind"] == "health"]) == 1


def test_a_job_shows_every_rank_newest_report(api: Any, make_report: Callable[..., dict[str, Any]]) -> None:
    token = api.register("ddp", total_steps=100)
    api.report_ok("ddp", token, make_report(1, 10, {"loss": 1.0}, world_size=2, sent_at=100.0))
    api.clock.advance(5)
    api.report_ok("ddp", token, make_report(1, 9, run_id="run-r1", rank=1, world_size=2, sent_at=101.0))
    api.clock.advance(1)
    ranks = api.job("ddp")["ranks"]
    assert [(r["rank"], r["step"]) for r in ranks] == [(0, 10), (1, 9)]
    assert [round(r["last_report_age_seconds"]) for r in ranks] == [6, 1]
    assert all(isinstance(r["host"], str) and isinstance(r["pid"], int) for r in ranks)
