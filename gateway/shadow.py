"""A rollout's comparator: sampled live requests sent to both versions, their answers compared.

During a rollout (``gateway.nginx.rollout.Rollout`` with ``shadow``) nginx copies a sample of
the rollout's admitted inference requests here (``mirror``; gateway/openai.js for an OpenAI
call, once its buckets admitted it): each arrives as a POST to its original URI with its
original body, and ``X-Rollout-Models`` naming the models in the rollout. It answers at once,
so the client's request never waits on it, and queues the copy. A worker decodes the request's
inputs (Triton's HTTP/REST JSON or binary tensors, gRPC's ``ModelInferRequest``, or an OpenAI
embeddings body), skips a model outside the rollout, sends the inputs to a stable and a canary
server with tritonclient, one request each, and records, for every FP32 output both answer,
the cosine of each row's pair of vectors (one per text for an embedding). A request it cannot
read is skipped, an error answer from either version counts as failed; neither ever stops a
worker:

    gateway_rollout_cosine{model}               histogram, near 1 when the versions agree
    gateway_rollout_shadow_total{model,outcome} compared, failed, skipped, dropped

What one copy may cost is bounded (``Bounds``), whoever sends it: a body over its size is not
read, a compressed one is not inflated past a size, nor decoded past one, a request of more
rows than the model's ``max_batch_size`` (which Triton refuses) is skipped, never split, and
the queue holds a number of copies and of bytes; past a bound a copy is skipped or dropped
(counted), and nothing reaches either version.

    python -m gateway.shadow --stable 127.0.0.1:8000 --canary 127.0.0.1:8100 \
        --host 127.0.0.1 --port 9147 --metrics-host 127.0.0.1 --metrics-port 9146
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import queue
import random
import re
import struct
import sys
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import cachetools
import numpy as np
import tritonclient.http as httpclient
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, triton_to_np_dtype

from gateway.nginx.config import SHADOW_IDLE_S
from gateway.served import SERVED
from pipelines import embedding

__all__ = [
    "Bounds",
    "Comparator",
    "TooLargeError",
    "batch_sizes_on",
    "decode_request",
    "listener",
    "replay_on",
    "row_cosines",
]

log = logging.getLogger(__name__)

COSINE_METRIC = "gateway_rollout_cosine"
SHADOW_METRIC = "gateway_rollout_shadow"
COMPARED, FAILED, SKIPPED, DROPPED = "compared", "failed", "skipped", "dropped"
# Where two versions of one model land: INT8 against fp32 is about 0.995 (docs/gpu.md).
COSINE_BUCKETS = (0.9, 0.95, 0.98, 0.99, 0.995, 0.998, 0.999, 0.9995, 0.9999, 1.0)
MODELS_HEADER = "X-Rollout-Models"  # space-separated
OTHER = "other"  # a model label no client can multiply
DEFAULT_PORT = 9147
DEFAULT_METRICS_PORT = 9146
HTTP_INFER = re.compile(r"^/v2/models/(?P<model>[^/]+)(/versions/[0-9]+)?/infer$")
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
OPENAI_EMBEDDINGS = "/v1/embeddings"
# What one decoded value takes in Python beyond its own bytes, at most about: a BYTES element
# (a bytes object and its slot in an object array), or a JSON value or key (the object, its
# slot in a list or dict).
OBJECT_BYTES = 64
MIB = 1 << 20

# name -> array; its Triton datatype is the dtype's (object: BYTES, bool: BOOL).
Inputs = dict[str, np.ndarray]
# A gRPC tensor's typed contents (InferTensorContents), by datatype; FP16 and BF16 have none.
GRPC_CONTENTS = {
    "BOOL": "bool_contents",
    **dict.fromkeys(("INT8", "INT16", "INT32"), "int_contents"),
    "INT64": "int64_contents",
    **dict.fromkeys(("UINT8", "UINT16", "UINT32"), "uint_contents"),
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# A body's Content-Encoding → zlib's wbits for it (HTTP's deflate is zlib's format).
INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


@dataclass(frozen=True)
class Bounds:
    """What mirrored requests may hold of the comparator; past a bound a copy is not compared.

    A worker holds at most about ``body`` + 2 × ``inflated`` bytes for its request (the body,
    what it inflates to, what that decodes to), and the listener at most ``queue`` bytes of
    bodies, whatever is sent.

    Attributes:
        body: bytes of one body read at most; a larger one is read past and skipped.
        inflated: bytes one request may inflate to (gzip, deflate), and, apart, bytes its JSON
            and tensors may decode to (``OBJECT_BYTES`` for each JSON value and BYTES element);
            a request over either is skipped before it is made.
        queue: bytes of bodies held at once, queued or being compared; more are dropped.
        items: requests held at once, queued or being compared; more are dropped.
        connections: connections served at once; another is closed at once (dropped).
    """

    body: int = 8 * MIB
    inflated: int = 16 * MIB
    queue: int = 32 * MIB
    items: int = 64
    connections: int = 32


# Each bound's option: (flag, its Bounds field, the bytes of one unit of it, what it bounds).
BOUND_OPTIONS = (
    ("--max-body-mib", "body", MIB, "a larger body is not read"),
    ("--max-inflated-mib", "inflated", MIB, "what one request may inflate to, and decode to"),
    ("--queue-mib", "queue", MIB, "bytes of bodies held at once"),
    ("--queue", "items", 1, "requests held at once"),
    ("--connections", "connections", 1, "connections served at once"),
)


class TooLargeError(ValueError):
    """A request that would take more than ``Bounds`` lets one take."""


class _Budget:
    """Bytes a request may still decode to: each part is paid for before it is made."""

    def __init__(self, limit: int):
        self.left = limit

    def spend(self, size: int, what: str) -> None:
        self.left -= size
        if self.left < 0:
            raise TooLargeError(f"{what}: over the bound on what a request may decode to")


def _dtype(datatype: str) -> type:
    """The numpy type of a Triton datatype.

    Raises:
        ValueError: one that would not be sent on as it came (BF16 has no numpy type;
            tritonclient holds it as float32).
    """
    dtype = triton_to_np_dtype(datatype)
    if dtype is None or np_to_triton_dtype(dtype) != datatype:
        raise ValueError(f"datatype {datatype} is not replayed")
    return dtype


def _shape(value: Any) -> list[int]:
    shape = list(value)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"shape {shape!r} is not a list of sizes")
    return shape


def _cost(datatype: str, shape: Sequence[int]) -> int:
    """What a tensor of this datatype and shape takes decoded."""
    per = OBJECT_BYTES if datatype == "BYTES" else np.dtype(_dtype(datatype)).itemsize
    return math.prod(shape) * per


def _array(raw: bytes, datatype: str, shape: Sequence[int], budget: _Budget) -> np.ndarray:
    budget.spend(_cost(datatype, shape) + len(raw), "a tensor")
    if datatype == "BYTES":
        # Exactly the shape's elements, each a 4-byte length and its bytes: checked before
        # decoding, or 4 bytes of zeros would make an element each, whatever the shape said.
        offset = 0
        for _ in range(math.prod(shape)):
            (length,) = struct.unpack_from("<I", raw, offset)
            offset += 4 + length
        if offset != len(raw):
            raise ValueError("BYTES data does not hold the shape's elements")
        return deserialize_bytes_tensor(raw).reshape(shape)
    return np.frombuffer(raw, dtype=_dtype(datatype)).reshape(shape)


def _from_json(data: list, datatype: str, shape: Sequence[int], budget: _Budget) -> np.ndarray:
    budget.spend(_cost(datatype, shape), "a tensor")
    if datatype == "BYTES":
        items = []
        for item in np.ravel(data):
            if not isinstance(item, (str, bytes)):
                # Triton refuses it; bytes(n) of a number would be n zero bytes.
                raise ValueError(f"a BYTES element of type {type(item).__name__}")
            items.append(item.encode("utf-8") if isinstance(item, str) else bytes(item))
        return np.array(items, dtype=np.object_).reshape(shape)
    return np.array(data, dtype=_dtype(datatype)).reshape(shape)


def _json(text: bytes, budget: _Budget) -> Any:
    """``text`` parsed, once the values it can hold fit the budget.

    Every JSON value but the first follows a '[', ',' or ':', and every key a '{' or ',': their
    count bounds the objects json would make, before it makes them.
    """
    values = 1 + sum(text.count(c) for c in (b"[", b"{", b",", b":"))
    budget.spend(len(text) + values * OBJECT_BYTES, "JSON")
    return json.loads(text)


def _inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """A gzip or deflate body inflated, never past ``limit`` bytes.

    Raises:
        TooLargeError: it inflates to more.
        ValueError: it is not one whole stream of that encoding.
    """
    inflater = zlib.decompressobj(INFLATE_WBITS[encoding])
    data = inflater.decompress(body, limit + 1)
    if len(data) > limit:
        raise TooLargeError(f"a {encoding} body inflates past {limit} bytes")
    if not inflater.eof or inflater.unused_data:
        raise ValueError(f"not one whole {encoding} stream")
    return data


def _kserve(headers: Mapping[str, str], body: bytes, budget: _Budget) -> Inputs:
    """Triton's HTTP/REST request: JSON, or JSON then binary tensors (its extension)."""
    length = headers.get("inference-header-content-length")
    offset = int(length) if length else len(body)
    if not 0 <= offset <= len(body):
        raise ValueError("Inference-Header-Content-Length outside the body")
    header = _json(body[:offset], budget)
    inputs = {}
    for tensor in header["inputs"]:
        datatype, shape = tensor["datatype"], _shape(tensor["shape"])
        size = tensor.get("parameters", {}).get("binary_data_size")
        if size is None:
            inputs[tensor["name"]] = _from_json(tensor["data"], datatype, shape, budget)
        else:
            if not (isinstance(size, int) and 0 <= size <= len(body) - offset):
                raise ValueError(f"binary_data_size {size!r} outside the body")
            raw = body[offset : offset + size]
            offset += size
            inputs[tensor["name"]] = _array(raw, datatype, shape, budget)
    return inputs


