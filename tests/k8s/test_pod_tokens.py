"""Projected ServiceAccount tokens of TrainJob pods at the Kubeflow-compatible status endpoint: each item of
issue 8's "bad input and security" list about tokens has its test. The API server is a FAKE (``fakeapi.py``:
there is none on these machines) that issues RS256 tokens shaped as the kubelet's projected tokens and
answers TokenReviews as the real one documents."""

from __future__ import annotations

import time
from typing import Any

from fakeapi import RsaKey, make_jwt
from kubehelp import Cluster, pod_status


def pod(cluster: Cluster, name: str, trainjob: str | None, namespace: str = "nlp") -> dict[str, Any]:
    found: dict[str, Any] = cluster.fake.add_pod(namespace, name, trainjob)
    return found


def api_calls(cluster: Cluster) -> int:
    return len(cluster.fake.requests)


def reviews(cluster: Cluster) -> int:
    return len(cluster.fake.calls("POST", "/tokenreviews"))


def test_a_pod_of_the_trainjob_writes_its_status_and_the_review_is_cached(cluster: Cluster) -> None:
    pod(cluster, "llama-node-0-0", "llama")
    token = cluster.fake.token("nlp", "llama-node-0-0")
    body = pod_status(10)
    response = cluster.post_status("llama", token, body)
    assert response.status_code == 200, response.text
    assert response.json() == body  # upstream echoes the payload
    view = cluster.job("llama")
    assert view is not None and view["source"] == "kubeflow" and view["progress"]["step"] == 10
    before = api_calls(cluster)
    assert cluster.post_status("llama", token, pod_status(11)).status_code == 200
    assert api_calls(cluster) == before  # TokenReview, pod and keys kept: no API call for the next post
    assert reviews(cluster) == 1
    assert cluster.job("llama")["progress"]["step"] == 11  # type: ignore[index]


def test_job_tokens_keep_working_beside_pod_tokens(cluster: Cluster) -> None:
    response = cluster.client.post("/api/v1/namespaces/nlp/jobs", json={"name": "native"})
    assert response.status_code == 201, response.text
    token = response.json()["token"]
    assert cluster.post_status("native", token, pod_status(5)).status_code == 200
    assert reviews(cluster) == 0


def test_a_token_of_another_namespace_is_refused(cluster: Cluster) -> None:
    pod(cluster, "llama-node-0-0", "llama", namespace="vision")
    token = cluster.fake.token("vision", "llama-node-0-0")
    response = cluster.post_status("llama", token, pod_status(1), namespace="nlp")
    assert response.status_code == 403
    assert response.json()["kind"] == "Status" and "namespace" in response.json()["message"]
    assert api_calls(cluster) == 0  # the claims say so: no API call
    assert cluster.job("llama") is None


def test_a_pod_of_another_trainjob_is_refused(cluster: Cluster) -> None:
    pod(cluster, "mistral-node-0-0", "mistral")
    pod(cluster, "debug-shell", None)  # a pod of the namespace that belongs to no TrainJob
    for name, owner in (("mistral-node-0-0", "TrainJob mistral"), ("debug-shell", "no TrainJob")):
        response = cluster.post_status("llama", cluster.fake.token("nlp", name), pod_status(1))
        assert response.status_code == 403, response.text
        assert f"belongs to {owner}, not to llama" in response.json()["message"]
    assert cluster.job("llama") is None
    mine = cluster.fake.token("nlp", "mistral-node-0-0")
    assert cluster.post_status("mistral", mine, pod_status(1)).status_code == 200


def test_a_token_of_a_deleted_or_replaced_pod_is_refused(cluster: Cluster) -> None:
    old = pod(cluster, "llama-node-0-0", "llama")
    token = cluster.fake.token("nlp", "llama-node-0-0", pod_uid=old["metadata"]["uid"])
    pod(cluster, "llama-node-0-0", "llama")  # same name, a new pod (new uid): the old token's pod is gone
    response = cluster.post_status("llama", token, pod_status(1))
    assert response.status_code == 403
    assert "does not accept this token" in response.json()["message"]


def test_an_expired_token_is_refused_without_an_api_call(cluster: Cluster) -> None:
    pod(cluster, "llama-node-0-0", "llama")
    token = cluster.fake.token("nlp", "llama-node-0-0", expires_in=-120)
    response = cluster.post_status("llama", token, pod_status(1))
    assert response.status_code == 403
    assert "expired" in response.json()["message"]
    assert api_calls(cluster) == 0


