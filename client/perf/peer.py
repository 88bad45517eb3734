r"""Peer baseline: the classifier served by FastAPI + uvicorn with an asyncio micro-batcher.

This is what a Python user would build instead of Triton, done well: uvicorn with uvloop and
httptools (one worker process), orjson both ways, numpy conversions without Python loops, and the
"BatchScheduler" pattern — requests put ``(array, future)`` on an asyncio queue; one background
task collects up to ``max_batch`` rows, waiting at most ``max_wait_ms`` after the first, runs ONE
onnxruntime call in a worker thread (so the event loop keeps accepting) and splits the result.

It speaks the subset of the KServe v2 HTTP protocol that Triton's ``perf_analyzer`` uses, for
the model ``classifier`` only, so the same load generator with the same payload drives both::

    python -m client.perf.peer --port 8010 &
    perf_analyzer -m classifier -u 127.0.0.1:8010 -i http \
        --input-tensor-format json --output-tensor-format json --input-data zero

Tensors may be JSON (flat or nested ``data``) or Triton's binary tensor extension
(``Inference-Header-Content-Length``). ``--null`` answers zeros without running the model and
without converting the JSON numbers (their count is still checked), to measure the ceiling of the
load generator and the HTTP/JSON exchange.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipelines import classification as spec
from pipelines import onnx_runner
from server.launcher import MODEL_REPOSITORY, REPO_ROOT, free_port
from server.process import ManagedProcess, client_host

log = logging.getLogger(__name__)

MODEL_NAME = spec.CLASSIFIER
MODEL_VERSION = "1"
DEFAULT_MODEL = MODEL_REPOSITORY / spec.CLASSIFIER / MODEL_VERSION / "model.onnx"
INPUT_DIMS = (spec.CHANNELS, spec.IMAGE_SIZE, spec.IMAGE_SIZE)
OUTPUT_DIMS = (spec.NUM_CLASSES,)
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


# Request decoding ---------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodedRequest:
    """One validated inference request."""

    rows: int  # the batch size it declares
    pixels: np.ndarray | None  # float32 [batch, 3, 224, 224]; None if not converted
    binary_output: bool  # answer LOGITS with the binary tensor extension
    request_id: str | None = None


def _field(mapping: object, key: str, kind: type, where: str, default: object = None):
    if not isinstance(mapping, dict):
        raise InferenceRequestError(f"{where} must be a JSON object")
    value = mapping.get(key, default)
    if value is None and default is None:
        raise InferenceRequestError(f"{where} has no '{key}'")
    if not isinstance(value, kind):
        raise InferenceRequestError(f"'{key}' of {where} must be a {kind.__name__}")
    return value


def _check_shape(shape: list, max_batch: int) -> tuple[int, ...]:
    expected = [-1, *INPUT_DIMS]
    # bool is an int subclass; a shape of [true, 3, 224, 224] is still wrong.
    if not all(type(d) is int for d in shape) or tuple(shape[1:]) != INPUT_DIMS:
        raise InferenceRequestError(
            f"{spec.PIXELS} has shape {shape}, the model expects {expected} (batch first)"
        )
    if not 1 <= shape[0] <= max_batch:
        raise InferenceRequestError(
            f"{spec.PIXELS} batch size {shape[0]} is outside 1..{max_batch} (max_batch_size)"
        )
    return tuple(shape)


def _json_pixels(data: object, shape: tuple[int, ...], convert: bool) -> np.ndarray | None:
    if not isinstance(data, list):
        raise InferenceRequestError(f"'data' of {spec.PIXELS} must be a list of numbers")
    count = math.prod(shape)
    flat = not data or not isinstance(data[0], list)
    # A flat list of the wrong length is rejected before paying for the conversion.
    if flat and len(data) != count:
        raise InferenceRequestError(
            f"{spec.PIXELS} has {len(data)} values, shape {list(shape)} needs {count}"
        )
    if flat and not convert:
        return None
    try:
        # No dtype: numpy infers it in C, so strings, booleans and nulls show up as a wrong
        # kind instead of being silently converted to floats (or NaN).
        array = np.asarray(data)
    except ValueError as exc:  # ragged nesting
        raise InferenceRequestError(f"'data' of {spec.PIXELS} is not a regular array") from exc
    if array.dtype.kind not in "iuf":
        raise InferenceRequestError(f"'data' of {spec.PIXELS} must contain only numbers")
    if array.size != count or (array.ndim > 1 and array.shape != shape):
        raise InferenceRequestError(
            f"{spec.PIXELS} data has shape {list(array.shape)}, declared shape is {list(shape)}"
        )
    return array.astype(np.float32, copy=False).reshape(shape)


def _binary_pixels(
    parameters: dict, binary: memoryview, shape: tuple[int, ...]
) -> tuple[np.ndarray, int]:
    size = parameters.get("binary_data_size")
    nbytes = math.prod(shape) * 4
    if type(size) is not int or size != nbytes:
        raise InferenceRequestError(
            f"{spec.PIXELS} binary_data_size is {size!r}, shape {list(shape)} in FP32 needs "
            f"{nbytes} bytes"
        )
    if len(binary) < nbytes:
        raise InferenceRequestError(
            f"the body holds {len(binary)} bytes of tensor data, {spec.PIXELS} needs {nbytes}"
        )
    # Zero-copy view of the body; the batcher copies it once into the batch.
    return np.frombuffer(binary, dtype="<f4", count=nbytes // 4).reshape(shape), nbytes


def decode_request(
    body: bytes, header_length: str | None = None, max_batch: int = 32, convert: bool = True
) -> DecodedRequest:
    """Validate a KServe v2 inference request for the classifier and extract its pixels.

    Args:
        body: the HTTP body: JSON, or a JSON header followed by binary tensors.
        header_length: the ``Inference-Header-Content-Length`` header, if sent.
        max_batch: the largest batch one request may carry.
        convert: False skips converting flat JSON ``data`` to an array once its length is
            checked (the null model needs only the batch size), so ``pixels`` is None then.

    Returns:
        The pixels (float32, [batch, 3, 224, 224]) and how to encode the answer.

    Raises:
        InferenceRequestError: anything a client should fix, with a message saying what.
    """
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

    inputs = _field(request, "inputs", list, "the request")
    names = [i.get("name") if isinstance(i, dict) else None for i in inputs]
    if names != [spec.PIXELS]:
        raise InferenceRequestError(f"expected exactly one input '{spec.PIXELS}', got {names}")
    tensor = inputs[0]
    datatype = _field(tensor, "datatype", str, f"input {spec.PIXELS}")
    if datatype != "FP32":
        raise InferenceRequestError(f"{spec.PIXELS} must have datatype FP32, got {datatype}")
    shape = _check_shape(_field(tensor, "shape", list, f"input {spec.PIXELS}"), max_batch)
    parameters = _field(tensor, "parameters", dict, f"input {spec.PIXELS}", default={})
    if "binary_data_size" in parameters:
        pixels, used = _binary_pixels(parameters, binary, shape)
        binary = binary[used:]
    else:
        pixels = _json_pixels(tensor.get("data"), shape, convert)
    if len(binary):
        raise InferenceRequestError(f"{len(binary)} bytes of tensor data belong to no input")

    # Binary output: per output ("binary_data") or for all ("binary_data_output"), as in Triton.
    request_params = _field(request, "parameters", dict, "the request", default={})
    binary_output = bool(request_params.get("binary_data_output", False))
    for output in _field(request, "outputs", list, "the request", default=[]):
        name = _field(output, "name", str, "an output")
        if name != spec.LOGITS:
            raise InferenceRequestError(f"unknown output '{name}'; the model has {spec.LOGITS}")
        out_params = _field(output, "parameters", dict, f"output {name}", default={})
        binary_output = bool(out_params.get("binary_data", binary_output))
    request_id = request.get("id")
    request_id = request_id if isinstance(request_id, str) else None
    return DecodedRequest(shape[0], pixels, binary_output, request_id)


def encode_response(logits: np.ndarray, request: DecodedRequest) -> Response:
    """The KServe v2 answer with LOGITS, as JSON numbers or as a binary tensor.

    Args:
        logits: float32 [batch, 1000], C-contiguous.
        request: the decoded request (its id and the output encoding it asked for).

    Returns:
        The HTTP response.
    """
    output: dict = {"name": spec.LOGITS, "datatype": "FP32", "shape": list(logits.shape)}
    reply: dict = {"model_name": MODEL_NAME, "model_version": MODEL_VERSION, "outputs": [output]}
    if request.request_id is not None:
        reply["id"] = request.request_id
    if request.binary_output:
        raw = logits.astype("<f4", copy=False).tobytes()
        output["parameters"] = {"binary_data_size": len(raw)}
        header = orjson.dumps(reply)
        return Response(
            header + raw,
            media_type="application/octet-stream",
            headers={HEADER_LENGTH: str(len(header))},
        )
    # orjson writes a contiguous float32 array natively: no tolist(), no Python floats.
    output["data"] = np.ascontiguousarray(logits).reshape(-1)
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
            "name": MODEL_NAME,
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
    pixels: np.ndarray
    future: asyncio.Future
    enqueued_ns: int


@dataclass(frozen=True)
class _Execution:
    outputs: list[np.ndarray | Exception]  # one per request, in order
    input_ns: int
    infer_ns: int


def _log_crash(task: asyncio.Task) -> None:
    # Without this a crashed batcher would only show up as requests that never finish.
    if not task.cancelled() and task.exception() is not None:
        log.error("the micro-batcher stopped", exc_info=task.exception())


class MicroBatcher:
    """Collects concurrent requests into one model run in a worker thread.

    ``run_batch`` maps a float32 [rows, ...] batch to [rows, ...] outputs; it is called in a
    single dedicated thread, one batch at a time. While it runs, new requests queue up and form
    the next batch, so under load batches fill without waiting.
    """

    def __init__(
        self,
        run_batch: Callable[[np.ndarray], np.ndarray],
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

    async def submit(self, pixels: np.ndarray) -> np.ndarray:
        """Queue ``pixels`` ([rows, ...], rows <= max_batch) and await their outputs."""
        return (await self.submit_timed(pixels))[0]

    async def submit_timed(self, pixels: np.ndarray) -> tuple[np.ndarray, Timing]:
        """Like submit(), and say where the time went."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(pixels, future, time.perf_counter_ns()))
        return await future

    async def _collect(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        first, self._carry = self._carry or await self._queue.get(), None
        batch, rows = [first], len(first.pixels)
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
            if rows + len(item.pixels) > self.max_batch:
                self._carry = item  # first in line for the next batch: order is kept
                break
            batch.append(item)
            rows += len(item.pixels)
        return batch

    def _execute(self, arrays: list[np.ndarray]) -> _Execution:
        """In the worker thread: concatenate, run once, split; isolate a failing request."""
        start = time.perf_counter_ns()
        batch = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
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
        for pixels in arrays:
            try:
                outputs.append(self.run_batch(pixels))
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
                    self._executor, self._execute, [p.pixels for p in batch]
                )
            except Exception as exc:  # noqa: BLE001 - the executor itself failed
                execution = _Execution([exc] * len(batch), 0, 0)
            rows = sum(len(p.pixels) for p in batch)
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
    """What the routes share: the model (or none), the batcher and the statistics."""

    def __init__(
        self, model_path: Path | None, intra_op_threads: int, max_batch: int, max_wait_ms: float
    ):
        self.max_batch = max_batch
        self.stats = ModelStats()
        self.ready = False
        self.batcher: MicroBatcher | None = None
        self.description = "null model (zeros)"
        if model_path is not None:
            session = onnx_runner.create_session(model_path, intra_op_threads=intra_op_threads)

            def run_batch(pixels: np.ndarray) -> np.ndarray:
                return session.run([spec.LOGITS], {spec.PIXELS: pixels})[0]

            # The first run allocates and plans; do it before the server says it is ready.
            run_batch(np.zeros((1, *INPUT_DIMS), np.float32))
            self.batcher = MicroBatcher(run_batch, max_batch, max_wait_ms, self.stats)
            self.description = (
                f"{model_path} ({intra_op_threads} intra-op threads, max batch {max_batch}, "
                f"max wait {max_wait_ms} ms)"
            )
        # Null mode answers slices of one preallocated array.
        self.zeros = np.zeros((max_batch, *OUTPUT_DIMS), np.float32)

    async def infer(self, request: DecodedRequest) -> tuple[np.ndarray, Timing]:
        if self.batcher is None:
            self.stats.record_execution(request.rows, 0, 0)
            return self.zeros[: request.rows], Timing()
        return await self.batcher.submit_timed(request.pixels)

    def config(self) -> dict:
        """The model configuration, shaped like Triton's JSON ``/config`` answer.

        As in config.pbtxt, ``dims`` leave out the batch dimension.
        """
        tensor = {"data_type": "TYPE_FP32", "format": "FORMAT_NONE", "is_shape_tensor": False}
        return {
            "name": MODEL_NAME,
            "platform": "onnxruntime_onnx",
            "backend": "onnxruntime",
            "version_policy": {"latest": {"num_versions": 1}},
            "max_batch_size": self.max_batch,
            "input": [{"name": spec.PIXELS, **tensor, "dims": list(INPUT_DIMS)}],
            "output": [{"name": spec.LOGITS, **tensor, "dims": list(OUTPUT_DIMS)}],
            "dynamic_batching": {
                "max_queue_delay_microseconds": round(
                    (self.batcher.max_wait if self.batcher else 0) * 1e6
                )
            },
            "instance_group": [{"name": MODEL_NAME, "kind": "KIND_CPU", "count": 1}],
            "model_transaction_policy": {"decoupled": False},
            "parameters": {},
        }


