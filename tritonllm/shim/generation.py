"""What every route shares: running one generation through Triton with stop strings applied on the text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tritonllm.shim.errors import APIError
from tritonllm.shim.triton_client import TritonLLMClient
from tritonllm.shim.triton_errors import TritonRequestError, TritonUnavailable
from tritonllm.shim.triton_requests import GenerationRequest
from tritonllm.shim.triton_responses import ResponseDelta
from tritonllm.tokenizer.stop_strings import StopStringMatcher

STOP_STRING = "stop_string"  # finish reason when a stop string matched; the engine's own are end_id and length

T = TypeVar("T")


@dataclass
class Piece:
    text: str
    finish_reason: str | None  # set on a sample's last piece: end_id, length, stop_words or stop_string
    delta: ResponseDelta  # the sample index, token counts, log-probs, batch size and queue wait as of this piece
    stop: str | int | None = None  # the stop string or stop token id that ended the sample

    @property
    def index(self) -> int:
        return self.delta.index


async def generate(
    client: TritonLLMClient, request: GenerationRequest, stop: list[str], include_stop: bool = False
) -> AsyncIterator[Piece]:
    """Yields text pieces of every sample; leaving early (stop strings, caller gone) ends the generation in
    Triton too. A sample that meets a stop string ends there (with the string itself if `include_stop`)."""
    matchers: dict[int, StopStringMatcher] = {}
    done: set[int] = set()
    try:
        async with aclosing(client.generate(request)) as deltas:
            async for delta in deltas:
                if delta.index in done:
                    continue  # a sample already ended by a stop string, which the engine does not know of
                matcher = matchers.setdefault(delta.index, StopStringMatcher(stop))
                text = matcher.feed(delta.text)
                if delta.finish_reason == "timeout":
                    raise APIError(408, f"the request timed out after {delta.num_output_tokens} tokens", "timeout")
                if delta.finish_reason == "cancelled":  # the shim's own cancellations are never read back
                    raise APIError(503, "the server ended the generation: it is stopping or unloading the model")
                if delta.finish_reason == "error":
                    raise APIError(500, "the generation ended in an engine error; the server's log has its cause")
                if matcher.matched is not None:
                    piece = Piece(text + (matcher.matched if include_stop else ""), STOP_STRING, delta, matcher.matched)
                elif delta.finish_reason:
                    stop_token = delta.stop_token if delta.stop_token >= 0 else None
                    piece = Piece(text + matcher.flush(), delta.finish_reason, delta, stop_token)
                else:
                    piece = Piece(text, None, delta)
                yield piece
                if piece.finish_reason:
                    done.add(delta.index)
                    if len(done) == request.num_finals:
                        return
    except TritonRequestError as e:
        raise APIError.refused(e) from e
    except TritonUnavailable as e:
        raise APIError(503, str(e)) from e


async def primed(items: AsyncIterator[T]) -> AsyncIterator[T]:
    """`items` with its first item awaited already: an error that comes before anything was generated (input
    the model refuses) is raised here, while the HTTP status can still say so, not inside a 200 stream."""
    try:
        first = [await anext(items)]
    except StopAsyncIteration:
        first = []
    except BaseException:
        await items.aclose()
        raise

    async def rest() -> AsyncIterator[T]:
        async with aclosing(items):
            for item in first:
                yield item
            async for item in items:
                yield item

    return rest()


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


async def answer(
    request: Request,
    pieces: AsyncIterator[Piece],
    stream: bool,
    events: Callable[[AsyncIterator[Piece]], AsyncIterator[str]],
    feed: Callable[[Piece], object],
    built: Callable[[], dict],
) -> StreamingResponse | JSONResponse:
    """A route's answer to one generation, from a builder of its API's shapes: the builder's event stream of the
    pieces (`events`), or the object it built (`built`) once fed every piece (`feed`)."""
    if stream:
        pieces = await until_disconnected(request, primed(pieces))
        return StreamingResponse(events(pieces), media_type="text/event-stream")

    async def whole() -> dict:
        async with aclosing(pieces):
            async for piece in pieces:
                feed(piece)
        return built()

    return JSONResponse(await until_disconnected(request, whole()))
