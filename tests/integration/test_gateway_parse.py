"""What the gateway reads inside a request, read as Triton reads it: real nginx, real tritonserver.

A gRPC request names its model inside its protobuf message, where a parser keeps the last of a
field given twice and skips fields it does not know: the gateway routes, shapes and logs a
request under the model Triton answers for, or refuses it. An inference request's `priority`
and `timeout` parameters are the operator's: a tenant's request that sets either is refused,
over gRPC, HTTP JSON and HTTP binary tensors alike. Each refusal is checked against the same
bytes sent to Triton directly, which takes them (docs/operations.md#security).
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from functools import partial

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from gevent.ssl import create_default_context
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from bench.harness.pki import make_pki
from gateway import shaping
from gateway.nginx.config import TLS, Gateway, Shaping, Upstreams
from gateway.nginx.process import Nginx
from gateway.served import SERVED
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
OWNED = ("priority", "timeout")
OWNED_REFUSAL = "is not accepted through the gateway"
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
    gateway = Gateway(Upstreams.of(server), shaping=Shaping(LIMITS), tls=tls)
    with Nginx(gateway, log_path=log_path) as nginx:
        yield nginx


@pytest.fixture(scope="module")
def plain(server, nginx_binary, tmp_path_factory):
    """A plain-text gateway, for the property tests (the TLS one runs the same script)."""
    log_path = tmp_path_factory.mktemp("parse-plain") / "nginx.log"
    with Nginx(Gateway(Upstreams.of(server), shaping=Shaping(LIMITS)), log_path=log_path) as nginx:
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
    return [json.loads(line) for line in nginx.access_log.read_text().splitlines()]


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
def parameter_field(draw) -> tuple[set[str], bytes]:
    """(keys a parser may read, one entry of ModelInferRequest.parameters): an entry as a
    client writes it, one that gives its key twice, or a field 4 of another wire type."""
    keys = draw(st.lists(st.sampled_from([*OWNED, "user", "prio", "x"]), min_size=1, max_size=2))
    value = service_pb2.InferParameter(int64_param=draw(st.integers(1, 3))).SerializeToString()
    if draw(st.booleans()):
        entry = b"".join(field(1, LENGTH_DELIMITED, key.encode()) for key in keys)
        return set(keys), field(4, LENGTH_DELIMITED, entry + field(2, LENGTH_DELIMITED, value))
    return set(), field(4, VARINT, 1)


@st.composite
def infer_message(draw):
    """(names, parameter keys, bytes) of a ModelInferRequest in pieces, shuffled."""
    names = draw(NAMES)
    parameters = draw(st.lists(parameter_field(), max_size=2))
    inputs = text_request("").SerializeToString()  # inputs (5) and the tensor's bytes (7)
    pieces = [
        *(piece for _, _, piece in names),
        *(piece for _, piece in parameters),
        *draw(st.lists(unknown_field(), max_size=3)),
        inputs,
    ]
    pieces = draw(st.permutations(pieces))
    keys = set().union(*(keys for keys, _ in parameters))
    return [(model, string) for model, string, _ in names], keys, b"".join(pieces)


def expected(names: list[tuple[str, bool]], keys: set[str]):
    """The gateway's answer, by its rules: (status, the model it passes the request to)."""
    if len(names) != 1 or not names[0][1] or keys & set(OWNED):
        return grpc.StatusCode.INVALID_ARGUMENT, None
    model = names[0][0]
    return (grpc.StatusCode.OK, model) if model in SERVED else (grpc.StatusCode.NOT_FOUND, None)


@PROPERTY
@given(case=infer_message())
def test_a_model_infer_is_answered_logged_and_shaped_for_the_model_triton_reads(
    plain, server, pki, case
):
    names, keys, message = case
    # What Triton's parser makes of the bytes (protobuf's own, here in Python).
    parsed = service_pb2.ModelInferRequest.FromString(message)
    want, model = expected(names, keys)
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
    want, model = expected(names, set())
    event(f"{method} {want.name} {model}")
    with channel(plain, server, pki) as front:
        code, response, details = raw_call(front, method, message)
    assert code == want, details
    if code == grpc.StatusCode.OK and method == "ModelMetadata":
        assert response.name == parsed.name == model
    elif code == grpc.StatusCode.OK:
        assert response.ready and parsed.name == model


