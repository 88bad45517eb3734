r"""Peer baseline: a model served by FastAPI + uvicorn with an asyncio micro-batcher.

This is what a Python user would build instead of Triton, done well: uvicorn with uvloop and
httptools (one worker process), orjson both ways, numpy conversions without Python loops, and the
"BatchScheduler" pattern — requests put ``(rows, future)`` on an asyncio queue; one background
task collects up to ``max_batch`` rows, waiting at most ``max_wait_ms`` after the first, runs ONE
model call in a worker thread (so the event loop keeps accepting) and splits the result.

It serves one of two models (``--model-name``), under the same name and tensors as in Triton:

- ``classifier``: PIXELS FP32 [-1, 3, 224, 224] → LOGITS FP32 [-1, 1000], one onnxruntime run
  per micro-batch.
- ``embed``: TEXT BYTES [-1, 1] → EMBEDDING FP32 [-1, 384] (all-MiniLM-L6-v2), per micro-batch
  one tokenizer call, one onnxruntime run of the encoder and one mean pooling, with the texts
  padded to the longest of the micro-batch, as a plain batched ``encode()`` does.

It speaks the subset of the KServe v2 HTTP protocol that Triton's ``perf_analyzer`` uses, so the
same load generator with the same payload drives both::

    python -m client.perf.peer --port 8010 &
    perf_analyzer -m classifier -u 127.0.0.1:8010 -i http \
        --input-tensor-format json --output-tensor-format json --input-data zero

    python -m client.perf.peer --model-name embed --port 8011 &
    perf_analyzer -m embed -u 127.0.0.1:8011 -i http --input-data texts.json

Tensors may be JSON (flat or nested ``data``; strings for BYTES) or Triton's binary tensor
extension (``Inference-Header-Content-Length``; BYTES elements as 4-byte little-endian length +
bytes). ``--null`` answers zeros without running the model and without converting the inputs
(their count and types are still checked), to measure the ceiling of the load generator and the
HTTP/JSON exchange.
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import logging
import math
import os
import shutil
import struct
import sys
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipelines import classification as spec
from pipelines import embedding as embed_spec
from pipelines import onnx_runner
from server.launcher import MODEL_REPOSITORY, REPO_ROOT, free_port
from server.process import ManagedProcess, client_host

log = logging.getLogger(__name__)

MODEL_NAME = spec.CLASSIFIER  # the model served by default
MODEL_VERSION = "1"
DEFAULT_MODEL = MODEL_REPOSITORY / spec.CLASSIFIER / MODEL_VERSION / "model.onnx"
INPUT_DIMS = (spec.CHANNELS, spec.IMAGE_SIZE, spec.IMAGE_SIZE)
OUTPUT_DIMS = (spec.NUM_CLASSES,)
EMBED_MODEL_NAME = embed_spec.ENSEMBLE
# The fp32 encoder (version 1), as in Triton's "embed" ensemble.
DEFAULT_EMBED_MODEL = MODEL_REPOSITORY / embed_spec.ENCODER / "1" / "model.onnx"
# Triton's binary tensor extension: the JSON header's length; binary tensors follow it.
HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_TYPE = "application/json"
SERVER_NAME = "peer-fastapi"
# The KServe v2 extensions implemented here (of the many Triton lists).
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics")


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


# The served models ------------------------------------------------------------------------
class ServedModel(abc.ABC):
    """One model the peer can serve: its KServe v2 tensors, how to decode them, how to run it.

    Subclasses give the class attributes, the tensor decoders and the batch function; the
    request envelope, batching, statistics and responses are shared.
    """

    name: str
    input: str  # the one input tensor
    datatype: str  # its KServe v2 datatype
    config_type: str  # its data_type in the model configuration
    input_dims: tuple[int, ...]  # without the batch dimension, as in config.pbtxt
    output: str  # the one output tensor, always FP32
    output_dims: tuple[int, ...]
    max_batch: int  # the default max_batch_size
    default_path: Path  # the ONNX file served when none is given
    platform: str
    backend: str

    def check_shape(self, shape: list, max_batch: int) -> tuple[int, ...]:
        """The declared input shape, if it is ``[batch, *input_dims]`` with batch in range.

        Raises:
            InferenceRequestError: the shape is wrong, with the expected one in the message.
        """
        expected = [-1, *self.input_dims]
        # bool is an int subclass; a shape of [true, 1] is still wrong.
        if not all(type(d) is int for d in shape) or tuple(shape[1:]) != self.input_dims:
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

    def metadata(self) -> dict:
        """The model metadata, shaped like Triton's JSON answer."""
        return {
            "name": self.name,
            "versions": [MODEL_VERSION],
            "platform": self.platform,
            "inputs": [
                {"name": self.input, "datatype": self.datatype, "shape": [-1, *self.input_dims]}
            ],
            "outputs": [
                {"name": self.output, "datatype": "FP32", "shape": [-1, *self.output_dims]}
            ],
        }

    def config(self, max_batch: int, max_wait_s: float) -> dict:
        """The model configuration, shaped like Triton's JSON ``/config`` answer.

        As in config.pbtxt, ``dims`` leave out the batch dimension.
        """

        def tensor(name: str, data_type: str, dims: tuple[int, ...]) -> dict:
            return {
                "name": name,
                "data_type": data_type,
                "format": "FORMAT_NONE",
                "dims": list(dims),
                "is_shape_tensor": False,
            }

        return {
            "name": self.name,
            "platform": self.platform,
            "backend": self.backend,
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": max_batch,
            "input": [tensor(self.input, self.config_type, self.input_dims)],
            "output": [tensor(self.output, "TYPE_FP32", self.output_dims)],
            "dynamic_batching": {"max_queue_delay_microseconds": round(max_wait_s * 1e6)},
            "instance_group": [{"name": self.name, "kind": "KIND_CPU", "count": 1}],
            "model_transaction_policy": {"decoupled": False},
            "parameters": {},
        }


