"""POST /v1/messages and /v1/messages/count_tokens, Anthropic's Messages API, as a chat completion underneath.

The request becomes a chat request (`system` as the system message, content blocks as chat parts: text, images
by base64 or URL, `tool_use` as the assistant's tool calls, `tool_result` as tool messages; `tools` as function
tools, `tool_choice` auto / any / tool / none; `thinking` as the template's `enable_thinking` with its budget), so
it meets the same template, media loading, tool-call grammar and parser as /v1/chat/completions. The answer is
content blocks (`thinking` from the reasoning parser, `text`, `tool_use`) with Anthropic's stop reasons, whole or
as Anthropic's event stream; a whole message is what the stream's events build. Errors take Anthropic's shape
(shim/errors.py, by the path).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tritonllm.shim.answer_parts import AnswerParts
from tritonllm.shim.errors import APIError, json_body
from tritonllm.shim.generation import STOP_STRING, Piece, answer, generate
from tritonllm.shim.openai_protocol import INT32_MAX, ChatRequest
from tritonllm.shim.serving_chat import chat_generation
from tritonllm.shim.settings import ShimSettings
from tritonllm.shim.triton_errors import TritonRequestError, TritonUnavailable
from tritonllm.shim.triton_requests import TokenizeRequest
from tritonllm.shim.vllm_fields import VLLMFields

ROLES = ("user", "assistant")
STOP_REASONS = {"length": "max_tokens", STOP_STRING: "stop_sequence"}  # anything else ends the turn


class Thinking(BaseModel):
    """enabled (with a budget), adaptive and between_tools (the model's own measure): the template's thinking on."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    display: Literal["summarized", "omitted"] | None = None  # the thinking is returned as the parser splits it


class OutputFormat(BaseModel):
    type: Literal["json_schema"]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]


class OutputConfig(BaseModel):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None  # the template's reasoning_effort
    format: OutputFormat | None = None  # structured output: the answer held to the schema by the engine's grammar


class MessagesRequest(VLLMFields):
    """Anthropic's fields (`max_tokens` required, as there), and vLLM's sampling and constraint fields (as on
    chat)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # left out: the first served LLM
    max_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)]
    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    # the sampling fields of the API reference's earlier versions (and of clients that still send them)
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    stream: bool | None = False
    # Fields that cannot change what a model served here answers (caching hints, routing, accounting): accepted,
    # ignored.
    metadata: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    service_tier: str | None = None
    speed: str | None = None
    inference_geo: str | None = None
    diagnostics: dict[str, Any] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    container: str | dict[str, Any] | None = None  # server tools' sandbox: no server tool runs here

    def chat_request(self) -> ChatRequest:
        """The same request as a chat completion; a field the chat refuses is named as this API names it."""
        for name in ("prompt_logprobs", "return_token_ids", "return_tokens_as_token_ids"):
            if getattr(self, name) not in (None, False):
                raise APIError(400, f"{name}: the Messages API has no place for it; use chat completions", name)
        choice = self.tool_choice or {}
        kwargs = {"enable_thinking": self.thinking.type != "disabled"} if self.thinking else None
        output = self.output_config or OutputConfig()
        schema = output.format.schema_ if output.format else None
        fields = {
            "model": self.model,
            "messages": self.chat_messages(),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": self.stop_sequences or None,
            "tools": [_chat_tool(i, t) for i, t in enumerate(self.tools or [])] or None,
            "tool_choice": _chat_tool_choice(choice) if self.tools or choice else None,
            "parallel_tool_calls": False if choice.get("disable_parallel_tool_use") else None,
            "chat_template_kwargs": kwargs,
            "max_thinking_tokens": self.thinking.budget_tokens if self.thinking else None,
            "reasoning_effort": output.effort,
            "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
            if schema is not None
            else None,
            **{name: getattr(self, name) for name in VLLMFields.model_fields},
        }
        try:
            return ChatRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as e:
            error = e.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            raise APIError(400, f"{where}: {error['msg']}", where) from e

    def chat_messages(self) -> list[dict]:
        """`system`, then each message; a user turn's tool results become tool messages ahead of its other blocks,
        an assistant turn's tool_use blocks its tool calls."""
        messages = [{"role": "system", "content": _text(self.system, "system")}] if self.system else []
        for index, message in enumerate(self.messages):
            role, where = message.get("role"), f"messages.{index}"
            if role not in ROLES:
                raise APIError(400, f"{where}.role must be one of {list(ROLES)}", f"{where}.role")
            content = message.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
                raise APIError(400, f"{where}.content must be a string or a list of blocks", f"{where}.content")
            if role == "user":
                messages += _user_turn(blocks, f"{where}.content")
            else:
                messages.append(_assistant_turn(blocks, f"{where}.content"))
        return messages


