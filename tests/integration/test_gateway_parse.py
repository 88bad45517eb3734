"""What the gateway reads inside a request, read as Triton reads it: real nginx, real tritonserver.

A gRPC request names its model inside its protobuf message, where a parser keeps the last of a
field given twice and skips fields it does not know: the gateway routes, shapes and logs a
request under the model Triton answers for, or refuses it. Each refusal is checked against the
same bytes sent to Triton directly, which takes them (docs/operations.md#security).
"""

from __future__ import annotations

import json
import time

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from bench.harness.pki import make_pki
from gateway import shaping
from gateway.nginx.config import SERVED, TLS
from gateway.nginx.process import Nginx
from pipelines import classification, embedding

pytestmark = pytest.mark.integration

LIMITS = shaping.parse_limits(
    {
        "anonymous": {"rate": 1000, "capacity": 1000},
        "models": {m: {"rate": 1000, "capacity": 1000} for m in SERVED},
    }
)
# Models that take TEXT [1, 1]: served ones, and steps that Triton serves but the gateway must not.
TEXT_SERVED = (embedding.ENSEMBLE, embedding.INT8_ENSEMBLE, embedding.GRAPH_ENSEMBLE)
TEXT_STEPS = (
    embedding.TOKENIZE,
    embedding.TOKENIZE_ENCODE,
    embedding.OPENAI_MODELS[embedding.ENSEMBLE],
)
# Few examples, always the same ones: the suite runs on a small, busy machine, and a failure
# must come back on the next run.
PROPERTY = settings(
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module", params=["plain", "tls"])
def gateway(request, server, pki, nginx_binary, tmp_path_factory):
    """The gateway (plain, or over TLS on both ports) with buckets for every served model."""
    tls = TLS(str(pki.certificate), str(pki.key)) if request.param == "tls" else None
    log_path = tmp_path_factory.mktemp("parse") / "nginx.log"
    with Nginx(
        [server.http_url], [server.grpc_url], limits=LIMITS, log_path=log_path, tls=tls
    ) as nginx:
        yield nginx


@pytest.fixture(scope="module")
def plain(server, nginx_binary, tmp_path_factory):
    """A plain-text gateway, for the property tests (the TLS one runs the same script)."""
    log_path = tmp_path_factory.mktemp("parse-plain") / "nginx.log"
    with Nginx([server.http_url], [server.grpc_url], limits=LIMITS, log_path=log_path) as nginx:
        yield nginx


def channel(nginx: Nginx | None, server, pki) -> grpc.Channel:
    """A channel to the gateway (TLS when it speaks TLS), or to Triton itself for None."""
    if nginx is None:
        return grpc.insecure_channel(server.grpc_url)
    if nginx.gateway.tls is None:
        return grpc.insecure_channel(nginx.grpc_url)
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
    return grpc.secure_channel(nginx.grpc_url, credentials)


RESPONSES = {
    "ModelInfer": service_pb2.ModelInferResponse,
    "ModelMetadata": service_pb2.ModelMetadataResponse,
    "ModelReady": service_pb2.ModelReadyResponse,
    "ModelConfig": service_pb2.ModelConfigResponse,
}


def raw_call(chan: grpc.Channel, method: str, message: bytes, compression=None):
    """(status code, response or None, details) of one call whose message is these bytes."""
    call = chan.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=None,  # the bytes as they are
        response_deserializer=RESPONSES[method].FromString,
    )
    try:
        return grpc.StatusCode.OK, call(message, timeout=30, compression=compression), ""
    except grpc.RpcError as exc:
        return exc.code(), None, exc.details()


def text_request(model: str, text: bytes = b"a short sentence") -> service_pb2.ModelInferRequest:
    """A ModelInferRequest with one TEXT [1, 1] (Triton's BYTES: a 4-byte length, the bytes)."""
    request = service_pb2.ModelInferRequest(
        model_name=model,
        inputs=[
            service_pb2.ModelInferRequest.InferInputTensor(
                name=embedding.TEXT, datatype="BYTES", shape=[1, 1]
            )
        ],
    )
    request.raw_input_contents.append(len(text).to_bytes(4, "little") + text)
    return request


def shaping_lines(nginx: Nginx) -> list[dict]:
    return [json.loads(line) for line in nginx.shaping_log.read_text().splitlines()]


def logged_after(nginx: Nginx, count: int) -> dict:
    """The log line after the first ``count`` (nginx writes it once the answer is sent)."""
    deadline = time.monotonic() + 10
    while True:
        lines = shaping_lines(nginx)
        if len(lines) > count or time.monotonic() > deadline:
            assert len(lines) == count + 1, lines[count:]
            return lines[count]
        time.sleep(0.02)


