"""Chat and completions served: a request body mapped onto ensemble requests, the generated pieces rendered as
OpenAI's chunks or whole responses."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from tritonllm.shim.errors import APIError
from tritonllm.shim.generation import STOP_STRING, Piece, generate
from tritonllm.shim.openai_protocol import MAX_TEXT_CHARS, ChatRequest, CompletionRequest, SamplingFields
from tritonllm.shim.settings import ShimSettings
from tritonllm.shim.triton_requests import GenerationRequest
from tritonllm.shim.triton_responses import TokenLogprob
from tritonllm.tokenizer import reasoning
from tritonllm.tokenizer.reasoning import ThinkingSplit
from tritonllm.tokenizer.tool_calls import FORMATS, ToolCallParser

OPENAI_FINISH = {"end_id": "stop", STOP_STRING: "stop", "stop_words": "stop", "length": "length"}


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
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # each response's arrival and its tokens
    batch_sizes: list[int] = field(default_factory=list)
    queue_waits: list[int] = field(default_factory=list)
    # a reasoning model's: its thinking apart from its answer, and the last piece's share of each
    thinking: ThinkingSplit | None = None
    reasoning: str = ""
    content: str = ""
    last_split: tuple[str, str] = ("", "")

    def add(self, piece: Piece) -> None:
        delta = piece.delta
        self.text += piece.text
        if self.thinking is not None:
            final = bool(piece.finish_reason)
            thought, said = self.thinking.feed(piece.text, delta.token_texts, delta.num_tokens, final)
            self.reasoning, self.content = self.reasoning + thought, self.content + said
            self.last_split = (thought, said)
        self.logprobs += delta.logprobs
        if delta.prompt_text is not None:
            self.prompt_text, self.prompt_logprobs = delta.prompt_text, delta.prompt_logprobs
        self.prompt_tokens, self.completion_tokens = delta.num_input_tokens, delta.num_output_tokens
        self.accepted_prediction_tokens = delta.accepted_prediction_tokens
        self.rejected_prediction_tokens = delta.rejected_prediction_tokens
        self.arrivals.append((delta.arrived, delta.num_tokens))
        # Per token: the batch it was generated in, and the time it waited in the queue (only the first did).
        for _ in range(max(delta.num_tokens, 1)):
            self.batch_sizes.append(delta.batch_size)
            self.queue_waits.append(0 if len(self.queue_waits) else delta.queue_wait_us)
        if piece.finish_reason:
            self.finish_reason, self.stop = piece.finish_reason, piece.stop

    @property
    def cum_logprob(self) -> float:
        return sum(t.logprob for t in self.logprobs)


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


async def generated_pieces(client, gens: list[GenerationRequest], stops: list[str], include_stop: bool, per: int):
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
    texts = piece.delta.texts
    if len(texts) == 1:
        return [piece]
    return [
        dataclasses.replace(
            piece,
            text=text,
            delta=dataclasses.replace(piece.delta, texts=[text], index=j, logprobs=[] if j else piece.delta.logprobs),
        )
        for j, text in enumerate(texts)
    ]


def chat_generation(body: ChatRequest, settings: ShimSettings, where: str = "messages") -> GenerationRequest:
    """The ensemble request of a chat: its messages rendered, its tools and its guide; errors name `where`."""
    body.check()
    messages = [m.rendered(i, where) for i, m in enumerate(body.messages)]
    check_size(sum(len(m["content"]) for m in messages), where)
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    prediction = body.prediction.text() if body.prediction else None
    check_size(len(prediction or ""), "prediction")
    if body.chat_template is not None and not settings.trust_request_chat_template:
        raise APIError(
            400,
            "chat_template: this server renders chats with the model's own template; a request's template needs "
            "the server started with --trust-request-chat-template",
            "chat_template",
        )
    guide = body.guide(FORMATS[settings.tool_call_parser])
    return body.generation_request(
        settings.default_max_tokens,
        messages=messages,
        tools=[t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None,
        guide=guide,
        **thinking_fields(body, settings, guide),
        logprobs=bool(body.logprobs) or None,
        top_logprobs=body.top_logprobs if body.logprobs else None,
        prediction=prediction,
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message or None,
        chat_template_kwargs=body.template_variables() or None,
        chat_template=body.chat_template,
    )


def thinking_fields(body: ChatRequest, settings: ShimSettings, guide: tuple[str, str] | None) -> dict[str, Any]:
    """The engine follows a reasoning model's thinking block where it must: to cut it short (a budget), or to keep a
    grammar for the answer (unless --guide-reasoning has the grammar hold the thinking too)."""
    starts_inside = reasoning.answer_starts_inside(settings.reasoning_parser, body.chat_template_kwargs)
    thinks = starts_inside is not None
    budget = thinking_budget(body, settings, thinks)
    guides_thinking = guide is not None and settings.guide_reasoning
    if guides_thinking and budget is not None:
        if body.max_thinking_tokens is not None:
            raise APIError(
                400,
                "max_thinking_tokens cannot be combined with constrained decoding on this server (--guide-reasoning)",
                "max_thinking_tokens",
            )
        budget = None
    follow = thinks and (budget is not None or (guide is not None and not guides_thinking))
    return {"thinking_budget": budget, "thinking_open": starts_inside if follow else None}


def thinking_budget(body: ChatRequest, settings: ShimSettings, thinks: bool) -> int | None:
    """The chat's max_thinking_tokens, else the server's --reasoning-budget; `thinks`: the model has a
    reasoning format (a budget for a model that writes no thinking block is a 400)."""
    if body.max_thinking_tokens is None:
        return settings.reasoning_budget if thinks and settings.reasoning_budget >= 0 else None
    if not thinks:
        raise APIError(400, "max_thinking_tokens: the model's answers have no thinking block", "max_thinking_tokens")
    return body.max_thinking_tokens


def check_size(chars: int, field_name: str) -> None:
    if chars > MAX_TEXT_CHARS:
        raise APIError(413, f"{field_name} has {chars} characters; at most {MAX_TEXT_CHARS} (4 MB) are allowed")


def _usage(choices: list[Choice], prompts: int = 1) -> dict:
    per = max(len(choices) // prompts, 1)
    prompt = sum(c.prompt_tokens for c in choices[::per])
    completion = sum(c.completion_tokens for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Render:
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
        """The spec's prefill_time (to the first token) and decode_time_arr (one entry a token after the first), in
        milliseconds. Tokens that came in one response (the server merges a stream's tokens when its sender falls
        behind) share its gap since the one before; those that came with the first token, 0."""
        prefill, decode, before = None, [], None
        for arrived, tokens in (a for a in choice.arrivals if a[1]):
            if before is None:
                prefill, decode = round((arrived - self.start) * 1000, 3), [0.0] * (tokens - 1)
            else:
                decode += [round((arrived - before) * 1000 / tokens, 3)] * tokens
            before = arrived
        return {"prefill_time": prefill, "decode_time_arr": decode}

    def new_choice(self) -> Choice:
        return Choice()

    async def stream(self, pieces) -> AsyncIterator[str]:
        choices: dict[int, Choice] = {}
        try:
            async with aclosing(pieces):
                async for index, piece in pieces:
                    if index not in choices:
                        choices[index] = self.new_choice()
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


class ChatRender(Render):
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
        self.echoed = body.echoed()
        # whether each answer starts inside the thinking block; None: the model does not think
        self.starts_thinking = reasoning.answer_starts_inside(settings.reasoning_parser, body.chat_template_kwargs)

    def new_choice(self) -> Choice:
        thinking = None if self.starts_thinking is None else ThinkingSplit(self.starts_thinking)
        return Choice(thinking=thinking)

    def new_parser(self) -> ToolCallParser:
        return ToolCallParser(self.tool_format, self.max_calls)

    def opening(self, index: int) -> list[dict]:
        self.shown[index] = self.echoed
        delta = {"role": "assistant", "content": self.echoed}
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
        thought, said = choice.last_split if choice.thinking is not None else ("", piece.text)
        text, calls = self.split(parser, said, piece.finish_reason)
        self.shown[index] = self.shown.get(index, "") + text
        delta: dict[str, Any] = {}
        if thought:
            delta["reasoning_content"] = thought
        if self.full_text and (text or piece.finish_reason):
            delta["content"] = self.shown[index]
        elif text:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = calls
        finish = self.finish_reason(piece.finish_reason, parser) if piece.finish_reason else None
        if not delta and not finish and not piece.delta.logprobs:
            return []
        out = {"index": index, "delta": delta, "logprobs": self.logprobs(piece.delta.logprobs), "finish_reason": finish}
        extra: dict[str, Any] = {}
        if finish and self.full_text:
            extra["full_text"] = choice.text
        if finish and not self.include_usage():
            extra["usage"] = self.usage([choice])
        return [self.envelope(self.object_chunk, [out], **extra)]

    def logprobs(self, tokens) -> dict | None:
        if not self.body.logprobs:
            return None

        def entry(token: str, logprob: float) -> dict:
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

        return {
            "content": [
                {**entry(t.token, t.logprob), "top_logprobs": [entry(tok, lp) for tok, lp in t.top]}
                for t in self.body.named(tokens)
            ]
        }

    def whole(self, choices: list[Choice]) -> dict:
        out = []
        for index, choice in enumerate(choices):
            parser = self.new_parser()
            said = choice.content if choice.thinking is not None else choice.text
            content, _ = self.split(parser, said, choice.finish_reason)
            content = self.echoed + content
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if parser.tool_calls():
                message = {"role": "assistant", "content": content or None, "tool_calls": parser.tool_calls()}
            if choice.thinking is not None:
                message["reasoning_content"] = choice.reasoning or None
            finish = self.finish_reason(choice.finish_reason, parser)
            out.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": self.logprobs(choice.logprobs),
                    "finish_reason": finish,
                }
            )
        return self.envelope(self.object_whole, out, usage=self.usage(choices), **self.timings(choices[0]))

    def usage(self, choices: list[Choice]) -> dict:
        counts = _usage(choices)
        details = {}
        if self.starts_thinking is not None:
            details["reasoning_tokens"] = sum(c.thinking.reasoning_tokens for c in choices if c.thinking)
        if self.body.prediction is not None:
            details["accepted_prediction_tokens"] = sum(c.accepted_prediction_tokens for c in choices)
            details["rejected_prediction_tokens"] = sum(c.rejected_prediction_tokens for c in choices)
        return {**counts, "completion_tokens_details": details} if details else counts


class CompletionRender(Render):
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
        text, tokens = self.generated(piece.text, piece.delta.logprobs)
        if self.body.echo and index not in self.echoed:
            self.echoed.add(index)
            text, tokens = self.echo_of(index, piece.delta.prompt_text) + text, piece.delta.prompt_logprobs + tokens
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
        tokens = self.body.named(tokens)
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
