"""`POST /v2/models/{model}/generate_stream` and `/generate` in the format of the generate_stream spec."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from tritonllm.common.request_parameters import INT32_MAX, UINT64_MAX
from tritonllm.media.kinds import MAX_GENERATE_STREAM_IMAGES
from tritonllm.shim.errors import APIError, json_body
from tritonllm.shim.generation import STOP_STRING, Piece, generate, primed, until_disconnected
from tritonllm.shim.openai_protocol import text_chars
from tritonllm.shim.settings import ShimSettings
from tritonllm.shim.triton_requests import GenerationRequest

MAX_TEXT_CHARS = 4 * 1024 * 1024
# where preprocessing names a part of the one user turn a list text_input becomes; the request names it text_input[i]
TURN_PART = "messages[0].content["
SPEC_FINISH = {"end_id": "eos_token", STOP_STRING: "stop_sequence", "stop_words": "stop_sequence", "length": "length"}


class Parameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    details: bool = False
    do_sample: bool | None = None
    max_new_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] = 20
    repetition_penalty: Annotated[float, Field(gt=0.0)] = 1.0
    seed: Annotated[int, Field(gt=0, le=UINT64_MAX)] | None = None
    temperature: Annotated[float, Field(gt=0.0)] = 1.0
    top_k: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    batch_size: Annotated[int, Field(gt=0, le=INT32_MAX)] = 1
    typical_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    watermark: bool = False
    perf_stat: bool = False
    priority: Annotated[int, Field(ge=1, le=5)] = 5
    timeout: Annotated[int, Field(gt=0, le=3600)] = 600


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_-]+$")] | None = None
    text_input: str | list[dict[str, Any]]
    parameters: Parameters = Field(default_factory=Parameters)

    def generation_request(self, media: tuple[str, ...] = ()) -> GenerationRequest:
        """`media`: what the model takes beside text. A list text_input (text and image_url parts, the pages'
        multimodal form) is one user turn, rendered by the model's chat template with its image in place."""
        prompt: dict[str, Any] = {"text": self.text_input}
        if not isinstance(self.text_input, str):
            prompt = {"messages": [{"role": "user", "content": self._parts(media)}], "add_generation_prompt": True}
        elif not 0 < len(self.text_input) <= MAX_TEXT_CHARS:
            raise APIError(400, f"text_input must have 1 to {MAX_TEXT_CHARS} characters", "text_input")
        p = self.parameters
        # do_sample false, or not given with no sampling field set, decodes greedily.
        fields = p.model_fields_set
        sampling_fields = {"temperature", "top_k", "top_p", "typical_p", "seed"}
        sample = p.do_sample if p.do_sample is not None else bool(fields & sampling_fields)
        request = GenerationRequest(
            max_tokens=p.max_new_tokens,
            **prompt,
            temperature=p.temperature if sample else 0.0,
            top_k=p.top_k if sample else None,
            top_p=p.top_p if sample else None,
            typical_p=p.typical_p if sample else None,
            repetition_penalty=p.repetition_penalty,
            watermark=p.watermark or None,
            seed=p.seed,
            priority=p.priority,
            timeout_ms=p.timeout * 1000,
        )
        return request  # its request id is the shim's own: a client's id could name (and stop) another's request

    def _parts(self, media: tuple[str, ...]) -> list[dict[str, Any]]:
        if "image" not in media:
            raise APIError(400, "text_input as a list needs a multimodal model; this one takes a string", "text_input")
        parts = self.text_input
        for i, part in enumerate(parts):
            if part.get("type") not in ("text", "image_url"):
                raise APIError(400, f"text_input[{i}].type must be text or image_url", f"text_input[{i}].type")
        images = [i for i, part in enumerate(parts) if part.get("type") == "image_url"]
        if len(images) > MAX_GENERATE_STREAM_IMAGES:
            field = f"text_input[{images[MAX_GENERATE_STREAM_IMAGES]}]"
            raise APIError(400, f"{field}: at most {MAX_GENERATE_STREAM_IMAGES} image in a request", field)
        if text_chars(parts) > MAX_TEXT_CHARS:
            raise APIError(400, f"text_input must have at most {MAX_TEXT_CHARS} characters", "text_input")
        return parts


