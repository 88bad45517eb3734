"""A user's PyTorch models, exported by the one command and served by a real tritonserver.

``python -m export torch`` writes two models no one here wrote into a temporary repository
(never model_repository/): a small ResNet from transformers with random weights, exported with
its INT8 version, and a module with two inputs, a dynamic token axis and a mapping of outputs.
The server loads that repository as ``make serve`` loads model_repository/ (the ``local``
variant), and every answer, over HTTP and gRPC, is checked against the same module in PyTorch.
"""

from __future__ import annotations

import concurrent.futures
import json

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

import model_config
from client import connection, tensors
from tests import user_models
from tests.helpers import (
    batched_in_some_burst,
    export_into,
    run_cli,
    serving,
    settled_executions,
)

pytestmark = pytest.mark.integration

RESNET = "your_resnet"
TOKENS = "your_tokens"


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """A repository holding the two exported models and nothing else."""
    root = tmp_path_factory.mktemp("your-models") / "repository"
    export_into(
        root,
        "torch",
        "--model",
        "tests.user_models:resnet",
        "--input",
        "pixel_values:fp32:3,64,64",
        "--output",
        "logits",
        "--int8",
        "--max-batch",
        "16",
        "--name",
        RESNET,
    )
    export_into(
        root,
        "torch",
        "--model",
        "tests.user_models:TokensAndScale",
        "--input",
        "tokens:int64:2..24:0..50",
        "--input",
        "scale:fp32:1",
        "--name",
        TOKENS,
    )
    return root


@pytest.fixture(scope="module")
def served(repository, tmp_path_factory):
    """A real tritonserver over that repository, as `make serve` runs one."""
    with serving(repository, tmp_path_factory.mktemp("triton-your-models")) as running:
        yield running


def test_the_exported_folders_are_what_make_models_checks(repository):
    """Every config and variant renders, matches signature.json, and is up to date."""
    from model_config import signatures

    assert signatures.check_repository(repository) == []
    assert model_config.stale(repository) == []
    resnet = repository / RESNET
    assert sorted(p.name for p in (resnet / "configs").glob("*.overlay.pbtxt")) == [
        "gpu-local.overlay.pbtxt",
        "gpu-ort.overlay.pbtxt",
        "gpu.overlay.pbtxt",
        "local.overlay.pbtxt",
    ]
    signature = json.loads((resnet / "signature.json").read_text())
    assert signature["outputs"] == [{"name": "logits", "datatype": "FP32", "dims": [10]}]
    assert signature["command"][:3] == ["torch", "--model", "tests.user_models:resnet"]
    assert "--repository" not in signature["command"]
    gpu = model_config.render(resnet, "gpu")
    assert gpu.backend == "tensorrt" and gpu.optimization.cuda.graphs  # fixed shapes: graphs
    tokens_gpu = model_config.render(repository / TOKENS, "gpu")
    assert not tokens_gpu.optimization.cuda.graphs  # a dynamic token axis: no graphs


def _pixels(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 64, 64)).astype(np.float32)


def test_resnet_answers_as_pytorch_over_both_protocols(served):
    model = user_models.resnet().eval()
    pixels = _pixels(5, seed=7)
    with torch.inference_mode():
        expected = model(pixel_values=torch.from_numpy(pixels)).logits.numpy()
    for protocol, url in (("http", served.http_url), ("grpc", served.grpc_url)):
        with tensors.TensorClient(url, protocol, RESNET) as client:
            int8 = client.infer_arrays({"pixel_values": pixels})["logits"]  # newest: INT8
        with tensors.TensorClient(url, protocol, RESNET, version="1") as client:
            got = client.infer_arrays({"pixel_values": pixels})["logits"]
            np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-3)
        cosine = (int8 * expected).sum(1) / (
            np.linalg.norm(int8, axis=1) * np.linalg.norm(expected, axis=1)
        )
        assert cosine.min() >= 0.99, cosine
        assert not np.allclose(int8, expected, atol=1e-4)  # version 2 is the INT8 graph


def test_two_inputs_and_a_dynamic_axis_answer_as_pytorch(served):
    model = user_models.TokensAndScale().eval()
    rng = np.random.default_rng(3)
    for protocol, url in (("http", served.http_url), ("grpc", served.grpc_url)):
        with tensors.TensorClient(url, protocol, TOKENS) as client:
            for length in (2, 9, 24):
                feeds = {
                    "tokens": rng.integers(0, 50, (3, length)).astype(np.int64),
                    "scale": rng.standard_normal((3, 1)).astype(np.float32),
                }
                with torch.inference_mode():
                    want = model(*(torch.from_numpy(a) for a in feeds.values()))
                got = client.infer_arrays(feeds)
                assert got["per_token"].shape == (3, length)
                for name in ("pooled", "per_token"):
                    np.testing.assert_allclose(got[name], want[name].numpy(), atol=1e-5, rtol=1e-4)


def test_requests_from_many_clients_are_batched(served):
    """The dynamic batcher joins concurrent one-row requests; each still gets its own answer."""
    model = user_models.resnet().eval()
    rows = _pixels(16, seed=11)
    with torch.inference_mode():
        expected = model(pixel_values=torch.from_numpy(rows)).logits.numpy()
    stats_client = httpclient.InferenceServerClient(served.http_url)

    def stats() -> dict:
        return stats_client.get_inference_statistics(RESNET, "1")["model_stats"][0]

    def one(i: int) -> None:
        with tensors.TensorClient(served.grpc_url, "grpc", RESNET, version="1") as client:
            got = client.infer_arrays({"pixel_values": rows[i : i + 1]})["logits"]
        np.testing.assert_allclose(got[0], expected[i], atol=1e-4, rtol=1e-3)

    def burst() -> int:
        before = stats()
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(16)))
        return settled_executions(stats, before, 16)

    assert batched_in_some_burst(burst, 16, most=False)


def test_a_bad_request_fails_alone(served):
    """A request of the wrong item shape gets its error; the server answers the next one."""
    with tensors.TensorClient(served.http_url, "http", TOKENS) as client:
        with pytest.raises(connection.ClientError, match="tokens"):
            client.infer_arrays(
                {
                    "tokens": np.zeros((1, 2, 2), np.int64),
                    "scale": np.ones((1, 1), np.float32),
                }
            )
        ok = client.infer_arrays(
            {"tokens": np.zeros((1, 4), np.int64), "scale": np.ones((1, 1), np.float32)}
        )
        assert ok["per_token"].shape == (1, 4)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_cli_calls_it_by_name_with_inputs_from_a_file(served, tmp_path, protocol):
    pixels = _pixels(2, seed=5)
    np.save(tmp_path / "pixels.npy", pixels)
    url = served.http_url if protocol == "http" else served.grpc_url
    out = tmp_path / "out.npz"
    done = run_cli(
        "infer", RESNET, str(tmp_path / "pixels.npy"), "--out", str(out),
        "--url", url, "--protocol", protocol,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with np.load(out) as saved:
        assert saved["logits"].shape == (2, 10)
    printed = run_cli(
        "infer", "nope", str(tmp_path / "pixels.npy"), "--url", url, "--protocol", protocol
    )
    assert printed.returncode == 1 and "nope" in printed.stderr
