"""The Kubernetes manifests: strict schema validation (offline) and the contract between them."""

from __future__ import annotations

import fnmatch
import posixpath
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate

from model_config import parse
from monitoring import kubernetes as rules_configmap
from paths import MODEL_REPOSITORY

KUBERNETES = Path(__file__).resolve().parents[2] / "docker" / "kubernetes"
MANIFESTS = sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")
ALERTMANAGER_CONFIG = KUBERNETES.parent / "alertmanager" / "alertmanager.yml"
PROMETHEUS_VALUES = KUBERNETES / "helm" / "prometheus-values.yaml"
# The cluster's Prometheus and what this folder puts beside it (by app.kubernetes.io/component);
# everything else lives in Triton's namespace.
MONITORING = "monitoring"
MONITORING_COMPONENTS = {"alertmanager", "prometheus-rules", "prometheus-adapter-rules"}
# The rule files the prometheus-community chart loads by default, which its values must keep.
CHART_RULE_FILES = [
    "/etc/config/recording_rules.yml",
    "/etc/config/alerting_rules.yml",
    "/etc/config/rules",
    "/etc/config/alerts",
]
# The oldest release the manifests target (PDB unhealthyPodEvictionPolicy is GA there) and the
# newest schema kubernetes-validate ships, so a field removed since 1.31 fails too.
KUBERNETES_VERSIONS = ["1.31", "1.37"]

QUEUE = "nv_inference_queue_duration_us"
COMPUTE = "nv_inference_compute_infer_duration_us"
HTTP, GRPC, METRICS = 8000, 8001, 8002


def load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def resource(kind: str, name: str | None = None) -> dict:
    (found,) = [
        doc
        for path in MANIFESTS
        for doc in load(path)
        if doc["kind"] == kind and name in (None, doc["metadata"]["name"])
    ]
    return found


@pytest.fixture(scope="module")
def deployment() -> dict:
    return resource("Deployment", "triton")


@pytest.fixture(scope="module")
def pod(deployment) -> dict:
    return deployment["spec"]["template"]


@pytest.fixture(scope="module")
def container(pod) -> dict:
    (only,) = pod["spec"]["containers"]
    return only


@pytest.fixture(scope="module")
def adapter_rule() -> dict:
    """The prometheus-adapter rule, parsed from the adapter config inside the ConfigMap."""
    config = yaml.safe_load(
        resource("ConfigMap", "triton-prometheus-adapter-rules")["data"]["config.yaml"]
    )
    (rule,) = config["rules"]
    return rule


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def container_port(container: dict, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


# Schema ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_strictly(path: Path, version: str):
    # The schemas ship inside the package: no network. Strict rejects unknown fields, and the
    # Python API raises SchemaNotFoundError for an unknown kind/apiVersion (the CLI only warns).
    docs = load(path)
    assert docs, f"{path.name} holds no resource"
    errors = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{doc['kind']} at {'.'.join(map(str, e.path))}: {e.message}")
    # Outside the except: the chained jsonschema error would print the whole schema.
    assert not errors, f"{path.name}: {errors}"


def test_strict_validation_rejects_an_unknown_field(deployment):
    # Guards the test above: a misspelt field must fail, not pass silently.
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError) as caught:
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)
    assert "'readinesProbe' was unexpected" in caught.value.message


def test_kustomization_lists_every_manifest_and_the_image():
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS)
    # A top-level namespace would move the adapter rules out of the adapter's namespace.
    assert "namespace" not in kustomization
    image = resource("Deployment", "triton")["spec"]["template"]["spec"]["containers"][0]["image"]
    name, tag = image.rsplit(":", 1)
    (entry,) = kustomization["images"]
    assert entry["name"] == name and entry.get("newTag", tag) == tag


def test_each_resource_lives_in_tritons_namespace_or_beside_prometheus():
    namespace = resource("Namespace")["metadata"]["name"]
    for path in MANIFESTS:
        for doc in load(path):
            if doc["kind"] == "Namespace":
                continue
            component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
            expected = MONITORING if component in MONITORING_COMPONENTS else namespace
            assert doc["metadata"]["namespace"] == expected, f"{path.name} {doc['kind']}"


# Deployment --------------------------------------------------------------------------------------
def test_deployment_selects_its_pods_and_leaves_replicas_to_the_hpa(deployment, pod):
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    assert "replicas" not in deployment["spec"]


