"""The embed ensemble on a real tritonserver: quality, cache, INT8, bad input, client."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

import model_config
from client.connection import ClientError, module
from client.embed import EmbedClient
from export import minilm as export_minilm
from export import text_samples
from pipelines import bert, embedding, tokenization
from tests.helpers import batched_in_some_burst, behind_passages, run_cli, settled_executions

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = ["http", "grpc"]
SERVED_MIN_COSINE = 0.9999


def url(server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


@pytest.fixture(scope="module")
def reference():
    model = bert.load_pretrained()
    return lambda texts: export_minilm.reference_embeddings(model, list(texts))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_served_embeddings_match_the_pytorch_reference(server, reference, protocol):
    texts = export_minilm.parity_texts()  # short ones and one far over 256 tokens
    with EmbedClient(url(server, protocol), protocol) as client:
        client.check_ready()
        served = client.embed(texts, truncate=True)
    assert served.shape == (len(texts), embedding.HIDDEN_SIZE) and served.dtype == np.float32
    assert cosines(served, reference(texts)).min() >= SERVED_MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_paraphrases_score_above_unrelated_pairs(server, protocol):
    with EmbedClient(url(server, protocol), protocol) as client:

        def score(pairs):
            a = client.embed([p[0] for p in pairs])
            b = client.embed([p[1] for p in pairs])
            return cosines(a, b)

        assert score(text_samples.PARAPHRASES).min() > score(text_samples.UNRELATED).max()


def embed_stats(server, model: str, version: str = "") -> dict:
    import tritonclient.http as http

    with http.InferenceServerClient(server.http_url) as client:
        (stats,) = client.get_inference_statistics(model, version)["model_stats"]
    return stats


def test_repeated_texts_are_answered_from_the_response_cache(server):
    text = ["Caching makes repeated queries nearly free."]
    before = embed_stats(server, embedding.ENSEMBLE)
    with EmbedClient(server.grpc_url, "grpc") as client:
        first = client.embed(text)
        again = [client.embed(text) for _ in range(5)]
    after = embed_stats(server, embedding.ENSEMBLE)
    hits = (
        after["inference_stats"]["cache_hit"]["count"]
        - before["inference_stats"]["cache_hit"]["count"]
    )
    assert hits >= 5
    for vector in again:
        np.testing.assert_array_equal(vector, first)


def test_int8_encoder_stays_close_to_fp32(server):
    texts = list(text_samples.SENTENCES)
    with (
        EmbedClient(server.grpc_url, "grpc") as fp32,
        EmbedClient(server.grpc_url, "grpc", model="embed_int8") as int8,
    ):
        assert cosines(int8.embed(texts), fp32.embed(texts)).min() >= export_minilm.MIN_COSINE_INT8


def raw_infer(
    server,
    protocol: str,
    array: np.ndarray,
    datatype: str = "BYTES",
    model: str = embedding.ENSEMBLE,
) -> str | None:
    mod = module(protocol)
    with mod.InferenceServerClient(url(server, protocol)) as client:
        tensor = mod.InferInput(embedding.TEXT, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        try:
            client.infer(model, [tensor])
        except Exception as exc:  # noqa: BLE001 - the test inspects the message
            return str(exc)
    return None


def texts(*items: bytes) -> np.ndarray:
    return np.array(items, dtype=np.object_).reshape(-1, 1)


BAD = {
    "not-utf8": (texts(b"caf\xe9 latin-1"), "BYTES", "TEXT[0]: not UTF-8"),
    "empty": (texts(b""), "BYTES", "TEXT[0]: empty text"),
    "whitespace": (texts(b"  \t"), "BYTES", "only whitespace"),
    "wrong-dtype": (np.zeros((1, 1), np.float32), "FP32", "expects 'BYTES'"),
    "empty-tensor": (np.zeros((0, 1), np.object_), "BYTES", "expected 1 string elements"),
    "bad-item-in-batch": (texts(b"fine", b"\xff"), "BYTES", "TEXT[1]: not UTF-8"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", [embedding.ENSEMBLE, embedding.GRAPH_ENSEMBLE])
def test_bad_input_gets_a_clear_error_and_the_server_stays_ready(server, model, protocol, case):
    array, datatype, expected = BAD[case]
    message = raw_infer(server, protocol, array, datatype, model)
    assert message is not None and expected in message
    with EmbedClient(url(server, protocol), protocol, model=model) as client:
        client.check_ready()
        # A text never sent before: the response cache cannot answer it, so it runs through
        # the steps the bad request went through (a stub it killed would fail it).
        fine = f"still fine after {model} {protocol} {case}"
        assert client.embed([fine]).shape == (1, embedding.HIDDEN_SIZE)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_one_graph_model_matches_the_ensemble(server, reference, protocol):
    """embed_graph (tokenizer op + encoder, one process) gives embed's vectors."""
    texts = [*export_minilm.parity_texts(), "Café, naïve: 東京 🚀 https://example.com/a?b=1"]
    with (
        EmbedClient(url(server, protocol), protocol) as ensemble,
        EmbedClient(url(server, protocol), protocol, model=embedding.GRAPH_ENSEMBLE) as graph,
    ):
        one_graph = graph.embed(texts)
        assert cosines(one_graph, ensemble.embed(texts, truncate=True)).min() >= 0.99999
    assert cosines(one_graph, reference(texts)).min() >= SERVED_MIN_COSINE


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", [embedding.ENSEMBLE, embedding.INT8_ENSEMBLE])
def test_an_over_long_text_is_refused_by_name_unless_its_request_asks_to_cut_it(
    server, reference, protocol, model
):
    long_text = f"{text_samples.LONG_TEXT} ({protocol}, {model})"  # no cache has seen it
    mixed = ["short", long_text, "a medium sized sentence about serving models"]
    pieces = len(tokenization.tokenizer().encode(long_text, add_special_tokens=True).ids)
    (length,) = tokenization.encode_counted([long_text])[1]
    assert pieces == embedding.MAX_TOKENS < length  # the tokenizer cuts it; the count does not
    refusal = f"TEXT[1]: text too long: {length} word pieces, over the limit of 256"
    with EmbedClient(url(server, protocol), protocol, model=model) as client:
        with pytest.raises(ClientError, match=re.escape(refusal)):
            client.embed(mixed)
        served = client.embed(mixed, truncate=True)
        # Asked again without TRUNCATE: refused again. Triton's response cache keys TRUNCATE
        # with the texts, so the cut answer it now holds does not answer this request.
        with pytest.raises(ClientError, match=re.escape(refusal)):
            client.embed(mixed)
    want = reference(mixed)  # sentence-transformers: its first 256 word pieces
    floor = SERVED_MIN_COSINE if model == embedding.ENSEMBLE else export_minilm.MIN_COSINE_INT8
    assert cosines(served, want).min() >= floor


