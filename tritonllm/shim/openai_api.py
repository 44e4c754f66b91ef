"""OpenAI routes: /v1/chat/completions, /v1/completions, /v1/models, mapped onto the ensemble's tensors.

/v1/models lists the embedding model too; /v1/embeddings lives in embeddings_api.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..tokenizer.tool_calls import FORMATS, ToolCallFormat, ToolCallParser
from .errors import APIError, json_body
from .generation import STOP_STRING, Piece, generate, primed, until_disconnected
from .settings import ShimSettings
from .triton_client import GenerationRequest, TokenLogprob

UINT64_MAX = (1 << 64) - 1
INT32_MAX = 2147483647
MAX_TEXT_CHARS = 4 * 1024 * 1024  # the specs' limit on a request's text
MAX_TOOLS = 32
OPENAI_FINISH = {"end_id": "stop", STOP_STRING: "stop", "stop_words": "stop", "length": "length"}
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class StreamOptions(BaseModel):
    include_usage: bool | None = False


class SamplingFields(BaseModel):
    """What chat and completions share; ranges as the spec pages give them."""

    model_config = ConfigDict(extra="forbid")

    model: str
    max_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: int | None = None
    seed: Annotated[int, Field(ge=0, le=UINT64_MAX)] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = False
    skip_special_tokens: bool | None = True
    ignore_eos: bool | None = False
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = 1
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None  # token id -> bias
    # Fields of OpenAI's API that cannot change what a text model served here answers: accepted, ignored.
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        if v is not None and v != -1 and not 0 < v <= INT32_MAX:
            raise ValueError("top_k must be -1 or in (0, 2147483647]")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if any(len(s) < 1 for s in stops) or sum(len(s) for s in stops) > 32768:
            raise ValueError("stop strings must be non-empty and 32768 characters at most in total")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v):
        if v is not None and not all(key.isdigit() for key in v):
            raise ValueError("keys must be token ids (strings of digits)")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_token_ids(cls, v):
        return None if v is None else [t for t in v if -(2**31) <= t < 2**31]  # the spec ignores the rest

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    def generation_request(self, default_max_tokens: int, **content: Any) -> GenerationRequest:
        top_k = None if self.top_k is None else (0 if self.top_k == -1 else self.top_k)
        return GenerationRequest(
            max_tokens=self.output_limit or default_max_tokens,
            # a limit the client set must fit after the prompt (OpenAI's 400); the default stops at the context
            max_tokens_must_fit=self.output_limit is not None or None,
            # OpenAI's default temperature is 1.0 (sampling); 0 asks for greedy decoding.
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=top_k,
            top_p=self.top_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            stop_token_ids=self.stop_token_ids or None,
            logit_bias={int(token): bias for token, bias in self.logit_bias.items()} if self.logit_bias else None,
            include_stop_str_in_output=bool(self.include_stop_str_in_output),
            skip_special_tokens=self.skip_special_tokens is not False,
            ignore_eos=bool(self.ignore_eos),
            num_samples=self.n or 1,
            stream=True,  # even for a whole answer: the tokens' arrival times give decode_time_arr
            **content,
        )


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def rendered(self, index: int, where: str = "messages") -> dict:
        """The message as the chat template takes it; errors name it as `where`.index."""
        field = f"{where}.{index}.content"
        if self.role == "tool" and not self.tool_call_id:
            raise APIError(400, f"{where}.{index}.tool_call_id is required for tool messages", field)
        content = self.content
        if isinstance(content, list):
            kinds = {part.get("type") for part in content}
            if kinds - {"text"}:
                raise APIError(400, f"{field}: this model takes text only, not {sorted(kinds - {'text'})}", field)
            content = "".join(str(part.get("text", "")) for part in content)
        if not content and not (self.role == "assistant" and self.tool_calls) and self.role != "tool":
            raise APIError(400, f"{field} must not be empty", field)
        # OpenAI's SDKs send instructions as "developer" for newer models; chat templates know them as "system".
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        if self.tool_calls:
            for call in self.tool_calls:
                function = call.get("function") or {}
                if not isinstance(function.get("name"), str) or not isinstance(function.get("arguments"), str):
                    raise APIError(400, f"{where}.{index}.tool_calls: each needs function.name and arguments")
            # The template renders arguments as an object; OpenAI sends them as a JSON string.
            out["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": _json_or_text(c["function"]["arguments"])}}
                for c in self.tool_calls
            ]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class FunctionObject(BaseModel):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = False


class ToolObject(BaseModel):
    type: Literal["function"]
    function: FunctionObject


class JsonSchemaObject(BaseModel):
    name: str
    description: str | None = None
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    strict: bool | None = False


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaObject | None = None


class ChatRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(gt=0, le=INT32_MAX)] | None = None  # max_tokens' new name
    # Deprecated spellings of tools and tool_choice, still in the API reference.
    functions: Annotated[list[FunctionObject], Field(max_length=MAX_TOOLS)] | None = None
    function_call: Literal["none", "auto"] | dict[str, Any] | None = None
    # Accepted and ignored: they cannot change a text model's answer here.
    reasoning_effort: str | None = None
    verbosity: str | None = None
    prediction: dict[str, Any] | None = None
    # They would change the answer, and cannot be honoured: refused when they ask for something.
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def check(self) -> None:
        if self.modalities and set(self.modalities) - {"text"}:
            raise APIError(400, f"modalities: this model answers in text only, not {self.modalities}", "modalities")
        for name in ("audio", "web_search_options"):
            if getattr(self, name) is not None:
                raise APIError(400, f"{name}: this server cannot honour it", name)
        if self.functions:
            if self.tools:
                raise APIError(400, "give tools or the deprecated functions, not both", "functions")
            self.tools = [ToolObject(type="function", function=f) for f in self.functions]
            if self.function_call is not None and self.tool_choice is None:
                call = self.function_call
                self.tool_choice = call if isinstance(call, str) else {"type": "function", "function": call}

    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: Annotated[list[ToolObject], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # false: at most one call
    response_format: ResponseFormat | None = None

    def forced_tools(self) -> tuple[list[dict], bool] | None:
        """The functions a call must be made to, and whether several calls may follow; None when not forced."""
        choice, functions = self.tool_choice, self.tool_functions()
        if choice == "required":
            if not functions:
                raise APIError(400, "tool_choice 'required' needs tools", "tool_choice")
            return functions, self.parallel_tool_calls is not False
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            named = [f for f in functions if f["name"] == name]
            if choice.get("type") != "function" or not named:
                raise APIError(400, f"tool_choice names no function among tools: {name!r}", "tool_choice")
            return named, False
        return None

    def tool_functions(self) -> list[dict]:
        return [t.function.model_dump(exclude_none=True) for t in self.tools or []]

    def tools_active(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def guide(self, tool_format: ToolCallFormat) -> tuple[str, str] | None:
        forced = self.forced_tools()
        fmt = self.response_format
        if forced is not None:
            if fmt and fmt.type != "text":
                raise APIError(400, "response_format cannot be combined with a forced tool_choice", "response_format")
            return "lark", tool_format.grammar(*forced)
        if fmt is None or fmt.type == "text":
            if self.tools_active() and tool_format.guards_auto:
                several = self.parallel_tool_calls is not False
                return "lark", tool_format.grammar(self.tool_functions(), several, or_text=True)
            return None
        if fmt.type == "json_object":
            return "json", ""
        if fmt.json_schema is None:
            raise APIError(400, "response_format.json_schema is required for type json_schema", "response_format")
        return "json_schema", json.dumps(fmt.json_schema.schema_)


TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class CompletionRequest(SamplingFields):
    # text, texts, token ids, or lists of token ids (lm-eval's tokenized requests); one choice set per prompt
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: Annotated[int, Field(ge=0, le=INT32_MAX)] | None = None  # 0 only with echo: the prompt alone
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool | None = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=128)] | None = None
    use_beam_search: bool | None = False
    error_behavior: Literal["truncate", "error"] | None = "error"
    use_raw_prompt: bool | None = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        prompts = [v] if isinstance(v, str) or (v and isinstance(v[0], int)) else v
        if not prompts or any(not p for p in prompts):
            raise ValueError("prompt must be a non-empty string or token-id list, or a list of them")
        return prompts

    def check(self) -> None:
        """The completions page's rules for n, best_of and beam search; max_tokens 0 only to echo the prompt."""
        if self.max_tokens == 0 and not self.echo:
            raise APIError(
                400, "max_tokens: 0 is only allowed with echo (the prompt's log-probabilities)", "max_tokens"
            )
        n, best_of = self.n or 1, self.best_of
        if self.use_beam_search:
            if self.stop:
                raise APIError(400, "use_beam_search cannot be combined with stop", "use_beam_search")
            return
        sampling = self.temperature is None or self.temperature > 0
        if (n > 1 or (best_of or 1) > 1) and not sampling:
            raise APIError(400, "n and best_of > 1 need temperature > 0", "temperature")
        if self.stream and best_of is not None and best_of != n:
            raise APIError(400, "when streaming, best_of must equal n", "best_of")
        if best_of is not None and best_of < n:
            raise APIError(400, f"best_of ({best_of}) must be >= n ({n})", "best_of")