class ClassifierModel(ServedModel):
    """The image classifier: PIXELS FP32 [-1, 3, 224, 224] → LOGITS FP32 [-1, 1000]."""

    name = spec.CLASSIFIER
    input = spec.PIXELS
    datatype = "FP32"
    config_type = "TYPE_FP32"
    input_dims = INPUT_DIMS
    output = spec.LOGITS
    output_dims = OUTPUT_DIMS
    max_batch = 32
    default_path = DEFAULT_MODEL
    platform = "onnxruntime_onnx"
    backend = "onnxruntime"

    def json_data(self, data: object, shape: tuple[int, ...], convert: bool) -> np.ndarray | None:
        """Float32 pixels from JSON numbers (None for flat data when not converting)."""
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
        if array.dtype.kind not in "iuf":
            raise InferenceRequestError(f"'data' of {self.input} must contain only numbers")
        if array.size != math.prod(shape) or (array.ndim > 1 and array.shape != shape):
            raise InferenceRequestError(
                f"{self.input} data has shape {list(array.shape)}, declared shape is {list(shape)}"
            )
        return array.astype(np.float32, copy=False).reshape(shape)

    def binary_data(self, chunk: memoryview, shape: tuple[int, ...], convert: bool) -> np.ndarray:
        """Float32 pixels viewed in the body (little-endian FP32)."""
        nbytes = math.prod(shape) * 4
        if len(chunk) != nbytes:
            raise InferenceRequestError(
                f"{self.input} binary_data_size is {len(chunk)}, shape {list(shape)} in FP32 "
                f"needs {nbytes} bytes"
            )
        # Zero-copy view of the body; the batcher copies it once into the batch.
        return np.frombuffer(chunk, dtype="<f4").reshape(shape)

    def runner(self, session: Any) -> Callable[[np.ndarray], np.ndarray]:
        """Pixels [rows, 3, 224, 224] → logits [rows, 1000], one onnxruntime run."""

        def run_batch(pixels: np.ndarray) -> np.ndarray:
            return onnx_runner.run(session, {spec.PIXELS: pixels}, [spec.LOGITS])[0]

        return run_batch

    def warmup_input(self) -> np.ndarray:
        """One image of zeros."""
        return np.zeros((1, *INPUT_DIMS), np.float32)


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
    input = embed_spec.TEXT
    datatype = "BYTES"
    config_type = "TYPE_STRING"
    input_dims = (1,)
    output = embed_spec.EMBEDDING
    output_dims = (embed_spec.HIDDEN_SIZE,)
    max_batch = 64
    default_path = DEFAULT_EMBED_MODEL
    # Tokenizer and pooling in Python around onnxruntime: a Python-backend model in Triton.
    platform = "python"
    backend = "python"

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
                texts.append(embed_spec.decode_text(item))
            except embed_spec.TextError as exc:
                raise InferenceRequestError(f"{self.input}[{i}]: {exc}") from None
        return texts

    def runner(self, session: Any) -> Callable[[list[str]], np.ndarray]:
        """Texts → embeddings [rows, 384]: one tokenizer call, one encoder run, one pooling."""

        def run_batch(texts: list[str]) -> np.ndarray:
            tokens, _ = embed_spec.encode(texts)
            # Padded to the longest text of the micro-batch, as a plain batched encode() does
            # (sentence-transformers); Triton's tokenize step pads per request to a bucket.
            ids, mask = embed_spec.pad(tokens, length=max(len(t) for t in tokens))
            feeds = {embed_spec.INPUT_IDS: ids, embed_spec.ATTENTION_MASK: mask}
            (hidden,) = onnx_runner.run(session, feeds, [embed_spec.TOKEN_EMBEDDINGS])
            return embed_spec.mean_pool(hidden, mask)

        return run_batch

    def warmup_input(self) -> list[str]:
        """One short text (this also loads the tokenizer)."""
        return ["Warming up the peer."]