def test_a_forged_token_is_refused_without_an_api_call(cluster: Cluster) -> None:
    pod(cluster, "llama-node-0-0", "llama")
    good = cluster.fake.token("nlp", "llama-node-0-0")
    assert cluster.post_status("llama", good, pod_status(1)).status_code == 200  # the issuer's keys are read now
    before = api_calls(cluster)
    head, body, _ = good.split(".")
    forged_key = RsaKey(cluster.fake.key.n + 2, 65537, 3, cluster.fake.key.kid)  # not the cluster's key
    other = RsaKey.generate()
    claims = {
        "aud": ["trainer.kubeflow.org"],
        "exp": int(time.time()) + 3600,
        "sub": "system:serviceaccount:nlp:default",
        "kubernetes.io": {"namespace": "nlp", "pod": {"name": "llama-node-0-0", "uid": "x"}},
    }
    forged = [
        make_jwt(other, claims, {"alg": "RS256", "kid": cluster.fake.key.kid}),  # signed by another key
        make_jwt(other, claims, {"alg": "RS256", "kid": other.kid}),  # naming a key the issuer does not have
        f"{head}.{body}.{make_jwt(forged_key, claims).split('.')[2]}",  # real claims, a made-up signature
        make_jwt(other, claims, {"alg": "none"}).rsplit(".", 1)[0] + ".c2ln",  # "alg": "none"
        make_jwt(other, claims, {"alg": "HS256", "kid": cluster.fake.key.kid}),  # a shared-secret algorithm
    ]
    for token in forged:
        response = cluster.post_status("llama", token, pod_status(99))
        assert response.status_code == 403, response.text
    assert api_calls(cluster) == before  # none of them reached the API server (the unknown kid: at most a key read)
    assert reviews(cluster) == 1
    assert cluster.job("llama")["progress"]["step"] == 1  # type: ignore[index]


def test_a_token_for_another_audience_or_not_bound_to_a_pod_is_refused(cluster: Cluster) -> None:
    pod(cluster, "llama-node-0-0", "llama")
    wrong_audience = cluster.fake.token("nlp", "llama-node-0-0", audience="https://kubernetes.default.svc")
    response = cluster.post_status("llama", wrong_audience, pod_status(1))
    assert response.status_code == 403 and "audience" in response.json()["message"]
    unbound = make_jwt(
        cluster.fake.key,
        {
            "aud": ["trainer.kubeflow.org"],
            "exp": int(time.time()) + 3600,
            "sub": "system:serviceaccount:nlp:default",
            "kubernetes.io": {"namespace": "nlp", "serviceaccount": {"name": "default", "uid": "sa"}},
        },
    )
    response = cluster.post_status("llama", unbound, pod_status(1))
    assert response.status_code == 403 and "not bound to a pod" in response.json()["message"]
    assert api_calls(cluster) == 0


def test_a_flood_from_one_job_gets_429_and_other_jobs_are_unaffected(cluster: Cluster) -> None:
    pod(cluster, "llama-node-0-0", "llama")
    pod(cluster, "mistral-node-0-0", "mistral")
    flood = cluster.fake.token("nlp", "llama-node-0-0")
    calm = cluster.fake.token("nlp", "mistral-node-0-0")
    codes = [cluster.post_status("llama", flood, pod_status(1 + i % 50)).status_code for i in range(40)]
    assert codes[:20] == [200] * 20  # a burst of 10 s at 2/s
    assert 429 in codes[20:]
    limited = cluster.post_status("llama", flood, pod_status(1))
    assert limited.status_code == 429
    assert int(limited.headers["Retry-After"]) >= 1
    assert limited.json()["reason"] == "TooManyRequests"
    reviews_so_far = reviews(cluster)
    for step in range(5):
        assert cluster.post_status("mistral", calm, pod_status(step)).status_code == 200
    assert reviews(cluster) == reviews_so_far + 1  # the flood cost the API server one TokenReview


def test_a_flood_from_one_service_account_gets_429_and_other_accounts_are_unaffected(
    make_cluster: Any,
) -> None:
    cluster: Cluster = make_cluster(k8s_account_rate=1.0)  # bursts of 5 per account
    for name in ("a", "b", "c"):
        pod(cluster, f"{name}-0", name)
    noisy = [cluster.fake.token("nlp", f"{n}-0", service_account="noisy") for n in ("a", "b")]
    codes = [cluster.post_status(n, t, pod_status(1)).status_code for _ in range(4) for n, t in zip("ab", noisy)]
    assert codes.count(200) == 5 and codes.count(429) == 3
    quiet = cluster.fake.token("nlp", "c-0", service_account="quiet")
    assert cluster.post_status("c", quiet, pod_status(1)).status_code == 200


def test_without_pod_tokens_a_jwt_is_just_a_wrong_job_token(make_cluster: Any) -> None:
    cluster: Cluster = make_cluster(k8s_pod_tokens=False)
    response = cluster.client.post("/api/v1/namespaces/nlp/jobs", json={"name": "llama"})
    assert response.status_code == 201
    pod(cluster, "llama-node-0-0", "llama")
    response = cluster.post_status("llama", cluster.fake.token("nlp", "llama-node-0-0"), pod_status(1))
    assert response.status_code == 403
    assert api_calls(cluster) == 0