@dataclass
class Choice:
    """What one choice has gathered: its text, end, log-probs and timings."""

    text: str = ""
    finish_reason: str | None = None
    stop: str | int | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_text: str | None = None  # asked for by completions' echo
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    arrivals: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    queue_waits: list[int] = field(default_factory=list)

    def add(self, piece: Piece) -> None:
        chunk = piece.chunk
        self.text += piece.text
        self.logprobs += chunk.logprobs
        if chunk.prompt_text is not None:
            self.prompt_text, self.prompt_logprobs = chunk.prompt_text, chunk.prompt_logprobs
        self.prompt_tokens, self.completion_tokens = chunk.num_input_tokens, chunk.num_output_tokens
        self.arrivals.append(chunk.arrived)
        # Per token: the batch it was generated in, and the time it waited in the queue (only the first did).
        for _ in range(max(chunk.num_tokens, 1)):
            self.batch_sizes.append(chunk.batch_size)
            self.queue_waits.append(0 if len(self.queue_waits) else chunk.queue_wait_us)
        if piece.finish_reason:
            self.finish_reason, self.stop = piece.finish_reason, piece.stop

    @property
    def cum_logprob(self) -> float:
        return sum(t.logprob for t in self.logprobs)


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


async def _pieces(client, gens: list[GenerationRequest], stops: list[str], include_stop: bool, per: int):
    """(choice index, piece) from several generations at once; choice = generation * `per` + sample index."""
    if len(gens) == 1:
        async with aclosing(generate(client, gens[0], stops, include_stop)) as pieces:
            async for piece in pieces:
                for one in _beams_of(piece):
                    yield one.index, one
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen: GenerationRequest) -> None:
        try:
            async for piece in generate(client, gen, stops, include_stop):
                for one in _beams_of(piece):
                    await queue.put((i * per + one.index, one))
        except APIError as e:
            await queue.put(e)
        finally:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(gens)]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, APIError):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


