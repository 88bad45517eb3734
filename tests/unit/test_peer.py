"""The peer baseline: micro-batching, parity with onnxruntime, KServe v2 errors, null mode.

Both served models are covered: the classifier and the text embedding (``embed``).

The app is driven in-process through ASGI (no HTTP client library needed); one test starts the
real ``python -m bench.peers.microbatcher`` process and talks to it over a socket.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import struct
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest

from bench.peers import microbatcher as peer_mod
from bench.peers.microbatcher import MicroBatcher, PeerServer, create_app
from export import text_samples
from pipelines import classification, embedding, onnx_runner, padding, tokenization
from pipelines.rows import RowCountError

SHAPE = (classification.CHANNELS, classification.IMAGE_SIZE, classification.IMAGE_SIZE)


# A minimal ASGI client: one request, the whole body at once, lifespan run by the caller.
async def call(app, method, path, body=b"", headers=None):
    headers = {"content-type": "application/json", **(headers or {})}
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), str(v).encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return pending.pop() if pending else {"type": "http.disconnect"}

    sent = []

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    response_headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], response_headers, content


def run_with_app(app, scenario):
    """Run ``scenario(app)`` inside the app's lifespan (so the batcher runs)."""

    async def main():
        async with app.router.lifespan_context(app):
            return await scenario(app)

    return asyncio.run(main())


def infer_body(pixels, nested=False, **extra):
    data = pixels.tolist() if nested else pixels.reshape(-1).tolist()
    tensor = {
        "name": classification.PIXELS,
        "shape": list(pixels.shape),
        "datatype": "UINT8",
        "data": data,
    }
    return orjson.dumps({"inputs": [tensor], **extra})


def logits_of(content):
    reply = orjson.loads(content)
    (output,) = reply["outputs"]
    assert output["name"] == classification.LOGITS and output["datatype"] == "FP32"
    return np.asarray(output["data"], np.float32).reshape(output["shape"])


def images(rows, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(rows, *SHAPE), dtype=np.uint8)


@pytest.fixture(scope="module")
def session(classifier_onnx):
    return onnx_runner.create_session(classifier_onnx, intra_op_threads=1)


@pytest.fixture(scope="module")
def app(classifier_onnx):
    # A long wait so that concurrent requests surely meet in one batch.
    return create_app(classifier_onnx, intra_op_threads=1, max_batch=8, max_wait_ms=50)


def direct(session, pixels):
    return session.run([classification.LOGITS], {classification.PIXELS: pixels})[0]


# The batcher alone -------------------------------------------------------------------------
def test_batcher_collects_concurrent_requests_and_splits_in_order():
    batches = []

    def run_batch(x):
        batches.append(len(x))
        return x * 2

    async def scenario():
        batcher = MicroBatcher(run_batch, max_batch=4, max_wait_ms=20)
        batcher.start()
        try:
            # Sizes 1 and 3 never exceed max_batch 4 when combined; the 3s force carry-over.
            inputs = [np.full((1 + 2 * (i % 2), 2), i, np.float32) for i in range(10)]
            outputs = await asyncio.gather(*(batcher.submit(x) for x in inputs))
        finally:
            await batcher.close()
        return inputs, outputs, batcher.stats

    inputs, outputs, stats = asyncio.run(scenario())
    for x, y in zip(inputs, outputs, strict=True):
        np.testing.assert_array_equal(y, x * 2)
    assert max(batches) <= 4 and sum(batches) == sum(len(x) for x in inputs)
    assert len(batches) < len(inputs)
    assert stats.execution_count == len(batches)