MODELS: dict[str, ServedModel] = {m.name: m for m in (ClassifierModel(), EmbedModel())}


def served_model(name: str) -> ServedModel:
    """The served model called ``name``.

    Raises:
        ValueError: the peer does not serve it; the message lists those it does.
    """
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"the peer serves {sorted(MODELS)}, not {name!r}") from None


# Request decoding ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodedRequest:
    """One validated inference request."""

    rows: int  # the batch size it declares
    data: Any  # the model's rows (pixels array, or list of texts); None if not converted
    binary_output: bool  # answer the output with the binary tensor extension
    request_id: str | None = None

    @property
    def pixels(self) -> Any:
        """The classifier's name for ``data``."""
        return self.data


def decode_request(
    body: bytes,
    header_length: str | None = None,
    max_batch: int | None = None,
    convert: bool = True,
    model: ServedModel = MODELS[MODEL_NAME],
) -> DecodedRequest:
    """Validate a KServe v2 inference request for ``model`` and extract its input rows.

    Args:
        body: the HTTP body: JSON, or a JSON header followed by binary tensors.
        header_length: the ``Inference-Header-Content-Length`` header, if sent.
        max_batch: the largest batch one request may carry (default: the model's).
        convert: False skips converting the input values once their count (and, for texts,
            types and binary framing) is checked: the null model needs only the batch size, so
            ``data`` may be None then.
        model: the served model (default: the classifier).

    Returns:
        The rows (float32 pixels [batch, 3, 224, 224], or a list of batch texts) and how to
        encode the answer.

    Raises:
        InferenceRequestError: anything a client should fix, with a message saying what.
    """
    max_batch = max_batch or model.max_batch
    binary = memoryview(b"")
    if header_length is not None:
        try:
            split = int(header_length)
        except ValueError:
            raise InferenceRequestError(f"{HEADER_LENGTH} is not an integer") from None
        if not 0 < split <= len(body):
            raise InferenceRequestError(
                f"{HEADER_LENGTH} is {split} but the body has {len(body)} bytes"
            )
        binary = memoryview(body)[split:]
        body = body[:split]
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InferenceRequestError(f"the request body is not valid JSON: {exc}") from None

    name = model.input
    inputs = _field(request, "inputs", list, "the request")
    names = [i.get("name") if isinstance(i, dict) else None for i in inputs]
    if names != [name]:
        raise InferenceRequestError(f"expected exactly one input '{name}', got {names}")
    tensor = inputs[0]
    datatype = _field(tensor, "datatype", str, f"input {name}")
    if datatype != model.datatype:
        raise InferenceRequestError(f"{name} must have datatype {model.datatype}, got {datatype}")
    shape = model.check_shape(_field(tensor, "shape", list, f"input {name}"), max_batch)
    parameters = _field(tensor, "parameters", dict, f"input {name}", default={})
    if "binary_data_size" in parameters:
        size = parameters["binary_data_size"]
        if type(size) is not int or size < 0:
            raise InferenceRequestError(
                f"{name} binary_data_size must be a byte count, got {size!r}"
            )
        if len(binary) < size:
            raise InferenceRequestError(
                f"the body holds {len(binary)} bytes of tensor data, {name} needs {size}"
            )
        data = model.binary_data(binary[:size], shape, convert)
        binary = binary[size:]
    else:
        data = model.json_data(tensor.get("data"), shape, convert)
    if len(binary):
        raise InferenceRequestError(f"{len(binary)} bytes of tensor data belong to no input")

    # Binary output: per output ("binary_data") or for all ("binary_data_output"), as in Triton.
    request_params = _field(request, "parameters", dict, "the request", default={})
    binary_output = bool(request_params.get("binary_data_output", False))
    for output in _field(request, "outputs", list, "the request", default=[]):
        output_name = _field(output, "name", str, "an output")
        if output_name != model.output:
            raise InferenceRequestError(
                f"unknown output '{output_name}'; the model has {model.output}"
            )
        out_params = _field(output, "parameters", dict, f"output {output_name}", default={})
        binary_output = bool(out_params.get("binary_data", binary_output))
    request_id = request.get("id")
    request_id = request_id if isinstance(request_id, str) else None
    return DecodedRequest(shape[0], data, binary_output, request_id)