def _beams_of(piece: Piece) -> list[Piece]:
    """A beam search's final piece holds every beam's text: one piece per beam, as if they were samples."""
    texts = piece.chunk.texts
    if len(texts) == 1:
        return [piece]
    return [
        dataclasses.replace(
            piece,
            text=text,
            chunk=dataclasses.replace(piece.chunk, texts=[text], index=j, logprobs=[] if j else piece.chunk.logprobs),
        )
        for j, text in enumerate(texts)
    ]


def build_router(settings: ShimSettings) -> APIRouter:
    router = APIRouter()

    def check_model(name: str) -> None:
        if name == settings.embedding_model_name:
            raise APIError(400, f"model {name!r} only embeds; use /v1/embeddings", "model")
        check_served_model(settings, name)

    async def run(request: Request, body: SamplingFields, gens: list[GenerationRequest], render: _Render) -> Any:
        client = request.app.state.triton
        include = bool(body.include_stop_str_in_output)
        per = gens[0].num_samples
        if body.stream and not render.whole_only:
            pieces = await until_disconnected(request, primed(_pieces(client, gens, body.stop or [], include, per)))
            return StreamingResponse(render.stream(pieces), media_type="text/event-stream")

        async def collect() -> list[Choice]:
            choices = [Choice() for _ in range(len(gens) * per)]
            async with aclosing(_pieces(client, gens, body.stop or [], include, per)) as pieces:
                async for index, piece in pieces:
                    choices[index].add(piece)
            return choices

        choices = await until_disconnected(request, collect())
        if body.stream:  # beam search streams "fake": every choice in one event
            return StreamingResponse(render.whole_stream(choices), media_type="text/event-stream")
        return JSONResponse(render.whole(choices))

    cards = {
        name: {"id": name, "object": "model", "created": settings.started, "owned_by": "tritonllm"}
        for name in (settings.served_model_name, settings.embedding_model_name)
    }

    @router.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": list(cards.values())}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        if model_id not in cards:
            raise APIError(404, f"model {model_id!r} does not exist; this server has {sorted(cards)}", "model")
        return cards[model_id]

    @router.post("/v1/chat/completions")
    async def chat(request: Request, body: ChatBody) -> Any:
        check_model(body.model)
        return await run(request, body, [chat_generation(body, settings)], ChatRender(body, settings))

    @router.post("/v1/completions")
    async def completions(request: Request, body: CompletionBody) -> Any:
        check_model(body.model)
        body.check()
        check_size(sum(len(p) for p in body.prompt), "prompt")
        gens = []
        for prompt in body.prompt:
            gen = body.generation_request(
                settings.default_max_tokens,
                **({"text": prompt} if isinstance(prompt, str) else {"prompt_ids": prompt}),
                use_raw_prompt=bool(body.use_raw_prompt) or None,
                truncate_prompt=body.error_behavior == "truncate" or None,
            )
            n = body.n or 1
            if body.use_beam_search:
                gen.beam_width, gen.num_samples, gen.temperature = max(n, body.best_of or n, 2), n, None
            elif (body.best_of or n) > n:
                gen.num_samples, gen.logprobs = body.best_of, True  # the best n by cumulative log-prob
            if body.logprobs is not None:
                gen.logprobs, gen.top_logprobs = True, body.logprobs
                gen.prompt_logprobs = bool(body.echo) or None
            if body.echo and not isinstance(prompt, str):
                gen.prompt_logprobs = True  # they bring the prompt's text back too, which echo shows
            if body.max_tokens == 0:
                gen.max_tokens = 1
            gens.append(gen)
        return await run(request, body, gens, CompletionRender(body, settings))

    return router