def test_batcher_isolates_a_failing_request():
    def run_batch(x):
        if (x < 0).any():
            raise ValueError("negative input")
        return x + 1

    async def scenario():
        batcher = MicroBatcher(run_batch, max_batch=8, max_wait_ms=20)
        batcher.start()
        try:
            good = batcher.submit(np.zeros((1, 2), np.float32))
            bad = batcher.submit(-np.ones((1, 2), np.float32))
            return await asyncio.gather(good, bad, return_exceptions=True)
        finally:
            await batcher.close()

    good, bad = asyncio.run(scenario())
    np.testing.assert_array_equal(good, np.ones((1, 2), np.float32))
    assert isinstance(bad, ValueError) and "negative" in str(bad)


# The app: parity, batching, errors -------------------------------------------------------
def test_concurrent_requests_are_batched_and_match_onnxruntime(app, session):
    requests = [images(1 + i % 2, seed=i) for i in range(10)]

    async def scenario(app):
        replies = await asyncio.gather(
            *(call(app, "POST", "/v2/models/classifier/infer", infer_body(x)) for x in requests)
        )
        _, _, stats = await call(app, "GET", "/v2/models/classifier/stats")
        return replies, orjson.loads(stats)["model_stats"][0]

    before = app.state.peer.stats.execution_count
    replies, stats = run_with_app(app, scenario)
    for pixels, (status, _, content) in zip(requests, replies, strict=True):
        assert status == 200, content
        logits = logits_of(content)
        assert logits.shape == (len(pixels), classification.NUM_CLASSES)
        np.testing.assert_allclose(logits, direct(session, pixels), atol=1e-5)
    runs = stats["execution_count"] - before
    assert 0 < runs < len(requests)
    assert stats["inference_stats"]["success"]["count"] >= len(requests)
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 2


def test_nested_json_and_binary_tensors_match_onnxruntime(app, session):
    pixels = images(2, seed=42)
    expected = direct(session, pixels)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": classification.PIXELS,
                    "shape": [2, *SHAPE],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": pixels.nbytes},
                }
            ],
            "outputs": [{"name": classification.LOGITS, "parameters": {"binary_data": True}}],
        }
    )

    async def scenario(app):
        nested = await call(app, "POST", "/v2/models/classifier/infer", infer_body(pixels, True))
        binary = await call(
            app,
            "POST",
            "/v2/models/classifier/versions/1/infer",
            header + pixels.tobytes(),
            {"Inference-Header-Content-Length": len(header)},
        )
        return nested, binary

    (status, _, content), (bstatus, bheaders, bcontent) = run_with_app(app, scenario)
    assert status == 200
    np.testing.assert_allclose(logits_of(content), expected, atol=1e-5)
    assert bstatus == 200
    split = int(bheaders["inference-header-content-length"])
    reply = orjson.loads(bcontent[:split])
    assert reply["outputs"][0]["parameters"]["binary_data_size"] == expected.nbytes
    binary_logits = np.frombuffer(bcontent[split:], "<f4").reshape(reply["outputs"][0]["shape"])
    np.testing.assert_allclose(binary_logits, expected, atol=1e-5)


def _tensor(**changes):
    tensor = {
        "name": classification.PIXELS,
        "shape": [1, *SHAPE],
        "datatype": "UINT8",
        "data": [0] * int(np.prod(SHAPE)),
    }
    return orjson.dumps({"inputs": [{**tensor, **changes}]})


BAD_REQUESTS = [
    (b"{not json", "not valid JSON"),
    (b"[]", "must be a JSON object"),
    (b"{}", "has no 'inputs'"),
    (_tensor(name="IMAGE"), "expected exactly one input 'PIXELS'"),
    (_tensor(datatype="FP32"), "datatype UINT8"),
    (_tensor(shape=[1, 3, 32, 32]), "the model expects [-1, 3, 224, 224]"),
    (_tensor(shape=[9, *SHAPE]), "outside 1..8"),
    (_tensor(data=[0] * 10), "has 10 values"),
    (_tensor(data=["x"] * int(np.prod(SHAPE))), "integers 0-255"),
    (_tensor(data=[None] * int(np.prod(SHAPE))), "integers 0-255"),
    (_tensor(data=[0.5] * int(np.prod(SHAPE))), "integers 0-255"),
    (_tensor(data=[256] * int(np.prod(SHAPE))), "integers 0-255"),
    (_tensor(data=[[0] * 3, [0]]), "not a regular array"),
    (
        orjson.dumps({**orjson.loads(_tensor()), "outputs": [{"name": "SCORES"}]}),
        "unknown output 'SCORES'",
    ),
]