def encode_response(
    outputs: np.ndarray, request: DecodedRequest, model: ServedModel = MODELS[MODEL_NAME]
) -> Response:
    """The KServe v2 answer with the model's output, as JSON numbers or as a binary tensor.

    Args:
        outputs: float32 [batch, ...] (LOGITS or EMBEDDING), C-contiguous.
        request: the decoded request (its id and the output encoding it asked for).
        model: the served model (default: the classifier).

    Returns:
        The HTTP response.
    """
    output: dict = {"name": model.output, "datatype": "FP32", "shape": list(outputs.shape)}
    reply: dict = {"model_name": model.name, "model_version": MODEL_VERSION, "outputs": [output]}
    if request.request_id is not None:
        reply["id"] = request.request_id
    if request.binary_output:
        raw = outputs.astype("<f4", copy=False).tobytes()
        output["parameters"] = {"binary_data_size": len(raw)}
        header = orjson.dumps(reply)
        return Response(
            header + raw,
            media_type="application/octet-stream",
            headers={HEADER_LENGTH: str(len(header))},
        )
    # orjson writes a contiguous float32 array natively: no tolist(), no Python floats.
    output["data"] = np.ascontiguousarray(outputs).reshape(-1)
    return Response(orjson.dumps(reply, option=orjson.OPT_SERIALIZE_NUMPY), media_type=JSON_TYPE)


# Server-side statistics (Triton's /stats shape, so perf_analyzer can report them) ----------
@dataclass
class Duration:
    """A count and the nanoseconds it took, as in Triton's statistics."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        """Account ``count`` events that took ``ns`` in total."""
        self.count += count
        self.ns += ns

    def as_json(self) -> dict[str, int]:
        """``{"count": ..., "ns": ...}``."""
        return {"count": self.count, "ns": self.ns}


@dataclass(frozen=True)
class Timing:
    """Where one request's time went inside the batcher."""

    queue_ns: int = 0  # waiting for its batch to start
    input_ns: int = 0  # its batch's concatenation
    infer_ns: int = 0  # its batch's model run


@dataclass
class ModelStats:
    """Per-model statistics, updated on the event loop only (so no locking).

    A request's counters are all updated together when it completes: perf_analyzer compares
    the differences of two snapshots and aborts if the compute counts disagree.
    """

    model_name: str = MODEL_NAME
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    inference_count: int = 0  # batch rows served
    execution_count: int = 0  # model runs (fewer than requests when batching works)
    last_inference_ms: int = 0
    batches: dict[int, tuple[Duration, Duration, Duration]] = field(default_factory=dict)

    def record_execution(self, rows: int, input_ns: int, infer_ns: int) -> None:
        """One model run over a batch of ``rows`` rows."""
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
        per_size = self.batches.setdefault(rows, (Duration(), Duration(), Duration()))
        per_size[0].add(input_ns)
        per_size[1].add(infer_ns)

    def record_request(self, rows: int, timing: Timing, output_ns: int, total_ns: int) -> None:
        """One request answered successfully, ``total_ns`` after its handler started."""
        self.inference_count += rows
        self.success.add(total_ns)
        self.queue.add(timing.queue_ns)
        # Like Triton, every request of a batch is charged its whole batch's compute time.
        self.compute_input.add(timing.input_ns)
        self.compute_infer.add(timing.infer_ns)
        self.compute_output.add(output_ns)

    def as_json(self) -> dict:
        """One entry of Triton's ``model_stats`` list."""
        return {
            "name": self.model_name,
            "version": MODEL_VERSION,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": self.compute_input.as_json(),
                "compute_infer": self.compute_infer.as_json(),
                "compute_output": self.compute_output.as_json(),
                "cache_hit": Duration().as_json(),
                "cache_miss": Duration().as_json(),
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": d[0].as_json(),
                    "compute_infer": d[1].as_json(),
                    "compute_output": d[2].as_json(),
                }
                for size, d in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }


