"""Tracing: the server's flags and environment, the steps' spans, the receiver reading them."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import triton_python_backend_utils as pb_utils

from monitoring import traces
from pipelines.backend import batching, step_traces
from server import tracing
from server.launcher import Server, ServerConfig

TRACE_ID = "0af7651916cd43dd8448eb211c126611"
PARENT = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"


# The server's side -----------------------------------------------------------------------------
def test_settings_become_tritons_flags_and_the_steps_standard_variables():
    settings = tracing.TraceSettings(
        "http://collector:4318/v1/traces", rate=10, resource={"service.version": "24.10"}
    )
    args = settings.server_args()
    assert "--trace-config=mode=opentelemetry" in args
    assert "--trace-config=opentelemetry,url=http://collector:4318/v1/traces" in args
    assert "--trace-config=rate=10" in args and "--trace-config=level=TIMESTAMPS" in args
    # One service: Triton's default name, given to both.
    assert "--trace-config=opentelemetry,resource=service.name=triton-inference-server" in args
    assert "--trace-config=opentelemetry,resource=service.version=24.10" in args
    env = settings.environment()
    assert env[step_traces.ENDPOINT_ENV] == "http://collector:4318/v1/traces"
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == (
        "service.name=triton-inference-server,service.version=24.10"
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"url": "collector:4318"},
        {"url": "grpc://collector:4317"},
        {"url": "http://c/v1/traces", "rate": 0},
        {"url": "http://c/v1/traces", "resource": {"service.name": "a,b"}},
        {"url": "http://c/v1/traces", "resource": {"k=v": "x"}},
    ],
)
def test_settings_that_cannot_travel_are_refused(kwargs):
    with pytest.raises(ValueError):
        tracing.TraceSettings(**kwargs)


def test_the_containers_environment_turns_it_on_and_skips_empty_attributes():
    assert tracing.from_environment({}) is None
    assert tracing.from_environment({"TRITON_TRACE_ENDPOINT": " "}) is None
    settings = tracing.from_environment(
        {
            "TRITON_TRACE_ENDPOINT": "http://otel:4318/v1/traces",
            "TRITON_TRACE_RATE": "100",
            # A pod label that is not set leaves "service.version=".
            "TRITON_TRACE_RESOURCE": "service.instance.id=triton-0,service.version=",
        }
    )
    assert settings.rate == 100
    assert dict(settings.resource) == {
        "service.name": "triton-inference-server",
        "service.instance.id": "triton-0",
    }
    with pytest.raises(ValueError):
        tracing.parse_resource(["no-equals"])


def test_the_server_traces_only_when_asked(monkeypatch):
    # A variable left in the shell must not turn the steps' spans on behind the server's back.
    monkeypatch.setenv(step_traces.ENDPOINT_ENV, "http://127.0.0.1:4318/v1/traces")
    off = Server(ServerConfig(restricted_apis=()))
    assert not [a for a in off.command() if a.startswith("--trace-config")]
    assert step_traces.ENDPOINT_ENV not in off.environment()
    on = Server(
        ServerConfig(restricted_apis=(), trace=tracing.TraceSettings("http://c:1/v1/traces"))
    )
    assert "--trace-config=mode=opentelemetry" in on.command()
    assert on.environment()[step_traces.ENDPOINT_ENV] == "http://c:1/v1/traces"


# The receiver ----------------------------------------------------------------------------------
def _otlp_json(trace_id: str, span_id: str, parent: str) -> bytes:
    """An export as Triton's OTel C++ exporter writes it: ids in hex, as OTLP's JSON wants."""
    span = {
        "traceId": trace_id,
        "spanId": span_id,
        "parentSpanId": parent,
        "name": "embed",
        "startTimeUnixNano": "1000",
        "endTimeUnixNano": "3000",
        "attributes": [{"key": "triton.model_name", "value": {"stringValue": "embed"}}],
        "events": [{"name": "QUEUE_START", "timeUnixNano": "1500"}],
    }
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "t"}}]}
    export = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}
    return json.dumps(export).encode()


def test_json_exports_keep_their_hex_ids():
    (span,) = traces.decode(_otlp_json(TRACE_ID, "00f067aa0ba902b7", PARENT), "application/json")
    # Read as protobuf's JSON (base64) these ids would come out as other bytes.
    assert (span.trace_id, span.span_id, span.parent_id) == (TRACE_ID, "00f067aa0ba902b7", PARENT)
    assert span.attributes == {"triton.model_name": "embed"} and span.events == ("QUEUE_START",)
    assert span.resource == {"service.name": "t"} and span.duration_s == pytest.approx(2e-6)
    assert base64.b64decode(base64.b64encode(bytes.fromhex(TRACE_ID))).hex() == TRACE_ID


def test_a_body_that_is_not_an_export_is_refused():
    with pytest.raises(ValueError):
        traces.decode(b"{not json", "application/json")
    with pytest.raises(ValueError):
        traces.decode(b"\xff\xff\xff", "application/x-protobuf")


# The steps' spans, exported for real to the receiver ------------------------------------------
def _request(context: str | None, rows: int = 1) -> pb_utils.InferenceRequest:
    tensor = pb_utils.Tensor("X", np.ones((rows, 2), np.float32))
    return pb_utils.InferenceRequest([tensor], trace_context=context)


def _double(items: list[dict]) -> list[dict]:
    with step_traces.phase("double", rows=sum(len(i["X"]) for i in items)):
        return [{"Y": item["X"] * 2} for item in items]


def test_a_steps_phases_reach_the_collector_under_each_traced_request(monkeypatch):
    with traces.Receiver() as receiver:
        monkeypatch.setenv(step_traces.ENDPOINT_ENV, receiver.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        monkeypatch.setattr(step_traces, "_tracer", None)
        context = json.dumps({"traceparent": TRACEPARENT})
        requests = [_request(context), _request(None), _request("")]
        parse = lambda r: {"X": pb_utils.get_input_tensor_by_name(r, "X").as_numpy()}  # noqa: E731
        responses = batching.execute(requests, parse, _double, model="double")
        assert all(r.has_error() is False for r in responses)
        step_traces.flush()
        (span,) = receiver.wait_for(lambda s: len(s) >= 1, trace_id=TRACE_ID, timeout=10)
    # One span, for the one traced request, under its model's span; the batch it shared said.
    assert (span.name, span.parent_id) == ("double", PARENT)
    assert span.attributes == {"batch.requests": 3, "rows": 3}
    assert span.resource["service.name"] != ""
    assert len(receiver.spans()) == 1


def test_with_tracing_off_a_step_makes_no_spans(monkeypatch):
    monkeypatch.delenv(step_traces.ENDPOINT_ENV, raising=False)
    context = json.dumps({"traceparent": TRACEPARENT})
    assert step_traces.contexts([_request(context)]) == [None]
    with step_traces.running([None]), step_traces.phase("nothing"):
        assert not step_traces._current


def test_a_context_that_is_not_a_traceparent_is_ignored():
    assert step_traces.parent_of(None) is None
    assert step_traces.parent_of("not json") is None
    assert step_traces.parent_of(json.dumps({"traceparent": "00-zz-yy-01"})) is None
    assert step_traces.parent_of(json.dumps({"traceparent": TRACEPARENT})) is not None


def test_the_launchers_options_turn_it_on(capsys):
    from server import serve

    url = "http://127.0.0.1:4318/v1/traces"
    args = serve.parse_args(
        ["--trace-url", url, "--trace-rate", "1", "--trace-resource", "service.version=2"]
    )
    assert args.trace.rate == 1 and args.trace.resource["service.version"] == "2"
    assert serve.parse_args([]).trace is None
    with pytest.raises(SystemExit):
        serve.parse_args(["--trace-url", "http://x/v1/traces", "--trace-resource", "novalue"])
    assert "trace resource" in capsys.readouterr().err
