"""Every Python-backend model's ``execute()``, in-process, against the stand-in pb_utils.

One mixed batch per model: good requests of different sizes and shapes, a bad input in one
request, a cancelled request and an empty one. Each request gets its own response, in order;
the bad and cancelled ones fail alone; the good ones equal the plain functions' results.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import triton_python_backend_utils as pb_utils

from export import model_config, samples
from pipelines import classification as cspec
from pipelines import embedding as espec
from pipelines import image
from server.launcher import MODEL_REPOSITORY

INVALID, CANCELLED = pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.CANCELLED


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


def test_preprocess_decodes_the_batch_once_and_fails_only_the_bad_request():
    model = load(cspec.PREPROCESS)
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
    reference, _ = image.preprocess_batch(
        [samples.photo_bytes(n) for n in ("chelsea", "coffee", "astronaut")]
    )
    np.testing.assert_array_equal(output(responses[0], cspec.PIXELS), reference[:1])
    assert failed(responses[1], INVALID, f"{cspec.IMAGE}[0]")
    assert failed(responses[2], INVALID, f"{cspec.IMAGE} is empty")
    assert failed(responses[3], CANCELLED, "cancelled")
    np.testing.assert_array_equal(output(responses[4], cspec.PIXELS), reference[1:])
    # The steps' own metrics saw both refusals and every image given.
    assert model.metrics.series["images"].value == 4


def test_postprocess_runs_top_k_once_with_each_requests_own_k():
    model = load(cspec.POSTPROCESS)
    rng = np.random.default_rng(0)
    logits = [rng.normal(size=(n, cspec.NUM_CLASSES)).astype(np.float32) for n in (1, 2, 1, 1)]
    k = lambda v: np.array([[v]], dtype=np.int32)  # noqa: E731
    responses = model.execute(
        [
            request(LOGITS=logits[0], TOP_K=k(1)),
            request(LOGITS=logits[1]),  # the config's default k
            request(LOGITS=logits[2], TOP_K=k(0)),  # out of range
            request(cancelled=True, LOGITS=logits[3], TOP_K=k(3)),
            request(LOGITS=np.zeros((0, cspec.NUM_CLASSES), np.float32), TOP_K=k(3)),
        ]
    )
    ids, _ = cspec.top_k(logits[0], 1)
    np.testing.assert_array_equal(output(responses[0], cspec.CLASS_IDS), ids)
    assert output(responses[1], cspec.CLASS_IDS).shape == (2, model.default_k)
    np.testing.assert_array_equal(
        output(responses[1], cspec.CLASS_IDS), cspec.top_k(logits[1], model.default_k)[0]
    )
    assert failed(responses[2], INVALID, f"{cspec.TOP_K} must be between 1")
    assert failed(responses[3], CANCELLED, "cancelled")
    assert failed(responses[4], INVALID, f"{cspec.LOGITS} is empty")


def texts(*items) -> np.ndarray:
    return np.array([t.encode() if isinstance(t, str) else t for t in items], np.object_).reshape(
        -1, 1
    )


def test_tokenize_pads_each_request_to_its_own_bucket_and_refuses_bad_text():
    model = load(espec.TOKENIZE)
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
    ids, mask = espec.tokenize([short])
    np.testing.assert_array_equal(output(responses[0], espec.INPUT_IDS), ids)
    np.testing.assert_array_equal(output(responses[0], espec.ATTENTION_MASK), mask)
    assert failed(responses[1], INVALID, f"{espec.TEXT}[1]")
    long_ids, _ = espec.tokenize([long_, short])
    np.testing.assert_array_equal(output(responses[2], espec.INPUT_IDS), long_ids)
    assert output(responses[2], espec.INPUT_IDS).shape[1] > ids.shape[1]
    assert failed(responses[3], INVALID, "no texts in the request")
    assert failed(responses[4], CANCELLED, "cancelled")


@pytest.fixture(scope="module")
def classifier(classifier_onnx):
    return load(cspec.CLASSIFIER)


def test_classifier_runs_the_batch_once_and_isolates_a_request_that_breaks_it(classifier):
    from bench.reference import ReferenceClassifier

    pixels, _ = image.preprocess_batch([samples.photo_bytes(n) for n in ("chelsea", "coffee")])
    wrong = np.zeros((1, 3, 224, 200), np.float32)  # its own shape group, which cannot run
    responses = classifier.execute(
        [
            request(PIXELS=pixels[:1]),
            request(PIXELS=wrong),
            request(cancelled=True, PIXELS=pixels[1:]),
            request(PIXELS=pixels),
        ]
    )
    reference = ReferenceClassifier(MODEL_REPOSITORY / cspec.CLASSIFIER / "1" / "model.onnx")
    want = reference.logits(pixels)
    np.testing.assert_allclose(output(responses[0], cspec.LOGITS), want[:1], atol=1e-4)
    assert failed(responses[1], INVALID, "model failed")
    assert failed(responses[2], CANCELLED, "cancelled")
    np.testing.assert_allclose(output(responses[3], cspec.LOGITS), want, atol=1e-4)


def test_encoder_runs_each_sequence_length_once_and_pools_real_tokens_only(encoder_onnx):
    model = load(espec.ENCODER)
    texts = ["A man is eating food.", "A man rides a horse."]
    ids16, mask16 = espec.tokenize(texts)
    ids32, mask32 = espec.pad(espec.encode(texts[:1])[0], length=32)
    ids_long, mask_long = espec.tokenize(["word " * 40])
    responses = model.execute(
        [
            request(INPUT_IDS=ids16[:1], ATTENTION_MASK=mask16[:1]),
            request(INPUT_IDS=ids_long, ATTENTION_MASK=mask_long),
            request(INPUT_IDS=ids16[1:], ATTENTION_MASK=mask16[1:]),
            request(INPUT_IDS=ids32, ATTENTION_MASK=mask32),
        ]
    )
    together = model.run([{espec.INPUT_IDS: ids16, espec.ATTENTION_MASK: mask16}])[0]
    first, second = output(responses[0], espec.EMBEDDING), output(responses[2], espec.EMBEDDING)
    np.testing.assert_allclose(first, together[espec.EMBEDDING][:1], atol=1e-5)
    np.testing.assert_allclose(second, together[espec.EMBEDDING][1:], atol=1e-5)
    assert output(responses[1], espec.EMBEDDING).shape == (1, espec.HIDDEN_SIZE)
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
    # More padding, same vector: the graph's pooling reads the mask.
    np.testing.assert_allclose(output(responses[3], espec.EMBEDDING), first, atol=1e-5)


def test_embed_graph_runs_texts_of_every_request_at_once_and_refuses_bad_text(encoder_onnx):
    model = load(espec.GRAPH_ENSEMBLE)
    short, long_ = "A man is eating food.", "Ünïcödé, accents and emoji 🚀 " * 30
    responses = model.execute(
        [
            request(TEXT=texts(short)),
            request(TEXT=texts(short, b"\xff\xfe not UTF-8")),
            request(TEXT=texts(long_, short)),
            request(TEXT=texts(b"")),
            request(cancelled=True, TEXT=texts(short)),
        ]
    )
    from export.minilm import onnx_embeddings

    want = onnx_embeddings(encoder_onnx[0], [short, long_])
    np.testing.assert_allclose(output(responses[0], espec.EMBEDDING), want[:1], atol=1e-5)
    assert failed(responses[1], INVALID, f"{espec.TEXT}[1]: not UTF-8")
    np.testing.assert_allclose(output(responses[2], espec.EMBEDDING), want[[1, 0]], atol=1e-5)
    assert failed(responses[3], INVALID, "empty text")
    assert failed(responses[4], CANCELLED, "cancelled")


def test_torch_classifier_runs_the_batch_once_and_isolates_a_request_that_breaks_it():
    """The gpu-local runner (PyTorch), here on a CPU instance; tensors leave through DLPack."""
    from bench.reference import ReferenceClassifier

    model = load(cspec.CLASSIFIER, config_name="gpu-local")
    pixels, _ = image.preprocess_batch([samples.photo_bytes(n) for n in ("chelsea", "coffee")])
    responses = model.execute(
        [
            request(PIXELS=pixels[:1]),
            request(PIXELS=np.zeros((1, 4, 224, 224), np.float32)),  # 4 channels: the pass fails
            request(cancelled=True, PIXELS=pixels[1:]),
            request(PIXELS=pixels),
        ]
    )
    want = ReferenceClassifier(MODEL_REPOSITORY / cspec.CLASSIFIER / "1" / "model.onnx").logits(
        pixels
    )
    np.testing.assert_allclose(output(responses[0], cspec.LOGITS), want[:1], atol=1e-3)
    assert failed(responses[1], INVALID, "model failed")
    assert failed(responses[2], CANCELLED, "cancelled")
    np.testing.assert_allclose(output(responses[3], cspec.LOGITS), want, atol=1e-3)
