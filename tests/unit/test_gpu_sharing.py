"""GPU isolation manifests (docker/kubernetes/gpu-sharing/): strict schemas and their contract.

Nothing here runs on a GPU: the manifests are checked offline against the Kubernetes schemas,
and each Deployment against the model configs it serves.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes_validate import utils as kubernetes_validate

from model_config import resolve
from paths import MODEL_REPOSITORY

SHARING = Path(__file__).resolve().parents[2] / "docker" / "kubernetes" / "gpu-sharing"
MANIFESTS = sorted(SHARING.glob("*.yaml"))
KUBERNETES_VERSIONS = ["1.31", "1.37"]
MIG_RESOURCE = "nvidia.com/mig-"


def load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def deployments(name: str) -> list[dict]:
    return [d for d in load(SHARING / name) if d["kind"] == "Deployment"]


def container(deployment: dict) -> dict:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def gpu_resources(deployment: dict) -> dict[str, int]:
    """The pod's GPU resources (a whole GPU or a MIG slice), requested exactly as limited."""
    resources = container(deployment)["resources"]
    requests, limits = (
        {k: v for k, v in resources[part].items() if k.startswith("nvidia.com/")}
        for part in ("requests", "limits")
    )
    # Extended resources cannot be overcommitted: Kubernetes refuses a request other than the
    # limit. The manifests write both, and the scheduler places the pod by the requests.
    assert requests == limits, (deployment["metadata"]["name"], requests, limits)
    return limits


def loaded_model(deployment: dict) -> str:
    (model,) = [a.split("=", 1)[1] for a in container(deployment)["args"] if "--load-model=" in a]
    return model


def env(deployment: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container(deployment)["env"]}


def served_models(model: str) -> list[str]:
    """The model and, for an ensemble, every step Triton loads with it."""
    config = resolve(MODEL_REPOSITORY / model, "gpu")
    steps = [s.model_name for s in config.ensemble_scheduling.step]
    return [model] + [m for step in steps for m in served_models(step)]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_strictly(path: Path, version: str):
    docs = load(path)
    assert docs
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path.name} {doc['kind']}/{doc['metadata']['name']}: {e.message}")


@pytest.mark.parametrize("name", ["mig.yaml", "shared-gpu.yaml"])
def test_each_model_has_a_deployment_and_a_service_of_its_own(name):
    docs = load(SHARING / name)
    found = deployments(name)
    assert len({loaded_model(d) for d in found}) == len(found) >= 2
    services = [d for d in docs if d["kind"] == "Service"]
    for deployment in found:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"] == labels
        (service,) = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
        others = [d for d in found if d is not deployment]
        for other in others:
            other_labels = other["spec"]["template"]["metadata"]["labels"]
            assert not service["spec"]["selector"].items() <= other_labels.items()
        assert "--model-control-mode=explicit" in container(deployment)["args"]


def test_each_model_gets_its_own_mig_slice():
    for deployment in deployments("mig.yaml"):
        resources = gpu_resources(deployment)
        # One resource, and that a slice: a whole nvidia.com/gpu beside it would fail here.
        (resource,) = resources
        assert resource.startswith(MIG_RESOURCE) and resources[resource] == 1, resources
        assert resource[len(MIG_RESOURCE) :].split(".")[0] in {"1g", "2g", "3g", "4g", "7g"}


@pytest.mark.parametrize("name", ["mig.yaml", "shared-gpu.yaml"])
def test_instance_groups_fit_one_slice(name):
    """A slice or a shared replica is one device (0) in the pod; every GPU instance goes there.

    The count per device is TRITON_INSTANCES_PER_GPU: one on a 1g slice, never more than the
    slice's compute units (a 3g slice takes 2).
    """
    for deployment in deployments(name):
        per_gpu = int(env(deployment)["TRITON_INSTANCES_PER_GPU"])
        (resource,) = gpu_resources(deployment)
        units = int(resource[len(MIG_RESOURCE)]) if resource.startswith(MIG_RESOURCE) else 1
        assert 1 <= per_gpu <= units, (deployment["metadata"]["name"], per_gpu, units)
        for model in served_models(loaded_model(deployment)):
            for group in resolve(MODEL_REPOSITORY / model, "gpu").instance_group:
                assert list(group.gpus) in ([], [0]), (model, list(group.gpus))


def test_device_plugin_sharing_advertises_one_replica_per_shared_model():
    (config_map,) = load(SHARING / "device-plugin-sharing.yaml")
    shared = len(deployments("shared-gpu.yaml"))
    for strategy, key in (("time-slicing", "timeSlicing"), ("mps", "mps")):
        config = yaml.safe_load(config_map["data"][strategy])
        assert config["version"] == "v1"
        (resource,) = config["sharing"][key]["resources"]
        assert resource == {"name": "nvidia.com/gpu", "replicas": shared}
    time_slicing = yaml.safe_load(config_map["data"]["time-slicing"])["sharing"]["timeSlicing"]
    assert time_slicing["failRequestsGreaterThanOne"] is True
    for deployment in deployments("shared-gpu.yaml"):
        assert gpu_resources(deployment) == {"nvidia.com/gpu": 1}


def test_manifests_say_they_were_not_run_on_a_gpu():
    for path in MANIFESTS:
        if path.name != "device-plugin-sharing.yaml":
            assert "Not run on a GPU" in path.read_text(), path.name
