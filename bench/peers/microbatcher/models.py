"""The served models: what the peer runs for each request batch, and their tensor contracts."""

from __future__ import annotations

import abc
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from paths import MODEL_REPOSITORY
from pipelines import classification, embedding, image, imagenet, onnx_runner, padding, tokenization
from pipelines.tensors import Signature, Tensor

MODEL_NAME = classification.CLASSIFIER  # the model served by default
MODEL_VERSION = "1"
DEFAULT_MODEL = MODEL_REPOSITORY / classification.CLASSIFIER / MODEL_VERSION / "model.onnx"
EMBED_MODEL_NAME = embedding.ENSEMBLE
# The fp32 encoder (version 1), as in Triton's "embed" ensemble.
DEFAULT_EMBED_MODEL = MODEL_REPOSITORY / embedding.ENCODER / "1" / "model.onnx"
# Triton's binary tensor extension: the JSON header's length; binary tensors follow it.
HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
SERVER_NAME = "peer-fastapi"
# The KServe v2 extensions implemented here (of the many Triton lists).
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")
# KServe v2 datatypes of the outputs → their model-configuration names.


class InferenceRequestError(ValueError):
    """The request is malformed; the message says what to fix (answered with HTTP 400)."""


class UnknownModelError(LookupError):
    """A model or version this server does not serve (answered with HTTP 404, as Triton does)."""


def _field(mapping: object, key: str, kind: type, where: str, default: object = None):
    if not isinstance(mapping, dict):
        raise InferenceRequestError(f"{where} must be a JSON object")
    value = mapping.get(key, default)
    if value is None and default is None:
        raise InferenceRequestError(f"{where} has no '{key}'")
    if not isinstance(value, kind):
        raise InferenceRequestError(f"'{key}' of {where} must be a {kind.__name__}")
    return value


def _count_error(name: str, count: int, shape: tuple[int, ...]) -> InferenceRequestError:
    return InferenceRequestError(
        f"{name} has {count} values, shape {list(shape)} needs {math.prod(shape)}"
    )


@dataclass(frozen=True)
class Padded:
    """What a batch function over texts returns: its outputs and the token positions it ran.

    The micro-batcher counts both (``ModelStats.tokens``, ``padded_tokens``), so the statistics say
    how much of the encoder's work was padding.
    """

    outputs: np.ndarray  # [rows, ...]
    tokens: int  # real word pieces of the batch's texts
    padded: int  # positions the encoder ran: rows × the length they were padded to


