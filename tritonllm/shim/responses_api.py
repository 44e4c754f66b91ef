"""POST /v1/responses, OpenAI's Responses API, as a chat completion underneath.

The request becomes a chat request (instructions and input items as messages, function tools as chat tools,
`text.format` as `response_format`, vLLM's sampling and constraint fields as they are), so it meets the same
template, tool-call grammar and parser as /v1/chat/completions. A reasoning model's thinking comes back as a
reasoning item before the message. Nothing is stored: `previous_response_id` and the other stored-state fields are
400s, and every response says `store: false`. A whole response is the stream's last event, built by the same code.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tritonllm.shim.answer_parts import AnswerParts
from tritonllm.shim.errors import APIError, json_body
from tritonllm.shim.generation import Piece, answer, generate
from tritonllm.shim.openai_protocol import INT32_MAX, ChatRequest
from tritonllm.shim.serving_chat import chat_generation
from tritonllm.shim.settings import ShimSettings
from tritonllm.shim.triton_responses import TokenLogprob
from tritonllm.shim.vllm_fields import VLLMFields

LOGPROBS = "message.output_text.logprobs"  # the `include` entry that asks for the output's log-probabilities
ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")


class TextFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class TextConfig(BaseModel):
    format: TextFormat | None = None
    verbosity: str | None = None  # cannot change what this model says: accepted, ignored


class ResponsesRequest(VLLMFields):
    """OpenAI's fields, and vLLM's sampling and constraint fields (as on chat)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # left out: the first served LLM
    input: str | Annotated[list[dict[str, Any]], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, Field(ge=1)] | None = None
    text: TextConfig | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    # its effort reaches the chat template as `reasoning_effort` (as on chat); a reasoning model's thinking comes
    # back as reasoning items whatever it says
    reasoning: dict[str, Any] | None = None
    # Fields that cannot change a text model's answer here: accepted, ignored.
    store: bool | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # State this server does not keep, or work it does not do: refused when asked for.
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    background: bool | None = None

    def check(self) -> None:
        for name in ("previous_response_id", "conversation", "prompt"):
            if getattr(self, name) is not None:
                raise APIError(400, f"{name}: this server stores no responses; send the whole input instead", name)
        for name in ("prompt_logprobs", "return_token_ids"):
            if getattr(self, name) not in (None, False):
                raise APIError(400, f"{name}: the Responses API has no place for it; use chat completions", name)
        if self.background:
            raise APIError(400, "background: this server answers in the foreground only", "background")

    def chat_request(self) -> ChatRequest:
        """The same request as a chat completion."""
        fields = {
            "model": self.model,
            "messages": self.messages(),
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "logprobs": self.top_logprobs is not None or LOGPROBS in (self.include or []),
            "top_logprobs": self.top_logprobs,
            "tools": [_chat_tool(i, t) for i, t in enumerate(self.tools or [])] or None,
            "tool_choice": _chat_tool_choice(self.tool_choice),
            "parallel_tool_calls": False if self.max_tool_calls == 1 else self.parallel_tool_calls,
            "response_format": self.response_format(),
            "reasoning_effort": (self.reasoning or {}).get("effort"),
            **{name: getattr(self, name) for name in VLLMFields.model_fields},
        }
        try:
            return ChatRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as e:
            error = e.errors()[0]
            where = ".".join(str(p) for p in error["loc"]).replace("messages", "input", 1)
            raise APIError(400, f"{where}: {error['msg']}", where) from e

    def messages(self) -> list[dict]:
        """Instructions and input items as chat messages; a run of function calls is one assistant message."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        for index, item in enumerate(items):
            kind = item.get("type", "message")
            if kind == "message":
                if item.get("role") not in ROLES:
                    raise APIError(400, f"input.{index}.role must be one of {list(ROLES)}", f"input.{index}.role")
                content = _content(item.get("content"), f"input.{index}.content")
                if not content:
                    raise APIError(400, f"input.{index}.content must not be empty", f"input.{index}.content")
                messages.append({"role": item["role"], "content": content})
            elif kind == "function_call":
                call = {"id": item.get("call_id"), "type": "function", "function": _function(item, index)}
                last = messages[-1] if messages else {}
                if last.get("role") == "assistant" and last.get("tool_calls"):
                    last["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                if not isinstance(item.get("call_id"), str):
                    raise APIError(400, f"input.{index}.call_id is required", f"input.{index}.call_id")
                output = _text(item.get("output"), f"input.{index}.output")
                messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
            elif kind != "reasoning":  # thinking sent back: templates show none of past turns (Qwen3's drop it)
                raise APIError(400, f"input.{index}.type {kind!r} cannot be served here", f"input.{index}.type")
        return messages

    def response_format(self) -> dict | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type != "json_schema":
            return None if fmt is None else {"type": fmt.type}
        if fmt.schema_ is None or not fmt.name:
            raise APIError(400, "text.format json_schema needs a name and a schema", "text.format")
        return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}


MEDIA_PARTS = frozenset({"input_image", "input_audio"})


def _content(content: Any, field: str) -> str | list[dict]:
    """A message's content: its text, or, where it holds images or audio, its parts as a chat message's (each
    text part as `text`), for a multimodal model to read (a text model's chat refuses them, naming the part)."""
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in MEDIA_PARTS for p in content):
        others = sorted({str(p.get("type")) for p in content if isinstance(p, dict)} - set(TEXT_PARTS) - MEDIA_PARTS)
        if others or not all(isinstance(p, dict) for p in content):
            raise APIError(400, f"{field}: parts are text, input_image or input_audio, not {others}", field)
        return [p if p["type"] in MEDIA_PARTS else {"type": "text", "text": str(p.get("text", ""))} for p in content]
    return _text(content, field)


