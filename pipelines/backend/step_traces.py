"""A Python step's own phases as spans in each traced request's OpenTelemetry trace.

Triton's OpenTelemetry trace (``--trace-config mode=opentelemetry``) gives every traced request
a span per model it runs through, with a ``compute`` span under it, and stops there: what a
Python step did inside its compute (decode the images, tokenize, look up the per-text cache,
run the encoder) is one opaque bar. The 2.51 stub hands each request's trace to the model
(``request.trace().get_context()``: ``{"traceparent": "00-<trace>-<span>-01"}``, the span of the
step's model in the request's trace), so the step adds its phases as children of that span,
beside ``compute``, exported to the same OTLP endpoint as the server's spans.

Off unless the server was started with tracing (``server.launcher``'s ``TraceSettings`` sets the
standard OpenTelemetry variables below in the stubs' environment); then only requests that
Triton sampled get spans. The steps batch across requests, so one phase runs once for several
requests: each traced request gets its own span of that phase, with the same times, and
``batch.requests`` says how many shared it (docs/operations.md#tracing-one-request).

Spans travel as OTLP/HTTP protobuf, encoded by ``opentelemetry-exporter-otlp-proto-common``:
the OTLP exporter package itself pins a protobuf newer than Triton's client libraries accept.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)

# The standard variables (OpenTelemetry's SDK configuration): the endpoint turns tracing on;
# OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME and OTEL_BSP_SCHEDULE_DELAY are read by the SDK.
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
EXPORT_TIMEOUT_S = 2.0

_tracer: Any = None
_provider: Any = None
# The parent contexts of the traced requests whose group is running now (``running``), and
# how many requests that group has in all.
_current: list = []
_group_size = 0


def enabled() -> bool:
    """Whether the server was started with tracing (the endpoint is set) and the SDK is here."""
    return bool(os.environ.get(ENDPOINT_ENV)) and _sdk_present()


@functools.cache
def _sdk_present() -> bool:
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        log.warning("tracing is on but opentelemetry-sdk is not installed: no step spans")
        return False
    return True


def _exporter(url: str):
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class OtlpHttpExporter(SpanExporter):
        """POSTs the spans as OTLP/HTTP protobuf; a collector that is down costs a warning."""

        def __init__(self) -> None:
            self._warned = False

        def export(self, spans):
            body = encode_spans(spans).SerializeToString()
            request = urllib.request.Request(
                url, body, {"Content-Type": "application/x-protobuf"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=EXPORT_TIMEOUT_S):
                    return SpanExportResult.SUCCESS
            except OSError as exc:
                # Inference goes on; one warning per process, as the server itself says nothing.
                if not self._warned:
                    log.warning("step spans not exported to %s: %s", url, exc)
                    self._warned = True
                return SpanExportResult.FAILURE

    return OtlpHttpExporter()


def _get_tracer():
    global _tracer, _provider
    if _tracer is None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        _provider = TracerProvider(resource=Resource.create())
        _provider.add_span_processor(BatchSpanProcessor(_exporter(os.environ[ENDPOINT_ENV])))
        _tracer = _provider.get_tracer("pipelines.backend")
    return _tracer


def warm() -> None:
    """Import and start the exporter at model load, so the first traced request does not pay."""
    if enabled():
        _get_tracer()


def parent_of(context_json: str | None):
    """The OpenTelemetry context a request's trace names, or None (not traced, or no context)."""
    if not context_json:
        return None
    try:
        carrier = json.loads(context_json)
    except ValueError:
        return None
    if not isinstance(carrier, dict) or "traceparent" not in carrier:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract(carrier)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def contexts(requests: Sequence[Any]) -> list:
    """Each request's parent context (None where it is not traced); all None when tracing is off."""
    if not enabled():
        return [None] * len(requests)
    parents = []
    for request in requests:
        try:
            parents.append(parent_of(request.trace().get_context()))
        except Exception:  # noqa: BLE001 - a trace we cannot read is one we do not extend
            parents.append(None)
    return parents


@contextlib.contextmanager
def running(parents: Sequence[Any]) -> Iterator[None]:
    """The phases inside belong to these requests (one group's run, in ``batching.execute``)."""
    global _current, _group_size
    traced = [p for p in parents if p is not None]
    previous = _current, _group_size
    _current, _group_size = traced, len(parents)
    try:
        yield
    finally:
        _current, _group_size = previous


@contextlib.contextmanager
def phase(name: str, **attributes: Any) -> Iterator[None]:
    """Time the block; each traced request of the running group gets a span ``name`` of it."""
    if not _current:
        yield
        return
    parents = _current
    started = time.time_ns()
    try:
        yield
    finally:
        ended = time.time_ns()
        tracer = _get_tracer()
        attributes = {"batch.requests": _group_size, **attributes}
        for parent in parents:
            tracer.start_span(name, context=parent, start_time=started, attributes=attributes).end(
                end_time=ended
            )


def flush() -> None:
    """Export what is pending (a model's ``finalize``; the SDK also does it at exit)."""
    if _provider is not None:
        _provider.force_flush(int(EXPORT_TIMEOUT_S * 1000))
