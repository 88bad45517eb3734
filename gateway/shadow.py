"""A rollout's comparator: sampled live requests sent to both versions, their answers compared.

During a rollout (``gateway.nginx.config.Rollout`` with ``shadow``) nginx copies a sample of
the rollout's inference requests here (``mirror``): each arrives as a POST to its original
URI with its original body, and ``X-Rollout-Models`` naming the models in the rollout. It
answers 204 at once, so the client's request never waits on it, and queues the copy (a full
queue drops it, counted). A worker decodes the request's inputs (Triton's HTTP/REST JSON or
binary tensors, gRPC's ``ModelInferRequest``, or an OpenAI embeddings body), skips a model
outside the rollout, sends the inputs to a stable and a canary server with tritonclient, and
records, for every FP32 output both answer, the cosine of each row's pair of vectors (one per
text for an embedding). A request it cannot read is skipped, an error answer from either
version counts as failed; neither ever stops a worker:

    gateway_rollout_cosine{model}               histogram, near 1 when the versions agree
    gateway_rollout_shadow_total{model,outcome} compared, failed, skipped, dropped

    python -m gateway.shadow --stable 127.0.0.1:8000 --canary 127.0.0.1:8100 --port 9147 \
        --metrics-port 9146
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import queue
import random
import re
import sys
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import tritonclient.http as httpclient
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, triton_to_np_dtype

from gateway.nginx.config import SERVED
from pipelines import embedding

__all__ = ["Comparator", "decode_request", "row_cosines"]

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


def _array(raw: bytes, datatype: str, shape: Sequence[int]) -> np.ndarray:
    if datatype == "BYTES":
        return deserialize_bytes_tensor(raw).reshape(shape)
    return np.frombuffer(raw, dtype=_dtype(datatype)).reshape(shape)


def _from_json(data: list, datatype: str, shape: Sequence[int]) -> np.ndarray:
    if datatype == "BYTES":
        items = [d.encode("utf-8") if isinstance(d, str) else bytes(d) for d in np.ravel(data)]
        return np.array(items, dtype=np.object_).reshape(shape)
    return np.array(data, dtype=_dtype(datatype)).reshape(shape)


def _kserve(headers: Mapping[str, str], body: bytes) -> Inputs:
    """Triton's HTTP/REST request: JSON, or JSON then binary tensors (its extension)."""
    length = headers.get("inference-header-content-length")
    header = json.loads(body[: int(length)] if length else body)
    offset = int(length) if length else 0
    inputs = {}
    for tensor in header["inputs"]:
        datatype, shape = tensor["datatype"], tensor["shape"]
        size = tensor.get("parameters", {}).get("binary_data_size")
        if size is None:
            inputs[tensor["name"]] = _from_json(tensor["data"], datatype, shape)
        else:
            raw = body[offset : offset + size]
            offset += size
            inputs[tensor["name"]] = _array(raw, datatype, shape)
    return inputs


def _grpc(body: bytes) -> tuple[str, Inputs] | None:
    """A gRPC ModelInferRequest frame (uncompressed): raw contents, or each input's typed ones."""
    from tritonclient.grpc import service_pb2

    if len(body) < 5 or body[0] != 0:
        return None  # compressed, or not a frame
    length = int.from_bytes(body[1:5], "big")
    if len(body) < 5 + length:
        return None  # cut short: protobuf would read what is there as a whole message
    request = service_pb2.ModelInferRequest.FromString(body[5 : 5 + length])
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        return None  # Triton refuses a request that mixes the two
    inputs = {}
    for index, tensor in enumerate(request.inputs):
        if raw:
            inputs[tensor.name] = _array(raw[index], tensor.datatype, tensor.shape)
        else:
            data = getattr(tensor.contents, GRPC_CONTENTS[tensor.datatype])
            inputs[tensor.name] = _from_json(list(data), tensor.datatype, tensor.shape)
    return request.model_name, inputs


def _openai(body: bytes) -> tuple[str, Inputs] | None:
    """An OpenAI embeddings call: its texts as the model's TEXT (and TRUNCATE) rows.

    The inputs are those ``client.embed.build_inputs`` sends for the same texts.
    """
    call = json.loads(body)
    if call["model"] not in embedding.OPENAI_MODELS:
        return None  # the gateway refuses it: nothing either version answered
    texts = [call["input"]] if isinstance(call["input"], str) else call["input"]
    if not texts or not all(isinstance(t, str) for t in texts):
        return None  # token arrays: not replayed
    rows = np.array([t.encode("utf-8") for t in texts], dtype=np.object_).reshape(-1, 1)
    inputs = {embedding.TEXT: rows}
    if call.get("truncate"):
        inputs[embedding.TRUNCATE] = np.ones((len(texts), 1), dtype=bool)
    return call["model"], inputs


