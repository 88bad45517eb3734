"""Every Python-backend model's ``execute()``, in-process, against the stand-in pb_utils.

One mixed batch per model: good requests of different sizes and shapes, a bad input in one
request, a cancelled request and an empty one. Each request gets its own response, in order;
the bad and cancelled ones fail alone; the good ones equal the plain functions' results. Where
a test says "once", it counts the calls of the function doing the work and the batch each saw:
equal outputs alone would also come from running every request by itself.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import triton_python_backend_utils as pb_utils

import model_config
from export import samples
from paths import MODEL_REPOSITORY
from pipelines import classification, embedding, image, imagenet, onnx_runner, padding, tokenization

INVALID, CANCELLED = pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.CANCELLED
INTERNAL = pb_utils.TritonError.INTERNAL


class Calls:
    """Wraps ``fn``: counts its calls and records the batch size each call saw (``sizes``)."""

    def __init__(self, fn, size):
        self.fn, self.size, self.sizes = fn, size, []

    def __call__(self, *args, **kwargs):
        self.sizes.append(self.size(*args, **kwargs))
        return self.fn(*args, **kwargs)


def counted(monkeypatch, owner, name: str, size) -> Calls:
    """Replace ``owner.name`` with a counting wrapper for this test."""
    calls = Calls(getattr(owner, name), size)
    monkeypatch.setattr(owner, name, calls)
    return calls


def onnx_runs(monkeypatch) -> Calls:
    """Every onnxruntime run of a Python-backend ONNX model: (rows, non-batch dims) of its feed."""

    def size(session, feeds, outputs):
        first = next(iter(feeds.values()))
        return len(first), tuple(first.shape[1:])

    return counted(monkeypatch, onnx_runner, "run", size)


def load(name: str, version: str = "1", config_name: str = "local"):
    """The model's TritonPythonModel, initialized as the stub would on a CPU instance."""
    config = model_config.resolve(MODEL_REPOSITORY / name, config_name)
    args = {
        "model_config": model_config.to_json(config),
        "model_name": name,
        "model_version": version,
        "model_repository": str(MODEL_REPOSITORY / name),
        "model_instance_kind": "CPU",
        "model_instance_device_id": "0",
        "model_instance_name": f"{name}_0_0",
    }
    path = MODEL_REPOSITORY / name / version / "model.py"
    spec = importlib.util.spec_from_file_location(f"model_{name}_{version}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.initialize(args)
    return model


def request(cancelled: bool = False, **tensors) -> pb_utils.InferenceRequest:
    return pb_utils.InferenceRequest(
        [pb_utils.Tensor(k, v) for k, v in tensors.items()], cancelled=cancelled
    )


def output(response, name: str) -> np.ndarray:
    assert not response.has_error(), response.error().message()
    return pb_utils.get_output_tensor_by_name(response, name).as_numpy()


def failed(response, code: int, text: str) -> bool:
    return (
        response.has_error()
        and response.error().code() == code
        and text in (response.error().message())
    )


def images(*names: str) -> np.ndarray:
    return np.array([samples.photo_bytes(n) for n in names], dtype=np.object_).reshape(-1, 1)


def test_preprocess_decodes_the_batch_once_and_fails_only_the_bad_request(monkeypatch):
    model = load(classification.PREPROCESS)
    decodes = counted(monkeypatch, model, "_pixels", len)
    empty = np.zeros((0, 1), dtype=np.object_)
    responses = model.execute(
        [
            request(IMAGE=images("chelsea")),
            request(IMAGE=np.array([[b"not an image"]], dtype=np.object_)),
            request(IMAGE=empty),
            request(cancelled=True, IMAGE=images("coffee")),
            request(IMAGE=images("coffee", "astronaut")),
        ]
    )
    assert len(responses) == 5
    # One decode pass over every image of the live requests, the undecodable one included.
    assert decodes.sizes == [4]
    reference, _ = image.preprocess_batch(
        [samples.photo_bytes(n) for n in ("chelsea", "coffee", "astronaut")]
    )
    np.testing.assert_array_equal(output(responses[0], classification.PIXELS), reference[:1])
    assert failed(responses[1], INVALID, f"{classification.IMAGE}[0]")
    assert failed(responses[2], INVALID, f"{classification.IMAGE} is empty")
    assert failed(responses[3], CANCELLED, "cancelled")
    np.testing.assert_array_equal(output(responses[4], classification.PIXELS), reference[1:])
    # The steps' own metrics saw both refusals and every image given.
    assert model.metrics.series["images"].value == 4


def test_postprocess_runs_top_k_once_with_each_requests_own_k(monkeypatch):
    model = load(classification.POSTPROCESS)
    top_k = counted(monkeypatch, imagenet, "top_k", lambda logits, k: (len(logits), k))
    rng = np.random.default_rng(0)
    logits = [
        rng.normal(size=(n, classification.NUM_CLASSES)).astype(np.float32) for n in (1, 2, 1, 1)
    ]
    k = lambda v: np.array([[v]], dtype=np.int32)  # noqa: E731
    responses = model.execute(
        [
            request(LOGITS=logits[0], TOP_K=k(1)),
            request(LOGITS=logits[1]),  # the config's default k
            request(LOGITS=logits[2], TOP_K=k(0)),  # out of range
            request(cancelled=True, LOGITS=logits[3], TOP_K=k(3)),
            request(LOGITS=np.zeros((0, classification.NUM_CLASSES), np.float32), TOP_K=k(3)),
        ]
    )
    # One top-k over both live requests' 3 rows, with the larger of their k.
    assert top_k.sizes == [(3, max(1, model.default_k))]
    ids, _ = imagenet.top_k(logits[0], 1)
    np.testing.assert_array_equal(output(responses[0], classification.CLASS_IDS), ids)
    assert output(responses[1], classification.CLASS_IDS).shape == (2, model.default_k)
    np.testing.assert_array_equal(
        output(responses[1], classification.CLASS_IDS),
        imagenet.top_k(logits[1], model.default_k)[0],
    )
    assert failed(responses[2], INVALID, f"{classification.TOP_K} must be between 1")
    assert failed(responses[3], CANCELLED, "cancelled")
    assert failed(responses[4], INVALID, f"{classification.LOGITS} is empty")


def test_fused_classify_runs_the_model_once_on_decoded_images_and_answers_as_classify(
    monkeypatch, classifier_onnx
):
    from bench.harness.reference import ReferenceClassifier

    model = load(classification.FUSED)
    runs = onnx_runs(monkeypatch)
    k = lambda v: np.array([[v]], dtype=np.int32)  # noqa: E731
    responses = model.execute(
        [
            request(IMAGE=images("chelsea"), TOP_K=k(3)),
            request(IMAGE=np.array([[b"not an image"]], dtype=np.object_)),
            request(IMAGE=images("coffee"), TOP_K=k(0)),  # out of range
            request(cancelled=True, IMAGE=images("flower")),
            request(IMAGE=images("coffee", "astronaut")),  # the config's default k
        ]
    )
    # One model run, over the three images of the two good requests only.
    assert runs.sizes == [
        (3, (classification.CHANNELS, classification.IMAGE_SIZE, classification.IMAGE_SIZE))
    ]
    reference = ReferenceClassifier(classifier_onnx)
    expected = [
        (responses[0], ("chelsea",), 3),
        (responses[4], ("coffee", "astronaut"), classification.DEFAULT_TOP_K),
    ]
    for response, names, top in expected:
        labels, scores, ids = reference.classify([samples.photo_bytes(n) for n in names], top)
        np.testing.assert_array_equal(output(response, classification.CLASS_IDS), ids)
        np.testing.assert_allclose(output(response, classification.SCORES), scores, rtol=1e-5)
        assert output(response, classification.LABELS).tolist() == labels.tolist()
    assert failed(responses[1], INVALID, f"{classification.IMAGE}[0]: not an image")
    assert failed(responses[2], INVALID, f"{classification.TOP_K} must be between 1")
    assert failed(responses[3], CANCELLED, "cancelled")
    # Its decode failures and images count as preprocess's do, under its own name.
    assert model.metrics.series["images"].value == 4


def texts(*items) -> np.ndarray:
    return np.array([t.encode() if isinstance(t, str) else t for t in items], np.object_).reshape(
        -1, 1
    )


def test_tokenize_pads_each_request_to_its_own_bucket_and_refuses_bad_text(monkeypatch):
    model = load(embedding.TOKENIZE)
    encodes = counted(monkeypatch, tokenization, "encode_counted", lambda texts, *_: len(texts))
    short, long_ = "A man is eating food.", "word " * 40
    responses = model.execute(
        [
            request(TEXT=texts(short)),
            request(TEXT=texts(short, b"\xff\xfe not UTF-8")),
            request(TEXT=texts(long_, short)),
            request(TEXT=np.zeros((0, 1), np.object_)),
            request(cancelled=True, TEXT=texts(short)),
        ]
    )
    assert encodes.sizes == [3]  # one tokenizer call for the 3 texts of the 2 good requests
    ids, mask = padding.tokenize([short])
    np.testing.assert_array_equal(output(responses[0], embedding.INPUT_IDS), ids)
    np.testing.assert_array_equal(output(responses[0], embedding.ATTENTION_MASK), mask)
    assert failed(responses[1], INVALID, f"{embedding.TEXT}[1]")
    long_ids, _ = padding.tokenize([long_, short])
    np.testing.assert_array_equal(output(responses[2], embedding.INPUT_IDS), long_ids)
    assert output(responses[2], embedding.INPUT_IDS).shape[1] > ids.shape[1]
    # TOKENS: each text's own word pieces, not its padded length.
    counts = [[len(t)] for t in tokenization.encode([long_, short])[0]]
    np.testing.assert_array_equal(output(responses[2], embedding.TOKENS), counts)
    assert output(responses[0], embedding.TOKENS).tolist() == [[int(mask.sum())]]
    assert failed(responses[3], INVALID, "no texts in the request")
    assert failed(responses[4], CANCELLED, "cancelled")


@pytest.fixture(scope="module")
def classifier(classifier_onnx):
    return load(classification.CLASSIFIER)


def test_classifier_runs_the_batch_once_and_isolates_a_request_that_breaks_it(
    classifier, monkeypatch
):
    from bench.harness.reference import ReferenceClassifier

    pixels, _ = image.preprocess_batch([samples.photo_bytes(n) for n in ("chelsea", "coffee")])
    wrong = np.zeros((1, 3, 224, 200), np.float32)  # its own shape group, which cannot run
    runs = onnx_runs(monkeypatch)
    responses = classifier.execute(
        [
            request(PIXELS=pixels[:1]),
            request(PIXELS=wrong),
            request(cancelled=True, PIXELS=pixels[1:]),
            request(PIXELS=pixels),
        ]
    )
    # One run for the 3 good rows, one (failing) for the odd shape; nothing for the cancelled.
    assert runs.sizes == [(3, (3, 224, 224)), (1, (3, 224, 200))]
    reference = ReferenceClassifier(
        MODEL_REPOSITORY / classification.CLASSIFIER / "1" / "model.onnx"
    )
    want = reference.logits(pixels)
    np.testing.assert_allclose(output(responses[0], classification.LOGITS), want[:1], atol=1e-4)
    # The model failed, not the request's encoding: INTERNAL, with the model's name.
    assert failed(responses[1], INTERNAL, f"model {classification.CLASSIFIER} failed")
    assert failed(responses[2], CANCELLED, "cancelled")
    np.testing.assert_allclose(output(responses[3], classification.LOGITS), want, atol=1e-4)


def test_encoder_runs_each_sequence_length_once_and_pools_real_tokens_only(
    encoder_onnx, monkeypatch
):
    model = load(embedding.ENCODER)
    texts = ["A man is eating food.", "A man rides a horse."]
    ids16, mask16 = padding.tokenize(texts)
    ids32, mask32 = padding.pad(tokenization.encode(texts[:1])[0], length=32)
    ids_long, mask_long = padding.tokenize(["word " * 40])
    runs = onnx_runs(monkeypatch)
    responses = model.execute(
        [
            request(INPUT_IDS=ids16[:1], ATTENTION_MASK=mask16[:1]),
            request(INPUT_IDS=ids_long, ATTENTION_MASK=mask_long),
            request(INPUT_IDS=ids16[1:], ATTENTION_MASK=mask16[1:]),
            request(INPUT_IDS=ids32, ATTENTION_MASK=mask32),
        ]
    )
    # One run per sequence length, in the order each length first came.
    assert runs.sizes == [(2, (16,)), (1, ids_long.shape[1:]), (1, (32,))]
    together = model.run([{embedding.INPUT_IDS: ids16, embedding.ATTENTION_MASK: mask16}])[0]
    first, second = (
        output(responses[0], embedding.EMBEDDING),
        output(responses[2], embedding.EMBEDDING),
    )
    np.testing.assert_allclose(first, together[embedding.EMBEDDING][:1], atol=1e-5)
    np.testing.assert_allclose(second, together[embedding.EMBEDDING][1:], atol=1e-5)
    assert output(responses[1], embedding.EMBEDDING).shape == (1, embedding.HIDDEN_SIZE)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    # More padding, same vector: the graph's pooling reads the mask.
    np.testing.assert_allclose(output(responses[3], embedding.EMBEDDING), first, atol=1e-5)


def test_embed_graph_runs_texts_of_every_request_at_once_and_refuses_bad_text(
    encoder_onnx, monkeypatch
):
    model = load(embedding.GRAPH_ENSEMBLE)
    short, long_ = "A man is eating food.", "Ünïcödé, accents and emoji 🚀 " * 30
    runs = onnx_runs(monkeypatch)
    responses = model.execute(
        [
            request(TEXT=texts(short)),
            request(TEXT=texts(short, b"\xff\xfe not UTF-8")),
            request(TEXT=texts(long_, short)),
            request(TEXT=texts(b"")),
            request(cancelled=True, TEXT=texts(short)),
        ]
    )
    assert runs.sizes == [(3, (1,))]  # one run for the 3 texts of the 2 good requests
    from export.minilm import onnx_embeddings

    want = onnx_embeddings(encoder_onnx[0], [short, long_])
    np.testing.assert_allclose(output(responses[0], embedding.EMBEDDING), want[:1], atol=1e-5)
    assert failed(responses[1], INVALID, f"{embedding.TEXT}[1]: not UTF-8")
    np.testing.assert_allclose(output(responses[2], embedding.EMBEDDING), want[[1, 0]], atol=1e-5)
    assert failed(responses[3], INVALID, "empty text")
    assert failed(responses[4], CANCELLED, "cancelled")


def test_tokenize_encode_sorts_every_text_of_the_batch_and_refuses_bad_text(
    encoder_onnx, monkeypatch
):
    model = load(embedding.TOKENIZE_ENCODE)
    short, other, passage = "A man is eating food.", "A monkey is playing drums.", "word " * 120
    encodes = counted(monkeypatch, tokenization, "encode_counted", lambda texts, *_: len(texts))
    runs = onnx_runs(monkeypatch)
    responses = model.execute(
        [
            request(TEXT=texts(passage, short)),
            request(TEXT=texts(short, b"\xff\xfe not UTF-8")),
            request(TEXT=texts(other)),
            request(TEXT=texts(b"")),
            request(cancelled=True, TEXT=texts(short)),
        ]
    )
    assert encodes.sizes == [3]  # one tokenizer call for the 3 texts of the 2 good requests
    # Sorted into two runs: the sentences of both requests together, the passage alone, each
    # padded to its own longest text (no bucket).
    (long_ids, short_ids, other_ids), _ = tokenization.encode([passage, short, other])
    assert runs.sizes == [(2, (len(other_ids),)), (1, (len(long_ids),))]
    from export.minilm import onnx_embeddings

    want = onnx_embeddings(encoder_onnx[0], [passage, short, other])
    np.testing.assert_allclose(output(responses[0], embedding.EMBEDDING), want[:2], atol=1e-5)
    assert failed(responses[1], INVALID, f"{embedding.TEXT}[1]: not UTF-8")
    np.testing.assert_allclose(output(responses[2], embedding.EMBEDDING), want[2:], atol=1e-5)
    # Each request's TOKENS are its own texts' word pieces, in its order (not the sort's).
    assert output(responses[0], embedding.TOKENS).tolist() == [[len(long_ids)], [len(short_ids)]]
    assert output(responses[2], embedding.TOKENS).tolist() == [[len(other_ids)]]
    assert failed(responses[3], INVALID, "empty text")
    assert failed(responses[4], CANCELLED, "cancelled")
    real = len(long_ids) + len(short_ids) + len(other_ids)
    assert model.metrics.series["tokens"].value == real
    assert model.metrics.series["padded"].value == 2 * len(other_ids) + len(long_ids)
    # Version 2 opens the encoder's INT8 graph.
    int8 = load(embedding.TOKENIZE_ENCODE, version="2")
    assert int8.engine.source == MODEL_REPOSITORY / embedding.ENCODER / "2" / "model.onnx"


def test_tokenize_encode_answers_seen_texts_from_its_cache_and_encodes_a_repeat_once(
    encoder_onnx, monkeypatch
):
    model = load(embedding.TOKENIZE_ENCODE)
    runs = onnx_runs(monkeypatch)
    first = model.execute([request(TEXT=texts("seen before", "once")), request(TEXT=texts("once"))])
    # "once" twice in one batch: encoded once (one run of the two distinct texts).
    assert [rows for rows, _ in runs.sizes] == [2]
    again = model.execute([request(TEXT=texts("once", "seen before"))])
    assert len(runs.sizes) == 1  # nothing new: no encoder run at all
    for name in (embedding.EMBEDDING, embedding.TOKENS):
        np.testing.assert_array_equal(output(again[0], name), output(first[0], name)[::-1])
        np.testing.assert_array_equal(output(first[1], name), output(first[0], name)[1:])
    cache = model.cache_metrics.series
    assert (cache["local"].value, cache["redis"].value, cache["misses"].value) == (2, 0, 2)


def test_tokenize_encode_calls_the_served_encoder_through_bls_in_pieces_it_takes(encoder_onnx):
    """The GPU configs' step: the encoder Triton serves (a TensorRT engine there), via BLS."""
    from export.minilm import onnx_embeddings

    encoder = onnx_runner.create_session(encoder_onnx[0])
    calls = []

    def served_encoder(bls):
        ids, mask = (pb_utils.get_input_tensor_by_name(bls, n).as_numpy()
                     for n in (embedding.INPUT_IDS, embedding.ATTENTION_MASK))  # fmt: skip
        calls.append((bls.model_name, bls.model_version, len(ids)))
        feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
        vectors = onnx_runner.run(encoder, feeds, [embedding.EMBEDDING])[0]
        return pb_utils.InferenceResponse([pb_utils.Tensor(embedding.EMBEDDING, vectors)])

    pb_utils.BLS_MODELS[embedding.ENCODER] = served_encoder
    try:
        model = load(embedding.TOKENIZE_ENCODE, config_name="gpu")
        many = [f"sentence number {i:03d}" for i in range(70)]  # one length: one sub-batch
        (response,) = model.execute([request(TEXT=texts(*many))])
    finally:
        del pb_utils.BLS_MODELS[embedding.ENCODER]
    # The encoder takes 64 rows at most: the sub-batch of 70 went as 64 and 6.
    assert calls == [(embedding.ENCODER, 1, 64), (embedding.ENCODER, 1, 6)]
    want = onnx_embeddings(encoder_onnx[0], many)
    np.testing.assert_allclose(output(response, embedding.EMBEDDING), want, atol=1e-5)


def test_texts_as_batch_makes_rows_of_a_1d_batch_and_refuses_none_or_too_many():
    model = load(embedding.TEXT_ROWS)
    batch = np.array([b"first", b"second", b"third"], dtype=np.object_)
    too_many = np.array([b"t"] * (embedding.MAX_TEXTS + 1), dtype=np.object_)
    responses = model.execute(
        [
            request(**{embedding.TEXTS: batch}),
            request(**{embedding.TEXTS: np.zeros(0, np.object_)}),
            request(**{embedding.TEXTS: too_many}),
            request(**{embedding.TEXTS: batch.reshape(-1, 1)}),
            request(cancelled=True, **{embedding.TEXTS: batch}),
            request(**{embedding.TEXTS: batch[:1]}),
        ]
    )
    rows = output(responses[0], embedding.TEXT)
    assert rows.shape == (3, 1) and rows.ravel().tolist() == batch.tolist()
    assert failed(responses[1], INVALID, "holds no texts")
    assert failed(
        responses[2], INVALID, f"{embedding.MAX_TEXTS + 1} texts; at most {embedding.MAX_TEXTS}"
    )
    assert failed(responses[3], INVALID, "must be 1-D [N], got shape [3, 1]")
    assert failed(responses[4], CANCELLED, "cancelled")
    assert output(responses[5], embedding.TEXT).tolist() == [[b"first"]]


def test_torch_classifier_runs_the_batch_once_and_isolates_a_request_that_breaks_it(monkeypatch):
    """The gpu-local runner (PyTorch), here on a CPU instance; tensors leave through DLPack."""
    from bench.harness.reference import ReferenceClassifier

    model = load(classification.CLASSIFIER, config_name="gpu-local")
    passes = counted(monkeypatch, model.runner.classifier, "model", len)
    pixels, _ = image.preprocess_batch([samples.photo_bytes(n) for n in ("chelsea", "coffee")])
    want = ReferenceClassifier(
        MODEL_REPOSITORY / classification.CLASSIFIER / "1" / "model.onnx"
    ).logits(pixels)
    good = [
        request(PIXELS=pixels[:1]),
        request(cancelled=True, PIXELS=pixels[1:]),
        request(PIXELS=pixels),
    ]
    responses = model.execute(good)
    assert passes.sizes == [3]  # one forward pass for the 3 rows of the 2 live requests
    np.testing.assert_allclose(output(responses[0], classification.LOGITS), want[:1], atol=1e-3)
    assert failed(responses[1], CANCELLED, "cancelled")
    np.testing.assert_allclose(output(responses[2], classification.LOGITS), want, atol=1e-3)

    passes.sizes.clear()
    broken = request(PIXELS=np.zeros((1, 4, 224, 224), np.float32))  # 4 channels: cannot run
    responses = model.execute([good[0], broken, good[2]])
    # The batch cannot even be concatenated, so each request runs alone: the 4-channel one
    # fails inside the network, the others succeed.
    assert passes.sizes == [1, 1, 2]
    np.testing.assert_allclose(output(responses[0], classification.LOGITS), want[:1], atol=1e-3)
    assert failed(responses[1], INTERNAL, f"model {classification.CLASSIFIER} failed")
    np.testing.assert_allclose(output(responses[2], classification.LOGITS), want, atol=1e-3)


# A text over the model's 256 word pieces: 400 words, [CLS] and [SEP].
OVER_LONG, OVER_LONG_PIECES = "word " * 400, 402


def flags(*values) -> np.ndarray:
    return np.array(values, dtype=bool).reshape(-1, 1)


@pytest.mark.parametrize("name", [embedding.TOKENIZE, embedding.TOKENIZE_ENCODE])
def test_an_over_long_text_is_refused_by_name_unless_its_request_lets_it_be_cut(name, encoder_onnx):
    model = load(name)
    short = "A man is eating food."
    responses = model.execute(
        [
            request(TEXT=texts(short, OVER_LONG)),  # no TRUNCATE: refused
            request(TEXT=texts(short)),
            request(TEXT=texts(OVER_LONG, short), TRUNCATE=flags(True, False)),
            request(TEXT=texts(short, OVER_LONG), TRUNCATE=flags(True, False)),
            request(TEXT=texts(short), TRUNCATE=flags(True, True)),  # one flag per text
        ]
    )
    limit = embedding.MAX_TOKENS
    message = (
        f"{embedding.TEXT}[1]: text too long: {OVER_LONG_PIECES} word pieces, over the limit "
        f"of {limit}; shorten it, or set {embedding.TRUNCATE} to true to embed its first {limit}"
    )
    assert failed(responses[0], INVALID, message), responses[0].error()
    assert failed(responses[3], INVALID, message)
    assert failed(responses[4], INVALID, f"{embedding.TRUNCATE} has 2 flags for 1 texts")
    # The others of the same batch are answered; the cut text has the model's 256 pieces.
    assert output(responses[1], embedding.TOKENS).tolist() == [[8]]  # 5 words, ".", [CLS], [SEP]
    assert output(responses[2], embedding.TOKENS).tolist() == [[limit], [8]]
    if name == embedding.TOKENIZE_ENCODE:
        from export.minilm import onnx_embeddings

        want = onnx_embeddings(encoder_onnx[0], [OVER_LONG, short])  # cut at 256, as before
        np.testing.assert_allclose(output(responses[2], embedding.EMBEDDING), want, atol=1e-5)
    refused = {reason: series.value for reason, series in model.metrics._failures.items()}
    assert refused == {"too_long": 2, "other": 1}


def test_a_cut_vector_in_the_cache_never_answers_a_text_that_may_not_be_cut(encoder_onnx):
    model = load(embedding.TOKENIZE_ENCODE)
    (cut,) = model.execute([request(TEXT=texts(OVER_LONG), TRUNCATE=flags(True))])
    assert output(cut, embedding.TOKENS).tolist() == [[embedding.MAX_TOKENS]]
    (refused,) = model.execute([request(TEXT=texts(OVER_LONG))])
    assert failed(refused, INVALID, f"text too long: {OVER_LONG_PIECES} word pieces")
    # The reverse: a refused text stores nothing, and a short text is kept under each flag.
    (again,) = model.execute([request(TEXT=texts(OVER_LONG), TRUNCATE=flags(True))])
    vectors = [output(r, embedding.EMBEDDING) for r in (again, cut)]
    np.testing.assert_array_equal(*vectors)
    cache = model.cache_metrics.series
    assert (cache["local"].value, cache["misses"].value) == (1, 2)


def test_texts_as_batch_gives_every_row_the_request_flag():
    model = load(embedding.TEXT_ROWS)
    batch = np.array([b"a", b"b", b"c"], dtype=np.object_)
    with_flag, without, wrong = model.execute(
        [
            request(input_text=batch, TRUNCATE=np.array([True])),
            request(input_text=batch),
            request(input_text=batch, TRUNCATE=np.array([True, False])),
        ]
    )
    assert output(with_flag, embedding.TRUNCATE).tolist() == [[True]] * 3
    assert output(without, embedding.TRUNCATE).tolist() == [[False]] * 3
    assert output(with_flag, embedding.TEXT).shape == (3, 1)
    assert failed(wrong, INVALID, f"{embedding.TRUNCATE} is one flag for all the texts")
