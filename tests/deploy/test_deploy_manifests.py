"""deploy/: the Kubernetes manifests and the image recipe, checked offline.

There is no Kubernetes API server (nor a container engine) on these machines, so the checks are:
- every object of the base and of each overlay is valid against the Kubernetes OpenAPI schemas
  (``kubernetes-validate`` ships them; strict: an unknown field fails), for the oldest and a recent
  Kubernetes release we support;
- the kustomizations are rendered by a small renderer below (the few kustomize features deploy/ uses:
  resources, images, JSON 6902 patches) and, where ``kubectl`` is installed, the result is compared with
  ``kubectl kustomize``, so the renderer cannot drift from the real thing;
- what the schemas cannot see: RBAC grants exactly the API calls the Kubernetes code makes, selectors
  match the pods, probes reach real routes, environment variables are real settings, the Secret key is
  the one the docs create, and the image's command is the manifests' command;
- the containers as written (command, arguments, environment) start a real server on a real PostgreSQL
  that answers its probes (in test_deploy_server.py).
"""

from __future__ import annotations

import ast
import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")
if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBE_CODE = ROOT / "src" / "stepwatch" / "server" / "runners" / "kubernetes"
KUSTOMIZATIONS = [
    "base",
    "overlays/delete-on-stop",
    "overlays/observer",
    "overlays/poll",
    "overlays/poll-network-policy",
    "overlays/tls",
]
POLL_OVERLAYS = ("overlays/poll", "overlays/poll-network-policy")
KUBERNETES_RELEASES = ["1.29.0", "1.35.0"]  # Kubeflow Trainer v2 needs 1.29 or newer


# ------------------------------------------------------------------------------- a small kustomize


_SUPPORTED = {"apiVersion", "kind", "resources", "images", "patches"}


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects of a kustomization, as ``kubectl kustomize`` makes them for the features deploy/ uses."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - _SUPPORTED
    assert not unknown, f"{directory}: the test's renderer does not know {sorted(unknown)}; teach it"
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            objects += render(path)
        else:
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for image in kustomization.get("images", []):
        for obj in objects:
            for container in _containers(obj):
                if container["image"].split(":")[0] == image["name"]:
                    container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    for patch in kustomization.get("patches", []):
        target = patch["target"]
        matched = [obj for obj in objects if _targets(target, obj)]
        assert len(matched) == 1, f"patch target {target} matches {len(matched)} objects"
        for op in yaml.safe_load(patch["patch"]):
            _json_patch(matched[0], op)
    return objects


def _targets(target: dict[str, str], obj: dict[str, Any]) -> bool:
    group = obj["apiVersion"].rpartition("/")[0]
    return (
        target.get("kind", obj["kind"]) == obj["kind"]
        and target.get("name", obj["metadata"]["name"]) == obj["metadata"]["name"]
        and target.get("group", group) == group
    )


def _json_patch(obj: dict[str, Any], op: dict[str, Any]) -> None:
    """RFC 6902 ``add`` and ``replace`` (what deploy/ uses)."""
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    value = copy.deepcopy(op["value"])
    if op["op"] == "add" and isinstance(node, list):
        node.insert(len(node) if last == "-" else int(last), value)
    elif op["op"] in ("add", "replace"):
        if op["op"] == "replace":
            assert last in node, op
        node[int(last) if isinstance(node, list) else last] = value
    else:
        raise AssertionError(f"the test's renderer does not do {op['op']!r}")


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    found: list[dict[str, Any]] = spec.get("containers", []) + spec.get("initContainers", [])
    return found


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


@pytest.fixture(scope="module", params=KUSTOMIZATIONS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, dict[tuple[str, str, str], dict[str, Any]]]:
    objects = render(DEPLOY / request.param)
    by_key = {_key(obj): obj for obj in objects}
    assert len(by_key) == len(objects), "two objects with the same kind, namespace and name"
    return request.param, by_key


