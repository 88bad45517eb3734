"""The torch runtime of the text step's encoder (the GPU configs of the PyPI server), on a CPU."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from export import text_samples
from export.minilm import onnx_embeddings
from paths import MODEL_REPOSITORY
from pipelines import embedding, minilm_weights, padding, tokenization
from pipelines.backend import engines, text_model, torch_encoder
from tests.unit.test_models import INVALID, failed, load, output, request, texts


def test_runs_are_padded_to_few_shapes_and_every_one_is_warmed():
    assert torch_encoder.row_buckets(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert torch_encoder.row_buckets(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    assert torch_encoder.padded_shape(3, 17, 256) == (4, 32)
    assert torch_encoder.padded_shape(1, 256, 256) == (1, 256)
    assert torch_encoder.padded_shape(300, 5, 256) == (300, 16)  # more rows than any bucket
    rng = random.Random(0)
    for max_rows, max_tokens in ((256, 65536), (256, 8192), (64, 2048)):
        warmed = set(torch_encoder.warm_shapes(max_rows, max_tokens))
        seen = set()
        for _ in range(200):
            # Sentences and passages in any mix, as the step's formed batches hold them.
            lengths = [rng.choice((rng.randint(3, 30), rng.randint(30, 256))) for _ in range(
                rng.randint(1, max_rows))]  # fmt: skip
            for run in padding.sub_batches(lengths, max_tokens, run_cost=rng.choice((16, 8192))):
                longest = max(lengths[i] for i in run)
                seen.add(torch_encoder.padded_shape(len(run), longest, max_rows))
        assert seen <= warmed, sorted(seen - warmed)
        assert len(seen) >= len(warmed) // 2  # the warmed shapes are ones runs do take
    # A tight token budget leaves out what no run reaches: 128 texts of 129+ word pieces.
    assert (128, 256) not in torch_encoder.warm_shapes(256, 8192)
    assert (1, 256) in torch_encoder.warm_shapes(256, 8192)  # one long text is always a run


@pytest.fixture(scope="module")
def engine():
    return engines.open_engine(
        MODEL_REPOSITORY / embedding.ENCODER / "1" / "model.onnx",
        [embedding.EMBEDDING],
        {"max_batch_tokens": "4096"},
        runtime="torch",
        max_rows=64,
    )


def test_the_torch_encoder_gives_the_graph_s_vectors_whatever_its_padding(engine, encoder_onnx):
    """fp32 on a CPU: the pinned package's weights, the exported graph's vectors; rows and
    positions added to reach a bucket change no text's vector."""
    assert (engine.runtime, engine.numerics, engine.device) == ("torch", "torch float32", "cpu")
    assert engine.source == minilm_weights.model_zip()
    sample = [*text_samples.SENTENCES[:3], text_samples.LONG_TEXT]
    tokens, _ = tokenization.encode(sample)
    ids, mask = padding.pad(tokens[:3], max(map(len, tokens[:3])))  # 3 rows of 15: to 4 x 16
    assert torch_encoder.padded_shape(*ids.shape, engine.max_rows) == (4, 16)
    (padded,) = engine({embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask})
    exact = engine._run(ids, mask)
    np.testing.assert_allclose(padded, exact, atol=2e-6)
    vectors, _ = padding.encode_sorted(
        lambda i, m: engine({embedding.INPUT_IDS: i, embedding.ATTENTION_MASK: m})[0], tokens
    )
    want = onnx_embeddings(encoder_onnx[0], sample)
    np.testing.assert_allclose(vectors, want, atol=1e-5)


def test_a_padded_row_is_never_masked_whole(engine, monkeypatch):
    seen = []
    monkeypatch.setattr(engine, "_run", lambda ids, mask: seen.append(mask) or np.zeros((8, 384)))
    ids, mask = padding.pad([[101, 2000, 102]] * 5, 3)
    (out,) = engine({embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask})
    (fed,) = seen
    assert fed.shape == (8, 16) and out.shape == (5, 384)
    assert (fed.sum(1) > 0).all() and fed[5:].sum() == 3


