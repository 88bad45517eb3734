"""The rollout's comparator without a server: decoding each kind of request, the cosines, the
queue, the listener's answer, and the bounds on what a copy may cost."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import tracemalloc
import urllib.request
import zlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2

from client.embed import build_inputs
from gateway import shadow
from pipelines import embedding

TEXTS = ["a man is eating food", "ünïcode text", ""]


def kserve(binary: bool, truncate: bool = True) -> tuple[dict, bytes]:
    """Headers and body of tritonclient's HTTP request for TEXTS."""
    rows = np.array([t.encode("utf-8") for t in TEXTS], dtype=np.object_).reshape(-1, 1)
    arrays = {embedding.TEXT: (rows, "BYTES")}
    if truncate:
        arrays[embedding.TRUNCATE] = (np.ones((len(TEXTS), 1), dtype=bool), "BOOL")
    inputs = []
    for name, (array, datatype) in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(embedding.EMBEDDING, binary_data=binary)]
    body, length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs)
    return ({"Inference-Header-Content-Length": str(length)} if length else {}), body


def grpc_frame(compressed: int = 0, typed: bool = False) -> bytes:
    """A gRPC ModelInferRequest frame for TEXTS, as tritonclient writes it (``typed``: each
    input's values in its own ``contents``, as other gRPC clients may send them)."""
    request = service_pb2.ModelInferRequest(model_name=embedding.ENSEMBLE)
    for tensor in build_inputs(grpcclient, TEXTS, truncate=True):
        request.inputs.append(tensor._get_tensor())
        request.raw_input_contents.append(tensor._get_content())
    if typed:
        del request.raw_input_contents[:]
        request.inputs[0].contents.bytes_contents.extend(t.encode("utf-8") for t in TEXTS)
        request.inputs[1].contents.bool_contents.extend([True] * len(TEXTS))
    message = request.SerializeToString()
    return bytes([compressed]) + len(message).to_bytes(4, "big") + message


def assert_texts(inputs: shadow.Inputs, truncate: bool = True) -> None:
    array = inputs[embedding.TEXT]
    assert array.dtype == np.object_ and array.shape == (len(TEXTS), 1)
    assert [t.decode("utf-8") for t in array[:, 0]] == TEXTS
    if truncate:
        flags = inputs[embedding.TRUNCATE]
        assert flags.dtype == np.bool_ and flags.shape == (len(TEXTS), 1) and flags.all()
    else:
        assert embedding.TRUNCATE not in inputs


@pytest.mark.parametrize("binary", [True, False])
def test_triton_http_requests_decode_in_both_encodings(binary):
    headers, body = kserve(binary)
    model, inputs = shadow.decode_request("/v2/models/embed/versions/1/infer", headers, body)
    assert model == embedding.ENSEMBLE
    assert_texts(inputs)


def test_numbers_keep_their_datatype():
    values = np.arange(6, dtype=np.float16).reshape(2, 3)
    for binary in (True, False):
        tensor = httpclient.InferInput("X", [2, 3], "FP16")
        tensor.set_data_from_numpy(values, binary_data=binary)
        body, length = httpclient.InferenceServerClient.generate_request_body([tensor])
        headers = {"Inference-Header-Content-Length": str(length)} if length else {}
        _, inputs = shadow.decode_request("/v2/models/m/infer", headers, body)
        assert inputs["X"].dtype == np.float16 and (inputs["X"] == values).all()
    # BF16 has no numpy type: sent on as float32 it would be another request.
    bf16 = {"inputs": [{"name": "X", "datatype": "BF16", "shape": [1], "data": [1.0]}]}
    assert shadow.decode_request("/v2/models/m/infer", {}, json.dumps(bf16).encode()) is None


@pytest.mark.parametrize(
    "encoding, compress", [("gzip", gzip.compress), ("deflate", zlib.compress)]
)
def test_a_compressed_request_is_read_and_a_broken_one_skipped(encoding, compress):
    headers, body = kserve(binary=True)
    packed = {**headers, "Content-Encoding": encoding}
    assert_texts(shadow.decode_request("/v2/models/embed/infer", packed, compress(body))[1])
    # Not what it says it is: gzip and zlib raise errors of their own, not ValueError.
    assert shadow.decode_request("/v2/models/embed/infer", packed, body) is None


def test_an_unknown_encoding_is_skipped():
    headers, body = kserve(binary=True)
    brotli = {**headers, "Content-Encoding": "br"}
    assert shadow.decode_request("/v2/models/embed/infer", brotli, body) is None