# The micro-batcher ------------------------------------------------------------------------
@dataclass
class _Pending:
    data: np.ndarray | list  # the request's rows
    future: asyncio.Future
    enqueued_ns: int


@dataclass(frozen=True)
class _Execution:
    outputs: list[np.ndarray | Exception]  # one per request, in order
    input_ns: int
    infer_ns: int


def _join(parts: list) -> np.ndarray | list:
    """One batch of several requests' rows: arrays are concatenated, lists (texts) chained."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    return [row for part in parts for row in part]


def _log_crash(task: asyncio.Task) -> None:
    # Without this a crashed batcher would only show up as requests that never finish.
    if not task.cancelled() and task.exception() is not None:
        log.error("the micro-batcher stopped", exc_info=task.exception())


class MicroBatcher:
    """Collects concurrent requests into one model run in a worker thread.

    ``run_batch`` maps a batch of rows (an array [rows, ...], or a list of rows such as texts)
    to [rows, ...] outputs; it is called in a single dedicated thread, one batch at a time. While
    it runs, new requests queue up and form the next batch, so under load batches fill without
    waiting.
    """

    def __init__(
        self,
        run_batch: Callable[[Any], np.ndarray],
        max_batch: int = 32,
        max_wait_ms: float = 2.0,
        stats: ModelStats | None = None,
    ):
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_ms >= 0")
        self.run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000
        self.stats = stats or ModelStats()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._carry: _Pending | None = None  # did not fit into the previous batch
        self._current: list[_Pending] = []  # being collected or run: failed if we are stopped
        self._task: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """Start the collecting task on the running event loop."""
        # The queue binds to the loop that first waits on it, so each start gets a fresh one.
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="peer-model")
        self._task = asyncio.get_running_loop().create_task(self._serve(), name="micro-batcher")
        self._task.add_done_callback(_log_crash)

    async def close(self) -> None:
        """Stop collecting; requests still queued fail with RuntimeError."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        leftovers = self._current + ([self._carry] if self._carry else [])
        while self._queue is not None and not self._queue.empty():
            leftovers.append(self._queue.get_nowait())
        for item in leftovers:
            if not item.future.done():
                item.future.set_exception(RuntimeError("the server is shutting down"))
        self._carry, self._current = None, []
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def submit(self, data: np.ndarray | list) -> np.ndarray:
        """Queue ``data`` (rows <= max_batch: an array [rows, ...] or a list) for its outputs."""
        return (await self.submit_timed(data))[0]

    async def submit_timed(self, data: np.ndarray | list) -> tuple[np.ndarray, Timing]:
        """Like submit(), and say where the time went."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(data, future, time.perf_counter_ns()))
        return await future

    async def _collect(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        first, self._carry = self._carry or await self._queue.get(), None
        batch, rows = [first], len(first.data)
        self._current = batch
        deadline = loop.time() + self.max_wait
        while rows < self.max_batch:
            try:
                # Whatever queued up while the previous batch ran is taken without waiting.
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            if rows + len(item.data) > self.max_batch:
                self._carry = item  # first in line for the next batch: order is kept
                break
            batch.append(item)
            rows += len(item.data)
        return batch

    def _execute(self, arrays: list[np.ndarray | list]) -> _Execution:
        """In the worker thread: join, run once, split; isolate a failing request."""
        start = time.perf_counter_ns()
        batch = _join(arrays)
        ready = time.perf_counter_ns()
        try:
            result = self.run_batch(batch)
            done = time.perf_counter_ns()
            bounds = np.cumsum([len(a) for a in arrays])[:-1]
            # Row slices of a C-contiguous array are contiguous views: no copies.
            outputs: list = np.split(result, bounds)
            return _Execution(outputs, ready - start, done - ready)
        except Exception as exc:
            if len(arrays) == 1:
                return _Execution([exc], ready - start, time.perf_counter_ns() - ready)
            # Retried one by one below, so that only the culprit fails.
            log.exception("batched run of %d requests failed; retrying one by one", len(arrays))
        outputs = []
        for part in arrays:
            try:
                outputs.append(self.run_batch(part))
            except Exception as exc:  # noqa: BLE001 - reported to its own request only
                outputs.append(exc)
        return _Execution(outputs, ready - start, time.perf_counter_ns() - ready)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # Requests whose client went away are not run.
            batch = [p for p in await self._collect() if not p.future.done()]
            self._current = batch
            if not batch:
                continue
            started = time.perf_counter_ns()
            try:
                execution = await loop.run_in_executor(
                    self._executor, self._execute, [p.data for p in batch]
                )
            except Exception as exc:  # noqa: BLE001 - the executor itself failed
                execution = _Execution([exc] * len(batch), 0, 0)
            rows = sum(len(p.data) for p in batch)
            self.stats.record_execution(rows, execution.input_ns, execution.infer_ns)
            for item, output in zip(batch, execution.outputs, strict=True):
                if item.future.done():
                    continue
                if isinstance(output, Exception):
                    item.future.set_exception(output)
                else:
                    timing = Timing(
                        started - item.enqueued_ns, execution.input_ns, execution.infer_ns
                    )
                    item.future.set_result((output, timing))
            self._current = []


# The application --------------------------------------------------------------------------
class _Peer:
    """What the routes share: the served model (or none), the batcher and the statistics."""

    def __init__(
        self,
        model: ServedModel,
        model_path: Path | None,
        intra_op_threads: int,
        max_batch: int,
        max_wait_ms: float,
    ):
        self.model = model
        self.max_batch = max_batch
        self.stats = ModelStats(model.name)
        self.ready = False
        self.batcher: MicroBatcher | None = None
        self.description = f"{model.name}: null model (zeros)"
        if model_path is not None:
            run_batch = model.load(model_path, intra_op_threads)
            self.batcher = MicroBatcher(run_batch, max_batch, max_wait_ms, self.stats)
            self.description = (
                f"{model.name}: {model_path} ({intra_op_threads} intra-op threads, "
                f"max batch {max_batch}, max wait {max_wait_ms} ms)"
            )
        # Null mode answers slices of one preallocated array.
        self.zeros = np.zeros((max_batch, *model.output_dims), np.float32)

    async def infer(self, request: DecodedRequest) -> tuple[np.ndarray, Timing]:
        if self.batcher is None:
            self.stats.record_execution(request.rows, 0, 0)
            return self.zeros[: request.rows], Timing()
        return await self.batcher.submit_timed(request.data)

    def config(self) -> dict:
        """The model configuration, shaped like Triton's JSON ``/config`` answer."""
        return self.model.config(self.max_batch, self.batcher.max_wait if self.batcher else 0)


