"""deploy/: every manifest validates against its schema, and every command is one `fleet` accepts.

Kubernetes objects are checked with kubernetes-validate (offline schemas, strict: unknown
fields fail), KEDA ScaledObjects field by field, the Compose file against the Compose
specification's JSON schema (vendored in tests/schemas/), and each `fleet ...` command
line with the real CLI parser.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Neither ships type information; the codes stay quiet should stubs appear.
import jsonschema
import kubernetes_validate
import pytest
import yaml

from fleetops.cli.main import build_parser, resolve
from fleetops.cli.ops import flower_env, worker_argv
from fleetops.cli.serve import MIN_TOKEN_CHARS, serve_token
from workers.app import QUEUES
from workers.probes import SOFT_SHUTDOWN_WINDOW_S

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "docker-compose.yml"
COMPOSE_SCHEMA = Path(__file__).parent / "schemas" / "compose-spec.json"
K8S_VERSION = "1.30.0"
IMAGE = "agent-fleet"
EXTERNAL_SECRETS = {"fleet-redis", "fleet-flower", "fleet-serve", "fleet-provider-keys"}
"""Secrets the user creates (docs/operations.md); everything else must be in the build."""
KUSTOMIZATIONS = sorted(K8S.glob("**/kustomization.yaml"))
MANIFESTS = sorted(p for p in K8S.glob("**/*.yaml") if p.name != "kustomization.yaml")
SCALED_OBJECT_FIELDS = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
PROMETHEUS_FIELDS = {
    "serverAddress",
    "query",
    "threshold",
    "activationThreshold",
    "ignoreNullValues",
    "namespace",
    "customHeaders",
    "queryParameters",
    "unsafeSsl",
    "timeout",
}


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def compose_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


def duration_s(text: str) -> float:
    """A Compose duration ("3m30s", "210s", "1h") in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"bad duration {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