# The served models ------------------------------------------------------------------------
class ServedModel(abc.ABC):
    """One model the peer can serve: its KServe v2 tensors, how to decode them, how to run it.

    Subclasses give the class attributes, the tensor decoders and the batch function; the
    request envelope, batching, statistics and responses are shared.
    """

    name: str
    # The repository's model of that name: its first input is the one the peer takes, its
    # outputs what it answers (dims without the batch dimension, as in config.pbtxt).
    signature: Signature
    max_batch: int  # the default max_batch_size
    default_path: Path  # the ONNX file served when none is given
    # What Triton would run it with: a Python-backend model (pre/post-processing in Python
    # around onnxruntime) unless a subclass serves a bare ONNX graph.
    platform: str = "python"
    backend: str = "python"

    @property
    def taken(self) -> Tensor:
        """The one input the peer takes."""
        return self.signature.inputs[0]

    @property
    def input(self) -> str:
        """The name of the input the peer takes."""
        return self.taken.name

    def check_shape(self, shape: list, max_batch: int) -> tuple[int, ...]:
        """The declared input shape, if it is ``[batch, *input_dims]`` with batch in range.

        Raises:
            InferenceRequestError: the shape is wrong, with the expected one in the message.
        """
        expected = [-1, *self.taken.dims]
        # bool is an int subclass; a shape of [true, 1] is still wrong.
        if not all(type(d) is int for d in shape) or tuple(shape[1:]) != self.taken.dims:
            raise InferenceRequestError(
                f"{self.input} has shape {shape}, the model expects {expected} (batch first)"
            )
        if not 1 <= shape[0] <= max_batch:
            raise InferenceRequestError(
                f"{self.input} batch size {shape[0]} is outside 1..{max_batch} (max_batch_size)"
            )
        return tuple(shape)

    @abc.abstractmethod
    def json_data(self, data: object, shape: tuple[int, ...], convert: bool) -> Any:
        """The batch rows from a JSON ``data`` member.

        Args:
            data: the tensor's ``data`` (flat, or nested as its shape).
            shape: its checked shape.
            convert: False may skip converting the values once their count and types are
                checked (the null model needs only the batch size), and return None.

        Raises:
            InferenceRequestError: the data does not fit the tensor.
        """

    @abc.abstractmethod
    def binary_data(self, chunk: memoryview, shape: tuple[int, ...], convert: bool) -> Any:
        """The batch rows from the tensor's ``binary_data_size`` bytes; as json_data()."""

    @abc.abstractmethod
    def runner(self, session: Any) -> Callable[[Any], np.ndarray]:
        """The batch function over an onnxruntime session: rows in, FP32 [rows, ...] out."""

    @abc.abstractmethod
    def warmup_input(self) -> Any:
        """One row to run before the server says it is ready."""

    def load(self, model_path: Path, intra_op_threads: int) -> Callable[[Any], np.ndarray]:
        """Open the ONNX file and return the warmed-up batch function."""
        session = onnx_runner.create_session(model_path, intra_op_threads=intra_op_threads)
        run_batch = self.runner(session)
        # The first run allocates and plans; do it before the server says it is ready.
        run_batch(self.warmup_input())
        return run_batch

    def output_specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """(name, KServe v2 datatype, dims without the batch) of each output."""
        return [(t.name, t.datatype, t.dims) for t in self.signature.outputs]

    def output_tensors(self, result: np.ndarray) -> list[tuple[str, str, np.ndarray]]:
        """(name, datatype, array) of each output, from a request's rows of the batch result."""
        (output,) = self.signature.outputs  # one FP32 output; ClassifyModel overrides this
        return [(output.name, output.datatype, result)]

    def null_result(self, rows: int) -> np.ndarray:
        """What the null model answers for ``rows`` rows: zeros shaped as the result."""
        (output,) = self.signature.outputs
        return np.zeros((rows, *output.dims), np.float32)

    def metadata(self) -> dict:
        """The model metadata, shaped like Triton's JSON answer."""
        taken = self.taken
        return {
            "name": self.name,
            "versions": [MODEL_VERSION],
            "platform": self.platform,
            "inputs": [
                {"name": self.input, "datatype": taken.datatype, "shape": [-1, *taken.dims]}
            ],
            "outputs": [
                {"name": name, "datatype": datatype, "shape": [-1, *dims]}
                for name, datatype, dims in self.output_specs()
            ],
        }

    def config(self, max_batch: int, max_wait_s: float) -> dict:
        """The model configuration, shaped like Triton's JSON ``/config`` answer.

        As in config.pbtxt, ``dims`` leave out the batch dimension.
        """

        def tensor(t: Tensor) -> dict:
            return {
                "name": t.name,
                "data_type": t.config_type,
                "format": "FORMAT_NONE",
                "dims": list(t.dims),
                "is_shape_tensor": False,
            }

        return {
            "name": self.name,
            "platform": self.platform,
            "backend": self.backend,
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": max_batch,
            "input": [tensor(self.taken)],
            "output": [tensor(t) for t in self.signature.outputs],
            "dynamic_batching": {"max_queue_delay_microseconds": round(max_wait_s * 1e6)},
            "instance_group": [{"name": self.name, "kind": "KIND_CPU", "count": 1}],
            "model_transaction_policy": {"decoupled": False},
            "parameters": {},
        }


