"""The shim's own Prometheus metrics on its port (`GET /metrics`): requests by route and status, and the time to
each response's start. The engine's metrics (KV blocks, batch, tokens, TTFT) stay on Triton's metrics port."""

from __future__ import annotations

import time

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def install(app: FastAPI) -> None:
    registry = CollectorRegistry()  # one per app: tests run several shims in one process
    requests = Counter(
        "tritonllm_shim_requests", "HTTP requests answered by the shim", ["route", "status"], registry=registry
    )
    latency = Histogram(
        "tritonllm_shim_response_start_seconds",
        "Time from a request's arrival to the start of its response (a stream's first byte)",
        ["route"],
        buckets=BUCKETS,
        registry=registry,
    )

    @app.middleware("http")
    async def observe(request: Request, call_next):
        start = time.monotonic()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "other")  # the template: bounded label values
        requests.labels(route, str(response.status_code)).inc()
        latency.labels(route).observe(time.monotonic() - start)
        return response

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
