"""Kubeflow Trainer's own status-server tests, ported: stepwatch's status endpoint against upstream's cases.

Upstream is the reference (kubeflow/trainer at 8c0f5059bd51, read from its repository): each test names
the file and the case it ports. ``pkg/statusserver/server_test.go``, ``middleware_test.go``,
``auth_test.go`` and ``utils_test.go`` are unit tests of the Go server; ``test/integration/statusserver/
server_test.go`` runs it against a real API server; the TrainJob CRD's validation markers
(``pkg/apis/trainer/v1alpha1/trainjob_types.go``, generated into ``manifests/base/crds/
trainer.kubeflow.org_trainjobs.yaml``) are what that API server checks a status against. Cases that test
Go machinery stepwatch does not have are listed at the end as not applicable; where stepwatch answers
otherwise on purpose, docs/kubernetes.md ("Conformance") says why, and the test asserts stepwatch's answer.

The server is real (in-process ASGI, a real SQLite file); the Kubernetes API server is a FAKE
(``fakeapi.py``: there is none on these machines) that issues RS256 tokens shaped as the kubelet projects
them and answers TokenReviews as the real one documents.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fakeapi import make_jwt
from kubehelp import Cluster, trainjob, wait_for

from stepwatch.protocol import format_rfc3339, kubeflow_status_path
from stepwatch.server.runners.kubernetes.tokens import trainjob_audience

NOW = "2026-03-01T12:00:00Z"


def _status(**fields: Any) -> dict[str, Any]:
    """``{"trainerStatus": {...}}`` with ``lastUpdatedTime`` (the CRD requires it) unless given."""
    return {"trainerStatus": {"lastUpdatedTime": NOW, **fields}}


def _register(cluster: Cluster, name: str) -> str:
    """A job registered on stepwatch (its own write token): the TrainJob of upstream's tests."""
    response = cluster.client.post("/api/v1/namespaces/nlp/jobs", json={"name": name})
    assert response.status_code == 201, response.text
    token: str = response.json()["token"]
    return token


def _post(cluster: Cluster, name: str, token: str | None, content: bytes | str, **headers: str) -> Any:
    sent = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return cluster.client.post(cluster.status_url(name), content=content, headers={**sent, **headers})


def _is_status(response: Any, code: int, reason: str) -> dict[str, Any]:
    """The answer is a Kubernetes ``Status`` with this code and reason, as upstream's ``badRequest`` writes."""
    assert response.status_code == code, response.text
    body: dict[str, Any] = response.json()
    assert (body["kind"], body["status"], body["code"], body["reason"]) == ("Status", "Failure", code, reason)
    assert body["message"]
    return body


def _trainer_status(cluster: Cluster, name: str) -> dict[str, Any] | None:
    job = cluster.job(name)
    assert job is not None
    found: dict[str, Any] | None = job.get("trainerStatus") if job["source"] == "kubeflow" else None
    return found


OVERSIZED = '{"trainerStatus": {"metrics": [' + '{"name":"m","value":"0.5"},' * 40000 + "]}}"
"""Upstream's ~1 MB body (server_test.go: ``strings.Repeat(`{"name":"m","value":"0.5"},`, 40000)``)."""


def _chunks(text: str) -> Any:
    data = text.encode()
    for i in range(0, len(data), 8192):
        yield data[i : i + 8192]


# --------------------------------------------------------------- pkg/statusserver/server_test.go


@pytest.mark.parametrize(
    ("case", "token", "body", "code", "reason"),
    [
        ("unauthorized fails with 403 unauthorized", "wrong", json.dumps(_status()), 403, "Forbidden"),
        ("invalid payload fails with 422 unprocessable entity", "job", "invalid payload", 422, "Invalid"),
        ("multiple JSON values fail with 422 unprocessable entity", "job", "{}{}", 422, "Invalid"),
        ("trailing invalid data fails with 422 unprocessable entity", "job", "{} invalid payload", 422, "Invalid"),
        ("trailing closing delimiter fails with 422 unprocessable entity", "job", "{}]", 422, "Invalid"),
        ("oversized payload fails with 413 payload too large error", "job", OVERSIZED, 413, "RequestEntityTooLarge"),
        (
            "oversized chunked payload fails with 413 payload too large error",
            "job",
            "chunked",
            413,
            "RequestEntityTooLarge",
        ),
    ],
)
def test_server_error_responses(cluster: Cluster, case: str, token: str, body: str, code: int, reason: str) -> None:
    """pkg/statusserver/server_test.go TestServerErrorResponses, each case by its upstream name."""
    own = _register(cluster, "test-job")
    content: Any = _chunks(OVERSIZED) if body == "chunked" else body
    response = cluster.client.post(
        cluster.status_url("test-job"),
        content=content,
        headers={"Authorization": f"Bearer {own if token == 'job' else token}"},
    )
    _is_status(response, code, reason)
    assert _trainer_status(cluster, "test-job") is None  # nothing was applied


