"""OpenTelemetry traces, exported over OTLP/HTTP to the endpoint `serve --otlp-traces-endpoint` names (passed to
every process as $TRITONLLM_OTLP_TRACES_ENDPOINT). Without one nothing is traced and opentelemetry is not even
imported. A span's parent comes in W3C's `traceparent`: from the client to the shim, from the shim to Triton (gRPC
metadata; Triton's own OpenTelemetry mode continues it through the ensemble), and from Triton to a model
(`request.trace().get_context()`)."""

from __future__ import annotations

import os
from functools import cache
from typing import Any

OTLP_TRACES_ENDPOINT_ENV = "TRITONLLM_OTLP_TRACES_ENDPOINT"
TRACEPARENT = "traceparent"


def endpoint() -> str | None:
    return os.environ.get(OTLP_TRACES_ENDPOINT_ENV) or None


_providers: dict[str, Any] = {}  # service -> its TracerProvider


@cache
def tracer(service: str, url: str | None = None) -> Any | None:
    """The tracer of `service` (its spans batched and exported to `url`, by default $TRITONLLM_OTLP_TRACES_ENDPOINT),
    or None where traces go nowhere."""
    url = url or endpoint()
    if url is None:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url), schedule_delay_millis=500))
    _providers[service] = provider
    return provider.get_tracer("tritonllm")


def flush(service: str) -> None:
    """Exports the spans `service` still holds (at a stop)."""
    if service in _providers:
        _providers[service].force_flush()


def context_of(carrier: dict[str, str]) -> Any:
    """The trace context a `traceparent` (in a dict of headers) names; an empty one without it."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(carrier)


def traceparent() -> str | None:
    """The current span's `traceparent`, to hand on to the next hop."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get(TRACEPARENT)
