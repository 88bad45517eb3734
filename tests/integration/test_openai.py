"""The embeddings for the clients people already use, against a real server and a real gateway.

One tritonserver and nginx in front of it with OpenAI's embeddings API (gateway/openai.js) and
token buckets. The clients are the real packages from PyPI: OpenAI's SDK, LiteLLM (its
``triton/`` provider straight to Triton and through the gateway, its ``openai/`` provider),
LangChain's OpenAIEmbeddings, and LlamaIndex's NvidiaTritonEmbedding call as its source makes
it (tritonclient; the package itself is not on the index this project installs from). Every
vector is compared with what ``embed`` answers for the same text.
"""

from __future__ import annotations

import base64
import itertools
import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
import tritonclient.http as httpclient
from prometheus_client import CollectorRegistry
from tritonclient.utils import InferenceServerException

from client.embed import EmbedClient
from gateway import access_log, shaping
from gateway.access_log import AccessLogMetrics, count_line
from gateway.nginx.config import Gateway, OpenAI, Shaping, Upstreams
from gateway.nginx.process import Nginx
from paths import REPO_ROOT
from pipelines import embedding, tokenization
from server import Server, ServerConfig
from tests.helpers import batched_in_some_burst, encoder_alone, settled_executions

pytestmark = pytest.mark.integration

MIN_COSINE = 0.99999
CALM_KEY, TIGHT_KEY, PAIR_KEY = "calm-key-0001", "tight-key-0001", "pair-key-0001"
TIGHT = shaping.Limit(rate=0.2, capacity=2)  # Retry-After: 5 s
# The counting test's own tenant (no other test spends its bucket): a token a minute, nginx's
# slowest rate.
COUNTED_KEY = "counted-key-0001"
COUNTED = shaping.Limit(rate=1 / 60, capacity=2)
LIMITS = shaping.parse_limits(
    {
        "anonymous": {"rate": 1000, "capacity": 1000},
        "tenants": {
            "calm": {"keys": [CALM_KEY], "rate": 1000, "capacity": 1000},
            "tight": {"keys": [TIGHT_KEY], "rate": TIGHT.rate, "capacity": TIGHT.capacity},
            "pair": {"keys": [PAIR_KEY], "rate": 0.1, "capacity": 2},
            "counted": {"keys": [COUNTED_KEY], "rate": COUNTED.rate, "capacity": COUNTED.capacity},
        },
        "models": {},
    }
)
MODELS = [
    embedding.ENSEMBLE,
    embedding.INT8_ENSEMBLE,
    *embedding.OPENAI_MODELS.values(),
    embedding.TEXTS_ENSEMBLE,
]
SENTENCES = [
    "A man is eating food.",
    "A man is riding a horse.",
    "Triton batches requests across clients.",
]


@pytest.fixture(scope="module")
def server(encoder_onnx, tmp_path_factory):
    # LiteLLM's and the SDKs' pooled connections stay open: Triton waits for them at exit.
    extra = ["--model-control-mode=explicit", "--exit-timeout-secs=3"]
    extra += [f"--load-model={m}" for m in MODELS]
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=0, extra_args=extra)
    log_path = tmp_path_factory.mktemp("openai") / "tritonserver.log"
    with Server(config, log_path=log_path) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(server, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("openai") / "nginx.log"
    gateway = Gateway(Upstreams.of(server), shaping=Shaping(LIMITS), openai=OpenAI())
    with Nginx(gateway, log_path=log_path) as nginx:
        yield nginx


def sdk(gateway, key: str = CALM_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{gateway.http_url}/v1", api_key=key, max_retries=0)


def reference(server, texts: list[str], model: str = embedding.ENSEMBLE) -> np.ndarray:
    """What Triton's own model answers for these texts (the vectors every client must get)."""
    with EmbedClient(server.http_url, "http", model=model) as client:
        chunks = range(0, len(texts), embedding.MAX_TEXTS)
        return np.concatenate(
            [client.embed(texts[i : i + embedding.MAX_TEXTS], truncate=True) for i in chunks]
        )


def assert_same_vectors(got, want) -> None:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= MIN_COSINE, cosine.min()


def tokens(texts: list[str]) -> int:
    """Word pieces the model's own tokenizer makes of the texts (cut at 256 each)."""
    return sum(len(ids) for ids in tokenization.encode(texts)[0])


# OpenAI's SDK ----------------------------------------------------------------------------------
@pytest.mark.parametrize("model", list(embedding.OPENAI_MODELS))
def test_floats_and_base64_are_the_models_vectors_with_their_token_usage(server, gateway, model):
    client = sdk(gateway)
    floats = client.embeddings.create(model=model, input=SENTENCES, encoding_format="float")
    assert floats.model == model and [d.index for d in floats.data] == [0, 1, 2]
    want = reference(server, SENTENCES, model)
    assert_same_vectors([d.embedding for d in floats.data], want)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == tokens(SENTENCES)
    # base64 as it travels: little-endian float32, what the SDK decodes by default.
    raw = client.embeddings.with_raw_response.create(
        model=model, input=SENTENCES, encoding_format="base64"
    )
    body = json.loads(raw.http_response.text)
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]]
    assert_same_vectors(vectors, want)
    default = client.embeddings.create(model=model, input=SENTENCES[0])  # the SDK asks base64
    # Alone, as the reference runs it: INT8 scales activations per run, so its vector of a text
    # depends on the texts it runs with (docs/models.md).
    assert_same_vectors([default.data[0].embedding], reference(server, SENTENCES[:1], model))