class ClassifierModel(ServedModel):
    """The image classifier: PIXELS UINT8 [-1, 3, 224, 224] → LOGITS FP32 [-1, 1000]."""

    name = classification.CLASSIFIER
    signature = classification.SIGNATURES[classification.CLASSIFIER]
    max_batch = 32
    default_path = DEFAULT_MODEL
    platform = "onnxruntime_onnx"
    backend = "onnxruntime"

    def json_data(self, data: object, shape: tuple[int, ...], convert: bool) -> np.ndarray | None:
        """uint8 pixels from JSON numbers (None for flat data when not converting)."""
        if not isinstance(data, list):
            raise InferenceRequestError(f"'data' of {self.input} must be a list of numbers")
        flat = not data or not isinstance(data[0], list)
        # A flat list of the wrong length is rejected before paying for the conversion.
        if flat and len(data) != math.prod(shape):
            raise _count_error(self.input, len(data), shape)
        if flat and not convert:
            return None
        try:
            # No dtype: numpy infers it in C, so strings, booleans and nulls show up as a wrong
            # kind instead of being silently converted to floats (or NaN).
            array = np.asarray(data)
        except ValueError as exc:  # ragged nesting
            raise InferenceRequestError(f"'data' of {self.input} is not a regular array") from exc
        if array.dtype.kind not in "iu" or (array.size and (array.min() < 0 or array.max() > 255)):
            raise InferenceRequestError(f"'data' of {self.input} must hold integers 0-255 (UINT8)")
        if array.size != math.prod(shape) or (array.ndim > 1 and array.shape != shape):
            raise InferenceRequestError(
                f"{self.input} data has shape {list(array.shape)}, declared shape is {list(shape)}"
            )
        return array.astype(np.uint8, copy=False).reshape(shape)

    def binary_data(self, chunk: memoryview, shape: tuple[int, ...], convert: bool) -> np.ndarray:
        """uint8 pixels viewed in the body."""
        nbytes = math.prod(shape)
        if len(chunk) != nbytes:
            raise InferenceRequestError(
                f"{self.input} binary_data_size is {len(chunk)}, shape {list(shape)} in UINT8 "
                f"needs {nbytes} bytes"
            )
        # Zero-copy view of the body; the batcher copies it once into the batch.
        return np.frombuffer(chunk, dtype=np.uint8).reshape(shape)

    def runner(self, session: Any) -> Callable[[np.ndarray], np.ndarray]:
        """Pixels [rows, 3, 224, 224] → logits [rows, 1000], one onnxruntime run."""

        def run_batch(pixels: np.ndarray) -> np.ndarray:
            return onnx_runner.run(
                session, {classification.PIXELS: pixels}, [classification.LOGITS]
            )[0]

        return run_batch

    def warmup_input(self) -> np.ndarray:
        """One black image."""
        return np.zeros((1, *self.taken.dims), np.uint8)


def _json_leaves(name: str, data: object, shape: tuple[int, ...]) -> list:
    """The elements of a flat, or nested as ``shape``, JSON ``data`` list, in row-major order."""
    if not isinstance(data, list):
        raise InferenceRequestError(f"'data' of {name} must be a list")
    if not any(isinstance(x, list) for x in data):
        if len(data) != math.prod(shape):
            raise _count_error(name, len(data), shape)
        return data
    leaves: list = []

    def walk(node: object, dims: tuple[int, ...]) -> None:
        if not dims:
            leaves.append(node)
        elif isinstance(node, list) and len(node) == dims[0]:
            for child in node:
                walk(child, dims[1:])
        else:
            raise InferenceRequestError(
                f"'data' of {name} is not nested as its declared shape {list(shape)}"
            )

    walk(data, shape)
    return leaves


def _bytes_elements(name: str, chunk: memoryview, count: int) -> list[memoryview]:
    """Split Triton's serialized BYTES tensor: per element, a 4-byte LE length, then the bytes."""
    items, offset = [], 0
    for i in range(count):
        if offset + 4 > len(chunk):
            raise InferenceRequestError(
                f"{name} binary data ends at byte {len(chunk)}, before element {i} of {count}"
            )
        (length,) = struct.unpack_from("<I", chunk, offset)
        offset += 4
        if offset + length > len(chunk):
            raise InferenceRequestError(
                f"{name}[{i}] declares {length} bytes, only {len(chunk) - offset} remain in its "
                f"binary_data_size of {len(chunk)}"
            )
        items.append(chunk[offset : offset + length])
        offset += length
    if offset != len(chunk):
        raise InferenceRequestError(
            f"{name} binary_data_size is {len(chunk)}, its {count} elements take {offset} bytes"
        )
    return items


class EmbedModel(ServedModel):
    """The text embedding: TEXT BYTES [-1, 1] → EMBEDDING FP32 [-1, 384], unit vectors.

    Texts are decoded and checked in the request handler, so a bad text is refused with a 400
    naming it before it can join a micro-batch (and fail the requests batched with it).
    """

    name = EMBED_MODEL_NAME
    signature = embedding.SIGNATURES[embedding.ENSEMBLE]
    max_batch = 64
    default_path = DEFAULT_EMBED_MODEL

    def json_data(self, data: object, shape: tuple[int, ...], convert: bool) -> list[str] | None:
        """Texts from JSON strings (None when not converting; their types are still checked)."""
        items = _json_leaves(self.input, data, shape)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                shown = orjson.dumps(item).decode()
                raise InferenceRequestError(f"{self.input}[{i}] must be a string, got {shown[:40]}")
        # orjson already refused invalid UTF-8 (and lone surrogates), so encoding cannot fail;
        # the round trip lets decode_text check empty and blank texts in one place.
        return self._texts([s.encode("utf-8") for s in items]) if convert else None

    def binary_data(
        self, chunk: memoryview, shape: tuple[int, ...], convert: bool
    ) -> list[str] | None:
        """Texts from serialized BYTES elements (None when not converting; framing is checked)."""
        items = _bytes_elements(self.input, chunk, math.prod(shape))
        return self._texts(items) if convert else None

    def _texts(self, items: list) -> list[str]:
        texts = []
        for i, item in enumerate(items):
            try:
                texts.append(tokenization.decode_text(item))
            except tokenization.TextError as exc:
                raise InferenceRequestError(f"{self.input}[{i}]: {exc}") from None
        return texts

    def runner(self, session: Any) -> Callable[[list[str]], Padded]:
        """Texts → embeddings [rows, 384]: one tokenizer call, one encoder run (it pools)."""

        def run_batch(texts: list[str]) -> Padded:
            tokens, _ = tokenization.encode(texts)
            # Padded to the longest text of the micro-batch, as a plain batched encode() does
            # (sentence-transformers); Triton sorts by length into sub-batches instead.
            ids, mask = padding.pad(tokens, length=max(len(t) for t in tokens))
            feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
            outputs = onnx_runner.run(session, feeds, [embedding.EMBEDDING])[0]
            return Padded(outputs, sum(map(len, tokens)), ids.size)

        return run_batch

    def warmup_input(self) -> list[str]:
        """One short text (this also loads the tokenizer)."""
        return ["Warming up the peer."]