def decode_request(path: str, headers: Mapping[str, str], body: bytes) -> tuple[str, Inputs] | None:
    """The model and inputs of a mirrored request; None for one this cannot replay.

    Args:
        path: the request's original URI.
        headers: its headers (any case).
        body: its body, as sent (gzip and deflate are undone).

    Returns:
        The model the request names (the path's, the gRPC request's, the OpenAI call's) and
        its inputs by name, or None: another path, an encoding or a form not replayed, or a
        body that does not parse. Never raises.
    """
    headers = {k.lower(): v for k, v in headers.items()}
    encoding = headers.get("content-encoding", "identity")
    try:
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        elif encoding != "identity":
            return None
        path = path.split("?", 1)[0]
        if path == GRPC_INFER:
            decoded = _grpc(body)
        elif path == OPENAI_EMBEDDINGS:
            decoded = _openai(body)
        elif match := HTTP_INFER.match(path):
            decoded = match["model"], _kserve(headers, body)
        else:
            return None
    except Exception as exc:  # noqa: BLE001 - gzip, zlib and protobuf raise their own
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


def infer(url: str, model: str, inputs: Inputs, rows: int = embedding.MAX_TEXTS):
    """Every FP32 output of ``model`` on the server at ``url`` for ``inputs``.

    At most ``rows`` batch rows a request (an OpenAI call's texts come in one body, as many as
    the API takes); the answers are put back together.
    """
    total = len(next(iter(inputs.values())))
    parts: dict[str, list[np.ndarray]] = {}
    with httpclient.InferenceServerClient(url, connection_timeout=10, network_timeout=30) as c:
        for start in range(0, total, rows):
            tensors = []
            for name, array in inputs.items():
                chunk = array[start : start + rows]
                datatype = np_to_triton_dtype(chunk.dtype)
                # Built here, not with client.connection: the gateway's image has no client/.
                tensor = httpclient.InferInput(name, list(chunk.shape), datatype)
                tensor.set_data_from_numpy(chunk, binary_data=True)
                tensors.append(tensor)
            # No outputs named: Triton answers all of them, as binary tensors.
            result = c.infer(model, tensors)
            for out in result.get_response()["outputs"]:
                if out["datatype"] == "FP32":
                    parts.setdefault(out["name"], []).append(result.as_numpy(out["name"]))
    return {name: np.concatenate(chunks) for name, chunks in parts.items()}


Replay = Callable[[str, Inputs], tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]


class Comparator:
    """The queue of mirrored requests, its workers, and the comparison's metrics.

    Args:
        replay: (model, inputs) → (the stable version's FP32 outputs, the canary's).
        registry: where the metrics live (a new one by default).
        capacity: requests waiting at most; more are dropped (counted).
        workers: threads replaying at once.
    """

    def __init__(
        self,
        replay: Replay,
        registry: CollectorRegistry | None = None,
        capacity: int = 64,
        workers: int = 2,
    ):
        self.replay = replay
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
        self.queue: queue.Queue = queue.Queue(maxsize=capacity)
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

    def submit(self, path: str, headers: Mapping[str, str], body: bytes) -> bool:
        """Queue one mirrored request; False (counted as dropped) when the queue is full."""
        try:
            self.queue.put_nowait((path, dict(headers), body))
            return True
        except queue.Full:
            self.requests.labels(OTHER, DROPPED).inc()  # not decoded: no time for it
            return False

    def compare(self, path: str, headers: Mapping[str, str], body: bytes) -> str:
        """Replay one request on both versions and record the cosines; the outcome."""
        decoded = decode_request(path, headers, body)
        in_rollout = {k.lower(): v for k, v in headers.items()}.get(MODELS_HEADER.lower())
        if decoded is None or (in_rollout is not None and decoded[0] not in in_rollout.split()):
            self.requests.labels(self.label(decoded[0] if decoded else ""), SKIPPED).inc()
            return SKIPPED
        model, inputs = decoded
        label = self.label(model)
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


def replay_on(stable: Sequence[str], canary: Sequence[str]) -> Replay:
    """The replay on real servers: one of each version, picked at random per request."""

    def replay(model: str, inputs: Inputs):
        return infer(random.choice(stable), model, inputs), infer(
            random.choice(canary), model, inputs
        )

    return replay


def listener(comparator: Comparator, host: str, port: int) -> ThreadingHTTPServer:
    """The HTTP server nginx mirrors to: 204 at once, the request queued."""

    class Mirrored(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keepalive from nginx's upstream pool

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(204)
            self.end_headers()
            comparator.submit(self.path, dict(self.headers.items()), body)

        def log_message(self, *args):  # one line per sampled request is noise
            pass

    return ThreadingHTTPServer((host, port), Mirrored)


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
    parser.add_argument("--host", default="127.0.0.1", help="where to listen (default loopback)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default %(default)s")
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    parser.add_argument("--queue", type=int, default=64, help="requests waiting at most")
    parser.add_argument("--workers", type=int, default=2, help="requests replayed at once")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    comparator = Comparator(replay_on(args.stable, args.canary), None, args.queue, args.workers)
    metrics, metrics_thread = start_http_server(
        args.metrics_port, args.host, registry=comparator.registry
    )
    server = listener(comparator, args.host, args.port)
    log.info("comparing on %s:%d, /metrics on %s:%d", args.host, args.port, args.host,
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
