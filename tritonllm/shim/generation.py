"""What every route shares: running one generation through Triton with stop strings applied on the text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request

from ..tokenizer.stop_strings import StopStringMatcher
from .errors import APIError
from .triton_client import Chunk, GenerationRequest, TritonLLMClient, TritonRequestError

STOP_STRING = "stop_string"  # finish reason when a stop string matched; the engine's own are end_id and length

T = TypeVar("T")


@dataclass
class Piece:
    text: str
    finish_reason: str | None  # set on the last piece: end_id, length or stop_string
    chunk: Chunk  # token counts, batch size and queue wait as of this piece


async def generate(client: TritonLLMClient, request: GenerationRequest, stop: list[str]) -> AsyncIterator[Piece]:
    """Yields text pieces; leaving early (stop string, caller gone) ends the generation in Triton too."""
    matcher = StopStringMatcher(stop)
    try:
        async with aclosing(client.generate(request)) as chunks:
            async for chunk in chunks:
                text = matcher.feed(chunk.text)
                if matcher.matched is not None:
                    yield Piece(text, STOP_STRING, chunk)
                    return
                if chunk.finish_reason == "timeout":
                    raise APIError(408, f"the request timed out after {chunk.num_output_tokens} tokens", "timeout")
                if chunk.finish_reason in ("cancelled", "error"):
                    raise APIError(500, f"generation ended early: {chunk.finish_reason}")
                if chunk.finish_reason:
                    yield Piece(text + matcher.flush(), chunk.finish_reason, chunk)
                    return
                yield Piece(text, None, chunk)
    except TritonRequestError as e:
        raise APIError(400, str(e), _param_named_in(str(e))) from e


def _param_named_in(message: str) -> str | None:
    for name in ("text_input", "max_tokens", "chat_messages", "chat_tools", "input_ids", "temperature", "top_k"):
        if name in message:
            return name
    return None


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Runs `work` but cancels it when the HTTP client goes away, so its generation stops too."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            raise APIError(499, "client closed the request")