@pytest.mark.parametrize("typed", [False, True])
def test_a_grpc_frame_decodes_and_a_compressed_one_is_skipped(typed):
    model, inputs = shadow.decode_request(shadow.GRPC_INFER, {}, grpc_frame(typed=typed))
    assert model == embedding.ENSEMBLE
    assert_texts(inputs)
    assert shadow.decode_request(shadow.GRPC_INFER, {}, grpc_frame(1, typed)) is None


def test_a_broken_grpc_frame_is_skipped():
    frame = grpc_frame()
    assert shadow.decode_request(shadow.GRPC_INFER, {}, frame[:-3]) is None  # cut short
    # Cut where protobuf sees a whole message: only the frame's length tells.
    longer = frame[:1] + (len(frame) - 5 + 10).to_bytes(4, "big") + frame[5:]
    assert shadow.decode_request(shadow.GRPC_INFER, {}, longer) is None
    garbage = b"\x00" + (5).to_bytes(4, "big") + b"\xff\xff\xff\xff\xff"
    assert shadow.decode_request(shadow.GRPC_INFER, {}, garbage) is None  # not protobuf


@pytest.mark.parametrize(
    "call, truncate",
    [
        ({"model": "embed", "input": TEXTS, "truncate": True}, True),
        ({"model": "embed", "input": TEXTS}, False),
    ],
)
def test_an_openai_call_becomes_the_model_s_text_rows(call, truncate):
    model, inputs = shadow.decode_request(shadow.OPENAI_EMBEDDINGS, {}, json.dumps(call).encode())
    assert model == "embed"
    assert_texts(inputs, truncate)
    one = {"model": "embed", "input": "one text"}
    _, inputs = shadow.decode_request(shadow.OPENAI_EMBEDDINGS, {}, json.dumps(one).encode())
    assert inputs[embedding.TEXT].shape == (1, 1)


@pytest.mark.parametrize(
    "path, body",
    [
        (shadow.OPENAI_EMBEDDINGS, json.dumps({"model": "embed", "input": [[1, 2, 3]]})),
        (shadow.OPENAI_EMBEDDINGS, json.dumps({"model": "embed", "input": []})),
        (shadow.OPENAI_EMBEDDINGS, json.dumps({"model": "gpt-4", "input": "a text"})),
        (shadow.OPENAI_EMBEDDINGS, "not json"),
        ("/v2/models/embed/infer", '{"inputs": [{"name": "TEXT"}]}'),
        ("/v2/models/embed/ready", "{}"),
        (shadow.GRPC_INFER, "\x00\x00"),
    ],
)
def test_what_cannot_be_replayed_is_skipped(path, body):
    assert shadow.decode_request(path, {}, body.encode()) is None