def test_bad_requests_get_400_with_a_reason_and_the_server_keeps_serving(app, session):
    good = images(1, seed=7)

    async def scenario(app):
        bad = [
            await call(app, "POST", "/v2/models/classifier/infer", body) for body, _ in BAD_REQUESTS
        ]
        unknown = await call(app, "POST", "/v2/models/resnet/infer", _tensor())
        after = await call(app, "POST", "/v2/models/classifier/infer", infer_body(good))
        return bad, unknown, after

    bad, unknown, (status, _, content) = run_with_app(app, scenario)
    for (_, reason), (code, headers, body) in zip(BAD_REQUESTS, bad, strict=True):
        assert code == 400, (reason, body)
        assert headers["content-type"].startswith("application/json")
        assert reason in orjson.loads(body)["error"]
    assert unknown[0] == 404 and "unknown model" in orjson.loads(unknown[2])["error"]
    assert status == 200
    np.testing.assert_allclose(logits_of(content), direct(session, good), atol=1e-5)


def test_metadata_config_and_health_follow_kserve_v2(app):
    async def scenario(app):
        paths = [
            "/v2/health/live",
            "/v2/health/ready",
            "/v2",
            "/v2/models/classifier",
            "/v2/models/classifier/ready",
            "/v2/models/classifier/config",
            "/v2/models/stats",
        ]
        return {p: await call(app, "GET", p) for p in paths}

    replies = run_with_app(app, scenario)
    assert all(status == 200 for status, _, _ in replies.values())
    assert "statistics" in orjson.loads(replies["/v2"][2])["extensions"]
    meta = orjson.loads(replies["/v2/models/classifier"][2])
    assert meta["inputs"] == [{"name": "PIXELS", "datatype": "UINT8", "shape": [-1, *SHAPE]}]
    assert meta["outputs"] == [{"name": "LOGITS", "datatype": "FP32", "shape": [-1, 1000]}]
    config = orjson.loads(replies["/v2/models/classifier/config"][2])
    assert config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_UINT8"
    assert config["input"][0]["dims"] == list(SHAPE)
    assert config["output"][0]["dims"] == [classification.NUM_CLASSES]


# Null mode and the real process ----------------------------------------------------------
def test_null_mode_answers_zeros_of_the_right_shape():
    app = create_app(None)
    assert app.state.peer.batcher is None

    async def scenario(app):
        ok = await call(app, "POST", "/v2/models/classifier/infer", _tensor(shape=[1, *SHAPE]))
        three = images(3, seed=1)
        batch = await call(app, "POST", "/v2/models/classifier/infer", infer_body(three))
        bad = await call(app, "POST", "/v2/models/classifier/infer", _tensor(datatype="INT8"))
        return ok, batch, bad

    ok, batch, bad = run_with_app(app, scenario)
    assert ok[0] == 200 and batch[0] == 200
    assert logits_of(ok[2]).shape == (1, classification.NUM_CLASSES)
    logits = logits_of(batch[2])
    assert logits.shape == (3, classification.NUM_CLASSES) and not logits.any()
    assert bad[0] == 400


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read()