def test_a_list_of_100_texts_comes_back_in_order(server, gateway):
    texts = [f"document {i}: {SENTENCES[i % 3]} ({'word ' * (i % 40)})" for i in range(100)]
    result = sdk(gateway).embeddings.create(model="embed", input=texts, encoding_format="float")
    assert [d.index for d in result.data] == list(range(100))
    assert_same_vectors([d.embedding for d in result.data], reference(server, texts))
    assert result.usage.prompt_tokens == tokens(texts)


def test_models_are_listed_and_an_unknown_one_is_404(gateway):
    client = sdk(gateway)
    assert [m.id for m in client.models.list().data] == list(embedding.OPENAI_MODELS)
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="text-embedding-3-small", input="hello")
    assert err.value.body["code"] == "model_not_found"
    assert "embed, embed_int8" in err.value.body["message"]


LONG = "retrieval " * 600  # far over the model's 256 word pieces


def test_an_over_long_text_is_refused_by_its_index_unless_the_call_asks_to_truncate(
    server, gateway
):
    # The long text is in the call's second Triton request (64 texts each): its index is the
    # call's, not that request's.
    texts = [SENTENCES[i % 3] for i in range(embedding.MAX_TEXTS + 1)] + [LONG]
    (length,) = tokenization.encode_counted([LONG])[1]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(gateway).embeddings.create(model="embed", input=texts, encoding_format="float")
    assert refused.value.body["param"] == "input"
    assert (
        f"input[{len(texts) - 1}]: text too long: {length} word pieces, over the limit of 256; "
        "shorten it, or set 'truncate' to true to embed its first 256"
    ) in refused.value.body["message"]
    result = sdk(gateway).embeddings.create(
        model="embed", input=[LONG, SENTENCES[0]], encoding_format="float",
        extra_body={"truncate": True},
    )  # fmt: skip
    assert result.usage.prompt_tokens == embedding.MAX_TOKENS + tokens(SENTENCES[:1])
    assert_same_vectors([d.embedding for d in result.data], reference(server, [LONG, SENTENCES[0]]))


# Bad input: a clear error for that call, and the gateway serves on -------------------------------
BAD_CALLS = {
    "empty list": ({"input": []}, 400, "'input' is empty"),
    "empty text": ({"input": ["fine", ""]}, 400, "'input[1]' is empty"),
    "not a string": ({"input": ["fine", 3]}, 400, "'input[1]' must be a string, not number"),
    "null item": ({"input": [None]}, 400, "'input[0]' must be a string, not null"),
    "token ids": ({"input": [[101, 7592, 102]]}, 400, "token ids are not supported"),
    "flat token ids": ({"input": [101, 7592, 102]}, 400, "token ids are not supported"),
    "too many": ({"input": ["t"] * (embedding.MAX_OPENAI_INPUTS + 1)}, 413, "at most 2048"),
    "dimensions": (
        {"input": "x", "dimensions": 64},
        400,
        f"have {embedding.HIDDEN_SIZE} dimensions",
    ),
    "encoding": ({"input": "x", "encoding_format": "int8"}, 400, "'float' or 'base64'"),
    "whitespace only": ({"input": ["   "]}, 400, "only whitespace"),
    "truncate": ({"input": "x", "truncate": "yes"}, 400, "'truncate' must be true or false"),
    "no model": ({"input": "x", "model": None}, 400, "'model' must be the name of a model"),
}


