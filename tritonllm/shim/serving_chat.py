"""Chat completions served: a body's messages mapped onto an ensemble request, the pieces rendered as
chat.completion chunks or a whole response (tool calls and the reasoning block parsed out of the text)."""

from __future__ import annotations

from typing import Any

from tritonllm.shim.errors import APIError
from tritonllm.shim.generation import Piece
from tritonllm.shim.openai_protocol import ChatRequest, text_chars
from tritonllm.shim.serving_base import OPENAI_FINISH, Choice, Render, check_size, usage_of
from tritonllm.shim.settings import ShimSettings
from tritonllm.shim.triton_requests import GenerationRequest
from tritonllm.tokenizer import reasoning
from tritonllm.tokenizer.reasoning import ThinkingSplit
from tritonllm.tokenizer.tool_calls import FORMATS, ToolCallParser


def chat_generation(body: ChatRequest, settings: ShimSettings, where: str = "messages") -> GenerationRequest:
    """The ensemble request of a chat: its messages rendered, its tools and its guide; errors name `where`."""
    body.check()
    messages = [m.rendered(i, where, settings.media) for i, m in enumerate(body.messages)]
    check_size(sum(text_chars(m["content"]) for m in messages), where)
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
    gen = body.generation_request(
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
        add_special_tokens=body.add_special_tokens or None,
        chat_template_kwargs=body.template_variables() or None,
        chat_template=body.chat_template,
    )
    return body.applied(gen)


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

    def opening(self, index: int, choice: Choice) -> list[dict]:
        self.shown[index] = self.echoed
        delta = {"role": "assistant", "content": self.echoed}
        extra = {"prompt_token_ids": choice.prompt_ids} if self.body.return_token_ids else {}
        return [
            self.envelope(
                self.object_chunk,
                [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}],
                **extra,
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
        token_ids = piece.delta.token_ids if self.body.return_token_ids else []
        if not delta and not finish and not piece.delta.logprobs and not token_ids:
            return []
        out = {"index": index, "delta": delta, "logprobs": self.logprobs(piece.delta.logprobs), "finish_reason": finish}
        if self.body.return_token_ids:
            out["token_ids"] = token_ids
        extra: dict[str, Any] = {}
        if finish and self.full_text:
            extra["full_text"] = choice.text
        if finish and self.usage_on_finish():
            extra["usage"] = self.usage([choice])
        return [self.envelope(self.object_chunk, [out], **extra)]

    def logprobs(self, tokens) -> dict | None:
        if not self.body.logprobs:
            return None

        def entry(token: str, logprob: float) -> dict:
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

        k = self.body.top_logprobs or 0  # the wire may carry more, for prompt_logprobs
        return {
            "content": [
                {**entry(t.token, t.logprob), "top_logprobs": [entry(tok, lp) for tok, lp in t.top[:k]]}
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
                    # vLLM's extension fields are null when not asked for (the SDK then reads them as None)
                    "token_ids": choice.token_ids if self.body.return_token_ids else None,
                }
            )
        extra: dict[str, Any] = {"prompt_logprobs": None, "prompt_token_ids": None}
        if self.body.prompt_logprobs is not None:
            extra["prompt_logprobs"] = self.body.prompt_logprobs_of(choices[0].prompt_logprobs)
        if self.body.return_token_ids:
            extra["prompt_token_ids"] = choices[0].prompt_ids
        return self.envelope(self.object_whole, out, usage=self.usage(choices), **extra, **self.timings(choices[0]))

    def usage(self, choices: list[Choice]) -> dict:
        counts = usage_of(choices)
        details = {}
        if self.starts_thinking is not None:
            details["reasoning_tokens"] = sum(c.thinking.reasoning_tokens for c in choices if c.thinking)
        if self.body.prediction is not None:
            details["accepted_prediction_tokens"] = sum(c.accepted_prediction_tokens for c in choices)
            details["rejected_prediction_tokens"] = sum(c.rejected_prediction_tokens for c in choices)
        return {**counts, "completion_tokens_details": details} if details else counts