def _grpc(body: bytes, budget: _Budget) -> tuple[str, Inputs] | None:
    """A gRPC ModelInferRequest frame (uncompressed): raw contents, or each input's typed ones."""
    from tritonclient.grpc import service_pb2

    if len(body) < 5 or body[0] != 0:
        return None  # compressed, or not a frame
    length = int.from_bytes(body[1:5], "big")
    if len(body) < 5 + length:
        return None  # cut short: protobuf would read what is there as a whole message
    budget.spend(length, "the message")
    request = service_pb2.ModelInferRequest.FromString(body[5 : 5 + length])
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        return None  # Triton refuses a request that mixes the two
    inputs = {}
    for index, tensor in enumerate(request.inputs):
        shape = _shape(tensor.shape)
        if raw:
            inputs[tensor.name] = _array(raw[index], tensor.datatype, shape, budget)
        else:
            data = getattr(tensor.contents, GRPC_CONTENTS[tensor.datatype])
            budget.spend(len(data) * OBJECT_BYTES, "typed contents")
            inputs[tensor.name] = _from_json(list(data), tensor.datatype, shape, budget)
    return request.model_name, inputs


def _openai(body: bytes, budget: _Budget) -> tuple[str, Inputs] | None:
    """An OpenAI embeddings call: its first texts as the model's TEXT (and TRUNCATE) rows.

    The gateway sends a call's texts as requests of the model's ``max_batch_size``
    (``OpenAI.chunk``); its first request stands for the call, so that a call of any size costs
    one request on each version. The inputs are those ``client.embed.build_inputs`` sends for
    the same texts.
    """
    call = _json(body, budget)
    if call["model"] not in embedding.OPENAI_MODELS:
        return None  # the gateway refuses it: nothing either version answered
    texts = [call["input"]] if isinstance(call["input"], str) else call["input"]
    if not texts or len(texts) > embedding.MAX_OPENAI_INPUTS:
        return None  # the gateway refuses it
    if not all(isinstance(t, str) for t in texts):
        return None  # token arrays: not replayed
    texts = texts[: embedding.MAX_TEXTS]
    rows = np.array([t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)
    inputs = {embedding.TEXT: rows}
    if call.get("truncate"):
        inputs[embedding.TRUNCATE] = np.ones((len(texts), 1), dtype=bool)
    return call["model"], inputs


def decode_request(
    path: str, headers: Mapping[str, str], body: bytes, limit: int = Bounds.inflated
) -> tuple[str, Inputs] | None:
    """The model and inputs of a mirrored request; None for one this cannot replay.

    Args:
        path: the request's original URI.
        headers: its headers (any case).
        body: its body, as sent (gzip and deflate are undone, up to ``limit`` bytes).
        limit: bytes the body may inflate to, and, apart, bytes its JSON and tensors may decode
            to (``Bounds.inflated``).

    Returns:
        The model the request names (the path's, the gRPC request's, the OpenAI call's) and
        its inputs by name, or None: another path, an encoding or a form not replayed, a body
        that does not parse, or one over ``limit``. Never raises.
    """
    headers = {k.lower(): v for k, v in headers.items()}
    encoding = headers.get("content-encoding", "identity").strip().lower()
    try:
        if encoding in INFLATE_WBITS:
            body = _inflate(body, encoding, limit)
        elif encoding not in ("", "identity"):
            return None
        budget = _Budget(limit)
        path = path.split("?", 1)[0]
        if path == GRPC_INFER:
            decoded = _grpc(body, budget)
        elif path == OPENAI_EMBEDDINGS:
            decoded = _openai(body, budget)
        elif match := HTTP_INFER.match(path):
            decoded = match["model"], _kserve(headers, body, budget)
        else:
            return None
    except Exception as exc:  # noqa: BLE001 - zlib, json, struct and protobuf raise their own
        log.debug("cannot decode %s: %s", path, exc)
        return None
    return decoded


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine of each row of ``a`` with the same row of ``b`` (rows: the first axis).

    Two zero rows agree (1); a zero row against another is 0.

    Raises:
        ValueError: the two do not have the same shape, or have no first axis.
    """
    if a.shape != b.shape or a.ndim == 0:
        raise ValueError(f"the versions answered shapes {a.shape} and {b.shape}")
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosines = np.sum(a * b, axis=1) / np.where(norms == 0, 1.0, norms)
    both_zero = ~a.any(axis=1) & ~b.any(axis=1)
    return np.where(both_zero, 1.0, cosines)


def infer(url: str, model: str, inputs: Inputs) -> dict[str, np.ndarray]:
    """Every FP32 output of ``model`` on the server at ``url`` for ``inputs``, in one request."""
    tensors = []
    for name, array in inputs.items():
        # Built here, not with client.connection: the gateway's image has no client/.
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=True)
        tensors.append(tensor)
    with httpclient.InferenceServerClient(url, connection_timeout=10, network_timeout=30) as c:
        # No outputs named: Triton answers all of them, as binary tensors.
        result = c.infer(model, tensors)
    return {
        out["name"]: result.as_numpy(out["name"])
        for out in result.get_response()["outputs"]
        if out["datatype"] == "FP32"
    }


Replay = Callable[[str, Inputs], tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]
# model → its max_batch_size (0: it does not batch), or None when not known.
BatchSizes = Callable[[str], "int | None"]


def _unknown(model: str) -> int | None:
    return None


def rows(inputs: Inputs) -> int:
    """The most rows (first axis) of any input: what Triton holds against ``max_batch_size``."""
    return max((len(a) for a in inputs.values() if a.ndim), default=0)


class Comparator:
    """The queue of mirrored requests, its workers, and the comparison's metrics.

    Args:
        replay: (model, inputs) → (the stable version's FP32 outputs, the canary's).
        registry: where the metrics live (a new one by default).
        bounds: what the requests held at once may take (``Bounds``).
        workers: threads replaying at once.
        batch_sizes: model → its ``max_batch_size`` (``batch_sizes_on``); a request of more
            rows is skipped. By default none is known, and none is skipped so.
    """

    def __init__(
        self,
        replay: Replay,
        registry: CollectorRegistry | None = None,
        bounds: Bounds = Bounds(),
        workers: int = 2,
        batch_sizes: BatchSizes = _unknown,
    ):
        self.replay = replay
        self.bounds = bounds
        self.batch_sizes = batch_sizes
        self.registry = registry or CollectorRegistry()
        self.cosine = Histogram(
            COSINE_METRIC,
            "Cosine of the stable and canary versions' answers to one sampled row.",
            ["model"],
            registry=self.registry,
            buckets=COSINE_BUCKETS,
        )
        self.requests = Counter(
            SHADOW_METRIC,
            "Sampled requests of a rollout, by what the comparator did with them.",
            ["model", "outcome"],
            registry=self.registry,
        )
        # Bounded by what hold() lets in, in requests and in bytes, not by the queue itself.
        self.queue: queue.Queue = queue.Queue()
        self._held = [0, 0]  # requests, bytes
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, daemon=True, name=f"shadow-{i}")
            for i in range(workers)
        ]

    def start(self) -> Comparator:
        """Start the workers."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Let the workers finish what they hold, then stop them."""
        for _ in self._threads:
            self.queue.put(None)
        for thread in self._threads:
            thread.join(timeout=30)

    def __enter__(self) -> Comparator:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @staticmethod
    def label(model: str) -> str:
        """The model label: a served model, else ``other``."""
        return model if model in SERVED else OTHER

    def hold(self, size: int) -> str | None:
        """Room for a body of ``size`` bytes, taken before it is read.

        Returns:
            None once held (``enqueue`` it, or ``release`` it), else what was counted: skipped
            (over ``Bounds.body``) or dropped (``Bounds.queue`` or ``Bounds.items`` full).
        """
        if size > self.bounds.body:
            self.requests.labels(OTHER, SKIPPED).inc()  # not read: no model to name
            return SKIPPED
        with self._lock:
            count, held = self._held
            full = count >= self.bounds.items or held + size > self.bounds.queue
            if not full:
                self._held = [count + 1, held + size]
        if full:
            self.requests.labels(OTHER, DROPPED).inc()
            return DROPPED
        return None

    def release(self, size: int) -> None:
        """Give back what ``hold`` took for a body of ``size`` bytes."""
        with self._lock:
            self._held = [self._held[0] - 1, self._held[1] - size]

    def enqueue(self, path: str, headers: Mapping[str, str], body: bytes) -> None:
        """Queue a request whose body is held (``hold``); a worker releases it when done."""
        self.queue.put((path, dict(headers), body))

    def submit(self, path: str, headers: Mapping[str, str], body: bytes) -> bool:
        """Queue one mirrored request; False (counted) when it is over a bound."""
        if self.hold(len(body)) is not None:
            return False
        self.enqueue(path, headers, body)
        return True

    def compare(self, path: str, headers: Mapping[str, str], body: bytes) -> str:
        """Replay one request on both versions and record the cosines; the outcome."""
        decoded = decode_request(path, headers, body, self.bounds.inflated)
        in_rollout = {k.lower(): v for k, v in headers.items()}.get(MODELS_HEADER.lower())
        if decoded is None or (in_rollout is not None and decoded[0] not in in_rollout.split()):
            self.requests.labels(self.label(decoded[0] if decoded else ""), SKIPPED).inc()
            return SKIPPED
        model, inputs = decoded
        label = self.label(model)
        batch_size = self.batch_sizes(model)
        if batch_size and rows(inputs) > batch_size:
            # Triton refuses it: sent whole it would cost both versions its bytes for nothing,
            # split it would be any number of requests that no client's request was.
            log.info("%s: not compared: %d rows, over max_batch_size %d", model, rows(inputs),
                     batch_size)  # fmt: skip
            self.requests.labels(label, SKIPPED).inc()
            return SKIPPED
        try:
            stable, canary = self.replay(model, inputs)
            cosines = [
                row_cosines(stable[name], canary[name]) for name in sorted(stable.keys() & canary)
            ]
        except Exception as exc:  # noqa: BLE001 - a version's error is what this counts
            log.info("%s: not compared: %s", model, exc)
            self.requests.labels(label, FAILED).inc()
            return FAILED
        if not cosines:
            self.requests.labels(label, SKIPPED).inc()
            return SKIPPED
        values = np.concatenate(cosines)
        if not np.isfinite(values).all():
            # A NaN or inf answer is a broken version, and one NaN would make the histogram's
            # sum NaN for as long as the process lives.
            log.info("%s: not compared: an answer that is not finite", model)
            self.requests.labels(label, FAILED).inc()
            return FAILED
        for value in values:
            self.cosine.labels(label).observe(float(value))
        self.requests.labels(label, COMPARED).inc()
        return COMPARED

    def _work(self) -> None:
        while (job := self.queue.get()) is not None:
            try:
                self.compare(*job)
            except Exception:  # a worker lost is every later copy dropped
                log.exception("a mirrored request of %s", job[0])
                self.requests.labels(OTHER, SKIPPED).inc()
            finally:
                self.release(len(job[2]))


def replay_on(stable: Sequence[str], canary: Sequence[str]) -> Replay:
    """The replay on real servers: one of each version, picked at random per request."""

    def replay(model: str, inputs: Inputs):
        return infer(random.choice(stable), model, inputs), infer(
            random.choice(canary), model, inputs
        )

    return replay


def batch_sizes_on(servers: Sequence[str], ttl_s: float = 60.0) -> BatchSizes:
    """Each model's ``max_batch_size``, as one of ``servers`` configures it.

    Read again after ``ttl_s``. None for a model whose config cannot be read: its requests then
    go to Triton, which refuses any over the size it has.
    """

    # Bounded: a name in a request is whatever its sender wrote.
    @cachetools.cached(cachetools.TTLCache(maxsize=256, ttl=ttl_s), lock=threading.Lock())
    def batch_size(model: str) -> int | None:
        try:
            url = random.choice(servers)
            with httpclient.InferenceServerClient(url, connection_timeout=10) as client:
                return int(client.get_model_config(model).get("max_batch_size", 0))
        except Exception as exc:  # noqa: BLE001 - tritonclient and gevent raise their own
            log.info("%s: max_batch_size not read: %s", model, exc)
            return None

    return batch_size


def _discard(stream, size: int) -> None:
    """Read ``size`` bytes of ``stream`` and keep none of them."""
    while size > 0:
        chunk = stream.read(min(size, 1 << 16))
        if not chunk:
            raise ConnectionError("the body ended early")
        size -= len(chunk)


class _Listener(ThreadingHTTPServer):
    """A thread per connection, and at most ``connections`` of them at once."""

    def __init__(self, address, handler, comparator: Comparator):
        super().__init__(address, handler)
        self.comparator = comparator
        self._slots = threading.BoundedSemaphore(comparator.bounds.connections)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            self.comparator.requests.labels(OTHER, DROPPED).inc()
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def listener(comparator: Comparator, host: str, port: int) -> ThreadingHTTPServer:
    """The HTTP server nginx mirrors to: an answer at once, the request queued.

    204 once queued (or dropped, the queue being full), 413 for a body over ``Bounds.body``,
    which is read past, never kept; 411 without a Content-Length (nginx sends one).
    """

    class Mirrored(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keepalive from nginx's upstream pool
        timeout = SHADOW_IDLE_S  # an idle connection, or a stalled body, is closed

        def do_POST(self):
            try:
                size = int(self.headers.get("Content-Length", ""))
                if size < 0:
                    raise ValueError(size)
            except ValueError:
                self.send_error(411)  # and the connection closed: its body is not read
                return
            refused = comparator.hold(size)
            try:
                if refused is None:
                    body = self.rfile.read(size)
                    if len(body) != size:
                        raise ConnectionError("the body ended early")
                else:
                    _discard(self.rfile, size)
            except OSError:
                if refused is None:
                    comparator.release(size)
                self.close_connection = True
                return
            self.send_response(413 if refused == SKIPPED else 204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            if refused is None:
                comparator.enqueue(self.path, dict(self.headers.items()), body)

        def log_message(self, *args):  # one line per sampled request is noise
            pass

    return _Listener((host, port), Mirrored, comparator)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the comparator and its metrics until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m gateway.shadow",
        description="Compare a rollout's two versions on the requests nginx mirrors here.",
        epilog="example: python -m gateway.shadow --stable 127.0.0.1:8000 "
        "--canary 127.0.0.1:8100 --port 9147 --metrics-port 9146",
    )
    parser.add_argument("--stable", action="append", required=True, help="a server's HTTP")
    parser.add_argument("--canary", action="append", required=True, help="a canary's HTTP")
    parser.add_argument(
        "--host", default="127.0.0.1", help="where nginx's copies arrive (default loopback)"
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default %(default)s")
    parser.add_argument(
        "--metrics-host", default="127.0.0.1", help="where /metrics is served (default loopback)"
    )
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    defaults = Bounds()
    for flag, field, unit, text in BOUND_OPTIONS:
        parser.add_argument(
            flag,
            type=int,
            default=getattr(defaults, field) // unit,
            help=f"{text} (default %(default)s)",
        )
    parser.add_argument("--workers", type=int, default=2, help="requests replayed at once")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    given = vars(args)
    bounds = Bounds(
        **{
            field: given[flag[2:].replace("-", "_")] * unit
            for flag, field, unit, _ in BOUND_OPTIONS
        }
    )
    comparator = Comparator(
        replay_on(args.stable, args.canary),
        bounds=bounds,
        workers=args.workers,
        batch_sizes=batch_sizes_on(args.stable),
    )
    metrics, metrics_thread = start_http_server(
        args.metrics_port, args.metrics_host, registry=comparator.registry
    )
    server = listener(comparator, args.host, args.port)
    log.info("comparing on %s:%d, /metrics on %s:%d", args.host, args.port, args.metrics_host,
             args.metrics_port)  # fmt: skip
    with comparator:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
            metrics.shutdown()
            metrics_thread.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
