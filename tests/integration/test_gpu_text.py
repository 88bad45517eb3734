"""The gpu-local text service on a real tritonserver here, without a GPU.

``--model-config-name=gpu-local`` is what a GPU host with the PyPI server runs: there
``tokenize_encode`` runs MiniLM in PyTorch FP16 on its GPU. Without a GPU the launcher makes its
KIND_GPU group KIND_CPU, so the same config, the torch runtime and its padding run here in fp32,
and must give the fp32 ONNX encoder's vectors. Then the GPU run's own script (tests/gpu_text.py)
with its smoke plan: the compact weights it packs, loaded through the ``weights`` parameter.
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
import tritonclient.http as httpclient

from client.connection import ClientError
from client.embed import EmbedClient
from export import minilm, text_samples
from paths import MODEL_REPOSITORY
from pipelines import embedding
from server import Server, ServerConfig
from tests import gpu_text
from tests.helpers import batched_in_some_burst, behind_passages, settled_executions

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

        before = step_stats(gpu_local)
        first, *results = asyncio.run(
            behind_passages(
                url(gpu_local, protocol), protocol, f"{protocol} burst {n}", [[t] for t in plan]
            )
        )
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


def test_the_gpu_run_s_smoke_plan_serves_its_compact_weights(tmp_path):
    """What the GPU run does, here: pack, write the text models into a repository of its own
    (their step reading the packed files), serve it, measure in process with the smoke plan."""
    bundle = tmp_path / "bundle"
    sizes = gpu_text.pack(bundle)
    assert set(sizes) == {gpu_text.COMPACT, gpu_text.TOKENIZER, gpu_text.REFERENCE}
    assert sizes[gpu_text.COMPACT] < 25 * 2**20  # int8: a quarter of the fp32 weights
    repository = tmp_path / "repository"
    repository.mkdir()
    models = gpu_text.add_models(repository, MODEL_REPOSITORY, bundle)
    assert models == [embedding.ENSEMBLE, embedding.TOKENIZE_ENCODE]
    config = ServerConfig(
        model_repository=repository, http_port=0, grpc_port=0, metrics_port=0,
        model_config_name="gpu-local", instances_per_gpu=1, cache_bytes=0,
        extra_args=["--model-control-mode=explicit", f"--load-model={embedding.ENSEMBLE}"],
    )  # fmt: skip
    with Server(config, log_path=tmp_path / "tritonserver.log") as server:
        with httpclient.InferenceServerClient(server.http_url) as client:
            parameters = client.get_model_config(embedding.TOKENIZE_ENCODE)["parameters"]
        assert parameters["weights"]["string_value"] == str((bundle / gpu_text.COMPACT).resolve())
        assert parameters["text_cache_bytes"]["string_value"] == "0"
        texts = minilm.compact_texts()
        with EmbedClient(server.grpc_url, "grpc") as client:
            from_copy = client.embed(texts, truncate=True)
        # The copy's int8 weights answer: close to fp32, and not fp32 (which holds MIN_COSINE).
        fidelity = cosines(from_copy, minilm.onnx_embeddings(minilm.DEFAULT_OUTPUT, texts)).min()
        assert minilm.MIN_COSINE_COMPACT <= fidelity < MIN_COSINE

        plan = gpu_text.Plan.smoke()
        local = gpu_text.in_process(bundle, "cpu", plan)
        assert local["numerics"] == "torch float32"
        assert local["cosine_min"] >= minilm.MIN_COSINE_COMPACT
        assert set(local["texts_per_s"]) == {"short 4", "mixed 4"}
        assert all(rate > 0 for rate in local["texts_per_s"].values())
        # As the diagnostic calls it, the reference is the one packed beside the served files.
        assert gpu_text.served_reference(server.http_url) == gpu_text.reference(bundle)
        # Its measured levels run in the diagnosis's rehearsal (tests/integration/
        # test_gpu_diag.py); here a deadline already past: the copy's answers checked, the
        # load's files written, no level run, and a note for each.
        out = tmp_path / "out"
        late = gpu_text.served(server.grpc_url, server.http_url, out, plan, 0.0, bundle)
        assert late["cosine_min"] >= minilm.MIN_COSINE_COMPACT
        assert not late["levels"] and len(late["notes"]) == 2, late
        assert {p.name for p in out.iterdir()} == {"embed-short.json", "embed-mixed.json"}