def test_the_torch_runtime_reads_a_compact_copy_relative_to_the_model_repository(
    tmp_path, monkeypatch
):
    calls = []
    monkeypatch.setattr(
        torch_encoder.bert, "load_pretrained", lambda w=None: calls.append(w) or _tiny()
    )
    graph = tmp_path / "repo" / embedding.ENCODER / "1" / "model.onnx"
    opened = engines.open_engine(
        graph, [embedding.EMBEDDING], {"weights": "encoder/minilm.safetensors"}, "torch"
    )
    assert calls == [tmp_path / "repo" / "encoder" / "minilm.safetensors"]
    assert opened.source == calls[0]
    engines.open_engine(graph, [embedding.EMBEDDING], {"weights": "/abs/w.safetensors"}, "torch")
    assert calls[-1].as_posix() == "/abs/w.safetensors"
    # Not the text encoder's output: the torch runtime has nothing to run.
    with pytest.raises(ValueError, match="torch runs the text encoder only"):
        engines.open_engine(graph, ["LOGITS"], {}, "torch")


def _tiny():
    return torch.nn.Identity()


def test_the_torch_runtime_takes_its_cpu_threads_from_the_config(tmp_path, monkeypatch):
    """As onnxruntime's sessions do: a thread per core spins on cores that others hold."""
    calls = []
    monkeypatch.setattr(torch_encoder.bert, "load_pretrained", lambda w=None: _tiny())
    monkeypatch.setattr(torch_encoder.torch, "set_num_threads", calls.append)
    graph = tmp_path / "repo" / embedding.ENCODER / "1" / "model.onnx"
    engines.open_engine(graph, [embedding.EMBEDDING], {"intra_op_thread_count": "1"}, "torch")
    engines.open_engine(graph, [embedding.EMBEDDING], {}, "torch")  # torch's own default
    assert calls == [1]


def test_the_cache_keys_each_weights_file_and_precision_apart(engine, encoder_onnx):
    args = {"model_version": "1", "model_config": model_config_json()}
    params = {"text_cache_bytes": str(1 << 20)}
    onnx = engines.open_engine(encoder_onnx[0], [embedding.EMBEDDING], {})
    digests = {
        "onnxruntime": text_model.text_cache_for(args, params, onnx).keyspace.digest(),
        "torch fp32": text_model.text_cache_for(args, params, engine).keyspace.digest(),
    }
    half = torch_encoder.TorchEngine(engine.source, engine.model, "cpu", torch.float16, 64)
    digests["torch fp16"] = text_model.text_cache_for(args, params, half).keyspace.digest()
    other = torch_encoder.TorchEngine(encoder_onnx[1], engine.model, "cpu", torch.float32, 64)
    digests["other weights"] = text_model.text_cache_for(args, params, other).keyspace.digest()
    assert len(set(digests.values())) == len(digests)


def test_tokenize_encode_on_gpu_local_runs_torch_and_refuses_bad_text_alone(encoder_onnx):
    """The gpu-local step on a CPU instance: the torch encoder in fp32, each request answered."""
    model = load(embedding.TOKENIZE_ENCODE, config_name="gpu-local")
    assert isinstance(model.engine, torch_encoder.TorchEngine)
    config = json.loads(model_config_json())
    assert model.engine.max_rows == config["max_batch_size"] > embedding.MAX_TEXTS
    short, passage = "A man is eating food.", " ".join(text_samples.SENTENCES)
    responses = model.execute(
        [
            request(TEXT=texts(passage, short)),
            request(TEXT=texts(b"")),
            request(TEXT=texts(text_samples.LONG_TEXT)),  # over 256 word pieces, not to be cut
            request(TEXT=texts(short)),
        ]
    )
    want = onnx_embeddings(encoder_onnx[0], [passage, short])
    np.testing.assert_allclose(output(responses[0], embedding.EMBEDDING), want, atol=1e-5)
    assert failed(responses[1], INVALID, "empty text")
    assert failed(responses[2], INVALID, "text too long")
    np.testing.assert_allclose(output(responses[3], embedding.EMBEDDING), want[1:], atol=1e-5)


def model_config_json() -> str:
    import model_config

    config = model_config.resolve(MODEL_REPOSITORY / embedding.TOKENIZE_ENCODE, "gpu-local")
    return model_config.to_json(config)


def test_a_copy_of_the_tokenizer_stands_in_for_the_package_and_no_other_file(tmp_path):
    copy, other = tmp_path / "tokenizer.json", tmp_path / "other.json"
    copy.write_bytes(minilm_weights.read_member("tokenizer.json"))
    tok = tokenization.tokenizer(str(copy))
    assert tok is not tokenization.tokenizer()  # read from the copy, not the package
    assert tokenization.encode_counted(
        ["A man is eating food."], tok
    ) == tokenization.encode_counted(["A man is eating food."])
    other.write_bytes(copy.read_bytes().replace(b'"[UNK]"', b'"[UNKNOWN]"', 1))
    with pytest.raises(ValueError, match=r"sha256 \w+ != pinned"):
        tokenization.tokenizer_json(str(other))