def check_fleet_command(argv: list[str]) -> None:
    """Fail unless the real `fleet` parser (and the command's own checks) accept `argv`."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`fleet {' '.join(argv)}` is not a command the CLI accepts")
    assert callable(resolve(args.handler))
    if args.command == "worker":
        worker_argv(args)  # unknown queues, --autoscale with threads: ConfigError
    if args.command == "flower":
        flower_env(args.address, args.basic_auth, {"FLOWER_BASIC_AUTH": "user:secret"})
    if args.command == "serve":
        serve_token(args.address, {"FLEET_SERVE_TOKEN": "t" * MIN_TOKEN_CHARS})


# -- Compose -------------------------------------------------------------------


def test_the_compose_file_matches_the_compose_specification() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)
    document = yaml.safe_load(COMPOSE.read_text())
    assert [e.message for e in validator.iter_errors(document)] == []
    broken = copy.deepcopy(document)
    broken["services"]["explore"]["stop_grace"] = "210s"  # a typo must not pass
    assert list(validator.iter_errors(broken))


def test_compose_runs_one_worker_per_queue_with_a_grace_period_above_the_drain() -> None:
    services = compose_services()
    for queue in QUEUES:
        service = services[queue.removeprefix("fleet.")]
        command = service["command"]
        assert command[:3] == ["worker", "-Q", queue]
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert service["init"] is True
        assert duration_s(service["stop_grace_period"]) > SOFT_SHUTDOWN_WINDOW_S
        assert service["env_file"] == [{"path": "fleet.env", "required": True}]
        assert service["healthcheck"]["test"][:3] == ["CMD", "fleet", "probe"]
        # `--scale explore=8` needs no fixed name and no host port.
        assert "container_name" not in service and "ports" not in service


def test_compose_redis_persists_every_second_and_never_evicts() -> None:
    redis = compose_services()["redis"]
    command = " ".join(redis["command"])
    for setting in ("--appendonly yes", "--appendfsync everysec", "--maxmemory-policy noeviction"):
        assert setting in command


def test_compose_redis_requires_the_password_from_the_env_file() -> None:
    redis = compose_services()["redis"]
    assert redis["command"][:2] == ["sh", "-c"]
    # Compose turns `$$` into `$`: the shell reads the password from fleet.env, and an
    # empty one stops Redis from starting (`:?`).
    assert '--requirepass "$${REDIS_PASSWORD:?' in redis["command"][2]
    assert redis["env_file"] == [{"path": "fleet.env", "required": True}]
    check = redis["healthcheck"]["test"]
    assert check[0] == "CMD-SHELL" and 'REDISCLI_AUTH="$$REDIS_PASSWORD"' in check[1]
    assert " -a " not in check[1], "the password never goes on argv"
    example = dict(
        line.split("=", 1)
        for line in (DEPLOY / "example.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert example["REDIS_PASSWORD"] == "", "no default password: the user must set one"
    assert re.fullmatch(r"redis://:PASSWORD@redis:6379/\d+", example["FLEET_REDIS_URL"])


def test_compose_flower_listens_beyond_loopback_only_with_basic_auth() -> None:
    flower = compose_services()["flower"]
    assert flower["command"][:3] == ["flower", "--address", "0.0.0.0"]
    example = (DEPLOY / "example.env").read_text()
    assert re.search(r"^FLOWER_BASIC_AUTH=\S+:\S+$", example, re.MULTILINE)
    assert all(p.startswith("127.0.0.1:") for p in flower["ports"])


def test_compose_serve_listens_beyond_loopback_only_with_a_token() -> None:
    serve = compose_services()["serve"]
    assert serve["command"][:3] == ["serve", "--address", "0.0.0.0"]
    assert all(p.startswith("127.0.0.1:") for p in serve["ports"])
    example = (DEPLOY / "example.env").read_text()
    token = re.search(r"^FLEET_SERVE_TOKEN=(\S+)$", example, re.MULTILINE)
    assert token and len(token.group(1)) >= MIN_TOKEN_CHARS


def test_the_env_file_is_ignored_and_the_example_holds_no_key() -> None:
    ignore = (ROOT / ".gitignore").read_text().splitlines()
    assert "deploy/*.env" in ignore and "!deploy/example.env" in ignore
    dockerignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in dockerignore and "**/*.env" in dockerignore
    for line in (DEPLOY / "example.env").read_text().splitlines():
        if line.endswith("_API_KEY=") or not line.partition("=")[0].endswith("_KEY"):
            continue
        pytest.fail(f"example.env must leave provider keys empty: {line!r}")


def compose_commands() -> Iterator[list[str]]:
    for service in compose_services().values():
        if not service.get("image", "").startswith(IMAGE):
            continue
        yield service["command"]
        test = service.get("healthcheck", {}).get("test", [])
        if test[:2] == ["CMD", "fleet"]:
            yield test[2:]


# -- Dockerfile ----------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_the_image_is_multi_stage_slim_non_root_with_an_exec_entrypoint() -> None:
    steps = dockerfile_instructions()
    stages = [arg for op, arg in steps if op == "FROM"]
    assert len(stages) == 2 and all(s.startswith("python:3.11-slim") for s in stages)
    final = steps[max(i for i, (op, _) in enumerate(steps) if op == "FROM") :]
    assert ("USER", "10001:10001") in final
    assert json.loads(dict(final)["ENTRYPOINT"]) == ["fleet"]
    assert "PYTHONUNBUFFERED=1" in dict(final)["ENV"].split()
    for op, arg in steps:
        if op in ("ENV", "ARG"):
            assert not re.search(r"(KEY|SECRET|PASSWORD|TOKEN)\w*=\S", arg), arg


def dockerfile_commands() -> Iterator[list[str]]:
    yield json.loads(dict(dockerfile_instructions())["CMD"])


# -- Kubernetes ----------------------------------------------------------------


def objects_of(kind: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def base_objects() -> list[dict[str, Any]]:
    return [o for path in sorted((K8S / "base").glob("*.yaml")) for o in load_all(path)]


def pod_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    return containers


def component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"].get("app.kubernetes.io/component", ""))


def validate_object(obj: dict[str, Any]) -> None:
    if obj["kind"] == "ScaledObject":
        check_scaled_object(obj)
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(K8S)))
def test_each_kubernetes_manifest_validates(path: Path) -> None:
    for obj in load_all(path):
        validate_object(obj)


def test_kustomizations_name_only_files_that_exist() -> None:
    assert {p.parent.name for p in KUSTOMIZATIONS} == {"base", "dev", "prod"}
    for path in KUSTOMIZATIONS:
        spec = yaml.safe_load(path.read_text())
        assert spec["kind"] == "Kustomization" and spec["namespace"] == "fleet"
        for resource in spec["resources"]:
            assert (path.parent / resource).exists(), f"{path}: {resource!r} is missing"


def check_scaled_object(obj: dict[str, Any]) -> None:
    """The KEDA fields, checked one by one (kubernetes-validate has no KEDA schema)."""
    assert obj["apiVersion"] == "keda.sh/v1alpha1"
    spec = obj["spec"]
    assert set(spec) <= SCALED_OBJECT_FIELDS, set(spec) - SCALED_OBJECT_FIELDS
    assert isinstance(spec["scaleTargetRef"]["name"], str)
    counts = [spec[k] for k in ("minReplicaCount", "maxReplicaCount", "cooldownPeriod")]
    assert all(isinstance(n, int) and n >= 0 for n in counts)
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
    fallback = spec["fallback"]
    assert fallback["failureThreshold"] >= 1 and 0 <= fallback["replicas"] <= counts[1]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    kubernetes_validate.validate(hpa_with(behavior), K8S_VERSION, strict=True)
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    metadata = trigger["metadata"]
    assert set(metadata) <= PROMETHEUS_FIELDS, set(metadata) - PROMETHEUS_FIELDS
    assert all(isinstance(v, str) for v in metadata.values()), "KEDA metadata is string-only"
    assert re.match(r"https?://[\w.-]+(:\d+)?$", metadata["serverAddress"])
    assert float(metadata["threshold"]) > 0 and float(metadata["activationThreshold"]) >= 0


def hpa_with(behavior: dict[str, Any]) -> dict[str, Any]:
    """A minimal HPA carrying KEDA's `behavior`, so the Kubernetes schema checks it."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "check"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
            "maxReplicas": 1,
            "behavior": behavior,
        },
    }