def _json(content: object, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type=JSON_TYPE)


def _error(message: str, status: int = 400) -> Response:
    return _json({"error": message}, status)


def _check_model(request: Request, served: str) -> None:
    model = request.path_params["model"]
    version = request.path_params.get("version", MODEL_VERSION)
    if model != served:
        raise UnknownModelError(f"Request for unknown model: '{model}' is not found")
    if version not in (MODEL_VERSION, ""):
        raise UnknownModelError(f"Request for unknown model: '{model}' version {version}")


def create_app(
    model_path: Path | None,
    intra_op_threads: int = 1,
    max_batch: int | None = None,
    max_wait_ms: float = 2.0,
    model_name: str = MODEL_NAME,
) -> FastAPI:
    """The peer server as an ASGI app; the model session is opened (and warmed up) here.

    Args:
        model_path: the model's ONNX file (the encoder's for ``embed``); None serves the null
            model (zeros, no model).
        intra_op_threads: onnxruntime intra-op threads for the one session.
        max_batch: the most rows per model run, and per request (``max_batch_size``); default:
            the model's (32 for the classifier, 64 for embed, as in Triton).
        max_wait_ms: how long a batch waits for more requests after its first one.
        model_name: ``classifier`` or ``embed``: the model served, under that name.

    Returns:
        The FastAPI application; its lifespan starts and stops the micro-batcher.

    Raises:
        ValueError: ``model_name`` is not one the peer serves.
    """
    model = served_model(model_name)
    max_batch = max_batch or model.max_batch
    peer = _Peer(model, model_path, intra_op_threads, max_batch, max_wait_ms)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if peer.batcher is not None:
            peer.batcher.start()
        peer.ready = True
        log.info("peer ready: %s", peer.description)
        try:
            yield
        finally:
            peer.ready = False
            if peer.batcher is not None:
                await peer.batcher.close()

    app = FastAPI(
        title=f"{model.name} peer (FastAPI + micro-batcher)",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.peer = peer

    # Errors are answered as KServe v2 does: {"error": "..."}.
    @app.exception_handler(InferenceRequestError)
    async def _bad_request(_request: Request, exc: InferenceRequestError) -> Response:
        peer.stats.fail.add(0)
        return _error(str(exc), 400)

    @app.exception_handler(UnknownModelError)
    async def _unknown_model(_request: Request, exc: UnknownModelError) -> Response:
        return _error(str(exc), 404)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        return _error(str(exc.detail), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> Response:
        return _error(str(exc), 400)

    async def live(_request: Request) -> Response:
        return Response(status_code=200)

    async def ready(_request: Request) -> Response:
        return Response(status_code=200 if peer.ready else 503)

    async def server_metadata(_request: Request) -> Response:
        # perf_analyzer asks for server-side statistics only when "statistics" is listed.
        return _json({"name": SERVER_NAME, "version": "1", "extensions": list(EXTENSIONS)})

    async def model_ready(request: Request) -> Response:
        _check_model(request, model.name)
        return Response(status_code=200 if peer.ready else 503)

    async def model_metadata(request: Request) -> Response:
        _check_model(request, model.name)
        return _json(model.metadata())

    async def model_config(request: Request) -> Response:
        _check_model(request, model.name)
        return _json(peer.config())

    async def model_stats(request: Request) -> Response:
        if "model" in request.path_params:
            _check_model(request, model.name)
        return _json({"model_stats": [peer.stats.as_json()]})

    async def infer(request: Request) -> Response:
        start = time.perf_counter_ns()
        _check_model(request, model.name)
        decoded = decode_request(
            await request.body(),
            request.headers.get(HEADER_LENGTH),
            peer.max_batch,
            # The null model skips converting the inputs: it measures the load generator.
            convert=peer.batcher is not None,
            model=model,
        )
        try:
            outputs, timing = await peer.infer(decoded)
        except Exception as exc:  # noqa: BLE001 - the model failed on this request
            log.warning("inference failed: %s", exc)
            peer.stats.fail.add(time.perf_counter_ns() - start)
            return _error(f"{model.name} failed: {exc}", 500)
        computed = time.perf_counter_ns()
        response = encode_response(outputs, decoded, model)
        done = time.perf_counter_ns()
        peer.stats.record_request(len(outputs), timing, done - computed, done - start)
        return response

    routes = [
        ("/v2/health/live", live, "GET"),
        ("/v2/health/ready", ready, "GET"),
        ("/v2", server_metadata, "GET"),
        ("/v2/models/stats", model_stats, "GET"),
    ]
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            (base, model_metadata, "GET"),
            (f"{base}/ready", model_ready, "GET"),
            (f"{base}/config", model_config, "GET"),
            (f"{base}/stats", model_stats, "GET"),
            (f"{base}/infer", infer, "POST"),
        ]
    for path, endpoint, method in routes:
        app.add_api_route(path, endpoint, methods=[method], include_in_schema=False)
    return app


# Running it as a process ------------------------------------------------------------------
class PeerServer(ManagedProcess):
    """The peer as a subprocess (``python -m client.perf.peer``), optionally pinned to CPUs.

    Use as a context manager, or call start() and stop().
    """

    name = "peer"
    poll_interval = 0.1

    def __init__(
        self,
        model_path: Path | None,
        port: int = 0,
        host: str = "127.0.0.1",
        intra_op_threads: int = 1,
        max_batch: int | None = None,
        max_wait_ms: float = 2.0,
        cpus: list[int] | None = None,
        log_path: Path | None = None,
        model_name: str = MODEL_NAME,
    ):
        """See create_app() for the model arguments; ``model_path`` None serves zeros.

        Raises:
            ValueError: ``model_name`` is not one the peer serves.
        """
        served_model(model_name)  # fail here, not in the subprocess
        super().__init__(log_path)
        self.model_path = model_path
        self.port = port
        self.host = host
        self.intra_op_threads = intra_op_threads
        self.max_batch = max_batch
        self.max_wait_ms = max_wait_ms
        self.cpus = cpus
        self.model_name = model_name

    @property
    def url(self) -> str:
        """host:port, as perf_analyzer's ``-u`` and tritonclient expect."""
        return f"{client_host(self.host)}:{self.port}"

    @property
    def ready_url(self) -> str:
        """/v2/health/ready, as in Triton."""
        return f"http://{self.url}/v2/health/ready"

    def command(self) -> list[str]:
        """The command line: the CLI below, behind ``taskset -c`` when CPUs are given."""
        args = [sys.executable, "-m", "client.perf.peer", "--model-name", self.model_name]
        args += ["--host", self.host, "--port", str(self.port)]
        args += ["--threads", str(self.intra_op_threads), "--max-wait-ms", str(self.max_wait_ms)]
        if self.max_batch is not None:
            args += ["--max-batch", str(self.max_batch)]
        args += ["--null"] if self.model_path is None else ["--model", str(self.model_path)]
        if self.cpus:
            taskset = shutil.which("taskset")
            if taskset is None:
                raise FileNotFoundError("taskset (util-linux) is needed to pin the peer to CPUs")
            args = [taskset, "-c", ",".join(str(c) for c in self.cpus), *args]
        return args

    def prepare(self) -> None:
        """Pick a free port if asked (0)."""
        if self.port == 0:
            self.port = free_port(client_host(self.host))

    def environment(self) -> dict[str, str]:
        """Our environment, with this repository importable."""
        env = super().environment()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
        return env

    def start(self, timeout: float = 60.0) -> PeerServer:
        """Start the process in the repository and wait until /v2/health/ready answers 200.

        Raises:
            ServerStartError: it exited or was not ready in time; the message ends with its log.
        """
        return super().start(timeout, cwd=REPO_ROOT)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (uvicorn finishes in-flight requests), SIGKILL if it does not exit in time."""
        return super().stop(timeout)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The CLI's options, checked; ``model`` is the served model's default file when not given.

    Exits with a usage error for values out of range or a missing model file.
    """
    parser = argparse.ArgumentParser(
        prog="python -m client.perf.peer",
        description="The classifier or the text embedding on FastAPI + uvicorn with an asyncio "
        "micro-batcher, speaking the KServe v2 HTTP protocol (a peer baseline for perf_analyzer).",
    )
    parser.add_argument(
        "--model-name",
        choices=sorted(MODELS),
        default=MODEL_NAME,
        help="the model served, under this name (default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help=f"ONNX file (default: {DEFAULT_MODEL} for classifier, {DEFAULT_EMBED_MODEL} "
        "for embed)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8010, help="HTTP port (default: %(default)s)")
    parser.add_argument(
        "--threads", type=int, default=1, help="onnxruntime intra-op threads (default: 1)"
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="most rows per model run (default: the model's max_batch_size, "
        + ", ".join(f"{m.max_batch} for {m.name}" for m in MODELS.values())
        + ")",
    )
    parser.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        help="how long a batch waits for more requests after its first (default: 2.0)",
    )
    parser.add_argument(
        "--null", action="store_true", help="answer zeros without running the model"
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    args = parser.parse_args(argv)
    model = MODELS[args.model_name]
    args.max_batch = args.max_batch if args.max_batch is not None else model.max_batch
    if args.max_batch < 1 or args.max_wait_ms < 0 or args.threads < 1:
        parser.error("--max-batch and --threads must be >= 1, --max-wait-ms >= 0")
    args.model = args.model or model.default_path
    if not args.null and not args.model.is_file():
        parser.error(f"model not found: {args.model} (run `make models`, or pass --null)")
    return args


def main(argv: list[str] | None = None) -> int:
    """CLI: serve the classifier or the embedding (or the null model) until SIGTERM or Ctrl-C."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    import uvicorn  # the server is only needed here, not by importers of create_app

    app = create_app(
        None if args.null else args.model,
        args.threads,
        args.max_batch,
        args.max_wait_ms,
        args.model_name,
    )
    print(f"peer serving on http://{args.host}:{args.port}/v2/models/{args.model_name}", flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        workers=1,
        access_log=False,  # a log line per request would cost more than some requests
        log_level="warning" if args.log_level != "debug" else "debug",
        timeout_graceful_shutdown=5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