def text_step(server) -> str:
    """The model that batches embed's texts in the server's configs (its first step)."""
    config = model_config.resolve(
        REPO / "model_repository" / embedding.ENSEMBLE, server.config.model_config_name
    )
    return config.ensemble_scheduling.step[0].model_name


_bursts = itertools.count()  # shared by both protocols' runs: their texts differ too


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_requests_among_concurrent_good_ones(server, reference, protocol):
    # Short sentences, a bad text and passages of several lengths, each its own request: they
    # share formed batches, and each answer must be its own text's vector.
    passage = " ".join(text_samples.SENTENCES[:6])
    kinds = [
        "A man is eating food.",
        None,  # not UTF-8
        passage,
        "A monkey is playing drums.",
        text_samples.LONG_TEXT,  # over the limit, without TRUNCATE: refused
        f"{passage} {passage}",
    ]

    def plan_of(n: int) -> list[list]:
        # Every text new in every burst, over both protocols' runs: a response-cache hit
        # skips the step, and fewer executions would then pass for batching.
        return [
            [b"\xff\xfe" if kind is None else f"{kind} (burst {n}, request {i})"]
            for i, kind in enumerate(kinds * 4)
        ]

    step = text_step(server)

    def burst_checked() -> int:
        n = next(_bursts)
        plan = plan_of(n)
        before = embed_stats(server, step, "1")
        first, *results = asyncio.run(
            behind_passages(url(server, protocol), protocol, f"burst {n}", plan)
        )
        assert not isinstance(first, BaseException) and len(first) == 16, first
        for request, result in zip(plan, results, strict=True):
            if isinstance(request[0], bytes):
                assert isinstance(result, ClientError) and "not UTF-8" in str(result)
            elif request[0].startswith(text_samples.LONG_TEXT):
                assert isinstance(result, ClientError) and "text too long" in str(result)
            else:
                assert cosines(result, reference(request)).min() >= SERVED_MIN_COSINE
        return settled_executions(lambda: embed_stats(server, step, "1"), before, 1 + len(plan))

    assert batched_in_some_burst(burst_checked, 1 + 4 * len(kinds)), (
        "never batched with the bad ones"
    )


