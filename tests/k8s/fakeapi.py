"""A FAKE Kubernetes API server, in process on 127.0.0.1, for the TrainJob runner and the pod-token checks.

There is no Kubernetes API server on these machines, so this fake stands in for the parts stepwatch
uses, following the API's documented behaviour (kubernetes.io "API Concepts", "Server-Side Apply",
"Authenticating: TokenReview", "Service account tokens"):

- TrainJobs (``trainer.kubeflow.org/v1alpha1``, namespaced, with a ``status`` subresource): list
  (``limit``/``continue`` pages, the list's ``resourceVersion``), get, watch from a
  ``resourceVersion`` (``ADDED``/``MODIFIED``/``DELETED`` newline-delimited JSON, ``BOOKMARK`` events
  when ``allowWatchBookmarks=true``, closed after ``timeoutSeconds``), and an ``ERROR`` event with a
  ``410 Expired`` Status for a resourceVersion older than what it keeps (:meth:`FakeApi.compact`);
- server-side apply (``application/apply-patch+yaml``): ``fieldManager`` required, fields owned per
  manager in ``metadata.managedFields`` (``fieldsV1``), conflicts (409) with other managers' fields
  unless ``force=true``, fields a manager stops applying are removed, a no-op apply changes nothing
  (not even the resourceVersion); on the main resource ``status`` is ignored, on ``/status`` all but
  ``status`` is;
- JSON merge patch with a ``metadata.resourceVersion`` precondition (409 Conflict when stale) and
  delete with a ``preconditions.uid`` (409 when it names another object);
- (Cluster)TrainingRuntimes get; pods get, and list by an equality-based ``labelSelector`` (``k=v``,
  ``k==v``, ``k!=v``, ``k``, ``!k``, comma-separated: all must hold; set-based selectors are refused with
  400 here), sorted by name as etcd returns them, with the status the kubelet reports (``phase``,
  ``podIP``, ``conditions``, ``containerStatuses[].state.terminated.message``); ``TokenReview`` create;
  the issuer's keys at ``/openid/v1/jwks``; ServiceAccount tokens as RS256 JWTs with the ``kubernetes.io``
  claims a projected, pod-bound token carries (a TokenReview of a token whose pod is gone fails, as the real
  server checks the bound object);
- NetworkPolicies (``networking.k8s.io/v1``): get, create (409 ``AlreadyExists``), replace with a
  ``resourceVersion`` precondition (409 when stale).

Every request needs the bearer token of the kubeconfig the tests write (401 otherwise). Failures can be
injected (:meth:`FakeApi.fail`), watches dropped (:meth:`FakeApi.drop_watches`), and every request
is logged (:attr:`FakeApi.requests`). It is not the real thing: no admission, no defaulting, no
validation beyond what is listed, ownership per leaf field with lists atomic.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

GROUP_PATH = "/apis/trainer.kubeflow.org/v1alpha1"
API_TOKEN = "fake-runner-token"


# ------------------------------------------------------------------------------------ RSA and JWTs


def _probable_prime(bits: int) -> int:
    small = [p for p in range(3, 2000, 2) if all(p % q for q in range(3, int(p**0.5) + 1, 2))]
    while True:
        n = secrets.randbits(bits) | (1 << (bits - 1)) | 1
        if any(n % p == 0 for p in small):
            continue
        d, r = n - 1, 0
        while d % 2 == 0:
            d //= 2
            r += 1
        for _ in range(24):
            a = secrets.randbelow(n - 3) + 2
            x = pow(a, d, n)
            if x in (1, n - 1):
                continue
            for _ in range(r - 1):
                x = pow(x, 2, n)
                if x == n - 1:
                    break
            else:
                break
        else:
            return n


@dataclass(frozen=True)
class RsaKey:
    """A test signing key (1024-bit: a fake's key, fast to make)."""

    n: int
    e: int
    d: int
    kid: str

    @classmethod
    def generate(cls) -> RsaKey:
        e = 65537
        while True:
            p, q = _probable_prime(512), _probable_prime(512)
            phi = (p - 1) * (q - 1)
            if p != q and phi % e:
                return cls(p * q, e, pow(e, -1, phi), uuid.uuid4().hex[:12])

    def jwk(self) -> dict[str, str]:
        return {"kty": "RSA", "alg": "RS256", "use": "sig", "kid": self.kid, "n": _b64int(self.n), "e": _b64int(self.e)}

    def sign(self, data: bytes) -> bytes:
        size = (self.n.bit_length() + 7) // 8
        digest_info = bytes.fromhex("3031300d060960864801650304020105000420") + hashlib.sha256(data).digest()
        padded = b"\x00\x01" + b"\xff" * (size - len(digest_info) - 3) + b"\x00" + digest_info
        return pow(int.from_bytes(padded, "big"), self.d, self.n).to_bytes(size, "big")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64int(value: int) -> str:
    return _b64(value.to_bytes((value.bit_length() + 7) // 8, "big"))


def make_jwt(key: RsaKey, claims: dict[str, Any], header: dict[str, Any] | None = None) -> str:
    """A signed JWT (RS256), as the API server issues ServiceAccount tokens."""
    head = _b64(json.dumps(header or {"alg": "RS256", "kid": key.kid}).encode())
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{_b64(key.sign(f'{head}.{body}'.encode()))}"


# ------------------------------------------------------------------------------------- the store


def _leaves(obj: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Leaf paths of an applied config (lists are atomic, as ``listType=atomic``)."""
    if isinstance(obj, dict) and obj:
        found: dict[tuple[str, ...], Any] = {}
        for key, value in obj.items():
            found.update(_leaves(value, (*prefix, key)))
        return found
    return {prefix: obj}


_MISSING = object()


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def _set(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            obj[key] = {}
        obj = obj[key]
    obj[path[-1]] = copy.deepcopy(value)


def _delete(obj: dict[str, Any], path: tuple[str, ...]) -> None:
    parents = []
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        parents.append((node, key))
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, key in reversed(parents):  # drop the maps left empty
        if parent[key] == {}:
            del parent[key]


def _fields_v1(paths: set[tuple[str, ...]]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(paths):
        node = root
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return root


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def _now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiFailure(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.body = status_body(code, reason, message, details)
        self.code = code


@dataclass
class _Owner:
    manager: str
    operation: str
    subresource: str
    paths: set[tuple[str, ...]] = field(default_factory=set)


class FakeApi:
    """The fake's state and behaviour (see the module docstring); :meth:`start` serves it."""

    def __init__(self, key: RsaKey | None = None) -> None:
        self.lock = threading.Condition()
        self.rv = 100
        self.trainjobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.owners: dict[tuple[str, str], list[_Owner]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.oldest = 0
        """Watches from a resourceVersion older than this get 410 Expired."""
        self.runtimes: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.network_policies: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.failures: list[list[Any]] = []
        self.timed: list[tuple[float, str, str]] = []
        self.key = key or RsaKey.generate()
        self.issuer = "https://kubernetes.default.svc.cluster.local"
        self.bookmark_every_s = 0.2
        self._generation = 0
        """Bumped by :meth:`drop_watches`: open watches end."""
        self._pages: dict[str, list[dict[str, Any]]] = {}
        self.server: ThreadingHTTPServer | None = None

    # ------------------------------------------------------------------ test controls

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeApi:
        fake = self

        class Handler(_Handler):
            api = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True, name="fake-kube-api").start()
        return self

    def stop(self) -> None:
        self.drop_watches()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig for this fake (what ``kubectl`` and the ``kubernetes`` client read)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "runner", "user": {"token": API_TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "runner", "namespace": namespace}}],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    def fail(self, method: str, path_part: str, code: int, times: int = 1) -> None:
        """The next ``times`` requests of ``method`` whose path contains ``path_part`` answer ``code``."""
        with self.lock:
            self.failures.append([method, path_part, code, times])

    def drop_watches(self) -> None:
        """End every open watch (as a restarting API server or a load balancer does)."""
        with self.lock:
            self._generation += 1
            self.lock.notify_all()

    def compact(self) -> None:
        """Forget the history: watches from any resourceVersion up to now get 410 Expired."""
        with self.lock:
            self.history.clear()
            self.oldest = self.rv + 1
            self._generation += 1
            self.lock.notify_all()

    def timed_calls(self) -> list[tuple[float, str, str]]:
        """``(time.monotonic(), method, path)`` of every request, in order."""
        with self.lock:
            return list(self.timed)

    def calls(self, method: str | None = None, path_part: str = "") -> list[tuple[str, str, dict[str, list[str]]]]:
        with self.lock:
            return [r for r in self.requests if (method is None or r[0] == method) and path_part in r[1]]

    # ------------------------------------------------------------------ objects

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        self.history.append((self.rv, kind, copy.deepcopy(obj)))
        self.lock.notify_all()

    def _publish(self, key: tuple[str, str]) -> None:
        obj = self.trainjobs[key]
        obj["metadata"]["managedFields"] = [
            {
                "manager": o.manager,
                "operation": o.operation,
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "time": _now_rfc3339(),
                "fieldsType": "FieldsV1",
                "fieldsV1": _fields_v1(o.paths),
                **({"subresource": o.subresource} if o.subresource else {}),
            }
            for o in self.owners.get(key, [])
            if o.paths
        ]

    def create_trainjob(self, obj: dict[str, Any], manager: str = "kubectl") -> dict[str, Any]:
        with self.lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            meta.setdefault("namespace", "default")
            key = (meta["namespace"], meta["name"])
            if key in self.trainjobs:
                raise ApiFailure(409, "AlreadyExists", f'trainjobs.trainer.kubeflow.org "{key[1]}" already exists')
            meta.update(
                uid=str(uuid.uuid4()), resourceVersion=self._bump(), creationTimestamp=_now_rfc3339(), generation=1
            )
            obj.setdefault("apiVersion", "trainer.kubeflow.org/v1alpha1")
            obj.setdefault("kind", "TrainJob")
            status = obj.pop("status", None)
            self.owners[key] = [_Owner(manager, "Update", "", set(_leaves({"spec": obj.get("spec", {})})))]
            if status:
                obj["status"] = status
            self.trainjobs[key] = obj
            self._publish(key)
            self._emit("ADDED", obj)
            return copy.deepcopy(obj)

    def controller_update_status(self, namespace: str, name: str, status: dict[str, Any], manager: str) -> None:
        """What a controller does: a merge patch of ``/status`` under its own manager (``Update``)."""
        self.merge_patch(namespace, name, {"status": status}, manager, subresource="status")

    def set_condition(self, namespace: str, name: str, kind: str, status: str = "True", **extra: str) -> None:
        """Kubeflow's controller sets a condition (``Complete``, ``Failed``, ``Suspended``...)."""
        with self.lock:
            current = copy.deepcopy(self.trainjobs[(namespace, name)].get("status", {}).get("conditions", []))
        current = [c for c in current if c["type"] != kind]
        current.append({"type": kind, "status": status, "lastTransitionTime": _now_rfc3339(), "reason": kind, **extra})
        self.merge_patch(namespace, name, {"status": {"conditions": current}}, "trainer-controller", "status")

    def delete_trainjob(self, namespace: str, name: str, uid: str | None = None) -> None:
        with self.lock:
            obj = self.trainjobs.get((namespace, name))
            if obj is None:
                raise ApiFailure(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
            if uid is not None and obj["metadata"]["uid"] != uid:
                raise ApiFailure(
                    409,
                    "Conflict",
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {obj['metadata']['uid']}",
                )
            del self.trainjobs[(namespace, name)]
            self.owners.pop((namespace, name), None)
            obj["metadata"]["resourceVersion"] = self._bump()
            self._emit("DELETED", obj)

    def merge_patch(
        self, namespace: str, name: str, patch: dict[str, Any], manager: str, subresource: str = ""
    ) -> dict[str, Any]:
        with self.lock:
            key = (namespace, name)
            obj = self.trainjobs.get(key)
            if obj is None:
                raise ApiFailure(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
            patch = copy.deepcopy(patch)
            wanted = (patch.get("metadata") or {}).pop("resourceVersion", None)
            if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
                raise ApiFailure(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on trainjobs.trainer.kubeflow.org "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            patch = {"status": patch.get("status", {})} if subresource == "status" else _without_status(patch)
            before = copy.deepcopy(obj)
            _merge(obj, patch)
            touched = {p for p in _leaves(patch) if patch and p != ()}
            self._take(key, manager, "Update", subresource, touched)
            return self._changed(key, before)

    def apply(
        self, namespace: str, name: str, config: dict[str, Any], manager: str, force: bool, subresource: str = ""
    ) -> dict[str, Any]:
        with self.lock:
            key = (namespace, name)
            obj = self.trainjobs.get(key)
            if obj is None:
                raise ApiFailure(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
            config = {"status": config.get("status", {})} if subresource == "status" else _without_status(config)
            meta = config.get("metadata") or {}
            config = {k: v for k, v in config.items() if k not in ("apiVersion", "kind", "metadata")}
            if meta.get("annotations") or meta.get("labels"):
                config["metadata"] = {k: meta[k] for k in ("annotations", "labels") if meta.get(k)}
            applied = {p: v for p, v in _leaves(config).items() if p}
            conflicts = []
            for other in self.owners.get(key, []):
                if other.manager == manager and other.subresource == subresource:
                    continue
                for path, value in applied.items():
                    if path in other.paths and _get(obj, path) != value:
                        conflicts.append((other.manager, path))
            if conflicts and not force:
                causes = [
                    {"type": "FieldManagerConflict", "message": f'conflict with "{m}"', "field": "." + ".".join(p)}
                    for m, p in conflicts
                ]
                raise ApiFailure(409, "Conflict", f"Apply failed with {len(conflicts)} conflict(s)", {"causes": causes})
            before = copy.deepcopy(obj)
            mine = next(
                (o for o in self.owners.get(key, []) if o.manager == manager and o.subresource == subresource), None
            )
            for path in (mine.paths if mine else set()) - set(applied):
                if not any(path in o.paths for o in self.owners[key] if o is not mine):
                    _delete(obj, path)
            for path, value in applied.items():
                _set(obj, path, value)
            self._take(key, manager, "Apply", subresource, set(applied), replace=True)
            return self._changed(key, before)

    def _take(
        self,
        key: tuple[str, str],
        manager: str,
        operation: str,
        sub: str,
        paths: set[tuple[str, ...]],
        replace: bool = False,
    ) -> None:
        owners = self.owners.setdefault(key, [])
        for other in owners:
            if not (other.manager == manager and other.subresource == sub):
                other.paths -= paths
        mine = next((o for o in owners if o.manager == manager and o.subresource == sub), None)
        if mine is None:
            owners.append(_Owner(manager, operation, sub, set(paths)))
        else:
            mine.operation = operation
            mine.paths = set(paths) if replace else mine.paths | paths

    def _changed(self, key: tuple[str, str], before: dict[str, Any]) -> dict[str, Any]:
        obj = self.trainjobs[key]
        strip = {k: v for k, v in before["metadata"].items() if k != "managedFields"}
        after = {k: v for k, v in obj["metadata"].items() if k != "managedFields"}
        same = strip == after and {k: v for k, v in before.items() if k != "metadata"} == {
            k: v for k, v in obj.items() if k != "metadata"
        }
        if same:
            self._publish(key)
            return copy.deepcopy(obj)  # a no-op: no new resourceVersion, no event
        if before.get("spec") != obj.get("spec"):
            obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        obj["metadata"]["resourceVersion"] = self._bump()
        self._publish(key)
        self._emit("MODIFIED", obj)
        return copy.deepcopy(obj)

    # ------------------------------------------------------------------ pods and tokens

    def add_pod(
        self,
        namespace: str,
        name: str,
        trainjob: str | None,
        phase: str = "Running",
        *,
        labels: dict[str, str] | None = None,
        pod_ip: str | None = None,
        ready: bool | None = None,
        containers: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A pod as JobSet creates them for a TrainJob (labels naming the JobSet, which is named after it), or
        with ``labels`` of its own when given; ``pod_ip``, ``ready`` (its ``Ready`` condition) and
        ``containers`` (its ``containerStatuses``) as the kubelet reports them."""
        if labels is None:
            labels = (
                {"jobset.sigs.k8s.io/jobset-name": trainjob, "trainer.kubeflow.org/trainjob-name": trainjob}
                if trainjob
                else {}
            )
        status: dict[str, Any] = {"phase": phase}
        if pod_ip is not None:
            status["podIP"] = pod_ip
        if ready is not None:
            status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        if containers is not None:
            status["containerStatuses"] = containers
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "labels": labels},
            "status": status,
        }
        with self.lock:
            self.pods[(namespace, name)] = pod
        return pod

    def set_pod_status(self, namespace: str, name: str, **status: Any) -> None:
        """The kubelet updates a pod's status (``phase="Succeeded"``, ``containerStatuses=[...]``...)."""
        with self.lock:
            self.pods[(namespace, name)]["status"].update(copy.deepcopy(status))

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """The pods of a namespace matching an equality-based label selector, by name."""
        terms = [t.strip() for t in selector.split(",") if t.strip()]
        if any(" " in t or "(" in t for t in terms):
            raise ApiFailure(400, "BadRequest", f"this fake takes equality-based selectors only: {selector!r}")

        def holds(term: str, labels: dict[str, str]) -> bool:
            if "!=" in term:
                key, value = term.split("!=", 1)
                return labels.get(key) != value
            if "=" in term:
                key, value = term.replace("==", "=").split("=", 1)
                return labels.get(key) == value
            if term.startswith("!"):
                return term[1:] not in labels
            return term in labels

        with self.lock:
            return [
                copy.deepcopy(pod)
                for (ns, _), pod in sorted(self.pods.items())
                if ns == namespace and all(holds(t, pod["metadata"].get("labels") or {}) for t in terms)
            ]

    def token(
        self,
        namespace: str,
        pod: str,
        service_account: str = "default",
        audience: str = "trainer.kubeflow.org",
        expires_in: float = 3600.0,
        key: RsaKey | None = None,
        pod_uid: str | None = None,
    ) -> str:
        """A projected ServiceAccount token for a pod, as the kubelet mounts it."""
        now = int(time.time())
        uid = pod_uid or (self.pods.get((namespace, pod)) or {}).get("metadata", {}).get("uid", str(uuid.uuid4()))
        claims = {
            "aud": [audience],
            "exp": int(now + expires_in),
            "iat": now,
            "nbf": now,
            "iss": self.issuer,
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "kubernetes.io": {
                "namespace": namespace,
                "pod": {"name": pod, "uid": uid},
                "serviceaccount": {"name": service_account, "uid": "sa-" + service_account},
            },
        }
        return make_jwt(key or self.key, claims)

    def review(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A TokenReview: signature, expiry, audiences, and the bound pod still there."""
        token = spec.get("token", "")
        wanted = spec.get("audiences") or []
        try:
            head, body, sig = token.split(".")
            signed = f"{head}.{body}".encode()
            if self.key.sign(signed) != base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)):
                raise ValueError("invalid signature")
            claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            if claims["exp"] < time.time():
                raise ValueError("token has expired")
            audiences = [a for a in claims["aud"] if not wanted or a in wanted]
            if not audiences:
                raise ValueError("token audiences is invalid for the target audiences")
            bound = claims["kubernetes.io"]
            pod = self.pods.get((bound["namespace"], bound["pod"]["name"]))
            if pod is None or pod["metadata"]["uid"] != bound["pod"]["uid"]:
                raise ValueError(f'pods "{bound["pod"]["name"]}" not found')
        except (ValueError, KeyError, TypeError) as exc:
            return {"authenticated": False, "error": f"[invalid bearer token, {exc}]"}
        sa = bound["serviceaccount"]["name"]
        return {
            "authenticated": True,
            "user": {
                "username": claims["sub"],
                "uid": bound["serviceaccount"]["uid"],
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{bound['namespace']}",
                    "system:authenticated",
                ],
                "extra": {
                    "authentication.kubernetes.io/pod-name": [bound["pod"]["name"]],
                    "authentication.kubernetes.io/pod-uid": [bound["pod"]["uid"]],
                    "authentication.kubernetes.io/credential-id": ["JTI=" + sa],
                },
            },
            "audiences": audiences,
        }


def _bool(text: str | None) -> bool:
    """A query flag as the API server reads it (Go's strconv.ParseBool: the Python client sends ``True``)."""
    return text in ("1", "t", "T", "true", "TRUE", "True")


def _without_status(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "status"}


class _Handler(BaseHTTPRequestHandler):
    api: FakeApi
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked watch bodies (the client streams chunk by chunk)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -------------------------------------------------------------- plumbing

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        return json.loads(self._raw) if self._raw else None

    def _route(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self._raw = self.rfile.read(length) if length else b""  # read whatever the answer: the connection is kept
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        api = self.api
        with api.lock:
            api.requests.append((method, parts.path, query))
            api.timed.append((time.monotonic(), method, parts.path))
            for failure in api.failures:
                if failure[0] == method and failure[1] in parts.path and failure[3] > 0:
                    failure[3] -= 1
                    code = failure[2]
                    reason = {409: "Conflict", 410: "Expired", 429: "TooManyRequests", 500: "InternalError"}
                    return self._send(code, status_body(code, reason.get(code, "Unknown"), f"injected {code}"))
        if self.headers.get("Authorization") != f"Bearer {API_TOKEN}":
            return self._send(401, status_body(401, "Unauthorized", "Unauthorized"))
        try:
            self._serve(method, parts.path, query)
        except ApiFailure as exc:
            self._send(exc.code, exc.body)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PATCH(self) -> None:
        self._route("PATCH")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def do_PUT(self) -> None:
        self._route("PUT")

    # -------------------------------------------------------------- routes

    def _serve(self, method: str, path: str, query: dict[str, list[str]]) -> None:
        api = self.api
        segments = path.strip("/").split("/")
        q = {k: v[-1] for k, v in query.items()}
        if path == "/openid/v1/jwks" and method == "GET":
            return self._send(200, {"keys": [api.key.jwk()]})
        if path == "/apis/authentication.k8s.io/v1/tokenreviews" and method == "POST":
            review = self._body() or {}
            status = api.review(review.get("spec") or {})
            return self._send(201, {**review, "status": status})
        if segments[:3] == ["api", "v1", "namespaces"] and segments[4:5] == ["pods"] and method == "GET":
            return self._pods(segments[3], segments[5] if len(segments) == 6 else None, q)
        if segments[:3] == ["apis", "networking.k8s.io", "v1"] and segments[3:4] == ["namespaces"]:
            return self._network_policy(method, segments[4:])
        if not path.startswith(GROUP_PATH + "/"):
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        rest = segments[3:]
        namespace = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else "")
        if resource in ("clustertrainingruntimes", "trainingruntimes") and method == "GET" and name:
            kind = "ClusterTrainingRuntime" if resource == "clustertrainingruntimes" else "TrainingRuntime"
            found = api.runtimes.get((kind, namespace or "", name))
            if found is None:
                raise ApiFailure(404, "NotFound", f'{resource}.trainer.kubeflow.org "{name}" not found')
            return self._send(200, found)
        if resource != "trainjobs":
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        if name is None and method == "GET":
            if _bool(q.get("watch")):
                return self._watch(namespace, q)
            return self._list(namespace, q)
        if name is None or namespace is None:
            raise ApiFailure(405, "MethodNotAllowed", "not supported by this fake")
        if method == "GET":
            with api.lock:
                obj = api.trainjobs.get((namespace, name))
                if obj is None:
                    raise ApiFailure(404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found')
                return self._send(200, copy.deepcopy(obj))
        if method == "PATCH":
            kind = self.headers.get("Content-Type", "")
            body = self._body() or {}
            manager = q.get("fieldManager", "")
            if kind.startswith("application/apply-patch"):
                if not manager:
                    raise ApiFailure(
                        422,
                        "Invalid",
                        'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is '
                        "required for apply patch",
                    )
                force = _bool(q.get("force"))
                return self._send(200, api.apply(namespace, name, body, manager, force, sub))
            if kind.startswith("application/merge-patch+json"):
                if "force" in q:
                    raise ApiFailure(400, "BadRequest", "force must be unset for non-apply patch requests")
                return self._send(200, api.merge_patch(namespace, name, body, manager or "unknown", sub))
            raise ApiFailure(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {kind}")
        if method == "DELETE":
            options = self._body() or {}
            api.delete_trainjob(namespace, name, (options.get("preconditions") or {}).get("uid"))
            return self._send(200, status_body(200, "", "deleted") | {"status": "Success"})
        raise ApiFailure(405, "MethodNotAllowed", f"{method} is not supported by this fake")

    def _pods(self, namespace: str, name: str | None, q: dict[str, str]) -> None:
        """A pod, or the pods of a namespace by ``labelSelector``."""
        if name is None:
            items = self.api.list_pods(namespace, q.get("labelSelector", ""))
            return self._send(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
        with self.api.lock:
            pod = copy.deepcopy(self.api.pods.get((namespace, name)))
        if pod is None:
            raise ApiFailure(404, "NotFound", f'pods "{name}" not found')
        return self._send(200, pod)

    def _network_policy(self, method: str, rest: list[str]) -> None:
        """``/apis/networking.k8s.io/v1/namespaces/`` + ``rest``: ``NS/networkpolicies[/NAME]``."""
        api = self.api
        if len(rest) not in (2, 3) or rest[1] != "networkpolicies":
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        namespace, name = rest[0], (rest[2] if len(rest) == 3 else None)
        with api.lock:
            if method == "GET" and name is not None:
                found = api.network_policies.get((namespace, name))
                if found is None:
                    raise ApiFailure(404, "NotFound", f'networkpolicies.networking.k8s.io "{name}" not found')
                return self._send(200, copy.deepcopy(found))
            body = copy.deepcopy(self._body() or {})
            meta = body.setdefault("metadata", {})
            if method == "POST" and name is None:
                key = (namespace, meta.get("name", ""))
                if key in api.network_policies:
                    raise ApiFailure(
                        409, "AlreadyExists", f'networkpolicies.networking.k8s.io "{key[1]}" already exists'
                    )
                meta.update(namespace=namespace, uid=str(uuid.uuid4()), resourceVersion=api._bump(), generation=1)
                meta.setdefault("creationTimestamp", _now_rfc3339())
                api.network_policies[key] = body
                return self._send(201, copy.deepcopy(body))
            if method == "PUT" and name is not None:
                current = api.network_policies.get((namespace, name))
                if current is None:
                    raise ApiFailure(404, "NotFound", f'networkpolicies.networking.k8s.io "{name}" not found')
                if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
                    raise ApiFailure(409, "Conflict", f'Operation cannot be fulfilled on networkpolicies "{name}"')
                meta.update(uid=current["metadata"]["uid"], resourceVersion=api._bump())
                api.network_policies[(namespace, name)] = body
                return self._send(200, copy.deepcopy(body))
        raise ApiFailure(405, "MethodNotAllowed", f"{method} is not supported by this fake")

    def _list(self, namespace: str | None, q: dict[str, str]) -> None:
        api = self.api
        limit = int(q.get("limit") or 0)
        with api.lock:
            token = q.get("continue")
            if token:
                page_id, offset_text, rv = token.split(":")
                items = api._pages.get(page_id)
                if items is None or int(rv) < api.oldest:
                    raise ApiFailure(410, "Expired", "The provided continue parameter is too old")
                offset = int(offset_text)
            else:
                items = [
                    copy.deepcopy(o)
                    for (ns, _), o in sorted(api.trainjobs.items())
                    if namespace is None or ns == namespace
                ]
                page_id, offset, rv = uuid.uuid4().hex[:8], 0, str(api.rv)
                api._pages[page_id] = items
            page = items[offset : offset + limit] if limit else items[offset:]
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            if limit and offset + limit < len(items):
                meta["continue"] = f"{page_id}:{offset + limit}:{rv}"
            self._send(
                200,
                {
                    "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "kind": "TrainJobList",
                    "metadata": meta,
                    "items": page,
                },
            )

    def _watch(self, namespace: str | None, q: dict[str, str]) -> None:
        """A watch: newline-delimited events in a chunked body (one event a chunk), as the API server sends."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def write(event: dict[str, Any]) -> None:
            line = json.dumps(event).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        try:
            self._watch_events(namespace, q, write)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _watch_events(self, namespace: str | None, q: dict[str, str], write: Callable[[dict[str, Any]], None]) -> None:
        api = self.api
        since = int(q.get("resourceVersion") or 0)
        bookmarks = _bool(q.get("allowWatchBookmarks"))
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 1800)

        with api.lock:
            generation = api._generation
            if since == 0:  # no resourceVersion: the current state first, as ADDED
                pending = [
                    ("ADDED", copy.deepcopy(o))
                    for (ns, _), o in sorted(api.trainjobs.items())
                    if namespace in (None, ns)
                ]
                since = api.rv
            elif since < api.oldest - 1:
                pending = []
                expired = status_body(410, "Expired", f"too old resource version: {since} ({api.oldest - 1})")
                write({"type": "ERROR", "object": expired})
                return
            else:
                pending = []
        last_bookmark = time.monotonic()
        try:
            for kind, obj in pending:
                write({"type": kind, "object": obj})
            while time.monotonic() < deadline:
                with api.lock:
                    if api._generation != generation:
                        return
                    if since < api.oldest - 1:
                        write(
                            {
                                "type": "ERROR",
                                "object": status_body(410, "Expired", f"too old resource version: {since}"),
                            }
                        )
                        return
                    events = [
                        (rv, kind, obj)
                        for rv, kind, obj in api.history
                        if rv > since and namespace in (None, obj["metadata"]["namespace"])
                    ]
                    current = api.rv  # every event up to here is in ``events``: what a bookmark may say
                    if not events:
                        api.lock.wait(timeout=min(0.05, max(deadline - time.monotonic(), 0)))
                if events:
                    for rv, kind, obj in events:
                        write({"type": kind, "object": obj})
                        since = rv
                    continue
                if bookmarks and time.monotonic() - last_bookmark >= api.bookmark_every_s:
                    since = max(since, current)
                    write(
                        {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": "TrainJob",
                                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                                "metadata": {"resourceVersion": str(since)},
                            },
                        }
                    )
                    last_bookmark = time.monotonic()
        except (BrokenPipeError, ConnectionResetError):
            return