# Request parameters the gateway owns ------------------------------------------------------------
def post(address: str, path: str, body: bytes, headers=(), tls: bool = False, pki=None):
    """(status, JSON answer) of one POST with exactly this body and these (name, value) headers."""
    host, port = address.rsplit(":", 1)
    if tls:
        context = ssl.create_default_context(cafile=str(pki.ca))
        conn = http.client.HTTPSConnection(host, int(port), timeout=30, context=context)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", path)
        for name, value in [("Content-Length", str(len(body))), *headers]:
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def front_post(gateway: Nginx, pki, body: bytes, headers=()):
    tls = gateway.gateway.tls is not None
    path = f"/v2/models/{embedding.ENSEMBLE}/infer"
    return post(gateway.http_url, path, body, headers, tls, pki)


def direct_post(server, body: bytes, headers=()):
    return post(server.http_url, f"/v2/models/{embedding.ENSEMBLE}/infer", body, headers)


def json_request(text: str = "a short sentence", tail: str = "") -> bytes:
    """embed's request in JSON; ``tail`` is more of the top-level object, written as is."""
    inputs = [{"name": embedding.TEXT, "shape": [1, 1], "datatype": "BYTES", "data": [text]}]
    return ('{"inputs":' + json.dumps(inputs) + tail + "}").encode()


def texts_input(mod, texts=("a short sentence",)):
    tensor = mod.InferInput(embedding.TEXT, [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], np.object_).reshape(-1, 1))
    return tensor


@pytest.mark.parametrize("parameter", [{"priority": 1}, {"timeout": 1_000_000}], ids=str)
def test_a_tenant_cannot_set_its_own_priority_or_timeout(gateway, server, pki, parameter):
    """The queue jump: Triton takes priority 1 from anyone; the gateway takes it from no one."""
    tls = gateway.gateway.tls is not None
    ca = str(pki.ca) if tls else None
    https = {"ssl": True, "ssl_context_factory": partial(create_default_context, cafile=ca)}
    http_front = httpclient.InferenceServerClient(gateway.http_url, **(https if tls else {}))
    grpc_front = grpcclient.InferenceServerClient(gateway.grpc_url, ssl=tls, root_certificates=ca)
    http_direct = httpclient.InferenceServerClient(server.http_url)
    grpc_direct = grpcclient.InferenceServerClient(server.grpc_url)
    for front, direct, mod in (
        (http_front, http_direct, httpclient),  # binary tensors: the JSON is the header
        (grpc_front, grpc_direct, grpcclient),
    ):
        with front, direct:
            with pytest.raises(InferenceServerException) as refused:
                front.infer(embedding.ENSEMBLE, [texts_input(mod)], **parameter)
            assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
            assert f"'{next(iter(parameter))}' {OWNED_REFUSAL}" in refused.value.message()
            # The control: Triton takes it, and the gateway takes the request without it.
            want = direct.infer(embedding.ENSEMBLE, [texts_input(mod)], **parameter)
            got = front.infer(embedding.ENSEMBLE, [texts_input(mod)])
            np.testing.assert_allclose(
                got.as_numpy(embedding.EMBEDDING), want.as_numpy(embedding.EMBEDDING), atol=1e-6
            )
    # The same in a JSON body.
    key, value = next(iter(parameter.items()))
    body = json_request(tail=f',"parameters":{{"{key}":{value}}}')
    status, answer = front_post(gateway, pki, body)
    assert status == 400 and OWNED_REFUSAL in answer["error"], answer
    assert direct_post(server, body)[0] == 200


def test_a_parameter_whose_key_is_written_twice_is_refused_over_grpc(gateway, server, pki):
    """A map entry that names its key twice: protobuf keeps the last, so Triton reads
    'priority' (and here fails on its string value, which shows that it read it)."""
    value = service_pb2.InferParameter(string_param="x").SerializeToString()
    entry = (
        field(1, LENGTH_DELIMITED, b"user")
        + field(1, LENGTH_DELIMITED, b"priority")
        + field(2, LENGTH_DELIMITED, value)
    )
    message = text_request(embedding.ENSEMBLE).SerializeToString() + field(
        4, LENGTH_DELIMITED, entry
    )
    with channel(gateway, server, pki) as front, channel(None, server, pki) as direct:
        code, _, details = raw_call(front, "ModelInfer", message)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and OWNED_REFUSAL in details, details
        code, _, details = raw_call(direct, "ModelInfer", message)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "'priority'" in details, details