def test_peer_server_process_serves_and_stops_cleanly(tmp_path):
    body = _tensor()
    cpus = [0] if shutil.which("taskset") else None  # pinning is optional; the rest is not
    with PeerServer(None, port=0, cpus=cpus, log_path=tmp_path / "peer.log") as server:
        host, port = server.url.split(":")
        assert host == "127.0.0.1" and int(port) > 0
        if cpus:
            taskset, flag, cpu_list = server.command()[:3]
            assert Path(taskset).name == "taskset" and (flag, cpu_list) == ("-c", "0")
        assert _get(f"http://{server.url}/v2/health/ready")[0] == 200
        request = urllib.request.Request(
            f"http://{server.url}/v2/models/classifier/infer", data=body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert logits_of(response.read()).shape == (1, classification.NUM_CLASSES)
        bad = urllib.request.Request(
            f"http://{server.url}/v2/models/classifier/infer", data=b"{", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(bad, timeout=5)
        assert error.value.code == 400 and "JSON" in json.loads(error.value.read())["error"]
        started = time.monotonic()
        server.stop()
    assert time.monotonic() - started < 5
    assert server.process.returncode is not None
    assert "peer ready" in (tmp_path / "peer.log").read_text()


def test_cli_refuses_a_missing_model(tmp_path, capsys):
    with pytest.raises(SystemExit):
        peer_mod.main(["--model", str(tmp_path / "missing.onnx")])
    assert "model not found" in capsys.readouterr().err


def test_a_run_without_one_row_per_input_row_fails_its_requests_alone():
    # A model that drops the last row of whatever it is given: joined, the rows of the
    # requests cannot be told apart, so each is run alone, and each fails on its own count.
    def run_batch(x):
        return x[:-1] if x[0, 0] >= 0 else x

    async def scenario():
        batcher = MicroBatcher(run_batch, max_batch=8, max_wait_ms=20)
        batcher.start()
        try:
            sent = [np.full((2, 2), v, np.float32) for v in (1, 2, -3)]
            return await asyncio.gather(*map(batcher.submit, sent), return_exceptions=True)
        finally:
            await batcher.close()

    one, two, fine = asyncio.run(scenario())
    for failed in (one, two):
        assert isinstance(failed, RowCountError), failed
        assert "has 1 rows for 2 input rows" in str(failed)
    np.testing.assert_array_equal(fine, np.full((2, 2), -3, np.float32))


def test_closing_the_batcher_fails_requests_in_flight():
    async def scenario():
        batcher = MicroBatcher(lambda x: time.sleep(0.3) or x, max_batch=4, max_wait_ms=0)
        batcher.start()
        running = asyncio.ensure_future(batcher.submit(np.zeros((1, 2), np.float32)))
        await asyncio.sleep(0.05)  # it is now in the worker thread
        queued = asyncio.ensure_future(batcher.submit(np.zeros((1, 2), np.float32)))
        await asyncio.sleep(0)
        await batcher.close()
        return await asyncio.gather(running, queued, return_exceptions=True)

    for result in asyncio.run(scenario()):
        assert isinstance(result, RuntimeError) and "shutting down" in str(result)


# The text embedding ("embed") ------------------------------------------------------------
EMBED = embedding.ENSEMBLE
EMBED_INFER = f"/v2/models/{EMBED}/infer"


@pytest.fixture(scope="module")
def encoder_session(encoder_onnx):
    return onnx_runner.create_session(encoder_onnx[0], intra_op_threads=1)


@pytest.fixture(scope="module")
def embed_app(encoder_onnx):
    # A long wait so that concurrent requests surely meet in one batch.
    return create_app(encoder_onnx[0], intra_op_threads=1, max_wait_ms=50, model_name=EMBED)


def reference_embeddings(session, texts):
    """Each text alone, padded to its own bucket: the peer pads to the batch's longest text."""
    rows = []
    for text in texts:
        ids, mask = padding.tokenize([text])
        feeds = {embedding.INPUT_IDS: ids, embedding.ATTENTION_MASK: mask}
        rows.append(onnx_runner.run(session, feeds, [embedding.EMBEDDING])[0][0])
    return np.stack(rows)


def assert_same_embeddings(actual, expected):
    assert actual.shape == expected.shape
    cosine = (actual * expected).sum(1) / (
        np.linalg.norm(actual, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(np.linalg.norm(actual, axis=1), 1.0, atol=1e-5)


def text_body(texts, nested=True, **extra):
    data = [[t] for t in texts] if nested else list(texts)
    tensor = {"name": embedding.TEXT, "shape": [len(texts), 1], "datatype": "BYTES", "data": data}
    return orjson.dumps({"inputs": [tensor], **extra})


def binary_request(raw, rows, binary_output=False):
    """(body, headers) with ``raw`` as the TEXT tensor's binary data."""
    tensor = {"name": embedding.TEXT, "shape": [rows, 1], "datatype": "BYTES"}
    output = {"name": embedding.EMBEDDING, "parameters": {"binary_data": binary_output}}
    header = orjson.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}],
            "outputs": [output],
        }
    )
    return header + raw, {"Inference-Header-Content-Length": len(header)}