def test_handle_default(cluster: Cluster) -> None:
    """pkg/statusserver/server_test.go TestHandleDefault: an unknown route is a 404 Status."""
    _is_status(cluster.client.get("/unsupported-route"), 404, "NotFound")


def test_to_apply_config_nil_trainer_status(cluster: Cluster) -> None:
    """pkg/statusserver/server_test.go TestToApplyConfig "nil TrainerStatus returns empty status apply
    configuration": a request without a status applies nothing (200, the request echoed)."""
    token = _register(cluster, "job")
    for body in ("{}", '{"trainerStatus": null}'):
        response = _post(cluster, "job", token, body)
        assert response.status_code == 200, response.text
        assert response.json() == {}
    assert cluster.job("job")["state"] == "pending"  # type: ignore[index]  # not even a first report


def test_to_apply_config_populated_trainer_status_maps_all_fields(cluster: Cluster) -> None:
    """pkg/statusserver/server_test.go TestToApplyConfig "populated TrainerStatus maps all fields": every
    field reaches the stored status as posted, and 200 echoes the payload (server.go)."""
    token = _register(cluster, "job")
    posted = _status(
        progressPercentage=75,
        estimatedRemainingSeconds=120,
        metrics=[{"name": "loss", "value": "0.25"}, {"name": "accuracy", "value": "0.95"}],
    )
    response = _post(cluster, "job", token, json.dumps(posted))
    assert response.status_code == 200, response.text
    assert response.json() == posted
    assert _trainer_status(cluster, "job") == posted["trainerStatus"]


# ----------------------------------------------------------- pkg/statusserver/middleware_test.go


def test_body_size_limit_rejects_when_content_length_exceeds_max_bytes(cluster: Cluster) -> None:
    """middleware_test.go TestBodySizeLimitMiddleware "rejects when Content-Length exceeds maxBytes", at
    upstream's real limit (server.go ``maxBodySize = 1 << 16``): 413 before the token is looked at."""
    _register(cluster, "job")
    body = "x" * ((1 << 16) + 1)
    _is_status(_post(cluster, "job", None, body), 413, "RequestEntityTooLarge")


def test_body_size_limit_allows_when_content_length_is_within_limit(cluster: Cluster) -> None:
    """middleware_test.go TestBodySizeLimitMiddleware "allows when Content-Length is within limit": a
    status of exactly 65,536 bytes is read and applied."""
    token = _register(cluster, "job")
    body = json.dumps(_status(progressPercentage=1, metrics=[{"name": "pad", "value": "x"}]))
    padding = (1 << 16) - len(body)
    body = body[:-2] + " " * padding + body[-2:]
    assert len(body.encode()) == 1 << 16
    response = _post(cluster, "job", token, body)
    assert response.status_code == 200, response.text
    assert _trainer_status(cluster, "job")["progressPercentage"] == 1  # type: ignore[index]


def test_body_size_limit_streaming(cluster: Cluster) -> None:
    """middleware_test.go TestBodySizeLimitMiddlewareStreaming: a body without Content-Length that grows
    past the limit is refused (413) while it is read."""
    token = _register(cluster, "job")
    response = cluster.client.post(
        cluster.status_url("job"), content=_chunks(" " * (1 << 16) + "{}"), headers={"Authorization": f"Bearer {token}"}
    )
    _is_status(response, 413, "RequestEntityTooLarge")


# --------------------------------------------------------------- pkg/statusserver/auth_test.go