# Each: (JSON body, whether the gateway refuses it, whether Triton reads a priority or timeout
# from it). An invalid value ("x") makes Triton say so ("Unable to parse 'priority'"), which
# shows that it read the key.
HIDDEN = {
    "escaped key": (json_request(tail=',"parameters":{"prior\\u0069ty":"x"}'), True, True),
    "the first of two parameters": (
        b'{"parameters":{"priority":"x"},' + json_request()[1:-1] + b',"parameters":{}}',
        True,
        True,
    ),
    "spaces and newlines": (
        json_request(tail=',\n "parameters" :\t{ "timeout"\r\n: "x" }'),
        True,
        True,
    ),
    # A key of those names anywhere is refused, though Triton reads only the request's own.
    "in an input's parameters": (
        json_request().replace(b'"data"', b'"parameters":{"priority":"x"},"data"'),
        True,
        False,
    ),
    # "Timeout" is no parameter of Triton's: it passes.
    "another name": (json_request(tail=',"parameters":{"\\u0054imeout":"x"}'), False, False),
}


@pytest.mark.parametrize("case", HIDDEN)
def test_priority_and_timeout_are_refused_however_the_json_writes_them(gateway, server, pki, case):
    body, refused, triton_reads_it = HIDDEN[case]
    status, answer = front_post(gateway, pki, body)
    if refused:
        assert status == 400 and OWNED_REFUSAL in answer["error"], answer
    else:
        assert status == 200, answer
    _, direct_answer = direct_post(server, body)
    read = any(f"Unable to parse '{key}'" in str(direct_answer) for key in OWNED)
    assert read == triton_reads_it, direct_answer


def test_keys_inside_texts_and_other_json_pass_as_they_are(gateway, server, pki):
    texts = ['{"priority": 1, "timeout": 2}', 'say \\"priority\\": 1', ',"timeout":']
    for text in texts:
        body = json_request(text, tail=',"parameters":{"prio":1,"user":"timeout"}')
        status, answer = front_post(gateway, pki, body)
        direct, want = direct_post(server, body)
        assert status == direct == 200, answer
        assert answer["outputs"][0]["data"] == pytest.approx(want["outputs"][0]["data"], abs=1e-6)


def test_the_json_header_is_read_as_triton_reads_it(gateway, server, pki):
    """Only the first Inference-Header-Content-Length bytes are JSON: a text after them that
    reads like a parameter is a tensor's bytes, to the gateway as to Triton."""
    text = b',"priority":1}'

    def binary(parameters: bytes) -> tuple[bytes, list[tuple[str, str]]]:
        header = (
            b'{"inputs":[{"name":"TEXT","shape":[1,1],"datatype":"BYTES",'
            b'"parameters":{"binary_data_size":%d}}]%s}' % (4 + len(text), parameters)
        )
        body = header + len(text).to_bytes(4, "little") + text
        return body, [("Inference-Header-Content-Length", str(len(header)))]

    for parameters, refused in ((b"", False), (b',"parameters":{"timeout":5}', True)):
        body, length = binary(parameters)
        status, answer = front_post(gateway, pki, body, length)
        assert (status, OWNED_REFUSAL in str(answer)) == ((400, True) if refused else (200, False))
        assert direct_post(server, body, length)[0] == 200
    body, _ = binary(b"")
    cases = {
        "twice": [("Inference-Header-Content-Length", "4")] * 2,
        "not a number": [("Inference-Header-Content-Length", "+12")],
        "past the body": [("Inference-Header-Content-Length", str(len(body) + 1))],
    }
    for case, headers in cases.items():
        status, answer = front_post(gateway, pki, body, headers)
        assert status == 400 and "Inference-Header-Content-Length" in answer["error"], case
    # More JSON than the gateway reads: refused, saying to send the tensors as binary.
    big = json_request("x" * (gateway.gateway.clients.max_json + 1))
    status, answer = front_post(gateway, pki, big)
    assert status == 413 and "binary" in answer["error"], answer