def test_container_ports(container):
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": HTTP,
        "grpc": GRPC,
        "metrics": METRICS,
    }


@pytest.mark.parametrize(
    ("probe", "path"),
    [
        ("startupProbe", "/v2/health/live"),
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
    ],
)
def test_probes_hit_triton_health_on_the_http_port(container, probe, path):
    get = container[probe]["httpGet"]
    assert get["path"] == path
    port = get["port"] if isinstance(get["port"], int) else container_port(container, get["port"])
    assert port == HTTP


def test_startup_probe_allows_minutes_for_the_engine_build(container):
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 15 * 60


def test_grace_period_covers_the_prestop_sleep_and_tritons_exit_timeout(pod, container):
    (sleep,) = [int(a) for a in container["lifecycle"]["preStop"]["exec"]["command"][1:]]
    (exit_timeout,) = [
        int(a.split("=", 1)[1]) for a in container["args"] if a.startswith("--exit-timeout-secs=")
    ]
    assert pod["spec"]["terminationGracePeriodSeconds"] > sleep + exit_timeout


def test_one_gpu_on_gpu_nodes(pod, container):
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["spec"]["nodeSelector"]
    tolerations = pod["spec"]["tolerations"]
    assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule" for t in tolerations)


def test_model_config_name_exists_in_the_repository(container):
    env = {e["name"]: e.get("value") for e in container["env"]}
    name = env["TRITON_MODEL_CONFIG_NAME"]
    assert list(MODEL_REPOSITORY.glob(f"*/configs/{name}.pbtxt")), name


def test_scrape_annotations_point_at_the_metrics_port(pod, container):
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == container_port(container, "metrics")
    assert annotations["prometheus.io/path"] == "/metrics"


def test_writable_paths_are_volumes_and_shm_is_memory(pod, container):
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    # The root filesystem is read-only: everything the entrypoint writes must be mounted.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"/tmp", "/engines", "/dev/shm"} <= mounts.keys()
    shm = mounts["/dev/shm"]["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRITON_ENGINE_CACHE"] in mounts


def test_runs_as_triton_server_without_privileges(pod, container):
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security.get("privileged", False) is False


# Service, PDB ------------------------------------------------------------------------------------
def test_service_targets_the_pods_on_the_three_ports(pod, container):
    service = resource("Service", "triton")
    assert service["spec"]["type"] == "ClusterIP"
    assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert {name: p["port"] for name, p in ports.items()} == {
        "http": HTTP,
        "grpc": GRPC,
        "metrics": METRICS,
    }
    for name, p in ports.items():
        target = p["targetPort"]
        assert (target if isinstance(target, int) else container_port(container, target)) == (
            container_port(container, name)
        )


def test_pdb_selects_the_pods(pod):
    pdb = resource("PodDisruptionBudget")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    # With maxUnavailable >= minReplicas a drain could empty the service.
    assert (
        pdb["spec"]["maxUnavailable"] < resource("HorizontalPodAutoscaler")["spec"]["minReplicas"]
    )


# HPA and the prometheus-adapter rule -------------------------------------------------------------
def test_hpa_scales_the_deployment(deployment):
    hpa = resource("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"],
        deployment["kind"],
        deployment["metadata"]["name"],
    )
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    # Pods being removed are cheap to lose but slow to get back (engine build).
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300


