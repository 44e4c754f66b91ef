"""The ASGI app: OpenAI, embeddings and generate_stream routes over one gRPC connection to Triton."""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import embeddings_api, generate_api, metrics, openai_api, openapi, responses_api, tokenize_api
from .errors import APIError, api_error_handler, http_error_handler, validation_error_handler
from .settings import ShimSettings
from .triton_client import TritonLLMClient


def create_app(settings: ShimSettings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.triton = TritonLLMClient(settings.triton_grpc_url)
        try:
            yield
        finally:
            await app.state.triton.close()

    app = FastAPI(title="tritonllm shim", lifespan=lifespan)
    app.add_exception_handler(APIError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    if settings.api_key:
        expected = f"Bearer {settings.api_key}".encode()

        @app.middleware("http")
        async def require_api_key(request: Request, call_next):
            given = request.headers.get("authorization", "").encode()
            if request.url.path != "/health" and not hmac.compare_digest(given, expected):
                error = APIError(401, "a valid API key is required: Authorization: Bearer <key>")
                return JSONResponse(error.body(), status_code=401)
            return await call_next(request)

    metrics.install(app)
    app.include_router(openai_api.build_router(settings))
    app.include_router(embeddings_api.build_router(settings))
    app.include_router(generate_api.build_router(settings))
    app.include_router(responses_api.build_router(settings))
    app.include_router(tokenize_api.build_router(settings))
    openapi.document_bodies(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        ready = await app.state.triton.ready()
        return JSONResponse({"status": "ok" if ready else "unavailable"}, status_code=200 if ready else 503)

    return app
