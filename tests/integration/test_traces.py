"""One request seen whole: OpenTelemetry spans from the gateway to each step, read back.

A real tritonserver traces every request (rate 1) to an OTLP receiver built on
opentelemetry-proto (``monitoring.traces``); the real nginx gateway sits in front. A client's
W3C ``traceparent`` must become the trace of its request inside the server, with the ensemble,
each composing step, its compute and the Python steps' own phases under one another, each
inside its parent's time, the request's own span opening while the client waited. Without a client
``traceparent`` the gateway starts a trace and writes its id into its access log. With tracing
off the server traces nothing, and with the receiver gone requests still succeed.
"""

from __future__ import annotations

import json
import secrets
import time

import numpy as np
import openai
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from gateway import shaping
from gateway.nginx.config import Gateway, OpenAI, Shaping, Upstreams
from gateway.nginx.process import Nginx
from monitoring import traces
from pipelines import classification, embedding
from server import Server, ServerConfig
from server.tracing import TraceSettings

pytestmark = pytest.mark.integration

KEY = "trace-key-0001"
# Shaping on (it is what writes the access log), every bucket wide open.
OPEN = {"rate": 1000, "capacity": 1000}
LIMITS = shaping.parse_limits(
    {"anonymous": OPEN, "tenants": {"tracer": {"keys": [KEY], **OPEN}}, "models": {}}
)
# What OpenAI's API serves as "embed" (its word-piece counts are the usage).
OPENAI_EMBED = embedding.OPENAI_MODELS[embedding.ENSEMBLE]
# Spans leave the server in batches every DELAY_MS; the receiver is waited on, not slept for.
DELAY_MS = 200
# Python's clock and the server's are the same clock, read by two processes: a child's edge
# may fall this far outside its parent's.
SLACK_NS = 2_000_000


def traceparent() -> tuple[str, str, str]:
    """A new client span's (header, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


@pytest.fixture(scope="module")
def receiver():
    with traces.Receiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced(receiver, classifier_onnx, encoder_onnx, tmp_path_factory):
    # The two services alone (their steps load with them), every request traced.
    extra = ["--model-control-mode=explicit", "--exit-timeout-secs=3"]
    models = (embedding.ENSEMBLE, OPENAI_EMBED, classification.ENSEMBLE)
    extra += [f"--load-model={m}" for m in models]
    trace = TraceSettings(
        receiver.url, rate=1, resource={"service.version": "test"}, delay_ms=DELAY_MS
    )
    config = ServerConfig(http_port=0, grpc_port=0, metrics_port=0, extra_args=extra, trace=trace)
    log_path = tmp_path_factory.mktemp("traces") / "tritonserver.log"
    with Server(config, log_path=log_path) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(traced, tmp_path_factory):
    config = Gateway(Upstreams.of(traced), shaping=Shaping(LIMITS), openai=OpenAI())
    with Nginx(config, log_path=tmp_path_factory.mktemp("traces") / "nginx.log") as nginx:
        yield nginx


def steps_of(server: Server, ensemble: str) -> list[str]:
    """The composing models of an ensemble, in its config's order."""
    with httpclient.InferenceServerClient(server.http_url) as client:
        config = client.get_model_config(ensemble)
    return [s["model_name"] for s in config["ensemble_scheduling"]["step"]]


def image_input(photos: dict[str, bytes]) -> grpcclient.InferInput:
    """One photo as classify's gRPC input."""
    tensor = grpcclient.InferInput(classification.IMAGE, [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[photos[sorted(photos)[0]]]], dtype=np.object_))
    return tensor


def one(spans: list[traces.Span], name: str) -> traces.Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, sorted(s.name for s in spans))
    return found[0]


def assert_inside(child: traces.Span, parent: traces.Span) -> None:
    assert child.parent_id == parent.span_id, (child.name, parent.name)
    assert parent.start_ns - SLACK_NS <= child.start_ns <= child.end_ns <= parent.end_ns + SLACK_NS


def assert_opened_during_the_call(request: traces.Span, started_ns: int, answered_ns: int):
    """The request's span opens while its client waits: after the call began, before its answer.

    It closes when Triton releases the request, the end of its trace (tracer.cc ends the root
    span in the trace's destructor), which can follow the answer (docs/operations.md, "What each
    span is"), so the client's wait is no bound on the span's duration.
    """
    assert started_ns - SLACK_NS <= request.start_ns <= answered_ns + SLACK_NS
    assert request.end_ns <= time.time_ns() + SLACK_NS  # ended before it reached the receiver


def assert_whole(
    spans: list[traces.Span], ensemble: str, steps: list[str], phases: dict[str, set[str]]
) -> traces.Span:
    """The request's span, the ensemble under it, each step under that with its compute and
    its phases; returns the request's span."""
    request = one(spans, "InferRequest")
    top = one(spans, ensemble)
    assert top.attributes["triton.model_name"] == ensemble
    assert_inside(top, request)
    for step in steps:
        span = one(spans, step)
        assert_inside(span, top)
        below = traces.children(spans, span)
        assert "compute" in {s.name for s in below}, step
        assert phases.get(step, set()) <= {s.name for s in below}, step
        for child in below:
            assert_inside(child, span)
    return request


