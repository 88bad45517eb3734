"""A user's sentence-embedding model, made a text service by one command, served for real.

A BERT encoder no one here wrote (transformers' BertModel with random weights, saved in the
layout sentence-transformers writes) goes through ``python -m export sentence`` into a temporary
repository; a real tritonserver serves the four models it writes, and every vector is checked
against the same model run in PyTorch (transformers, mean pooling, normalization, written here
again rather than taken from the export).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from client import connection
from client.embed import EmbedClient
from client.tensors import TensorClient
from export import text_samples
from pipelines import embedding
from tests import user_models
from tests.helpers import change, export_into, scrape, serving

pytestmark = pytest.mark.integration

NAME = "your_text"
MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sentence-model")
    user_models.sentence_model(folder)
    return folder


@pytest.fixture(scope="module")
def repository(saved, tmp_path_factory):
    root = tmp_path_factory.mktemp("your-text") / "repository"
    export_into(root, "sentence", "--path", str(saved), "--name", NAME)
    return root


@pytest.fixture(scope="module")
def served(repository, tmp_path_factory):
    with serving(repository, tmp_path_factory.mktemp("triton-your-text")) as running:
        yield running


def reference(saved, texts: list[str]) -> np.ndarray:
    """The vectors sentence-transformers would give: BertModel, mean over real tokens, L2."""
    from transformers import BertModel

    model = BertModel.from_pretrained(saved, local_files_only=True).eval()
    tok = Tokenizer.from_file(str(saved / "tokenizer.json"))
    tok.enable_truncation(max_length=embedding.MAX_TOKENS)
    tok.no_padding()
    rows = []
    with torch.inference_mode():
        for encoding in tok.encode_batch(texts):
            ids = torch.tensor([encoding.ids])
            hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids))[0]
            rows.append(torch.nn.functional.normalize(hidden.mean(1), dim=-1)[0].numpy())
    return np.stack(rows)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


TEXTS = [*text_samples.SENTENCES, *text_samples.mixed_texts(6, seed=9)]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_service_answers_as_the_model_in_pytorch(served, saved, protocol):
    url = served.http_url if protocol == "http" else served.grpc_url
    with EmbedClient(url, protocol, NAME) as client:
        got = client.embed(TEXTS)
    assert got.shape == (len(TEXTS), 48)
    assert cosines(got, reference(saved, TEXTS)).min() >= MIN_COSINE


def test_the_gpu_ensembles_two_steps_answer_the_same(served, saved):
    """tokenize → encoder, the steps the GPU configs chain, called one after the other."""
    texts = TEXTS[:5]
    with TensorClient(served.grpc_url, "grpc", f"{NAME}_tokenize") as tokenize:
        texts_in = np.array([t.encode() for t in texts], dtype=np.object_).reshape(-1, 1)
        pieces = tokenize.infer_arrays({embedding.TEXT: texts_in})
    with TensorClient(served.grpc_url, "grpc", f"{NAME}_encoder") as encoder:
        got = encoder.infer_arrays(
            {
                embedding.INPUT_IDS: pieces[embedding.INPUT_IDS],
                embedding.ATTENTION_MASK: pieces[embedding.ATTENTION_MASK],
            }
        )[embedding.EMBEDDING]
    assert cosines(got, reference(saved, texts)).min() >= MIN_COSINE


def test_a_text_seen_before_is_answered_from_the_per_text_cache(served):
    step = {"model": f"{NAME}_tokenize_encode", "version": "1"}
    with EmbedClient(served.http_url, "http", NAME) as client:
        first = client.embed(["a text for the cache", "another one"])
        before = scrape(served)
        # A new request (the response cache does not answer it) holding one seen text.
        again = client.embed(["a text for the cache", "a text never sent"])
    hits = change(before, scrape(served), "pipeline_text_cache_hits_total", **step, layer="local")
    assert hits == 1
    np.testing.assert_array_equal(again[0], first[0])


def test_a_long_text_is_refused_unless_cut(served, saved):
    with EmbedClient(served.grpc_url, "grpc", NAME) as client:
        with pytest.raises(connection.ClientError, match="text too long"):
            client.embed([text_samples.LONG_TEXT, "a short one"])
        cut = client.embed([text_samples.LONG_TEXT], truncate=True)
    assert cosines(cut, reference(saved, [text_samples.LONG_TEXT])).min() >= MIN_COSINE


def test_openais_sdk_gets_its_vectors_through_the_gateway(served, saved, repository, tmp_path):
    """The gateway lists the service under its name and answers OpenAI's embeddings API."""
    import openai

    from gateway.nginx.config import Gateway, OpenAI, Upstreams
    from gateway.nginx.process import Nginx

    texts = TEXTS[:6]
    api = OpenAI.of_repository(repository)
    with Nginx(Gateway(Upstreams.of(served), openai=api), log_path=tmp_path / "n.log") as n:
        sdk = openai.OpenAI(base_url=f"http://{n.http_url}/v1", api_key="none", max_retries=0)
        assert NAME in [m.id for m in sdk.models.list().data]
        answer = sdk.embeddings.create(model=NAME, input=texts)
        with pytest.raises(openai.BadRequestError, match="48 dimensions"):
            sdk.embeddings.create(model=NAME, input=texts[:1], dimensions=384)
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    assert cosines(got, reference(saved, texts)).min() >= MIN_COSINE
    tok = Tokenizer.from_file(str(saved / "tokenizer.json"))
    tok.no_padding()  # the file pads to 128: a count of word pieces has none
    assert answer.usage.prompt_tokens == sum(len(e.ids) for e in tok.encode_batch(texts))