def _text(content: Any, field: str) -> str:
    """A message's content or a function's output: a string, or text parts (images and files need a model that
    sees them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
        raise APIError(400, f"{field} must be a string or a list of parts", field)
    others = sorted({str(part.get("type")) for part in content} - set(TEXT_PARTS))
    if others:
        raise APIError(400, f"{field}: this model takes text parts only, not {others}", field)
    return "".join(str(part.get("text", "")) for part in content)


def _function(item: dict, index: int) -> dict:
    if not all(isinstance(item.get(key), str) for key in ("call_id", "name", "arguments")):
        raise APIError(400, f"input.{index}: a function_call needs call_id, name and arguments", f"input.{index}")
    return {"name": item["name"], "arguments": item["arguments"]}


def _chat_tool(index: int, tool: dict) -> dict:
    if tool.get("type") != "function":
        raise APIError(
            400, f"tools.{index}.type: this server runs function tools only, not {tool.get('type')!r}", f"tools.{index}"
        )
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def _chat_tool_choice(choice: str | dict | None) -> str | dict | None:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function":
        raise APIError(400, f"tool_choice type {choice.get('type')!r} cannot be served here", "tool_choice")
    return {"type": "function", "function": {"name": choice.get("name")}}


ResponsesBody = Annotated[ResponsesRequest, Depends(json_body(ResponsesRequest))]


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/responses")
    async def responses(request: Request, body: ResponsesBody) -> Any:
        body.model = body.model or settings.served_model_name
        served = settings.served(body.model)
        body.check()
        chat = body.chat_request()
        gen = served.onto(chat_generation(chat, served.settings, where="input"))
        builder = ResponseBuilder(body, chat, served.settings)
        pieces = generate(request.app.state.triton, gen, [])
        try:
            return await answer(request, pieces, bool(body.stream), builder.stream, builder.events, builder.response)
        except APIError as e:
            if e.param == "max_tokens":  # this API's name for it
                raise APIError(
                    e.status, e.message.replace("max_tokens", "max_output_tokens"), "max_output_tokens"
                ) from e
            raise

    return router


class ResponseBuilder:
    """Turns the pieces of one generation into the Responses API's stream events and final response object."""

    def __init__(self, body: ResponsesRequest, chat: ChatRequest, settings: ShimSettings) -> None:
        self.body = body
        self.chat = chat
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self.status = "in_progress"
        self.error: dict | None = None
        self.logprobs = bool(chat.logprobs)
        max_calls = 1 if chat.parallel_tool_calls is False else body.max_tool_calls
        self.parts = AnswerParts(chat, settings, max_calls)
        self.output: list[dict] = []
        self.open: dict | None = None  # the output item still being written
        self.sequence = 0
        self.usage: dict | None = None

    def response(self) -> dict:
        body = self.body
        fmt = body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text and body.text.format else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "background": False,
            "error": self.error,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": body.max_tool_calls,
            "model": body.model,
            "output": self.output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": (body.reasoning or {}).get("effort"), "summary": None},
            "store": False,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": fmt or {"type": "text"}},
            "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [],
            "top_logprobs": body.top_logprobs,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": body.truncation or "disabled",
            "usage": self.usage,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    async def stream(self, pieces: AsyncIterator[Piece]) -> AsyncIterator[str]:
        yield self._sse(self._event("response.created", response=self.response()))
        yield self._sse(self._event("response.in_progress", response=self.response()))
        try:
            async with aclosing(pieces):
                async for piece in pieces:
                    for event in self.events(piece):
                        yield self._sse(event)
        except APIError as e:
            self.status, self.error = (
                "failed",
                {"code": "server_error" if e.status >= 500 else "invalid_request", "message": e.message},
            )
            yield self._sse(self._event("response.failed", response=self.response()))
            return
        yield self._sse(self._event(f"response.{self.status}", response=self.response()))

    def events(self, piece: Piece) -> list[dict]:
        """The events of one piece; the last piece also closes the open item and sets the status and usage."""
        events: list[dict] = []
        thought, text, calls = self.parts.split(piece)
        if thought:
            events += self._reasoning(thought)
        if text:
            events += self._text(text, piece.delta.logprobs if self.logprobs else [])
        for delta in calls:
            events += self._call(delta)
        if piece.finish_reason:
            self.status = "incomplete" if piece.finish_reason == "length" else "completed"
            events += self._close()
            delta, thinking = piece.delta, self.parts.thinking
            self.usage = {
                "input_tokens": delta.num_input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": delta.num_output_tokens,
                "output_tokens_details": {"reasoning_tokens": thinking.reasoning_tokens if thinking else 0},
                "total_tokens": delta.num_input_tokens + delta.num_output_tokens,
            }
        return events

    def _text(self, text: str, tokens: list[TokenLogprob]) -> list[dict]:
        events = []
        if self.open is None or self.open["type"] != "message":
            events += self._close()
            item = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "status": "in_progress", "role": "assistant"}
            events += self._add({**item, "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.open["content"].append(part)
            events.append(self._event("response.content_part.added", **self._where(), part=copy.deepcopy(part)))
        part = self.open["content"][0]
        part["text"] += text
        logprobs = [_logprob(t) for t in self.chat.named(tokens)]
        part["logprobs"] += logprobs
        events.append(self._event("response.output_text.delta", **self._where(), delta=text, logprobs=logprobs))
        return events

    def _reasoning(self, text: str) -> list[dict]:
        events = []
        if self.open is None or self.open["type"] != "reasoning":
            events += self._close()
            item = {"id": f"rs_{uuid.uuid4().hex}", "type": "reasoning", "status": "in_progress", "summary": []}
            events += self._add({**item, "content": []})
            part = {"type": "reasoning_text", "text": ""}
            self.open["content"].append(part)
            events.append(self._event("response.content_part.added", **self._where(), part=copy.deepcopy(part)))
        self.open["content"][0]["text"] += text
        events.append(self._event("response.reasoning_text.delta", **self._where(), delta=text))
        return events

    def _call(self, delta: dict) -> list[dict]:
        events = []
        function = delta.get("function") or {}
        if "id" in delta:
            events += self._close()
            item = {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "status": "in_progress",
                "call_id": delta["id"],
                "name": function.get("name", ""),
                "arguments": "",
            }
            events += self._add(item)
        piece = function.get("arguments") or ""
        if piece:
            self.open["arguments"] += piece
            events.append(
                self._event(
                    "response.function_call_arguments.delta", item_id=self.open["id"], **self._index(), delta=piece
                )
            )
        return events

    def _add(self, item: dict) -> list[dict]:
        self.open = item
        self.output.append(item)
        return [self._event("response.output_item.added", **self._index(), item=copy.deepcopy(item))]

    def _close(self) -> list[dict]:
        item, events = self.open, []
        if item is None:
            return events
        item["status"] = "incomplete" if self.status == "incomplete" else "completed"
        if item["type"] == "message":
            part = item["content"][0]
            events.append(
                self._event("response.output_text.done", **self._where(), text=part["text"], logprobs=part["logprobs"])
            )
            events.append(self._event("response.content_part.done", **self._where(), part=copy.deepcopy(part)))
        elif item["type"] == "reasoning":
            part = item["content"][0]
            events.append(self._event("response.reasoning_text.done", **self._where(), text=part["text"]))
            events.append(self._event("response.content_part.done", **self._where(), part=copy.deepcopy(part)))
        else:
            events.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    **self._index(),
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
        events.append(self._event("response.output_item.done", **self._index(), item=copy.deepcopy(item)))
        self.open = None
        return events

    def _index(self) -> dict:
        return {"output_index": self.output.index(self.open)}

    def _where(self) -> dict:
        return {"item_id": self.open["id"], **self._index(), "content_index": 0}

    def _event(self, kind: str, **fields: Any) -> dict:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    @staticmethod
    def _sse(event: dict) -> str:
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def _logprob(token: TokenLogprob) -> dict:
    def entry(text: str, logprob: float) -> dict:
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {**entry(token.token, token.logprob), "top_logprobs": [entry(t, lp) for t, lp in token.top]}
