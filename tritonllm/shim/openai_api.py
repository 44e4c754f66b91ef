"""OpenAI routes: /v1/chat/completions, /v1/completions, /v1/models, mapped onto the ensemble's tensors."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import APIError
from .generation import STOP_STRING, Piece, generate, until_disconnected
from .settings import ShimSettings
from .triton_client import GenerationRequest

UINT64_MAX = (1 << 64) - 1
OPENAI_FINISH = {"end_id": "stop", STOP_STRING: "stop", "length": "length"}
# Fields of the spec that this server does not honour yet: refused rather than silently ignored.
NOT_YET = (
    "presence_penalty", "frequency_penalty", "repetition_penalty", "stop_token_ids", "include_stop_str_in_output",
    "skip_special_tokens", "ignore_eos", "logprobs", "top_logprobs", "tools", "tool_choice", "response_format",
    "best_of", "use_beam_search", "echo", "suffix",
)  # fmt: skip


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: int | None = None
    seed: Annotated[int, Field(ge=0, le=UINT64_MAX)] | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    n: Annotated[int, Field(ge=1)] | None = 1
    user: str | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v is not None and v != -1 and not 0 < v <= 2147483647:
            raise ValueError("top_k must be -1 or in (0, 2147483647]")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if any(len(s) < 1 for s in stops) or sum(len(s) for s in stops) > 32768:
            raise ValueError("stop strings must be non-empty and 32768 characters at most in total")
        return stops

    def check_supported(self) -> None:
        extras = self.model_extra or {}
        for name in NOT_YET:
            if extras.get(name) not in (None, False):
                raise APIError(400, f"{name} is not supported by this server yet", name)
        if self.n not in (None, 1):
            raise APIError(400, "n > 1 is not supported by this server yet", "n")

    def generation_request(self, default_max_tokens: int, **content: Any) -> GenerationRequest:
        self.check_supported()
        top_k = None if self.top_k is None else (0 if self.top_k == -1 else self.top_k)
        return GenerationRequest(
            max_tokens=self.max_tokens or default_max_tokens,
            # OpenAI's default temperature is 1.0 (sampling); 0 asks for greedy decoding.
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=top_k,
            top_p=self.top_p,
            seed=self.seed,
            stream=bool(self.stream),
            **content,
        )


class StreamOptions(BaseModel):
    include_usage: bool | None = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def rendered(self, index: int) -> dict:
        field = f"messages.{index}.content"
        if self.role == "tool" and not self.tool_call_id:
            raise APIError(400, f"messages.{index}.tool_call_id is required for tool messages", field)
        content = self.content
        if isinstance(content, list):
            kinds = {part.get("type") for part in content}
            if kinds - {"text"}:
                raise APIError(400, f"{field}: this model takes text only, not {sorted(kinds - {'text'})}", field)
            content = "".join(str(part.get("text", "")) for part in content)
        if not content and not (self.role == "assistant" and self.tool_calls):
            raise APIError(400, f"{field} must not be empty", field)
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    stream_options: StreamOptions | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str]
    stream_options: StreamOptions | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        prompts = [v] if isinstance(v, str) else v
        if len(prompts) != 1:
            raise ValueError("one prompt per request is supported so far")
        if not prompts[0]:
            raise ValueError("prompt must not be empty")
        return prompts[0]


def _usage(piece: Piece) -> dict:
    prompt, completion = piece.chunk.num_input_tokens, piece.chunk.num_output_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    def check_model(name: str) -> None:
        if name != settings.served_model_name:
            raise APIError(
                404, f"model {name!r} does not exist; this server has {settings.served_model_name!r}", "model"
            )

    async def run(request: Request, body: SamplingFields, gen: GenerationRequest, render) -> Any:
        client = request.app.state.triton
        stops = body.stop or []
        if body.stream:
            return StreamingResponse(render.stream(generate(client, gen, stops)), media_type="text/event-stream")

        async def collect() -> tuple[str, Piece]:
            text, last = "", None
            async for piece in generate(client, gen, stops):
                text, last = text + piece.text, piece
            return text, last

        text, last = await until_disconnected(request, collect())
        return JSONResponse(render.whole(text, last))

    @router.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": settings.served_model_name,
                    "object": "model",
                    "created": settings.started,
                    "owned_by": "tritonllm",
                }
            ],
        }

    @router.post("/v1/chat/completions")
    async def chat(request: Request, body: ChatRequest) -> Any:
        check_model(body.model)
        messages = [m.rendered(i) for i, m in enumerate(body.messages)]
        gen = body.generation_request(settings.default_max_tokens, messages=messages)
        return await run(request, body, gen, ChatRender(body))

    @router.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Any:
        check_model(body.model)
        gen = body.generation_request(16, text=body.prompt)
        return await run(request, body, gen, CompletionRender(body))

    return router


class _Render:
    object_whole: str
    object_chunk: str
    prefix: str

    def __init__(self, body: SamplingFields) -> None:
        self.body = body
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def envelope(self, obj: str, choices: list, **extra) -> dict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.body.model,
            "choices": choices,
            **extra,
        }

    def include_usage(self) -> bool:
        options = getattr(self.body, "stream_options", None)
        return bool(options and options.include_usage)

    async def stream(self, pieces: AsyncIterator[Piece]) -> AsyncIterator[str]:
        for first in self.opening():
            yield _sse(first)
        last = None
        try:
            async with aclosing(pieces):
                async for piece in pieces:
                    last = piece
                    finish = OPENAI_FINISH[piece.finish_reason] if piece.finish_reason else None
                    if piece.text or finish:
                        yield _sse(self.envelope(self.object_chunk, [self.delta(piece.text, finish)]))
        except APIError as e:
            yield _sse(e.body())
            return
        if last is not None and self.include_usage():
            yield _sse(self.envelope(self.object_chunk, [], usage=_usage(last)))
        yield _sse("[DONE]")

    def opening(self) -> list[dict]:
        return []

    def whole(self, text: str, last: Piece) -> dict:
        return self.envelope(
            self.object_whole, [self.choice(text, OPENAI_FINISH[last.finish_reason])], usage=_usage(last)
        )


class ChatRender(_Render):
    object_whole, object_chunk, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def opening(self) -> list[dict]:
        delta = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return [self.envelope(self.object_chunk, [delta])]

    def delta(self, text: str, finish: str | None) -> dict:
        return {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None, "finish_reason": finish}

    def choice(self, text: str, finish: str) -> dict:
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }


class CompletionRender(_Render):
    object_whole, object_chunk, prefix = "text_completion", "text_completion", "cmpl"

    def delta(self, text: str, finish: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def choice(self, text: str, finish: str) -> dict:
        return self.delta(text, finish)