def worker_queue(deployment: dict[str, Any]) -> str:
    args: list[str] = pod_containers(deployment)[0]["args"]
    assert args[:2] == ["worker", "-Q"]
    return args[2]


def test_every_queue_scales_on_queued_plus_running_work_of_that_queue() -> None:
    objects = base_objects()
    deployments = {d["metadata"]["name"]: d for d in objects_of("Deployment", objects)}
    scaled = objects_of("ScaledObject", objects)
    assert len(scaled) == len(QUEUES)
    seen = set()
    for obj in scaled:
        target = deployments[obj["spec"]["scaleTargetRef"]["name"]]
        queue = worker_queue(target)
        query = obj["spec"]["triggers"][0]["metadata"]["query"]
        for metric in ("fleet_queue_length", "fleet_running_subagents"):
            assert f'{metric}{{queue="{queue}"}}' in query, query
        concurrency = pod_containers(target)[0]["args"][-1]
        assert obj["spec"]["triggers"][0]["metadata"]["threshold"] == concurrency
        assert "replicas" not in target["spec"], "KEDA owns the replica count"
        seen.add(queue)
    assert seen == set(QUEUES)


def test_worker_pods_drain_within_their_grace_and_probe_files_not_the_broker() -> None:
    objects = base_objects()
    workers = [d for d in objects_of("Deployment", objects) if component(d) == "worker"]
    budgets = {p["metadata"]["name"]: p for p in objects_of("PodDisruptionBudget", objects)}
    assert len(workers) == len(QUEUES)
    for deployment in workers:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] > SOFT_SHUTDOWN_WINDOW_S
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"]
        (container,) = pod["containers"]
        liveness = container["livenessProbe"]["exec"]["command"]
        assert liveness[:3] == ["fleet", "probe", "--max-age-s"]
        assert container["readinessProbe"]["exec"]["command"] == ["fleet", "probe", "--ready"]
        assert {"requests", "limits"} <= set(container["resources"])
        (redis_url,) = [e for e in container["env"] if e["name"] == "FLEET_REDIS_URL"]
        assert redis_url["valueFrom"]["secretKeyRef"]["name"] == "fleet-redis"
        budget = budgets[deployment["metadata"]["name"]]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_flower_is_one_replica_behind_basic_auth_from_a_secret() -> None:
    objects = base_objects()
    (flower,) = [d for d in objects_of("Deployment", objects) if component(d) == "flower"]
    assert flower["spec"]["replicas"] == 1
    (container,) = pod_containers(flower)
    auth = {e["name"]: e for e in container["env"]}["FLOWER_BASIC_AUTH"]
    assert auth["valueFrom"]["secretKeyRef"] == {"name": "fleet-flower", "key": "basic-auth"}
    services = {s["metadata"]["name"]: s for s in objects_of("Service", objects)}
    labels = flower["spec"]["template"]["metadata"]["labels"]
    assert services["fleet-flower"]["spec"]["selector"].items() <= labels.items()


