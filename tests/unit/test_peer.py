"""The peer baseline: micro-batching, parity with onnxruntime, KServe v2 errors, null mode.

The app is driven in-process through ASGI (no HTTP client library needed); one test starts the
real ``python -m client.perf.peer`` process and talks to it over a socket.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest

from client.perf import peer as peer_mod
from client.perf.peer import MicroBatcher, PeerServer, create_app
from pipelines import classification as spec
from pipelines import onnx_runner

SHAPE = (spec.CHANNELS, spec.IMAGE_SIZE, spec.IMAGE_SIZE)


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
    tensor = {"name": spec.PIXELS, "shape": list(pixels.shape), "datatype": "FP32", "data": data}
    return orjson.dumps({"inputs": [tensor], **extra})


def logits_of(content):
    reply = orjson.loads(content)
    (output,) = reply["outputs"]
    assert output["name"] == spec.LOGITS and output["datatype"] == "FP32"
    return np.asarray(output["data"], np.float32).reshape(output["shape"])


def images(rows, seed):
    return np.random.default_rng(seed).normal(size=(rows, *SHAPE)).astype(np.float32)


@pytest.fixture(scope="module")
def session(classifier_onnx):
    return onnx_runner.create_session(classifier_onnx, intra_op_threads=1)


@pytest.fixture(scope="module")
def app(classifier_onnx):
    # A long wait so that concurrent requests surely meet in one batch.
    return create_app(classifier_onnx, intra_op_threads=1, max_batch=8, max_wait_ms=50)


def direct(session, pixels):
    return session.run([spec.LOGITS], {spec.PIXELS: pixels})[0]


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
        assert logits.shape == (len(pixels), spec.NUM_CLASSES)
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
                    "name": spec.PIXELS,
                    "shape": [2, *SHAPE],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": pixels.nbytes},
                }
            ],
            "outputs": [{"name": spec.LOGITS, "parameters": {"binary_data": True}}],
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
        "name": spec.PIXELS,
        "shape": [1, *SHAPE],
        "datatype": "FP32",
        "data": [0.0] * int(np.prod(SHAPE)),
    }
    return orjson.dumps({"inputs": [{**tensor, **changes}]})


BAD_REQUESTS = [
    (b"{not json", "not valid JSON"),
    (b"[]", "must be a JSON object"),
    (b"{}", "has no 'inputs'"),
    (_tensor(name="IMAGE"), "expected exactly one input 'PIXELS'"),
    (_tensor(datatype="FP16"), "datatype FP32"),
    (_tensor(shape=[1, 3, 32, 32]), "the model expects [-1, 3, 224, 224]"),
    (_tensor(shape=[9, *SHAPE]), "outside 1..8"),
    (_tensor(data=[0.0] * 10), "has 10 values"),
    (_tensor(data=["x"] * int(np.prod(SHAPE))), "only numbers"),
    (_tensor(data=[None] * int(np.prod(SHAPE))), "only numbers"),
    (_tensor(data=[[0.0] * 3, [0.0]]), "not a regular array"),
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
    assert meta["inputs"] == [{"name": "PIXELS", "datatype": "FP32", "shape": [-1, *SHAPE]}]
    assert meta["outputs"] == [{"name": "LOGITS", "datatype": "FP32", "shape": [-1, 1000]}]
    config = orjson.loads(replies["/v2/models/classifier/config"][2])
    assert config["max_batch_size"] == 8
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == list(SHAPE)
    assert config["output"][0]["dims"] == [spec.NUM_CLASSES]


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
    assert logits_of(ok[2]).shape == (1, spec.NUM_CLASSES)
    logits = logits_of(batch[2])
    assert logits.shape == (3, spec.NUM_CLASSES) and not logits.any()
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
            assert logits_of(response.read()).shape == (1, spec.NUM_CLASSES)
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
