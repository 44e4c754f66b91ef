"""POST /v1/rerank and /v1/score (vLLM's routes and shapes; /rerank, /v2/rerank and /score too) onto the Triton
`reranker` model, which scores (query, document) pairs with a cross-encoder (tritonllm/backend/reranker.py).

Rerank: a query and its documents (strings, or Jina's and Cohere's {"text": ...}), answered most relevant first,
`top_n` of them. Score: `text_1` against `text_2`, one to one, one to many, or pairwise for lists of one length.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from tritonllm.shim.errors import APIError, json_body
from tritonllm.shim.openai_protocol import MAX_TEXT_CHARS
from tritonllm.shim.row_batches import in_batches
from tritonllm.shim.settings import ShimSettings

MAX_PAIRS = 1024


class Document(BaseModel):
    text: str


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # left out: the reranker
    query: str
    documents: Annotated[list[str | Document], Field(min_length=1, max_length=MAX_PAIRS)]
    top_n: Annotated[int, Field(ge=0)] | None = None  # None or 0: all of them
    return_documents: bool = True


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # left out: the reranker
    text_1: str | Annotated[list[str], Field(min_length=1, max_length=MAX_PAIRS)]
    text_2: str | Annotated[list[str], Field(min_length=1, max_length=MAX_PAIRS)]


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    def check_model(body: RerankRequest | ScoreRequest) -> None:
        """The request's model must be the reranker; left out, it is."""
        name = body.model = body.model or settings.rerank_model_name
        if settings.rerank_model_name is None:
            raise APIError(
                404,
                f"model {name!r} does not rerank: this server serves no reranker (`serve --rerank-model-dir`)",
                "model",
            )
        if name != settings.rerank_model_name:
            served = {m.name for m in settings.llms()} | {settings.embedding_model_name}
            raise APIError(
                400 if name in served else 404,
                f"model {name!r} does not rerank; the reranker is {settings.rerank_model_name!r}",
                "model",
            )

    async def scored(request: Request, queries: list[str], documents: list[str], field: str) -> tuple:
        """Each pair's score and the tokens of all; an error naming a document names it as `field`[i]."""
        if sum(map(len, queries)) + sum(map(len, documents)) > MAX_TEXT_CHARS:
            raise APIError(413, f"the texts are over {MAX_TEXT_CHARS} characters", field)
        client = request.app.state.triton
        score = lambda start, end: client.score(queries[start:end], documents[start:end])  # noqa: E731
        parts = await in_batches(request, len(queries), score, "document", field)
        return np.concatenate([s for s, _ in parts]), int(sum(int(n.sum()) for _, n in parts))

    async def rerank(
        request: Request, body: Annotated[RerankRequest, Depends(json_body(RerankRequest))]
    ) -> JSONResponse:
        check_model(body)
        texts = [d if isinstance(d, str) else d.text for d in body.documents]
        scores, tokens = await scored(request, [body.query] * len(texts), texts, "documents")
        order = sorted(range(len(texts)), key=lambda i: -scores[i])[: body.top_n or None]
        results = [
            {"index": i, "relevance_score": float(scores[i])}
            | ({"document": {"text": texts[i]}} if body.return_documents else {})
            for i in order
        ]
        return JSONResponse(
            {
                "id": f"rerank-{uuid.uuid4().hex}",
                "model": body.model,
                "usage": {"total_tokens": tokens},
                "results": results,
            }
        )

    async def score(request: Request, body: Annotated[ScoreRequest, Depends(json_body(ScoreRequest))]) -> JSONResponse:
        check_model(body)
        first = [body.text_1] if isinstance(body.text_1, str) else body.text_1
        second = [body.text_2] if isinstance(body.text_2, str) else body.text_2
        if len(first) == 1:
            first = first * len(second)
        elif len(first) != len(second):
            raise APIError(
                400, f"text_1 has {len(first)} texts and text_2 {len(second)}: give one, or as many", "text_2"
            )
        scores, tokens = await scored(request, first, second, "text_2")
        return JSONResponse(
            {
                "id": f"score-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": body.model,
                "data": [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        router.add_api_route(path, rerank, methods=["POST"])
    for path in ("/v1/score", "/score"):
        router.add_api_route(path, score, methods=["POST"])
    return router
