"""Triton's OpenTelemetry trace: one setting turns it on for the server and its Python steps.

``tritonserver --trace-config mode=opentelemetry`` exports, for each sampled request, a span of
its receipt and answer (``InferRequest``, with the front end's events), a span per model it ran
through (an ensemble's steps under the ensemble) and a ``compute`` span under each, over OTLP/HTTP
to a collector. A W3C ``traceparent`` header sent with the request (HTTP or gRPC) becomes the
trace's id and the parent of its first span, so a client's or the gateway's trace continues
inside the server. The Python steps add their own phases under their model's span
(``pipelines.backend.step_traces``), to the same endpoint, through OpenTelemetry's standard
environment variables.

Off by default; ``python -m server --trace-url URL`` (``make serve TRACE=URL``) turns it on.
docs/operations.md#tracing-one-request says how to read what comes out; what it costs:
docs/performance.md#what-tracing-costs-2026-12-05.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pipelines.backend import step_traces

# Triton's default service name; the steps' spans carry the same, so one service holds both.
SERVICE_NAME = "triton-inference-server"
# Triton's default sampling: one request in 1000 (a busy service's traces in proportion).
DEFAULT_RATE = 1000
# How long spans wait before their batch is exported (Triton's bsp_schedule_delay and the
# SDK's OTEL_BSP_SCHEDULE_DELAY; both default to 5 s).
DEFAULT_DELAY_MS = 5000
# A resource attribute travels in Triton's flag (``resource=key=value``: a comma would end the
# setting) and in OTEL_RESOURCE_ATTRIBUTES (comma-separated key=value pairs).
_ATTRIBUTE = re.compile(r"[A-Za-z0-9._/:@+-]+")


@dataclass(frozen=True)
class TraceSettings:
    """Where the server's spans go, how many requests are traced, and what they say of it.

    Raises ValueError at creation for a URL that is not http(s), a rate under 1 or a resource
    attribute that cannot travel in Triton's flag.
    """

    url: str
    rate: int = DEFAULT_RATE  # trace one request in `rate`
    # OpenTelemetry resource attributes: service.name, service.version, deployment.environment,
    # the rollout's version label... service.name defaults to Triton's own.
    resource: Mapping[str, str] = field(default_factory=dict)
    delay_ms: int = DEFAULT_DELAY_MS

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"trace URL: an OTLP/HTTP endpoint, http(s)://host:port/v1/traces, not {self.url!r}"
            )
        if self.rate < 1:
            raise ValueError(f"trace rate: one request in N, N >= 1, not {self.rate}")
        for key, value in self.resource.items():
            if not (_ATTRIBUTE.fullmatch(key) and _ATTRIBUTE.fullmatch(value)):
                raise ValueError(
                    f"trace resource {key}={value}: letters, digits and . _ / : @ + - only"
                )
        object.__setattr__(self, "resource", {"service.name": SERVICE_NAME, **self.resource})

    def server_args(self) -> list[str]:
        """The flags that give tritonserver this trace."""
        return [
            "--trace-config=mode=opentelemetry",
            f"--trace-config=opentelemetry,url={self.url}",
            f"--trace-config=rate={self.rate}",
            "--trace-config=level=TIMESTAMPS",
            f"--trace-config=opentelemetry,bsp_schedule_delay={self.delay_ms}",
            *(f"--trace-config=opentelemetry,resource={k}={v}" for k, v in self.resource.items()),
        ]

    def environment(self) -> dict[str, str]:
        """The Python steps' environment: OpenTelemetry's standard variables, same endpoint."""
        return {
            step_traces.ENDPOINT_ENV: self.url,
            "OTEL_RESOURCE_ATTRIBUTES": ",".join(f"{k}={v}" for k, v in self.resource.items()),
            "OTEL_BSP_SCHEDULE_DELAY": str(self.delay_ms),
        }


# What the launcher removes from the server's environment when tracing is off, so a variable
# left in a shell never turns on the steps' spans behind the server's back.
STEP_VARIABLES = (step_traces.ENDPOINT_ENV, "OTEL_RESOURCE_ATTRIBUTES", "OTEL_BSP_SCHEDULE_DELAY")


# The containers' settings (server.container, the compose stack, the Kubernetes manifests).
ENDPOINT_ENV, RATE_ENV, RESOURCE_ENV = (
    "TRITON_TRACE_ENDPOINT",
    "TRITON_TRACE_RATE",
    "TRITON_TRACE_RESOURCE",
)


def from_environment(environ: Mapping[str, str]) -> TraceSettings | None:
    """The containers' trace settings; None (off) where $TRITON_TRACE_ENDPOINT is unset or empty.

    $TRITON_TRACE_RATE: one request in N; $TRITON_TRACE_RESOURCE: k=v,k=v.
    """
    url = environ.get(ENDPOINT_ENV, "").strip()
    if not url:
        return None
    # "key=" is an attribute the platform left empty (a pod label that is not set): skipped.
    pairs = [p.strip() for p in environ.get(RESOURCE_ENV, "").split(",")]
    return TraceSettings(
        url,
        rate=int(environ.get(RATE_ENV) or DEFAULT_RATE),
        resource=parse_resource([p for p in pairs if p and not p.endswith("=")]),
    )


def parse_resource(pairs: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` (``--trace-resource``) → a dict.

    Raises:
        ValueError: a pair without '=' or without a key.
    """
    resource = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"trace resource {pair!r}: key=value")
        resource[key] = value
    return resource
