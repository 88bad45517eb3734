"""KServe v2 request decoding and response encoding (JSON and the binary tensor extension)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from fastapi.responses import Response

from bench.peers.microbatcher.models import (
    HEADER_LENGTH,
    JSON_TYPE,
    MODEL_NAME,
    MODEL_VERSION,
    MODELS,
    InferenceRequestError,
    ServedModel,
    _field,
)


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
        The rows (uint8 pixels [batch, 3, 224, 224], or a list of batch texts) and how to
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
    if datatype != model.taken.datatype:
        raise InferenceRequestError(
            f"{name} must have datatype {model.taken.datatype}, got {datatype}"
        )
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
        names = [name for name, _, _ in model.output_specs()]
        if output_name not in names:
            raise InferenceRequestError(
                f"unknown output '{output_name}'; the model has {', '.join(names)}"
            )
        out_params = _field(output, "parameters", dict, f"output {output_name}", default={})
        binary_output = bool(out_params.get("binary_data", binary_output))
    request_id = request.get("id")
    request_id = request_id if isinstance(request_id, str) else None
    return DecodedRequest(shape[0], data, binary_output, request_id)


# Binary tensor data: little-endian numbers; BYTES as Triton serializes them.
_WIRE = {"FP32": "<f4", "INT32": "<i4"}


def _raw(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(x)) + x for x in array.reshape(-1))
    return array.astype(_WIRE[datatype], copy=False).tobytes()


def encode_response(
    outputs: np.ndarray, request: DecodedRequest, model: ServedModel = MODELS[MODEL_NAME]
) -> Response:
    """The KServe v2 answer with the model's outputs, as JSON or as binary tensors.

    Args:
        outputs: the request's rows of the batch result: float32 [batch, ...] (LOGITS or
            EMBEDDING), C-contiguous, or what the model's ``output_tensors`` reads.
        request: the decoded request (its id and the output encoding it asked for).
        model: the served model (default: the classifier).

    Returns:
        The HTTP response.
    """
    tensors = model.output_tensors(outputs)
    described = [
        {"name": name, "datatype": datatype, "shape": list(array.shape)}
        for name, datatype, array in tensors
    ]
    reply: dict = {"model_name": model.name, "model_version": MODEL_VERSION, "outputs": described}
    if request.request_id is not None:
        reply["id"] = request.request_id
    if request.binary_output:
        chunks = [_raw(datatype, array) for _, datatype, array in tensors]
        for output, raw in zip(described, chunks, strict=True):
            output["parameters"] = {"binary_data_size": len(raw)}
        header = orjson.dumps(reply)
        return Response(
            header + b"".join(chunks),
            media_type="application/octet-stream",
            headers={HEADER_LENGTH: str(len(header))},
        )
    for output, (_, datatype, array) in zip(described, tensors, strict=True):
        # orjson writes contiguous numeric arrays natively: no tolist(), no Python floats.
        flat = np.ascontiguousarray(array).reshape(-1)
        output["data"] = [x.decode() for x in flat] if datatype == "BYTES" else flat
    return Response(orjson.dumps(reply, option=orjson.OPT_SERIALIZE_NUMPY), media_type=JSON_TYPE)
