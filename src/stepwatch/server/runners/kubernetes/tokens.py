"""Projected ServiceAccount tokens of TrainJob pods, at the Kubeflow-compatible status endpoint.

A pod of a TrainJob proves who it is with the token the kubelet mounts for it. Its audience is the one
Kubeflow Trainer's code projects, one per TrainJob (:func:`trainjob_audience`, upstream's ``utils.go``
``TokenAudience``: ``trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status``), accepted
for that TrainJob only; or the audience the server is configured with (``STEPWATCH_K8S_AUDIENCE``, by
default ``trainer.kubeflow.org`` as KEP-2779's text has it), for any TrainJob of the token's namespace.
:meth:`PodTokens.admit` takes a token for ``POST .../namespaces/{namespace}/trainjobs/{name}/status``
through these steps, cheapest first, so that a bad token costs the API server nothing:

1. the JWT's shape, expiry, audience, and its ``kubernetes.io`` claims: the namespace of the path, and
   a pod (a token not bound to a pod is refused);
2. its signature against the issuer's published keys (``/openid/v1/jwks``, read once and kept; RS256):
   a forged token is refused here, without an API call; ``none`` and shared-secret (HS*) algorithms are
   refused outright; other asymmetric ones (ES256...) must name a published key, then step 4 judges;
3. rate limits per TrainJob and per ServiceAccount (429 with Retry-After), before any API call, so that
   a flood from one job neither reaches the API server nor slows other jobs;
4. a ``TokenReview`` (kept until the token expires, at most 5 minutes; a refusal is kept 30 s): the API
   server's word that the token is valid and its pod still exists;
5. stricter than upstream: the pod named in the token is read (kept 60 s) and must be the same pod
   (uid) and belong to that TrainJob (its JobSet's label names it).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .api import KubeApi, KubeError
from .ratelimit import TokenBucket

__all__ = ["OWNER_LABELS", "PodIdentity", "PodTokenError", "PodTokens", "looks_like_jwt", "trainjob_audience"]

_log = logging.getLogger("stepwatch.server.kubernetes")

OWNER_LABELS = ("trainer.kubeflow.org/trainjob-name", "jobset.sigs.k8s.io/jobset-name")
"""Pod labels that name the TrainJob (Kubeflow Trainer's JobSet is named after it)."""
_LEEWAY_S = 30.0
_SIGNING_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512")
"""What an API server signs ServiceAccount tokens with (asymmetric keys only)."""
_SHA256_DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")


class PodTokenError(Exception):
    """A token refused: ``code`` 403 (not allowed) or 429 (too many; ``retry_after`` seconds)."""

    def __init__(self, code: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True)
class PodIdentity:
    """Who wrote: the pod, its ServiceAccount and the TrainJob it belongs to."""

    namespace: str
    trainjob: str
    pod: str
    pod_uid: str
    service_account: str


def trainjob_audience(namespace: str, trainjob: str) -> str:
    """The audience Kubeflow Trainer projects a TrainJob's pod tokens with (``utils.go`` ``TokenAudience``)."""
    return f"trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{trainjob}/status"


def looks_like_jwt(token: str) -> bool:
    """Whether a bearer token is a JWT (three base64url parts), not a stepwatch job token."""
    parts = token.split(".")
    return len(parts) == 3 and all(parts) and parts[0].startswith("eyJ")


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _int(text: str) -> int:
    return int.from_bytes(_b64decode(text), "big")


def rs256_verifies(n: int, e: int, signed: bytes, signature: bytes) -> bool:
    """RSASSA-PKCS1-v1_5 with SHA-256 (RFC 8017 8.2.2), with the standard library."""
    size = (n.bit_length() + 7) // 8
    if len(signature) != size or size < 64:
        return False
    value = int.from_bytes(signature, "big")
    if value >= n:
        return False
    encoded = pow(value, e, n).to_bytes(size, "big")
    digest_info = _SHA256_DIGEST_INFO + hashlib.sha256(signed).digest()
    expected = b"\x00\x01" + b"\xff" * (size - len(digest_info) - 3) + b"\x00" + digest_info
    return hmac.compare_digest(encoded, expected)


class _Bounded(OrderedDict[Any, Any]):
    """A dict that forgets its oldest entries past ``size``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class PodTokens:
    """Admits pod tokens (see the module docstring)."""

    def __init__(
        self,
        api: KubeApi,
        audience: str = "trainer.kubeflow.org",
        job_rate: float = 2.0,
        account_rate: float = 20.0,
        clock: Callable[[], float] = time.time,
        review_ttl_s: float = 300.0,
        pod_ttl_s: float = 60.0,
    ) -> None:
        self.api = api
        self.audience = audience
        self.job_rate = job_rate
        self.account_rate = account_rate
        self.clock = clock
        self.review_ttl_s = review_ttl_s
        self.pod_ttl_s = pod_ttl_s
        self._reviews = _Bounded(10_000)
        self._pods = _Bounded(10_000)
        self._jobs = _Bounded(100_000)
        self._accounts = _Bounded(100_000)
        self._keys: dict[str, tuple[int, int]] | None = None
        self._kids: set[str] = set()
        self._keys_at = -math.inf
        self._keys_lock = asyncio.Lock()
        self.stats = {"admitted": 0, "refused": 0, "limited": 0, "reviews": 0, "pod_reads": 0}

    async def admit(self, namespace: str, trainjob: str, token: str) -> PodIdentity:
        """The pod behind ``token`` if it may write the status of ``namespace/trainjob``, else
        :class:`PodTokenError`."""
        try:
            identity = await self._admit(namespace, trainjob, token)
        except PodTokenError as exc:
            self.stats["limited" if exc.code == 429 else "refused"] += 1
            raise
        self.stats["admitted"] += 1
        return identity

    async def _admit(self, namespace: str, trainjob: str, token: str) -> PodIdentity:
        header, claims, signed, signature = self._decode(token)
        now = self.clock()
        audience = self._check_claims(claims, namespace, trainjob, now)
        bound = claims["kubernetes.io"]
        await self._check_signature(header, signed, signature)
        subject = str(claims.get("sub") or "")
        self._limit(self._jobs, (namespace, trainjob), self.job_rate, 10, f"TrainJob {namespace}/{trainjob}")
        self._limit(self._accounts, subject, self.account_rate, 5, f"ServiceAccount {subject}")
        review = await self._review(token, claims, now, audience)
        user = review.get("user") or {}
        if user.get("username") != subject:
            raise PodTokenError(403, "the API server names another user for this token than the token does")
        extra = user.get("extra") or {}
        pod_name = (extra.get("authentication.kubernetes.io/pod-name") or [bound["pod"]["name"]])[0]
        pod_uid = (extra.get("authentication.kubernetes.io/pod-uid") or [bound["pod"]["uid"]])[0]
        await self._check_pod(namespace, trainjob, str(pod_name), str(pod_uid), now)
        account = str((bound.get("serviceaccount") or {}).get("name") or subject.rpartition(":")[2])
        return PodIdentity(namespace, trainjob, str(pod_name), str(pod_uid), account)

    # ------------------------------------------------------------------ 1. claims

    def _decode(self, token: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes]:
        try:
            head, body, sig = token.split(".")
            header = json.loads(_b64decode(head))
            claims = json.loads(_b64decode(body))
            signature = _b64decode(sig)
        except (ValueError, TypeError):
            raise PodTokenError(403, "the bearer token is not a ServiceAccount token (JWT)") from None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            raise PodTokenError(403, "the bearer token is not a ServiceAccount token (JWT)")
        return header, claims, f"{head}.{body}".encode(), signature

    def _check_claims(self, claims: dict[str, Any], namespace: str, trainjob: str, now: float) -> str:
        """The claims' checks; the audience the token is accepted for."""
        exp = claims.get("exp")
        if not isinstance(exp, (int, float)) or now > exp + _LEEWAY_S:
            raise PodTokenError(
                403, "the token has expired (the kubelet renews a projected token: read the file again)"
            )
        nbf = claims.get("nbf")
        if isinstance(nbf, (int, float)) and nbf > now + _LEEWAY_S:
            raise PodTokenError(403, "the token is not valid yet")
        audiences = claims.get("aud")
        audiences = [audiences] if isinstance(audiences, str) else audiences
        upstream = trainjob_audience(namespace, trainjob)
        audience = next((a for a in (upstream, self.audience) if isinstance(audiences, list) and a in audiences), None)
        if audience is None:
            raise PodTokenError(
                403,
                f"the token is not issued for audience {upstream!r} (as Kubeflow Trainer projects it for this "
                f"TrainJob) nor {self.audience!r}",
            )
        bound = claims.get("kubernetes.io")
        if not isinstance(bound, dict):
            raise PodTokenError(403, "the token carries no kubernetes.io claims: not a ServiceAccount token")
        if bound.get("namespace") != namespace:
            raise PodTokenError(
                403, f"a token of namespace {str(bound.get('namespace'))[:63]!r} cannot write to namespace {namespace}"
            )
        pod = bound.get("pod")
        if not isinstance(pod, dict) or not pod.get("name") or not pod.get("uid"):
            raise PodTokenError(403, "the token is not bound to a pod: use the projected token mounted in the pod")
        return audience

    # ------------------------------------------------------------------ 2. signature

    async def _check_signature(self, header: dict[str, Any], signed: bytes, signature: bytes) -> None:
        alg = header.get("alg")
        if alg not in _SIGNING_ALGORITHMS:  # "none", HS256 (a shared secret): never a ServiceAccount token
            raise PodTokenError(403, f"the token is signed with {str(alg)[:16]!r}: not a ServiceAccount token")
        kid = str(header.get("kid") or "")
        keys = await self._issuer_keys(kid)
        if keys is None:
            return  # the keys could not be read: the TokenReview alone judges
        if alg != "RS256":  # ES256... (no stdlib verifier): at least a key the issuer publishes, then TokenReview
            if kid not in self._kids:
                raise PodTokenError(403, "the token names no signing key of the cluster's issuer")
            return
        candidates = [keys[kid]] if kid in keys else list(keys.values())
        if not any(rs256_verifies(n, e, signed, signature) for n, e in candidates):
            raise PodTokenError(403, "the token's signature does not verify against the cluster's keys")

    async def _issuer_keys(self, kid: str) -> dict[str, tuple[int, int]] | None:
        """The issuer's RSA keys by kid; read again after 10 minutes, or at most every minute for an unknown kid."""
        now = time.monotonic()
        stale = now - self._keys_at > 600 or (self._keys is not None and kid and kid not in self._kids)
        if stale and now - self._keys_at > 60:
            async with self._keys_lock:
                if time.monotonic() - self._keys_at > 60:
                    self._keys_at = time.monotonic()
                    try:
                        data = await asyncio.to_thread(self.api.jwks)
                        published = [k for k in data.get("keys") or [] if isinstance(k, dict)]
                        self._kids = {str(k.get("kid") or "") for k in published}
                        self._keys = {
                            str(k.get("kid") or i): (_int(k["n"]), _int(k["e"]))
                            for i, k in enumerate(published)
                            if k.get("kty") == "RSA" and k.get("n") and k.get("e")
                        }
                    except (KubeError, KeyError, ValueError, TypeError) as exc:
                        _log.warning("cannot read the issuer's keys (%s): tokens are checked by TokenReview alone", exc)
                        self._keys = None
        return self._keys

    # ------------------------------------------------------------------ 3. rate limits

    def _limit(self, buckets: _Bounded, key: Any, rate: float, burst_factor: float, who: str) -> None:
        bucket = buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(rate, max(rate * burst_factor, 1.0))
            buckets.put(key, bucket)
        wait = bucket.try_take()
        if wait > 0:
            raise PodTokenError(
                429,
                f"{who} sends status too often (at most {rate:g}/s); slow down",
                retry_after=max(1.0, math.ceil(wait)),
            )

    # ------------------------------------------------------------------ 4. TokenReview

    async def _review(self, token: str, claims: dict[str, Any], now: float, audience: str) -> dict[str, Any]:
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._reviews.get(key)
        if cached is not None and cached[0] > now:
            status: dict[str, Any] = cached[1]
        else:
            try:
                status = await asyncio.to_thread(self.api.token_review, token, [audience])
            except KubeError as exc:
                _log.warning("TokenReview failed: %s", exc)
                raise PodTokenError(403, "the token could not be reviewed by the API server; try again") from None
            self.stats["reviews"] += 1
            if status.get("authenticated"):
                until = min(float(claims.get("exp") or now), now + self.review_ttl_s)
            else:
                until = now + 30.0
            self._reviews.put(key, (until, status))
        if not status.get("authenticated"):
            error = str(status.get("error") or "not authenticated")[:200]
            raise PodTokenError(403, f"the API server does not accept this token: {error}")
        if audience not in (status.get("audiences") or [audience]):
            raise PodTokenError(403, f"the API server does not accept this token for audience {audience!r}")
        return status

    # ------------------------------------------------------------------ 5. the pod

    async def _check_pod(self, namespace: str, trainjob: str, name: str, uid: str, now: float) -> None:
        cached = self._pods.get((namespace, name))
        if cached is not None and cached[0] > now:
            pod = cached[1]
        else:
            try:
                pod = await asyncio.to_thread(self.api.get_pod, namespace, name)
            except KubeError as exc:
                _log.warning("reading pod %s/%s failed: %s", namespace, name, exc)
                raise PodTokenError(403, f"pod {name} could not be read to check it belongs to {trainjob}") from None
            self.stats["pod_reads"] += 1
            self._pods.put((namespace, name), (now + self.pod_ttl_s, pod))
        if pod is None:
            raise PodTokenError(403, f"pod {namespace}/{name} no longer exists")
        meta = pod.get("metadata") or {}
        if meta.get("uid") != uid:
            raise PodTokenError(403, f"pod {namespace}/{name} is not the pod this token was issued to")
        labels = meta.get("labels") or {}
        owners = {str(labels[label]) for label in OWNER_LABELS if labels.get(label)}
        if trainjob not in owners:
            belongs = f"TrainJob {sorted(owners)[0]}" if owners else "no TrainJob"
            raise PodTokenError(403, f"pod {namespace}/{name} belongs to {belongs}, not to {trainjob}")