# Protobuf on the wire: https://protobuf.dev/programming-guides/encoding/
VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, wire_type: int, payload: bytes | int) -> bytes:
    """One encoded field: its tag, then a varint, 8 or 4 bytes, or a length and bytes."""
    tag = varint(number << 3 | wire_type)
    if wire_type == VARINT:
        return tag + varint(payload)
    if wire_type == LENGTH_DELIMITED:
        return tag + varint(len(payload)) + payload
    return tag + payload


# A second name in one message, the one Triton would take -----------------------------------------
def test_a_message_that_names_two_models_is_refused_as_triton_would_take_the_last(
    gateway, server, pki
):
    step = classification.PREPROCESS
    cases = [
        (
            "ModelMetadata",
            service_pb2.ModelMetadataRequest(name=embedding.ENSEMBLE).SerializeToString()
            + service_pb2.ModelMetadataRequest(name=embedding.ENCODER).SerializeToString(),
            lambda response: response.name == embedding.ENCODER,
        ),
        (
            "ModelInfer",
            service_pb2.ModelInferRequest(model_name=embedding.ENSEMBLE).SerializeToString()
            + text_request(embedding.TOKENIZE).SerializeToString(),
            lambda response: response.model_name == embedding.TOKENIZE,
        ),
        (
            # The second name after 2 MiB of a field nobody reads, past any first bytes.
            "ModelInfer",
            text_request(embedding.ENSEMBLE).SerializeToString()
            + field(99, LENGTH_DELIMITED, bytes(2 << 20))
            + field(1, LENGTH_DELIMITED, embedding.TOKENIZE.encode()),
            lambda response: response.model_name == embedding.TOKENIZE,
        ),
        (
            "ModelReady",
            service_pb2.ModelReadyRequest(name=embedding.ENSEMBLE).SerializeToString()
            + service_pb2.ModelReadyRequest(name="no-such-model").SerializeToString(),
            lambda response: response.ready is False,
        ),
    ]
    with channel(gateway, server, pki) as front, channel(None, server, pki) as direct:
        for method, message, answered_for_the_last in cases:
            code, _, details = raw_call(front, method, message)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, details)
            assert "names its model 2 times" in details
            # The control: Triton takes the bytes and answers for the second name.
            code, response, details = raw_call(direct, method, message)
            assert code == grpc.StatusCode.OK and answered_for_the_last(response), details
        # ModelConfig is the operators' (none here) whatever it names; Triton answers it.
        message = (
            service_pb2.ModelConfigRequest(name=embedding.ENSEMBLE).SerializeToString()
            + service_pb2.ModelConfigRequest(name=step).SerializeToString()
        )
        assert raw_call(front, "ModelConfig", message)[0] == grpc.StatusCode.PERMISSION_DENIED
        code, response, _ = raw_call(direct, "ModelConfig", message)
        assert code == grpc.StatusCode.OK and response.config.name == step


def test_a_name_written_as_no_client_writes_it_is_still_the_one_protobuf_reads(
    gateway, server, pki
):
    """A tag in two bytes, and a name after the other fields: Triton reads both as field 1."""
    inputs = text_request(embedding.ENSEMBLE)
    inputs.ClearField("model_name")
    overlong = bytes([1 << 3 | LENGTH_DELIMITED | 0x80, 0x00])
    cases = {
        "last": inputs.SerializeToString() + field(1, LENGTH_DELIMITED, b"embed"),
        "two-byte tag": overlong + varint(5) + b"embed" + inputs.SerializeToString(),
    }
    with channel(gateway, server, pki) as front:
        for name, message in cases.items():
            before = len(shaping_lines(gateway))
            code, response, details = raw_call(front, "ModelInfer", message)
            assert code == grpc.StatusCode.OK, (name, details)
            assert response.model_name == embedding.ENSEMBLE
            assert logged_after(gateway, before)["model"] == embedding.ENSEMBLE
            # The same with a step's name is refused: the gateway read the name there.
            stepped = message.replace(b"embed", b"tkniz")
            code, _, details = raw_call(front, "ModelInfer", stepped)
            assert code == grpc.StatusCode.NOT_FOUND and "'tkniz'" in details, (name, details)


def test_malformed_messages_get_a_clear_refusal(gateway, server, pki):
    name = field(1, LENGTH_DELIMITED, b"embed")
    cases = {
        "a group": name + field(9, 3, b"") + field(9, 4, b""),
        "a name that is a number": field(1, VARINT, 7),
        "a field past the end": name + field(9, LENGTH_DELIMITED, b"xyz")[:-1],
        "an 11-byte varint": name + bytes([9 << 3]) + b"\xff" * 10 + b"\x01",
        "no name": field(9, VARINT, 1),
        "nothing": b"",
    }
    with channel(gateway, server, pki) as front:
        for case, message in cases.items():
            code, _, details = raw_call(front, "ModelInfer", message)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (case, details)
            assert "could not read this request" in details or "names no model" in details
        # gRPC compression hides the name from the gateway: refused, saying so. (gRPC sends a
        # message of a few bytes uncompressed: this one is worth compressing.)
        message = name + field(9, LENGTH_DELIMITED, bytes(4096))
        code, _, details = raw_call(front, "ModelInfer", message, grpc.Compression.Gzip)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "without gRPC compression" in details


