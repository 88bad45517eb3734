"""An OTLP/HTTP trace receiver: what Triton, the Python steps and the gateway export, read back.

Triton 2.51 exports its OpenTelemetry spans with the OTel C++ exporter as OTLP/HTTP JSON
(``POST /v1/traces``); the Python steps' own spans (``pipelines.backend.step_traces``) come as
OTLP/HTTP protobuf. Both decode into ``opentelemetry-proto``'s ``ExportTraceServiceRequest``;
OTLP's JSON writes trace and span ids in hex where protobuf's JSON mapping expects base64, so
they are turned back before parsing (the OTLP specification, "JSON Protobuf Encoding").

A collector is the production answer (the compose stack and the Kubernetes manifests take its
URL). This receiver is what a laptop needs to see one request's spans, and what the tests read:

    python -m monitoring.traces --port 4318      # prints each trace as a tree as it arrives
    make serve TRACE=http://127.0.0.1:4318/v1/traces
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

log = logging.getLogger(__name__)

PATH = "/v1/traces"
# The id fields OTLP's JSON writes in hex (every other bytes field would be base64).
_HEX_IDS = ("traceId", "spanId", "parentSpanId")


@dataclass(frozen=True)
class Span:
    """One span as received: ids in hex, times in Unix nanoseconds."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, object] = field(default_factory=dict)
    events: tuple[str, ...] = ()
    resource: dict[str, object] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        """End minus start, in seconds."""
        return (self.end_ns - self.start_ns) / 1e9


def _value(any_value) -> object:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(pairs) -> dict[str, object]:
    return {a.key: _value(a.value) for a in pairs}


def _hex_to_base64(node: object) -> None:
    """OTLP JSON's hex ids → protobuf JSON's base64, in place, wherever they sit."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _HEX_IDS and isinstance(value, str) and value:
                node[key] = base64.b64encode(bytes.fromhex(value)).decode()
            else:
                _hex_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_to_base64(item)


def decode(body: bytes, content_type: str) -> list[Span]:
    """The spans of one OTLP/HTTP export body (``application/json`` or ``x-protobuf``).

    Raises:
        ValueError: a body that is neither.
    """
    request = ExportTraceServiceRequest()
    try:
        if "json" in content_type:
            tree = json.loads(body)
            _hex_to_base64(tree)
            json_format.ParseDict(tree, request, ignore_unknown_fields=True)
        else:
            request.ParseFromString(body)
    except Exception as exc:  # json, protobuf and base64 errors alike
        raise ValueError(f"not an OTLP trace export ({content_type}): {exc}") from exc
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(
                    Span(
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        name=s.name,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes=_attributes(s.attributes),
                        events=tuple(e.name for e in s.events),
                        resource=resource,
                    )
                )
    return spans


class Receiver:
    """Receives OTLP/HTTP trace exports on ``host:port`` and keeps their spans.

    A context manager; port 0 picks a free one (``url`` says which).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        on_spans: Callable[[list[Span]], None] | None = None,
    ):
        self._spans: list[Span] = []
        self._lock = threading.Condition()
        self.exports = 0  # export requests received
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # the exporters keep their connection

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                content_type = self.headers.get("Content-Type", "")
                if self.path != PATH:
                    return self._answer(404, b"", "text/plain")
                try:
                    spans = decode(body, content_type)
                except ValueError as exc:
                    return self._answer(400, str(exc).encode(), "text/plain")
                receiver._add(spans)
                if on_spans is not None:
                    on_spans(spans)
                empty = ExportTraceServiceResponse()
                if "json" in content_type:
                    body = json_format.MessageToJson(empty).encode()
                else:
                    body = empty.SerializeToString()
                return self._answer(200, body, content_type)

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # the exporters post every few seconds
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Where to export to: ``http://host:port/v1/traces``."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}{PATH}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop receiving (the exporters' next posts are refused)."""
        self._server.shutdown()
        self._server.server_close()

    def _add(self, spans: list[Span]) -> None:
        with self._lock:
            self._spans.extend(spans)
            self.exports += 1
            self._lock.notify_all()

    def spans(self, trace_id: str | None = None) -> list[Span]:
        """Every span received so far, or those of one trace."""
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def wait_for(
        self, done: Callable[[list[Span]], bool], trace_id: str | None = None, timeout: float = 30
    ) -> list[Span]:
        """The spans (of ``trace_id``) once ``done(spans)`` holds.

        Raises:
            TimeoutError: not within ``timeout`` seconds; it names the spans that had come.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                spans = [s for s in self._spans if trace_id is None or s.trace_id == trace_id]
                if done(spans):
                    return spans
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted(s.name for s in spans)
                    raise TimeoutError(f"after {timeout:.0f} s the trace has only {names}")
                self._lock.wait(left)


def children(spans: Iterable[Span], parent: Span) -> list[Span]:
    """The spans whose parent is ``parent``, in start order."""
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


def tree(spans: Iterable[Span]) -> str:
    """The spans as indented trees, one per root (a span whose parent is not among them)."""
    spans = list(spans)
    ids = {s.span_id for s in spans}
    lines: list[str] = []

    def walk(span: Span, depth: int) -> None:
        where = span.attributes.get("triton.model_name") or span.resource.get("service.name", "")
        lines.append(f"{'  ' * depth}{span.name:<24} {span.duration_s * 1e3:9.3f} ms  {where}")
        for child in children(spans, span):
            walk(child, depth + 1)

    for root in sorted((s for s in spans if s.parent_id not in ids), key=lambda s: s.start_ns):
        lines.append(f"trace {root.trace_id}")
        walk(root, 1)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Receive until interrupted, printing each export's spans as trees."""
    parser = argparse.ArgumentParser(prog="python -m monitoring.traces", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318, help="OTLP/HTTP's port by default")
    args = parser.parse_args(argv)
    with Receiver(args.host, args.port, on_spans=lambda spans: print(tree(spans), flush=True)) as r:
        print(f"receiving OTLP/HTTP traces on {r.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