def test_cli_embeds_arguments_and_files(server, tmp_path):
    done = run_cli("embed", "A man is eating food.", "--url", server.grpc_url, "--protocol", "grpc")
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert (
        line["text"] == "A man is eating food." and len(line["embedding"]) == embedding.HIDDEN_SIZE
    )
    source = tmp_path / "texts.jsonl"
    source.write_text("\n".join(json.dumps({"text": t}) for t in text_samples.SENTENCES * 10))
    out = tmp_path / "vectors.npy"
    done = run_cli(
        "embed",
        "--file",
        str(source),
        "--out",
        str(out),
        "--url",
        server.http_url,
        "--batch-size",
        "16",
        "--concurrency",
        "4",
        "--priority",  # passed to Triton with every request; the encoder here has no levels
        "1",
    )
    assert done.returncode == 0, done.stderr
    vectors = np.load(out)
    assert vectors.shape == (len(text_samples.SENTENCES) * 10, embedding.HIDDEN_SIZE)
    assert f"{len(vectors)}/{len(vectors)}" in done.stderr  # the progress bar finished
    np.testing.assert_allclose(vectors[0], vectors[len(text_samples.SENTENCES)], atol=1e-6)


def test_the_step_can_run_the_encoder_triton_serves_through_bls(reference):
    """The GPU configs' embed: tokenize_encode calls the served encoder (here its CPU model)."""
    import tritonclient.http as http

    from paths import MODEL_REPOSITORY
    from server import Server, ServerConfig

    config = ServerConfig(
        http_port=0, grpc_port=0, metrics_port=0,
        extra_args=["--model-control-mode=explicit", f"--load-model={embedding.ENCODER}"],
    )  # fmt: skip
    texts = ["A man is eating food.", "A man is riding a horse.", "word " * 250]
    with Server(config) as server, http.InferenceServerClient(server.http_url) as client:
        step = model_config.resolve(MODEL_REPOSITORY / embedding.TOKENIZE_ENCODE, "gpu")
        assert step.parameters["encoder_backend"].string_value == "triton"
        del step.instance_group[1:]
        step.instance_group[0].count = 1  # one stub is enough here
        admin = server.admin_headers()
        client.load_model(
            embedding.TOKENIZE_ENCODE, config=model_config.to_json(step), headers=admin
        )
        client.load_model(embedding.ENSEMBLE, headers=admin)

        def encoded() -> int:
            stats = client.get_inference_statistics(embedding.ENCODER)["model_stats"]
            return sum(int(v["inference_count"]) for v in stats)

        before = encoded()
        with EmbedClient(server.http_url, "http") as embed:
            served = embed.embed(texts)
        # Every text went through the served encoder (whose statistics may trail the answer).
        deadline = time.monotonic() + 10
        while encoded() - before < len(texts) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert encoded() - before == len(texts)
    assert cosines(served, reference(texts)).min() >= SERVED_MIN_COSINE


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_one_dimensional_batch_refuses_or_cuts_a_long_text_as_embed_does(server, protocol):
    """text_embeddings (LiteLLM's request shape): one TRUNCATE flag for all of its texts."""
    from tritonclient.utils import InferenceServerException

    mod = module(protocol)
    long_text = f"{text_samples.LONG_TEXT} (1-D, {protocol})"
    texts = np.array([b"short", long_text.encode()], dtype=np.object_)
    batch = mod.InferInput(embedding.TEXTS, [2], "BYTES")
    batch.set_data_from_numpy(texts)
    flag = mod.InferInput(embedding.TRUNCATE, [1], "BOOL")
    flag.set_data_from_numpy(np.array([True]))
    with mod.InferenceServerClient(url(server, protocol)) as client:
        with pytest.raises(InferenceServerException) as refused:
            client.infer(embedding.TEXTS_ENSEMBLE, [batch])
        assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        assert f"{embedding.TEXT}[1]: text too long" in refused.value.message()
        cut = client.infer(embedding.TEXTS_ENSEMBLE, [batch, flag])
    with EmbedClient(url(server, protocol), protocol) as client:
        want = client.embed(texts.tolist(), truncate=True)
    np.testing.assert_allclose(cut.as_numpy(embedding.EMBEDDING), want, atol=1e-6)