def check_served_model(settings: ShimSettings, name: str) -> None:
    """A 404 naming the served model unless `name` is it."""
    if name != settings.served_model_name:
        raise APIError(404, f"model {name!r} does not exist; this server has {settings.served_model_name!r}", "model")


def chat_generation(body: ChatRequest, settings: ShimSettings, where: str = "messages") -> GenerationRequest:
    """The ensemble request of a chat: its messages rendered, its tools and its guide; errors name `where`."""
    body.check()
    messages = [m.rendered(i, where) for i, m in enumerate(body.messages)]
    check_size(sum(len(m["content"]) for m in messages), where)
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    return body.generation_request(
        settings.default_max_tokens,
        messages=messages,
        tools=[t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None,
        guide=body.guide(FORMATS[settings.tool_call_parser]),
        logprobs=bool(body.logprobs) or None,
        top_logprobs=body.top_logprobs if body.logprobs else None,
    )


def check_size(chars: int, field_name: str) -> None:
    if chars > MAX_TEXT_CHARS:
        raise APIError(413, f"{field_name} has {chars} characters; at most {MAX_TEXT_CHARS} (4 MB) are allowed")


ChatBody = Annotated[ChatRequest, Depends(json_body(ChatRequest))]
CompletionBody = Annotated[CompletionRequest, Depends(json_body(CompletionRequest))]


def _usage(choices: list[Choice], prompts: int = 1) -> dict:
    per = max(len(choices) // prompts, 1)
    prompt = sum(c.prompt_tokens for c in choices[::per])
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _Render:
    object_whole: str
    object_chunk: str
    prefix: str
    whole_only = False  # True: even a streaming request gets all choices at once

    def __init__(self, body: SamplingFields, settings: ShimSettings) -> None:
        self.body = body
        self.full_text = settings.full_text_enabled
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.start = time.monotonic()

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
        options = self.body.stream_options
        return bool(options and options.include_usage)

    def timings(self, choice: Choice) -> dict:
        """The spec's prefill_time (first token) and decode_time_arr (between tokens), in milliseconds."""
        times = [self.start, *choice.arrivals]
        gaps = [round((b - a) * 1000, 3) for a, b in zip(times, times[1:], strict=False)]
        return {"prefill_time": gaps[0] if gaps else None, "decode_time_arr": gaps[1:]}

    async def stream(self, pieces) -> AsyncIterator[str]:
        choices: dict[int, Choice] = {}
        try:
            async with aclosing(pieces):
                async for index, piece in pieces:
                    if index not in choices:
                        choices[index] = Choice()
                        for opening in self.opening(index):
                            yield _sse(opening)
                    choice = choices[index]
                    choice.add(piece)
                    for event in self.events(index, piece, choice):
                        yield _sse(event)
        except APIError as e:
            yield _sse(e.body())
            return
        ordered = [choices[i] for i in sorted(choices)]
        if ordered and self.include_usage():
            yield _sse(self.envelope(self.object_chunk, [], usage=self.usage(ordered)))
        yield _sse("[DONE]")

    async def whole_stream(self, choices: list[Choice]) -> AsyncIterator[str]:
        yield _sse({**self.whole(choices), "object": self.object_chunk})
        yield _sse("[DONE]")

    def usage(self, choices: list[Choice]) -> dict:
        return _usage(choices)

    def opening(self, index: int) -> list[dict]:
        return []


class ChatRender(_Render):
    object_whole, object_chunk, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(self, body: ChatRequest, settings: ShimSettings) -> None:
        super().__init__(body, settings)
        self.tools = body.tools_active()
        self.tool_format = FORMATS[settings.tool_call_parser]
        self.max_calls = 1 if body.parallel_tool_calls is False or isinstance(body.tool_choice, dict) else None
        # OpenAI ends a call forced by name with "stop", any other with "tool_calls"
        self.calls_finish = "stop" if isinstance(body.tool_choice, dict) else "tool_calls"
        self.parsers: dict[int, ToolCallParser] = {}  # per choice: content streams until a tool call opens
        self.shown: dict[int, str] = {}  # per choice: the content streamed so far

    def new_parser(self) -> ToolCallParser:
        return ToolCallParser(self.tool_format, self.max_calls)

    def opening(self, index: int) -> list[dict]:
        delta = {"role": "assistant", "content": ""}
        return [
            self.envelope(
                self.object_chunk, [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]
            )
        ]

    def split(self, parser: ToolCallParser, text: str, finish_reason: str | None) -> tuple[str, list[dict]]:
        """Content and tool-call deltas of new text; with tools off, all of it is content."""
        if not self.tools:
            return text, []
        content, calls = parser.feed(text)
        if finish_reason:
            rest, more = parser.finish(cut_off=finish_reason == "length")
            content, calls = content + rest, calls + more
        return content, calls

    def finish_reason(self, reason: str, parser: ToolCallParser) -> str:
        finish = OPENAI_FINISH[reason]
        return self.calls_finish if finish == "stop" and self.tools and parser.has_complete_call else finish

    def events(self, index: int, piece: Piece, choice: Choice) -> list[dict]:
        parser = self.parsers.setdefault(index, self.new_parser())
        text, calls = self.split(parser, piece.text, piece.finish_reason)
        self.shown[index] = self.shown.get(index, "") + text
        delta: dict[str, Any] = {}
        if self.full_text and (text or piece.finish_reason):
            delta["content"] = self.shown[index]
        elif text:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = calls
        finish = self.finish_reason(piece.finish_reason, parser) if piece.finish_reason else None
        if not delta and not finish and not piece.chunk.logprobs:
            return []
        out = {"index": index, "delta": delta, "logprobs": self.logprobs(piece.chunk.logprobs), "finish_reason": finish}
        extra: dict[str, Any] = {}
        if finish and self.full_text:
            extra["full_text"] = choice.text
        if finish and not self.include_usage():
            extra["usage"] = _usage([choice])
        return [self.envelope(self.object_chunk, [out], **extra)]

    def logprobs(self, tokens) -> dict | None:
        if not self.body.logprobs:
            return None

        def entry(token: str, logprob: float) -> dict:
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

        return {
            "content": [
                {**entry(t.token, t.logprob), "top_logprobs": [entry(tok, lp) for tok, lp in t.top]} for t in tokens
            ]
        }

    def whole(self, choices: list[Choice]) -> dict:
        out = []
        for index, choice in enumerate(choices):
            parser = self.new_parser()
            content, _ = self.split(parser, choice.text, choice.finish_reason)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if parser.tool_calls():
                message = {"role": "assistant", "content": content or None, "tool_calls": parser.tool_calls()}
            finish = self.finish_reason(choice.finish_reason, parser)
            out.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": self.logprobs(choice.logprobs),
                    "finish_reason": finish,
                }
            )
        return self.envelope(self.object_whole, out, usage=_usage(choices), **self.timings(choices[0]))