def test_hpa_metric_is_the_one_the_adapter_rule_produces(adapter_rule):
    (metric,) = resource("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "Pods"
    series = re.match(r"\s*(\w+)\{", adapter_rule["seriesQuery"]).group(1)
    name = adapter_rule["name"]
    assert re.fullmatch(name["matches"], series)
    assert "$" not in name["as"]  # a literal name, no capture groups to expand
    assert metric["pods"]["metric"]["name"] == name["as"]


def test_adapter_rule_is_per_pod(adapter_rule):
    assert adapter_rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    query = adapter_rule["metricsQuery"]
    # Both rates restricted to the HPA's pods and summed per pod, not across the deployment.
    assert query.count("<<.LabelMatchers>>") == 2
    assert query.count("sum by (<<.GroupBy>>)") == 2


def test_adapter_rule_divides_queue_by_compute(adapter_rule):
    assert set(re.findall(r"\bnv_\w+", adapter_rule["seriesQuery"])) == {QUEUE}
    query = adapter_rule["metricsQuery"]
    assert set(re.findall(r"\bnv_\w+", query)) == {QUEUE, COMPUTE}
    numerator, denominator = query.split("/", 1)
    assert QUEUE in numerator and COMPUTE not in numerator
    assert COMPUTE in denominator


def test_adapter_rule_leaves_out_exactly_the_ensembles(adapter_rule):
    # An ensemble's compute counter repeats its steps' compute (shown on a real server by
    # tests/integration/test_kubernetes_metrics.py); counting it would halve the ratio.
    ensembles = {
        path.parent.name
        for path in MODEL_REPOSITORY.glob("*/config.pbtxt")
        if parse(path).platform == "ensemble"
    }
    assert ensembles
    excluded = re.findall(r'model!~"([^"]*)"', adapter_rule["metricsQuery"])
    assert len(excluded) == 2
    for pattern in excluded:
        assert set(pattern.split("|")) == ensembles


def test_every_pod_shares_the_embed_cache_named_by_an_optional_secret(container):
    (url,) = [e for e in container["env"] if e["name"] == "EMBED_TEXT_CACHE_URL"]
    ref = url["valueFrom"]["secretKeyRef"]
    # Optional: without it the pods start with their in-process cache only.
    assert ref == {"name": "embed-cache", "key": "url", "optional": True}
    redis = resource("Deployment", "embed-cache")["spec"]["template"]
    (cache,) = redis["spec"]["containers"]
    (password,) = cache["env"]
    # Not optional: this Redis never runs without a password.
    assert password["valueFrom"]["secretKeyRef"] == {"name": "embed-cache", "key": "password"}
    assert cache["args"][:2] == ["--requirepass", "$(REDIS_PASSWORD)"]
    assert "allkeys-lru" in cache["args"] and redis["spec"]["securityContext"]["runAsNonRoot"]
    service = resource("Service", "embed-cache")
    assert selects(service["spec"]["selector"], redis["metadata"]["labels"])
    assert service["spec"]["ports"][0]["port"] == 6379


def test_admin_key_comes_from_an_optional_secret(container):
    (key,) = [e for e in container["env"] if e["name"] == "TRITON_ADMIN_KEY"]
    ref = key["valueFrom"]["secretKeyRef"]
    # Optional: without the Secret the pod starts and the admin endpoints stay closed.
    assert ref["optional"] is True and ref["name"] and ref["key"]


# NetworkPolicy: who may reach what -----------------------------------------------------------
# A pod as the policies see it: its namespace's labels, its own labels. Namespaces carry
# kubernetes.io/metadata.name (set by Kubernetes itself since 1.22).
Pod = tuple[dict[str, str], dict[str, str]]
PROMETHEUS_NS = {"kubernetes.io/metadata.name": "monitoring"}
TRITON_NS = {"kubernetes.io/metadata.name": "triton"}


def namespace_labels(name: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name}


def pod_of(kind: str, name: str) -> Pod:
    """A pod of one of our Deployments, in that Deployment's namespace."""
    found = resource(kind, name)
    namespace = namespace_labels(found["metadata"]["namespace"])
    return namespace, found["spec"]["template"]["metadata"]["labels"]


PROMETHEUS: Pod = (PROMETHEUS_NS, {"app.kubernetes.io/name": "prometheus"})
# Pods that must reach nothing of ours: another app in our namespace, anything elsewhere, and
# something in the monitoring namespace that is not Prometheus.
STRANGERS: dict[str, Pod] = {
    "same-namespace": (TRITON_NS, {"app": "debug-shell"}),
    "other-namespace": ({"kubernetes.io/metadata.name": "default"}, {"app": "web"}),
    "monitoring-not-prometheus": (PROMETHEUS_NS, {"app.kubernetes.io/name": "grafana"}),
    "prometheus-elsewhere": (TRITON_NS, {"app.kubernetes.io/name": "prometheus"}),
}


def port_names(pod_labels: dict[str, str]) -> dict[str, int]:
    """name → number of every container port of the Deployment whose pods carry these labels."""
    (deployment,) = [
        doc
        for path in MANIFESTS
        for doc in load(path)
        if doc["kind"] == "Deployment"
        and doc["spec"]["template"]["metadata"]["labels"] == pod_labels
    ]
    return {
        p["name"]: p["containerPort"]
        for c in deployment["spec"]["template"]["spec"]["containers"]
        for p in c.get("ports", [])
        if "name" in p
    }


def policies() -> list[dict]:
    return load(KUBERNETES / "network-policy.yaml")


def selecting(target: Pod) -> list[dict]:
    """The policies that select a pod: in its namespace, their podSelector matching its labels."""
    namespace, labels = target
    return [
        doc
        for doc in policies()
        if namespace_labels(doc["metadata"]["namespace"]) == namespace
        and selects(doc["spec"]["podSelector"]["matchLabels"], labels)
    ]


def peer_matches(peer: dict, source: Pod, policy_namespace: str) -> bool:
    namespace, labels = source
    ns_selector = peer.get("namespaceSelector")
    pod_selector = peer.get("podSelector")
    # No namespaceSelector: the policy's own namespace.
    ns_ok = (
        namespace == namespace_labels(policy_namespace)
        if ns_selector is None
        else selects(ns_selector.get("matchLabels", {}), namespace)
    )
    pod_ok = pod_selector is None or selects(pod_selector.get("matchLabels", {}), labels)
    return ns_ok and pod_ok


def allowed(source: Pod, target: Pod, port: int) -> bool:
    """Whether the NetworkPolicies let ``source`` open a TCP connection to ``target``:``port``.

    Kubernetes' rules: a pod no policy selects takes everything; a selected pod takes what
    any rule of any policy selecting it allows (from: any peer, ports: any listed).
    """
    names = port_names(target[1])
    if not selecting(target):
        return True
    for policy in selecting(target):
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        namespace = policy["metadata"]["namespace"]
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            ports = [names.get(p["port"], p["port"]) for p in rule.get("ports", [])]
            if (peers is None or any(peer_matches(p, source, namespace) for p in peers)) and (
                not ports or port in ports
            ):
                return True
    return False


@pytest.fixture(scope="module")
def pods() -> dict[str, Pod]:
    return {
        "triton": pod_of("Deployment", "triton"),
        "gateway": pod_of("Deployment", "gateway"),
        "redis": pod_of("Deployment", "embed-cache"),
        "alertmanager": pod_of("Deployment", "triton-alertmanager"),
    }


def test_every_pod_of_ours_is_selected_by_a_policy_and_every_named_port_exists(pods):
    for name, pod in pods.items():
        (policy,) = selecting(pod)
        for rule in policy["spec"]["ingress"]:
            for port in rule["ports"]:
                assert isinstance(port["port"], int) or port["port"] in port_names(pod[1]), name


def test_only_the_gateway_and_prometheus_reach_triton(pods):
    triton = pods["triton"]
    for port in (HTTP, GRPC):
        assert allowed(pods["gateway"], triton, port)
        assert not allowed(PROMETHEUS, triton, port)
    assert allowed(PROMETHEUS, triton, METRICS)
    assert not allowed(pods["gateway"], triton, METRICS)
    for name, stranger in {**STRANGERS, "redis": pods["redis"]}.items():
        for port in (HTTP, GRPC, METRICS):
            assert not allowed(stranger, triton, port), (name, port)


def test_only_triton_reaches_the_embed_cache(pods):
    assert allowed(pods["triton"], pods["redis"], 6379)
    for name, stranger in {**STRANGERS, "gateway": pods["gateway"], "p": PROMETHEUS}.items():
        assert not allowed(stranger, pods["redis"], 6379), name


def test_anyone_reaches_the_gateway_and_only_prometheus_its_counts(pods):
    gateway = pods["gateway"]
    ports = port_names(gateway[1])
    for stranger in STRANGERS.values():
        assert allowed(stranger, gateway, ports["http"]) and allowed(
            stranger, gateway, ports["grpc"]
        )
        assert not allowed(stranger, gateway, ports["metrics"])
    assert allowed(PROMETHEUS, gateway, ports["metrics"])


def test_only_prometheus_reaches_the_alertmanager(pods):
    alertmanager = pods["alertmanager"]
    port = port_names(alertmanager[1])["http"]
    assert allowed(PROMETHEUS, alertmanager, port)
    others = {**STRANGERS, "triton": pods["triton"], "gateway": pods["gateway"]}
    for name, stranger in others.items():
        assert not allowed(stranger, alertmanager, port), name


def test_the_policy_check_fails_on_an_open_policy(pods, monkeypatch):
    # Guards the tests above: a rule without `from` admits every pod, and they must see it.
    opened = policies()
    opened[0]["spec"]["ingress"][0].pop("from")
    monkeypatch.setattr(sys.modules[__name__], "policies", lambda: opened)
    assert allowed(STRANGERS["other-namespace"], pods["triton"], HTTP)


def test_the_policy_check_sees_a_policy_in_another_namespace_select_nothing(pods, monkeypatch):
    # Guards the namespace check: Alertmanager's policy moved out of its namespace leaves its
    # pod unselected, open to anyone, and the tests above must see it.
    moved = policies()
    (policy,) = [p for p in moved if p["metadata"]["name"] == "triton-alertmanager"]
    policy["metadata"]["namespace"] = "triton"
    monkeypatch.setattr(sys.modules[__name__], "policies", lambda: moved)
    assert not selecting(pods["alertmanager"])
    assert allowed(STRANGERS["other-namespace"], pods["alertmanager"], 9093)


# Alertmanager ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alertmanager() -> dict:
    return resource("Deployment", "triton-alertmanager")


@pytest.fixture(scope="module")
def alertmanager_container(alertmanager) -> dict:
    (only,) = alertmanager["spec"]["template"]["spec"]["containers"]
    return only


def flags(container: dict) -> dict[str, str]:
    """{--flag: value} of a container's ``--flag=value`` arguments."""
    return dict(arg.split("=", 1) for arg in container["args"] if arg.startswith("--"))


def test_alertmanager_is_the_image_compose_runs_one_instance_without_peers(
    alertmanager, alertmanager_container
):
    from containers import images

    assert alertmanager_container["image"] == images.hub_images()["ALERTMANAGER_IMAGE"]
    # Two instances that do not gossip would both send every notification: one, and a rollout
    # that stops the old pod before it starts the new one.
    assert alertmanager["spec"]["replicas"] == 1
    assert alertmanager["spec"]["strategy"]["type"] == "Recreate"
    assert flags(alertmanager_container)["--cluster.listen-address"] == ""
    template = alertmanager["spec"]["template"]
    assert selects(alertmanager["spec"]["selector"]["matchLabels"], template["metadata"]["labels"])


@pytest.mark.parametrize(
    ("probe", "path"), [("readinessProbe", "/-/ready"), ("livenessProbe", "/-/healthy")]
)
def test_alertmanager_probes_hit_its_health_on_its_web_port(alertmanager_container, probe, path):
    get = alertmanager_container[probe]["httpGet"]
    assert get["path"] == path
    port = (
        get["port"]
        if isinstance(get["port"], int)
        else container_port(alertmanager_container, get["port"])
    )
    listen = flags(alertmanager_container)["--web.listen-address"]
    assert port == int(listen.rpartition(":")[2]) == 9093


def test_alertmanager_runs_as_nobody_read_only_with_bounded_memory(
    alertmanager, alertmanager_container
):
    pod = alertmanager["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # nobody, the official image's user (who owns its /alertmanager).
    assert pod["securityContext"]["runAsUser"] == 65534
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    security = alertmanager_container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    resources = alertmanager_container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]


def test_alertmanager_reads_its_config_from_the_secret_and_writes_to_a_volume(
    alertmanager, alertmanager_container
):
    volumes = {v["name"]: v for v in alertmanager["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m for m in alertmanager_container["volumeMounts"]}
    config = flags(alertmanager_container)["--config.file"]
    folder, name = posixpath.split(config)
    mount = mounts[folder]
    secret = volumes[mount["name"]]["secret"]
    assert mount["readOnly"] is True
    assert secret["secretName"] == "triton-alertmanager-config"
    # The Secret holds the file under the name compose mounts it by.
    assert secret["items"] == [{"key": ALERTMANAGER_CONFIG.name, "path": name}]
    assert name == ALERTMANAGER_CONFIG.name
    # Silences and the notification log, under a read-only root: a volume of their own.
    storage = mounts[flags(alertmanager_container)["--storage.path"]]
    assert "emptyDir" in volumes[storage["name"]] and not storage.get("readOnly")
    # The operator makes the Secret from a copy with real receivers: none is committed.
    kinds = {doc["kind"] for path in MANIFESTS for doc in load(path)}
    assert "Secret" not in kinds


def test_the_committed_alertmanager_config_has_placeholder_receivers_only():
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    urls = [
        value
        for receiver in config["receivers"]
        for kind, settings in receiver.items()
        if kind.endswith("_configs")
        for setting in settings
        for key, value in setting.items()
        if key.endswith("url")
    ]
    assert urls
    for url in urls:
        # .invalid never resolves (RFC 2606): nothing real, no token, is in the repository.
        assert urlsplit(url).hostname.endswith(".invalid"), url


def test_alertmanager_service_targets_its_pods(alertmanager, alertmanager_container):
    service = resource("Service", "triton-alertmanager")
    assert service["spec"]["type"] == "ClusterIP"
    assert selects(
        service["spec"]["selector"], alertmanager["spec"]["template"]["metadata"]["labels"]
    )
    (port,) = service["spec"]["ports"]
    target = port["targetPort"]
    assert port["port"] == 9093
    assert (
        target if isinstance(target, int) else container_port(alertmanager_container, target)
    ) == 9093


# The rules and the Alertmanager reaching the cluster's Prometheus ------------------------------
def test_the_rules_configmap_holds_the_compose_prometheus_rule_files_unchanged():
    sources = rules_configmap.rule_files()
    assert {"alerts.yml", "slo-rules.yml"} <= set(sources)
    configmap = resource("ConfigMap", rules_configmap.NAME)
    assert configmap["data"] == sources, (
        "docker/kubernetes/prometheus-rules.yaml differs from docker/prometheus's rule files: "
        "run python -m monitoring rules"
    )
    assert rules_configmap.OUTPUT.read_text() == rules_configmap.render(sources)
    assert configmap["metadata"]["namespace"] == PROMETHEUS_NS["kubernetes.io/metadata.name"]


def test_the_rules_check_fails_once_a_source_changes():
    sources = rules_configmap.rule_files()
    changed = {**sources, "alerts.yml": sources["alerts.yml"] + "# one more line\n"}
    assert resource("ConfigMap", rules_configmap.NAME)["data"] != changed
    assert rules_configmap.OUTPUT.read_text() != rules_configmap.render(changed)
    # Whatever a rule file holds comes back unchanged from the YAML written.
    for text in ("tab\there\n", "no newline", "two\n\n", "  indented\n", "\n\nblank first\n"):
        assert yaml.safe_load(rules_configmap.render({"f.yml": text}))["data"]["f.yml"] == text


@pytest.fixture(scope="module")
def prometheus_values() -> dict:
    return yaml.safe_load(PROMETHEUS_VALUES.read_text())


def test_the_charts_prometheus_loads_every_rule_file_of_the_configmap(prometheus_values):
    configmap = resource("ConfigMap", rules_configmap.NAME)
    (mount,) = [
        m
        for m in prometheus_values["server"]["extraConfigmapMounts"]
        if m["configMap"] == rules_configmap.NAME
    ]
    rule_files = prometheus_values["serverFiles"]["prometheus.yml"]["rule_files"]
    # The list replaces the chart's: its own files stay loaded.
    assert rule_files[: len(CHART_RULE_FILES)] == CHART_RULE_FILES
    for name in configmap["data"]:
        path = posixpath.join(mount["mountPath"], name)
        assert any(fnmatch.fnmatchcase(path, pattern) for pattern in rule_files), path
    # The config reloader sees the same files, so that a changed ConfigMap reloads Prometheus.
    reload = prometheus_values["configmapReload"]["prometheus"]
    assert mount["mountPath"] in reload["extraVolumeDirs"]
    assert {(m["configMap"], m["mountPath"]) for m in reload["extraConfigmapMounts"]} == {
        (rules_configmap.NAME, mount["mountPath"])
    }


def test_the_charts_prometheus_sends_its_alerts_to_the_alertmanager_service(prometheus_values):
    service = resource("Service", "triton-alertmanager")
    (config,) = prometheus_values["server"]["alertmanagers"]
    targets = [t for group in config["static_configs"] for t in group["targets"]]
    (port,) = service["spec"]["ports"]
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert targets == [f"{name}.{namespace}.svc:{port['port']}"]