@pytest.mark.parametrize(
    ("case", "header", "extracted"),
    [
        ("valid bearer token", "Bearer {t}", True),
        ("empty header", "", False),
        ("missing token", "Bearer", False),
        ("wrong auth scheme", "Basic {t}", False),
        ("too many parts", "Bearer {t} def", False),
        ("multiple spaces", "Bearer    {t}", True),
        ("lowercase bearer", "bearer {t}", True),
        ("leading and trailing spaces", "   Bearer {t}   ", True),
    ],
)
def test_extract_raw_token(cluster: Cluster, case: str, header: str, extracted: bool) -> None:
    """pkg/statusserver/auth_test.go TestExtractRawToken, through the endpoint: where upstream extracts the
    token the write is allowed, else 403."""
    token = _register(cluster, "job")
    response = cluster.client.post(
        cluster.status_url("job"), json=_status(progressPercentage=3), headers={"Authorization": header.format(t=token)}
    )
    if extracted:
        assert response.status_code == 200, response.text
    else:
        _is_status(response, 403, "Forbidden")


# -------------------------------------------------------------- pkg/statusserver/utils_test.go


@pytest.mark.parametrize(
    ("case", "namespace", "name", "audience", "path"),
    [
        (
            "default namespace",
            "default",
            "mnist",
            "trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/mnist/status",
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs/mnist/status",
        ),
        (
            "kubeflow namespace",
            "kubeflow",
            "llm-job",
            "trainer.kubeflow.org/v1alpha1/namespaces/kubeflow/trainjobs/llm-job/status",
            "/apis/trainer.kubeflow.org/v1alpha1/namespaces/kubeflow/trainjobs/llm-job/status",
        ),
    ],
)
def test_token_audience_and_status_url(case: str, namespace: str, name: str, audience: str, path: str) -> None:
    """pkg/statusserver/utils_test.go TestTokenAudience and TestStatusUrl (both cases of each)."""
    assert trainjob_audience(namespace, name) == audience
    assert kubeflow_status_path(namespace, name) == path


# --------------------------------------------- pkg/statusserver/auth.go Authorize (upstream's tokens)


def _upstream_token(cluster: Cluster, trainjob_name: str, pod: str, namespace: str = "nlp") -> str:
    """A token as Kubeflow Trainer's TrainJobStatus plugin has the kubelet project it for a pod of
    ``trainjob_name``: audience ``TokenAudience(namespace, name)``, bound to the pod."""
    token: str = cluster.fake.token(namespace, pod, audience=trainjob_audience(namespace, trainjob_name))
    return token