def test_an_openai_embeddings_call_is_one_trace_down_to_the_steps_phases(traced, gateway, receiver):
    header, trace_id, client_span = traceparent()
    sdk = openai.OpenAI(
        base_url=f"http://{gateway.http_url}/v1",
        api_key=KEY,
        max_retries=0,
        default_headers={"traceparent": header},
    )
    started = time.time_ns()
    answer = sdk.embeddings.create(model=embedding.ENSEMBLE, input=["where did the time go?"])
    answered = time.time_ns()
    assert len(answer.data[0].embedding) == embedding.HIDDEN_SIZE
    steps = steps_of(traced, OPENAI_EMBED)
    spans = receiver.wait_for(
        lambda s: (
            {"InferRequest", *steps} <= {x.name for x in s} and "encode" in {x.name for x in s}
        ),
        trace_id=trace_id,
    )
    # The text steps' own phases: on the one-step CPU path, tokenize, cache and encoder.
    phases = {
        embedding.TOKENIZE_ENCODE: {"tokenize", "encode", "cache lookup"},
        embedding.TOKENIZE: {"tokenize"},
    }
    request = assert_whole(spans, OPENAI_EMBED, steps, phases)
    assert request.parent_id == client_span  # the client's span is the server's parent
    assert request.resource["service.version"] == "test"
    assert_opened_during_the_call(request, started, answered)


def test_a_grpc_classify_call_is_one_trace_with_its_steps_in_order(
    traced, gateway, receiver, photos
):
    header, trace_id, client_span = traceparent()
    tensor = image_input(photos)
    started = time.time_ns()
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        result = client.infer(
            classification.ENSEMBLE, [tensor], headers={"traceparent": header, "x-api-key": KEY}
        )
    answered = time.time_ns()
    assert result.as_numpy(classification.LABELS).shape[0] == 1
    steps = steps_of(traced, classification.ENSEMBLE)
    spans = receiver.wait_for(
        lambda s: {"InferRequest", *steps, "decode"} <= {x.name for x in s}, trace_id=trace_id
    )
    request = assert_whole(
        spans, classification.ENSEMBLE, steps, {classification.PREPROCESS: {"decode"}}
    )
    assert request.parent_id == client_span
    assert_opened_during_the_call(request, started, answered)
    # The steps ran one after the other, in the ensemble's order.
    starts = [one(spans, step).start_ns for step in steps]
    assert starts == sorted(starts)


def test_the_gateway_starts_a_trace_where_the_client_sent_none_and_logs_its_id(
    traced, gateway, receiver, photos
):
    def log_lines() -> list[dict]:
        return [json.loads(x) for x in gateway.access_log.read_text().splitlines()]

    logged_before = len(log_lines())
    body = {"model": embedding.ENSEMBLE, "input": ["a trace that starts at the gateway"]}
    url = f"http://{gateway.http_url}/v1/embeddings"
    headers = {"Authorization": f"Bearer {KEY}"}
    # None sent, one that is no traceparent (W3C: the receiver starts a new trace), and gRPC.
    for sent in ({}, {"traceparent": "00-not-a-trace-01"}):
        answer = requests.post(url, json=body, headers={**headers, **sent}, timeout=30)
        assert answer.status_code == 200, answer.text
    with grpcclient.InferenceServerClient(gateway.grpc_url) as client:
        client.infer(classification.ENSEMBLE, [image_input(photos)])
    header, client_trace, _ = traceparent()
    answer = requests.post(url, json=body, headers={**headers, "traceparent": header}, timeout=30)
    assert answer.status_code == 200
    # nginx writes a request's line after its answer has gone: the client can read the log
    # before the last line is there.
    deadline = time.monotonic() + 10
    while len(lines := log_lines()) < logged_before + 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    logged = [line["trace_id"] for line in lines[logged_before:]]
    assert len(logged) == 4 and client_trace in logged, (logged, client_trace)
    started = [trace_id for trace_id in logged if trace_id != client_trace]
    assert len(set(started)) == 3
    for trace_id in started:
        assert len(trace_id) == 32 and int(trace_id, 16) != 0
        spans = receiver.wait_for(
            lambda s: "InferRequest" in {x.name for x in s}, trace_id=trace_id
        )
        assert one(spans, "InferRequest").parent_id != ""


def test_with_tracing_off_the_server_traces_nothing(server, traced):
    # Triton's own trace settings, asked of both: the session's server (make serve's default)
    # has tracing off, the traced one is the control.
    def settings(running: Server) -> dict:
        headers = running.admin_headers("http")
        answer = requests.get(
            f"http://{running.http_url}/v2/trace/setting", headers=headers, timeout=10
        )
        answer.raise_for_status()
        return answer.json()

    assert settings(server)["trace_level"] == ["OFF"]
    assert settings(traced)["trace_level"] == ["TIMESTAMPS"]
    assert settings(traced)["trace_mode"] == "opentelemetry"


def test_with_the_receiver_gone_requests_still_succeed(traced, gateway, receiver):
    receiver.close()
    header, _, _ = traceparent()
    with httpclient.InferenceServerClient(traced.http_url) as client:
        texts = np.array([[b"nobody is listening"]], dtype=np.object_)
        tensor = httpclient.InferInput(embedding.TEXT, [1, 1], "BYTES")
        tensor.set_data_from_numpy(texts)
        for _ in range(3):
            result = client.infer(embedding.ENSEMBLE, [tensor], headers={"traceparent": header})
            assert result.as_numpy(embedding.EMBEDDING).shape == (1, embedding.HIDDEN_SIZE)
        assert client.is_server_ready()
