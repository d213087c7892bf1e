"""Server settings: each declared once (name, default, type, help, variable); read at start, never at import."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .analysis.cost import PriceList, parse_prices
from .analysis.health_params import HealthParams
from .api.auth import AUTH_MODES, Authenticator, Grant, is_loopback, parse_cidrs, parse_group_roles
from .api.guard import GuardRules
from .notify import TargetRules, parse_allow_list
from .policies.model import Policy, PolicyError, parse_policy

__all__ = ["SERVER_SETTINGS", "ServerSettings", "default_data_dir"]


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the embedded database lives: ``$STEPWATCH_HOME``, else ``$XDG_DATA_HOME/stepwatch``."""
    env = os.environ if environ is None else environ
    if env.get("STEPWATCH_HOME"):
        return Path(env["STEPWATCH_HOME"])
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "stepwatch"


@dataclass(frozen=True)
class _Setting:
    name: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    help: str


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"a port is 0..65535, got {value}")
    return value


def _policy(text: str) -> Policy:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    try:
        return parse_policy(data)
    except PolicyError as exc:
        raise ValueError(str(exc)) from None


def _prices(text: str) -> dict[str, float]:
    return parse_prices(text)


def _health(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("give a JSON object of knob: number")
    known = {f.name: f for f in fields(HealthParams)}
    for key, value in data.items():
        if key not in known:
            raise ValueError(f"unknown knob {key!r}; the knobs are {', '.join(known)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")
        if known[key].type in ("int", int):
            if value != int(value):
                raise ValueError(f"{key} must be a whole number, got {value!r}")
            data[key] = int(value)
    try:
        HealthParams(**data)
    except (TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    return dict(data)


def _seconds(text: str) -> float:
    value = float(text)
    if not (0 < value < 86400):
        raise ValueError(f"seconds between 0 and 86400, got {text}")
    return value


def _linger_ms(text: str) -> float:
    value = float(text)
    if not (0 <= value <= 100):
        raise ValueError(f"milliseconds between 0 and 100, got {text}")
    return value


def _days(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"a number of days above 0, got {text!r}")
    return value


def _quotas(text: str) -> dict[str, int]:
    """A quota for every namespace (``"*"``), or JSON of quotas by namespace."""
    text = text.strip()
    if not text.startswith("{"):
        return {"*": _quota(text)}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("a JSON object of namespace to quota")
    return {str(k): _quota(str(v)) for k, v in data.items()}


def _quota(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"a quota is at least 1 window, got {value}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise ValueError(f"a whole number of at least 1, got {value}")
    return value


def _flag(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"give true or false, got {text!r}")


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.replace(",", " ").split() if n)


def _rate(text: str) -> float:
    value = float(text)
    if not (0 < value <= 100_000):
        raise ValueError(f"a rate per second above 0, got {text}")
    return value


def _auth_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in AUTH_MODES:
        raise ValueError(f"one of {', '.join(AUTH_MODES)}, got {text!r}")
    return mode


K8S_MODES = ("endpoint", "observer", "poll")
"""How the runner meets Kubeflow Trainer's status (docs/kubernetes.md): pods post to stepwatch and the runner
writes ``status.trainerStatus`` (endpoint), or pods post to upstream's own status server and the runner
only reads what it wrote (observer), or, as observer, and the runner polls the pods of TrainJobs annotated
for OpenShift AI's progression tracking as Red Hat's controller does (poll)."""


def _k8s_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in K8S_MODES:
        raise ValueError(f"one of {', '.join(K8S_MODES)}, got {text!r}")
    return mode


def _header(text: str) -> str:
    name = text.strip()
    if not name or not all(c.isalnum() or c == "-" for c in name):
        raise ValueError(f"an HTTP header name (letters, digits and '-'), got {text!r}")
    return name


SERVER_SETTINGS: tuple[_Setting, ...] = (
    _Setting("host", "STEPWATCH_SERVER_HOST", "127.0.0.1", str, "address to listen on (loopback by default)"),
    _Setting("port", "STEPWATCH_SERVER_PORT", 8642, _port, "port to listen on"),
    _Setting("db", "STEPWATCH_DB", None, str, "SQLite file (default: stepwatch.db in the data directory)"),
    _Setting(
        "database_url",
        "STEPWATCH_DATABASE_URL",
        None,
        str,
        "database URL: sqlite:///PATH, or postgresql://USER@HOST/DB for PostgreSQL (several replicas can share it)",
    ),
    _Setting(
        "policy",
        "STEPWATCH_POLICY",
        Policy(),
        _policy,
        'the server\'s policy layer, JSON (for example \'{"on": {"diverging": "notify"}}\'); '
        "namespaces and jobs lay theirs over it",
    ),
    _Setting(
        "gpu_prices",
        "STEPWATCH_GPU_PRICES",
        None,
        _prices,
        "default price of a GPU hour by GPU type, for jobs registered without one: a100=2.5,h100=4.1 (* for any)",
    ),
    _Setting(
        "namespace_prices",
        "STEPWATCH_NAMESPACE_PRICES",
        None,
        _prices,
        "default price of a GPU hour by namespace (or namespace/gpu-type), over the GPU-type prices: nlp=3.0",
    ),
    _Setting(
        "notify",
        "STEPWATCH_NOTIFY",
        None,
        str,
        "notification targets: URLs separated by commas or spaces; http(s) URLs are signed webhooks, others go "
        "through Apprise (pip install 'stepwatch[notify]')",
    ),
    _Setting(
        "notify_secret",
        "STEPWATCH_NOTIFY_SECRET",
        None,
        str,
        "shared secret that signs webhooks (HMAC-SHA256 in X-Stepwatch-Signature)",
    ),
    _Setting(
        "public_url",
        "STEPWATCH_PUBLIC_URL",
        None,
        str,
        "the dashboard's address as people reach it, for links in notifications",
    ),
    _Setting(
        "health",
        "STEPWATCH_HEALTH",
        None,
        _health,
        "health analysis knobs over their defaults, JSON (for example '{\"plateau_min_s\": 60}'; see docs/health.md)",
    ),
    _Setting(
        "health_sweep_s",
        "STEPWATCH_HEALTH_SWEEP_S",
        5.0,
        _seconds,
        "how often live jobs are judged again without a report (a stall shows within this much)",
    ),
    _Setting(
        "retention_days",
        "STEPWATCH_RETENTION_DAYS",
        None,
        _days,
        "raw windows older than this many days are compacted into roll-ups that keep min, max and last "
        "(default: keep every window; see docs/retention.md)",
    ),
    _Setting(
        "quota_points",
        "STEPWATCH_QUOTA_POINTS",
        None,
        _quotas,
        "raw windows a namespace keeps before its oldest are compacted: a number for each namespace, or JSON "
        '{"nlp": 50000000, "*": 10000000} (default: no quota; ingest is never refused for it)',
    ),
    _Setting(
        "retention_sweep_s",
        "STEPWATCH_RETENTION_SWEEP_S",
        600.0,
        _seconds,
        "how often retention and quotas are applied (each pass deletes at most 20,000 rows, then yields)",
    ),
    _Setting(
        "head_timeout_s",
        "STEPWATCH_HEAD_TIMEOUT_S",
        10.0,
        _seconds,
        "a client has this long from connecting (or from a request's first byte) to send the request line and "
        "headers; then the connection is closed (slow clients, see docs/reliability.md)",
    ),
    _Setting(
        "body_timeout_s",
        "STEPWATCH_BODY_TIMEOUT_S",
        30.0,
        _seconds,
        "a request body (at most 64 KiB) must arrive within this long, else 408 and the connection is closed",
    ),
    # limits on what one client can grow (docs/auth.md, "Limits")
    _Setting(
        "max_metric_names",
        "STEPWATCH_MAX_METRIC_NAMES",
        1024,
        _count,
        "distinct metric names one job may have; a report that would add more is refused whole (422)",
    ),
    _Setting(
        "live_streams_per_client",
        "STEPWATCH_LIVE_STREAMS_PER_CLIENT",
        32,
        _count,
        "live streams (GET /api/v1/events) open at once per token, user or, without auth, client address "
        "(beyond: 429 with Retry-After)",
    ),
    _Setting(
        "live_streams",
        "STEPWATCH_LIVE_STREAMS",
        512,
        _count,
        "live streams open at once in all, per server process (beyond: 429 with Retry-After)",
    ),
    _Setting(
        "live_ring_bytes",
        "STEPWATCH_LIVE_RING_BYTES",
        8 * 1024 * 1024,
        _count,
        "bytes of recent live updates kept for clients that reconnect with Last-Event-ID",
    ),
    _Setting(
        "write_linger_ms",
        "STEPWATCH_WRITE_LINGER_MS",
        2.0,
        _linger_ms,
        "how long a batch of reports waits for more before it is written, while reports arrive at most 5x this "
        "apart (group commit at a fleet's pace: fewer commits, a little more latency; 0: never waits); on "
        "PostgreSQL under load a batch waits up to 4x this for 16 reports",
    ),
    _Setting(
        "k8s_runner",
        "STEPWATCH_K8S_RUNNER",
        False,
        _flag,
        "watch Kubeflow TrainJobs and keep them and stepwatch in step (pip install 'stepwatch[k8s]'; in a cluster "
        "through its ServiceAccount, else the kubeconfig); run it in one replica (see docs/kubernetes.md)",
    ),
    _Setting(
        "k8s_mode",
        "STEPWATCH_K8S_MODE",
        "endpoint",
        _k8s_mode,
        "endpoint (pods post their status to stepwatch, upstream's TrainJobStatus gate off; the runner writes "
        "status.trainerStatus), observer (pods post to upstream's status server; the runner turns each change "
        "of status.trainerStatus into history and never writes it) or poll (as observer, and the runner polls "
        "the pods of TrainJobs annotated trainer.opendatahub.io/progression-tracking=true as OpenShift AI's "
        "controller does, writing its annotation); see docs/kubernetes.md",
    ),
    _Setting(
        "k8s_network_policy",
        "STEPWATCH_K8S_NETWORK_POLICY",
        False,
        _flag,
        "poll mode: give the pods of each tracked TrainJob OpenShift AI's NetworkPolicy (its own pods on every "
        "port, the runner on the metrics port), for namespaces that deny ingress by default; it closes the pods "
        "to everything else (see docs/kubernetes.md)",
    ),
    _Setting(
        "k8s_namespaces",
        "STEPWATCH_K8S_NAMESPACES",
        (),
        _names,
        "namespaces whose TrainJobs the runner watches (comma-separated; empty: every namespace)",
    ),
    _Setting(
        "k8s_grace_s",
        "STEPWATCH_K8S_GRACE_S",
        300.0,
        _seconds,
        "after a stop, how long a TrainJob that reports has to checkpoint and stop by itself before it is suspended",
    ),
    _Setting(
        "k8s_delete_on_stop",
        "STEPWATCH_K8S_DELETE_ON_STOP",
        False,
        _flag,
        "delete a stopped TrainJob instead of suspending it (spec.suspend: true)",
    ),
    _Setting(
        "k8s_status_interval_s",
        "STEPWATCH_K8S_STATUS_INTERVAL_S",
        5.0,
        _seconds,
        "at most one status write per TrainJob in this many seconds",
    ),
    _Setting(
        "k8s_writes_per_s",
        "STEPWATCH_K8S_WRITES_PER_S",
        20.0,
        _rate,
        "API server writes per second by the runner, all TrainJobs together",
    ),
    _Setting(
        "k8s_pod_tokens",
        "STEPWATCH_K8S_POD_TOKENS",
        False,
        _flag,
        "accept projected ServiceAccount tokens of TrainJob pods at the Kubeflow status endpoint (TokenReview, "
        "pod ownership, rate limits); job tokens keep working",
    ),
    _Setting(
        "k8s_audience",
        "STEPWATCH_K8S_AUDIENCE",
        "trainer.kubeflow.org",
        str,
        "an audience pod tokens may be issued for, valid for any TrainJob of the token's namespace (KEP-2779's "
        "text by default); the one Kubeflow Trainer projects, trainer.kubeflow.org/v1alpha1/namespaces/NS/"
        "trainjobs/NAME/status, is always accepted for that TrainJob",
    ),
    _Setting(
        "k8s_job_rate",
        "STEPWATCH_K8S_JOB_RATE",
        2.0,
        _rate,
        "status posts a second one TrainJob may send with pod tokens (bursts of 10x; beyond: 429 with Retry-After)",
    ),
    _Setting(
        "k8s_account_rate",
        "STEPWATCH_K8S_ACCOUNT_RATE",
        20.0,
        _rate,
        "status posts a second one ServiceAccount may send with pod tokens (bursts of 5x; beyond: 429)",
    ),
    _Setting(
        "kubeconfig",
        "STEPWATCH_KUBECONFIG",
        None,
        str,
        "kubeconfig file for the runner and the token checks outside a cluster (default: in-cluster, else "
        "$KUBECONFIG, else ~/.kube/config)",
    ),
    _Setting("tls_certfile", "STEPWATCH_TLS_CERTFILE", None, str, "serve HTTPS with this certificate (PEM)"),
    _Setting("tls_keyfile", "STEPWATCH_TLS_KEYFILE", None, str, "the certificate's private key (PEM)"),
    _Setting(
        "auth",
        "STEPWATCH_AUTH",
        "none",
        _auth_mode,
        "who may do what: none (everyone is an admin: loopback only), tokens (API tokens: stepwatch token create), "
        "proxy (tokens, and identity headers from a trusted authenticating proxy); see docs/auth.md",
    ),
    _Setting(
        "insecure",
        "STEPWATCH_INSECURE",
        False,
        _flag,
        "allow auth none on an address other than loopback (anyone who reaches the server can stop any job)",
    ),
    _Setting(
        "allowed_hosts",
        "STEPWATCH_ALLOWED_HOSTS",
        (),
        _names,
        "with auth none: names the Host header may carry besides localhost, loopback addresses and the address "
        "listened on (comma-separated; * for any); other names get 403 (DNS rebinding, see docs/auth.md)",
    ),
    _Setting(
        "allowed_origins",
        "STEPWATCH_ALLOWED_ORIGINS",
        (),
        _names,
        "with auth none or proxy: origins (http://host:port) besides the server's own from which a browser may "
        "send requests that change something (comma-separated; * for any)",
    ),
    _Setting(
        "notify_allow",
        "STEPWATCH_NOTIFY_ALLOW",
        (),
        parse_allow_list,
        "hosts and networks (CIDR) that policies' notification targets may reach although they are loopback, "
        "private or link-local (comma-separated; the server's own STEPWATCH_NOTIFY targets need no entry)",
    ),
    _Setting(
        "trusted_proxies",
        "STEPWATCH_TRUSTED_PROXIES",
        (),
        parse_cidrs,
        "with auth proxy: the addresses or networks (CIDR) of the authenticating proxy; identity headers from any "
        "other peer are ignored",
    ),
    _Setting(
        "proxy_user_header",
        "STEPWATCH_PROXY_USER_HEADER",
        "X-Forwarded-User",
        _header,
        "with auth proxy: the header that names the user",
    ),
    _Setting(
        "proxy_groups_header",
        "STEPWATCH_PROXY_GROUPS_HEADER",
        "X-Forwarded-Groups",
        _header,
        "with auth proxy: the header that lists the user's groups (comma-separated)",
    ),
    _Setting(
        "proxy_groups",
        "STEPWATCH_PROXY_GROUPS",
        None,
        parse_group_roles,
        'with auth proxy: groups (or user:NAME) to a role over namespaces, JSON: {"ml-team": "editor:nlp,vision", '
        '"platform": "admin:*"}',
    ),
)


@dataclass(frozen=True)
class ServerSettings:
    """The resolved settings of one server."""

    host: str = "127.0.0.1"
    port: int = 8642
    db: str | None = None
    database_url: str | None = None
    health_sweep_s: float = 5.0
    health: dict[str, Any] | None = None
    retention_days: float | None = None
    quota_points: dict[str, int] | None = None
    retention_sweep_s: float = 600.0
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_metric_names: int = 1024
    live_streams_per_client: int = 32
    live_streams: int = 512
    live_ring_bytes: int = 8 * 1024 * 1024
    write_linger_ms: float = 2.0
    gpu_prices: dict[str, float] | None = None
    namespace_prices: dict[str, float] | None = None
    notify: str | None = None
    notify_secret: str | None = field(default=None, repr=False)
    public_url: str | None = None
    policy: Policy = field(default_factory=Policy)
    k8s_runner: bool = False
    k8s_mode: str = "endpoint"
    k8s_network_policy: bool = False
    k8s_namespaces: tuple[str, ...] = ()
    k8s_grace_s: float = 300.0
    k8s_delete_on_stop: bool = False
    k8s_status_interval_s: float = 5.0
    k8s_writes_per_s: float = 20.0
    k8s_pod_tokens: bool = False
    k8s_audience: str = "trainer.kubeflow.org"
    k8s_job_rate: float = 2.0
    k8s_account_rate: float = 20.0
    kubeconfig: str | None = None
    tls_certfile: str | None = None
    tls_keyfile: str | None = None
    auth: str = "none"
    insecure: bool = False
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    notify_allow: tuple[str, ...] = ()
    trusted_proxies: tuple[Any, ...] = ()
    proxy_user_header: str = "X-Forwarded-User"
    proxy_groups_header: str = "X-Forwarded-Groups"
    proxy_groups: dict[str, Grant] | None = None

    @classmethod
    def resolve(cls, arguments: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> ServerSettings:
        """Arguments, then environment variables, then defaults; ``ValueError`` names the culprit."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for setting in SERVER_SETTINGS:
            given = arguments.get(setting.name)
            if given is not None:
                values[setting.name] = given
            elif env.get(setting.env):
                try:
                    values[setting.name] = setting.parse(env[setting.env])
                except ValueError as exc:
                    raise ValueError(f"{setting.env}: {exc}") from None
            else:
                values[setting.name] = setting.default
        return cls(**values)

    def authenticator(self) -> Authenticator:
        """Who requests come from, under the ``auth`` mode."""
        return Authenticator(
            self.auth, tuple(self.trusted_proxies), self.proxy_user_header, self.proxy_groups_header,
            dict(self.proxy_groups or {}),
        )  # fmt: skip

    def guard_rules(self) -> GuardRules:
        """What the guard in front of every route checks (Host, Origin, JSON: see :mod:`.api.guard`)."""
        return GuardRules.for_server(self.auth, self.host, self.allowed_hosts, self.allowed_origins)

    def target_rules(self) -> TargetRules:
        """Where policies' notification targets may point (see :mod:`.notify`)."""
        trusted = [*_names(self.notify or ""), *self.policy.notify]
        return TargetRules(self.notify_allow, frozenset(trusted))

    def auth_problem(self) -> str | None:
        """Why the server must not start with these access settings, in words; ``None`` when it may."""
        if self.auth == "none" and not self.insecure and not is_loopback(self.host):
            return (
                f"{self.host} is reachable from other machines and auth is none (anyone could stop any job): "
                "turn authentication on (--auth tokens, see docs/auth.md), or say --insecure (STEPWATCH_INSECURE=1)"
            )
        if self.auth == "proxy" and not self.trusted_proxies:
            return "auth proxy needs the proxy's address: set STEPWATCH_TRUSTED_PROXIES (for example 10.0.0.0/8)"
        return None

    def health_params(self) -> HealthParams:
        """The health analysis knobs: the defaults with what ``STEPWATCH_HEALTH`` changes."""
        return HealthParams(**(self.health or {}))

    def price_list(self) -> PriceList:
        """The default prices of a GPU hour (by GPU type and namespace)."""
        return PriceList(dict(self.gpu_prices or {}), dict(self.namespace_prices or {}))

    def postgres_url(self) -> str | None:
        """The PostgreSQL URL this server stores in, when ``database_url`` names one."""
        url = self.database_url or ""
        return url if url.startswith(("postgresql://", "postgres://")) else None

    def database_shown(self) -> str:
        """Where this server stores, to show: the SQLite file, or the PostgreSQL URL without its password."""
        url = self.postgres_url()
        if url is None:
            return self.database_path()
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))

    def database_path(self, environ: Mapping[str, str] | None = None) -> str:
        """The SQLite file this server uses (a PostgreSQL URL has none: see :meth:`postgres_url`)."""
        if self.database_url:
            if not self.database_url.startswith("sqlite:///"):
                raise ValueError(
                    f"unsupported database URL {self.database_url!r}: this server stores in SQLite "
                    "(sqlite:///PATH) or PostgreSQL (postgresql://USER@HOST/DB)"
                )
            return self.database_url.removeprefix("sqlite:///") or ":memory:"
        if self.db:
            return self.db
        return str(default_data_dir(environ) / "stepwatch.db")
