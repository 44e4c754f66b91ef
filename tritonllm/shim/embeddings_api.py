"""POST /v1/embeddings onto the Triton `embedding` model.

The inputs go in batches of the model's max_batch_size, all at once; Triton's dynamic batcher joins what arrives
together. The OpenAI SDKs ask for base64 unless told otherwise, so both encodings are served.
"""

from __future__ import annotations

import base64
import uuid
from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tritonllm.shim.errors import APIError, json_body
from tritonllm.shim.openai_protocol import MAX_TEXT_CHARS, TokenId
from tritonllm.shim.row_batches import in_batches
from tritonllm.shim.settings import ShimSettings

MAX_INPUTS = 2048  # as OpenAI's API


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # left out: the embedding model
    # a text, texts, token ids or lists of them (OpenAI's four forms); ids are read as they are
    input: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[list[TokenId]], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    instruction: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(gt=0)] | None = None
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _no_empty_input(cls, v):
        """An empty text or id list embeds nothing: OpenAI refuses it."""
        rows = _rows(v)
        empty = [i for i, row in enumerate(rows) if not row]
        if empty:
            raise ValueError("must not be empty" if rows[0] is v else f"input[{empty[0]}] must not be empty")
        return v

    def rows(self) -> list[str] | list[list[int]]:
        """The inputs a row each: texts, or token-id lists."""
        return _rows(self.input)


def _rows(value):
    return [value] if isinstance(value, str) or isinstance(value[0], int) else value


EmbeddingBody = Annotated[EmbeddingRequest, Depends(json_body(EmbeddingRequest))]


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/embeddings")
    async def embeddings(request: Request, body: EmbeddingBody) -> JSONResponse:
        body.model = body.model or settings.embedding_model_name
        if settings.embedding_model_name is None:
            raise APIError(
                404,
                f"model {body.model!r} does not embed: this server serves no embedding model "
                "(`serve` ran with --no-embedding)",
                "model",
            )
        if body.model != settings.embedding_model_name:
            raise APIError(
                400 if body.model in {model.name for model in settings.llms()} else 404,
                f"model {body.model!r} does not embed; /v1/embeddings serves {settings.embedding_model_name!r}",
                "model",
            )
        rows = body.rows()
        given_ids = isinstance(rows[0], list)
        if given_ids and body.instruction:
            raise APIError(400, "instruction is put before a text; input holds token ids", "instruction")
        if not given_ids and sum(map(len, rows)) + len(body.instruction or "") > MAX_TEXT_CHARS:
            raise APIError(413, f"input is over {MAX_TEXT_CHARS} characters", "input")
        client = request.app.state.triton
        embed = lambda start, end: client.embed(rows[start:end], body.instruction)  # noqa: E731
        results = await in_batches(request, len(rows), embed, "input_ids" if given_ids else "text_input", "input")
        vectors = np.concatenate([v for v, _ in results])
        if body.dimensions is not None and body.dimensions != vectors.shape[1]:
            raise APIError(400, f"dimensions must be {vectors.shape[1]} for {body.model!r} (or left out)", "dimensions")
        tokens = int(sum(int(n.sum()) for _, n in results))
        # a JSONResponse skips FastAPI's field-by-field encoding of thousands of floats
        return JSONResponse(
            {
                "id": f"embd-{uuid.uuid4().hex}",
                "object": "list",
                "model": body.model,
                "data": [
                    {"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
                    for i, v in enumerate(vectors)
                ],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    return router


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI sends it
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