def test_row_cosines():
    a = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    b = np.array([[2.0, 0.0], [1.0, 0.0], [3.0, 4.0]], dtype=np.float32)
    assert shadow.row_cosines(a, b) == pytest.approx([1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="shapes"):
        shadow.row_cosines(a, b[:2])
    zero = np.zeros((1, 2))
    assert shadow.row_cosines(zero, zero) == pytest.approx([1.0])  # both answered nothing
    assert shadow.row_cosines(zero, a[:1]) == pytest.approx([0.0])


def sample(comparator: shadow.Comparator, name: str, **labels) -> float:
    return comparator.registry.get_sample_value(name, labels) or 0.0


def test_the_comparator_records_cosines_of_rollout_models_only():
    def replay(model, inputs):
        rows = len(inputs[embedding.TEXT])
        stable = np.tile([1.0, 0.0], (rows, 1))
        return {embedding.EMBEDDING: stable}, {embedding.EMBEDDING: stable + np.array([0, 0.11])}

    comparator = shadow.Comparator(replay)
    headers, body = kserve(binary=True)
    in_rollout = {**headers, shadow.MODELS_HEADER: "embed classify"}
    assert comparator.compare("/v2/models/embed/infer", in_rollout, body) == shadow.COMPARED
    count = f"{shadow.COSINE_METRIC}_count"
    assert sample(comparator, count, model="embed") == len(TEXTS)
    # cos = 1/sqrt(1.0121) ≈ 0.994: in the bucket up to 0.995, none below 0.99.
    bucket = f"{shadow.COSINE_METRIC}_bucket"
    assert sample(comparator, bucket, model="embed", le="0.99") == 0
    assert sample(comparator, bucket, model="embed", le="0.995") == len(TEXTS)
    elsewhere = {**headers, shadow.MODELS_HEADER: "classify"}
    assert comparator.compare("/v2/models/embed/infer", elsewhere, body) == shadow.SKIPPED
    total = f"{shadow.SHADOW_METRIC}_total"
    assert sample(comparator, total, model="embed", outcome=shadow.SKIPPED) == 1


def test_a_version_s_error_counts_as_failed():
    def replay(model, inputs):
        raise RuntimeError("canary: model not ready")

    comparator = shadow.Comparator(replay)
    headers, body = kserve(binary=True)
    assert comparator.compare("/v2/models/embed/infer", headers, body) == shadow.FAILED
    total = f"{shadow.SHADOW_METRIC}_total"
    assert sample(comparator, total, model="embed", outcome=shadow.FAILED) == 1


def test_an_answer_that_is_not_finite_counts_as_failed():
    def replay(model, inputs):
        rows = np.ones((len(inputs[embedding.TEXT]), 2), dtype=np.float32)
        canary = rows.copy()
        canary[0, 0] = np.nan
        return {embedding.EMBEDDING: rows}, {embedding.EMBEDDING: canary}

    comparator = shadow.Comparator(replay)
    headers, body = kserve(binary=True)
    assert comparator.compare("/v2/models/embed/infer", headers, body) == shadow.FAILED
    assert sample(comparator, f"{shadow.COSINE_METRIC}_count", model="embed") == 0


def test_a_worker_outlives_what_it_cannot_read():
    done = threading.Event()

    def replay(model, inputs):
        done.set()
        return {}, {}

    class Fragile(shadow.Comparator):
        def compare(self, path, headers, body):
            if path == "/crash":
                raise RuntimeError("a bug of the comparator's own")
            return super().compare(path, headers, body)

    headers, body = kserve(binary=True)
    with Fragile(replay, workers=1) as comparator:
        broken = {**headers, "Content-Encoding": "gzip"}
        comparator.submit("/v2/models/embed/infer", broken, body)  # not gzip
        comparator.submit(shadow.GRPC_INFER, {}, b"\x00\x00\x00\x00\x02\xff\xff")
        comparator.submit("/crash", {}, b"")
        comparator.submit("/v2/models/embed/infer", headers, body)
        assert done.wait(5), "the worker stopped at a request it could not read"
    total = f"{shadow.SHADOW_METRIC}_total"
    assert sample(comparator, total, model="embed", outcome=shadow.SKIPPED) == 1
    # The broken gzip, the broken frame, the crash: none of them named a model that was read.
    assert sample(comparator, total, model="other", outcome=shadow.SKIPPED) == 3


def test_a_full_queue_drops_and_the_listener_answers_at_once():
    release = threading.Event()

    def replay(model, inputs):
        release.wait(10)  # a slow replay: the queue fills behind it
        return {}, {}

    comparator = shadow.Comparator(replay, bounds=shadow.Bounds(items=2), workers=1).start()
    server = shadow.listener(comparator, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    headers, body = kserve(binary=True)
    url = f"http://127.0.0.1:{server.server_address[1]}/v2/models/embed/infer"
    try:
        statuses = []
        for _ in range(4):  # one replaying, one queued, two dropped
            request = urllib.request.Request(url, data=body, headers=headers, method="POST")
            with urllib.request.urlopen(request, timeout=5) as response:
                statuses.append(response.status)
        assert statuses == [204] * 4  # while the first is still being replayed
        # Each request is queued after its answer went out: wait for the last of them.
        total = f"{shadow.SHADOW_METRIC}_total"
        deadline = time.monotonic() + 5
        while sample(comparator, total, model="other", outcome=shadow.DROPPED) < 2:
            assert time.monotonic() < deadline, "a full queue dropped nothing"
            time.sleep(0.01)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        comparator.stop()


# The bounds -------------------------------------------------------------------------------------
LIMIT = 1 << 20  # what a request may inflate to, and decode to, in these tests


def packed(body: bytes, encoding: str) -> bytes:
    return gzip.compress(body) if encoding == "gzip" else zlib.compress(body)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_inflates_up_to_the_bound_and_no_further(encoding):
    headers, body = kserve(binary=True)
    packed_headers = {**headers, "Content-Encoding": encoding}
    assert shadow.decode_request("/v2/models/embed/infer", packed_headers, packed(body, encoding))
    # 64 MiB of zeros in about 64 KiB: never inflated past the bound.
    bomb = packed(body + bytes(64 << 20), encoding)
    assert len(bomb) < 256 << 10
    assert shadow.decode_request("/v2/models/embed/infer", packed_headers, bomb, LIMIT) is None
    # Two streams, or one cut short, are not one body.
    twice = packed(body, encoding) * 2
    assert shadow.decode_request("/v2/models/embed/infer", packed_headers, twice) is None
    cut = packed(body, encoding)[:-8]
    assert shadow.decode_request("/v2/models/embed/infer", packed_headers, cut) is None


def peak_bytes(*request) -> tuple[object, int]:
    """What ``decode_request(*request)`` returns, and the most bytes Python and numpy held
    meanwhile."""
    tracemalloc.start()
    try:
        return shadow.decode_request(*request), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_json_is_parsed_only_when_its_values_fit_the_bound():
    row = {"inputs": [{"name": "X", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]}
    assert shadow.decode_request("/v2/models/m/infer", {}, json.dumps(row).encode(), LIMIT)
    # A fraction of the bound in bytes, and millions of Python objects once parsed: not parsed.
    nested = b'{"inputs": [{"data": [' + b",".join([b"[]"] * (LIMIT // 8)) + b"]}]}"
    texts = json.dumps({"model": "embed", "input": ["ab"] * (LIMIT // 16)}).encode()
    for path, body in (("/v2/models/m/infer", nested), (shadow.OPENAI_EMBEDDINGS, texts)):
        assert len(body) < LIMIT / 2
        decoded, peak = peak_bytes(path, {}, body, LIMIT)
        assert decoded is None and peak < 2 * len(body), (path, peak)


def test_tensors_are_decoded_only_within_the_bound():
    count = LIMIT // shadow.OBJECT_BYTES + 1  # one element over
    rows = np.array([b""] * count, dtype=np.object_).reshape(-1, 1)
    tensor = httpclient.InferInput(embedding.TEXT, list(rows.shape), "BYTES")
    tensor.set_data_from_numpy(rows, binary_data=True)
    body, length = httpclient.InferenceServerClient.generate_request_body([tensor])
    headers = {"Inference-Header-Content-Length": str(length)}
    assert shadow.decode_request("/v2/models/embed/infer", headers, body, LIMIT) is None
    assert shadow.decode_request("/v2/models/embed/infer", headers, body, 2 * LIMIT)
    # A shape of one element over 4 MiB of zeros, each 4 an empty element: not decoded into
    # a million of them to learn that the shape is wrong.
    zeros = 4 << 20
    header = {
        "inputs": [
            {
                "name": embedding.TEXT,
                "shape": [1, 1],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": zeros},
            }
        ]
    }
    text = json.dumps(header).encode()
    headers = {"Inference-Header-Content-Length": str(len(text))}
    body = text + bytes(zeros)
    decoded, peak = peak_bytes("/v2/models/embed/infer", headers, body)
    assert decoded is None and peak < 2 * zeros, peak


def test_a_bytes_element_must_be_text():
    # bytes(n) of the number n would be n zero bytes: 256 MiB here.
    number = {"inputs": [{"name": "T", "shape": [1], "datatype": "BYTES", "data": [1 << 28]}]}
    decoded, peak = peak_bytes("/v2/models/m/infer", {}, json.dumps(number).encode())
    refused = decoded is None  # (not decoded's repr in a failure's message)
    assert refused and peak < 1 << 20, peak


def test_typed_grpc_contents_are_counted_before_they_are_copied():
    request = service_pb2.ModelInferRequest(model_name=embedding.ENSEMBLE)
    tensor = request.inputs.add(name="FLAGS", datatype="BOOL", shape=[1, 1])
    tensor.contents.bool_contents.extend([True] * (4 << 20))  # 4 MiB, packed
    message = request.SerializeToString()
    frame = b"\x00" + len(message).to_bytes(4, "big") + message
    # As a list, 8 bytes a value: never made, over the bound.
    decoded, peak = peak_bytes(shadow.GRPC_INFER, {}, frame)
    assert decoded is None and peak < 2 * len(frame), peak


def test_rows_over_max_batch_size_are_skipped_never_split():
    replayed = []

    def replay(model, inputs):
        replayed.append(shadow.rows(inputs))
        stable = np.ones((shadow.rows(inputs), 2))
        return {embedding.EMBEDDING: stable}, {embedding.EMBEDDING: stable}

    comparator = shadow.Comparator(replay, batch_sizes={"embed": len(TEXTS) - 1}.get)
    headers, body = kserve(binary=True)
    assert comparator.compare("/v2/models/embed/infer", headers, body) == shadow.SKIPPED
    assert comparator.compare(shadow.GRPC_INFER, {}, grpc_frame()) == shadow.SKIPPED
    assert replayed == []  # neither version saw either
    total = f"{shadow.SHADOW_METRIC}_total"
    assert sample(comparator, total, model="embed", outcome=shadow.SKIPPED) == 2
    # At the size, or for a model whose size is not known, it is replayed as it came.
    at_size = shadow.Comparator(replay, batch_sizes={"embed": len(TEXTS)}.get)
    assert at_size.compare("/v2/models/embed/infer", headers, body) == shadow.COMPARED
    assert replayed == [len(TEXTS)]


def test_an_openai_call_is_compared_on_its_first_request():
    replayed = []

    def replay(model, inputs):
        replayed.append(inputs[embedding.TEXT][:, 0].tolist())
        stable = np.ones((shadow.rows(inputs), 2))
        return {embedding.EMBEDDING: stable}, {embedding.EMBEDDING: stable}

    comparator = shadow.Comparator(replay, batch_sizes={"embed": embedding.MAX_TEXTS}.get)
    texts = [f"text {i}" for i in range(embedding.MAX_TEXTS * 3 + 1)]
    call = json.dumps({"model": "embed", "input": texts}).encode()
    assert comparator.compare(shadow.OPENAI_EMBEDDINGS, {}, call) == shadow.COMPARED
    # What the gateway sent first for the call (OpenAI.chunk texts), once on each version.
    assert replayed == [[t.encode() for t in texts[: embedding.MAX_TEXTS]]]
    # More texts than the gateway takes in a call: not one of its calls.
    many = ["a text"] * (embedding.MAX_OPENAI_INPUTS + 1)
    body = json.dumps({"model": "embed", "input": many}).encode()
    assert comparator.compare(shadow.OPENAI_EMBEDDINGS, {}, body) == shadow.SKIPPED
    assert len(replayed) == 1


def test_the_queue_is_bounded_in_bytes_and_gives_them_back():
    bounds = shadow.Bounds(body=100, queue=150, items=10)
    comparator = shadow.Comparator(lambda model, inputs: ({}, {}), bounds=bounds)
    total = f"{shadow.SHADOW_METRIC}_total"
    assert comparator.hold(101) == shadow.SKIPPED  # over the body's bound: never read
    assert comparator.hold(100) is None
    assert comparator.hold(60) == shadow.DROPPED  # 160 bytes would be held
    assert comparator.hold(50) is None
    assert sample(comparator, total, model="other", outcome=shadow.SKIPPED) == 1
    assert sample(comparator, total, model="other", outcome=shadow.DROPPED) == 1
    comparator.release(100)
    assert comparator.hold(60) is None
    # submit() holds as the listener does; a worker gives the bytes back once done.
    comparator.release(60)
    comparator.release(50)
    with comparator:
        assert comparator.submit("/v2/models/embed/infer", {}, b"x" * 100)
        assert not comparator.submit("/v2/models/embed/infer", {}, b"x" * 101)
    # All 150 bytes free again once the worker is done.
    assert comparator.hold(100) is None and comparator.hold(50) is None


def post(sock: socket.socket, body: bytes) -> bytes:
    """One request on a kept-alive connection; the status line of its answer."""
    head = f"POST /v2/models/embed/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}"
    sock.sendall(head.encode() + b"\r\n\r\n" + body)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(4096)
        assert chunk, "the comparator closed the connection"
        answer += chunk
    return answer.split(b"\r\n", 1)[0]


def test_the_listener_reads_past_a_large_body_and_bounds_its_connections():
    bounds = shadow.Bounds(body=1000, connections=1)
    comparator = shadow.Comparator(lambda model, inputs: ({}, {}), bounds=bounds).start()
    server = shadow.listener(comparator, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = ("127.0.0.1", server.server_address[1])
    total = f"{shadow.SHADOW_METRIC}_total"
    try:
        with socket.create_connection(address, timeout=5) as first:
            assert post(first, b"x" * 1001) == b"HTTP/1.1 413 Request Entity Too Large"
            # Read past, not kept: the same connection carries the next copy.
            assert post(first, b"x" * 10) == b"HTTP/1.1 204 No Content"
            assert sample(comparator, total, model="other", outcome=shadow.SKIPPED) >= 1
            # The one connection allowed is this one: another is closed at once.
            with socket.create_connection(address, timeout=5) as second:
                assert second.recv(1) == b""
            assert sample(comparator, total, model="other", outcome=shadow.DROPPED) == 1
    finally:
        server.shutdown()
        server.server_close()
        comparator.stop()