def _json(content: object, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type=JSON_TYPE)


def _error(message: str, status: int = 400) -> Response:
    return _json({"error": message}, status)


def _check_model(request: Request) -> None:
    model = request.path_params["model"]
    version = request.path_params.get("version", MODEL_VERSION)
    if model != MODEL_NAME:
        raise UnknownModelError(f"Request for unknown model: '{model}' is not found")
    if version not in (MODEL_VERSION, ""):
        raise UnknownModelError(f"Request for unknown model: '{model}' version {version}")


def create_app(
    model_path: Path | None,
    intra_op_threads: int = 1,
    max_batch: int = 32,
    max_wait_ms: float = 2.0,
) -> FastAPI:
    """The peer server as an ASGI app; the model session is opened (and warmed up) here.

    Args:
        model_path: the classifier's ONNX file; None serves the null model (zeros, no model).
        intra_op_threads: onnxruntime intra-op threads for the one session.
        max_batch: the most rows per model run, and per request (``max_batch_size``).
        max_wait_ms: how long a batch waits for more requests after its first one.

    Returns:
        The FastAPI application; its lifespan starts and stops the micro-batcher.
    """
    peer = _Peer(model_path, intra_op_threads, max_batch, max_wait_ms)

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
        title="classifier peer (FastAPI + micro-batcher)",
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
        _check_model(request)
        return Response(status_code=200 if peer.ready else 503)

    async def model_metadata(request: Request) -> Response:
        _check_model(request)
        return _json(
            {
                "name": MODEL_NAME,
                "versions": [MODEL_VERSION],
                "platform": "onnxruntime_onnx",
                "inputs": [{"name": spec.PIXELS, "datatype": "FP32", "shape": [-1, *INPUT_DIMS]}],
                "outputs": [{"name": spec.LOGITS, "datatype": "FP32", "shape": [-1, *OUTPUT_DIMS]}],
            }
        )

    async def model_config(request: Request) -> Response:
        _check_model(request)
        return _json(peer.config())

    async def model_stats(request: Request) -> Response:
        if "model" in request.path_params:
            _check_model(request)
        return _json({"model_stats": [peer.stats.as_json()]})

    async def infer(request: Request) -> Response:
        start = time.perf_counter_ns()
        _check_model(request)
        decoded = decode_request(
            await request.body(),
            request.headers.get(HEADER_LENGTH),
            peer.max_batch,
            # The null model skips the numbers' conversion: it measures the load generator.
            convert=peer.batcher is not None,
        )
        try:
            logits, timing = await peer.infer(decoded)
        except Exception as exc:  # noqa: BLE001 - the model failed on this request
            log.warning("inference failed: %s", exc)
            peer.stats.fail.add(time.perf_counter_ns() - start)
            return _error(f"{MODEL_NAME} failed: {exc}", 500)
        computed = time.perf_counter_ns()
        response = encode_response(logits, decoded)
        done = time.perf_counter_ns()
        peer.stats.record_request(len(logits), timing, done - computed, done - start)
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
        max_batch: int = 32,
        max_wait_ms: float = 2.0,
        cpus: list[int] | None = None,
        log_path: Path | None = None,
    ):
        super().__init__(log_path)
        self.model_path = model_path
        self.port = port
        self.host = host
        self.intra_op_threads = intra_op_threads
        self.max_batch = max_batch
        self.max_wait_ms = max_wait_ms
        self.cpus = cpus

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
        args = [sys.executable, "-m", "client.perf.peer", "--host", self.host]
        args += ["--port", str(self.port), "--threads", str(self.intra_op_threads)]
        args += ["--max-batch", str(self.max_batch), "--max-wait-ms", str(self.max_wait_ms)]
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


