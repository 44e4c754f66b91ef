"""Rows for a batched Triton model (the embedder, the reranker), sent in batches of its max_batch_size all at
once: Triton's dynamic batcher joins what arrives together. The model's errors name a row of their batch; the
answer names it by its place in the request's field."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

from fastapi import Request

from tritonllm.shim.errors import APIError
from tritonllm.shim.generation import until_disconnected
from tritonllm.shim.triton_errors import TritonRequestError, TritonUnavailable

BATCH_ROWS = 64  # the embedding and reranker models' max_batch_size


async def in_batches(
    request: Request, rows: int, call: Callable[[int, int], Awaitable], tensor: str, field: str
) -> list:
    """`call(start, end)` for each batch of `rows`, at once; their results in order. An error naming `tensor`[i]
    of a batch names `field`[start + i]; Triton out of reach is a 503."""

    async def batch(start: int):
        try:
            return await call(start, start + BATCH_ROWS)
        except TritonRequestError as e:
            error = APIError.refused(e)
            named = lambda m: f"{field}[{start + int(m[1])}]"  # noqa: E731
            pattern = rf"{re.escape(tensor)}\[(\d+)\]"
            error.message = re.sub(pattern, named, error.message)
            error.param = re.sub(pattern, named, error.param or field)
            raise error from e
        except TritonUnavailable as e:
            raise APIError(503, str(e)) from e

    return await until_disconnected(request, asyncio.gather(*(batch(s) for s in range(0, rows, BATCH_ROWS))))