def test_authorize_accepts_the_per_trainjob_audience_for_that_trainjob(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pkg/statusserver/auth.go Authorize: the verifier's ClientID is ``TokenAudience(namespace, name)``, and
    the token's ``kubernetes.io`` namespace is the TrainJob's. Such a token writes that TrainJob's status,
    and the TokenReview is asked for that audience."""
    reviewed: list[dict[str, Any]] = []
    review = cluster.fake.review
    monkeypatch.setattr(cluster.fake, "review", lambda spec: reviewed.append(spec) or review(spec))
    cluster.fake.add_pod("nlp", "llama-node-0-0", "llama")
    token = _upstream_token(cluster, "llama", "llama-node-0-0")
    response = cluster.post_status("llama", token, _status(progressPercentage=10))
    assert response.status_code == 200, response.text
    assert [spec["audiences"] for spec in reviewed] == [[trainjob_audience("nlp", "llama")]]
    assert _trainer_status(cluster, "llama")["progressPercentage"] == 10  # type: ignore[index]


def test_authorize_refuses_another_trainjobs_audience(cluster: Cluster) -> None:
    """pkg/statusserver/auth.go Authorize: a token projected for TrainJob ``mistral`` does not verify for
    ``llama`` (its audience is not the one asked for), even from the same namespace; no API call is made."""
    cluster.fake.add_pod("nlp", "llama-node-0-0", "llama")
    token = _upstream_token(cluster, "mistral", "llama-node-0-0")
    before = len(cluster.fake.requests)
    body = _is_status(cluster.post_status("llama", token, _status(progressPercentage=10)), 403, "Forbidden")
    assert "audience" in body["message"]
    assert len(cluster.fake.requests) == before
    assert cluster.job("llama") is None


def test_authorize_refuses_a_token_of_another_namespace(cluster: Cluster) -> None:
    """pkg/statusserver/auth.go Authorize: ``parsedToken.Kubernetes.Namespace != namespace`` refuses, even
    with the audience of the path's TrainJob."""
    cluster.fake.add_pod("vision", "llama-node-0-0", "llama")
    token = cluster.fake.token("vision", "llama-node-0-0", audience=trainjob_audience("nlp", "llama"))
    _is_status(cluster.post_status("llama", token, _status(progressPercentage=10)), 403, "Forbidden")


def test_the_kep_audience_stays_accepted(cluster: Cluster) -> None:
    """Not upstream's: stepwatch also accepts KEP-2779's ``trainer.kubeflow.org`` (pods set up with stepwatch's
    own projected volume keep working)."""
    cluster.fake.add_pod("nlp", "llama-node-0-0", "llama")
    token = cluster.fake.token("nlp", "llama-node-0-0", audience="trainer.kubeflow.org")
    assert cluster.post_status("llama", token, _status(progressPercentage=10)).status_code == 200


def test_a_forged_token_with_the_upstream_audience_is_refused(cluster: Cluster) -> None:
    """pkg/statusserver/auth.go Authorize: ``verifier.Verify`` checks the signature; a token with the right
    claims signed by another key is refused."""
    cluster.fake.add_pod("nlp", "llama-node-0-0", "llama")
    claims = {
        "aud": [trainjob_audience("nlp", "llama")],
        "exp": int(time.time()) + 3600,
        "sub": "system:serviceaccount:nlp:default",
        "kubernetes.io": {"namespace": "nlp", "pod": {"name": "llama-node-0-0", "uid": "x"}},
    }
    from fakeapi import RsaKey

    forged = make_jwt(RsaKey.generate(), claims, {"alg": "RS256", "kid": cluster.fake.key.kid})
    _is_status(cluster.post_status("llama", forged, _status(progressPercentage=10)), 403, "Forbidden")


# ------------------------------------------------------------ test/integration/statusserver/server_test.go


def test_should_update_the_trainjob_status_when_the_request_is_valid(make_cluster: Any) -> None:
    """test/integration/statusserver/server_test.go "Should update the TrainJob status when the request is
    valid": 200, and the TrainJob's ``status.trainerStatus`` holds it (the runner writes it back)."""
    cluster: Cluster = make_cluster()
    cluster.fake.create_trainjob(trainjob("valid-trainjob"))
    cluster.fake.add_pod("nlp", "valid-trainjob-node-0-0", "valid-trainjob")
    cluster.start_runner()
    token = _upstream_token(cluster, "valid-trainjob", "valid-trainjob-node-0-0")
    posted = _status(progressPercentage=50)
    response = cluster.post_status("valid-trainjob", token, posted)
    assert response.status_code == 200, response.text

    def on_trainjob() -> dict[str, Any] | None:
        status: dict[str, Any] | None = (cluster.fake.trainjobs[("nlp", "valid-trainjob")].get("status") or {}).get(
            "trainerStatus"
        )
        return status if status and status.get("progressPercentage") == 50 else None

    assert wait_for(on_trainjob, 10, "the status on the TrainJob") == posted["trainerStatus"]


def test_should_overwrite_existing_status_not_merge(cluster: Cluster) -> None:
    """test/integration/statusserver/server_test.go "Should overwrite existing status, not merge, when
    posting a new update": a second status without progressPercentage removes it."""
    token = _register(cluster, "overwrite-trainjob")
    assert _post(cluster, "overwrite-trainjob", token, json.dumps(_status(progressPercentage=30))).status_code == 200
    assert _trainer_status(cluster, "overwrite-trainjob")["progressPercentage"] == 30  # type: ignore[index]
    assert _post(cluster, "overwrite-trainjob", token, json.dumps(_status())).status_code == 200
    status = _trainer_status(cluster, "overwrite-trainjob")
    assert status == {"lastUpdatedTime": NOW}
    job = cluster.job("overwrite-trainjob")
    assert job is not None and job["progress"]["percent"] is None  # nothing says how far it is now


def test_should_accept_an_empty_update_request_but_not_overwrite_existing_status(cluster: Cluster) -> None:
    """test/integration/statusserver/server_test.go "Should accept an empty update request but not
    overwrite existing status"."""
    token = _register(cluster, "empty-update-trainjob")
    assert _post(cluster, "empty-update-trainjob", token, json.dumps(_status(progressPercentage=40))).status_code == 200
    response = _post(cluster, "empty-update-trainjob", token, "{}")
    assert response.status_code == 200, response.text
    assert _trainer_status(cluster, "empty-update-trainjob")["progressPercentage"] == 40  # type: ignore[index]
    assert cluster.job("empty-update-trainjob")["progress"]["percent"] == 40.0  # type: ignore[index]


def test_should_reject_progress_percentage_over_100_with_a_useful_error(cluster: Cluster) -> None:
    """test/integration/statusserver/server_test.go "Should reject a request with progressPercentage > 100
    with a useful error message": 422 Invalid that names what is wrong, and the status is not mutated."""
    token = _register(cluster, "invalid-progress-trainjob")
    response = _post(cluster, "invalid-progress-trainjob", token, json.dumps(_status(progressPercentage=150)))
    body = _is_status(response, 422, "Invalid")
    assert "100" in body["message"] and body["details"]["field"] == "trainerStatus.progressPercentage"
    assert _trainer_status(cluster, "invalid-progress-trainjob") is None
    assert cluster.job("invalid-progress-trainjob")["state"] == "pending"  # type: ignore[index]


def test_should_reject_an_update_to_a_non_existing_trainjob(cluster: Cluster) -> None:
    """test/integration/statusserver/server_test.go "Should reject an update to a non-existing TrainJob
    with a useful error message" (upstream: 404, its token passes). Deliberate difference: no stepwatch
    token can be valid for a job that does not exist (a job token is the job's own; a pod token must come
    from a pod of that TrainJob), so the answer is upstream's authorisation failure, 403; nothing is
    created (as upstream)."""
    token = _register(cluster, "other")
    response = _post(cluster, "does-not-exist", token, json.dumps(_status(progressPercentage=50)))
    _is_status(response, 403, "Forbidden")
    cluster.fake.add_pod("nlp", "stray-0", None)  # a pod of no TrainJob, with upstream's audience
    response = cluster.post_status("does-not-exist", _upstream_token(cluster, "does-not-exist", "stray-0"), _status())
    _is_status(response, 403, "Forbidden")
    assert cluster.job("does-not-exist") is None


# ------------------------------------------------------------------------ the upstream order of checks


def test_checks_run_in_upstreams_order_size_then_authorisation_then_the_body(cluster: Cluster) -> None:
    """pkg/statusserver/server.go: bodySizeLimitMiddleware, then Authorize, then the decoder: an oversized
    body without a token is 413; a malformed body without a token is 403, with one 422."""
    token = _register(cluster, "job")
    _is_status(_post(cluster, "job", None, "x" * 70_000), 413, "RequestEntityTooLarge")
    _is_status(_post(cluster, "job", "wrong", "{"), 403, "Forbidden")
    _is_status(_post(cluster, "job", token, "{"), 422, "Invalid")
    no_job = _is_status(_post(cluster, "nope", "wrong", "{"), 403, "Forbidden")
    wrong = _is_status(_post(cluster, "job", "wrong", "{"), 403, "Forbidden")
    assert no_job["message"].replace("nope", "job") == wrong["message"]  # nothing tells which jobs exist


# ------------------------------------------------- the TrainJob CRD's validation markers (trainjob_types.go)


def _metrics(n: int, name: str = "m", value: str = "1") -> list[dict[str, str]]:
    return [{"name": f"{name}{i}" if n > 1 else name, "value": value} for i in range(n)]


CRD_CASES = [
    # (marker, trainerStatus fields, accepted)
    ("progressPercentage Minimum=0", {"progressPercentage": 0}, True),
    ("progressPercentage Minimum=0", {"progressPercentage": -1}, False),
    ("progressPercentage Maximum=100", {"progressPercentage": 100}, True),
    ("progressPercentage Maximum=100", {"progressPercentage": 101}, False),
    ("progressPercentage int32", {"progressPercentage": 49.5}, False),
    ("estimatedRemainingSeconds Minimum=0", {"estimatedRemainingSeconds": 0}, True),
    ("estimatedRemainingSeconds Minimum=0", {"estimatedRemainingSeconds": -1}, False),
    ("estimatedRemainingSeconds int32", {"estimatedRemainingSeconds": 2**31 - 1}, True),
    ("estimatedRemainingSeconds int32", {"estimatedRemainingSeconds": 2**31}, False),
    ("estimatedRemainingSeconds int32", {"estimatedRemainingSeconds": "60"}, False),
    ("metrics MaxItems=256", {"metrics": _metrics(256)}, True),
    ("metrics MaxItems=256", {"metrics": _metrics(257)}, False),
    ("metrics listType=atomic (null is none)", {"metrics": None}, True),
    ("Metric.name MinLength=1", {"metrics": _metrics(1, name="")}, False),
    ("Metric.name MaxLength=64", {"metrics": _metrics(1, name="n" * 64)}, True),
    ("Metric.name MaxLength=64", {"metrics": _metrics(1, name="n" * 65)}, False),
    ("Metric.value MinLength=1", {"metrics": _metrics(1, value="")}, False),
    ("Metric.value MaxLength=64", {"metrics": _metrics(1, value="v" * 64)}, True),
    ("Metric.value MaxLength=64", {"metrics": _metrics(1, value="v" * 65)}, False),
    ("Metric.value is a string", {"metrics": [{"name": "loss", "value": 0.5}]}, False),
    ("Metric.name +required", {"metrics": [{"value": "1"}]}, False),
    ("TrainerStatus has(self.lastUpdatedTime)", {"lastUpdatedTime": None}, False),
]


@pytest.mark.parametrize(("marker", "fields", "accepted"), CRD_CASES, ids=[f"{c[0]}-{c[2]}" for c in CRD_CASES])
def test_crd_validation_markers(cluster: Cluster, marker: str, fields: dict[str, Any], accepted: bool) -> None:
    """manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml (from trainjob_types.go's markers): what the
    API server accepts into ``status.trainerStatus``, upstream answers 200; what it refuses, 422 Invalid."""
    token = _register(cluster, "crd")
    body = {"trainerStatus": {k: v for k, v in {"lastUpdatedTime": NOW, **fields}.items() if v is not None}}
    if "metrics" in fields and fields["metrics"] is None:
        body["trainerStatus"]["metrics"] = None
    response = _post(cluster, "crd", token, json.dumps(body))
    if accepted:
        assert response.status_code == 200, response.text
        assert response.json()["trainerStatus"]["lastUpdatedTime"] == NOW
    else:
        _is_status(response, 422, "Invalid")
        assert _trainer_status(cluster, "crd") is None


# ---------------------------------------------- what the TrainJob holds afterwards: values as the client sent them


def test_values_come_back_as_the_client_sent_them(cluster: Cluster) -> None:
    """pkg/statusserver/server.go applies the request's own strings (``WithValue(m.Value)``): lastUpdatedTime
    as sent (not the arrival time), ``"warmup"`` kept, ``"100"`` not ``"100.0"``; numeric strings are still
    charted (stepwatch's history)."""
    token = _register(cluster, "strings")
    sent = "2026-03-01T11:59:58.123456+00:00"
    posted = _status(
        lastUpdatedTime=sent,
        estimatedRemainingSeconds=3600,
        metrics=[{"name": "phase", "value": "warmup"}, {"name": "current_step", "value": "100"},
                 {"name": "loss", "value": "1e-3"}],
    )  # fmt: skip
    assert _post(cluster, "strings", token, json.dumps(posted)).status_code == 200
    job = cluster.job("strings")
    assert job is not None and job["trainerStatus"] == posted["trainerStatus"]
    assert job["progress"]["step"] == 100 and job["metrics"] == {"loss": 1e-3}
    assert job["eta"]["reported_seconds"] == 3600 and job["eta"]["source"] == "reported"
    assert 3500 < job["eta"]["remaining_seconds"] <= 3600
    history = cluster.client.get("/api/v1/namespaces/nlp/jobs/strings/history").json()["metrics"]
    assert list(history) == ["loss"] and [p["last"] for p in history["loss"]] == [1e-3]
    assert format_rfc3339(time.time()) != sent  # (the arrival time would be another string)


# ------------------------------------------------------------------------------ not applicable (Go machinery)

NOT_APPLICABLE = {
    "pkg/statusserver/server_test.go TestServerStartReturnsAfterContextCancel": "controller-runtime Runnable lifecycle",
    "pkg/statusserver/server_test.go TestNeedLeaderElection": "controller-runtime leader election",
    "pkg/statusserver/middleware_test.go TestRecoveryMiddleware": "a Go panic in a handler (stepwatch: any "
    "exception is a 500 Status, tests/server/api/test_api.py)",
    "pkg/statusserver/middleware_test.go TestLoggingMiddleware": "Go request logging",
    "pkg/statusserver/middleware_test.go TestChain": "Go middleware composition",
}
"""Upstream cases that test Go machinery stepwatch has no counterpart of (counted as n.a. in the table of
docs/kubernetes.md)."""


def test_the_not_applicable_cases_are_the_go_machinery_only() -> None:
    assert len(NOT_APPLICABLE) == 5 and all(NOT_APPLICABLE.values())
