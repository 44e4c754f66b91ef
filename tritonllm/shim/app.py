"""The ASGI app: OpenAI, embeddings and generate_stream routes over gRPC to Triton, one connection an LLM."""

from __future__ import annotations

import contextlib
import hmac
import tempfile
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tritonllm.common import tracing
from tritonllm.shim import (
    anthropic_api,
    batch_api,
    chat_route,
    embeddings_api,
    generate_api,
    lora_registry,
    metrics,
    model_admin,
    openai_api,
    openapi,
    rerank_api,
    responses_api,
    tokenize_api,
)
from tritonllm.shim.batch_runner import BatchRunner
from tritonllm.shim.batch_store import BatchStore
from tritonllm.shim.errors import (
    UNAVAILABLE_RETRY_AFTER_S,
    APIError,
    IgnoredFieldsHeader,
    api_error_handler,
    http_error_handler,
    internal_error_handler,
    validation_error_handler,
)
from tritonllm.shim.model_pool import ModelPool
from tritonllm.shim.settings import ShimSettings

SHIM_SERVICE = "tritonllm-shim"  # the service name of the shim's spans


def create_app(settings: ShimSettings, unavailable: Callable[[], str | None] | None = None) -> FastAPI:
    """`unavailable`: why the server behind the shim cannot serve right now (a restart under way), or None;
    while it says why, /health and every route answer 503 with the reason."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.triton = ModelPool(settings)
        with contextlib.ExitStack() as temporary:
            folder = settings.batch_dir or temporary.enter_context(tempfile.TemporaryDirectory(prefix="batches-"))
            app.state.batch_store = BatchStore(Path(folder))
            app.state.batch_runner = BatchRunner(app.state.batch_store, app, settings.api_key)
            app.state.batch_runner.resume()
            try:
                yield
            finally:
                await app.state.batch_runner.close()
                app.state.batch_store.close()
                await app.state.triton.close()
                tracing.flush(SHIM_SERVICE)

    app = FastAPI(title="tritonllm shim", lifespan=lifespan)
    app.state.strict_request_fields = settings.strict_request_fields
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(Exception, internal_error_handler)
    if unavailable is not None:
        app.add_middleware(WhileUnavailable, reason=unavailable)
    if settings.api_key:
        app.add_middleware(RequireAPIKey, key=settings.api_key.encode())
    app.add_middleware(IgnoredFieldsHeader)
    tracer = tracing.tracer(SHIM_SERVICE)
    if tracer is not None:
        app.add_middleware(TraceRequests, tracer=tracer)
    metrics.install(app)
    app.include_router(openai_api.build_router(settings))
    app.include_router(embeddings_api.build_router(settings))
    app.include_router(generate_api.build_router(settings))
    app.include_router(responses_api.build_router(settings))
    app.include_router(anthropic_api.build_router(settings))
    app.include_router(batch_api.build_router())
    app.include_router(rerank_api.build_router(settings))
    app.include_router(tokenize_api.build_router(settings))
    if settings.models_max is not None:
        app.include_router(model_admin.build_router(settings))
    if settings.allow_runtime_lora:
        app.include_router(lora_registry.build_router(settings.loras))
    openapi.document_bodies(app)
    chat_route.install(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if await app.state.triton.ready():
            return JSONResponse({"status": "ok"})
        reason = "tritonserver does not answer, or its ensembles are not ready"
        retry = {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)}
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503, headers=retry)

    return app


class WhileUnavailable:
    """503 with the reason, on every route, while the server behind the shim is being restarted."""

    def __init__(self, app: ASGIApp, reason: Callable[[], str | None]) -> None:
        self.app = app
        self.reason = reason

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reason = self.reason() if scope["type"] == "http" and scope["path"] != "/metrics" else None
        if reason is not None:
            body = {"status": "unavailable", "reason": reason} if scope["path"] == "/health" else None
            error = APIError(503, reason)
            answer = (
                JSONResponse(body, status_code=503, headers=error.headers()) if body else error.response(scope["path"])
            )
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)


class TraceRequests:
    """A span for every request (its method and route), the child of the client's `traceparent` where it sends one;
    the shim's calls to Triton hand it on (triton_client.py). Plain ASGI, so that a stream's span lasts until its
    last event is sent."""

    def __init__(self, app: ASGIApp, tracer) -> None:
        from opentelemetry.trace import SpanKind  # noqa: PLC0415 - only a traced shim imports opentelemetry

        self.app = app
        self.tracer = tracer
        self.server = SpanKind.SERVER

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in ("/health", "/metrics"):
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        name = f"{scope['method']} {scope['path']}"
        parent = tracing.context_of(headers)
        with self.tracer.start_as_current_span(name, context=parent, kind=self.server) as span:
            span.set_attribute("http.request.method", scope["method"])
            span.set_attribute("url.path", scope["path"])

            async def sent(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await self.app(scope, receive, sent)


class RequireAPIKey:
    """Refuses every route but /health and the chat page's files without the key, as `Authorization: Bearer <key>`
    (OpenAI's clients) or `x-api-key: <key>` (Anthropic's). Plain ASGI: Starlette's @app.middleware wraps each
    streamed chunk in a task and a memory stream of its own."""

    def __init__(self, app: ASGIApp, key: bytes) -> None:
        self.app = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and not chat_route.is_page(scope["path"]):
            headers = dict(scope["headers"])
            bearer = hmac.compare_digest(headers.get(b"authorization", b""), b"Bearer " + self.key)
            if not (bearer or hmac.compare_digest(headers.get(b"x-api-key", b""), self.key)):
                error = APIError(401, "a valid API key is required: Authorization: Bearer <key>, or x-api-key")
                await error.response(scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)