def test_serve_takes_its_token_from_a_secret_and_is_probed_without_it() -> None:
    objects = base_objects()
    (serve,) = [d for d in objects_of("Deployment", objects) if component(d) == "serve"]
    (container,) = pod_containers(serve)
    token = {e["name"]: e for e in container["env"]}["FLEET_SERVE_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "fleet-serve", "key": "token"}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz"  # no data, no token
    services = {s["metadata"]["name"]: s for s in objects_of("Service", objects)}
    labels = serve["spec"]["template"]["metadata"]["labels"]
    assert services["fleet-serve"]["spec"]["selector"].items() <= labels.items()


def test_the_grafana_dashboard_links_a_trace_id_to_the_live_page() -> None:
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["trace_id"]["type"] == "textbox"
    (link,) = dashboard["links"]
    assert link["url"] == "${serve_url}/?trace=${trace_id:percentencode}"


def kubernetes_commands(objects: list[dict[str, Any]]) -> Iterator[list[str]]:
    for obj in objects_of("Deployment", objects):
        for container in pod_containers(obj):
            if container["image"].rpartition("/")[2].partition(":")[0] == IMAGE:
                yield container["args"]
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                command = container.get(probe, {}).get("exec", {}).get("command", [])
                if command[:1] == ["fleet"]:
                    yield command[1:]


def test_every_command_in_the_manifests_is_one_the_fleet_cli_accepts() -> None:
    commands = [
        *compose_commands(),
        *dockerfile_commands(),
        *kubernetes_commands(base_objects()),
    ]
    assert len(commands) > 20
    for argv in commands:
        check_fleet_command(argv)


# -- kustomize builds ----------------------------------------------------------


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def references(obj: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(kind, name) of every Secret and ConfigMap a pod template refers to."""
    for container in pod_containers(obj):
        for source in container.get("envFrom", []):
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in source:
                    yield kind, source[key]["name"]
        for env in container.get("env", []):
            if "secretKeyRef" in env.get("valueFrom", {}):
                yield "Secret", env["valueFrom"]["secretKeyRef"]["name"]


@pytest.mark.parametrize("overlay", ["base", "overlays/dev", "overlays/prod"])
def test_each_kustomization_builds_into_valid_objects_whose_references_resolve(
    overlay: str,
) -> None:
    objects = kustomize(K8S / overlay)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for obj in objects:
        validate_object(obj)
        assert obj["kind"] == "Namespace" or obj["metadata"]["namespace"] == "fleet"
    for deployment in objects_of("Deployment", objects):
        for kind, name in references(deployment):
            assert (kind, name) in names or name in EXTERNAL_SECRETS, (kind, name)
    commands = list(kubernetes_commands(objects))
    assert commands
    for argv in commands:
        check_fleet_command(argv)


# -- Redis passwords and the network policy --------------------------------------


def test_every_overlay_with_its_own_redis_requires_a_password_from_the_secret() -> None:
    dev = kustomize(K8S / "overlays" / "dev")
    (redis,) = [d for d in objects_of("Deployment", dev) if component(d) == "redis"]
    (container,) = pod_containers(redis)
    assert container["command"] == ["sh", "-c"]
    assert '--requirepass "${REDIS_PASSWORD:?' in container["args"][0]
    env = {e["name"]: e for e in container["env"]}
    ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref["key"] == "password" and ref["name"].startswith("fleet-redis")
    assert "REDISCLI_AUTH" in container["readinessProbe"]["exec"]["command"][2]
    (secret,) = [
        s for s in objects_of("Secret", dev) if s["metadata"]["name"].startswith("fleet-redis")
    ]
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["password"] and data["url"].startswith(f"redis://:{data['password']}@")
    # prod brings its own Redis: no in-cluster one, and the URL is the user's Secret.
    prod = kustomize(K8S / "overlays" / "prod")
    assert not [d for d in objects_of("Deployment", prod) if component(d) == "redis"]
    assert "rediss://:PASSWORD@" in (K8S / "overlays" / "prod" / "kustomization.yaml").read_text()


METADATA = ipaddress.ip_address("169.254.169.254")


def allowed(block: dict[str, Any], address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether an ipBlock lets `address` through."""
    network = ipaddress.ip_network(block["cidr"])
    if address.version != network.version or address not in network:
        return False
    return not any(
        address in ipaddress.ip_network(e)
        for e in block.get("except", [])
        if ipaddress.ip_network(e).version == address.version
    )


def test_workers_reach_dns_redis_and_public_https_never_the_metadata_service() -> None:
    for overlay in ("base", "overlays/dev", "overlays/prod"):
        objects = kustomize(K8S / overlay)
        policies = {p["metadata"]["name"]: p["spec"] for p in objects_of("NetworkPolicy", objects)}
        spec = policies["fleet-workers"]
        workers = [d for d in objects_of("Deployment", objects) if component(d) == "worker"]
        assert len(workers) == len(QUEUES)
        for deployment in workers:
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            assert spec["podSelector"]["matchLabels"].items() <= labels.items()
        assert set(spec["policyTypes"]) == {"Ingress", "Egress"} and spec["ingress"] == []
        ports = {(p["protocol"], p["port"]) for rule in spec["egress"] for p in rule["ports"]}
        assert ports == {("UDP", 53), ("TCP", 53), ("TCP", 6379), ("TCP", 6380), ("TCP", 443)}
        blocks = [peer["ipBlock"] for r in spec["egress"] for peer in r["to"] if "ipBlock" in peer]
        for address in (METADATA, ipaddress.ip_address("fd00:ec2::254")):
            assert not any(allowed(block, address) for block in blocks), address
        https = next(r for r in spec["egress"] if r["ports"] == [{"protocol": "TCP", "port": 443}])
        public = [peer["ipBlock"] for peer in https["to"]]
        assert any(allowed(b, ipaddress.ip_address("104.18.7.192")) for b in public)
        for private in ("10.0.0.5", "172.16.1.1", "192.168.1.1", "100.64.0.1", "127.0.0.1"):
            assert not any(allowed(b, ipaddress.ip_address(private)) for b in public), private


def selects(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a NetworkPolicy's podSelector (matchLabels and `In` expressions) picks a pod."""
    selector = spec["podSelector"]
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    return all(
        labels.get(e["key"]) in e["values"]
        for e in selector.get("matchExpressions", [])
        if e["operator"] == "In"
    )


def test_the_consoles_reach_only_dns_and_redis() -> None:
    objects = kustomize(K8S / "overlays" / "prod")
    policies = {p["metadata"]["name"]: p["spec"] for p in objects_of("NetworkPolicy", objects)}
    spec = policies["fleet-consoles"]
    consoles = [
        d
        for d in objects_of("Deployment", objects)
        if component(d) in ("flower", "metrics", "serve")
    ]
    assert {component(d) for d in consoles} == {"flower", "metrics", "serve"}
    for deployment in objects_of("Deployment", objects):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selects(spec, labels) == (deployment in consoles), deployment["metadata"]["name"]
        ports = {p["containerPort"] for c in pod_containers(deployment) for p in c.get("ports", [])}
        if deployment in consoles:
            allowed_in = {p["port"] for rule in spec["ingress"] for p in rule["ports"]}
            assert ports <= allowed_in
    egress = {(p["protocol"], p["port"]) for rule in spec["egress"] for p in rule["ports"]}
    assert egress == {("UDP", 53), ("TCP", 53), ("TCP", 6379), ("TCP", 6380)}
    blocks = [peer["ipBlock"] for r in spec["egress"] for peer in r["to"] if "ipBlock" in peer]
    assert not any(allowed(block, METADATA) for block in blocks)
