"""The GPU configs' wiring on a real tritonserver here, without a GPU.

``--model-config-name=gpu-local`` is what a GPU host with the bundled server runs (the GPU
check): the launcher links a copy of the repository and places every KIND_GPU group on the GPUs
it finds; with none, those groups become KIND_CPU, so the same configs, the PyTorch classifier
runner and its DLPack plumbing run here end to end. Only the device differs on a GPU.
"""

from __future__ import annotations

import pytest
import tritonclient.http as httpclient

from client.classify import ClassifyClient
from pipelines import classification
from server import Server
from tests import gpu_check
from tests.integration.test_classify import assert_matches_reference

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gpu_local_server(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("triton-gpu-local") / "tritonserver.log"
    # What `make gpu-check` serves, one instance per (absent) GPU.
    config = gpu_check.server_config(
        (classification.ENSEMBLE, classification.FUSED), instances_per_gpu=1
    )
    with Server(config, log_path=log_path) as running:
        yield running


def test_gpu_groups_become_cpu_groups_without_a_gpu(gpu_local_server):
    client = httpclient.InferenceServerClient(gpu_local_server.http_url)
    for model in (classification.CLASSIFIER, classification.PREPROCESS, classification.FUSED):
        groups = client.get_model_config(model)["instance_group"]
        assert [g["kind"] for g in groups] == ["KIND_CPU"], groups
        assert groups[0]["count"] == 1  # instances_per_gpu overrides the config's count
    config = client.get_model_config(classification.CLASSIFIER)
    assert config["backend"] == "python"
    assert config["parameters"]["runtime"]["string_value"] == "torch"


def test_torch_classifier_matches_the_onnx_reference(gpu_local_server, reference, photos):
    images = list(photos.values())
    with ClassifyClient(gpu_local_server.http_url, protocol="http") as client:
        predictions = client.classify(images)
    assert_matches_reference(predictions, reference, images)


def test_a_bad_image_fails_alone_through_the_torch_path(gpu_local_server, photos):
    with ClassifyClient(gpu_local_server.grpc_url, protocol="grpc") as client:
        good = client.classify([photos["chelsea"]])
        with pytest.raises(Exception, match="IMAGE"):
            client.classify([b"not an image"])
        assert client.classify([photos["chelsea"]]) == good


def test_the_fused_gpu_step_answers_as_the_reference_over_both_protocols(
    gpu_local_server, reference, photos
):
    """classify_fused's gpu-local config (one step: decode, the PyTorch model, top-k on the
    device), on a CPU instance: the same answers as the in-process reference."""
    images = list(photos.values())
    config = httpclient.InferenceServerClient(gpu_local_server.http_url).get_model_config(
        classification.FUSED
    )
    assert config["parameters"]["runtime"]["string_value"] == "torch"
    for url, protocol in ((gpu_local_server.http_url, "http"), (gpu_local_server.grpc_url, "grpc")):
        with ClassifyClient(url, protocol=protocol, model=classification.FUSED) as client:
            assert_matches_reference(client.classify(images), reference, images)
            with pytest.raises(Exception, match="IMAGE"):
                client.classify([b"not an image"])
