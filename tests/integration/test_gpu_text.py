"""The gpu-local text service on a real tritonserver here, without a GPU.

``--model-config-name=gpu-local`` is what a GPU host with the PyPI server runs: there
``tokenize_encode`` runs MiniLM in PyTorch FP16 on its GPU. Without a GPU the launcher makes its
KIND_GPU group KIND_CPU, so the same config, the torch runtime and its padding run here in fp32,
and must give the fp32 ONNX encoder's vectors.
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
import tritonclient.http as httpclient

from client.connection import ClientError
from client.embed import AsyncEmbedClient, EmbedClient
from export import minilm, text_samples
from pipelines import embedding
from server import Server, ServerConfig
from tests.helpers import batched_in_some_burst, settled_executions

pytestmark = pytest.mark.integration

PROTOCOLS = ("http", "grpc")
MIN_COSINE = 0.99999  # fp32 against fp32: only summation order differs


@pytest.fixture(scope="module")
def gpu_local(tmp_path_factory, encoder_onnx):
    log_path = tmp_path_factory.mktemp("triton-gpu-local-text") / "tritonserver.log"
    config = ServerConfig(
        http_port=0, grpc_port=0, metrics_port=0, model_config_name="gpu-local",
        extra_args=["--model-control-mode=explicit", f"--load-model={embedding.ENSEMBLE}"],
        instances_per_gpu=1, cache_bytes=0,
    )  # fmt: skip
    with Server(config, log_path=log_path) as running:
        yield running


def url(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def cosines(a, b) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def step_stats(server) -> dict:
    with httpclient.InferenceServerClient(server.http_url) as client:
        stats = client.get_inference_statistics(embedding.TOKENIZE_ENCODE, "1")
    return stats["model_stats"][0]


def test_the_step_runs_the_torch_encoder_on_what_stands_for_the_gpu(gpu_local):
    with httpclient.InferenceServerClient(gpu_local.http_url) as client:
        config = client.get_model_config(embedding.TOKENIZE_ENCODE)
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 1)]
    assert config["parameters"]["encoder_backend"]["string_value"] == "torch"
    assert config["max_batch_size"] > embedding.MAX_TEXTS


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_vectors_are_the_fp32_onnx_encoder_s(gpu_local, encoder_onnx, protocol):
    texts = [*minilm.compact_texts(), f"a text only the {protocol} run sends"]
    # Sentences alone: their run is padded past its longest text, to a length bucket.
    sentences = [f"{t} ({protocol})" for t in text_samples.SENTENCES]
    with EmbedClient(url(gpu_local, protocol), protocol) as client:
        served = client.embed(texts, truncate=True)
        alone = client.embed(sentences)
    assert served.shape == (len(texts), embedding.HIDDEN_SIZE)
    assert cosines(served, minilm.onnx_embeddings(encoder_onnx[0], texts)).min() >= MIN_COSINE
    assert cosines(alone, minilm.onnx_embeddings(encoder_onnx[0], sentences)).min() >= MIN_COSINE


_bursts = itertools.count()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_text_fails_only_its_own_request(gpu_local, encoder_onnx, protocol):
    """Empty texts and over-long ones without TRUNCATE among good requests in one burst."""
    kinds = ["A man is eating food.", "", "A monkey is playing drums.", text_samples.LONG_TEXT]

    def burst_checked() -> int:
        n = next(_bursts)
        plan = [f"{k} ({protocol} burst {n}, {i})" if k else k for i, k in enumerate(kinds * 4)]

        async def burst():
            # A queue of passages first: the burst waits behind them and is batched.
            blocker = [f"{text_samples.LONG_TEXT} ({protocol} burst {n}, {i})" for i in range(16)]
            async with AsyncEmbedClient(url(gpu_local, protocol), protocol) as client:
                return await asyncio.gather(
                    client.embed(blocker, truncate=True),
                    *(client.embed([t]) for t in plan),
                    return_exceptions=True,
                )

        before = step_stats(gpu_local)
        first, *results = asyncio.run(burst())
        assert not isinstance(first, BaseException), first
        good = [t for t in plan if t and not t.startswith(text_samples.LONG_TEXT)]
        want = dict(zip(good, minilm.onnx_embeddings(encoder_onnx[0], good), strict=True))
        for text, result in zip(plan, results, strict=True):
            if not text:
                assert isinstance(result, ClientError) and "empty text" in str(result), result
            elif text.startswith(text_samples.LONG_TEXT):
                assert isinstance(result, ClientError) and "text too long" in str(result), result
            else:
                assert cosines(result, want[text][None]).min() >= MIN_COSINE
        return settled_executions(lambda: step_stats(gpu_local), before, 1 + len(plan))

    assert batched_in_some_burst(burst_checked, 1 + len(kinds) * 4), "never batched with them"
    with EmbedClient(url(gpu_local, protocol), protocol) as client:
        assert client.embed(["still answering"]).shape == (1, embedding.HIDDEN_SIZE)
