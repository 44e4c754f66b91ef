"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}, and the bodies' parsing."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tritonllm.shim.triton_errors import TritonRequestError

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    422: "invalid_request_error",
    500: "server_error",
}


# What a 503 (the server behind the shim restarting, out of reach, or loading) tells a client to wait, in seconds
UNAVAILABLE_RETRY_AFTER_S = 5


class APIError(Exception):
    """`retry_after_s`: when a retry may succeed, for the `Retry-After` header of a 429 (a 503 says
    UNAVAILABLE_RETRY_AFTER_S)."""

    def __init__(self, status: int, message: str, param: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s if retry_after_s or status != 503 else UNAVAILABLE_RETRY_AFTER_S

    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else None

    @classmethod
    def refused(cls, error: TritonRequestError) -> APIError:
        """What the models refused, with the status and field their typed error carries. An untyped error is no
        fault of the request's (a model's bug, a step that died): 500, naming the request for the server's log."""
        typed = error.typed
        if typed is not None:
            return cls(typed.status, typed.message, typed.param, getattr(typed, "retry_after_s", None))
        log.error("internal error serving request %s: %s", error.request_id or "(no id)", error)
        return cls.internal(error.request_id)

    @classmethod
    def internal(cls, request_id: str | None) -> APIError:
        return cls(
            500, f"internal server error (request {request_id or 'without an id'}); the server's log has its cause"
        )

    def body(self) -> dict:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}

    def anthropic_body(self) -> dict:
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, path: str, headers: dict[str, str] | None = None) -> JSONResponse:
        """The error as the route at `path` answers it: Anthropic's shape under /v1/messages, OpenAI's elsewhere."""
        body = self.anthropic_body() if path.startswith(ANTHROPIC_ROUTES) else self.body()
        return JSONResponse(body, status_code=self.status, headers={**(headers or {}), **(self.headers() or {})})


ANTHROPIC_ROUTES = "/v1/messages"
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


async def api_error_handler(request: Request, exc: APIError) -> JSONResponse:
    return exc.response(request.url.path)


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """A bug in the shim: logged with its traceback under an id of its own, answered 500 naming that id."""
    request_id = uuid.uuid4().hex
    log.error("internal error serving %s %s (request %s)", request.method, request.url.path, request_id, exc_info=exc)
    return APIError.internal(request_id).response(request.url.path)


async def http_error_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own answers (no such route 404, wrong method 405) in the route's error shape."""
    return APIError(exc.status_code, str(exc.detail)).response(request.url.path, exc.headers)


async def validation_error_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    """Pydantic errors become 400s whose message names each offending field."""
    problems, first = [], None
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        name = ".".join(loc) or "body"
        first = first or name
        problems.append(f"{name}: {err.get('msg', 'invalid')}")
    return APIError(400, "; ".join(problems), first).response(request.url.path)


M = TypeVar("M", bound=BaseModel)


def json_body(model: type[M], open_to_extras: bool = True) -> Callable[[Request], Awaitable[M]]:
    """A dependency that parses the body as JSON whatever its Content-Type (curl -d sends a form type).

    `open_to_extras`: an OpenAI-style body, where clients (LangChain, LiteLLM) pass fields of other vendors; unless
    the app is strict (`strict_request_fields`), top-level fields the model does not declare are dropped, logged
    and named in a `Warning` header (IgnoredFieldsHeader), as vLLM takes them. The model itself forbids extras,
    so a strict app answers 400 naming the field."""

    async def parse(request: Request) -> M:
        raw = await request.body()
        try:
            if open_to_extras and not getattr(request.app.state, "strict_request_fields", False):
                return model.model_validate(_declared_only(model, raw, request))
            return model.model_validate_json(raw)
        except ValidationError as e:
            raise RequestValidationError(e.errors(include_url=False)) from e

    parse.body_model = model  # for /openapi.json (see openapi.py)
    return parse


def _declared_only(model: type[BaseModel], raw: bytes, request: Request) -> object:
    """The JSON body without the top-level fields `model` does not declare; those are logged and kept on the
    request's state for the Warning header."""
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise RequestValidationError([{"loc": ("body",), "msg": f"not JSON: {e}", "type": "json_invalid"}]) from e
    except RecursionError as e:  # Python's parser recurses once a level: some thousand levels, and it is out of stack
        msg = "JSON nested too deeply to be a request"
        raise RequestValidationError([{"loc": ("body",), "msg": msg, "type": "json_invalid"}]) from e
    if not isinstance(body, dict):
        return body
    declared = {f.alias or name for name, f in model.model_fields.items()} | set(model.model_fields)
    ignored = sorted(set(body) - declared)
    if ignored:
        log.warning("%s %s: ignored fields this server does not know: %s", request.method, request.url.path, ignored)
        request.state.ignored_fields = ignored
    return {key: value for key, value in body.items() if key not in ignored}


class IgnoredFieldsHeader:
    """`Warning: 299 tritonllm "ignored fields: a, b"` on answers to bodies whose unknown fields were dropped."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_warning(message: Message) -> None:
            ignored = scope.get("state", {}).get("ignored_fields")
            if message["type"] == "http.response.start" and ignored:
                text = f'299 tritonllm "ignored fields: {_header_safe(", ".join(ignored))}"'
                message = {**message, "headers": [*message.get("headers", []), (b"warning", text.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_warning)


def _header_safe(text: str, limit: int = 512) -> str:
    """Client-chosen field names as a header's quoted string: printable ASCII only (a control or non-ASCII
    character in a header ends the connection instead of the answer), escaped as JSON escapes it, at most
    `limit` characters."""
    escaped = json.dumps(text)[1:-1]
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."