def binary_text_request(items, binary_output=False):
    """TEXT as Triton's serialized BYTES: per item, a 4-byte LE length, then the bytes."""
    raw = b"".join(struct.pack("<I", len(item)) + item for item in items)
    return binary_request(raw, len(items), binary_output)


def embeddings_of(content, headers=None):
    split = int((headers or {}).get("inference-header-content-length", len(content)))
    reply = orjson.loads(content[:split])
    assert reply["model_name"] == EMBED
    (output,) = reply["outputs"]
    assert output["name"] == embedding.EMBEDDING and output["datatype"] == "FP32"
    if split < len(content):
        return np.frombuffer(content[split:], "<f4").reshape(output["shape"])
    return np.asarray(output["data"], np.float32).reshape(output["shape"])


def test_embed_requests_are_batched_and_match_the_reference(embed_app, encoder_session):
    # One or two texts per request, flat and nested JSON: 8 requests, the 12 sample texts.
    remaining = list(text_samples.SENTENCES)
    requests = [[remaining.pop(0) for _ in range(1 + i % 2)] for i in range(8)]
    long_request = ["Short.", text_samples.LONG_TEXT]  # truncated at 256 tokens, not refused

    async def scenario(app):
        replies = await asyncio.gather(
            *(
                call(app, "POST", EMBED_INFER, text_body(t, nested=i % 2 == 0))
                for i, t in enumerate(requests)
            )
        )
        long = await call(app, "POST", EMBED_INFER, text_body(long_request))
        _, _, stats = await call(app, "GET", f"/v2/models/{EMBED}/stats")
        return replies, long, orjson.loads(stats)["model_stats"][0]

    before = embed_app.state.peer.stats.execution_count
    replies, long, stats = run_with_app(embed_app, scenario)
    for texts, (status, _, content) in zip(requests, replies, strict=True):
        assert status == 200, content
        assert_same_embeddings(embeddings_of(content), reference_embeddings(encoder_session, texts))
    assert long[0] == 200, long[2]
    expected = reference_embeddings(encoder_session, long_request)
    assert_same_embeddings(embeddings_of(long[2]), expected)
    assert stats["name"] == EMBED
    concurrent_runs = stats["execution_count"] - before - 1  # the long request ran alone
    assert 0 < concurrent_runs < len(requests)
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 2


def test_embed_binary_bytes_tensors_decode_like_json(embed_app, encoder_session):
    texts = ["Ünïcödé, accents and emoji 🚀 are part of real traffic too.", "A man is eating food."]
    body, headers = binary_text_request([t.encode() for t in texts], binary_output=True)

    async def scenario(app):
        binary = await call(app, "POST", f"/v2/models/{EMBED}/versions/1/infer", body, headers)
        as_json = await call(app, "POST", EMBED_INFER, text_body(texts, nested=False))
        return binary, as_json

    (bstatus, bheaders, bcontent), (status, _, content) = run_with_app(embed_app, scenario)
    assert bstatus == 200 and status == 200, (bcontent, content)
    assert bheaders["content-type"] == "application/octet-stream"
    from_binary = embeddings_of(bcontent, bheaders)
    assert_same_embeddings(from_binary, reference_embeddings(encoder_session, texts))
    np.testing.assert_allclose(from_binary, embeddings_of(content), atol=1e-6)


