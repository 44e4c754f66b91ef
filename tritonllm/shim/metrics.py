"""The shim's own Prometheus metrics on its port (`GET /metrics`): requests by route and status, and the time to
each response's start. The engine's metrics (KV blocks, batch, tokens, TTFT) stay on Triton's metrics port."""

from __future__ import annotations

import time

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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

    app.add_middleware(ObservedRoutes, requests=requests, latency=latency)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class ObservedRoutes:
    """Counts each response by route and status and times its start, as its head goes out. Plain ASGI: Starlette's
    @app.middleware would pass every streamed chunk through a task and a memory stream of its own."""

    def __init__(self, app: ASGIApp, requests: Counter, latency: Histogram) -> None:
        self.app = app
        self.requests = requests
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()

        async def observed(message: Message) -> None:
            if message["type"] == "http.response.start":
                # the router has put the matched route in the scope: its template keeps label values bounded
                route = getattr(scope.get("route"), "path", "other")
                self.requests.labels(route, str(message["status"])).inc()
                self.latency.labels(route).observe(time.monotonic() - start)
            await send(message)

        await self.app(scope, receive, observed)