def main(argv: list[str] | None = None) -> int:
    """CLI: serve the classifier (or the null model) until SIGTERM or Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m client.perf.peer",
        description="The classifier on FastAPI + uvicorn with an asyncio micro-batcher, "
        "speaking the KServe v2 HTTP protocol (a peer baseline for perf_analyzer).",
    )
    parser.add_argument(
        "--model", type=Path, default=DEFAULT_MODEL, help="ONNX file (default: %(default)s)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8010, help="HTTP port (default: %(default)s)")
    parser.add_argument(
        "--threads", type=int, default=1, help="onnxruntime intra-op threads (default: 1)"
    )
    parser.add_argument(
        "--max-batch", type=int, default=32, help="most rows per model run (default: 32)"
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
    if args.max_batch < 1 or args.max_wait_ms < 0 or args.threads < 1:
        parser.error("--max-batch and --threads must be >= 1, --max-wait-ms >= 0")
    if not args.null and not args.model.is_file():
        parser.error(f"model not found: {args.model} (run `make models`, or pass --null)")

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s")
    import uvicorn  # the server is only needed here, not by importers of create_app

    app = create_app(
        None if args.null else args.model, args.threads, args.max_batch, args.max_wait_ms
    )
    print(f"peer serving on http://{args.host}:{args.port}/v2/models/{MODEL_NAME}", flush=True)
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