def _text_tensor(**changes):
    tensor = {"name": embedding.TEXT, "shape": [1, 1], "datatype": "BYTES", "data": ["text"]}
    return orjson.dumps({"inputs": [{**tensor, **changes}]}), {}


EMBED_BAD_REQUESTS = [
    ((text_body(["fine", ""]), {}), "TEXT[1]: empty text"),
    ((text_body(["   "]), {}), "TEXT[0]: text has only whitespace"),
    (binary_text_request([b"fine", b"\xff\xfe bad"]), "TEXT[1]: not UTF-8"),
    (binary_request(struct.pack("<I", 10) + b"ab", 1), "TEXT[0] declares 10 bytes"),
    (binary_request(b"\0\0", 1), "ends at byte 2, before element 0"),
    (_text_tensor(data=[5]), "TEXT[0] must be a string, got 5"),
    (_text_tensor(data=[None]), "TEXT[0] must be a string, got null"),
    (_text_tensor(datatype="FP32"), "datatype BYTES"),
    (_text_tensor(shape=[1]), "the model expects [-1, 1]"),
    (_text_tensor(shape=[65, 1]), "outside 1..64"),
    (_text_tensor(shape=[2, 1]), "has 1 values, shape [2, 1] needs 2"),
    (_text_tensor(shape=[2, 1], data=[["a", "b"]]), "not nested as its declared shape [2, 1]"),
    (_text_tensor(name="TEXTS"), "expected exactly one input 'TEXT'"),
    (
        (orjson.dumps({**orjson.loads(_text_tensor()[0]), "outputs": [{"name": "LOGITS"}]}), {}),
        "unknown output 'LOGITS'",
    ),
]


def test_embed_bad_texts_get_400_naming_the_item_and_batchmates_succeed(embed_app, encoder_session):
    good = ["A monkey is playing drums.", "The girl is carrying a baby."]

    async def scenario(app):
        # Bad and good requests at once: the good ones share micro-batches among themselves.
        everything = await asyncio.gather(
            *(call(app, "POST", EMBED_INFER, *request) for request, _ in EMBED_BAD_REQUESTS),
            *(call(app, "POST", EMBED_INFER, text_body([t])) for t in good),
        )
        after = await call(app, "POST", EMBED_INFER, text_body(good))
        return everything[: len(EMBED_BAD_REQUESTS)], everything[len(EMBED_BAD_REQUESTS) :], after

    bad, concurrent_good, after = run_with_app(embed_app, scenario)
    for (_, reason), (code, headers, body) in zip(EMBED_BAD_REQUESTS, bad, strict=True):
        assert code == 400, (reason, body)
        assert headers["content-type"].startswith("application/json")
        assert reason in orjson.loads(body)["error"], (reason, body)
    expected = reference_embeddings(encoder_session, good)
    for row, (status, _, content) in zip(expected, concurrent_good, strict=True):
        assert status == 200, content
        assert_same_embeddings(embeddings_of(content), row[None])
    assert after[0] == 200, after[2]
    assert_same_embeddings(embeddings_of(after[2]), expected)