GenerateBody = Annotated[GenerateRequest, Depends(json_body(GenerateRequest, open_to_extras=False))]


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    def prepare(model: str, body: GenerateRequest) -> GenerationRequest:
        served = settings.served(model)
        return served.onto(body.generation_request(served.settings.media))

    @router.post("/v2/models/{model}/generate_stream")
    async def generate_stream(request: Request, model: str, body: GenerateBody) -> StreamingResponse:
        gen = prepare(model, body)
        events = Events(model, body, gen, settings.full_text_enabled)
        pieces = _parts_named_as_sent(generate(request.app.state.triton, gen, []))
        pieces = await until_disconnected(request, primed(pieces))
        return StreamingResponse(events.stream(pieces), media_type="text/event-stream")

    @router.post("/v2/models/{model}/generate")
    async def generate_whole(request: Request, model: str, body: GenerateBody) -> JSONResponse:
        gen = prepare(model, body)
        gen.stream = False
        events = Events(model, body, gen)

        async def collect() -> dict:
            text, last = "", None
            async for piece in _parts_named_as_sent(generate(request.app.state.triton, gen, [])):
                text, last = text + piece.text, piece
            return events.event(text, last)

        return JSONResponse(await until_disconnected(request, collect()))

    return router


async def _parts_named_as_sent(pieces: AsyncIterator[Piece]) -> AsyncIterator[Piece]:
    """`pieces`, an error about a part of a list text_input naming it as the request does (`text_input[1]`), not as
    the user turn preprocessing was given (`messages[0].content[1]`)."""
    try:
        async with aclosing(pieces):
            async for piece in pieces:
                yield piece
    except APIError as e:
        if not (e.param or "").startswith(TURN_PART):
            raise
        renamed = e.message.replace(TURN_PART, "text_input[")
        raise APIError(e.status, renamed, e.param.replace(TURN_PART, "text_input[", 1)) from e


def _event_line(payload: dict) -> str:
    """One SSE event, compact JSON after `data:` as in the spec's examples."""
    return f"data:{json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


class Events:
    """Builds the spec's events: id, model_name, model_version, text_output, details, prefill/decode time."""

    def __init__(self, model: str, body: GenerateRequest, gen: GenerationRequest, full_text: bool = False) -> None:
        self.model = model
        self.details = body.parameters.details
        self.perf_stat = body.parameters.perf_stat
        self.full_text = full_text  # each event carries the whole text so far
        self.text = ""
        self.id = body.id or gen.request_id
        self.start = time.monotonic()
        self.previous: float | None = None
        self.first_token_ms: float | None = None
        self.decode_ms = 0.0

    def event(self, text: str, piece: Piece) -> dict:
        now = time.monotonic()
        first = self.previous is None
        elapsed_ms = round((now - (self.start if first else self.previous)) * 1000, 3)
        self.previous = now
        if first:
            self.first_token_ms = elapsed_ms
        else:
            self.decode_ms += elapsed_ms
        self.text += text
        output = self.text if self.full_text else text
        out: dict[str, Any] = {"id": self.id, "model_name": self.model, "model_version": None, "text_output": output}
        if self.details:
            details: dict[str, Any] = {}
            if piece.finish_reason:
                details["finish_reason"] = SPEC_FINISH[piece.finish_reason]
            details.update(
                generated_tokens=piece.delta.num_output_tokens,
                # perf_stat: the first token's latency and the decoding time so far, in milliseconds
                first_token_cost=self.first_token_ms if self.perf_stat else None,
                decode_cost=round(self.decode_ms, 3) if self.perf_stat else None,
                batch_size=piece.delta.batch_size,
                queue_wait_time=piece.delta.queue_wait_us,
            )
            out["details"] = details
        out["prefill_time"] = elapsed_ms if first else None
        out["decode_time"] = None if first else elapsed_ms
        return out

    async def stream(self, pieces: AsyncIterator[Piece]) -> AsyncIterator[str]:
        try:
            async with aclosing(pieces):
                async for piece in pieces:
                    if not piece.text and not piece.finish_reason:
                        continue  # a token that completes no character yet
                    yield _event_line(self.event(piece.text, piece))
        except APIError as e:
            yield _event_line(e.body())
