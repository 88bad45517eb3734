"""Error codes on a real tritonserver: a bad input is the client's fault, a broken model is not.

A bad request must come back as HTTP 400 / gRPC ``INVALID_ARGUMENT`` (fix the input), a model
that fails on good input as HTTP 500 / gRPC ``INTERNAL`` (an operator must look), and neither
may fail the other requests of the same formed batch.

The broken model is a real one, loaded the way an operator loads a new export: the production
``embed_graph`` adapter (its own ``model.py``) over an ONNX graph whose batch axis was lost at
export. It pools over the batch axis instead of the tokens, so it returns one row whatever it
is given: right for a request of one text, wrong for a request of two, which the adapter must
refuse (``np.split`` would hand out short pieces). It goes in through the model-control API with
a config and file override on a server of its own (explicit model control), never into the
model repository.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from client.connection import module
from paths import MODEL_REPOSITORY
from pipelines import embedding
from server import Server, ServerConfig

pytestmark = pytest.mark.integration

PROTOCOLS = ["http", "grpc"]
MODEL = embedding.GRAPH_ENSEMBLE  # embed_graph: text in, vector out, one Python model locally
CLIENT_TIMEOUT_S = 60
# The whole burst must land in one execution: the batcher waits this long for a full batch,
# far longer than four threads need to send their requests even on a busy core.
QUEUE_DELAY_US = 1_500_000
TRIES = 4  # bursts before giving up on one execution holding all four requests
STATUS = {
    "http": {"bad": "400", "broken": "500"},
    "grpc": {"bad": "StatusCode.INVALID_ARGUMENT", "broken": "StatusCode.INTERNAL"},
}


def batch_axis_lost_onnx() -> bytes:
    """TEXT [N, 1] → EMBEDDING [1, 384]: the mean over the batch axis, broadcast."""
    from onnx import TensorProto, helper

    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    width = helper.make_tensor("width", TensorProto.INT64, [2], [1, embedding.HIDDEN_SIZE])
    nodes = [
        helper.make_node("Shape", [embedding.TEXT], ["shape"]),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=one),
        helper.make_node("ReduceMean", ["ones"], ["pooled"], axes=[0], keepdims=1),
        helper.make_node("Expand", ["pooled", "width"], [embedding.EMBEDDING]),
    ]
    graph = helper.make_graph(
        nodes,
        "batch_axis_lost",
        [helper.make_tensor_value_info(embedding.TEXT, TensorProto.STRING, ["batch", 1])],
        [helper.make_tensor_value_info(embedding.EMBEDDING, TensorProto.FLOAT, [1, "width"])],
        initializer=[width],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def broken_config() -> str:
    return json.dumps(
        {
            "name": MODEL,
            "backend": "python",
            "max_batch_size": 8,
            "input": [{"name": embedding.TEXT, "data_type": "TYPE_STRING", "dims": [1]}],
            "output": [
                {
                    "name": embedding.EMBEDDING,
                    "data_type": "TYPE_FP32",
                    "dims": [embedding.HIDDEN_SIZE],
                }
            ],
            "instance_group": [{"kind": "KIND_CPU", "count": 1}],
            "dynamic_batching": {"max_queue_delay_microseconds": QUEUE_DELAY_US},
        }
    )


@pytest.fixture(scope="module")
def broken_server(tmp_path_factory):
    """A server with explicit model control serving only the broken ``embed_graph``."""
    import tritonclient.grpc as grpc

    log_path = tmp_path_factory.mktemp("error-codes") / "tritonserver.log"
    config = ServerConfig(
        http_port=0, grpc_port=0, metrics_port=0, extra_args=["--model-control-mode=explicit"]
    )
    with Server(config, log_path=log_path) as server:
        files = {
            "file:1/model.py": (MODEL_REPOSITORY / MODEL / "1" / "model.py").read_bytes(),
            "file:1/model.onnx": batch_axis_lost_onnx(),
        }
        with grpc.InferenceServerClient(server.grpc_url) as admin:
            admin.load_model(
                MODEL, config=broken_config(), files=files, headers=server.admin_headers("grpc")
            )
            assert admin.is_model_ready(MODEL)
        yield server


def url(server: Server, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


def send(server: Server, protocol: str, texts: list[bytes]):
    """One request of ``texts``: its EMBEDDING, or the InferenceServerException it got."""
    mod = module(protocol)
    array = np.array(texts, dtype=np.object_).reshape(-1, 1)
    tensor = mod.InferInput(embedding.TEXT, list(array.shape), "BYTES")
    tensor.set_data_from_numpy(array)
    with mod.InferenceServerClient(url(server, protocol)) as client:
        timeout = {"client_timeout": CLIENT_TIMEOUT_S} if protocol == "grpc" else {}
        try:
            return client.infer(MODEL, [tensor], **timeout).as_numpy(embedding.EMBEDDING)
        except InferenceServerException as exc:
            return exc


def executions(server: Server) -> int:
    import tritonclient.http as http

    with http.InferenceServerClient(server.http_url) as client:
        (stats,) = client.get_inference_statistics(MODEL)["model_stats"]
    return int(stats["execution_count"])


def burst(server: Server, protocol: str, plan: dict[str, list[bytes]]) -> tuple[dict, int]:
    """Send every request of ``plan`` at once; their answers and the executions they took."""
    before = executions(server)
    answers: dict = {}
    threads = [
        threading.Thread(target=lambda k=k: answers.__setitem__(k, send(server, protocol, plan[k])))
        for k in plan
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(CLIENT_TIMEOUT_S + 10)
    assert set(answers) == set(plan), "a request was never answered"
    return answers, executions(server) - before


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_input_is_400_a_broken_model_is_500_and_the_rest_of_the_batch_succeeds(
    broken_server, protocol
):
    plan = {
        "good": [b"A man is eating food."],
        "broken": [b"two texts make", b"the lost batch axis show"],
        "bad": ["café".encode("latin-1")],  # not UTF-8: the client's fault
        "also good": [b"A man is riding a horse."],
    }
    for _ in range(TRIES):
        answers, taken = burst(broken_server, protocol, plan)
        if taken == 1:
            break
    assert taken == 1, f"the four requests never shared one execution (last burst: {taken})"

    for name in ("good", "also good"):
        assert not isinstance(answers[name], Exception), str(answers[name])
        assert answers[name].shape == (1, embedding.HIDDEN_SIZE)

    bad, broken = answers["bad"], answers["broken"]
    assert isinstance(bad, InferenceServerException), "the bad request succeeded"
    assert bad.status() == STATUS[protocol]["bad"], str(bad)
    assert "TEXT[0]: not UTF-8" in bad.message()

    assert isinstance(broken, InferenceServerException), "the broken model's answer was accepted"
    assert broken.status() == STATUS[protocol]["broken"], str(broken)
    assert (
        f"model {MODEL} failed: output {embedding.EMBEDDING} has 1 rows for 2 input rows"
        in broken.message()
    )


def test_the_broken_graph_really_returns_one_row_for_two(tmp_path: Path):
    """The fault is the graph's, not the server's: onnxruntime itself returns one row for two."""
    import onnxruntime as ort

    path = tmp_path / "model.onnx"
    path.write_bytes(batch_axis_lost_onnx())
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    two = np.array([["a"], ["b"]], dtype=object)
    (vectors,) = session.run([embedding.EMBEDDING], {embedding.TEXT: two})
    assert vectors.shape == (1, embedding.HIDDEN_SIZE)