def test_a_body_read_from_its_file_goes_on_without_waiting(gateway, pki):
    """The body goes to Triton in a file (the script read it there): it must not wait on TCP
    after its headers (Nagle and a delayed ACK: 40 ms a request). Against the gateway's own
    answer to a request without a body, on the same connection, interleaved."""
    host, port = gateway.http_url.rsplit(":", 1)
    if gateway.gateway.tls is None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
    else:
        context = ssl.create_default_context(cafile=str(pki.ca))
        conn = http.client.HTTPSConnection(host, int(port), timeout=30, context=context)
    body = json_request()  # the same each time: Triton's response cache answers it
    times: dict[str, list[float]] = {"infer": [], "metadata": []}
    try:
        for _ in range(30):
            for kind, method, path, data in (
                ("metadata", "GET", f"/v2/models/{embedding.ENSEMBLE}", None),
                ("infer", "POST", f"/v2/models/{embedding.ENSEMBLE}/infer", body),
            ):
                began = time.perf_counter()
                conn.request(method, path, body=data)
                response = conn.getresponse()
                assert response.status == 200, response.read()
                response.read()
                times[kind].append(time.perf_counter() - began)
    finally:
        conn.close()
    infer, metadata = (float(np.median(times[k])) for k in ("infer", "metadata"))
    # About 1x here; 40 ms a request is over 50x.
    assert infer < 10 * metadata, (infer, metadata)


@st.composite
def json_body(draw) -> tuple[bytes, bool]:
    """(embed's JSON request, whether it has a key of OWNED anywhere), written every which way:
    keys plain or \\u-escaped, parameters objects repeated, members in any order, texts that
    hold keys of their own, whitespace between every token."""
    space = st.text(" \t\n\r", max_size=2)

    def key(name: str) -> str:
        chars = [
            f"\\u{ord(c):04{draw(st.sampled_from('xX'))}}" if draw(st.booleans()) else c
            for c in name
        ]
        return '"' + "".join(chars) + '"'

    def obj(members: list[tuple[str, str]]) -> str:
        inner = ",".join(f"{draw(space)}{k}{draw(space)}:{draw(space)}{v}" for k, v in members)
        return "{" + inner + draw(space) + "}"

    names = st.sampled_from([*OWNED, "Priority", "prio", "user", "timeout_s"])
    found = False

    def parameters() -> str:
        nonlocal found
        keys = draw(st.lists(names, max_size=3))
        found |= bool(set(keys) & set(OWNED))
        return obj([(key(k), draw(st.sampled_from(['"x"', "1", '"priority"']))) for k in keys])

    text = draw(st.sampled_from(["plain", '{"priority": 1}', 'a\\"timeout\\":', ',"priority":1']))
    tensor = [
        (key("name"), json.dumps(embedding.TEXT)),
        (key("shape"), "[1,1]"),
        (key("datatype"), '"BYTES"'),
        (key("data"), json.dumps([text])),
    ]
    if draw(st.booleans()):
        tensor.append((key("parameters"), parameters()))
    members = [(key("inputs"), "[" + obj(draw(st.permutations(tensor))) + "]")]
    members += [(key("parameters"), parameters()) for _ in range(draw(st.integers(0, 2)))]
    return obj(draw(st.permutations(members))).encode(), found


@PROPERTY
@given(case=json_body())
def test_a_json_body_passes_exactly_when_it_sets_no_priority_or_timeout(plain, server, case):
    body, has_owned_key = case
    event(f"refused: {has_owned_key}")
    status, answer = post(plain.http_url, f"/v2/models/{embedding.ENSEMBLE}/infer", body)
    direct, direct_answer = direct_post(server, body)
    if has_owned_key:
        assert status == 400 and OWNED_REFUSAL in answer["error"], answer
    else:
        # Passed on: Triton's own answer, whatever it is; it never read a priority or timeout.
        assert status == direct, answer
        assert "Unable to parse 'priority'" not in str(direct_answer)
        assert "Unable to parse 'timeout'" not in str(direct_answer)
