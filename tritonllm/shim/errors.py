"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .triton_client import TritonRequestError

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    422: "invalid_request_error",
    500: "server_error",
}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    @classmethod
    def refused(cls, error: TritonRequestError) -> APIError:
        """What the models refused, with the status and field their typed error carries (400 when untyped)."""
        typed = error.typed
        return cls(typed.status, typed.message, typed.param) if typed else cls(400, str(error))

    def body(self) -> dict:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


async def api_error_handler(_: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def http_error_handler(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own answers (no such route 404, wrong method 405) in OpenAI's error shape."""
    return JSONResponse(
        APIError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code, headers=exc.headers
    )


async def validation_error_handler(_: Request, exc: RequestValidationError) -> JSONResponse:
    """Pydantic errors become 400s whose message names each offending field."""
    problems, first = [], None
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        name = ".".join(loc) or "body"
        first = first or name
        problems.append(f"{name}: {err.get('msg', 'invalid')}")
    return JSONResponse(APIError(400, "; ".join(problems), first).body(), status_code=400)


M = TypeVar("M", bound=BaseModel)


def json_body(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency that parses the body as JSON whatever its Content-Type (curl -d sends a form type)."""

    async def parse(request: Request) -> M:
        try:
            return model.model_validate_json(await request.body())
        except ValidationError as e:
            raise RequestValidationError(e.errors(include_url=False)) from e

    parse.body_model = model  # for /openapi.json (see openapi.py)
    return parse
