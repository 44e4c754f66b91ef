"""What chat and completions share as they are served: the generated pieces of a request's generations, each
choice's text and counters, and the rendering into OpenAI's chunks or whole responses."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from tritonllm.shim.errors import APIError
from tritonllm.shim.generation import STOP_STRING, Piece, generate
from tritonllm.shim.openai_protocol import MAX_TEXT_CHARS, SamplingFields
from tritonllm.shim.settings import ShimSettings
from tritonllm.shim.triton_requests import GenerationRequest
from tritonllm.shim.triton_responses import TokenLogprob
from tritonllm.tokenizer.reasoning import ThinkingSplit

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
    prompt_ids: list[int] | None = None  # asked for by return_token_ids
    token_ids: list[int] = field(default_factory=list)
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
        self.token_ids += delta.token_ids
        if delta.prompt_ids is not None:
            self.prompt_ids = delta.prompt_ids
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


def sse(payload: dict | str) -> str:
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


def check_size(chars: int, field_name: str) -> None:
    if chars > MAX_TEXT_CHARS:
        raise APIError(413, f"{field_name} has {chars} characters; at most {MAX_TEXT_CHARS} (4 MB) are allowed")


def usage_of(choices: list[Choice], prompts: int = 1) -> dict:
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

    def usage_chunk(self) -> bool:
        """Whether a stream ends with a chunk of its own for the usage (stream_options.include_usage)."""
        options = self.body.stream_options
        return bool(options and options.include_usage)

    def usage_on_finish(self) -> bool:
        """Whether a choice's last chunk carries its usage: unless stream_options says where usage goes."""
        options = self.body.stream_options
        return options is None or options.include_usage is None

    def continuous_usage(self) -> bool:
        """vLLM's continuous_usage_stats: every chunk carries the usage so far (with include_usage)."""
        options = self.body.stream_options
        return self.usage_chunk() and bool(options.continuous_usage_stats)

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
                    opened = index in choices
                    choice = choices.setdefault(index, self.new_choice())
                    choice.add(piece)
                    opening = [] if opened else self.opening(index, choice)
                    events = self.events(index, piece, choice)
                    if self.continuous_usage():
                        for event in opening:
                            event["usage"] = self.usage_before_tokens(choice)
                        for event in events:
                            event["usage"] = self.usage([choice])
                    for event in opening + events:
                        yield sse(event)
        except APIError as e:
            yield sse(e.body())
            return
        ordered = [choices[i] for i in sorted(choices)]
        if ordered and self.usage_chunk():
            yield sse(self.envelope(self.object_chunk, [], usage=self.usage(ordered)))
        yield sse("[DONE]")

    async def whole_stream(self, choices: list[Choice]) -> AsyncIterator[str]:
        yield sse({**self.whole(choices), "object": self.object_chunk})
        yield sse("[DONE]")

    def usage(self, choices: list[Choice]) -> dict:
        return usage_of(choices)

    def usage_before_tokens(self, choice: Choice) -> dict:
        """The usage a chunk before the choice's first tokens carries (vLLM's role chunk): its prompt, no completion
        tokens yet; the chunks that carry them count 1, 2, ..."""
        prompt = self.usage([choice])["prompt_tokens"]
        return {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt}

    def opening(self, index: int, choice: Choice) -> list[dict]:
        """The chunks before a choice's first."""
        return []