def test_embed_metadata_config_and_stats_name_the_embed_model(embed_app):
    async def scenario(app):
        paths = [
            f"/v2/models/{EMBED}",
            f"/v2/models/{EMBED}/ready",
            f"/v2/models/{EMBED}/config",
            f"/v2/models/{EMBED}/stats",
            "/v2/models/classifier",
        ]
        return {p: await call(app, "GET", p) for p in paths}

    replies = run_with_app(embed_app, scenario)
    assert replies["/v2/models/classifier"][0] == 404  # only the served model is known
    meta = orjson.loads(replies[f"/v2/models/{EMBED}"][2])
    assert meta["name"] == EMBED
    assert meta["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
    assert meta["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": [-1, 384]}]
    assert replies[f"/v2/models/{EMBED}/ready"][0] == 200
    config = orjson.loads(replies[f"/v2/models/{EMBED}/config"][2])
    assert config["name"] == EMBED and config["max_batch_size"] == 64
    assert (config["input"][0]["data_type"], config["input"][0]["dims"]) == ("TYPE_STRING", [1])
    assert (config["output"][0]["data_type"], config["output"][0]["dims"]) == ("TYPE_FP32", [384])
    assert orjson.loads(replies[f"/v2/models/{EMBED}/stats"][2])["model_stats"][0]["name"] == EMBED


def test_embed_null_mode_answers_zeros_without_the_model():
    app = create_app(None, model_name=EMBED)
    assert app.state.peer.batcher is None

    async def scenario(app):
        texts = await call(app, "POST", EMBED_INFER, text_body(["one", "two", "three"]))
        binary = await call(app, "POST", EMBED_INFER, *binary_text_request([b"a", b"b"]))
        bad = [
            await call(app, "POST", EMBED_INFER, *_text_tensor(datatype="INT8")),
            await call(app, "POST", EMBED_INFER, *_text_tensor(data=[1])),
            await call(app, "POST", EMBED_INFER, *binary_request(b"\0\0", 1)),
        ]
        return texts, binary, bad

    texts, binary, bad = run_with_app(app, scenario)
    assert texts[0] == 200 and binary[0] == 200
    zeros = embeddings_of(texts[2])
    assert zeros.shape == (3, embedding.HIDDEN_SIZE) and not zeros.any()
    assert embeddings_of(binary[2]).shape == (2, embedding.HIDDEN_SIZE)
    assert [status for status, _, _ in bad] == [400] * 3


def test_embed_cli_and_process_options():
    args = peer_mod.parse_args(["--model-name", EMBED])
    assert args.model == peer_mod.DEFAULT_EMBED_MODEL and args.max_batch == 64
    assert peer_mod.parse_args([]).model == peer_mod.DEFAULT_MODEL
    command = PeerServer(peer_mod.DEFAULT_EMBED_MODEL, model_name=EMBED).command()
    assert command[command.index("--model-name") + 1] == EMBED
    assert "--max-batch" not in command  # the model's own default applies
    with pytest.raises(ValueError, match="not 'bert'"):
        PeerServer(None, model_name="bert")
    with pytest.raises(ValueError, match="not 'bert'"):
        create_app(None, model_name="bert")