# The property: whatever the fields, their order and their encoding ------------------------------
# Served models twice as often as the others.
MODELS = (*TEXT_SERVED, *TEXT_SERVED, *TEXT_STEPS, "no-such-model")
# Unknown to every message here (ModelInferRequest's fields are 1-7).
UNKNOWN_FIELDS = st.integers(8, (1 << 29) - 1)


@st.composite
def unknown_field(draw) -> bytes:
    """A field of a number no message here has, of any wire type but the deprecated groups."""
    number = draw(UNKNOWN_FIELDS)
    wire_type = draw(st.sampled_from([VARINT, FIXED64, LENGTH_DELIMITED, FIXED32]))
    if wire_type == VARINT:
        return field(number, wire_type, draw(st.integers(0, (1 << 64) - 1)))
    size = {FIXED64: 8, FIXED32: 4}.get(wire_type)
    return field(number, wire_type, draw(st.binary(min_size=size or 0, max_size=size or 64)))


@st.composite
def name_field(draw) -> tuple[str, bool, bytes]:
    """(model, a string as protobuf reads one, bytes): field 1 written plainly, with a tag of
    more bytes than it needs, or with the wrong wire type (which protobuf skips as unknown)."""
    model = draw(st.sampled_from(MODELS))
    how = draw(st.sampled_from(["plain", "plain", "plain", "long tag", "number"]))
    if how == "number":
        return model, False, field(1, VARINT, len(model))
    tag = bytes([1 << 3 | LENGTH_DELIMITED])
    if how == "long tag":
        tag = bytes([tag[0] | 0x80, 0x80, 0x00])
    return model, True, tag + varint(len(model)) + model.encode()


# Most often one name, as clients send it; else none, or two or three.
NAMES = st.one_of(
    st.lists(name_field(), min_size=1, max_size=1), st.lists(name_field(), max_size=3)
)


@st.composite
def infer_message(draw):
    """(names, bytes) of a ModelInferRequest in pieces, shuffled."""
    names = draw(NAMES)
    inputs = text_request("").SerializeToString()  # inputs (5) and the tensor's bytes (7)
    pieces = [
        *(piece for _, _, piece in names),
        *draw(st.lists(unknown_field(), max_size=3)),
        inputs,
    ]
    pieces = draw(st.permutations(pieces))
    return [(model, string) for model, string, _ in names], b"".join(pieces)


def expected(names: list[tuple[str, bool]]):
    """The gateway's answer, by its rules: (status, the model it passes the request to)."""
    if len(names) != 1 or not names[0][1]:
        return grpc.StatusCode.INVALID_ARGUMENT, None
    model = names[0][0]
    return (grpc.StatusCode.OK, model) if model in SERVED else (grpc.StatusCode.NOT_FOUND, None)


@PROPERTY
@given(case=infer_message())
def test_a_model_infer_is_answered_logged_and_shaped_for_the_model_triton_reads(
    plain, server, pki, case
):
    names, message = case
    # What Triton's parser makes of the bytes (protobuf's own, here in Python).
    parsed = service_pb2.ModelInferRequest.FromString(message)
    want, model = expected(names)
    event(f"{want.name} {model}")
    before = len(shaping_lines(plain))
    with channel(plain, server, pki) as front:
        code, response, details = raw_call(front, "ModelInfer", message)
    assert code == want, details
    if code == grpc.StatusCode.OK:
        assert response.model_name == parsed.model_name == model
        line = logged_after(plain, before)
        assert (line["model"], line["status"]) == (model, "200")


@st.composite
def metadata_message(draw):
    names = draw(NAMES)
    pieces = [piece for _, _, piece in names] + draw(st.lists(unknown_field(), max_size=3))
    message = b"".join(draw(st.permutations(pieces)))
    return [(model, string) for model, string, _ in names], message


@PROPERTY
@given(case=metadata_message(), method=st.sampled_from(["ModelMetadata", "ModelReady"]))
def test_metadata_and_readiness_are_answered_for_the_model_triton_reads(
    plain, server, pki, case, method
):
    names, message = case
    parsed = service_pb2.ModelMetadataRequest.FromString(message)
    want, model = expected(names)
    event(f"{method} {want.name} {model}")
    with channel(plain, server, pki) as front:
        code, response, details = raw_call(front, method, message)
    assert code == want, details
    if code == grpc.StatusCode.OK and method == "ModelMetadata":
        assert response.name == parsed.name == model
    elif code == grpc.StatusCode.OK:
        assert response.ready and parsed.name == model