def _user_turn(blocks: list[dict], where: str) -> list[dict]:
    results, parts = [], []
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise APIError(400, f"{where}.{i}.tool_use_id is required", f"{where}.{i}.tool_use_id")
            output = _text(block.get("content", ""), f"{where}.{i}.content")
            output = f"Error: {output}" if block.get("is_error") else output
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": output})
        elif kind == "text":
            parts.append({"type": "text", "text": _block_text(block, f"{where}.{i}")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, f"{where}.{i}")}})
        else:
            raise APIError(400, f"{where}.{i}.type {kind!r}: a user turn takes text, image and tool_result", where)
    if not parts:
        return results
    only_text = all(p["type"] == "text" for p in parts)
    return [*results, {"role": "user", "content": "".join(p["text"] for p in parts) if only_text else parts}]


def _assistant_turn(blocks: list[dict], where: str) -> dict:
    text, calls = "", []
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            text += _block_text(block, f"{where}.{i}")
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise APIError(400, f"{where}.{i}: a tool_use block needs an id and a name", f"{where}.{i}")
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        elif kind not in ("thinking", "redacted_thinking"):  # past thinking: templates show none of it
            raise APIError(400, f"{where}.{i}.type {kind!r}: an assistant turn takes text and tool_use", where)
    return {"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}


def _block_text(block: dict, where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise APIError(400, f"{where}.text must be a string", f"{where}.text")
    return block["text"]


def _text(content: Any, where: str) -> str:
    """A system prompt or a tool's result: a string or text blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        raise APIError(400, f"{where} must be a string or a list of text blocks", where)
    return "".join(_block_text(b, f"{where}.{i}") for i, b in enumerate(content))


def _image_url(block: dict, where: str) -> str:
    """An image block's source as the chat's image_url: base64 data as a data URL, or the URL itself."""
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    raise APIError(400, f"{where}.source must be base64 data or a URL", f"{where}.source")


def _chat_tool(index: int, tool: dict) -> dict:
    if tool.get("type", "custom") != "custom" or not isinstance(tool.get("name"), str):
        kind = tool.get("type")
        raise APIError(
            400,
            f"tools.{index}: this server runs client tools (a name and an input_schema), not {kind!r}",
            f"tools.{index}",
        )
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: dict) -> str | dict:
    kind = choice.get("type", "auto")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise APIError(400, "tool_choice.name is required with type tool", "tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}
    chat = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if chat is None:
        raise APIError(400, f"tool_choice.type must be auto, any, tool or none, not {kind!r}", "tool_choice.type")
    return chat


class CountTokensRequest(MessagesRequest):
    max_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] = 1  # not asked for here


MessagesBody = Annotated[MessagesRequest, Depends(json_body(MessagesRequest, open_to_extras=False))]
CountBody = Annotated[CountTokensRequest, Depends(json_body(CountTokensRequest, open_to_extras=False))]


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages")
    async def messages(request: Request, body: MessagesBody) -> Any:
        body.model = body.model or settings.served_model_name
        served = settings.served(body.model)
        chat = body.chat_request()
        gen = served.onto(chat_generation(chat, served.settings))
        builder = MessageBuilder(body, chat, served.settings)
        pieces = generate(request.app.state.triton, gen, body.stop_sequences or [])
        return await answer(request, pieces, bool(body.stream), builder.stream, builder.events, lambda: builder.message)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request, body: CountBody) -> dict:
        body.model = body.model or settings.served_model_name
        served = settings.served(body.model)
        chat = body.chat_request()
        tokenize = TokenizeRequest(
            messages=[m.rendered(i, media=served.settings.media) for i, m in enumerate(chat.messages)],
            tools=[t.model_dump(exclude_none=True) for t in chat.tools] if chat.tools else None,
            add_special_tokens=bool(chat.add_special_tokens),  # as the generation's prompt is rendered
            add_generation_prompt=True,
        )
        tokenize.model = served.model.name
        try:
            tokenized = await request.app.state.triton.tokenize(tokenize)
        except TritonRequestError as e:
            raise APIError.refused(e) from e
        except TritonUnavailable as e:
            raise APIError(503, str(e)) from e
        return {"input_tokens": len(tokenized.ids)}

    return router


class MessageBuilder:
    """Turns the pieces of one generation into Anthropic's stream events and the message they build."""

    def __init__(self, body: MessagesRequest, chat: ChatRequest, settings: ShimSettings) -> None:
        max_calls = 1 if chat.parallel_tool_calls is False else None
        self.parts = AnswerParts(chat, settings, max_calls)
        self.message: dict[str, Any] = {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "model": body.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        self.open: dict | None = None  # the content block still being written
        self.partial_json: dict[int, str] = {}  # a tool_use block's arguments, as they come

    async def stream(self, pieces: AsyncIterator[Piece]) -> AsyncIterator[str]:
        started = False
        try:
            async with aclosing(pieces):
                async for piece in pieces:
                    events = self.events(piece)
                    if not started:
                        started = True
                        yield _sse(self._start())
                        yield _sse({"type": "ping"})
                    for event in events:
                        yield _sse(event)
        except APIError as e:
            yield _sse({"type": "error", "error": {"type": "api_error", "message": e.message}})
            return
        usage = {"output_tokens": self.message["usage"]["output_tokens"]}
        delta = {"stop_reason": self.message["stop_reason"], "stop_sequence": self.message["stop_sequence"]}
        yield _sse({"type": "message_delta", "delta": delta, "usage": usage})
        yield _sse({"type": "message_stop"})

    def _start(self) -> dict:
        started = {**self.message, "content": [], "stop_reason": None, "stop_sequence": None}
        started["usage"] = {**self.message["usage"], "output_tokens": 0}
        return {"type": "message_start", "message": started}

    def events(self, piece: Piece) -> list[dict]:
        """The events of one piece; the last also closes the open block and sets the stop reason and usage."""
        events: list[dict] = []
        delta = piece.delta
        self.message["usage"] = {"input_tokens": delta.num_input_tokens, "output_tokens": delta.num_output_tokens}
        thought, text, calls = self.parts.split(piece)
        if thought:
            events += self._delta("thinking", {"type": "thinking_delta", "thinking": thought})
        if text:
            events += self._delta("text", {"type": "text_delta", "text": text})
        for call in calls:
            events += self._call(call)
        if piece.finish_reason:
            events += self._close()
            called = any(block["type"] == "tool_use" for block in self.message["content"])
            reason = "tool_use" if called else STOP_REASONS.get(piece.finish_reason, "end_turn")
            self.message["stop_reason"] = reason
            self.message["stop_sequence"] = piece.stop if reason == "stop_sequence" else None
        return events

    def _delta(self, kind: str, delta: dict) -> list[dict]:
        events = []
        if self.open is None or self.open["type"] != kind:
            events += self._close()
            events += self._add({"type": kind, kind: "", **({"signature": ""} if kind == "thinking" else {})})
        self.open[kind] += delta[kind]
        events.append({"type": "content_block_delta", "index": self._index(), "delta": delta})
        return events

    def _call(self, call: dict) -> list[dict]:
        events = []
        function = call.get("function") or {}
        if "id" in call:
            events += self._close()
            events += self._add({"type": "tool_use", "id": call["id"], "name": function.get("name", ""), "input": {}})
            self.partial_json[self._index()] = ""
        piece = function.get("arguments") or ""
        if piece and self.open is not None and self.open["type"] == "tool_use":
            self.partial_json[self._index()] += piece
            events.append(
                {
                    "type": "content_block_delta",
                    "index": self._index(),
                    "delta": {"type": "input_json_delta", "partial_json": piece},
                }
            )
        return events

    def _add(self, block: dict) -> list[dict]:
        self.open = block
        self.message["content"].append(block)
        start = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        return [{"type": "content_block_start", "index": self._index(), "content_block": start}]

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        index = self._index()
        if self.open["type"] == "tool_use":
            arguments = self.partial_json.pop(index, "")
            try:
                self.open["input"] = json.loads(arguments) if arguments.strip() else {}
            except (json.JSONDecodeError, RecursionError):
                self.open["input"] = {}  # a call cut off mid-arguments: what there is was streamed as it came
        self.open = None
        return [{"type": "content_block_stop", "index": index}]

    def _index(self) -> int:
        return next(i for i, block in enumerate(self.message["content"]) if block is self.open)


def _sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