def post(gateway, body: bytes, key: str = CALM_KEY) -> tuple[int, dict, dict]:
    request = urllib.request.Request(
        f"http://{gateway.http_url}/v1/embeddings",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_is_refused_in_openais_error_shape(gateway, case):
    fields, status, message = BAD_CALLS[case]
    got, body, _ = post(gateway, json.dumps({"model": "embed", **fields}).encode())
    assert got == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert message in body["error"]["message"] and body["error"]["type"] == "invalid_request_error"
    # The same gateway answers the next call.
    assert post(gateway, json.dumps({"model": "embed", "input": "fine"}).encode())[0] == 200


def test_invalid_utf8_non_json_and_oversized_bodies_are_refused(gateway):
    assert post(gateway, b'{"model": "embed", "input": "caf\xe9"}')[:1] == (400,)
    status, body, _ = post(gateway, b'{"model": "embed", "input": "caf\xe9"}')
    assert body["error"]["code"] == "invalid_encoding"
    status, body, _ = post(gateway, b'{"model": "embed", "input": ')
    assert status == 400 and body["error"]["code"] == "invalid_json"
    huge = json.dumps({"model": "embed", "input": "x" * (17 << 20)}).encode()
    status, body, _ = post(gateway, huge)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    # A text over the server's 256 KiB limit is refused by the model, in OpenAI's shape.
    status, body, _ = post(gateway, json.dumps({"model": "embed", "input": "y" * 300_000}).encode())
    assert status == 400 and "text too large" in body["error"]["message"]
    assert post(gateway, json.dumps({"model": "embed", "input": "fine"}).encode())[0] == 200


# Shaping, metrics, readiness ---------------------------------------------------------------------
def test_a_tenant_over_its_bucket_gets_429_with_retry_after(gateway):
    bearer = sdk(gateway, TIGHT_KEY)
    admitted = [bearer.embeddings.create(model="embed", input=f"t{i}") for i in range(2)]
    assert len(admitted) == TIGHT.capacity
    with pytest.raises(openai.RateLimitError) as err:
        bearer.embeddings.create(model="embed", input="one too many")
    assert err.value.response.headers["retry-after"] == str(math.ceil(1 / TIGHT.rate))
    assert err.value.body["code"] == "rate_limit_exceeded"
    # The same key in the gateway's own header names the same tenant, and its bucket is empty.
    request = urllib.request.Request(
        f"http://{gateway.http_url}/v1/embeddings",
        data=json.dumps({"model": "embed", "input": "x"}).encode(),
        headers={"Content-Type": "application/json", "X-Api-Key": TIGHT_KEY},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 429
    # The buckets count before the body is parsed: a tenant over its rate costs no parse, so
    # even a body that is not JSON gets 429 (under its rate it would get 400).
    request.data = b'{"model": "embed", "input": ["never parsed'
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 429
    # Other tenants are not held back.
    assert sdk(gateway).embeddings.create(model="embed", input="calm").data


def test_a_call_of_many_texts_takes_one_token(gateway):
    client = sdk(gateway, PAIR_KEY)
    texts = [f"chunked text {i}" for i in range(3 * embedding.MAX_TEXTS)]  # three Triton requests
    for _ in range(2):  # the bucket holds two tokens
        assert len(client.embeddings.create(model="embed", input=texts).data) == len(texts)
    with pytest.raises(openai.RateLimitError):
        client.embeddings.create(model="embed", input=texts[:1])


def openai_counts(gateway) -> Counter:
    """(tenant, model, outcome) → OpenAI calls counted from the gateway's whole access log."""
    registry = CollectorRegistry()
    metrics = AccessLogMetrics(registry)
    for line in gateway.access_log.read_text().splitlines():
        count_line(metrics, line)
    counts = Counter()
    for family in registry.collect():
        for sample in family.samples:
            labels = sample.labels
            if sample.name == f"{access_log.METRIC}_total" and labels["protocol"] == "openai":
                counts[labels["tenant"], labels["model"], labels["outcome"]] += sample.value
    return counts


def test_the_gateway_counts_openai_calls_by_tenant_and_outcome(gateway):
    # What the log held before this test (other tests' calls, in whatever order they ran) is
    # taken off: only this test's own calls are compared with what its client saw.
    before = openai_counts(gateway)
    anonymous = sdk(gateway, "not-a-known-key-1")
    for i in range(3):
        anonymous.embeddings.create(model="embed_int8", input=f"counted {i}")
    # One call more than the counted tenant's bucket holds, each outcome as the client saw it.
    counted = sdk(gateway, COUNTED_KEY)
    sent = COUNTED.capacity + 1
    seen = Counter()
    began = time.monotonic()
    for i in range(sent):
        try:
            counted.embeddings.create(model="embed", input=f"counted tenant {i}")
            seen[access_log.ADMITTED] += 1
        except openai.RateLimitError:
            seen[access_log.REFUSED] += 1
    elapsed = time.monotonic() - began
    assert seen[access_log.ADMITTED] + seen[access_log.REFUSED] == sent
    # The bucket admits its capacity plus what it refilled meanwhile (nothing in under a minute).
    assert seen[access_log.ADMITTED] <= COUNTED.capacity + COUNTED.rate * elapsed, (seen, elapsed)
    assert seen[access_log.REFUSED] >= 1, seen
    expected = {
        ("anonymous", "embed_int8", access_log.ADMITTED): 3,
        ("counted", "embed", access_log.ADMITTED): seen[access_log.ADMITTED],
        ("counted", "embed", access_log.REFUSED): seen[access_log.REFUSED],
    }
    # nginx logs a request after it has sent the answer: the last line may trail the client.
    deadline = time.monotonic() + 10
    while True:
        after = openai_counts(gateway)
        counted_now = {key: after[key] - before[key] for key in expected}
        if counted_now == expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert counted_now == expected


def test_503_while_the_model_is_not_loaded_and_200_once_it_is(server, gateway):
    client = sdk(gateway)
    headers = server.admin_headers("http")
    with httpclient.InferenceServerClient(server.http_url) as admin:
        admin.unload_model(embedding.OPENAI_MODELS["embed_int8"], headers=headers)
        try:
            with pytest.raises(openai.InternalServerError) as err:
                client.embeddings.create(model="embed_int8", input="not yet")
            assert err.value.status_code == 503 and err.value.body["code"] == "model_not_ready"
            assert err.value.response.headers["retry-after"] == "1"
        finally:
            admin.load_model(embedding.OPENAI_MODELS["embed_int8"], headers=headers)
    assert client.embeddings.create(model="embed_int8", input="ready again").data


def test_503_when_no_server_answers(tmp_path):
    dead = Upstreams(("127.0.0.1:1",), ("127.0.0.1:1",))
    with (
        Nginx(Gateway(dead, openai=OpenAI()), log_path=tmp_path / "n.log") as down,
        pytest.raises(openai.InternalServerError) as err,
    ):
        sdk(down).embeddings.create(model="embed", input="anyone?")
    assert err.value.status_code == 503 and err.value.body["code"] == "model_not_ready"


# Other clients -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import
    import litellm as module

    return module


@pytest.mark.parametrize("via", ["server", "gateway"])
def test_litellm_triton_provider_gets_embeds_vectors(server, gateway, litellm, via):
    base = server.http_url if via == "server" else gateway.http_url
    result = litellm.embedding(
        model=f"triton/{embedding.TEXTS_ENSEMBLE}",
        api_base=f"http://{base}/v2/models/{embedding.TEXTS_ENSEMBLE}/infer",
        input=SENTENCES,
    )
    assert [d["index"] for d in result.data] == [0, 1, 2]
    assert_same_vectors([d["embedding"] for d in result.data], reference(server, SENTENCES))
    # A text over 256 word pieces: the provider sends no TRUNCATE, so Triton refuses it, and
    # LiteLLM raises its own error with Triton's message in it.
    with pytest.raises(Exception, match=r"TEXT\[1\]: text too long") as refused:
        litellm.embedding(
            model=f"triton/{embedding.TEXTS_ENSEMBLE}",
            api_base=f"http://{base}/v2/models/{embedding.TEXTS_ENSEMBLE}/infer",
            input=[SENTENCES[0], LONG],
        )
    assert type(refused.value).__module__.startswith("litellm"), type(refused.value)


def test_litellm_openai_provider_through_the_gateway(server, gateway, litellm):
    result = litellm.embedding(
        model="openai/embed",
        api_base=f"http://{gateway.http_url}/v1",
        api_key=CALM_KEY,
        input=SENTENCES,
        encoding_format="float",
    )
    assert_same_vectors([d["embedding"] for d in result.data], reference(server, SENTENCES))
    assert result.usage.prompt_tokens == tokens(SENTENCES)


@pytest.mark.parametrize("via", ["server", "gateway"])
def test_llamaindex_nvidia_triton_call_shape(server, gateway, via):
    """llama_index.embeddings.nvidia_triton.NvidiaTritonEmbedding.get_general_text_embeddings,
    with input_tensor_name="input_text" and output_tensor_name="EMBEDDING"."""
    url = server.http_url if via == "server" else gateway.http_url
    input_data = httpclient.InferInput(embedding.TEXTS, [len(SENTENCES)], "BYTES")
    input_data.set_data_from_numpy(np.array(SENTENCES, dtype=np.object_))
    output_data = httpclient.InferRequestedOutput(embedding.EMBEDDING)
    client = httpclient.InferenceServerClient(url=url)
    response = client.infer(
        model_name=embedding.TEXTS_ENSEMBLE,
        inputs=[input_data],
        outputs=[output_data],
        request_id="7",
    )
    embeddings = [e.tolist() for e in response.as_numpy(embedding.EMBEDDING)]
    assert_same_vectors(embeddings, reference(server, SENTENCES))
    # A text over 256 word pieces: refused, as InferenceServerException (HTTP 400), which the
    # embedding class lets through to its caller.
    input_data = httpclient.InferInput(embedding.TEXTS, [2], "BYTES")
    input_data.set_data_from_numpy(np.array([SENTENCES[0], LONG], dtype=np.object_))
    with pytest.raises(InferenceServerException, match=r"TEXT\[1\]: text too long") as refused:
        client.infer(model_name=embedding.TEXTS_ENSEMBLE, inputs=[input_data])
    client.close()
    assert refused.value.status() == "400"


def documented_block(page: Path, marker: str) -> str:
    """The ```python block of a page that contains ``marker``, as the page writes it."""
    blocks = re.findall(r"^```python\n(.*?)^```$", page.read_text(), re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if marker in b]
    return block


def test_langchain_openai_embeddings_through_the_gateway(server, gateway):
    # docs/models.md's LangChain example, run as written there: only the address and the key
    # are this gateway's. (By default OpenAIEmbeddings sends tiktoken ids, which get a 400.)
    code = documented_block(REPO_ROOT / "docs" / "models.md", "OpenAIEmbeddings(")
    for shown, here in [
        ('"http://localhost:8080/v1"', f'"http://{gateway.http_url}/v1"'),
        ('"<tenant key>"', f'"{CALM_KEY}"'),
    ]:
        assert code.count(shown) == 1, shown
        code = code.replace(shown, here)
    namespace: dict = {}
    exec(compile(code, "docs/models.md", "exec"), namespace)
    assert_same_vectors(
        namespace["vectors"],
        reference(server, ["A man is eating food.", "A man is riding a horse."]),
    )
    embeddings = namespace["embeddings"]
    want = reference(server, SENTENCES)
    assert_same_vectors(embeddings.embed_documents(SENTENCES), want)
    assert_same_vectors([embeddings.embed_query(SENTENCES[0])], want[:1])


# (A Content-Encoding other than identity is refused before the script reads the call:
# test_gateway_hardening.)
@pytest.mark.parametrize(
    "header",
    [
        ("Inference-Header-Content-Length", "5"),  # Triton would cut the JSON at 5 bytes
        ("Content-Encoding", "identity"),  # a caller's; the script's requests name none
    ],
)
def test_a_callers_headers_never_reach_the_triton_requests_of_a_call(server, gateway, header):
    texts = ["headers are the caller's", "the script's requests are its own"]
    request = urllib.request.Request(
        f"http://{gateway.http_url}/v1/embeddings",
        data=json.dumps({"model": "embed", "input": texts}).encode(),
        headers={"Authorization": f"Bearer {CALM_KEY}", "Content-Type": "application/json",
                 header[0]: header[1]},
        method="POST",
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        body = json.loads(response.read())
    got = [item["embedding"] for item in sorted(body["data"], key=lambda d: d["index"])]
    assert_same_vectors(got, reference(server, texts))


def test_1d_requests_are_batched_with_each_other(server, encoder_onnx):
    alone = encoder_alone(encoder_onnx[0])  # not the server's own (cached) answers
    bursts = itertools.count()

    def burst() -> int:
        # New texts in every burst: a response-cache hit skips the step, and fewer executions
        # would then pass for batching.
        n = next(bursts)

        def one(i: int) -> None:
            texts = [f"burst {n} text {i} a", f"burst {n} text {i} b"]
            with httpclient.InferenceServerClient(server.http_url) as client:
                tensor = httpclient.InferInput(embedding.TEXTS, [2], "BYTES")
                tensor.set_data_from_numpy(np.array(texts, dtype=np.object_))
                got = client.infer(embedding.TEXTS_ENSEMBLE, [tensor]).as_numpy(embedding.EMBEDDING)
            assert_same_vectors(got, alone(texts))

        before = step_stats()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(16)))
        # Read once the step's statistics count all 16: Triton may record a request after its
        # client has the answer, and executions read before then can be too few to count.
        return settled_executions(step_stats, before, 16)

    def step_stats() -> dict:
        with httpclient.InferenceServerClient(server.http_url) as client:
            stats = client.get_inference_statistics(embedding.TOKENIZE_ENCODE)["model_stats"]
        (version,) = [v for v in stats if v["version"] == "1"]
        return version

    # 16 requests of 2 texts reach embed's step in fewer executions than requests. Sixteen
    # threads of blocking clients, with nothing to hold the step busy first, arrive too spread
    # on a busy machine for most of them to share a batch: any joining shows the path batches.
    assert batched_in_some_burst(burst, 16, most=False)


def test_a_bad_text_fails_only_its_1d_request(server):
    with httpclient.InferenceServerClient(server.http_url) as client:
        bad = httpclient.InferInput(embedding.TEXTS, [2], "BYTES")
        bad.set_data_from_numpy(np.array([b"fine", b"\xff\xfe"], dtype=np.object_))
        with pytest.raises(Exception, match="not UTF-8"):
            client.infer(embedding.TEXTS_ENSEMBLE, [bad])
        good = httpclient.InferInput(embedding.TEXTS, [1], "BYTES")
        good.set_data_from_numpy(np.array(["fine"], dtype=np.object_))
        assert client.infer(embedding.TEXTS_ENSEMBLE, [good]).as_numpy(
            embedding.EMBEDDING
        ).shape == (1, 384)


def test_openai_calls_get_the_per_text_cache_of_the_step_they_reach(server, gateway):
    from tests.helpers import change, scrape

    step = {"model": embedding.TOKENIZE_ENCODE, "version": "1"}
    client = sdk(gateway)
    first = client.embeddings.create(model="embed", input=["cached for the sdk", "and this"])
    before = scrape(server)
    # Another request (no response-cache hit), two of whose texts the step has seen.
    again = client.embeddings.create(
        model="embed", input=["and this", "new one", "cached for the sdk"]
    )
    after = scrape(server)
    assert change(before, after, "pipeline_text_cache_hits_total", **step, layer="local") == 2
    assert change(before, after, "pipeline_text_cache_misses_total", **step) == 1
    assert again.data[0].embedding == first.data[1].embedding
    assert again.data[2].embedding == first.data[0].embedding