class ClassifyModel(ServedModel):
    """The whole classify pipeline: IMAGE BYTES [-1, 1] → top-5 LABELS, SCORES, CLASS_IDS.

    As a user would put it behind FastAPI: Pillow decodes, crops and resizes (the functions of
    ``pipelines.image``), onnxruntime runs the classifier's model.onnx on the batch, numpy takes
    the top five; all of it in the batcher's one thread, on whatever queued. An image that does
    not decode fails its batch, which the batcher then runs request by request: only that
    request fails (HTTP 500), as in any batch function that raises.
    """

    name = classification.ENSEMBLE
    signature = classification.SIGNATURES[classification.ENSEMBLE]
    max_batch = 32
    default_path = DEFAULT_MODEL
    # A request's rows of a batch's result: one record per image.
    RESULT = np.dtype([("ids", np.int32, (classification.DEFAULT_TOP_K,)),
                       ("scores", np.float32, (classification.DEFAULT_TOP_K,))])  # fmt: skip

    def json_data(self, data: object, shape: tuple[int, ...], convert: bool) -> list[bytes] | None:
        """Encoded images as JSON strings are not taken: images travel as binary tensors."""
        raise InferenceRequestError(f"{self.input} must be sent as binary tensor data")

    def binary_data(self, chunk: memoryview, shape: tuple[int, ...], convert: bool) -> list[bytes]:
        """The encoded images, one per serialized BYTES element."""
        return [bytes(item) for item in _bytes_elements(self.input, chunk, math.prod(shape))]

    def runner(self, session: Any) -> Callable[[list[bytes]], np.ndarray]:
        """Images → one record (top-5 ids and probabilities) per image."""

        def run_batch(images: list[bytes]) -> np.ndarray:
            pixels, errors = image.preprocess_batch(images)
            failed = [str(e) for e in errors if e is not None]
            if failed:
                raise InferenceRequestError(f"{self.input}: {failed[0]}")
            logits = onnx_runner.run(
                session, {classification.PIXELS: pixels}, [classification.LOGITS]
            )[0]
            out = np.empty(len(images), self.RESULT)
            out["ids"], out["scores"] = imagenet.top_k(logits, classification.DEFAULT_TOP_K)
            return out

        return run_batch

    def warmup_input(self) -> list[bytes]:
        """One sample photo (this also loads Pillow's JPEG decoder)."""
        from export import samples

        return [samples.photo_bytes(samples.PHOTOS[0])]

    def output_tensors(self, result: np.ndarray) -> list[tuple[str, str, np.ndarray]]:
        """The three outputs of a request's records; labels looked up from the ids."""
        ids = np.ascontiguousarray(result["ids"])
        return [
            (classification.LABELS, "BYTES", imagenet.label_names(ids)),
            (classification.SCORES, "FP32", np.ascontiguousarray(result["scores"])),
            (classification.CLASS_IDS, "INT32", ids),
        ]

    def null_result(self, rows: int) -> np.ndarray:
        """Records of zeros."""
        return np.zeros(rows, self.RESULT)


MODELS: dict[str, ServedModel] = {
    m.name: m for m in (ClassifierModel(), EmbedModel(), ClassifyModel())
}


def served_model(name: str) -> ServedModel:
    """The served model called ``name``.

    Raises:
        ValueError: the peer does not serve it; the message lists those it does.
    """
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"the peer serves {sorted(MODELS)}, not {name!r}") from None
