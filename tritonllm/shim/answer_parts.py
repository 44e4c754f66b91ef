"""A generation's pieces split as a chat answer is split: the thinking (the reasoning parser's), the text, and
the tool calls the tool-call parser reads from the text. The routes that answer in other shapes than chat's
(the Responses API, Anthropic's Messages API) build their items or blocks from these parts."""

from __future__ import annotations

from tritonllm.shim.generation import Piece
from tritonllm.shim.openai_protocol import ChatRequest
from tritonllm.shim.settings import ShimSettings
from tritonllm.tokenizer import reasoning
from tritonllm.tokenizer.reasoning import ThinkingSplit
from tritonllm.tokenizer.tool_calls import FORMATS, ToolCallParser


class AnswerParts:
    def __init__(self, chat: ChatRequest, settings: ShimSettings, max_calls: int | None) -> None:
        """`max_calls`: tool calls read at most (None: any number)."""
        self.parser = ToolCallParser(FORMATS[settings.tool_call_parser], max_calls) if chat.tools_active() else None
        starts_inside = reasoning.answer_starts_inside(settings.reasoning_parser, chat.chat_template_kwargs)
        self.thinking = None if starts_inside is None else ThinkingSplit(starts_inside)

    def split(self, piece: Piece) -> tuple[str, str, list[dict]]:
        """The piece's thinking, text and tool-call deltas; the last piece also flushes what the parsers held."""
        thought, text, calls = "", piece.text, []
        final = bool(piece.finish_reason)
        if self.thinking is not None:
            delta = piece.delta
            thought, text = self.thinking.feed(piece.text, delta.token_texts, delta.num_tokens, final)
        if self.parser is not None:
            text, calls = self.parser.feed(text)
            if final:
                rest, more = self.parser.finish(cut_off=piece.finish_reason == "length")
                text, calls = text + rest, calls + more
        return thought, text, calls