class CompletionRender(_Render):
    object_whole, object_chunk, prefix = "text_completion", "text_completion", "cmpl"

    def __init__(self, body: CompletionRequest, settings: ShimSettings) -> None:
        super().__init__(body, settings)
        self.whole_only = bool(body.use_beam_search)
        self.per = body.n or 1
        # max_tokens 0 with echo: the prompt and its log-probabilities alone (how lm-eval scores a continuation);
        # the engine generates one token, which no one sees
        self.prompt_only = body.max_tokens == 0
        self.offsets: dict[int, int] = {}  # per choice: where its next logprobs token starts in its text
        self.echoed: set[int] = set()

    def echo_of(self, index: int, prompt_text: str | None) -> str:
        """The prompt of choice `index` as text; one given as token ids comes back as text from the engine."""
        prompt = self.body.prompt[index // self.per]
        return prompt if isinstance(prompt, str) else prompt_text or ""

    def generated(self, text: str, tokens: list[TokenLogprob]) -> tuple[str, list[TokenLogprob]]:
        return ("", []) if self.prompt_only else (text, tokens)

    def events(self, index: int, piece: Piece, choice: Choice) -> list[dict]:
        text, tokens = self.generated(piece.text, piece.chunk.logprobs)
        if self.body.echo and index not in self.echoed:
            self.echoed.add(index)
            text, tokens = self.echo_of(index, piece.chunk.prompt_text) + text, piece.chunk.prompt_logprobs + tokens
        if piece.finish_reason and self.body.suffix:
            text += self.body.suffix
        if self.full_text:
            text = (self.echo_of(index, choice.prompt_text) if self.body.echo else "") + self.generated(
                choice.text, []
            )[0]
        if not text and not piece.finish_reason:
            return []
        out = {
            "index": index,
            "text": text,
            "logprobs": self.logprobs(index, tokens),
            "finish_reason": self.finish_reason(piece.finish_reason) if piece.finish_reason else None,
            "stop_reason": piece.stop,
        }
        extra = {"usage": self.usage([choice])} if piece.finish_reason and not self.include_usage() else {}
        return [self.envelope(self.object_chunk, [out], **extra)]

    def finish_reason(self, reason: str) -> str:
        return "length" if self.prompt_only else OPENAI_FINISH[reason]

    def usage(self, choices: list[Choice]) -> dict:
        longest = max(choices, key=lambda c: len(c.batch_sizes))
        counts = _usage(choices, len(self.body.prompt))
        if self.prompt_only:
            counts = {**counts, "completion_tokens": 0, "total_tokens": counts["prompt_tokens"]}
        return {
            **counts,
            "batch_size": longest.batch_sizes,
            "queue_wait_time": longest.queue_waits,
        }

    def logprobs(self, index: int, tokens) -> dict | None:
        if self.body.logprobs is None:
            return None
        offset = self.offsets.get(index, 0)  # with echo, the tokens start with the prompt's
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t.token)
        self.offsets[index] = offset
        return {
            "text_offset": offsets,
            "token_logprobs": [t.logprob for t in tokens],
            "tokens": [t.token for t in tokens],
            # the prompt's first token has no log-probability, nor alternatives
            "top_logprobs": [None if t.logprob is None else dict(t.top) for t in tokens]
            if self.body.logprobs
            else None,
        }

    def whole(self, choices: list[Choice]) -> dict:
        n, per_prompt = self.body.n or 1, len(choices) // len(self.body.prompt)
        chosen = []
        for p in range(len(self.body.prompt)):
            group = choices[p * per_prompt : (p + 1) * per_prompt]
            if per_prompt > n:  # best_of: the n with the highest cumulative log-probability
                group = sorted(group, key=lambda c: -c.cum_logprob)[:n]
            chosen += group
        out = []
        for index, choice in enumerate(chosen):
            text, tokens = self.generated(choice.text, choice.logprobs)
            if self.body.echo:
                text, tokens = self.echo_of(index, choice.prompt_text) + text, choice.prompt_logprobs + tokens
            out.append(
                {
                    "index": index,
                    "text": text + (self.body.suffix or ""),
                    "logprobs": self.logprobs(index, tokens),
                    "finish_reason": self.finish_reason(choice.finish_reason),
                    "stop_reason": choice.stop,
                }
            )
        return self.envelope(self.object_whole, out, usage=self.usage(chosen), **self.timings(chosen[0]))