def test_embed_null_peer_process_serves_texts(tmp_path):
    with PeerServer(None, model_name=EMBED, log_path=tmp_path / "peer.log") as server:
        request = urllib.request.Request(
            f"http://{server.url}{EMBED_INFER}", data=text_body(["hello"]), method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert embeddings_of(response.read()).shape == (1, embedding.HIDDEN_SIZE)


def test_embed_batcher_counts_real_and_padded_tokens(embed_app):
    # One request after the other: each is one batch, padded to its own longest text.
    requests = [["Short.", text_samples.LONG_TEXT], list(text_samples.SENTENCES[:3])]

    async def scenario(app):
        counts = []
        for texts in requests:
            status, _, content = await call(app, "POST", EMBED_INFER, text_body(texts))
            assert status == 200, content
            _, _, stats = await call(app, "GET", f"/v2/models/{EMBED}/stats")
            counts.append(orjson.loads(stats)["model_stats"][0]["token_stats"])
        return counts

    start = dict(embed_app.state.peer.stats.__dict__)
    counts = run_with_app(embed_app, scenario)
    real, padded = start["tokens"], start["padded_tokens"]
    for texts, seen in zip(requests, counts, strict=True):
        lengths = [len(t) for t in tokenization.encode(texts)[0]]
        real, padded = real + sum(lengths), padded + len(lengths) * max(lengths)
        assert seen == {"tokens": real, "padded_tokens": padded}
    assert padded > real  # the long text padded the short one to 256 word pieces


# The whole classify pipeline -------------------------------------------------------------------
@pytest.fixture(scope="module")
def classify_app(classifier_onnx):
    return create_app(
        classifier_onnx,
        intra_op_threads=1,
        max_batch=8,
        max_wait_ms=50,
        model_name=classification.ENSEMBLE,
    )


def image_request(images: list[bytes], binary_output=True):
    raw = b"".join(struct.pack("<I", len(x)) + x for x in images)
    tensor = {"name": classification.IMAGE, "shape": [len(images), 1], "datatype": "BYTES"}
    tensor["parameters"] = {"binary_data_size": len(raw)}
    header = orjson.dumps({"inputs": [tensor], "parameters": {"binary_data_output": binary_output}})
    return header + raw, {"Inference-Header-Content-Length": len(header)}


def top_k_of(content, headers) -> dict[str, list]:
    """The three outputs of a binary or JSON classify answer."""
    split = int(headers.get("inference-header-content-length", len(content)))
    reply = orjson.loads(content[:split])
    out, offset = {}, split
    for output in reply["outputs"]:
        if "data" in output:
            out[output["name"]] = output["data"]
            continue
        size = output["parameters"]["binary_data_size"]
        raw = content[offset : offset + size]
        offset += size
        if output["datatype"] == "BYTES":
            items, at = [], 0
            while at < len(raw):
                (n,) = struct.unpack_from("<I", raw, at)
                items.append(raw[at + 4 : at + 4 + n].decode())
                at += 4 + n
            out[output["name"]] = items
        else:
            dtype = {"FP32": "<f4", "INT32": "<i4"}[output["datatype"]]
            out[output["name"]] = np.frombuffer(raw, dtype).tolist()
    return out


def test_the_pipeline_peer_batches_jpegs_and_answers_as_the_reference(classify_app, reference):
    from export import samples

    photos = [samples.photo_bytes(n) for n in samples.PHOTOS]
    requests = [[photos[i % 6]] for i in range(8)] + [photos[:2]]

    async def scenario(app):
        replies = await asyncio.gather(
            *(call(app, "POST", "/v2/models/classify/infer", *image_request(r)) for r in requests),
            call(app, "POST", "/v2/models/classify/infer", *image_request([photos[0]], False)),
            call(app, "POST", "/v2/models/classify/infer", *image_request([b"not an image"])),
        )
        _, _, stats = await call(app, "GET", "/v2/models/classify/stats")
        _, _, meta = await call(app, "GET", "/v2/models/classify")
        return replies, orjson.loads(stats)["model_stats"][0], orjson.loads(meta)

    replies, stats, meta = run_with_app(classify_app, scenario)
    *good, as_json, bad = replies
    for images, (status, headers, content) in zip([*requests, [photos[0]]], [*good, as_json],
                                                  strict=True):  # fmt: skip
        assert status == 200, content
        got = top_k_of(content, headers)
        labels, scores, ids = reference.classify(images)
        assert got[classification.CLASS_IDS] == ids.reshape(-1).tolist()
        assert got[classification.LABELS] == [x.decode() for x in labels.reshape(-1)]
        np.testing.assert_allclose(got[classification.SCORES], scores.reshape(-1), atol=1e-5)
    # Concurrent requests shared model runs; the bad image failed its own request only.
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 2
    assert bad[0] == 500 and "not an image" in orjson.loads(bad[2])["error"]
    names = [(o["name"], o["datatype"]) for o in meta["outputs"]]
    assert names == [
        (classification.LABELS, "BYTES"),
        (classification.SCORES, "FP32"),
        (classification.CLASS_IDS, "INT32"),
    ]