def _one(objects: dict[tuple[str, str, str], dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [obj for (k, _, n), obj in objects.items() if (k, n) == (kind, name)]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# ----------------------------------------------------------------------------------- the schemas


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: the renderer stands alone")
@pytest.mark.parametrize("where", KUSTOMIZATIONS)
def test_the_renderer_agrees_with_kubectl_kustomize(where: str) -> None:
    done = subprocess.run(["kubectl", "kustomize", str(DEPLOY / where)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    real = {_key(obj): obj for obj in yaml.safe_load_all(done.stdout) if obj}
    ours = {_key(obj): obj for obj in render(DEPLOY / where)}
    assert real.keys() == ours.keys()
    for key, obj in real.items():
        assert json.loads(json.dumps(ours[key])) == obj, key


@pytest.mark.parametrize("release", KUBERNETES_RELEASES)
def test_every_object_is_valid_against_the_kubernetes_schemas(
    rendered: tuple[str, dict[tuple[str, str, str], dict[str, Any]]], release: str
) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    _, objects = rendered
    kinds = {kind for kind, _, _ in objects}
    assert {"Deployment", "StatefulSet", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= kinds
    assert {"NetworkPolicy", "PodDisruptionBudget", "Namespace"} <= kinds
    for key, obj in objects.items():
        try:
            kubernetes_validate.validate(obj, release, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{key} is not a valid object for Kubernetes {release}: {exc.message} at {list(exc.path)}")


def test_the_validator_catches_a_wrong_field() -> None:
    """The schema check is not vacuous: a misspelt or mistyped field fails it."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = copy.deepcopy(_one({_key(o): o for o in render(DEPLOY / "base")}, "Deployment", "stepwatch-server"))
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "8642"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_RELEASES[-1], strict=True)
    deployment = copy.deepcopy(_one({_key(o): o for o in render(DEPLOY / "base")}, "Deployment", "stepwatch-server"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_RELEASES[-1], strict=True)


# ------------------------------------------------------------------------------------------ RBAC

Grant = tuple[str, str, str]
"""(API group, resource or non-resource URL, verb)."""

# The resources each public method of KubeApi touches; the verbs are read from the code (the client
# methods it calls), so only the resource names are written here. A new method fails the test below.
_RESOURCES: dict[str, list[tuple[str, str]]] = {
    "list_trainjobs": [("trainer.kubeflow.org", "trainjobs")],
    "watch_trainjobs": [("trainer.kubeflow.org", "trainjobs")],
    "get_trainjob": [("trainer.kubeflow.org", "trainjobs")],
    "get_runtime": [("trainer.kubeflow.org", "trainingruntimes"), ("trainer.kubeflow.org", "clustertrainingruntimes")],
    "apply_trainer_status": [("trainer.kubeflow.org", "trainjobs/status")],
    "apply_annotation": [("trainer.kubeflow.org", "trainjobs")],
    "suspend": [("trainer.kubeflow.org", "trainjobs")],
    "delete": [("trainer.kubeflow.org", "trainjobs")],
    "token_review": [("authentication.k8s.io", "tokenreviews")],
    "get_pod": [("", "pods")],
    "list_pods": [("", "pods")],
    "get_network_policy": [("networking.k8s.io", "networkpolicies")],
    "create_network_policy": [("networking.k8s.io", "networkpolicies")],
    "replace_network_policy": [("networking.k8s.io", "networkpolicies")],
    "jwks": [("", "/openid/v1/jwks")],
}
_VERB_OF_PREFIX = {
    "list": "list",
    "get": "get",
    "read": "get",
    "patch": "patch",
    "delete": "delete",
    "create": "create",
    "replace": "update",
}


def _kube_api_methods() -> dict[str, ast.FunctionDef]:
    tree = ast.parse((KUBE_CODE / "api.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KubeApi")
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _verbs(method: ast.FunctionDef, methods: dict[str, ast.FunctionDef]) -> set[str]:
    """The verbs a KubeApi method uses: from the client calls it makes (``self.custom.list_...``), the
    watch it starts, and the HTTP method of a raw ``call_api`` (also through ``self._apply``)."""
    verbs: set[str] = set()
    for node in ast.walk(method):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            owner = node.value
            if (
                isinstance(owner.value, ast.Name)
                and owner.value.id == "self"
                and owner.attr in ("custom", "core", "auth", "networking")
            ):
                verbs.add(_VERB_OF_PREFIX[node.attr.split("_")[0]])
        if isinstance(node, ast.Attribute) and node.attr == "Watch":
            verbs.add("watch")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "call_api" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                verbs.add(str(node.args[1].value).lower())
            if node.func.attr.startswith("_") and node.func.attr in methods and node.func.attr != "_call":
                verbs |= _verbs(methods[node.func.attr], methods)
    return verbs


def _grants_of(method: str) -> set[Grant]:
    methods = _kube_api_methods()
    verbs = _verbs(methods[method], methods)
    if method == "watch_trainjobs":
        verbs.discard("list")  # a watch is a list call with watch=true: RBAC asks for the watch verb
    assert verbs, f"KubeApi.{method}: no API call found"
    return {(group, resource, verb) for group, resource in _RESOURCES[method] for verb in verbs}


def test_only_the_runner_and_the_token_checks_call_the_api() -> None:
    """So that the two roles below cover every call (api.py makes them, wiring.py only connects)."""
    src = ROOT / "src" / "stepwatch"
    users = {
        p.relative_to(KUBE_CODE).as_posix()
        for p in src.rglob("*.py")
        if re.search(r"\bKubeApi\b|\bload_api\b", p.read_text()) and p.parent == KUBE_CODE
    }
    elsewhere = [p for p in src.rglob("*.py") if p.parent != KUBE_CODE and re.search(r"\bKubeApi\b", p.read_text())]
    assert users == {"api.py", "runner.py", "polling.py", "tokens.py", "wiring.py"}
    assert not elsewhere


def _used_by(module: str) -> set[str]:
    """The KubeApi methods a module calls (``self.api.NAME``)."""
    text = (KUBE_CODE / module).read_text()
    return set(re.findall(r"\bself\.api\.(\w+)\b", text)) & set(_kube_api_methods())


def _granted(role: dict[str, Any]) -> set[Grant]:
    grants: set[Grant] = set()
    for rule in role["rules"]:
        for verb in rule["verbs"]:
            for url in rule.get("nonResourceURLs", []):
                grants.add(("", url, verb))
            for group in rule.get("apiGroups", []):
                grants |= {(group, resource, verb) for resource in rule["resources"]}
    return grants


def test_every_kube_api_method_has_its_resources_written_here() -> None:
    public = {name for name in _kube_api_methods() if not name.startswith("_")}
    assert public == set(_RESOURCES), "a KubeApi method was added or removed: say which resources it touches"


def test_rbac_grants_exactly_the_calls_each_part_makes(
    rendered: tuple[str, dict[tuple[str, str, str], dict[str, Any]]],
) -> None:
    where, objects = rendered
    runner_calls = _used_by("runner.py") | _used_by("polling.py")  # (polling.py: the runner's poll mode)
    token_calls = _used_by("tokens.py")
    assert {"list_trainjobs", "watch_trainjobs", "apply_trainer_status", "suspend", "list_pods"} <= runner_calls
    assert {"token_review", "get_pod", "jwks"} <= token_calls

    runner_needs = set().union(*(_grants_of(m) for m in runner_calls))
    if where != "overlays/delete-on-stop":  # deleting is off unless configured, and so is its right
        runner_needs -= _grants_of("delete")
    if where not in POLL_OVERLAYS:  # only poll mode reads pods
        runner_needs -= _grants_of("list_pods")
    if where != "overlays/poll-network-policy":  # NetworkPolicies only with their switch
        policies = ("get_network_policy", "create_network_policy", "replace_network_policy")
        runner_needs -= set().union(*(_grants_of(m) for m in policies))
    assert _granted(_one(objects, "ClusterRole", "stepwatch-runner")) == runner_needs
    tokens_need = set().union(*(_grants_of(m) for m in token_calls))
    assert _granted(_one(objects, "ClusterRole", "stepwatch-pod-tokens")) == tokens_need

    # each role is bound to the ServiceAccount of the one workload that turns that part on
    runner = _one(objects, "StatefulSet", "stepwatch-runner")
    server = _one(objects, "Deployment", "stepwatch-server")
    for binding_name, workload, switch in (
        ("stepwatch-runner", runner, "STEPWATCH_K8S_RUNNER"),
        ("stepwatch-pod-tokens", server, "STEPWATCH_K8S_POD_TOKENS"),
    ):
        binding = _one(objects, "ClusterRoleBinding", binding_name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": binding_name,
        }
        pod = workload["spec"]["template"]["spec"]
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": pod["serviceAccountName"],
                "namespace": workload["metadata"]["namespace"],
            }
        ]
        assert _one(objects, "ServiceAccount", pod["serviceAccountName"])
        assert _env(pod["containers"][0])[switch] == "true"
    assert _env(server["spec"]["template"]["spec"]["containers"][0])["STEPWATCH_K8S_RUNNER"] == "false"
    assert _env(runner["spec"]["template"]["spec"]["containers"][0])["STEPWATCH_K8S_POD_TOKENS"] == "false"
    # no other role, and nothing namespaced that would widen these
    assert {n for k, _, n in objects if k in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")} == {
        "stepwatch-runner",
        "stepwatch-pod-tokens",
    }


def test_poll_overlays_switch_poll_mode_on_and_let_the_runner_reach_the_pods(
    rendered: tuple[str, dict[tuple[str, str, str], dict[str, Any]]],
) -> None:
    """Poll mode's runner reaches the pods' metrics port (its egress), and the NetworkPolicy it makes for the
    pods admits it: the labels and namespace it names are the runner's (src/.../networkpolicy.py)."""
    pytest.importorskip("kubernetes")
    from stepwatch.protocol.progression import DEFAULT_METRICS_PORT
    from stepwatch.server.runners.kubernetes.networkpolicy import RUNNER_LABELS, RUNNER_NAMESPACE

    where, objects = rendered
    runner = _one(objects, "StatefulSet", "stepwatch-runner")
    env = _env(runner["spec"]["template"]["spec"]["containers"][0])
    assert runner["spec"]["template"]["metadata"]["labels"] == RUNNER_LABELS
    assert runner["metadata"]["namespace"] == RUNNER_NAMESPACE
    egress = [o for (k, _, n), o in objects.items() if k == "NetworkPolicy" and n == "stepwatch-runner-poll"]
    if where not in POLL_OVERLAYS:
        assert env.get("STEPWATCH_K8S_MODE", "endpoint") != "poll" and not egress
        assert "STEPWATCH_K8S_NETWORK_POLICY" not in env
        return
    assert env["STEPWATCH_K8S_MODE"] == "poll"
    assert env.get("STEPWATCH_K8S_NETWORK_POLICY", "false") == ("true" if where.endswith("network-policy") else "false")
    [policy] = egress
    assert RUNNER_LABELS.items() <= policy["spec"]["podSelector"]["matchLabels"].items()
    assert policy["spec"]["policyTypes"] == ["Egress"]
    ports = {(p["protocol"], p["port"]) for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert ports == {("TCP", DEFAULT_METRICS_PORT)}
    assert all(peer == {"namespaceSelector": {}} for rule in policy["spec"]["egress"] for peer in rule["to"])


# ---------------------------------------------------------------------------------- the workloads


def test_one_runner_and_several_servers(rendered: tuple[str, dict[tuple[str, str, str], dict[str, Any]]]) -> None:
    _, objects = rendered
    server = _one(objects, "Deployment", "stepwatch-server")
    runner = _one(objects, "StatefulSet", "stepwatch-runner")
    assert server["spec"]["replicas"] >= 2
    assert runner["spec"]["replicas"] == 1
    # only the StatefulSet runs the TrainJob runner
    for kind, _, name in objects:
        if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"):
            workload = objects[(kind, _, name)]
            on = any(_env(c).get("STEPWATCH_K8S_RUNNER") == "true" for c in _containers(workload))
            assert on == (workload is runner), f"{kind}/{name}"


def test_selectors_services_and_budgets_match_the_pods(
    rendered: tuple[str, dict[tuple[str, str, str], dict[str, Any]]],
) -> None:
    _, objects = rendered
    workloads = [o for (k, _, _), o in objects.items() if k in ("Deployment", "StatefulSet")]
    assert len(workloads) == 2

    def selected(selector: dict[str, str]) -> list[dict[str, Any]]:
        return [w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]

    for w in workloads:
        assert selected(w["spec"]["selector"]["matchLabels"]) == [w]  # its own pods, and only those
        assert w["metadata"]["namespace"] == "stepwatch"
    server = _one(objects, "Deployment", "stepwatch-server")
    runner = _one(objects, "StatefulSet", "stepwatch-runner")

    service = _one(objects, "Service", "stepwatch")
    assert selected(service["spec"]["selector"]) == [server]  # the runner takes no traffic
    headless = _one(objects, "Service", runner["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert selected(headless["spec"]["selector"]) == [runner]
    pdb = _one(objects, "PodDisruptionBudget", "stepwatch-server")
    assert selected(pdb["spec"]["selector"]["matchLabels"]) == [server]
    assert pdb["spec"]["minAvailable"] < server["spec"]["replicas"]  # a node can still be drained
    policy = _one(objects, "NetworkPolicy", "stepwatch")
    assert selected(policy["spec"]["podSelector"]["matchLabels"]) == workloads

    for svc, workload in ((service, server), (headless, runner)):
        ports = {p["name"]: p["containerPort"] for p in workload["spec"]["template"]["spec"]["containers"][0]["ports"]}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports
            allowed = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
            assert ports[port["targetPort"]] in allowed


def test_pods_run_without_privileges_on_a_read_only_root(
    rendered: tuple[str, dict[tuple[str, str, str], dict[str, Any]]],
) -> None:
    _, objects = rendered
    for kind in ("Deployment", "StatefulSet"):
        for (k, _, name), workload in objects.items():
            if k != kind:
                continue
            pod = workload["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert pod["securityContext"]["runAsUser"] > 0
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            for container in pod["containers"]:
                context = container["securityContext"]
                assert context["readOnlyRootFilesystem"] is True, name
                assert context["allowPrivilegeEscalation"] is False
                assert context["capabilities"]["drop"] == ["ALL"]
                assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
                assert "memory" in container["resources"]["limits"]
                # the only writable place is the /tmp volume, where HOME and STEPWATCH_HOME point
                mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
                assert "tmp" in {m["name"] for m in mounts.values() if m["mountPath"] == "/tmp"}
                env = _env(container)
                assert env["HOME"] == "/tmp"
                assert env["STEPWATCH_HOME"].startswith("/tmp/")


def test_environment_variables_are_real_settings_with_valid_values(
    rendered: tuple[str, dict[tuple[str, str, str], dict[str, Any]]],
) -> None:
    pytest.importorskip("starlette")
    from stepwatch.server.settings import SERVER_SETTINGS

    settings = {s.env: s for s in SERVER_SETTINGS}
    _, objects = rendered
    for obj in objects.values():
        for container in _containers(obj):
            for name, value in _env(container).items():
                if name in ("HOME", "STEPWATCH_HOME"):
                    continue
                assert name in settings, f"{name} is not a server setting"
                if isinstance(value, str) and value:
                    settings[name].parse(value)  # raises on a value the server would refuse


def test_the_database_url_comes_from_the_secret_the_docs_create(
    rendered: tuple[str, dict[tuple[str, str, str], dict[str, Any]]],
) -> None:
    _, objects = rendered
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for kind, name in (("Deployment", "stepwatch-server"), ("StatefulSet", "stepwatch-runner")):
        container = _one(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]
        ref = _env(container)["STEPWATCH_DATABASE_URL"]["secretKeyRef"]
        command = f"kubectl create secret generic {ref['name']} -n stepwatch --from-literal={ref['key']}="
        assert command in docs, f"docs/deploy.md should say `{command}...`"
        assert not ref.get("optional"), "without a database the replicas would each keep their own SQLite"


def test_probes_reach_real_routes(
    rendered: tuple[str, dict[tuple[str, str, str], dict[str, Any]]], tmp_path: Path
) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("httpx")
    from starlette.testclient import TestClient

    from stepwatch.server import ServerSettings, create_app

    _, objects = rendered
    paths = set()
    for kind in ("Deployment", "StatefulSet"):
        for (k, _, _), workload in objects.items():
            if k == kind:
                for container in workload["spec"]["template"]["spec"]["containers"]:
                    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                        get = container[probe]["httpGet"]
                        assert get["port"] in {p["name"] for p in container["ports"]}
                        paths.add(get["path"])
    assert paths
    with TestClient(create_app(ServerSettings(db=str(tmp_path / "sw.db"), allowed_hosts=("testserver",)))) as client:
        for path in paths:
            answer = client.get(path)
            assert answer.status_code == 200, path
            assert answer.json()["status"] == "ok"


# ------------------------------------------------------------------------------------ the image


def _instructions(text: str) -> Iterator[tuple[str, str]]:
    """The Containerfile's instructions (continuation lines joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            yield word.upper(), rest.strip()


def test_the_image_runs_what_the_manifests_run() -> None:
    from stepwatch.cli import build_parser

    recipe = list(_instructions((DEPLOY / "Containerfile").read_text()))
    stages = [rest for word, rest in recipe if word == "FROM"]
    assert len(stages) == 2 and " AS " in stages[0].upper(), "a multi-stage build"
    last = recipe[max(i for i, (word, _) in enumerate(recipe) if word == "FROM") :]
    entrypoint = json.loads(next(rest for word, rest in last if word == "ENTRYPOINT"))
    cmd = json.loads(next(rest for word, rest in last if word == "CMD"))
    user = next(rest for word, rest in last if word == "USER")
    assert int(user.split(":")[0]) != 0

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert entrypoint[0] in project["scripts"]
    install = next(rest for word, rest in recipe if word == "RUN" and "pip install" in rest)
    extras = re.search(r"'\.\[([a-z0-9,]+)\]'", install)
    assert extras is not None
    assert {"server", "postgres", "k8s"} <= set(extras.group(1).split(","))
    assert set(extras.group(1).split(",")) <= project["optional-dependencies"].keys()

    args = build_parser().parse_args(cmd)  # the command and its flags exist
    env = dict(item.split("=", 1) for word, rest in last if word == "ENV" for item in rest.split() if "=" in item)
    # a bare `podman run` of the image starts: beyond loopback the server needs an auth mode
    assert env.get("STEPWATCH_AUTH") in ("tokens", "proxy")
    from stepwatch.server.settings import ServerSettings

    image = {k: v for k, v in env.items() if k.startswith("STEPWATCH_")}
    assert ServerSettings.resolve({"host": args.host}, image).auth_problem() is None
    assert ServerSettings.resolve({"host": args.host}, {}).auth_problem() is not None  # what it guards
    assert (args.command, args.host, args.port) == ("server", "0.0.0.0", 8642)
    for kind, name in (("Deployment", "stepwatch-server"), ("StatefulSet", "stepwatch-runner")):
        pod = _one({_key(o): o for o in render(DEPLOY / "base")}, kind, name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert container["command"] == entrypoint
        assert container["args"] == cmd
        assert pod["securityContext"]["runAsUser"] == int(user.split(":")[0])
        assert pod["securityContext"]["runAsGroup"] == int(user.split(":")[1])
        assert [p["containerPort"] for p in container["ports"]] == [args.port]


def test_the_paths_the_docs_apply_exist() -> None:
    docs = (ROOT / "docs" / "deploy.md").read_text()
    applied = re.findall(r"kubectl apply -k (deploy/[\w/-]+)", docs)
    assert {"deploy/base", "deploy/overlays/tls", "deploy/overlays/delete-on-stop"} <= set(applied)
    for where in applied:
        assert (ROOT / where / "kustomization.yaml").is_file(), where
    for path in re.findall(r"kubectl apply -f (deploy/[\w/.-]+)", docs):
        assert (ROOT / path).is_file(), path
    assert set(KUSTOMIZATIONS) == {
        p.parent.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("kustomization.yaml")
    }, "a kustomization the tests do not render"
